"""Deterministic mixing of components by smooth weighted round-robin (SWRR).

Why: sampling components at random only matches the weights in expectation,
and its state is a generator. SWRR (the nginx upstream algorithm) over integer
weights is exact: in every window of ``sum(weights)`` consecutive picks each
component is picked exactly ``weight`` times, picks are spread evenly inside the
window, and the whole state is one small list of integers.

Example:
    >>> rr = SmoothWeightedRoundRobin(integer_weights([0.7, 0.3]))
    >>> [rr.pick() for _ in range(10)]
    [0, 1, 0, 0, 0, 1, 0, 0, 1, 0]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from ..errors import ConfigError, CorruptCheckpoint
from ..validate import is_int as _strict_int
from ..validate import weight_vector

__all__ = ["integer_weights", "SmoothWeightedRoundRobin"]

#: Largest ``sum(weights) * len(weights)`` for which one period is tabulated.
_TABLE_LIMIT = 1 << 16


def integer_weights(weights: Sequence[float]) -> list[int]:
    """Smallest integers with the same ratios as ``weights``.

    Each weight is read as ``Fraction(w).limit_denominator(10**6)``, scaled by the
    LCM of the denominators and divided by the GCD, e.g. ``[0.7, 0.3] -> [7, 3]``
    and ``[1, 1, 2] -> [1, 1, 2]``. Weights may be 0 (never picked) but not all.

    Raises:
        ConfigError: a weight is negative, NaN, infinite or not a number, all
            weights are zero, or a positive weight is too small to represent.
    """
    ws = list(weights)
    if not ws:
        raise ConfigError("weights is empty: give one weight per dataset")
    ws = weight_vector(ws, [str(i) for i in range(len(ws))], "integer_weights")

    def limited(scale: float) -> list[Fraction]:
        return [Fraction(float(w) / scale).limit_denominator(10**6) for w in ws]

    fracs = limited(1.0)
    if any(fr == 0 and float(w) > 0 for fr, w in zip(fracs, ws, strict=True)):
        fracs = limited(max(float(w) for w in ws))  # scale-free retry: [1e-7, 2e-7] -> [1, 2]
    for i, (fr, w) in enumerate(zip(fracs, ws, strict=True)):
        if fr == 0 and float(w) > 0:
            raise ConfigError(
                f"weight {i} ({w!r}) is below 1e-6 of the largest weight and would never be "
                "picked: raise it or set it to 0"
            )
    lcm = 1
    for fr in fracs:
        lcm = lcm * fr.denominator // math.gcd(lcm, fr.denominator)
    ints = [int(fr * lcm) for fr in fracs]
    g = 0
    for v in ints:
        g = math.gcd(g, v)
    return [v // g for v in ints]


class SmoothWeightedRoundRobin:
    """Smooth weighted round-robin over non-negative integer weights.

    Each pick credits every active component with its weight, picks the one
    with the largest credit (ties: lowest index) and debits it by the total
    active weight. Inactive and zero-weight components get no credit and are
    never picked. The credits always sum to zero.

    State (``state_dict()``): the list of current credits, one int per component.

    Args:
        weights: non-negative ints, at least one positive (see :func:`integer_weights`).
    """

    def __init__(self, weights: Sequence[int]) -> None:
        ws = list(weights)
        if not ws or any(not _strict_int(w) or w < 0 for w in ws) or sum(ws) == 0:
            raise ConfigError(
                f"SmoothWeightedRoundRobin needs non-negative integer weights, not all zero; "
                f"got {ws!r} (convert floats with integer_weights())"
            )
        self.weights: tuple[int, ...] = tuple(ws)
        self.total = sum(ws)
        self._current: list[int] = [0] * len(ws)
        self._all_active = tuple(w > 0 for w in ws)
        self._table: tuple[list[int], list[tuple[int, ...]], dict[tuple[int, ...], int]] | None
        self._table = None
        self._tabulate = self.total * len(ws) <= _TABLE_LIMIT

    def __len__(self) -> int:
        return len(self.weights)

    def _eligible(self, active: Sequence[bool] | None) -> tuple[int, ...]:
        if active is None:
            return tuple(i for i, w in enumerate(self.weights) if w > 0)
        if len(active) != len(self.weights):
            raise ValueError(f"active has {len(active)} entries, expected {len(self.weights)}")
        return tuple(
            i for i, (w, a) in enumerate(zip(self.weights, active, strict=True)) if a and w > 0
        )

    def pick(self, active: Sequence[bool] | None = None) -> int:
        """The next component; ``active[i] is False`` skips component ``i``."""
        return self.pick_many(1, active)[0]

    def pick_many(self, count: int, active: Sequence[bool] | None = None) -> list[int]:
        """The next ``count`` picks with a fixed active set (same as ``count`` x :meth:`pick`)."""
        eligible = self._eligible(active)
        if not eligible:
            raise ValueError("no active component with a positive weight to pick from")
        if count <= 0:
            return []
        cur = self._current
        if self._tabulate and len(eligible) == sum(self._all_active):
            seq, states, phase_of = self._period_table()
            phase = phase_of.get(tuple(cur))
            if phase is not None:  # on the all-active cycle: read the picks off the table
                if phase + count <= self.total:
                    out = seq[phase : phase + count]
                else:
                    full, rest = divmod(count - (self.total - phase), self.total)
                    out = seq[phase:] + seq * full + seq[:rest]
                self._current = list(states[(phase + count) % self.total])
                return out
        weights = self.weights
        total = sum(weights[i] for i in eligible)
        out: list[int] = []
        for _ in range(count):
            best, best_credit = -1, 0
            for i in eligible:
                c = cur[i] + weights[i]
                cur[i] = c
                if best < 0 or c > best_credit:
                    best, best_credit = i, c
            cur[best] -= total
            out.append(best)
        return out

    def _period_table(
        self,
    ) -> tuple[list[int], list[tuple[int, ...]], dict[tuple[int, ...], int]]:
        """One period of picks from the all-zero credits, with all components active."""
        if self._table is None:
            saved, self._current = self._current, [0] * len(self.weights)
            self._tabulate = False  # build with the plain loop
            seq: list[int] = []
            states = [tuple(self._current)]
            for _ in range(self.total):
                seq += self.pick_many(1)
                states.append(tuple(self._current))
            self._current, self._tabulate = saved, True
            self._table = (seq, states[:-1], {s: p for p, s in enumerate(states[:-1])})
        return self._table

    def state_dict(self) -> list[int]:
        return list(self._current)

    def load_state_dict(self, state: Any) -> None:
        """Restore credits saved by :meth:`state_dict`.

        Raises:
            CorruptCheckpoint: not a list of ``len(weights)`` ints summing to zero.
        """
        if not isinstance(state, (list, tuple)) or len(state) != len(self.weights):
            raise CorruptCheckpoint(
                f"SWRR state must be a list of {len(self.weights)} ints, got {state!r}"
            )
        if any(not _strict_int(v) for v in state) or sum(state) != 0:
            raise CorruptCheckpoint(f"SWRR state must be ints summing to 0, got {state!r}")
        self._current = [int(v) for v in state]
