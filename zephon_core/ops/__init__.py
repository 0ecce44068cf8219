"""Built-in operators, one per module."""

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
