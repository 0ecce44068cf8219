"""Where the trainer integrations keep a Zephon state, so every reader finds it alike.

* HF ``checkpoint-N/`` directories: the file :data:`HF_STATE_FILE`;
* Lightning ``.ckpt`` dicts: ``checkpoint["zephon"] = {"state": ..., "rng": ...}``
  (:data:`LIGHTNING_KEY`), or ``{"per_rank": manifest}`` (``state_layout="per_rank"``:
  the states are in per-rank files, ``distributed/rank_files.py``), or -- checkpoints
  of earlier releases -- a datamodule entry ``{"zephon": <state>}`` under whatever class
  name wrote it.

Used by ``zephon_integrations`` (writing and restoring) and the ``zephon`` command
(inspecting), which must not import the trainers.
"""

from __future__ import annotations

from typing import Any

from .state import FORMAT

HF_STATE_FILE = "zephon_state.msgpack.zst"
LIGHTNING_KEY = "zephon"


def lightning_entry(checkpoint: dict[str, Any]) -> dict[str, Any] | None:
    """The ``{"state", "rng"}`` entry of a Lightning checkpoint, or None."""
    entry = checkpoint.get(LIGHTNING_KEY)
    return entry if isinstance(entry, dict) and "state" in entry else None


def lightning_manifest(checkpoint: dict[str, Any]) -> dict[str, Any] | None:
    """The per-rank manifest of a Lightning checkpoint saved with
    ``state_layout="per_rank"`` (``checkpoint["zephon"] = {"per_rank": manifest}``), or None."""
    entry = checkpoint.get(LIGHTNING_KEY)
    manifest = entry.get("per_rank") if isinstance(entry, dict) else None
    return manifest if isinstance(manifest, dict) else None


def legacy_lightning_state(checkpoint: dict[str, Any]) -> dict[str, Any] | None:
    """A ``{"zephon": <state>}`` datamodule entry under whatever class name wrote it."""
    for value in checkpoint.values():
        if (
            isinstance(value, dict)
            and isinstance(value.get(LIGHTNING_KEY), dict)
            and value[LIGHTNING_KEY].get("format") == FORMAT
        ):
            return value[LIGHTNING_KEY]
    return None
