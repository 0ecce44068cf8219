"""The eviction rule: which of a lane's chunks have left the inflight set (``docs/design.md`` §6).

The tracker runs on the producing side and sees a lane's outputs in exactly
the order the consumer will receive them, so it can compute the lane's state
*as of each output* and attach it (items travel with their state). The
consumer adopts the state of the last output it took.

* Monotone pipelines (every operator keeps cursor order): a watermark. If the
  most recently delivered record belongs to chunk N, every chunk below N is
  done.
* Epoch-based pipelines: per-offset tracking within an epoch and atomic
  per-epoch eviction. The tracker walks the lane's *own* recorded boundaries
  from the bottom and evicts an epoch only when every offset of every chunk
  in it closed; it stops at the first incomplete epoch, never evicts before
  the lane's first boundary, and never evicts the epoch the replay cursor
  points into (cursor pinning), so the replay filter can always find its
  target.
"""

from __future__ import annotations

from bisect import bisect_right

from ..checkpoint.state import Delivery, LaneState
from ..chunk import WorkChunk
from ..records import Contributor, SampleCursor
from .offsets import ChunkProgress


class LaneTracker:
    """Per-lane offset tracking and eviction (producer side), from a lane's state."""

    def __init__(self, epoch_based: bool, state: LaneState):
        self.epoch_based = epoch_based
        self.floor = state.floor
        self.boundaries = sorted(b for b in state.boundaries if b > state.floor)
        self.cursor = state.cursor
        self.delivered = state.delivered
        self.progress: dict[int, ChunkProgress] = {}
        self.tokens = list(state.tokens)
        self.digest = state.digest

    def register(self, chunk: WorkChunk) -> None:
        if self.epoch_based:
            self.progress[chunk.chunk_id] = ChunkProgress(chunk.chunk_id, len(chunk))

    def add_boundary(self, boundary: int) -> None:
        if not self.boundaries or boundary > self.boundaries[-1]:
            self.boundaries.append(boundary)

    def has_boundary(self, boundary: int) -> bool:
        i = bisect_right(self.boundaries, boundary)
        return i > 0 and self.boundaries[i - 1] == boundary

    def close(self, contributors: list[Contributor], tokens: list[int] | None = None) -> None:
        """Children that were delivered (counting their tokens into ``tokens``) or tombstoned."""
        if not self.epoch_based:
            if tokens is not None:
                for c in contributors:
                    tokens[c[4]] += c[5] or 1
            return
        progress = self.progress
        get = progress.get
        for chunk_id, offset, child, is_last, component, n_tokens in contributors:
            if tokens is not None:
                tokens[component] += n_tokens or 1
            p = get(chunk_id)
            if p is None:
                continue
            if child == 0 and is_last:  # the common whole-sample case, inlined
                closed = p.closed
                if not closed[offset]:
                    closed[offset] = 1
                    p.popcount += 1
            else:
                p.close_child(offset, child, is_last)

    def open_offsets(self, below: int) -> list[tuple[int, int]]:
        """(chunk, offset) of every tracked offset of chunks below ``below`` not closed yet."""
        out = []
        for cid in range(self.floor, below):
            p = self.progress.get(cid)
            if p is not None and not p.complete:
                out += [(cid, i) for i, closed in enumerate(p.closed) if not closed]
        return out

    def deliver(
        self, contributors: list[Contributor], cursor: SampleCursor, digest: object = None
    ) -> Delivery:
        """Account one output and return the lane state right after it."""
        self.close(contributors, self.tokens)
        self.cursor = cursor
        self.digest = digest
        self.delivered += 1
        if self.epoch_based:
            self._evict_epochs()
        elif cursor.chunk_id > self.floor:
            self.floor = cursor.chunk_id
        return Delivery(self.floor, cursor, self.delivered, False, tuple(self.tokens), digest)

    def finish(self, next_chunk_id: int) -> Delivery:
        """End of stream: everything was delivered or dropped."""
        self.progress.clear()
        self.boundaries.clear()
        self.floor = next_chunk_id
        return Delivery(
            self.floor, self.cursor, self.delivered, True, tuple(self.tokens), self.digest
        )

    def _evict_epochs(self) -> None:
        cursor_chunk = self.cursor.chunk_id if self.cursor is not None else -1
        progress = self.progress
        bounds = self.boundaries
        while bounds:
            lo, hi = self.floor, bounds[0]
            if lo <= cursor_chunk < hi:
                return  # cursor pinning: the replay filter's target must stay inflight
            for cid in range(lo, hi):
                p = progress.get(cid)
                if p is None or not p.complete:
                    return
            for cid in range(lo, hi):
                del progress[cid]
            self.floor = hi
            bounds.pop(0)
