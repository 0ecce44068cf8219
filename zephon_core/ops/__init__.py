"""Built-in operators, one per module."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from .base import OpContext, Operator, OpTraits
    from .batch import BatchOp
    from .ensure_mixture import EnsureMixtureOp
    from .fetch import FetchOp
    from .filter import FilterOp
    from .map import MapOp
    from .pack import PackOp
    from .shuffle import ShuffleOp
    from .split import SplitOp

__all__ = [
    "Operator",
    "OpContext",
    "OpTraits",
    "BatchOp",
    "EnsureMixtureOp",
    "FetchOp",
    "FilterOp",
    "MapOp",
    "PackOp",
    "ShuffleOp",
    "SplitOp",
]

_WHERE = {
    "OpContext": ".base",
    "Operator": ".base",
    "OpTraits": ".base",
    "BatchOp": ".batch",
    "EnsureMixtureOp": ".ensure_mixture",
    "FetchOp": ".fetch",
    "FilterOp": ".filter",
    "MapOp": ".map",
    "PackOp": ".pack",
    "ShuffleOp": ".shuffle",
    "SplitOp": ".split",
}
__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
