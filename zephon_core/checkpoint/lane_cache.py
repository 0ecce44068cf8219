"""Each lane's encoded state, encoded again only when the lane changed (``docs/design.md`` §8).

A handle that owns C lanes is asked for its state once per training step, and between two
steps only the lanes that delivered (or whose producer pulled a chunk) changed. Encoding
every lane on every call costs O(C) Python work (hundreds of ms at C=512); so the owner of
the lanes keeps a :class:`LaneCache`: each lane's msgpack bytes under a *version* -- a
tuple of counters the owner bumps on every change of that lane's state -- and a lane is
encoded again only when its version moved. The owner reads the version *before* it builds
the state it encodes, so a change racing with the build leaves a stale version behind,
never stale bytes.

The cached values are ``bytes``: immutable, so a per-rank state (``distributed/dcp.py``)
shares them between calls safely (``dcp.async_save`` keeps what was true at the call), and
:func:`merged` unpacks them into fresh containers for a merged state that shares nothing.

``_CACHING`` is a test-only switch (tests and ``benchmarks/bench_state_cost.py`` compare
the cached states with states encoded afresh): False encodes every lane on every call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import msgpack

from .state import CHANGES_VERSION, VERSION, LaneState, PipelineState

__all__ = ["EncodedState", "LaneBytes", "LaneCache", "caching", "encode_lane", "merged"]

#: test-only (see the module docstring)
_CACHING = True


def caching() -> bool:
    """Whether lane caches keep what they encode (always, outside tests)."""
    return _CACHING


class LaneBytes(NamedTuple):
    """One lane's encoded state."""

    version: Any  # the owner's version of the lane when it was encoded
    data: bytes  # msgpack of ``LaneState.to_dict()``
    drops: bool  # an inflight chunk carries drops (the state's schema version)


class EncodedState(NamedTuple):
    """A state as its header (a ``PipelineState`` without lanes) and its lanes' bytes."""

    header: PipelineState
    lanes: dict[int, LaneBytes]


def encode_lane(state: LaneState, version: Any = None) -> LaneBytes:
    d = state.to_dict()
    drops = any(len(c) > 4 for c in d["chunks"])
    return LaneBytes(version, msgpack.packb(d, use_bin_type=True), drops)


class LaneCache:
    """Lane id -> its last :class:`LaneBytes` (see the module docstring)."""

    def __init__(self) -> None:
        self._lanes: dict[int, LaneBytes] = {}

    def encoded(self, lane: int, version: Any, build: Callable[[], LaneState]) -> LaneBytes:
        """``lane``'s bytes at ``version``; ``build`` (called only when the lane changed)
        gives its state, read after ``version`` was."""
        if not _CACHING:
            return encode_lane(build(), version)
        hit = self._lanes.get(lane)
        if hit is not None and hit.version == version:
            return hit
        entry = self._lanes[lane] = encode_lane(build(), version)
        return entry


def merged(state: EncodedState) -> dict[str, Any]:
    """``state.header`` with its lanes as ``PipelineState.to_dict()`` writes them: every
    container new (unpacked from the bytes in one call)."""
    out = state.header.to_dict()
    lanes = [state.lanes[k] for k in sorted(state.lanes)]
    out["lanes"] = _unpack_list(lane.data for lane in lanes)
    if out["version"] != CHANGES_VERSION:  # the header alone decided, lanes may still
        out["version"] = CHANGES_VERSION if any(lane.drops for lane in lanes) else VERSION
    return out


def _unpack_list(items: Iterable[bytes]) -> list[Any]:
    parts = list(items)
    n = len(parts)
    if n < 16:
        head = bytes([0x90 | n])  # fixarray
    elif n < 1 << 16:
        head = b"\xdc" + n.to_bytes(2, "big")  # array 16
    else:
        head = b"\xdd" + n.to_bytes(4, "big")  # array 32
    return msgpack.unpackb(head + b"".join(parts), raw=False, strict_map_key=False)
