"""Row addressing of one lane of a ``StaticMixtureWorkSource``: positions, epochs, caps.

Why this shape: a lane's position must be restorable in O(1) from a few integers,
whatever the dataset sizes and however far training went. So each dataset is read as
the infinite concatenation of its epochs, position ``p`` being row
``perm_(seed, d, p // N_d)(p % N_d)`` of epoch ``p // N_d`` (a keyed bijection, never
materialized; identity without shuffling). Lane ``l`` of ``C`` takes positions
``l, l + C, l + 2C, ...`` of every dataset, so the lanes partition each epoch exactly
(even when ``N_d < C``) and a lane's whole position is one cursor per dataset.

``num_epochs`` caps a dataset: cursor ``k`` is valid while ``l + k*C < E*N_d``
(:attr:`LaneRows.limits`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..rng import derive_seed
from .block_shuffle import BlockShuffle
from .permutation import KeyedPermutation, map_many

__all__ = ["LaneRows"]

_SCALAR_SEGMENT = 8  # epoch segments shorter than this are mapped without numpy


class LaneRows:
    """The rows at one lane's cursors, and what the caps leave of each dataset."""

    # ``source``: the StaticMixtureWorkSource (not imported: it imports this module)
    def __init__(self, source: Any, lane: int, num_lanes: int) -> None:
        self._src = source
        self.lane = lane
        self.num_lanes = num_lanes
        n_ds = len(source.lengths)
        #: per dataset, the cursor the cap ends at (None: unbounded)
        self.limits: list[int | None] = [None] * n_ds
        for d, n in enumerate(source.lengths):
            epochs = source.epochs_of(d)
            if epochs is not None:
                self.limits[d] = max(0, -(-(epochs * n - lane) // num_lanes))
        # caches of pure functions of the cursor (never part of the state)
        per_chunk = [source.chunk_size * w for w in source.weights]
        self._block = [max(64, min(4096, math.ceil(32 * m))) for m in per_chunk]
        self._buf: list[np.ndarray | None] = [None] * n_ds
        self._buf_start = [0] * n_ds
        self._perm: list[tuple[int, KeyedPermutation] | None] = [None] * n_ds
        bounds = source.block_bounds
        # per dataset: a block shuffle, or None for the row-level permutation
        self._blocks = [
            None
            if bounds is None or b is None
            else BlockShuffle(
                b, source.shuffle_window, num_lanes, derive_seed(source.seed, d, "blocks")
            )
            for d, b in enumerate(bounds or [None] * n_ds)
        ]

    # -- caps --------------------------------------------------------------------------

    def remaining(self, cursors: Sequence[int]) -> list[int | None]:
        """Per dataset, the cursors left before its cap (None: unbounded)."""
        return [
            None if lim is None else lim - cur
            for cur, lim in zip(cursors, self.limits, strict=True)
        ]

    def drained(self, cursors: Sequence[int]) -> bool:
        """Whether the lane has ended at ``cursors`` (``when_exhausted``)."""
        done = [
            lim is not None and cur >= lim for cur, lim in zip(cursors, self.limits, strict=True)
        ]
        weighted = self._src.ever_weighted
        if self._src.when_exhausted == "end":
            return any(d and w for d, w in zip(done, weighted, strict=True))
        return all(d or not w for d, w in zip(done, weighted, strict=True))

    def ends_lane(self, remaining: Sequence[int | None]) -> bool:
        """``when_exhausted="end"``: a weighted capped dataset just ran out."""
        return self._src.when_exhausted == "end" and any(
            r is not None and r <= 0 and w
            for r, w in zip(remaining, self._src.ever_weighted, strict=True)
        )

    def epoch_fraction(self, d: int, cursor: int) -> float:
        """How far into its epochs this lane's ``cursor`` of dataset ``d`` points."""
        return (self.lane + self.num_lanes * cursor) / self._src.lengths[d]

    # -- rows --------------------------------------------------------------------------

    def rows(self, d: int, k0: int, count: int) -> list[int]:
        """Rows of dataset ``d`` at this lane's cursors ``k0 .. k0 + count - 1``."""
        buf, start = self._buf[d], self._buf_start[d]
        if buf is None or k0 < start or k0 + count > start + len(buf):
            size = max(count, self._block[d])
            limit = self.limits[d]
            if limit is not None:
                size = min(size, limit - k0)
            buf, start = self._compute(d, k0, size), k0
            self._buf[d], self._buf_start[d] = buf, start
        return buf[k0 - start : k0 - start + count].tolist()

    def _epoch_key(self, d: int, epoch: int) -> int:
        """The key of dataset ``d``'s row permutation in ``epoch``."""
        return derive_seed(self._src.seed, d, epoch)

    def _permutation(self, d: int, epoch: int) -> KeyedPermutation:
        cached = self._perm[d]
        if cached is None or cached[0] != epoch:
            key = self._epoch_key(d, epoch)
            cached = (epoch, KeyedPermutation(self._src.lengths[d], key))
            self._perm[d] = cached
        return cached[1]

    def _compute(self, d: int, k0: int, size: int) -> np.ndarray:
        n = self._src.lengths[d]
        pos = self.lane + self.num_lanes * (k0 + np.arange(size, dtype=np.int64))
        local = pos % n
        if not self._src.shuffle:
            return local
        epochs = pos // n
        cuts = [0, *(np.flatnonzero(np.diff(epochs)) + 1).tolist(), size]
        if len(cuts) > 3 and self._blocks[d] is None:
            # a small dataset: many epochs in one pass, each under its own key
            first = int(epochs[0])
            keys = [self._epoch_key(d, e) for e in range(first, int(epochs[-1]) + 1)]
            return map_many(n, keys, epochs - first, local)
        out = np.empty(size, dtype=np.int64)
        for a, b in zip(cuts[:-1], cuts[1:], strict=True):
            if self._blocks[d] is not None:
                out[a:b] = self._blocks[d].map_array(local[a:b], int(epochs[a]))
                continue
            perm = self._permutation(d, int(epochs[a]))
            if b - a < _SCALAR_SEGMENT:
                out[a:b] = [perm(int(i)) for i in local[a:b]]
            else:
                out[a:b] = perm.map_array(local[a:b])
        return out
