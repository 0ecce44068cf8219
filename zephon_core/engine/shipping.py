"""What a ``runner=processes`` stage sends to its workers, and the check compile makes.

Compile calls :func:`check_shippable` on every operator of such a stage, so a lambda
or closure is refused when the pipeline is built, not when the first worker starts;
``processes.py`` sends :func:`shippable` copies. One module for both, so the check and
what is sent cannot drift apart.
"""

from __future__ import annotations

import copy
import dataclasses
import pickle
from typing import TYPE_CHECKING

from ..errors import ConfigError

if TYPE_CHECKING:
    from ..ops.base import Operator


def shippable(op: Operator) -> Operator:
    """The copy of a bound operator sent to workers: without the source and the upstream
    operators its context refers to (a worker needs neither, and they may not pickle)."""
    ctx = getattr(op, "ctx", None)
    if ctx is None:
        return op
    out = copy.copy(op)
    out.ctx = dataclasses.replace(ctx, source=None, upstream=())
    return out


def check_shippable(op: Operator) -> None:
    try:
        pickle.dumps(shippable(op))
    except Exception as e:  # noqa: BLE001 - any pickling failure means the same fix
        raise ConfigError(
            f"operator {op.name!r} runs on worker processes but cannot be sent to them "
            f"({type(e).__name__}: {e}); define its function at module level (lambdas and "
            "closures do not pickle) or use runner='threads'"
        ) from e
