"""Per-rank state files beside a trainer checkpoint: no aggregation round, no gather.
(``docs/design.md`` §8)

The trainer integrations' ``state_layout="per_rank"``: at a save every rank writes its
own lanes' state (``distributed/dcp.py``'s per-rank shape: ``{"meta", "slots"}``, slots
keyed by ``(lane - position) mod C``) -- and whatever else the integration keeps per rank
(Lightning: the RNG) -- into one file of its own, atomically::

    <directory>/zephon_rank00003_dp00003.msgpack.zst

and the checkpoint rank 0 writes holds only a small :func:`manifest`: format, version,
``canonical_replicas``, position, fingerprint, ``dp_size``/``world_size`` at the save,
the directory of the files (relative to the checkpoint and absolute), and a *save id*
that every file of the save carries, so a file of another save is refused, never mixed in.

Resuming (:func:`read_share`): with the same ``dp_size`` and ``world_size`` a rank reads
only its own file (and its extras: the RNG continues); on another ``dp_size`` D' (dividing
C), rank r' reads only the files holding its slots r', r'+D', ... (slot s was written by
old data-parallel rank s mod D) and keeps only those slots; its extras are not restored.
Every rank lists the directory once, so a missing file raises
:class:`~zephon_core.errors.MissingLanes` on every rank alike; a corrupted file raises
:class:`~zephon_core.errors.CorruptCheckpoint` and a file of another save
:class:`~zephon_core.errors.IncompatibleCheckpoint` on the rank reading it, and
:func:`agree` raises on the others too (one small collective at resume, none at save).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._version import __version__
from ..checkpoint import codec
from ..errors import ConfigError, CorruptCheckpoint, IncompatibleCheckpoint, MissingLanes
from ..validate import is_int
from .dcp import decode_meta, merged_of, owned_slots, slot_key
from .topology import Topology

__all__ = [
    "LAYOUTS",
    "Share",
    "agree",
    "check_layout",
    "file_name",
    "is_manifest",
    "merged_state",
    "prune_orphans",
    "manifest",
    "read_share",
    "write_rank_file",
]

LAYOUTS = ("merged", "per_rank")
MANIFEST_FORMAT = "zephon.per_rank_manifest"
FILE_FORMAT = "zephon.rank_file"
VERSION = 1
_NAME = re.compile(r"^zephon_rank(\d{5,})_dp(\d{5,})\.msgpack\.zst$")
_FIX_MISSING = (
    "Resume from an earlier checkpoint whose files are all present (a node probably died "
    "after rank 0 wrote the checkpoint and before this file was written), and keep "
    "checkpoints on a filesystem every node sees (or copy every rank's file beside the "
    "checkpoint) before resuming on another number of ranks"
)


def check_layout(value: Any, who: str) -> str:
    """``value`` if it is one of :data:`LAYOUTS`, else a ConfigError naming them."""
    if value not in LAYOUTS:
        raise ConfigError(
            f"{who}(state_layout={value!r}): use one of {list(LAYOUTS)} -- 'merged' (one "
            "portable state of every lane in rank 0's checkpoint, through an aggregation "
            "round) or 'per_rank' (every rank writes its own lanes beside the checkpoint)"
        )
    return value


def file_name(rank: int, dp_rank: int) -> str:
    """The file of global rank ``rank`` (data-parallel rank ``dp_rank``)."""
    return f"zephon_rank{rank:05d}_dp{dp_rank:05d}.msgpack.zst"


def prune_orphans(parent: str, keep: str, suffix: str = ".zephon") -> list[str]:
    """Remove ``<checkpoint><suffix>/`` directories of ``parent`` whose checkpoint is gone
    (a trainer deleted it: ``ModelCheckpoint(save_top_k=...)``), holding nothing but rank
    files, except ``keep`` (the save being written). Local paths only; returns what went."""
    import shutil

    if "://" in parent or not os.path.isdir(parent):
        return []
    gone = []
    for name in os.listdir(parent):
        path = os.path.join(parent, name)
        if (
            not name.endswith(suffix)
            or os.path.abspath(path) == os.path.abspath(keep)
            or os.path.lexists(path[: -len(suffix)])
            or not os.path.isdir(path)
        ):
            continue
        inside = os.listdir(path)
        if all(_NAME.match(f) or (f.startswith(".") and f.endswith(".tmp")) for f in inside):
            shutil.rmtree(path, ignore_errors=True)
            gone.append(path)
    return gone


def write_rank_file(
    directory: str,
    *,
    save_id: str,
    topology: Topology,
    state: Mapping[str, Any],
    extra: Mapping[str, Any] | None = None,
) -> str:
    """Write this rank's per-rank ``state`` (``{"meta", "slots"}``) and ``extra`` (msgpack
    values) atomically into ``directory``; returns the path."""
    payload = {
        "format": FILE_FORMAT,
        "version": VERSION,
        "save_id": save_id,
        "rank": topology.rank,
        "world_size": topology.world_size,
        "dp_rank": topology.dp_rank,
        "dp_size": topology.dp_size,
        "state": {"meta": state["meta"], "slots": dict(state["slots"])},
        "extra": dict(extra or {}),
    }
    path = _join(directory, file_name(topology.rank, topology.dp_rank))
    codec.write_atomic(path, codec.encode(payload))
    return path


def manifest(
    *,
    save_id: str,
    state: Mapping[str, Any],
    topology: Topology,
    files: str,
    files_abs: str | None = None,
) -> dict[str, Any]:
    """What rank 0's checkpoint holds instead of the lanes: ``files`` is the directory of
    the per-rank files relative to the checkpoint's own directory, ``files_abs`` where it
    was at the save (tried second)."""
    meta = decode_meta(state["meta"])
    return {
        "format": MANIFEST_FORMAT,
        "version": VERSION,
        "save_id": save_id,
        "canonical_replicas": meta["canonical_replicas"],
        "position": meta["position"],
        "fingerprint": meta.get("fingerprint"),
        "dp_size": topology.dp_size,
        "world_size": topology.world_size,
        "files": files,
        "files_abs": files_abs,
        "zephon_version": __version__,
    }


def is_manifest(value: Any) -> bool:
    """``value`` is a per-rank manifest (not a merged state)."""
    return isinstance(value, Mapping) and value.get("format") == MANIFEST_FORMAT


def _checked_manifest(m: Any) -> dict[str, Any]:
    if not is_manifest(m):
        raise CorruptCheckpoint(
            f"not a Zephon per-rank manifest (no 'format': {MANIFEST_FORMAT!r})"
        )
    if m.get("version") != VERSION:
        raise IncompatibleCheckpoint(
            f"per-rank manifest version {m.get('version')!r} (written by Zephon "
            f"{m.get('zephon_version')}): this Zephon ({__version__}) reads version "
            f"{VERSION}; resume with the release that wrote it"
        )
    for name in ("canonical_replicas", "position", "dp_size", "world_size"):
        if not is_int(m.get(name)) or m[name] < (0 if name == "position" else 1):
            raise CorruptCheckpoint(f"the per-rank manifest has {name}={m.get(name)!r}")
    if not isinstance(m.get("save_id"), str) or not isinstance(m.get("files"), str):
        raise CorruptCheckpoint("the per-rank manifest has no save_id or files entry")
    return dict(m)


def locate(m: Mapping[str, Any], checkpoint_dir: str | None) -> str:
    """The directory of a manifest's files: ``files`` next to the checkpoint (as moved or
    copied), else where it was at the save. Raises MissingLanes when neither exists."""
    m = _checked_manifest(m)
    tried = []
    if checkpoint_dir is not None:
        tried.append(_join(checkpoint_dir, m["files"]) if m["files"] else checkpoint_dir)
    if m.get("files_abs"):
        tried.append(m["files_abs"])
    for path in tried:
        if _isdir(path):
            return path
    raise MissingLanes(
        f"the per-rank files of this checkpoint (save {m['save_id']}, "
        f"{m['world_size']} ranks) are not there: no directory {' nor '.join(tried)}. "
        f"{_FIX_MISSING}"
    )


@dataclass
class Share:
    """What one rank restores: ``state`` (``{"meta", "slots"}`` holding exactly the slots
    this rank owns), its own file's ``extra`` when the ranks are the same as at the save
    (else None), and the manifest."""

    state: dict[str, Any]
    extra: dict[str, Any] | None
    manifest: dict[str, Any]

    @property
    def same_ranks(self) -> bool:
        return self.extra is not None


def read_share(m: Mapping[str, Any], directory: str, topology: Topology) -> Share:
    """This rank's share of a per-rank checkpoint (see the module docstring).

    Raises:
        MissingLanes: a file this run needs (or any file of the save) is absent.
        IncompatibleCheckpoint: a file of another save, or another C than the manifest.
        CorruptCheckpoint: a file that does not decode or holds other lanes than its name.
    """
    m = _checked_manifest(m)
    n, d_old, w_old = m["canonical_replicas"], m["dp_size"], m["world_size"]
    names = _list(directory)
    by_dp: dict[int, list[tuple[int, str]]] = {}
    for name in names:
        match = _NAME.match(name)
        if match:
            by_dp.setdefault(int(match.group(2)), []).append((int(match.group(1)), name))
    absent = [k for k in range(d_old) if k not in by_dp]
    if d_old == w_old:  # one file per rank, named by it
        absent = [r for r in range(w_old) if file_name(r, r) not in names]
    if absent:
        shown = ", ".join(file_name(r, r) if d_old == w_old else f"dp rank {r}" for r in absent[:8])
        raise MissingLanes(
            f"{directory} lacks the per-rank state file(s) of rank(s) {absent[:16]} of the "
            f"{w_old} that saved it (save {m['save_id']}): {shown}"
            f"{', ...' if len(absent) > 8 else ''}. {_FIX_MISSING}"
        )
    same = d_old == topology.dp_size and w_old == topology.world_size
    own_name = file_name(topology.rank, topology.dp_rank)
    if same and own_name in names:
        own = _read(_join(directory, own_name), m, topology.dp_rank)
        return Share(own["state"], own["extra"], m)
    want = owned_slots(n, topology)
    groups: dict[int, list[int]] = {}
    for s in want:
        groups.setdefault(s % d_old, []).append(s)
    meta: Any = None
    slots: dict[str, Any] = {}
    for k, mine in sorted(groups.items()):
        _, name = min(by_dp[k])
        f = _read(_join(directory, name), m, k)
        if meta is None:
            meta = f["state"]["meta"]
        elif f["state"]["meta"] != meta:
            raise IncompatibleCheckpoint(
                f"{_join(directory, name)} describes another pipeline state than the other "
                f"files of save {m['save_id']}; resume from an earlier checkpoint"
            )
        held = f["state"]["slots"]
        for s in mine:
            if slot_key(s) in held:
                slots[slot_key(s)] = held[slot_key(s)]
    if meta is None:  # no slot wanted (not possible with dp_size <= C); keep the shape
        meta = _read(_join(directory, min(by_dp[0])[1]), m, 0)["state"]["meta"]
    return Share({"meta": meta, "slots": slots}, None, m)


def merged_state(m: Mapping[str, Any], checkpoint_dir: str | None) -> dict[str, Any]:
    """The merged state of a per-rank checkpoint (every rank's file read): what
    ``zephon inspect`` shows, and a portable state (``codec.encode`` it to keep one file)."""
    share = read_share(m, locate(m, checkpoint_dir), Topology())
    return merged_of(share.state)


def _read(path: str, m: Mapping[str, Any], dp_rank: int) -> dict[str, Any]:
    try:
        data = codec.read_bytes(path)
    except FileNotFoundError as e:
        raise MissingLanes(f"{path} is missing (save {m['save_id']}). {_FIX_MISSING}") from e
    try:
        f = codec.decode(data)
    except CorruptCheckpoint as e:
        raise CorruptCheckpoint(
            f"{path}: {e}; resume from an earlier checkpoint (this rank file is damaged)"
        ) from e
    if f.get("format") != FILE_FORMAT or not isinstance(f.get("state"), dict):
        raise CorruptCheckpoint(f"{path} is not a Zephon per-rank state file")
    if f.get("save_id") != m["save_id"]:
        raise IncompatibleCheckpoint(
            f"{path} belongs to another save (save id {f.get('save_id')!r}; the checkpoint's "
            f"manifest names {m['save_id']!r}): a later save rewrote it and did not finish, "
            "or files of two checkpoints were copied together. Zephon never mixes them: "
            "resume from an earlier checkpoint, or copy the files of this checkpoint's save"
        )
    if f.get("dp_rank") != dp_rank or f.get("dp_size") != m["dp_size"]:
        raise CorruptCheckpoint(
            f"{path} holds dp rank {f.get('dp_rank')} of {f.get('dp_size')}, its name and "
            f"the manifest say dp rank {dp_rank} of {m['dp_size']}: a renamed file"
        )
    state = f["state"]
    if not isinstance(state.get("slots"), dict) or "meta" not in state:
        raise CorruptCheckpoint(f"{path} holds no per-rank state")
    if decode_meta(state["meta"])["canonical_replicas"] != m["canonical_replicas"]:
        raise IncompatibleCheckpoint(
            f"{path} was written with another canonical_replicas than its manifest says"
        )
    f.setdefault("extra", {})
    return f


def agree(error: BaseException | None) -> None:
    """One collective at resume (when torch.distributed runs with several ranks): if any
    rank failed to read its share, every rank raises -- the others would otherwise wait
    in the first training collective until it timed out."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        if error is not None:
            raise error
        return
    mine = None if error is None else (type(error).__name__, str(error))
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    if error is not None:
        raise error
    for rank, failed in enumerate(every):
        if failed is not None:
            kind = {
                c.__name__: c for c in (MissingLanes, CorruptCheckpoint, IncompatibleCheckpoint)
            }.get(failed[0], IncompatibleCheckpoint)
            raise kind(f"rank {rank} could not read its share of the checkpoint: {failed[1]}")


# -- paths (local or fsspec URLs) ---------------------------------------------------------
def _join(directory: str, name: str) -> str:
    if "://" in directory:
        return f"{directory.rstrip('/')}/{name}"
    return os.path.join(directory, name)


def _isdir(path: str) -> bool:
    if "://" in path and not path.startswith("file://"):
        import fsspec

        fs, p = fsspec.core.url_to_fs(path)
        return fs.isdir(p)
    return os.path.isdir(path.removeprefix("file://"))


def _list(directory: str) -> set[str]:
    if "://" in directory and not directory.startswith("file://"):
        import fsspec

        fs, p = fsspec.core.url_to_fs(directory)
        return {os.path.basename(x.rstrip("/")) for x in fs.ls(p, detail=False)}
    try:
        return set(os.listdir(directory.removeprefix("file://")))
    except FileNotFoundError:
        return set()
