"""Mixture weights that change over the run: a piecewise-linear table.

Why a table and not a Python callable: the weights decide which rows every lane reads,
so they must be deterministic, serializable into the checkpoint's fingerprint and
comparable between runs. A table of ``(position, weights)`` points, linearly
interpolated and held constant outside, says all a warm-up, an anneal or a
curriculum needs.

A lane evaluates the table at ``num_lanes x`` its own consumed tokens (or documents),
its estimate of the global position (every lane carries ``1/num_lanes`` of the
stream), once per chunk. Steps are not a unit here: the source schedules documents
before packing; convert with ``tokens = steps * batch_size * seq_len``.

Example:
    >>> s = WeightSchedule([(0, {"web": 0.9, "hq": 0.1}), (1000, {"web": 0.5, "hq": 0.5})])
    >>> [round(w, 3) for w in s.at(500, ("web", "hq"))]
    [0.7, 0.3]
    >>> a = WeightSchedule.anneal({"web": 0.9, "hq": 0.1}, {"web": 0.5, "hq": 0.5},
    ...                          total=10_000, last_fraction=0.1)
    >>> [p for p, _ in a.points]
    [0, 9000, 10000]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import ConfigError
from ..validate import number_arg, weight_vector

__all__ = ["WeightSchedule", "fixed_point_shares", "SHARE_SCALE"]

#: fixed-point denominator of a lane's integer shares (deficit scheduling stays exact)
SHARE_SCALE = 1 << 20

Weights = Mapping[str, float] | Sequence[float]


class WeightSchedule:
    """Piecewise-linear mixture weights over consumed ``tokens`` or ``documents``.

    Args:
        points: ``[(position, weights), ...]`` with strictly increasing positions;
            ``weights`` a mapping by component name (missing names weigh 0) or a
            sequence. Before the first point the first weights hold, after the last
            the last.
        by: ``"tokens"`` (needs token lengths, see ``weights_unit``) or ``"documents"``.
    """

    def __init__(self, points: Sequence[tuple[float, Weights]], by: str = "tokens") -> None:
        if by not in ("tokens", "documents"):
            raise ConfigError(f"WeightSchedule(by={by!r}): use 'tokens' or 'documents'")
        if not isinstance(points, (list, tuple)) or not points:
            raise ConfigError(
                "WeightSchedule(points=...): give a non-empty list of (position, weights)"
            )
        pts: list[tuple[float, Weights]] = []
        for i, pt in enumerate(points):
            if not isinstance(pt, (list, tuple)) or len(pt) != 2:
                raise ConfigError(f"WeightSchedule point #{i} ({pt!r}) is not (position, weights)")
            pos = _tidy(number_arg("position", pt[0], where=f"WeightSchedule point #{i}"))
            if pos < 0 or (pts and pos <= pts[-1][0]):
                raise ConfigError(
                    f"WeightSchedule point #{i}: position {pos} must be >= 0 and greater than "
                    "the previous point's"
                )
            pts.append((pos, pt[1]))
        self.points: tuple[tuple[float, Weights], ...] = tuple(pts)
        self.by = by

    @classmethod
    def anneal(
        cls, start: Weights, end: Weights, total: float, last_fraction: float = 0.1, by="tokens"
    ) -> WeightSchedule:
        """``start`` weights, then a linear anneal to ``end`` over the last
        ``last_fraction`` of ``total`` (tokens or documents)."""
        total = number_arg("total", total, positive=True, where="WeightSchedule.anneal")
        frac = number_arg("last_fraction", last_fraction, positive=True, where="anneal")
        if frac > 1:
            raise ConfigError(f"WeightSchedule.anneal(last_fraction={frac}): must be in (0, 1]")
        total, knee = _tidy(total), _tidy(total * (1 - frac))
        pts = [(0, start), (knee, start), (total, end)] if knee > 0 else [(0, start), (total, end)]
        return cls([p for i, p in enumerate(pts) if i == 0 or p[0] > pts[i - 1][0]], by=by)

    def resolve(self, names: Sequence[str]) -> tuple[tuple[float, tuple[float, ...]], ...]:
        """The table with weight vectors normalized in ``names`` order (validated)."""
        out = []
        for pos, w in self.points:
            vec = weight_vector(w, names, "WeightSchedule", missing_is_zero=True)
            s = sum(vec)
            if s <= 0:
                raise ConfigError(f"WeightSchedule point at {pos}: all weights are zero")
            out.append((pos, tuple(x / s for x in vec)))
        return tuple(out)

    def at(self, position: float, names: Sequence[str]) -> tuple[float, ...]:
        """Normalized weights at ``position``."""
        return weights_at(self.resolve(names), position)

    def describe(self, names: Sequence[str]) -> dict[str, Any]:
        return {"by": self.by, "points": [[p, list(w)] for p, w in self.resolve(names)]}

    def __repr__(self) -> str:
        return f"WeightSchedule({list(self.points)!r}, by={self.by!r})"


def _tidy(x: float) -> float | int:
    """Integral positions as ints (they print and fingerprint as written)."""
    return int(x) if float(x).is_integer() else float(x)


def weights_at(
    table: Sequence[tuple[float, tuple[float, ...]]], position: float
) -> tuple[float, ...]:
    """Linear interpolation in a resolved table (constant outside it)."""
    if position <= table[0][0]:
        return table[0][1]
    for (p0, w0), (p1, w1) in zip(table, table[1:]):
        if position < p1:
            t = (position - p0) / (p1 - p0)
            return tuple(a + (b - a) * t for a, b in zip(w0, w1))
    return table[-1][1]


def fixed_point_shares(weights: Sequence[float]) -> list[int]:
    """Non-negative ints summing to ``SHARE_SCALE`` in the ratios of ``weights``
    (largest remainder, ties to the lower index; a positive weight keeps at least 1)."""
    total = float(sum(weights))
    raw = [w / total * SHARE_SCALE for w in weights]
    out = [int(r) for r in raw]
    for i, w in enumerate(weights):
        if w > 0 and out[i] == 0:
            out[i] = 1
    short = SHARE_SCALE - sum(out)
    order = sorted(range(len(raw)), key=lambda i: (-(raw[i] - int(raw[i])), i))
    k = 0
    while short > 0:
        i = order[k % len(order)]
        if weights[i] > 0:
            out[i] += 1
            short -= 1
        k += 1
    while short < 0:  # the minimum-1 bumps overshot: take from the largest
        i = max(range(len(out)), key=lambda j: (out[j], -j))
        out[i] -= 1
        short += 1
    return out
