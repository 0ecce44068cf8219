"""The eviction rule: which of a lane's chunks have left the inflight set.

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
from typing import NamedTuple

from ..records import Contributor, SampleCursor
from ..sources.chunk import WorkChunk
from .offsets import ChunkProgress


class Delivery(NamedTuple):
    """A lane's consumer-visible state right after one of its outputs was delivered."""

    floor: int                      # lowest chunk id still inflight
    cursor: SampleCursor | None     # replay cursor: identity of the last delivered record
    delivered: int                  # outputs delivered on this lane
    exhausted: bool                 # the lane's stream ended
    tokens: tuple[int, ...]         # cumulative delivered tokens per component
    digest: int | None = None       # value digest of the record behind the last output


class LaneTracker:
    """Per-lane offset tracking and eviction (producer side)."""

    def __init__(self, epoch_based: bool, floor: int, boundaries: list[int],
                 cursor: SampleCursor | None, delivered: int, n_components: int):
        self.epoch_based = epoch_based
        self.floor = floor
        self.boundaries = sorted(b for b in boundaries if b > floor)
        self.cursor = cursor
        self.delivered = delivered
        self.progress: dict[int, ChunkProgress] = {}
        self.tokens = [0] * n_components
        self.digest: int | None = None

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

    def deliver(self, contributors: list[Contributor], cursor: SampleCursor,
                digest: int | None = None) -> Delivery:
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
        return Delivery(self.floor, self.cursor, self.delivered, True, tuple(self.tokens),
                        self.digest)

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
