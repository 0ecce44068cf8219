"""shuffle: a per-lane buffer shuffle whose randomness replay reproduces.

The RNG of a lane is created from (operator seed, lane, cursor of the first
record after a reset) -- all things replay reproduces -- and is dropped on
every reset, so no counter survives a flush.
"""

from __future__ import annotations

import numpy as np

from ..errors import ConfigError
from ..records import Record
from ..rng import generator
from .base import Operator, OpTraits

_BLOCK = 256  # random slot indices drawn per RNG call


class _LaneBuffer:
    __slots__ = ("items", "rng", "draws", "pos")

    def __init__(self, rng: np.random.Generator):
        self.items: list[Record] = []
        self.rng = rng
        self.draws: list[int] = []
        self.pos = 0


class ShuffleOp(Operator):
    """Holds up to ``buffer_size`` records; each new record evicts a random held one."""

    traits = OpTraits(preserves_cursor_order=False, stateless=False)

    def __init__(self, buffer_size: int, name: str = "shuffle"):
        if not isinstance(buffer_size, int) or buffer_size < 1:
            raise ConfigError(f"shuffle(buffer_size={buffer_size!r}): must be a positive int")
        self.buffer_size = buffer_size
        self.name = name
        self._lanes: dict[int, _LaneBuffer] = {}

    def bind(self, ctx) -> None:
        super().bind(ctx)
        self._lanes = {}

    def process(self, record: Record, lane_id: int) -> list[Record]:
        st = self._lanes.get(lane_id)
        if st is None:
            st = self._lanes[lane_id] = _LaneBuffer(
                generator(self.ctx.seed, lane_id, *record.cursor))
        items = st.items
        if len(items) < self.buffer_size:
            items.append(record)
            return []
        if st.pos == len(st.draws):
            st.draws = st.rng.integers(0, self.buffer_size, _BLOCK).tolist()
            st.pos = 0
        j = st.draws[st.pos]
        st.pos += 1
        out = items[j]
        items[j] = record
        return [out]

    def flush(self, reset: bool, lane_id: int) -> list[Record]:
        st = self._lanes.get(lane_id)
        if st is None:
            return []
        items = st.items
        out = [items[i] for i in st.rng.permutation(len(items)).tolist()]
        if reset:
            del self._lanes[lane_id]
        else:
            st.items = []
        return out

    def has_pending(self, lane_id: int) -> bool:
        st = self._lanes.get(lane_id)
        return st is not None and bool(st.items)

    def describe(self) -> dict:
        return {"op": "shuffle", "name": self.name, "buffer_size": self.buffer_size}
