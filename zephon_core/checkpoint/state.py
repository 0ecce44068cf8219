"""The checkpoint schema: typed, versioned, read strictly (``docs/design.md`` §6, §8).

A pipeline state is a plain dict (ints, strs, lists, bools, None) so it can
be stored by msgpack, ``torch.save`` or a trainer's own checkpoint:

``format``, ``version``, ``fingerprint``, ``config`` (what the fingerprint
hashes, so a mismatch can say what differs), ``content`` (digests of every
component and user function, ``digests/content.py``), ``position`` (the global
round-robin position g) and ``lanes`` -- one entry per canonical lane:
``lane``, ``floor`` (lowest inflight chunk id), ``next_chunk``, ``chunks``
(the inflight chunks, in full), ``boundaries`` (incl. the trailing one),
``source`` (WorkSource state after the last inflight chunk), ``cursor``
(replay cursor), ``digest`` (value digest behind the last delivered output),
``delivered`` (lane progress), ``exhausted``, ``tokens``, ``chunk_digests`` (a CRC-32
of each inflight chunk's id, seed and pointers, so a pointer changed after the save is
refused instead of replayed) and, for a while after a re-mix, ``prior`` (the old
targets of the operators that keep mixture targets, ``remix.py``).
Per-offset bitmaps are deliberately absent: replay rebuilds them.

Since schema version 3 a state also names the Zephon that wrote it (``zephon_version``),
so a refusal can say which release can resume it (``provenance.py``). Older states are
still read: version 2 (without ``zephon_version`` and ``chunk_digests``) exactly as
before; version 1 (also without ``content`` and ``digest``) without the content checks.
States of releases that named map/filter functions in the configuration (``ops[i].fn``,
a ``module.qualname``) are read without those names, their fingerprint recomputed: the
content digest identifies a function now. Every reader (a restore, ``zephon inspect`` /
``diff``, a merge of lane states) sees the migrated configuration.

``to_dict()`` and ``from_dict()`` copy every container, so a state handed out never
shares anything with a running pipeline, and editing it changes nothing else.

A lane's state has one shape, :class:`LaneState`, and changes by two events:
:class:`Delivery` (what one delivered output changed: progress, cursor, counters) and
:class:`LaneDelta` (a delivery plus the chunks, boundaries and source state registered
since the last delta, for a consumer in another process). ``LaneState.advance`` and
``LaneState.apply`` apply them.
"""

from __future__ import annotations

import dataclasses
import logging
import struct
import zlib
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .._version import __version__
from ..chunk import WorkChunk
from ..digests.fingerprint import fingerprint, without_legacy_keys
from ..digests.value_digest import Deferred, resolve
from ..errors import ContractViolation, CorruptCheckpoint, IncompatibleCheckpoint
from ..records import SampleCursor
from ..validate import is_int
from .data_changes import NO_CHANGES, DataChanges

FORMAT = "zephon.pipeline_state"
VERSION = 3
#: written instead of ``VERSION`` by a state that records skipped positions or excluded
#: rows (``data_changes.py``) or holds a chunk read with drops: a release that cannot
#: follow them refuses it by its version, naming the release that wrote it
CHANGES_VERSION = 4
#: the schema versions this Zephon reads
READS = (1, 2, VERSION, CHANGES_VERSION)

_LANE_KEYS_V1 = frozenset(
    {
        "lane",
        "floor",
        "next_chunk",
        "chunks",
        "boundaries",
        "source",
        "cursor",
        "delivered",
        "exhausted",
        "tokens",
    }
)
_LANE_KEYS = {1: _LANE_KEYS_V1, 2: _LANE_KEYS_V1 | {"digest"}}
_LANE_KEYS[3] = _LANE_KEYS[2] | {"chunk_digests"}
_LANE_KEYS[4] = _LANE_KEYS[3]
_TOP_KEYS_V1 = frozenset({"format", "version", "fingerprint", "config", "position", "lanes"})
_TOP_KEYS = {1: _TOP_KEYS_V1, 2: _TOP_KEYS_V1 | {"content"}}
_TOP_KEYS[3] = _TOP_KEYS[2] | {"zephon_version"}
_TOP_KEYS[4] = _TOP_KEYS[3]
#: written only when a run skips positions or excludes rows (``data_changes.py``)
_OPTIONAL_TOP_KEYS = frozenset({"skip", "exclude"})

log = logging.getLogger(__name__)


def plain_copy(x: Any) -> Any:
    """A copy of a plain state value (dicts, lists, tuples, scalars) sharing no container:
    what a state handed out or taken in is made of. Much cheaper than ``copy.deepcopy``."""
    if isinstance(x, dict):
        return {k: plain_copy(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [plain_copy(v) for v in x]
    return x


def chunk_digest(chunk: WorkChunk) -> int:
    """CRC-32 of a chunk's id, seed, components and rows (little-endian uint64s): stored
    next to each inflight chunk, so a pointer that changed after the save is caught at
    admission instead of replaying another document."""
    n = 2 + 2 * len(chunk.rows)
    crc = zlib.crc32(
        struct.pack(f"<{n}Q", chunk.chunk_id, chunk.seed, *chunk.components, *chunk.rows)
    )
    if chunk.dropped:  # offsets an exclusion dropped when it was read (data_changes.py)
        crc = zlib.crc32(struct.pack(f"<{len(chunk.dropped)}Q", *chunk.dropped), crc)
    return crc


def turns_of_lane(lane: int, position: int, num_lanes: int) -> int:
    """How many of the global positions 0..position-1 belong to ``lane`` (g mod C)."""
    return max(0, (position - lane + num_lanes - 1) // num_lanes)


class Prior(NamedTuple):
    """After a re-mix: flush segments that start before chunk ``chunk`` keep the old
    mixture targets (``remix.py``). ``targets``: the old source weights (for operators
    that read them); ``ops``: (operator name, its old targets) for every operator with
    mixture targets (absent in states written before operators' own weights could
    change). Targets are normalized, in the new component order."""

    chunk: int
    targets: tuple[float, ...]
    ops: tuple[tuple[str, tuple[float, ...]], ...] = ()


class Delivery(NamedTuple):
    """What one delivered output changed in its lane's state."""

    floor: int  # lowest chunk id still inflight
    cursor: SampleCursor | None  # replay cursor: identity of the last delivered record
    delivered: int  # outputs delivered on this lane
    exhausted: bool  # the lane's stream ended
    tokens: tuple[int, ...]  # cumulative delivered tokens per component
    digest: int | Deferred | None = None  # values of the record behind the last output


@dataclass(frozen=True)
class LaneDelta:
    """A delivery plus what a consumer in another process has not seen yet."""

    lane: int
    delivery: Delivery
    new_chunks: tuple[WorkChunk, ...]
    boundaries: tuple[int, ...]
    source: dict[str, Any]
    next_chunk: int
    #: now and then, the sending worker's cumulative operator counters (``engine/stats.py``)
    stats: Any = None


@dataclass
class LaneState:
    """Everything a checkpoint holds for one lane (see the module docstring)."""

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
    digest: int | None = None
    #: after a re-mix: operators keep their old mixture targets in flush segments that
    #: start before chunk ``prior.chunk`` (``remix.py``)
    prior: Prior | None = None
    #: the chunk digests a state was read with (None: a version-2 state had none), checked
    #: by admission (:func:`check_chunk_digests`); ``to_dict`` computes them afresh
    saved_digests: tuple[int, ...] | None = field(default=None, compare=False)

    def copy(self) -> LaneState:
        """A copy whose lists can change independently (the source state never changes);
        its chunks may change, so the digests read with them are not kept."""
        return dataclasses.replace(
            self,
            chunks=list(self.chunks),
            boundaries=list(self.boundaries),
            tokens=list(self.tokens),
            saved_digests=None,
        )

    def progress(self) -> Delivery:
        """The delivered part of this state, as the event that would produce it."""
        return Delivery(
            self.floor, self.cursor, self.delivered, self.exhausted, tuple(self.tokens), self.digest
        )

    def advance(self, d: Delivery) -> None:
        """Adopt one delivered output's progress; chunks below its floor leave."""
        self.floor, self.cursor, self.delivered = d.floor, d.cursor, d.delivered
        self.exhausted, self.tokens, self.digest = d.exhausted, list(d.tokens), resolve(d.digest)
        cut = 0
        while cut < len(self.chunks) and self.chunks[cut].chunk_id < d.floor:
            cut += 1
        if cut:
            del self.chunks[:cut]

    def apply(self, delta: LaneDelta) -> None:
        """Mirror a delta from another process: its new chunks, then its delivery.

        One output can complete several chunks or epochs, and a delta omits chunks
        below the new floor that were never sent, so the first new chunk follows
        either the chunks held or the floor.
        """
        d = delta.delivery
        self.advance(d)
        expected = self.chunks[-1].chunk_id + 1 if self.chunks else d.floor
        for c in delta.new_chunks:
            if c.chunk_id < expected:
                continue  # held already, or below the floor
            if c.chunk_id != expected:
                raise ContractViolation(
                    f"lane {self.lane}: delta chunk {c.chunk_id} does not "
                    f"follow chunk {expected - 1} (floor {d.floor})"
                )
            self.chunks.append(c)
            expected += 1
        self.boundaries = list(delta.boundaries)
        self.source = delta.source
        self.next_chunk = delta.next_chunk

    def to_dict(self) -> dict[str, Any]:
        return {
            "lane": self.lane,
            "floor": self.floor,
            "next_chunk": self.next_chunk,
            "chunks": [c.to_state() for c in self.chunks],
            "chunk_digests": [chunk_digest(c) for c in self.chunks],
            "boundaries": list(self.boundaries),
            "source": plain_copy(self.source),
            "cursor": list(self.cursor) if self.cursor is not None else None,
            "digest": self.digest,
            "delivered": self.delivered,
            "exhausted": self.exhausted,
            "tokens": list(self.tokens),
        } | self._prior_dict()

    def _prior_dict(self) -> dict[str, Any]:
        # kept while a segment that started before the re-mix can still be replayed
        if self.prior is None or self.floor >= self.prior[0]:
            return {}
        ops = {name: list(t) for name, t in self.prior.ops}
        return {"prior": [self.prior[0], list(self.prior[1])] + ([ops] if ops else [])}

    @classmethod
    def from_dict(cls, d: Any, version: int = VERSION) -> LaneState:
        keys = _LANE_KEYS[version]
        _check_keys(
            d, keys | ({"prior"} if isinstance(d, dict) and "prior" in d else set()), "lane state"
        )
        lane = _int(d["lane"], "lane")
        cursor = d["cursor"]
        if cursor is not None:
            if not isinstance(cursor, (list, tuple)) or len(cursor) != 4:
                raise CorruptCheckpoint(f"lane {lane}: cursor {cursor!r} is not 4 ints")
            cursor = SampleCursor(*(_int(x, "cursor") for x in cursor))
        floor, next_chunk = _int(d["floor"], "floor"), _int(d["next_chunk"], "next_chunk")
        raw_chunks = _list(d["chunks"], "chunks")
        if len(raw_chunks) != next_chunk - floor:  # before building anything that large
            raise CorruptCheckpoint(
                f"lane {lane}: {len(raw_chunks)} inflight chunks, but they "
                f"must be the consecutive range [{floor}, {next_chunk}) "
                "(floor, next_chunk)"
            )
        chunks = [WorkChunk.from_state(lane, c) for c in raw_chunks]
        digest = d.get("digest")
        if digest is not None:
            digest = _int(digest, "digest")
        st = cls(
            lane=lane,
            floor=floor,
            next_chunk=next_chunk,
            chunks=chunks,
            boundaries=[_int(b, "boundary") for b in _list(d["boundaries"], "boundaries")],
            source=plain_copy(d["source"]),
            cursor=cursor,
            delivered=_int(d["delivered"], "delivered"),
            exhausted=_bool(d["exhausted"], "exhausted"),
            tokens=[_int(t, "tokens") for t in _list(d["tokens"], "tokens")],
            digest=digest,
            prior=_prior(d.get("prior"), lane),
        )
        for i, c in enumerate(chunks):
            if c.chunk_id != floor + i:
                raise CorruptCheckpoint(
                    f"lane {lane}: inflight chunk ids "
                    f"{[c.chunk_id for c in chunks][:20]} are not the "
                    f"consecutive range [{floor}, {next_chunk})"
                )
        if version >= 3:  # states of earlier versions carry no chunk digests
            digests = _list(d["chunk_digests"], f"lane {lane}: chunk_digests")
            if len(digests) != len(chunks):
                raise CorruptCheckpoint(
                    f"lane {lane}: {len(digests)} chunk digests for {len(chunks)} inflight chunks"
                )
            st.saved_digests = tuple(_int(x, "chunk digest") for x in digests)
        if not isinstance(st.source, dict):
            raise CorruptCheckpoint(f"lane {lane}: source state is not a dict")
        return st


@dataclass
class PipelineState:
    fingerprint: str
    config: dict[str, Any]
    position: int
    lanes: dict[int, LaneState]
    #: component and function digests; None for a version-1 state (not checked)
    content: dict[str, Any] | None = None
    #: where the state was read from, for the restore log (never serialized)
    origin: str | None = None
    #: the Zephon release that wrote the state (None: written before states recorded it);
    #: a state written again is written by this release
    written_by: str | None = __version__
    #: skipped positions and excluded rows the run follows (``data_changes.py``); written
    #: as the optional keys ``skip`` / ``exclude`` only when not empty
    changes: DataChanges = NO_CHANGES

    def to_dict(self) -> dict[str, Any]:
        out = {
            "format": FORMAT,
            "version": VERSION,
            "zephon_version": __version__,
            "fingerprint": self.fingerprint,
            "config": plain_copy(self.config),
            "content": plain_copy(self.content)
            if self.content is not None
            else {"components": {}, "ops": {}},
            "position": self.position,
            "lanes": [self.lanes[k].to_dict() for k in sorted(self.lanes)],
        } | self.changes.to_state()
        out["version"] = written_version(out)
        return out

    @classmethod
    def from_dict(cls, d: Any) -> PipelineState:
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise CorruptCheckpoint(
                "not a Zephon pipeline state (missing 'format': "
                f"{FORMAT!r}); pass what Pipeline.checkpoint() returned"
            )
        version = d.get("version")
        if version not in READS or isinstance(version, bool):
            writer = d.get("zephon_version")
            by = f" (written by Zephon {writer})" if isinstance(writer, str) else ""
            raise IncompatibleCheckpoint(
                f"checkpoint schema version {version!r}{by}: this Zephon ({__version__}) "
                f"reads versions {READS[0]} to {READS[-1]} and cannot resume it; resume with "
                f"the Zephon release that wrote it{' (' + writer + ')' if by else ''}"
            )
        optional = {k for k in _OPTIONAL_TOP_KEYS if k in d} if version >= 4 else set()
        _check_keys(d, _TOP_KEYS[version] | optional, "pipeline state")
        written_by = d.get("zephon_version")
        if version >= 3 and not isinstance(written_by, str):
            raise CorruptCheckpoint(f"zephon_version is {written_by!r}, expected a string")
        lanes = {}
        for ld in _list(d["lanes"], "lanes"):
            ls = LaneState.from_dict(ld, version)
            if ls.lane in lanes:
                raise CorruptCheckpoint(f"lane {ls.lane} appears twice")
            lanes[ls.lane] = ls
        if not isinstance(d["config"], dict) or not isinstance(d["fingerprint"], str):
            raise CorruptCheckpoint("config/fingerprint missing or of the wrong type")
        content = d.get("content") if version >= 2 else None
        if content is not None:
            content = _content(content)
        else:
            log.warning(
                "restoring a version-1 Zephon state: it has no content fingerprints, "
                "so changed data or functions cannot be detected"
            )
        config, fp = plain_copy(d["config"]), d["fingerprint"]
        migrated = without_legacy_keys(config)
        if migrated is not None:  # functions named by module: see the module docstring
            config, fp = migrated, fingerprint(migrated)
        return cls(
            fp,
            config,
            _int(d["position"], "position"),
            lanes,
            content,
            written_by=written_by,
            changes=DataChanges.from_state(d),
        )


def written_version(d: dict[str, Any]) -> int:
    """The schema version a state dict is written with: ``CHANGES_VERSION`` when it
    records data changes or a chunk carries drops, else ``VERSION`` (what earlier releases
    read)."""
    if any(k in d for k in _OPTIONAL_TOP_KEYS) or any(
        len(c) > 4 for lane in d["lanes"] for c in lane["chunks"]
    ):
        return CHANGES_VERSION
    return VERSION


def _content(c: Any) -> dict[str, Any]:
    if not isinstance(c, dict) or set(c) - {"components", "ops", "parts"}:
        raise CorruptCheckpoint(
            f"content fingerprints {c!r} are not {{'components': {{...}}, 'ops': {{...}}}}"
        )
    out: dict[str, Any] = {}
    for part in ("components", "ops"):
        table = c.get(part, {})
        if not isinstance(table, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in table.items()
        ):
            raise CorruptCheckpoint(f"content fingerprints {part!r} must map names to strings")
        out[part] = dict(table)
    if "parts" in c:  # per-function part digests (``digests/function_parts.py``), for messages
        parts = c["parts"]
        if not isinstance(parts, dict) or not all(
            isinstance(k, str)
            and isinstance(v, dict)
            and all(isinstance(p, str) and isinstance(d, str) for p, d in v.items())
            for k, v in parts.items()
        ):
            raise CorruptCheckpoint("content fingerprints 'parts' must map names to {part: digest}")
        out["parts"] = {k: dict(v) for k, v in parts.items()}
    return out


def check_chunk_digests(ls: LaneState) -> None:
    """Each inflight chunk must match the digest saved with it (states that carry them).

    Raises:
        CorruptCheckpoint: naming the lane and the chunk.
    """
    if ls.saved_digests is None:
        return
    for chunk, want in zip(ls.chunks, ls.saved_digests, strict=True):
        try:
            got: int | None = chunk_digest(chunk)
        except struct.error:  # a pointer beyond 64 bits
            got = None
        if got != want:
            raise CorruptCheckpoint(
                f"lane {ls.lane}: inflight chunk {chunk.chunk_id} does not match its digest "
                f"({want} saved, {got} from its pointers): its components, rows or seed "
                "changed after the checkpoint was written, and replaying it would deliver "
                "other documents. Restore from an intact copy of the checkpoint"
            )


def _prior(x: Any, lane: int) -> Prior | None:
    if x is None:
        return None

    def weights(w: Any) -> bool:
        return isinstance(w, (list, tuple)) and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in w
        )

    ok = (
        isinstance(x, (list, tuple))
        and len(x) in (2, 3)
        and is_int(x[0])
        and weights(x[1])
        and (
            len(x) == 2
            or isinstance(x[2], dict)
            and all(isinstance(k, str) and weights(v) for k, v in x[2].items())
        )
    )
    if not ok:
        raise CorruptCheckpoint(
            f"lane {lane}: prior {x!r} is not [chunk id, [weights], {{operator: [weights]}}]"
        )
    ops = tuple((k, tuple(float(v) for v in w)) for k, w in (x[2] if len(x) == 3 else {}).items())
    return Prior(int(x[0]), tuple(float(v) for v in x[1]), ops)


def _check_keys(d: Any, keys: set[str], what: str) -> None:
    if not isinstance(d, dict):
        raise CorruptCheckpoint(f"{what} is {type(d).__name__}, expected a dict")
    missing, extra = keys - d.keys(), d.keys() - keys
    if missing or extra:
        raise CorruptCheckpoint(
            f"{what}: missing keys {sorted(missing)}, unexpected keys {sorted(map(str, extra))}"
        )


def _int(x: Any, what: str) -> int:
    if not is_int(x):
        raise CorruptCheckpoint(f"{what} is {x!r}, expected an int")
    return int(x)


def _bool(x: Any, what: str) -> bool:
    if not isinstance(x, bool):
        raise CorruptCheckpoint(f"{what} is {x!r}, expected a bool")
    return x


def _list(x: Any, what: str) -> list:
    if not isinstance(x, (list, tuple)):
        raise CorruptCheckpoint(f"{what} is {type(x).__name__}, expected a list")
    return list(x)


def check_progress(state: PipelineState, n: int, lanes: Collection[int] | None = None) -> None:
    """Lane progress must be consistent with one global position. ``lanes``: the lanes the
    state must hold (a rank's share of a per-rank state); default: all ``n``."""
    want = list(range(n)) if lanes is None else sorted(lanes)
    if sorted(state.lanes) != want:
        raise IncompatibleCheckpoint(
            f"checkpoint holds lanes {sorted(state.lanes)}, the pipeline has canonical_replicas={n}"
        )
    bad = []
    for lane, ls in state.lanes.items():
        turns = turns_of_lane(lane, state.position, n)
        ok = ls.delivered <= turns if ls.exhausted else ls.delivered == turns
        if not ok:
            bad.append(
                f"lane {lane}: {ls.delivered} outputs delivered, position "
                f"{state.position} implies {turns}"
            )
    if bad:
        raise IncompatibleCheckpoint(
            "lane progress is inconsistent with a single global position (were lane states "
            "from ranks that checkpointed at different steps merged?): " + "; ".join(bad)
        )
