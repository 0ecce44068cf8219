"""A locality-aware shuffle of one epoch: blocks permuted, rows shuffled within windows.

Why: a row-level keyed permutation (``permutation.py``) sends consecutive positions to
rows anywhere in the dataset. Over sharded Parquet in object storage that is one
row-group read per row. Here a dataset is cut into **blocks** (row groups, or ``B``
rows) and an epoch position ``i`` is mapped to a row in three O(1) steps:

1. **Lane segment.** With ``C`` canonical lanes, the lane that takes position ``i``
   takes ``i ≡ r (mod C)``; its ``q``-th position (``q = i // C``) goes to
   ``j = offset(r) + q`` where class ``r`` owns the contiguous range
   ``[offset(r), offset(r) + n_r)`` of ``n_r = ceil((n - r) / C)`` slots. So each lane
   reads one contiguous run of the epoch's block order, and lanes share at most the
   block on each edge of their run.
2. **Window.** A lane's run is cut into windows of ``window`` x (mean block size) slots;
   a keyed permutation per (epoch, class, window) shuffles the slots of a window. A lane
   therefore holds at most ``window + 2`` blocks at once.
3. **Blocks.** Slot ``j`` falls in the ``j``-th row of the epoch's block order: the blocks
   permuted by a keyed permutation of the epoch, concatenated (one prefix sum of block
   sizes per epoch: memory O(number of blocks), like the shard index itself).

Nothing enters the checkpoint: the map depends only on the rows per block, ``C``,
``window``, the key and the epoch, so a lane's cursor still restores in O(1), lanes still
partition every epoch (each step is a bijection), and the global stream is the same for
every number of ranks and DataLoader workers (``C`` is the canonical lane count).

Example:
    >>> import numpy as np
    >>> bounds = np.arange(0, 101, 10)  # 10 blocks of 10 rows
    >>> shuf = BlockShuffle(bounds, window=2, num_lanes=2, key=5)
    >>> rows = shuf.map_array(np.arange(100), epoch=0)
    >>> sorted(rows.tolist()) == list(range(100))
    True
    >>> len({int(r) // 10 for r in rows[0::2][:20]})  # lane 0's first window: 2 blocks
    2
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ConfigError
from ..rng import derive_seed
from .permutation import KeyedPermutation

__all__ = ["BlockShuffle", "block_bounds"]

_KEEP_EPOCHS = 2  # a chunk may straddle one epoch boundary
_KEEP_WINDOWS = 8


def block_bounds(dataset: Any, n: int, block: int | str, name: str) -> np.ndarray | None:
    """Row offsets of the blocks of ``dataset`` (``n`` rows): multiples of an int
    ``block``, or the dataset's own ``block_bounds()`` for ``"row_group"`` (``None`` for a
    dataset without row groups: in memory, a row-level shuffle costs nothing extra).

    Raises:
        ConfigError: bad bounds.
    """
    if block == "row_group":
        fn = getattr(dataset, "block_bounds", None)
        if not callable(fn):
            return None
        bounds = np.asarray(fn(), dtype=np.int64)
        if (
            bounds.ndim != 1
            or len(bounds) < 2
            or bounds[0] != 0
            or bounds[-1] != n
            or np.any(np.diff(bounds) < 0)
        ):
            raise ConfigError(
                f"dataset {name!r}: block_bounds() must rise from 0 to len ({n}), got "
                f"{bounds[:8].tolist()}{'...' if len(bounds) > 8 else ''}"
            )
        return np.unique(bounds)  # empty blocks (an empty row group or shard) hold no rows
    return np.append(np.arange(0, n, int(block), dtype=np.int64), np.int64(n))


class BlockShuffle:
    """Epoch position -> row, with locality (see the module docstring).

    Args:
        bounds: block row offsets, ``0 = bounds[0] < ... < bounds[-1] = n``.
        window: blocks shuffled together per lane.
        num_lanes: the canonical lane count ``C``.
        key: keys every permutation (derive it from the source seed and dataset).
    """

    def __init__(self, bounds: np.ndarray, window: int, num_lanes: int, key: int) -> None:
        self.bounds = np.asarray(bounds, dtype=np.int64)
        self.n = int(self.bounds[-1])
        self.sizes = np.diff(self.bounds)
        self.num_blocks = len(self.sizes)
        self.num_lanes = int(num_lanes)
        self.key = int(key)
        # a window in slots: `window` blocks of the mean size (row groups vary a little)
        self.window_rows = max(1, int(window) * -(-self.n // self.num_blocks))
        self._epochs: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._windows: dict[tuple[int, int, int], KeyedPermutation] = {}

    def _block_order(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """The epoch's block order and where each block starts in slot space."""
        got = self._epochs.get(epoch)
        if got is None:
            perm = KeyedPermutation(self.num_blocks, derive_seed(self.key, "blocks", epoch))
            order = perm.map_array(np.arange(self.num_blocks, dtype=np.int64))
            starts = np.zeros(self.num_blocks + 1, dtype=np.int64)
            np.cumsum(self.sizes[order], out=starts[1:])
            if len(self._epochs) >= _KEEP_EPOCHS:
                self._epochs.pop(min(self._epochs))
            got = self._epochs[epoch] = (order, starts)
        return got

    def _window(self, epoch: int, r: int, g: int, size: int) -> KeyedPermutation:
        k = (epoch, r, g)
        perm = self._windows.get(k)
        if perm is None:
            if len(self._windows) >= _KEEP_WINDOWS:
                self._windows.pop(next(iter(self._windows)))
            perm = self._windows[k] = KeyedPermutation(
                size, derive_seed(self.key, "window", epoch, r, g)
            )
        return perm

    def slots(self, i: np.ndarray, epoch: int) -> np.ndarray:
        """Steps 1-2: epoch positions -> slots of the epoch's block order."""
        C, n = self.num_lanes, self.n
        a, b = divmod(n, C)
        r, q = i % C, i // C
        offset = r * a + np.minimum(r, b)
        n_r = a + (r < b)
        W = self.window_rows
        g = q // W
        t = q - g * W
        size = np.minimum(W, n_r - g * W)
        out = np.empty_like(i)
        # positions of one call come from one or two (class, window) pairs
        key = r * (n // max(1, W) + 2) + g
        for k in np.unique(key).tolist():
            pick = np.flatnonzero(key == k)
            p0 = int(pick[0])
            perm = self._window(epoch, int(r[p0]), int(g[p0]), int(size[p0]))
            out[pick] = perm.map_array(t[pick])
        return offset + g * W + out

    def map_array(self, i: np.ndarray, epoch: int) -> np.ndarray:
        """Rows of epoch positions ``i`` (an int64 array, ``0 <= i < n``) of ``epoch``."""
        i = np.asarray(i, dtype=np.int64)
        order, starts = self._block_order(int(epoch))
        j = self.slots(i, int(epoch))
        slot = np.searchsorted(starts, j, side="right") - 1
        return self.bounds[order[slot]] + (j - starts[slot])
