"""The global RNG states a training step draws from (python, numpy, torch, CUDA).

Zephon's own randomness never touches them; the model's does (dropout). A resume is
bit-identical only if they are restored at the point the uninterrupted run reached
them, so the integrations save them with each checkpoint and restore them right
before the first resumed training step.

Two forms: :func:`snapshot` / :func:`reinstate` keep the states as the libraries return
them (cheap enough to take at every training step), :func:`capture` / :func:`restore`
use the checkpoint form -- lists, ints and tensors only, so a checkpoint holding them
loads with ``torch.load(weights_only=True)``. :func:`to_checkpoint` and
:func:`from_checkpoint` convert between them.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

Snapshot = dict[str, Any]  # {"python", "numpy", "torch"[, "cuda"]} as the libraries return them


def snapshot() -> Snapshot:
    """This process's RNG states, as the libraries return them (copies)."""
    out: Snapshot = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.random.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = list(torch.cuda.get_rng_state_all())
    return out


def reinstate(snap: Snapshot) -> None:
    """Set this process's RNGs to a :func:`snapshot`."""
    random.setstate(snap["python"])
    np.random.set_state(snap["numpy"])
    torch.random.set_rng_state(snap["torch"])
    if "cuda" in snap and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(snap["cuda"])


def to_checkpoint(snap: Snapshot) -> dict[str, Any]:
    """The checkpoint form of a snapshot (lists, ints, floats and tensors only)."""
    kind, keys, pos, has_gauss, cached = snap["numpy"]
    out: dict[str, Any] = {
        "python": _listify(snap["python"]),
        "numpy": [
            kind,
            torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            int(pos),
            int(has_gauss),
            float(cached),
        ],
        "torch": snap["torch"],
    }
    if "cuda" in snap:
        out["cuda"] = list(snap["cuda"])
    return out


def from_checkpoint(state: dict[str, Any]) -> Snapshot:
    """The snapshot a checkpoint form describes."""
    kind, keys, pos, has_gauss, cached = state["numpy"]
    out: Snapshot = {
        "python": _tuplify(state["python"]),
        "numpy": (kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached),
        "torch": state["torch"],
    }
    if "cuda" in state:
        out["cuda"] = list(state["cuda"])
    return out


def _listify(x: Any) -> Any:
    return [_listify(v) for v in x] if isinstance(x, tuple) else x


def _tuplify(x: Any) -> Any:
    return tuple(_tuplify(v) for v in x) if isinstance(x, list) else x


def to_msgpack(snap: Snapshot) -> dict[str, Any]:
    """A snapshot as msgpack values (bytes, ints, lists): the form of a per-rank state file
    (``state_layout="per_rank"``), which holds no tensors."""
    kind, keys, pos, has_gauss, cached = snap["numpy"]
    out: dict[str, Any] = {
        "python": _listify(snap["python"]),
        "numpy": [kind, np.asarray(keys, dtype=np.uint32).tobytes(), int(pos), int(has_gauss)]
        + [float(cached)],
        "torch": snap["torch"].numpy().tobytes(),
    }
    if "cuda" in snap:
        out["cuda"] = [s.cpu().numpy().tobytes() for s in snap["cuda"]]
    return out


def from_msgpack(state: dict[str, Any]) -> Snapshot:
    """The snapshot :func:`to_msgpack` describes."""
    kind, keys, pos, has_gauss, cached = state["numpy"]
    out: Snapshot = {
        "python": _tuplify(state["python"]),
        "numpy": (kind, np.frombuffer(keys, dtype=np.uint32).copy(), pos, has_gauss, cached),
        "torch": torch.frombuffer(bytearray(state["torch"]), dtype=torch.uint8),
    }
    if "cuda" in state:
        out["cuda"] = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in state["cuda"]]
    return out
