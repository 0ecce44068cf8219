"""Real text that ships with every Python: the embedded default mixture of the examples,
the benchmarks and your own experiments (not part of the engine).

``prose()`` is the documentation of ``pydoc_data.topics`` (one document per
topic) and ``code()`` is the standard library's own source (one document per
module file). Both are read locally -- nothing downloads -- and are ordered
deterministically, so every machine with the same Python sees the same data.
"""

from __future__ import annotations

import sysconfig
from functools import lru_cache
from pathlib import Path


@lru_cache(maxsize=1)
def prose() -> tuple[dict, ...]:
    from pydoc_data.topics import topics

    return tuple({"text": topics[k], "id": f"topic:{k}"} for k in sorted(topics))


@lru_cache(maxsize=4)
def code(max_files: int | None = None) -> tuple[dict, ...]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py") if p.is_file())
    if max_files is not None:
        files = files[:max_files]
    docs = []
    for p in files:
        try:
            text = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if text.strip():
            docs.append({"text": text, "id": f"stdlib:{p.name}"})
    return tuple(docs)


def byte_tokens(payload: dict):
    """Byte-level tokenization (int32 ids 0..255): the benchmark's tokenizer."""
    import numpy as np

    return {
        "input_ids": np.frombuffer(payload["text"].encode("utf-8"), dtype=np.uint8).astype(np.int32)
    }
