"""The value digest: a cheap checksum of one record's values, checked during replay.
(``docs/design.md`` §6)

The replay filter matches the saved cursor by position. If the data or a function
changed since the checkpoint in a way the content fingerprints did not see (an edit
of an unsampled row, say), the record replayed at that position has other values.
So each lane's state carries the digest of the record behind its last delivered
output -- the batch's last member, or the output itself without ``batch`` -- and the
replay filter compares it when it finds the target (``ReplayDivergence`` on a
mismatch).

CRC-32 over the raw bytes of arrays and strings: a few microseconds per output.
Arrays above :data:`FULL_BYTES` contribute a strided sample.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np

FULL_BYTES = 1 << 16
_MAX_ITEMS = 256

__all__ = ["Deferred", "resolve", "value_digest"]


def value_digest(payload: Any) -> int:
    """A 32-bit checksum of ``payload``'s values (dicts, sequences, arrays, scalars)."""
    return _crc(payload, 0, 0)


class Deferred:
    """A digest computed only when a state is taken, not for every output.

    ``batch`` uses it for its last member: a record inside the pipeline that no consumer
    sees or can change, so digesting it later gives the same value."""

    __slots__ = ("payload",)

    def __init__(self, payload: Any):
        self.payload = payload


def resolve(digest: int | Deferred | None) -> int | None:
    """The digest as a number (computing a deferred one)."""
    return value_digest(digest.payload) if isinstance(digest, Deferred) else digest


def _crc(v: Any, crc: int, depth: int) -> int:
    if isinstance(v, np.ndarray):
        # shape and type folded in as integers: no string formatting on the hot path
        crc = (crc * 1_000_003 + v.size * 64 + v.itemsize * 8 + v.ndim) & 0xFFFFFFFF
        if v.dtype.kind == "O":
            for x in v.ravel()[:_MAX_ITEMS]:
                crc = _crc(x, crc, depth + 1)
            return crc
        if v.nbytes > FULL_BYTES:
            v = v.reshape(-1)[:: v.nbytes // FULL_BYTES + 1]
        return zlib.crc32(v.data if v.flags.c_contiguous else np.ascontiguousarray(v).data, crc)
    if isinstance(v, Mapping):
        for k in v:
            crc = zlib.crc32(str(k).encode(), crc)
            crc = _crc(v[k], crc, depth + 1)
        return crc
    if isinstance(v, str):
        return zlib.crc32(v.encode("utf-8", "surrogatepass"), crc)
    if isinstance(v, (bytes, bytearray)):
        return zlib.crc32(v, crc)
    if isinstance(v, (list, tuple)) and depth < 8:
        crc = zlib.crc32(str(len(v)).encode(), crc)
        for x in v[:_MAX_ITEMS]:
            crc = _crc(x, crc, depth + 1)
        return crc
    if hasattr(v, "detach") and hasattr(v, "numpy"):  # a torch tensor
        return _crc(v.detach().cpu().numpy(), crc, depth)
    return zlib.crc32(
        repr(v).encode()
        if isinstance(v, (int, float, bool, type(None), np.generic))
        else type(v).__qualname__.encode(),
        crc,
    )
