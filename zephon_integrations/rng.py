"""The global RNG states a training step draws from (python, numpy, torch, CUDA).

Zephon's own randomness never touches them; the model's does (dropout). A resume is
bit-identical only if they are restored at the point the uninterrupted run reached
them, so the integrations save them with each checkpoint and restore them right
before the first resumed training step. States are stored as lists, ints and tensors
only, so a checkpoint holding them loads with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def capture() -> dict[str, Any]:
    """This process's RNG states."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    out: dict[str, Any] = {
        "python": _listify(random.getstate()),
        "numpy": [
            kind,
            torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            int(pos),
            int(has_gauss),
            float(cached),
        ],
        "torch": torch.random.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = list(torch.cuda.get_rng_state_all())
    return out


def restore(state: dict[str, Any]) -> None:
    """Set this process's RNGs to a state from :func:`capture`."""
    random.setstate(_tuplify(state["python"]))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.random.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _listify(x: Any) -> Any:
    return [_listify(v) for v in x] if isinstance(x, tuple) else x


def _tuplify(x: Any) -> Any:
    return tuple(_tuplify(v) for v in x) if isinstance(x, list) else x
