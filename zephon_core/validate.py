"""One vocabulary for checking arguments.

Every check names the argument, the value and what was expected, and raises the
error type the caller passes (``ConfigError`` by default), so configuration, topology
and checkpoint code all speak alike. ``True`` is not an int here, and a weight is a
finite number >= 0.

Example:
    >>> int_arg("buffer_size", 4, minimum=1, where="shuffle")
    4
    >>> int_arg("buffer_size", True, minimum=1, where="shuffle")
    Traceback (most recent call last):
    ...
    zephon_core.errors.ConfigError: shuffle(buffer_size=True): must be an int >= 1
    >>> weight_vector({"prose": 0.7, "code": 0.3}, ("prose", "code"), "the source")
    [0.7, 0.3]
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .errors import ConfigError

__all__ = ["bool_arg", "int_arg", "is_int", "number_arg", "weight_vector"]


def is_int(x: object) -> bool:
    """An int (or numpy integer), and not a bool."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _label(name: str, value: Any, where: str | None) -> str:
    return f"{where}({name}={value!r})" if where else f"{name}={value!r}"


def int_arg(
    name: str,
    value: Any,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    where: str | None = None,
    allow_none: bool = False,
    error: type[Exception] = ConfigError,
) -> int | None:
    """``value`` as an int in ``[minimum, maximum]`` (None passes when ``allow_none``)."""
    if value is None and allow_none:
        return None
    ok = (
        is_int(value)
        and (minimum is None or value >= minimum)
        and (maximum is None or value <= maximum)
    )
    if not ok:
        bounds = (f" >= {minimum}" if minimum is not None else "") + (
            f" and <= {maximum}" if maximum is not None else ""
        )
        none = " or None" if allow_none else ""
        raise error(f"{_label(name, value, where)}: must be an int{bounds}{none}")
    return int(value)


def bool_arg(
    name: str, value: Any, *, where: str | None = None, error: type[Exception] = ConfigError
) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise error(f"{_label(name, value, where)}: must be True or False")
    return bool(value)


def number_arg(
    name: str,
    value: Any,
    *,
    positive: bool = False,
    allow_none: bool = False,
    where: str | None = None,
    hint: str = "",
    error: type[Exception] = ConfigError,
) -> float | None:
    """A finite number (``> 0`` when ``positive``)."""
    if value is None and allow_none:
        return None
    ok = (
        isinstance(value, (int, float, np.integer, np.floating))
        and not isinstance(value, (bool, np.bool_))
        and math.isfinite(float(value))
        and (not positive or float(value) > 0)
    )
    if not ok:
        raise error(
            f"{_label(name, value, where)}: must be a finite number"
            + (" > 0" if positive else "")
            + (" or None" if allow_none else "")
            + hint
        )
    return float(value)


def weight_vector(
    weights: Mapping[str, Any] | Sequence[Any],
    names: Sequence[str],
    where: str,
    *,
    missing_is_zero: bool = False,
) -> list[float]:
    """One weight per name, each a finite number >= 0, not all zero.

    Args:
        weights: ``{name: weight}`` or one weight per name, in order.
        names: the components the weights are for.
        where: who asks (for the message), e.g. ``"the source"``.
        missing_is_zero: a mapping may leave names out (they weigh 0).
    """
    names = list(names)
    if isinstance(weights, Mapping):
        unknown = [k for k in weights if k not in names]
        if unknown:
            raise ConfigError(
                f"{where}: weights given for unknown datasets {unknown!r}; known "
                f"datasets: {names!r}"
            )
        absent = [n for n in names if n not in weights]
        if absent and not missing_is_zero:
            raise ConfigError(
                f"{where}: no weight for datasets {absent!r}: give every dataset "
                "a weight (0 to leave it out)"
            )
        raw = [weights.get(n, 0.0) for n in names]
    elif isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence):
        raise ConfigError(f"{where}: weights must be a mapping or a sequence, got {weights!r}")
    else:
        raw = list(weights)
        if len(raw) != len(names):
            raise ConfigError(
                f"{where}: {len(raw)} weights for {len(names)} datasets "
                f"{names!r}: give one weight per dataset"
            )
    out = []
    for name, w in zip(names, raw, strict=True):
        ok = hasattr(w, "__float__") and not isinstance(w, (bool, str, bytes, np.bool_))
        if not ok or not math.isfinite(float(w)) or float(w) < 0:
            raise ConfigError(
                f"{where}: weight of dataset {name!r} is {w!r}: weights must be finite numbers >= 0"
            )
        out.append(float(w))
    if not any(out):
        raise ConfigError(
            f"{where}: all weights are zero for datasets {names!r}: give at "
            "least one dataset a positive weight"
        )
    return out
