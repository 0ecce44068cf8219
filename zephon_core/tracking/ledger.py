"""The ledger of a lane: the chunks a checkpoint would store, and what goes with them.
(``docs/design.md`` §6)

The producing side registers every chunk as it is pulled from the source --
including chunks pumped far ahead of the consumer -- together with the source
state right after it and the boundary that follows it, under one lock, so a
snapshot is always consistent: replaying the ledger's chunks and then
continuing the source from its saved state yields the original chunk
sequence. The consuming side trims chunks below the floor of the last output
it took. ``version`` counts the changes, so that an owner caching the lane's encoded
state (``checkpoint/lane_cache.py``) encodes it again only after one.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

from ..checkpoint.state import Delivery, LaneDelta, LaneState
from ..chunk import WorkChunk
from ..digests.value_digest import resolve


class LaneLedger:
    """Producer-side record of a lane's chunks; starts from the lane's (restored) state."""

    def __init__(self, state: LaneState):
        self.lane = state.lane
        self._lock = threading.Lock()
        self._chunks: deque[WorkChunk] = deque(state.chunks)
        self._boundaries: list[int] = list(state.boundaries)
        self._source_state = state.source
        self.next_chunk_id = state.next_chunk
        self._prior = state.prior  # fixed for the run (a re-mix's old targets)
        #: bumped (under the lock) by every change; read it before :meth:`snapshot`
        self.version = 0

    def register(
        self, chunk: WorkChunk, source_state: dict[str, Any], boundary_after: bool
    ) -> None:
        with self._lock:
            self.version += 1
            self._chunks.append(chunk)
            self._source_state = source_state
            self.next_chunk_id = chunk.chunk_id + 1
            if boundary_after:
                self._boundaries.append(chunk.chunk_id + 1)

    def mark_exhausted(self, source_state: dict[str, Any]) -> None:
        with self._lock:
            self.version += 1
            self._source_state = source_state

    def trim(self, floor: int) -> None:
        with self._lock:
            self.version += 1
            chunks = self._chunks
            while chunks and chunks[0].chunk_id < floor:
                chunks.popleft()
            bounds = self._boundaries
            while bounds and bounds[0] <= floor:
                bounds.pop(0)

    def snapshot(self, d: Delivery) -> LaneState:
        """The lane's state right after the output that produced ``d``: inflight chunks,
        boundaries incl. the trailing one, the source state after the last chunk."""
        with self._lock:
            return LaneState(
                lane=self.lane,
                floor=d.floor,
                next_chunk=max(self.next_chunk_id, d.floor),
                chunks=[c for c in self._chunks if c.chunk_id >= d.floor],
                boundaries=[b for b in self._boundaries if b > d.floor],
                source=self._source_state,
                cursor=d.cursor,
                delivered=d.delivered,
                exhausted=d.exhausted,
                tokens=list(d.tokens),
                digest=resolve(d.digest),
                prior=self._prior,
            )

    def delta(self, d: Delivery, since: int) -> LaneDelta:
        """What a consumer that holds the chunks below ``since`` needs after ``d``."""
        first = max(d.floor, since)
        with self._lock:
            return LaneDelta(
                lane=self.lane,
                delivery=d._replace(digest=resolve(d.digest)),
                new_chunks=tuple(c for c in self._chunks if c.chunk_id >= first),
                boundaries=tuple(b for b in self._boundaries if b > d.floor),
                source=self._source_state,
                next_chunk=max(self.next_chunk_id, d.floor),
            )

    def __len__(self) -> int:
        return len(self._chunks)
