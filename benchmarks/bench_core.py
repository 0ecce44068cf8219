"""Core engine benchmarks; every ratio is taken within a round of interleaved runs.

* tracking overhead: the same operator chain with checkpointing on vs off;
* checkpoint() latency and bytes per lane;
* restore-to-first-batch at batch 1,000 vs 10,000 and 100,000 (bounded recovery: set by
  the chunks in flight, not by the position);
* StaticMixtureWorkSource pointers/s and memory on a 10^9-row virtual dataset.
"""

from __future__ import annotations

import itertools
import statistics
import time
import tracemalloc

import rounds
from common import bar_pipeline, reference_pipeline

from zephon_core import StaticMixtureWorkSource
from zephon_core.checkpoint import codec

# window: batches timed per variant and round (~0.5 s: the pipelines deliver in bursts of a
# few hundred batches, a window spans many); restore: the checkpoints restored from (at
# batch n), the first the base of the time ratios
FULL = dict(window=3000, warmup=50, rounds=7, restore=(1_000, 10_000, 100_000), calls=200)
QUICK = dict(window=600, warmup=50, rounds=3, restore=(100, 1_000), calls=20)
PIPELINES = {
    "bar": (bar_pipeline, {}),
    "reference (threads+pump)": (reference_pipeline, {}),
    "reference (inline, no pump)": (reference_pipeline, {"prefetch": 0, "parallelism": 1}),
}


def _extra(r: rounds.Rounds, value: str) -> dict:
    """How much more ``value`` (wall or CPU seconds) tracked spends per batch than
    untracked in the same round, in %."""
    c = r.cost_ratio("tracked", "untracked", value, "items")
    return rounds.Spread(100 * (c.median - 1), 100 * (c.lo - 1), 100 * (c.hi - 1), c.n).to_json()


def bench_overhead(window: int, warmup: int, n_rounds: int) -> dict:
    """Tracked vs untracked per pipeline, the pair interleaved in its own rounds."""
    rows, size = [], (window, warmup)
    for name, (build, kw) in PIPELINES.items():
        variants = {
            label: rounds.window(lambda b=build, k=kw, on=on: b(checkpointing=on, **k), *size)
            for label, on in (("tracked", True), ("untracked", False))
        }
        r = rounds.run(variants, n_rounds)
        rows.append(
            {
                "pipeline": name,
                "tracked_batches_per_s": r.rate("tracked", "items").to_json(),
                "untracked_batches_per_s": r.rate("untracked", "items").to_json(),
                "overhead_wall_pct": _extra(r, "seconds"),
                "tracked_cpu_s_per_batch": r.per("tracked", "cpu_seconds", "items").to_json(),
                "untracked_cpu_s_per_batch": r.per("untracked", "cpu_seconds", "items").to_json(),
                "overhead_cpu_pct": _extra(r, "cpu_seconds"),
                "load": r.load,
            }
        )
    return {"window": window, "warmup": warmup, "rounds": n_rounds, "rows": rows}


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
        "at": at,
        "calls": calls,
        "checkpoint_ms_median": round(1000 * statistics.median(lat), 3),
        "encode_ms": round(1000 * enc, 3),
        "bytes": len(data),
        "lanes": lanes,
        "bytes_per_lane": len(data) // lanes,
        "inflight_chunks": sum(len(ls["chunks"]) for ls in state["lanes"]),
    }


#: each position is measured at 8 cuts spread over several flush epochs of every lane: a
#: single cut's restore time depends on where in its lane's flush epoch it falls and on
#: which documents its inflight chunks hold (30-250 ms here), so single cuts would compare
#: contents, not positions
NEARBY = tuple(331 * j for j in range(8))


def _checkpoints_near(at: int) -> list[bytes]:
    """States taken at ``at + d`` batches for each ``d`` in :data:`NEARBY`, in one run."""
    pipe = reference_pipeline()
    it = iter(pipe)
    out, done = [], 0
    for d in NEARBY:
        for _ in itertools.islice(it, at + d - done):
            pass
        done = at + d
        out.append(codec.encode(pipe.checkpoint()))
    pipe.close()
    return out


def _restore(states: list[bytes]):
    """A rounds variant: restore each state into a fresh pipeline, time to its first batch;
    the sample sums over the states."""

    def sample() -> rounds.Sample:
        wall = cpu = replayed = 0.0
        for data in states:
            fresh = reference_pipeline()
            t0, c0 = time.perf_counter(), time.process_time()
            fresh.load_state_dict(codec.decode(data))
            next(iter(fresh))
            wall += time.perf_counter() - t0
            cpu += time.process_time() - c0
            replayed += fresh.chunks_replayed
            fresh.close()
        return {
            "seconds": wall,
            "cpu_seconds": cpu,
            "chunks_replayed": replayed,
            "cuts": float(len(states)),
        }

    return sample


def bench_restore(ats: tuple[int, ...], n_rounds: int) -> dict:
    """Restore from each checkpoint once per round; each time ratio against the first
    position's restore in the same round."""
    data = {at: _checkpoints_near(at) for at in ats}
    r = rounds.run({str(at): _restore(data[at]) for at in ats}, n_rounds)
    base_at = ats[0]
    rows = [
        {
            "at": at,
            "s_to_first_batch": r.per(str(at), "seconds", "cuts").to_json(),
            "time_vs_first": r.cost_ratio(str(at), str(base_at), "seconds", "cuts").to_json(),
            "chunks_replayed": r.per(str(at), "chunks_replayed", "cuts").median,
            "bytes": sum(len(d) for d in data[at]) / len(NEARBY),
        }
        for at in ats
    ]
    return {"rounds": n_rounds, "rows": rows, "load": r.load, "base": base_at}


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
    cfg = QUICK if quick else FULL
    return {
        "config": cfg,
        "quick": quick,
        "overhead": bench_overhead(cfg["window"], cfg["warmup"], cfg["rounds"]),
        "checkpoint": bench_checkpoint(100 if quick else 1000, cfg["calls"]),
        "restore": bench_restore(cfg["restore"], cfg["rounds"]),
        "source_1e9_rows": bench_source(200) if quick else bench_source(),
    }


# -- tables ---------------------------------------------------------------------------------
_s = rounds.cell


def _overhead_table(sec: dict, quick: bool) -> dict:
    rows = [
        [
            r["pipeline"],
            _s(r["tracked_batches_per_s"], 0),
            _s(r["untracked_batches_per_s"], 0),
            _s(r["overhead_wall_pct"], 1, " %"),
            _s(r["tracked_cpu_s_per_batch"], 1, scale=1e6),
            _s(r["untracked_cpu_s_per_batch"], 1, scale=1e6),
            _s(r["overhead_cpu_pct"], 1, " %"),
        ]
        for r in sec["rows"]
    ]
    load = [pair for r in sec["rows"] for pair in r["load"]]
    return {
        "title": "Tracking overhead: checkpointing on vs off",
        "columns": [
            "pipeline",
            "tracked batches/s",
            "untracked batches/s",
            "overhead (wall per batch)",
            "tracked CPU us/batch",
            "untracked CPU us/batch",
            "overhead (CPU per batch)",
        ],
        "rows": rows,
        "note": "One process; per pipeline the tracked and the untracked run interleave in "
        "their own rounds. Overhead: tracked's time per batch over untracked's in the same "
        "round, minus 1 (CPU: this process's, all its threads). "
        + rounds.method(
            sec["rounds"],
            load,
            f"Window {sec['window']:,} batches after {sec['warmup']} of warm-up per variant "
            "and round.",
            quick,
        ),
    }


def _restore_table(sec: dict) -> dict:
    base = sec["base"]
    return {
        "title": "Restore to the first batch, by how far into the stream the checkpoint was",
        "columns": [
            "checkpoint at batch",
            "ms to first batch",
            f"time vs at {base:,} (within round)",
            "chunks replayed",
            "checkpoint bytes",
        ],
        "rows": [
            [
                f"{r['at']:,}",
                _s(r["s_to_first_batch"], 1, scale=1000),
                _s(r["time_vs_first"], 2, "x"),
                f"{r['chunks_replayed']:.1f}",
                f"{r['bytes']:,.0f}",
            ]
            for r in sec["rows"]
        ],
        "note": "reference_pipeline (4 lanes, a flush every 4 chunks), restored into a freshly "
        "built pipeline (load_state_dict, then the first batch); each position is "
        f"{len(NEARBY)} cuts spread over {NEARBY[-1]:,} batches (several flush epochs of "
        "every lane: one cut's time depends on where in its lane's flush epoch it falls and "
        "on which documents are in flight), figures per cut; each round restores from every "
        "checkpoint once. Bounded recovery: the time is set by the chunks in flight at the "
        "cut, not by how far into the stream the cut is. "
        + rounds.method(sec["rounds"], sec["load"], "One restore per cut and round."),
    }


def tables(result: dict) -> list[dict]:
    """The result as tables for ``docs/measurements.md``."""
    c, src, quick = result["checkpoint"], result["source_1e9_rows"], result["quick"]
    return [
        _overhead_table(result["overhead"], quick),
        {
            "title": "checkpoint(): latency and size",
            "columns": ["what", "value"],
            "rows": [
                ["checkpoint() ms (median)", f"{c['checkpoint_ms_median']:.3f}"],
                ["codec.encode ms (once)", f"{c['encode_ms']:.3f}"],
                ["bytes", f"{c['bytes']:,}"],
                ["lanes", str(c["lanes"])],
                ["bytes per lane", f"{c['bytes_per_lane']:,}"],
                ["chunks in flight", str(c["inflight_chunks"])],
            ],
            "note": f"reference_pipeline after {c['at']:,} batches; the median over "
            f"{c['calls']} consecutive checkpoint() calls, one process. Not a ratio: no rounds.",
        },
        _restore_table(result["restore"]),
        {
            "title": "StaticMixtureWorkSource on a 10^9-row virtual dataset",
            "columns": ["what", "value"],
            "rows": [
                ["pointers/s", f"{src['pointers_per_s']:,}"],
                ["peak traced memory KiB", f"{src['peak_traced_memory_kib']:,.1f}"],
                ["lane state restore us", f"{src['state_restore_us']:,.1f}"],
            ],
            "note": "One lane, chunks of 256 row pointers, one timing loop (memory traced in "
            "a separate loop: tracing slows it down). Not a ratio: no rounds.",
        },
    ]


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(main(quick="--quick" in sys.argv), indent=2))
