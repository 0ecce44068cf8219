"""The checkpoint schema: typed, versioned, read strictly.

A pipeline state is a plain dict (ints, strs, lists, bools, None) so it can
be stored by msgpack, ``torch.save`` or a trainer's own checkpoint:

``format``, ``version``, ``fingerprint``, ``config`` (what the fingerprint
hashes, so a mismatch can say what differs), ``position`` (the global
round-robin position g) and ``lanes`` -- one entry per canonical lane:
``lane``, ``floor`` (lowest inflight chunk id), ``next_chunk``, ``chunks``
(the inflight chunks, in full), ``boundaries`` (incl. the trailing one),
``source`` (WorkSource state after the last inflight chunk), ``cursor``
(replay cursor), ``delivered`` (lane progress), ``exhausted`` and ``tokens``.
Per-offset bitmaps are deliberately absent: replay rebuilds them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..engine.lanes import turns_of_lane
from ..errors import CorruptCheckpoint, IncompatibleCheckpoint
from ..records import SampleCursor
from ..sources.chunk import WorkChunk

FORMAT = "zephon.pipeline_state"
VERSION = 1

_LANE_KEYS = {"lane", "floor", "next_chunk", "chunks", "boundaries", "source", "cursor",
              "delivered", "exhausted", "tokens"}
_TOP_KEYS = {"format", "version", "fingerprint", "config", "position", "lanes"}


@dataclass
class LaneState:
    lane: int
    floor: int = 0
    next_chunk: int = 0
    chunks: list[WorkChunk] = field(default_factory=list)
    boundaries: list[int] = field(default_factory=list)
    source: dict[str, Any] = field(default_factory=dict)
    cursor: SampleCursor | None = None
    delivered: int = 0
    exhausted: bool = False
    tokens: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"lane": self.lane, "floor": self.floor, "next_chunk": self.next_chunk,
                "chunks": [c.to_state() for c in self.chunks],
                "boundaries": list(self.boundaries), "source": self.source,
                "cursor": list(self.cursor) if self.cursor is not None else None,
                "delivered": self.delivered, "exhausted": self.exhausted,
                "tokens": list(self.tokens)}

    @classmethod
    def from_dict(cls, d: Any) -> LaneState:
        _check_keys(d, _LANE_KEYS, "lane state")
        lane = _int(d["lane"], "lane")
        cursor = d["cursor"]
        if cursor is not None:
            if not isinstance(cursor, (list, tuple)) or len(cursor) != 4:
                raise CorruptCheckpoint(f"lane {lane}: cursor {cursor!r} is not 4 ints")
            cursor = SampleCursor(*(_int(x, "cursor") for x in cursor))
        chunks = [WorkChunk.from_state(lane, c) for c in _list(d["chunks"], "chunks")]
        st = cls(lane=lane, floor=_int(d["floor"], "floor"),
                 next_chunk=_int(d["next_chunk"], "next_chunk"), chunks=chunks,
                 boundaries=[_int(b, "boundary") for b in _list(d["boundaries"], "boundaries")],
                 source=d["source"], cursor=cursor,
                 delivered=_int(d["delivered"], "delivered"),
                 exhausted=_bool(d["exhausted"], "exhausted"),
                 tokens=[_int(t, "tokens") for t in _list(d["tokens"], "tokens")])
        ids = [c.chunk_id for c in chunks]
        if ids != list(range(st.floor, st.next_chunk)):
            raise CorruptCheckpoint(f"lane {lane}: inflight chunk ids {ids} are not the "
                                    f"consecutive range [{st.floor}, {st.next_chunk})")
        if not isinstance(st.source, dict):
            raise CorruptCheckpoint(f"lane {lane}: source state is not a dict")
        return st


@dataclass
class PipelineState:
    fingerprint: str
    config: dict[str, Any]
    position: int
    lanes: dict[int, LaneState]

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "fingerprint": self.fingerprint,
                "config": self.config, "position": self.position,
                "lanes": [self.lanes[k].to_dict() for k in sorted(self.lanes)]}

    @classmethod
    def from_dict(cls, d: Any) -> PipelineState:
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise CorruptCheckpoint("not a Zephon pipeline state (missing 'format': "
                                    f"{FORMAT!r}); pass what Pipeline.checkpoint() returned")
        if d.get("version") != VERSION:
            raise IncompatibleCheckpoint(
                f"checkpoint schema version {d.get('version')!r}, this Zephon reads version "
                f"{VERSION}; resume with the Zephon release that wrote it")
        _check_keys(d, _TOP_KEYS, "pipeline state")
        lanes = {}
        for ld in _list(d["lanes"], "lanes"):
            ls = LaneState.from_dict(ld)
            if ls.lane in lanes:
                raise CorruptCheckpoint(f"lane {ls.lane} appears twice")
            lanes[ls.lane] = ls
        if not isinstance(d["config"], dict) or not isinstance(d["fingerprint"], str):
            raise CorruptCheckpoint("config/fingerprint missing or of the wrong type")
        return cls(d["fingerprint"], d["config"], _int(d["position"], "position"), lanes)


def _check_keys(d: Any, keys: set[str], what: str) -> None:
    if not isinstance(d, dict):
        raise CorruptCheckpoint(f"{what} is {type(d).__name__}, expected a dict")
    missing, extra = keys - d.keys(), d.keys() - keys
    if missing or extra:
        raise CorruptCheckpoint(f"{what}: missing keys {sorted(missing)}, unexpected keys "
                                f"{sorted(map(str, extra))}")


def _int(x: Any, what: str) -> int:
    if isinstance(x, bool) or not isinstance(x, int):
        raise CorruptCheckpoint(f"{what} is {x!r}, expected an int")
    return x


def _bool(x: Any, what: str) -> bool:
    if not isinstance(x, bool):
        raise CorruptCheckpoint(f"{what} is {x!r}, expected a bool")
    return x


def _list(x: Any, what: str) -> list:
    if not isinstance(x, (list, tuple)):
        raise CorruptCheckpoint(f"{what} is {type(x).__name__}, expected a list")
    return list(x)


def check_progress(state: PipelineState, n: int) -> None:
    """Lane progress must be consistent with one global position."""
    if sorted(state.lanes) != list(range(n)):
        raise IncompatibleCheckpoint(f"checkpoint holds lanes {sorted(state.lanes)}, the "
                                     f"pipeline has canonical_replicas={n}")
    bad = []
    for lane, ls in state.lanes.items():
        turns = turns_of_lane(lane, state.position, n)
        ok = ls.delivered <= turns if ls.exhausted else ls.delivered == turns
        if not ok:
            bad.append(f"lane {lane}: {ls.delivered} outputs delivered, position "
                       f"{state.position} implies {turns}")
    if bad:
        raise IncompatibleCheckpoint(
            "lane progress is inconsistent with a single global position (were lane states "
            "from ranks that checkpointed at different steps merged?): " + "; ".join(bad))
