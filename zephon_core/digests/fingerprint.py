"""Configuration fingerprints: what must match for a checkpoint to restore."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def fingerprint(config: dict[str, Any]) -> str:
    canon = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canon.encode()).hexdigest()[:32]


def config_diff(saved: Any, current: Any, path: str = "") -> list[str]:
    """Human-readable differences between two configs (saved vs current)."""
    if isinstance(saved, dict) and isinstance(current, dict):
        out = []
        for k in sorted(set(saved) | set(current), key=str):
            p = f"{path}.{k}" if path else str(k)
            if k not in saved:
                out.append(f"{p}: absent in checkpoint, {current[k]!r} now")
            elif k not in current:
                out.append(f"{p}: {saved[k]!r} in checkpoint, absent now")
            else:
                out.extend(config_diff(saved[k], current[k], p))
        return out
    if isinstance(saved, (list, tuple)) and isinstance(current, (list, tuple)):
        if len(saved) != len(current):
            return [
                f"{path}: {len(saved)} entries in checkpoint, {len(current)} now "
                f"({saved!r} vs {current!r})"
            ]
        out = []
        for i, (a, b) in enumerate(zip(saved, current)):
            out.extend(config_diff(a, b, f"{path}[{i}]"))
        return out
    return [] if saved == current else [f"{path}: {saved!r} in checkpoint, {current!r} now"]


def without_legacy_keys(config: Any) -> dict[str, Any] | None:
    """``config`` without what earlier versions wrote into it and this one does not: the
    ``fn`` of map/filter operators (the function's ``module.qualname``, which differs
    between ``python train.py`` and ``import train``; the content digest identifies the
    function now). None when ``config`` holds none of it."""
    ops = config.get("ops") if isinstance(config, dict) else None
    if not isinstance(ops, list) or not any(_legacy_op(op) for op in ops):
        return None
    stripped = [{k: v for k, v in op.items() if k != "fn"} if _legacy_op(op) else op for op in ops]
    return {**config, "ops": stripped}


def _legacy_op(op: Any) -> bool:
    return isinstance(op, dict) and op.get("op") in ("map", "filter") and "fn" in op
