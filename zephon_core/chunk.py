"""WorkChunk: the unit of work a lane's source produces and a checkpoint stores.

Beside the records, below ``sources/`` (which make chunks), ``tracking/`` (which evicts
them) and ``checkpoint/`` (which stores them).
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import CorruptCheckpoint
from .validate import int_arg


@dataclass(frozen=True, slots=True)
class WorkChunk:
    """A run of sample pointers of one lane.

    Attributes:
        lane: the canonical lane the chunk belongs to.
        chunk_id: consecutive per lane, from 0.
        components: dataset index of each offset (the "component order").
        rows: row index inside that dataset, per offset.
        seed: 64-bit per-chunk seed derived from (pipeline seed, lane, chunk_id).
        dropped: offsets an exclusion (``exclude=``) removed when the chunk was read;
            they become tombstones. Stored with the chunk, so a replay drops the same.
    """

    lane: int
    chunk_id: int
    components: tuple[int, ...]
    rows: tuple[int, ...]
    seed: int
    dropped: tuple[int, ...] = ()

    @property
    def pointers(self) -> list[tuple[int, int]]:
        return list(zip(self.components, self.rows))

    def __len__(self) -> int:
        return len(self.rows)

    def to_state(self) -> list:
        out = [self.chunk_id, self.seed, list(self.components), list(self.rows)]
        if self.dropped:  # absent unless an exclusion dropped rows: earlier states read
            out.append(list(self.dropped))
        return out

    @classmethod
    def from_state(cls, lane: int, state: list) -> WorkChunk:
        try:
            if not isinstance(state, (list, tuple)) or len(state) not in (4, 5):
                raise ValueError("a chunk is [chunk_id, seed, components, rows(, dropped)]")
            chunk_id, seed, components, rows = state[:4]
            dropped = tuple(state[4]) if len(state) == 5 else ()
            if dropped and (
                not all(type(x) is int for x in dropped)
                or list(dropped) != sorted(set(dropped))
                or dropped[0] < 0
                or dropped[-1] >= len(rows)
            ):
                raise ValueError(f"dropped offsets {list(dropped)[:8]} are not sorted offsets")
            if not isinstance(components, (list, tuple)) or not isinstance(rows, (list, tuple)):
                raise ValueError("components and rows must be lists")
            if len(components) != len(rows) or not rows:
                raise ValueError("components/rows length mismatch or empty chunk")
            values = (chunk_id, seed, *components, *rows)
            # one pass in C for the usual case (plain ints >= 0), the per-value check (which
            # names the bad value) otherwise: admission reads thousands of pointers per lane
            if not (all(type(x) is int for x in values) and min(values) >= 0):
                for x in values:
                    int_arg("pointer", x, minimum=0, error=ValueError)
            return cls(lane, int(chunk_id), tuple(components), tuple(rows), int(seed), dropped)
        except (TypeError, ValueError) as e:
            raise CorruptCheckpoint(f"invalid work chunk in lane {lane}: {e}") from e
