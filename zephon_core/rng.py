"""Counter-based randomness: every random value is a pure function of its keys.

No global RNG state is ever read, and ``hash()`` is never used (PYTHONHASHSEED
differs between processes), so replay reproduces every draw.
"""

from __future__ import annotations

import hashlib

import numpy as np

MASK64 = (1 << 64) - 1


def splitmix64(x: int) -> int:
    """One SplitMix64 finalization step: a fast, well-mixed 64-bit bijection."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def derive_seed(*keys: int | str) -> int:
    """Derive a 64-bit seed from integers and strings, stable across processes."""
    h = 0x5A4E50484F4E  # "ZEPHON"
    for k in keys:
        if isinstance(k, str):
            k = int.from_bytes(hashlib.blake2b(k.encode(), digest_size=8).digest(), "little")
        h = splitmix64(h ^ (int(k) & MASK64))
    return h


def generator(*keys: int | str) -> np.random.Generator:
    """A numpy Generator keyed only by ``keys`` (Philox, counter-based)."""
    return np.random.Generator(np.random.Philox(key=derive_seed(*keys)))
