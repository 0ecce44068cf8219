"""Finding a Zephon state wherever it was saved, and summarizing it.

A state can sit in a Zephon state file (``pipe.save()``, msgpack+zstd), in a Lightning
``.ckpt`` (under the top-level key ``"zephon"``, or an older datamodule entry), or in
an HF ``checkpoint-N/`` directory (``zephon_state.msgpack.zst``); a checkpoint saved
with ``state_layout="per_rank"`` holds a manifest there instead, and its rank files are
read and merged (``distributed/rank_files.py``). ``read_any`` takes any of them -- a
torch file without running code from it (``torch_files.py``) -- and checks it as a
restore would, as far as that needs no pipeline (``checkpoint/restore.py``
``check_alone``); ``summary`` turns a state into what ``zephon inspect`` prints.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..checkpoint import codec
from ..checkpoint.provenance import writer
from ..checkpoint.restore import check_alone
from ..checkpoint.state import PipelineState
from ..checkpoint.trainer_files import (
    HF_STATE_FILE,
    legacy_lightning_state,
    lightning_entry,
    lightning_manifest,
)
from ..distributed import rank_files
from ..engine.mixture_report import dataset_totals
from ..errors import CorruptCheckpoint
from ..sources.mixture_state import lane_scheduled
from .torch_files import load_torch_file


def read_state(
    path: str | os.PathLike, trust_pickle: bool = False
) -> tuple[dict[str, Any], PipelineState, str]:
    """The state at ``path`` (as stored, and parsed) and what kind of file held it.

    Raises:
        CorruptCheckpoint / IncompatibleCheckpoint: the state is malformed, or out of
            range, as a restore would say (checks that need no pipeline).
        UntrustedCheckpoint: a torch file that names code (see ``torch_files.py``).
    """
    raw, kind = read_any(path, trust_pickle)
    return raw, check_alone(raw), kind


def read_any(path: str | os.PathLike, trust_pickle: bool = False) -> tuple[dict[str, Any], str]:
    """The state at ``path`` as stored, unchecked, and what kind of file held it.

    Raises:
        CorruptCheckpoint: nothing at ``path`` holds a Zephon state (the message says
            what was looked for).
        UntrustedCheckpoint: a torch file that names code (see ``torch_files.py``).
    """
    raw, kind, _ = read_with_step(path, trust_pickle)
    return raw, kind


def read_with_step(
    path: str | os.PathLike, trust_pickle: bool = False
) -> tuple[dict[str, Any], str, int | None]:
    """:func:`read_any`, and the trainer's optimizer step the checkpoint was saved at
    (HF ``trainer_state.json``'s ``global_step``, a Lightning ``.ckpt``'s
    ``global_step``), None for a state file."""
    p = Path(path)
    if p.is_dir():
        raw, kind = _from_dir(p)
        return raw, kind, hf_step(p)
    if not p.exists():
        raise CorruptCheckpoint(f"{p} does not exist")
    data = codec.read_bytes(p)
    if data.startswith(codec.MAGIC):
        return codec.decode(data), "Zephon state file", None
    ckpt = load_torch_file(p, trust_pickle)
    if not isinstance(ckpt, dict):
        raise CorruptCheckpoint(f"{p} holds a {type(ckpt).__name__}, not a checkpoint dict")
    step = ckpt.get("global_step")
    raw, kind = _from_torch(p, ckpt)
    return raw, kind, step if isinstance(step, int) else None


def hf_step(p: Path) -> int | None:
    """The optimizer step of an HF ``checkpoint-N/``: its ``trainer_state.json``, else N."""
    try:
        step = json.loads((p / "trainer_state.json").read_text()).get("global_step")
    except (OSError, ValueError):
        step = None
    if isinstance(step, int):
        return step
    tail = p.name.rpartition("-")[2]
    return int(tail) if p.name.startswith("checkpoint-") and tail.isdigit() else None


def _from_dir(p: Path) -> tuple[dict[str, Any], str]:
    f = p / HF_STATE_FILE
    if not f.exists():
        raise CorruptCheckpoint(
            f"{p} is a directory without {HF_STATE_FILE}: not an HF checkpoint written "
            "with ZephonCallback/ZephonTrainer"
        )
    state = codec.decode(codec.read_bytes(f))
    if rank_files.is_manifest(state):
        return rank_files.merged_state(state, str(p)), "HF checkpoint directory (per rank)"
    return state, "HF checkpoint directory"


def _from_torch(p: Path, ckpt: dict[str, Any]) -> tuple[dict[str, Any], str]:
    manifest = lightning_manifest(ckpt)
    if manifest is not None:  # state_layout="per_rank": the rank files beside it
        return rank_files.merged_state(manifest, str(p.parent)), "Lightning checkpoint (per rank)"
    return _lightning_state(p, ckpt), "Lightning checkpoint"


def _lightning_state(p: Path, ckpt: dict[str, Any]) -> dict[str, Any]:
    entry = lightning_entry(ckpt)
    if entry is not None:
        if not isinstance(entry["state"], dict):
            raise CorruptCheckpoint(f"{p}: the Zephon entry's state is not a dict")
        return entry["state"]
    legacy = legacy_lightning_state(ckpt)  # an older checkpoint: the datamodule's own entry
    if legacy is not None:
        return legacy
    raise CorruptCheckpoint(
        f"{p} holds no Zephon state (no 'zephon' entry): was it written with ZephonDataModule?"
    )


def summary(state: dict[str, Any], parsed: PipelineState) -> dict[str, Any]:
    """What ``zephon inspect`` reports (JSON-able), of a state ``check_alone`` passed."""
    config = state.get("config", {})
    src = config.get("source", {})
    lanes = [
        {
            "lane": ls["lane"],
            "delivered": ls["delivered"],
            "cursor": ls["cursor"],
            "inflight_chunks": len(ls["chunks"]),
            "chunk_range": [ls["floor"], ls["next_chunk"]],
            "exhausted": ls["exhausted"],
        }
        for ls in state.get("lanes", [])
    ]
    totals = dataset_totals(
        list(src.get("names", [])),
        list(src.get("lengths", [])),
        [ls.get("tokens", []) for ls in state.get("lanes", [])],
        [lane_scheduled(ls.get("source"))[0] for ls in state.get("lanes", [])],
    )
    components = {
        name: {
            "documents": int(row["documents"]),
            "epochs": round(row["epochs"], 4) if "epochs" in row else None,
            "tokens": int(row["tokens"]),
            "token_share": round(row["token_share"], 4),
        }
        for name, row in totals.items()
    }
    return {
        "format": state.get("format"),
        "version": state.get("version"),
        "zephon_version": parsed.written_by,
        "written_by": writer(parsed.written_by, state.get("version")),
        "fingerprint": state.get("fingerprint"),
        "position": state.get("position"),
        "lanes": lanes,
        "inflight_chunks": sum(lane["inflight_chunks"] for lane in lanes),
        "components": components,
        # deliberate data changes the run follows (checkpoint/data_changes.py)
        "skipped": [list(r) for r in parsed.changes.skip],
        "excluded": {name: list(rows) for name, rows in parsed.changes.exclude},
        "config": {
            "canonical_replicas": config.get("canonical_replicas"),
            "flush_every_k_chunks": config.get("flush_every_k_chunks"),
            "seed": config.get("seed"),
            "source": {k: v for k, v in src.items() if k != "token_lengths"},
            "ops": [
                op.get("op", "?") + ":" + str(op.get("name", "")) for op in config.get("ops", [])
            ],
        },
    }
