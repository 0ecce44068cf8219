"""Runners for a GIL-bound user function: inline vs threads vs processes.

A pure-Python tokenizer (a per-character loop, as slow Python tokenizers are) in
``map(..., parallelism=2)`` on the embedded mixture; batches/s after warm-up in
interleaved rounds (``rounds.py``), each ratio taken within a round. Threads cannot run
it in parallel (the GIL); processes can.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import rounds
from common import mixture_source

from zephon_core import Pipeline

# window: batches timed per variant and round (~1 s: a rate over many chunks); warmup:
# batches skipped first (worker processes' start-up)
FULL = dict(window=600, warmup=10, rounds=5)
QUICK = dict(window=60, warmup=10, rounds=3)
CONFIGS = {
    "inline": ("threads", 1),
    "threads_p2": ("threads", 2),
    "processes_p2": ("processes", 2),
}


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


def main(quick: bool = False) -> dict:
    cfg = QUICK if quick else FULL
    r = rounds.run(
        {
            name: rounds.window(partial(build, *how), cfg["window"], cfg["warmup"])
            for name, how in CONFIGS.items()
        },
        cfg["rounds"],
    )
    rows = [
        {
            "variant": name,
            "batches_per_s": r.rate(name, "items").to_json(),
            "main_cpu_s_per_batch": r.per(name, "cpu_seconds", "items").to_json(),
            "vs_inline": r.ratio(name, "inline", "items").to_json(),
            "vs_threads_p2": r.ratio(name, "threads_p2", "items").to_json(),
        }
        for name in CONFIGS
    ]
    return {"config": cfg, "quick": quick, "rows": rows, "load": r.load}


def tables(result: dict) -> list[dict]:
    """The result as tables for ``docs/measurements.md``."""
    cfg, s = result["config"], rounds.cell
    rows = [
        [
            r["variant"],
            s(r["batches_per_s"], 1),
            s(r["main_cpu_s_per_batch"], 2, scale=1000),
            s(r["vs_inline"], 2, "x"),
            s(r["vs_threads_p2"], 2, "x"),
        ]
        for r in result["rows"]
    ]
    window = (
        f"Window {cfg['window']} batches after {cfg['warmup']} of warm-up per variant and round."
    )
    return [
        {
            "title": "A GIL-bound map: inline, threads and processes",
            "columns": [
                "variant",
                "batches/s",
                "main-process CPU ms/batch",
                "vs inline (within round)",
                "vs threads_p2 (within round)",
            ],
            "rows": rows,
            "note": "A pure-Python tokenizer in map(parallelism=2) (inline: parallelism 1); "
            "processes_p2 vs threads_p2 is what the process runner buys over the GIL. "
            + rounds.method(cfg["rounds"], result["load"], window, result["quick"]),
        }
    ]


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(main(quick="--quick" in sys.argv), indent=2))
