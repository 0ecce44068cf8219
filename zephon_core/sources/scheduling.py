"""Which dataset each slot of a chunk reads: the two schedulers of a mixture lane.

* :class:`RoundRobinScheduler` -- fixed document weights: smooth weighted round-robin
  (``mixture.py``), exact over every ``sum(weights)`` slots; state ``swrr``.
* :class:`DeficitScheduler` -- token shares or a ``WeightSchedule``: token deficits
  (``deficit.py``), each document charged its length before it is fetched; state
  ``deficits`` and the lane's scheduled ``tokens`` (where a schedule is read).

Both fill one chunk from a lane's cursors (advancing them) and never pick a dataset
past its cap (``mixture_rows.py``).
"""

from __future__ import annotations

from typing import Any

from .deficit import TokenDeficit
from .mixture import SmoothWeightedRoundRobin
from .mixture_rows import LaneRows
from .schedule import fixed_point_shares, weights_at

__all__ = ["DeficitScheduler", "RoundRobinScheduler"]


class RoundRobinScheduler:
    """Smooth weighted round-robin over the integer document weights."""

    # ``source``: the StaticMixtureWorkSource (not imported: it imports this module)
    def __init__(self, source: Any) -> None:
        self._src = source
        self.swrr = SmoothWeightedRoundRobin(source.integer_weights)

    def fill(
        self, cursors: list[int], retired: int, rows: LaneRows
    ) -> tuple[list[int], tuple[int, ...]]:
        """(datasets, rows) of the next chunk; advances ``cursors``."""
        size = self._src.chunk_size
        remaining = rows.remaining(cursors)
        active = [
            w > 0 and (r is None or r > 0)
            for w, r in zip(self._src.integer_weights, remaining, strict=True)
        ]
        picks: list[int] = []
        while len(picks) < size and any(active) and not rows.ends_lane(remaining):
            # Pick as many slots as no active dataset can run out during.
            room = [r for r, a in zip(remaining, active, strict=True) if a and r is not None]
            batch = self.swrr.pick_many(min([size - len(picks), *room]), active)
            picks += batch
            for d in dict.fromkeys(batch):
                if remaining[d] is not None:
                    remaining[d] -= batch.count(d)
                    active[d] = remaining[d] > 0
        present = list(dict.fromkeys(picks))
        if len(present) == 1:
            d = present[0]
            out = tuple(rows.rows(d, cursors[d], len(picks)))
            cursors[d] += len(picks)
        else:
            iters: list[Any] = [None] * len(cursors)
            for d in present:
                count = picks.count(d)
                iters[d] = iter(rows.rows(d, cursors[d], count))
                cursors[d] += count
            out = tuple(map(next, [iters[c] for c in picks]))
        return picks, out

    def state_dict(self) -> Any:
        return self.swrr.state_dict()

    def load_state_dict(self, state: Any) -> None:
        self.swrr.load_state_dict(state)  # validates before changing anything


class DeficitScheduler:
    """Token deficits against the shares in force at the lane's position."""

    # ``source``: the StaticMixtureWorkSource (not imported: it imports this module)
    def __init__(self, source: Any, num_lanes: int) -> None:
        self._src = source
        self._num_lanes = num_lanes
        self.credits = TokenDeficit(len(source.lengths))
        self._lens = source._length_table() if source.needs_tokens else None
        self._shares: tuple[tuple[float, ...], list[int]] | None = None
        #: tokens scheduled on this lane (the position a schedule by tokens reads)
        self.tokens = 0

    def _current_shares(self, cursors: list[int], retired: int) -> list[int]:
        """Fixed-point shares at this lane's position (once per chunk)."""
        src = self._src
        table = src._table
        if len(table) == 1:
            pos = 0.0
        elif src.schedule is not None and src.schedule.by == "tokens":
            pos = float(self.tokens * self._num_lanes)
        else:
            pos = float((sum(cursors) + retired) * self._num_lanes)
        weights = weights_at(table, pos)
        cached = self._shares
        if cached is None or cached[0] != weights:
            cached = (weights, fixed_point_shares(weights))
            self._shares = cached
        return cached[1]

    def fill(
        self, cursors: list[int], retired: int, rows: LaneRows
    ) -> tuple[list[int], tuple[int, ...]]:
        """(datasets, rows) of the next chunk; advances ``cursors`` and ``tokens``."""
        size, lens = self._src.chunk_size, self._lens
        shares = self._current_shares(cursors, retired)
        remaining = rows.remaining(cursors)
        eligible = [
            d
            for d, (s, r) in enumerate(zip(shares, remaining, strict=True))
            if s > 0 and (r is None or r > 0)
        ]
        picks: list[int] = []
        out: list[int] = []
        credits = self.credits
        # each eligible dataset's next row and its length (the pick looks ahead at them)
        nxt_row = [0] * len(cursors)
        nxt_len = [1] * len(cursors)

        def peek(d: int) -> None:
            nxt_row[d] = row = rows.rows(d, cursors[d], 1)[0]
            nxt_len[d] = lens[d].of(row) if lens is not None else 1

        for d in eligible:
            peek(d)
        while len(picks) < size and eligible and not rows.ends_lane(remaining):
            d = credits.pick(eligible, nxt_len, shares)
            length = nxt_len[d]
            credits.charge(d, length, shares, eligible)
            self.tokens += length
            picks.append(d)
            out.append(nxt_row[d])
            cursors[d] += 1
            if remaining[d] is not None:
                remaining[d] -= 1
                if remaining[d] <= 0:
                    eligible = [c for c in eligible if c != d]
                    continue
            peek(d)
        return picks, tuple(out)

    def state_dict(self) -> Any:
        return self.credits.state_dict()

    def load_state_dict(self, state: Any) -> None:
        self.credits.load_state_dict(state)  # validates first
