"""A keyed pseudo-random bijection of ``range(n)``, computed index by index.

Why: shuffling a dataset epoch by materializing ``np.random.permutation(n)``
costs O(n) memory and time per epoch and per lane, and a checkpoint would have
to store (or regenerate) it. A keyed bijection maps position ``i`` to row
``perm(i)`` directly, so a 10^9-row dataset costs the same as a 10-row one and
restoring a position is O(1).

Construction: a balanced Feistel network over ``2h`` bits (the smallest even
bit count with ``2**(2h) >= n``, at least 2 bits). Each round swaps the halves
and XORs one half with a SplitMix64-style mix of the other half and a round
key, masked to ``h`` bits; a Feistel network is a bijection whatever the round
function is. Values that land outside ``[0, n)`` are re-encrypted
("cycle-walking") until they fall inside, which keeps the map a bijection of
``range(n)``; since the domain is less than 4n, the expected number of walks
is below 4.

Example:
    >>> perm = KeyedPermutation(10, key=1234)
    >>> sorted(perm(i) for i in range(10)) == list(range(10))
    True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..rng import MASK64, derive_seed
from ..validate import is_int as _is_int

__all__ = ["KeyedPermutation", "map_many"]

_GOLDEN = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB
_MAX_N = 1 << 63  # indices and results are int64

_U_GOLDEN = np.uint64(_GOLDEN)
_U_MIX1 = np.uint64(_MIX1)
_U_MIX2 = np.uint64(_MIX2)
_U30 = np.uint64(30)
_U27 = np.uint64(27)
_U31 = np.uint64(31)


class KeyedPermutation:
    """A pseudo-random permutation of ``range(n)`` keyed by a 64-bit ``key``.

    Never materialized: memory is O(rounds), independent of ``n``.

    Args:
        n: size of the domain, ``1 <= n <= 2**63``.
        key: any integer; only its low 64 bits matter.
        rounds: Feistel rounds (at least 4).

    Example:
        >>> p = KeyedPermutation(10**9, key=7)
        >>> 0 <= p(123_456_789) < 10**9
        True
    """

    __slots__ = ("n", "key", "rounds", "half_bits", "_mask", "_keys", "_ukeys")

    def __init__(self, n: int, key: int, rounds: int = 6) -> None:
        if not _is_int(n) or not 1 <= int(n) <= _MAX_N:
            raise ConfigError(
                f"KeyedPermutation needs an integer n with 1 <= n <= 2**63, got {n=!r}"
            )
        if not _is_int(key):
            raise ConfigError(f"KeyedPermutation key must be an integer, got {key=!r}")
        if not _is_int(rounds) or int(rounds) < 4:
            raise ConfigError(f"KeyedPermutation needs at least 4 rounds, got {rounds=!r}")
        self.n = int(n)
        self.key = int(key) & MASK64
        self.rounds = int(rounds)
        bits = max(2, (self.n - 1).bit_length())
        bits += bits & 1  # balanced: an even number of bits
        self.half_bits = bits // 2
        self._mask = (1 << self.half_bits) - 1
        self._keys = tuple(derive_seed(self.key, r) for r in range(self.rounds))
        self._ukeys: tuple[np.uint64, ...] = ()  # numpy copies, built on first map_array

    def __repr__(self) -> str:
        return f"KeyedPermutation(n={self.n}, key={self.key:#x}, rounds={self.rounds})"

    # -- scalar --------------------------------------------------------------------------

    def _encrypt(self, x: int) -> int:
        h, mask = self.half_bits, self._mask
        left, right = x >> h, x & mask
        for k in self._keys:
            z = (right * _GOLDEN + k) & MASK64
            z = ((z ^ (z >> 30)) * _MIX1) & MASK64
            z = ((z ^ (z >> 27)) * _MIX2) & MASK64
            left, right = right, left ^ ((z ^ (z >> 31)) & mask)
        return (left << h) | right

    def __call__(self, i: int) -> int:
        """The image of position ``i`` (``0 <= i < n``)."""
        if not _is_int(i):
            raise TypeError(f"KeyedPermutation index must be an integer, got {i!r}")
        i = int(i)
        if not 0 <= i < self.n:
            raise IndexError(f"index {i} out of range for a permutation of n={self.n}")
        y = self._encrypt(i)
        while y >= self.n:  # cycle-walking: terminates because i itself is in range
            y = self._encrypt(y)
        return y

    # -- vectorized ------------------------------------------------------------------------

    def _encrypt_array(self, x: np.ndarray, keys: Any = None) -> np.ndarray:
        """Same as :meth:`_encrypt` on a uint64 array (wrapping arithmetic); ``keys``
        (one uint64 array per round, aligned with ``x``) replaces the round keys."""
        mask, shift = np.uint64(self._mask), np.uint64(self.half_bits)
        left = x >> shift
        right = x & mask
        for k in self._ukeys if keys is None else keys:
            z = right * _U_GOLDEN
            z += k
            z ^= z >> _U30
            z *= _U_MIX1
            z ^= z >> _U27
            z *= _U_MIX2
            z ^= z >> _U31
            z &= mask
            z ^= left
            left, right = right, z
        left <<= shift
        left |= right
        return left

    def map_array(self, idx: np.ndarray) -> np.ndarray:
        """Vectorized ``__call__``: maps an integer array, returns int64 of the same shape.

        Gives results identical to the scalar version.
        """
        arr = np.asarray(idx)
        if arr.dtype.kind not in "iu":
            raise TypeError(f"map_array needs an integer array, got dtype {arr.dtype}")
        if arr.size == 0:
            return np.zeros(arr.shape, dtype=np.int64)
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi >= self.n:
            bad = lo if lo < 0 else hi
            raise IndexError(f"index {bad} out of range for a permutation of n={self.n}")
        if not self._ukeys:
            self._ukeys = tuple(np.uint64(k) for k in self._keys)
        flat = arr.astype(np.uint64).ravel()
        n = np.uint64(self.n)
        with np.errstate(over="ignore"):
            y = self._encrypt_array(flat)
            todo = np.flatnonzero(y >= n)
            while todo.size:  # cycle-walking, only on the values still out of range
                walked = self._encrypt_array(y[todo])
                y[todo] = walked
                todo = todo[walked >= n]
        return y.astype(np.int64).reshape(arr.shape)


def map_many(n: int, keys: Sequence[int], which: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """``KeyedPermutation(n, keys[which[i]])(idx[i])`` for every ``i``, in one vectorized
    pass. Why: a dataset smaller than a lane's read-ahead spans many epochs, each with
    its own key; mapping them one epoch at a time costs a numpy pass per epoch.

    Example:
        >>> import numpy as np
        >>> got = map_many(10, [3, 4], np.array([0, 1, 1]), np.array([5, 5, 6]))
        >>> got.tolist() == [KeyedPermutation(10, 3)(5), KeyedPermutation(10, 4)(5),
        ...                  KeyedPermutation(10, 4)(6)]
        True
    """
    proto = KeyedPermutation(n, 0)  # the bit layout depends on n alone
    table = np.array(
        [[derive_seed(int(k) & MASK64, r) for r in range(proto.rounds)] for k in keys],
        dtype=np.uint64,
    )
    per_elem = table[np.asarray(which)]  # [m, rounds]
    y = np.asarray(idx).astype(np.uint64).ravel()
    keys_of = [per_elem[:, r] for r in range(proto.rounds)]
    bound = np.uint64(n)
    with np.errstate(over="ignore"):
        y = proto._encrypt_array(y, keys_of)
        todo = np.flatnonzero(y >= bound)
        while todo.size:  # cycle-walking, each element with its own keys
            walked = proto._encrypt_array(y[todo], [k[todo] for k in keys_of])
            y[todo] = walked
            todo = todo[walked >= bound]
    return y.astype(np.int64)
