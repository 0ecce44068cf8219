"""Runners for a GIL-bound user function: inline vs threads vs processes.

A pure-Python tokenizer (a per-character loop, as slow Python tokenizers are) in
``map(..., parallelism=2)`` on the embedded mixture; batches/s after warm-up, median
of alternating rounds. Threads cannot run it in parallel (the GIL); processes can.
"""

from __future__ import annotations

import statistics
from functools import partial

import numpy as np
from common import mixture_source, rate

from zephon_core import Pipeline


def slow_tokenize(payload: dict) -> dict:
    """Byte tokens computed one character at a time in Python (holds the GIL)."""
    out = []
    for ch in payload["text"]:
        v = ord(ch)
        for _ in range(8):  # a little per-token work, like a rule-based pre-tokenizer
            v = (v * 31 + 7) & 0xFF
        out.append(v)
    return {"input_ids": np.asarray(out, dtype=np.int32), "id": payload["id"]}


def build(runner: str, parallelism: int) -> Pipeline:
    # small chunks spread the tokenizing over the measured window (a chunk is a microbatch)
    return (
        Pipeline(mixture_source(chunk_size=8), canonical_replicas=2, flush_every_k_chunks=4, seed=1)
        .fetch()
        .map(slow_tokenize, parallelism=parallelism, name="tokenize", runner=runner)
        .split(max_len=512)
        .pack(seq_len=512, bins=8)
        .batch(batch_size=8)
    )


def main(quick: bool = False, n: int = 600, rounds: int = 2) -> dict:
    n, rounds = (60, 1) if quick else (n, rounds)
    configs = {
        "inline": ("threads", 1),
        "threads_p2": ("threads", 2),
        "processes_p2": ("processes", 2),
    }
    rates: dict[str, list[float]] = {k: [] for k in configs}
    for _ in range(rounds):
        for name, (runner, p) in configs.items():
            rates[name].append(rate(partial(build, runner, p), n, warmup=10))
    med = {k: statistics.median(v) for k, v in rates.items()}
    return {
        "batches_per_s": {k: round(v, 1) for k, v in med.items()},
        "processes_vs_threads": round(med["processes_p2"] / med["threads_p2"], 2),
        "processes_vs_inline": round(med["processes_p2"] / med["inline"], 2),
    }


_NOTE = (
    "A GIL-bound pure-Python tokenizer in map(parallelism=2); batches/s, median over rounds "
    "in a fixed order."
)


def tables(result: dict) -> list[dict]:
    """The result as tables for ``docs/measurements.md``."""
    from report import flat_tables

    return flat_tables(result, _NOTE)


if __name__ == "__main__":
    import json

    print(json.dumps(main(), indent=2))
