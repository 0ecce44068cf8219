"""Core engine benchmarks; every number is a ratio measured side by side in one run.

* tracking overhead: the same operator chain with checkpointing on vs off;
* checkpoint() latency and bytes per lane;
* restore-to-first-batch at output 100 vs 10,000 (bounded recovery: ratio ~ 1);
* StaticMixtureWorkSource pointers/s and memory on a 10^9-row virtual dataset.
"""

from __future__ import annotations

import itertools
import statistics
import time
import tracemalloc

from common import bar_pipeline, paired_throughput, reference_pipeline

from zephon_core import StaticMixtureWorkSource
from zephon_core.checkpoint import codec


def bench_overhead(n: int = 3000) -> dict:
    res = {}
    variants = {
        "bar": (bar_pipeline, {}),
        "reference (threads+pump)": (reference_pipeline, {}),
        "reference (inline, no pump)": (reference_pipeline, {"prefetch": 0, "parallelism": 1}),
    }
    for name, (build, kw) in variants.items():
        r = paired_throughput(
            {
                "on": lambda b=build, k=kw: b(checkpointing=True, **k),
                "off": lambda b=build, k=kw: b(checkpointing=False, **k),
            },
            n,
        )
        ratios = sorted(off / on for on, off in zip(r["on"], r["off"]))
        res[name] = {
            "tracked_batches_per_s": round(statistics.median(r["on"])),
            "untracked_batches_per_s": round(statistics.median(r["off"])),
            "overhead_pct_median_of_paired_rounds": round(
                100 * (1 - 1 / statistics.median(ratios)), 1
            ),
            "overhead_pct_range": [
                round(100 * (1 - 1 / ratios[0]), 1),
                round(100 * (1 - 1 / ratios[-1]), 1),
            ],
        }
    return res


def bench_checkpoint(at: int = 1000, calls: int = 200) -> dict:
    pipe = reference_pipeline()
    it = iter(pipe)
    for _ in itertools.islice(it, at):
        pass
    lat = []
    for _ in range(calls):
        t0 = time.perf_counter()
        state = pipe.checkpoint()
        lat.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    data = codec.encode(state)
    enc = time.perf_counter() - t0
    lanes = len(state["lanes"])
    pipe.close()
    return {
        "checkpoint_ms_median": round(1000 * statistics.median(lat), 3),
        "encode_ms": round(1000 * enc, 3),
        "bytes": len(data),
        "lanes": lanes,
        "bytes_per_lane": len(data) // lanes,
        "inflight_chunks": sum(len(ls["chunks"]) for ls in state["lanes"]),
    }


def _restore_cost(at: int) -> dict:
    pipe = reference_pipeline()
    it = iter(pipe)
    for _ in itertools.islice(it, at):
        pass
    data = codec.encode(pipe.checkpoint())
    pipe.close()
    best = float("inf")
    for _ in range(5):
        fresh = reference_pipeline()
        t0 = time.perf_counter()
        fresh.load_state_dict(codec.decode(data))
        next(iter(fresh))
        best = min(best, time.perf_counter() - t0)
        replayed = fresh.chunks_replayed
        fresh.close()
    return {
        "restore_to_first_batch_ms": round(1000 * best, 1),
        "chunks_replayed": replayed,
        "bytes": len(data),
    }


def bench_restore(ats: tuple[int, ...] = (100, 1_000, 10_000, 30_000)) -> dict:
    points = {at: _restore_cost(at) for at in ats}
    lo, hi = min(ats), max(at for at in ats if at <= 10_000)
    a, b = points[lo], points[hi]
    return {
        **{f"at_{k}": v for k, v in points.items()},
        f"time_ratio_{hi}_vs_{lo}": round(
            b["restore_to_first_batch_ms"] / a["restore_to_first_batch_ms"], 2
        ),
        f"bytes_ratio_{hi}_vs_{lo}": round(b["bytes"] / a["bytes"], 2),
    }


class VirtualRows:
    """A 10^9-row dataset that materializes nothing."""

    def __len__(self) -> int:
        return 10**9

    def __getitem__(self, i: int) -> int:
        return i


def bench_source(chunks: int = 2000, chunk_size: int = 256) -> dict:
    src = StaticMixtureWorkSource(
        {"a": VirtualRows(), "b": VirtualRows()},
        {"a": 0.7, "b": 0.3},
        chunk_size=chunk_size,
        seed=1,
    )
    lane = src.open_lane(0, 8, 1)
    t0 = time.perf_counter()
    for _ in range(chunks):
        lane.next_chunk()
    dt = time.perf_counter() - t0
    tracemalloc.start()  # memory measured separately: tracing slows the loop down
    for _ in range(chunks // 4):
        lane.next_chunk()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    # restore far into the stream: O(1)
    st = lane.state_dict()
    t0 = time.perf_counter()
    src.open_lane(0, 8, 1).load_state_dict(st)
    restore = time.perf_counter() - t0
    return {
        "pointers_per_s": round(chunks * chunk_size / dt),
        "peak_traced_memory_kib": round(peak / 1024, 1),
        "state_restore_us": round(restore * 1e6, 1),
    }


def main(quick: bool = False) -> dict:
    out = {
        "overhead": bench_overhead(300 if quick else 3000),
        "checkpoint": bench_checkpoint(100, 20) if quick else bench_checkpoint(),
        "restore": bench_restore((100, 1_000) if quick else (100, 1_000, 10_000, 30_000)),
        "source_1e9_rows": bench_source(200) if quick else bench_source(),
    }
    return out


_NOTE = (
    "One process. The overhead figures come from paired rounds (tracked and untracked "
    "alternating, median and range of the per-round overhead); the others from one timing "
    "loop each."
)


def tables(result: dict) -> list[dict]:
    """The result as tables for ``docs/measurements.md``."""
    from report import flat_tables

    return flat_tables(result, _NOTE)


if __name__ == "__main__":
    import json

    print(json.dumps(main(), indent=2))
