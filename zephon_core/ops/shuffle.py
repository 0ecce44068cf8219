"""shuffle: a per-lane buffer shuffle whose randomness replay reproduces.

Each lane's instance creates its RNG from (operator seed, lane, cursor of its first
record) -- all things replay reproduces; a flush hands the lane a fresh instance, so
no counter survives it.
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np

from ..records import Record
from ..rng import generator
from ..validate import int_arg
from .base import Operator, OpTraits

_BLOCK = 256  # random slot indices drawn per RNG call


class ShuffleOp(Operator):
    """Holds up to ``buffer_size`` records; each new record evicts a random held one."""

    traits = OpTraits(preserves_cursor_order=False, stateless=False)

    def __init__(self, buffer_size: int, name: str = "shuffle"):
        buffer_size = int_arg("buffer_size", buffer_size, minimum=1, where="shuffle")
        self.buffer_size = buffer_size
        self.name = name
        self._items: list[Record] = []
        self._rng: np.random.Generator | None = None
        self._draws: list[int] = []
        self._pos = 0

    def for_lane(self, lane: int) -> ShuffleOp:
        new = copy.copy(self)  # cheaper than the default deep copy
        new.ctx = dataclasses.replace(self.ctx, lane=lane)
        new._items, new._rng, new._draws, new._pos = [], None, [], 0
        return new

    def process(self, record: Record) -> list[Record]:
        items = self._items
        if self._rng is None:
            self._rng = generator(self.ctx.seed, self.ctx.lane, *record.cursor)
        if len(items) < self.buffer_size:
            items.append(record)
            return []
        if self._pos == len(self._draws):
            self._draws = self._rng.integers(0, self.buffer_size, _BLOCK).tolist()
            self._pos = 0
        j = self._draws[self._pos]
        self._pos += 1
        out = items[j]
        items[j] = record
        return [out]

    def flush(self) -> list[Record]:
        items, self._items = self._items, []
        if not items:
            return []
        return [items[i] for i in self._rng.permutation(len(items)).tolist()]

    def describe(self) -> dict:
        return {"op": "shuffle", "name": self.name, "buffer_size": self.buffer_size}
