"""The ledger of a lane: the chunks a checkpoint would store, and what goes with them.

The producing side registers every chunk as it is pulled from the source --
including chunks pumped far ahead of the consumer -- together with the source
state right after it and the boundary that follows it, under one lock, so a
snapshot is always consistent: replaying the ledger's chunks and then
continuing the source from its saved state yields the original chunk
sequence. The consuming side trims chunks below the floor of the last output
it took.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

from ..sources.chunk import WorkChunk


class LaneLedger:
    def __init__(self, lane: int, chunks: list[WorkChunk], boundaries: list[int],
                 source_state: dict[str, Any], next_chunk_id: int):
        self.lane = lane
        self._lock = threading.Lock()
        self._chunks: deque[WorkChunk] = deque(chunks)
        self._boundaries: list[int] = list(boundaries)
        self._source_state = source_state
        self.next_chunk_id = next_chunk_id

    def register(self, chunk: WorkChunk, source_state: dict[str, Any],
                 boundary_after: bool) -> None:
        with self._lock:
            self._chunks.append(chunk)
            self._source_state = source_state
            self.next_chunk_id = chunk.chunk_id + 1
            if boundary_after:
                self._boundaries.append(chunk.chunk_id + 1)

    def mark_exhausted(self, source_state: dict[str, Any]) -> None:
        with self._lock:
            self._source_state = source_state

    def trim(self, floor: int) -> None:
        with self._lock:
            chunks = self._chunks
            while chunks and chunks[0].chunk_id < floor:
                chunks.popleft()
            bounds = self._boundaries
            while bounds and bounds[0] <= floor:
                bounds.pop(0)

    def snapshot(self, floor: int, since: int | None = None
                 ) -> tuple[list[WorkChunk], list[int], dict[str, Any], int]:
        """(inflight chunks, boundaries incl. the trailing one, source state, next chunk id).

        With ``since``, only chunks from that id on (for deltas)."""
        first = floor if since is None else max(floor, since)
        with self._lock:
            chunks = [c for c in self._chunks if c.chunk_id >= first]
            bounds = [b for b in self._boundaries if b > floor]
            return chunks, bounds, self._source_state, self.next_chunk_id

    def __len__(self) -> int:
        return len(self._chunks)
