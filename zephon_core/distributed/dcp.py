"""Per-rank states for ``torch.distributed.checkpoint`` (DCP): one key per lane, no round.
(``docs/design.md`` §8)

A handle's ``state_dict()`` is this rank's lanes only, shaped for DCP::

    {"meta": b"...", "slots": {"00003": b"...", "00007": b"...", ...}}

* ``meta``: msgpack of the format, schema version, ``canonical_replicas`` C, the global
  position, the Zephon version, the fingerprint, configuration and content digests --
  identical on every rank, so DCP writes it once;
* ``slots``: one msgpack ``bytes`` value per lane, keyed by its *slot*
  ``(lane - position) mod C`` (a str, zero-padded: DCP flattens nested dicts into dotted
  keys and would stringify int keys). Each value carries its lane id.

Why slots and not lane ids: which lanes rank ``r`` of ``D`` owns depends on the position
(``topology.rank_lanes``), but the slots it owns never do: ``r, r+D, r+2D, ...``. So a
fresh handle's ``state_dict()`` -- DCP's load template -- names exactly the keys this rank
needs on any D' dividing C, before anything has been read, and DCP reads only those.
Model-parallel peers (one ``dp_rank``) put identical keys, which DCP writes once.

A new dict on every call, of immutable ``bytes`` values: DCP fills a load template in
place, and ``dcp.async_save`` must keep what was true at the call. A handle keeps each
lane's bytes until the lane changes (``checkpoint/lane_cache.py``), so a call costs the
lanes that changed since the last one, not C.

Loading (:func:`admit_any`): a merged state (``checkpoint()``) or a per-rank state holding
at least this rank's slots. Only the owned lanes are decoded and validated (the same
admission as a merged state: ``checkpoint/restore.py``); a missing one raises
:class:`~zephon_core.errors.MissingLanes` naming what the state holds and the fix.

Before ``dcp.load``: :func:`check` reads the checkpoint's ``.metadata`` (and the small
``meta`` item) without a collective, so every rank raises the same typed error;
:func:`translate` turns DCP's ``CheckpointException`` for a missing slot into the same
error. DCP unpickles ``.metadata`` and every non-tensor value: a DCP checkpoint directory
is trusted input.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import msgpack

from .._version import __version__
from ..checkpoint.lane_cache import EncodedState
from ..checkpoint.owned_lanes import OwnedLanesState
from ..checkpoint.restore import admit, admit_owned, allowed_changes
from ..checkpoint.state import CHANGES_VERSION, PipelineState
from ..checkpoint.state import FORMAT as STATE_FORMAT
from ..checkpoint.state import VERSION as STATE_VERSION
from ..errors import CorruptCheckpoint, IncompatibleCheckpoint, MissingLanes
from ..validate import is_int
from .topology import Topology

__all__ = [
    "FORMAT",
    "admit_any",
    "check",
    "encode",
    "encode_cached",
    "is_per_rank",
    "merged_of",
    "owned_slots",
    "slot_key",
    "translate",
    "translated",
]

FORMAT = "zephon.dcp_state"
VERSION = 1
_FIX = (
    "save a state that holds every lane: per rank through DCP, "
    "dcp.save({..., 'data': loader}) on every rank (or loader.state_dict() of every rank "
    "together), or the merged state of loader.checkpoint()"
)


def slot_key(slot: int) -> str:
    """The key of a slot: zero-padded decimal (no dots, sorts by number)."""
    return f"{slot:05d}"


def owned_slots(num_lanes: int, topology: Topology) -> list[int]:
    """The slots data-parallel rank ``r`` of ``D`` owns at any position: r, r+D, ..."""
    return list(range(topology.dp_rank, num_lanes, topology.dp_size))


def is_per_rank(state: Any) -> bool:
    """``state`` has the per-rank (DCP) shape rather than the merged one."""
    return isinstance(state, Mapping) and "slots" in state and "format" not in state


def encode(state: PipelineState, num_lanes: int) -> dict[str, Any]:
    """This rank's lanes as ``{"meta": bytes, "slots": {key: bytes}}`` (a new dict)."""
    d = state.to_dict()
    position = d["position"]
    slots = {
        slot_key((lane["lane"] - position) % num_lanes): msgpack.packb(lane, use_bin_type=True)
        for lane in d["lanes"]
    }
    return {"meta": _meta(d, num_lanes), "slots": slots}


def encode_cached(state: EncodedState, num_lanes: int) -> dict[str, Any]:
    """:func:`encode` of a state whose lanes are encoded already (``checkpoint/lane_cache.py``):
    a new dict around the lanes' immutable bytes."""
    d = state.header.to_dict()
    position = d["position"]
    lanes = state.lanes
    slots = {slot_key((lane - position) % num_lanes): lanes[lane].data for lane in sorted(lanes)}
    return {"meta": _meta(d, num_lanes), "slots": slots}


def _meta(d: dict[str, Any], num_lanes: int) -> bytes:
    meta = {
        "format": FORMAT,
        "version": VERSION,
        "canonical_replicas": num_lanes,
        "position": d["position"],
        "zephon_version": __version__,
        # identical on every rank (DCP keeps one copy): by the run's recorded changes, not
        # by this rank's chunks
        "state_version": CHANGES_VERSION
        if any(k in d for k in ("skip", "exclude"))
        else STATE_VERSION,
        "fingerprint": d["fingerprint"],
        "config": d["config"],
        "content": d["content"],
    }
    for key in ("skip", "exclude"):  # the run's recorded data changes, when it has any
        if key in d:
            meta[key] = d[key]
    return msgpack.packb(meta, use_bin_type=True)


def _unpack(data: Any, what: str) -> Any:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise CorruptCheckpoint(f"{what} is {type(data).__name__}, expected msgpack bytes")
    try:
        return msgpack.unpackb(bytes(data), raw=False, strict_map_key=False)
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError) as e:
        raise CorruptCheckpoint(f"{what} is corrupted (msgpack: {e})") from e


def decode_meta(data: Any) -> dict[str, Any]:
    """The ``meta`` item, checked for shape (not yet against a pipeline)."""
    meta = _unpack(data, "the per-rank state's meta")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CorruptCheckpoint(
            f"not a per-rank Zephon state (meta has no 'format': {FORMAT!r}); pass what a "
            "handle's state_dict() returned"
        )
    if meta.get("version") != VERSION:
        writer = meta.get("zephon_version")
        raise IncompatibleCheckpoint(
            f"per-rank state version {meta.get('version')!r} (written by Zephon {writer}): "
            f"this Zephon ({__version__}) reads version {VERSION}; resume with the release "
            "that wrote it"
        )
    for name in ("canonical_replicas", "position", "state_version"):
        if not is_int(meta.get(name)) or meta[name] < 0:
            raise CorruptCheckpoint(f"the per-rank state's meta has {name}={meta.get(name)!r}")
    if meta["canonical_replicas"] < 1:
        raise CorruptCheckpoint("the per-rank state's meta has canonical_replicas=0")
    return meta


def _held(slots: Iterable[str], num_lanes: int) -> str:
    nums = sorted(int(s) for s in slots if s.isdigit())
    if len(nums) == num_lanes and nums == list(range(num_lanes)):
        return "all slots"
    shown = ", ".join(map(str, nums[:16])) + (", ..." if len(nums) > 16 else "")
    return f"slots [{shown}] ({len(nums)} of {num_lanes})"


def _missing(
    missing: list[int], held: str, num_lanes: int, position: int | None, topology: Topology | None
) -> MissingLanes:
    where = "this run needs"
    if topology is not None:
        where = f"dp_rank {topology.dp_rank} of dp_size {topology.dp_size} owns"
    lanes = ""
    if position is not None:
        lanes = f" = lanes {[(position + s) % num_lanes for s in missing[:16]]}"
    return MissingLanes(
        f"the per-rank state lacks slot(s) {missing[:16]}{lanes} that {where} "
        f"(slot = (lane - position) mod canonical_replicas={num_lanes}); it holds {held}. "
        f"Fix: {_FIX}"
    )


def _parse(
    state: Mapping[str, Any], plan: Any, topology: Topology | None
) -> tuple[PipelineState, list[int]]:
    """Decode ``meta`` and the slots ``topology`` owns (None: none) into a partial state;
    returns it and its lanes. Other slots are not read."""
    if not isinstance(state.get("slots"), Mapping) or "meta" not in state:
        raise CorruptCheckpoint(
            "a per-rank state is {'meta': bytes, 'slots': {key: bytes}}; got keys "
            f"{sorted(map(str, state))}"
        )
    meta = decode_meta(state["meta"])
    n, position = meta["canonical_replicas"], meta["position"]
    if n != plan.num_lanes:
        raise IncompatibleCheckpoint(
            f"the per-rank state was written with canonical_replicas={n}, this pipeline has "
            f"{plan.num_lanes}; canonical_replicas is fixed for a training run: rebuild the "
            f"pipeline with canonical_replicas={n}"
        )
    slots: Mapping[str, Any] = state["slots"]
    want = owned_slots(n, topology) if topology is not None else []
    missing = [s for s in want if slot_key(s) not in slots]
    if missing and topology is not None:
        raise _missing(missing, _held(slots, n), n, position, topology)
    lanes = []
    for s in want:
        lane = _unpack(slots[slot_key(s)], f"slot {slot_key(s)}")
        expected = (position + s) % n
        if not isinstance(lane, dict) or lane.get("lane") != expected:
            got = lane.get("lane") if isinstance(lane, dict) else lane
            raise CorruptCheckpoint(
                f"slot {slot_key(s)} holds lane {got!r}, but at position {position} it is "
                f"lane {expected}: the state's keys were renamed or mixed from other states"
            )
        lanes.append(lane)
    merged_shape = _merged_shape(meta, lanes)
    if meta["state_version"] not in (STATE_VERSION, CHANGES_VERSION):
        raise IncompatibleCheckpoint(
            f"per-rank lane states of schema version {meta['state_version']}: this Zephon "
            f"writes and reads versions {STATE_VERSION} and {CHANGES_VERSION} in per-rank "
            "states"
        )
    owned = [(position + s) % n for s in want]
    return PipelineState.from_dict(merged_shape), owned


def _merged_shape(meta: Mapping[str, Any], lanes: list[Any]) -> dict[str, Any]:
    out = {
        "format": STATE_FORMAT,
        "version": meta["state_version"],
        "fingerprint": meta.get("fingerprint"),
        "config": meta.get("config"),
        "content": meta.get("content"),
        "position": meta["position"],
        "lanes": lanes,
    }
    if isinstance(meta["state_version"], int) and meta["state_version"] >= 3:
        out["zephon_version"] = meta.get("zephon_version")
        for key in ("skip", "exclude"):  # deliberate data changes (checkpoint/data_changes.py)
            if key in meta:
                out[key] = meta[key]
    return out


def merged_of(state: Mapping[str, Any]) -> dict[str, Any]:
    """The merged state (``checkpoint()``'s shape) of a per-rank state holding every slot,
    e.g. the union of every rank's ``state_dict()``; checked by whoever admits it."""
    if not isinstance(state.get("slots"), Mapping) or "meta" not in state:
        raise CorruptCheckpoint("a per-rank state is {'meta': bytes, 'slots': {key: bytes}}")
    meta = decode_meta(state["meta"])
    n, slots = meta["canonical_replicas"], state["slots"]
    missing = [s for s in range(n) if slot_key(s) not in slots]
    if missing:
        raise _missing(missing, _held(slots, n), n, meta["position"], None)
    lanes = [_unpack(slots[slot_key(s)], f"slot {slot_key(s)}") for s in range(n)]
    return _merged_shape(meta, sorted(lanes, key=lambda x: x.get("lane", -1)
                                      if isinstance(x, dict) else -1))  # fmt: skip


def admit_any(
    state: Any,
    plan: Any,
    topology: Topology,
    allow_changes: Iterable[str] = (),
    origin: str | None = None,
) -> PipelineState:
    """Admit a merged state (``checkpoint()``) or a per-rank one (``state_dict()``, what
    ``dcp.load`` filled in); for a per-rank state, only this rank's lanes.

    Raises:
        MissingLanes: a per-rank state without a lane this rank owns now.
        CorruptCheckpoint / IncompatibleCheckpoint: as ``checkpoint/restore.py``'s ``admit``.
    """
    if isinstance(state, PipelineState) or not is_per_rank(state):
        return admit_owned(state, plan, topology.dp_rank, topology.dp_size, allow_changes, origin)
    parsed, owned = _parse(state, plan, topology)
    admitted = admit(parsed, plan, allow_changes, origin, lanes=owned)
    allowed = allowed_changes(allow_changes)
    return OwnedLanesState.of(admitted, topology.dp_rank, topology.dp_size, [], allowed)


# -- before and around dcp.load -----------------------------------------------------------
def check(checkpoint_id: str | os.PathLike, handle: Any, key: str = "data") -> None:
    """Check a DCP checkpoint directory before ``dcp.load``: that it holds Zephon state
    under ``key``, written with this pipeline's ``canonical_replicas``, every slot present,
    and that its ``meta`` admits into ``handle``'s pipeline (configuration, content). It
    reads ``.metadata`` and the ``meta`` item only, with no collective: every rank raises
    the same error.

    Raises:
        MissingLanes: slots absent from the checkpoint.
        IncompatibleCheckpoint / CorruptCheckpoint: another pipeline, another C, no state.
    """
    from torch.distributed.checkpoint import FileSystemReader

    path = os.fspath(checkpoint_id)
    plan = handle.spec.plan
    n = plan.num_lanes
    try:
        md = FileSystemReader(path).read_metadata()
    except FileNotFoundError as e:
        raise IncompatibleCheckpoint(
            f"{path} is not a complete DCP checkpoint (no .metadata: its save did not "
            "finish); resume from an earlier one"
        ) from e
    keys = md.state_dict_metadata
    prefix = f"{key}.slots."
    have = {k[len(prefix) :] for k in keys if k.startswith(prefix)}
    if f"{key}.meta" not in keys:
        near = sorted({k.split(".", 1)[0] for k in keys})
        raise IncompatibleCheckpoint(
            f"{path} holds no Zephon per-rank state under {key!r} (top-level keys {near}); "
            f"pass the key the loader was saved under, e.g. dcp.save({{{key!r}: loader}})"
        )
    held = sorted(int(s) for s in have if s.isdigit())
    if held and max(held) >= n or len(held) > n:
        raise IncompatibleCheckpoint(
            f"{path} holds {len(held)} lane slots (canonical_replicas={max(held) + 1} or "
            f"more), this pipeline has canonical_replicas={n}; canonical_replicas is fixed "
            "for a training run: rebuild the pipeline with the saved value"
        )
    missing = sorted(set(range(n)) - set(held))
    meta = _read_item(path, md, f"{key}.meta")
    position = None
    if meta is not None:
        decoded = decode_meta(meta)
        position = decoded["position"]
        if decoded["canonical_replicas"] != n:
            raise IncompatibleCheckpoint(
                f"{path} was written with canonical_replicas={decoded['canonical_replicas']}"
                f", this pipeline has {n}; rebuild the pipeline with the saved value"
            )
    if missing:
        err = _missing(missing, _held(have, n), n, position, None)  # the same on every rank
        raise MissingLanes(f"checkpoint {path}: {err}")
    if meta is not None:  # configuration and content, as a restore would (no lanes yet)
        admit(_parse({"meta": meta, "slots": {}}, plan, None)[0], plan, lanes=())


def _read_item(path: str, md: Any, fqn: str) -> bytes | None:
    """One small non-tensor item of a filesystem checkpoint, read directly (None: stored
    through a transform or in a layout this does not read)."""
    import io

    import torch
    from torch.distributed.checkpoint.metadata import MetadataIndex

    info = (md.storage_data or {}).get(MetadataIndex(fqn))
    if info is None or getattr(info, "transform_descriptors", None):
        return None
    with open(os.path.join(path, info.relative_path), "rb") as f:
        f.seek(info.offset)
        raw = f.read(info.length)
    try:
        value = torch.load(io.BytesIO(raw), weights_only=True)
    except Exception:  # noqa: BLE001 - another layout: dcp.load reads it instead
        return None
    return value if isinstance(value, bytes) else None


def translate(
    error: BaseException, handle: Any, key: str = "data", checkpoint_id: Any = None
) -> BaseException:
    """DCP's ``CheckpointException`` (a ``BaseException``, raised identically on every rank)
    for missing ``<key>.slots.*`` keys, as :class:`~zephon_core.errors.MissingLanes`; any
    other error is returned unchanged."""
    failures = getattr(error, "failures", None)
    if not isinstance(failures, Mapping):
        return error
    marker = f"Missing key in checkpoint state_dict: {key}.slots."
    missing: set[int] = set()
    for failure in failures.values():
        exc = failure[0] if isinstance(failure, tuple) else failure
        text = str(exc)
        if marker in text:
            tail = text.split(marker, 1)[1].rstrip(".")
            if tail.isdigit():
                missing.add(int(tail))
    if not missing:
        return error
    n = handle.spec.plan.num_lanes
    where = f" {os.fspath(checkpoint_id)}" if checkpoint_id is not None else ""
    shown = sorted(missing)
    return MissingLanes(
        f"checkpoint{where} lacks slot(s) {shown[:16]} under {key!r} that ranks of this run "
        f"own (slot = (lane - position) mod canonical_replicas={n}); it was saved with "
        f"fewer lanes or by fewer ranks than the state needs. Run "
        f"zephon_core.distributed.dcp.check(path, loader) to see what it holds. Fix: {_FIX}"
    )


@contextlib.contextmanager
def translated(handle: Any, key: str = "data", checkpoint_id: Any = None) -> Iterator[None]:
    """``with translated(loader): dcp.load(...)`` raises :class:`MissingLanes` for missing
    slots instead of DCP's ``CheckpointException``."""
    try:
        yield
    except BaseException as e:
        new = translate(e, handle, key, checkpoint_id)
        if new is e:
            raise
        raise new from e
