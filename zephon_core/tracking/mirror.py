"""Mirroring a lane's state across a process boundary with cheap deltas.

A DataLoader worker sends, with every output, a :class:`LaneDelta`: the lane's
delivery state, the chunks registered since the last delta, the boundaries
and the source state. The consuming process applies the deltas of the
batches it actually takes -- in order -- to a :class:`LaneMirror`, so its
state is always the one right after the last batch the training loop got,
whatever the workers prefetched.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from ..checkpoint.state import LaneState
from ..errors import ContractViolation
from ..sources.chunk import WorkChunk
from .eviction import Delivery


@dataclass(frozen=True)
class LaneDelta:
    lane: int
    state: Delivery
    new_chunks: tuple[WorkChunk, ...]
    boundaries: tuple[int, ...]
    source: dict[str, Any]
    next_chunk: int


class LaneMirror:
    def __init__(self, initial: LaneState):
        self.lane = initial.lane
        self.floor = initial.floor
        self.next_chunk = initial.next_chunk
        self.chunks: deque[WorkChunk] = deque(initial.chunks)
        self.boundaries = list(initial.boundaries)
        self.source = initial.source
        self.cursor = initial.cursor
        self.delivered = initial.delivered
        self.exhausted = initial.exhausted
        self.tokens = list(initial.tokens)
        self.digest = initial.digest

    def apply(self, delta: LaneDelta) -> None:
        d = delta.state
        chunks = self.chunks
        # Evict first: one output can complete several chunks or epochs, and a delta
        # omits chunks below the new floor that were never shipped, so the first new
        # chunk follows either the mirrored ones or the floor.
        while chunks and chunks[0].chunk_id < d.floor:
            chunks.popleft()
        expected = chunks[-1].chunk_id + 1 if chunks else d.floor
        for c in delta.new_chunks:
            if c.chunk_id < expected:
                continue  # already mirrored, or below the floor
            if c.chunk_id != expected:
                raise ContractViolation(f"lane {self.lane}: delta chunk {c.chunk_id} does not "
                                        f"follow chunk {expected - 1} (floor {d.floor})")
            chunks.append(c)
            expected += 1
        self.floor, self.cursor, self.delivered = d.floor, d.cursor, d.delivered
        self.exhausted, self.tokens, self.digest = d.exhausted, list(d.tokens), d.digest
        self.boundaries = list(delta.boundaries)
        self.source = delta.source
        self.next_chunk = delta.next_chunk

    def state(self) -> LaneState:
        return LaneState(lane=self.lane, floor=self.floor, next_chunk=self.next_chunk,
                         chunks=list(self.chunks), boundaries=list(self.boundaries),
                         source=self.source, cursor=self.cursor, delivered=self.delivered,
                         exhausted=self.exhausted, tokens=list(self.tokens), digest=self.digest)
