"""Throughput with a real tokenizer per real (non-padding) token: a bare loop, Zephon in
process and Zephon behind DataLoader workers, in interleaved rounds.

The workload is ``bpe_workload.py``'s (BPE 8192, split/pack 2048 with 8 bins, shuffle 64,
batch 8, 8 lanes). Every variant runs once per round (``rounds.py``: the order rotates,
each ratio is taken within a round, medians with min-max over the rounds):

1. the bare loop (the same steps with numpy, no framework);
2. Zephon ``iterate()`` with ``map(parallelism=1)`` and ``map(parallelism=2)``;
3. Zephon ``dataloader(num_workers=w)``, w = 1, 2, 4, 8;

each reported as batches/s, real tokens/s and padding fraction, with the ratio per real
token against the bare loop and against Zephon's best in-process configuration (the
better of 2. by median). The same with the tokenizer replaced by a lookup of precomputed
ids shows the framework's own cost. The main process of the 2-worker case is profiled
(cProfile) to say what it spends per batch; beside: bytes a worker sends per batch, the
first batch after a restore, threads per process.
"""

from __future__ import annotations

import cProfile
import itertools
import os
import pstats
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import rounds
from bpe_workload import (
    BATCH,
    BINS,
    CHUNK,
    K,
    LANES,
    SEQ,
    SHUFFLE,
    VOCAB,
    BareLoop,
    BpeTokenize,
    LookupIds,
    all_docs,
    bare_loader,
    keep_fields,
    real_tokens,
    train_tokenizer,
    zephon_pipeline,
)
from throughput_probes import bench_restore, bench_wire

from zephon_core.testing import corpora

WORKERS = (1, 2, 4, 8)
# window: batches timed per variant and round (>= 500 with the real tokenizer: several
# flush epochs); warmup: batches skipped first (worker start-up)
FULL = dict(window=500, warmup=24, lookup_window=2000, rounds=5, restore=(20, 100, 300))
QUICK = dict(window=12, warmup=4, lookup_window=60, rounds=3, restore=(5, 10))
BARE = "bare loop"
P1 = "Zephon iterate(), map parallelism 1"
P2 = "Zephon iterate(), map parallelism 2"
NO_PUMP = "Zephon iterate(), no pump thread (prefetch=0)"
OWN_COST_GOAL = 2.0  # issue 23 item 5: CPU per real token, in process, vs the bare loop


def _workers(w: int) -> str:
    return f"Zephon dataloader(num_workers={w})"


def _window(build: Callable, size: int, warmup: int) -> Callable[[], rounds.Sample]:
    return rounds.window(build, size, warmup, count=real_tokens, keep=keep_fields)


def _summary(r: rounds.Rounds, best: str) -> list[dict[str, Any]]:
    """One row per variant: rates, padding, CPU of this process, the two ratios."""
    out = []
    for name in r.samples:
        out.append(
            {
                "variant": name,
                "batches_per_s": r.rate(name, "batches").to_json(),
                "real_tokens_per_s": r.rate(name, "real_tokens").to_json(),
                "padding": 1 - r.mean(name, "real_tokens", "batches") / (BATCH * SEQ),
                "main_cpu_ms_per_batch": r.per(name, "cpu_seconds", "batches").to_json(),
                "vs_bare_batches": r.ratio(name, BARE, "batches").to_json(),
                "vs_bare_real_tokens": r.ratio(name, BARE, "real_tokens").to_json(),
                "vs_best_in_process_real_tokens": r.ratio(name, best, "real_tokens").to_json(),
                "cpu_vs_bare_real_tokens": r.cost_ratio(
                    name, BARE, "cpu_seconds", "real_tokens"
                ).to_json(),
            }
        )
    return out


def _best_in_process(r: rounds.Rounds) -> str:
    return max((P1, P2), key=lambda k: r.rate(k, "real_tokens").median)


#: where a file's own time goes, for the in-process profile (first match wins)
AREAS = (
    (("ops/batch.py", "ops/token_batch.py", "ops/packed_batch.py"), "batch: rows into tensors"),
    (("ops/pack.py",), "pack"),
    (("ops/split.py",), "split"),
    (("ops/shuffle.py",), "shuffle"),
    (("ops/fetch.py", "ops/map.py", "ops/base.py"), "fetch and map"),
    (("zephon_core/sources/",), "work source: mixture, permutation, chunks"),
    (("zephon_core/tracking/",), "tracking: offsets, eviction"),
    (("zephon_core/",), "engine: stages, records, lane state, seeds"),
)
#: the bare loop's functions (bpe_workload.py) under the same areas
BARE_AREAS = {
    "collate": "batch: rows into tensors",
    "pack": "pack",
    "emit": "pack",
    "_documents": "work source: mixture, permutation, chunks",
    "encode": "the lookup (the user's function)",
    "__call__": "the lookup (the user's function)",
}


def _area(file: str, name: str) -> str:
    if file == "~":
        return "builtins, numpy and torch calls"
    if file.endswith("bpe_workload.py"):
        return BARE_AREAS.get(name, "bare loop: split, shuffle, batching")
    for parts, area in AREAS:
        if any(p in file for p in parts):
            return area
    return "other Python (standard library, numpy/torch wrappers)"


def profile_main(build: Callable, size: int, warmup: int, top: int = 14) -> dict[str, Any]:
    """cProfile of this (the training) process over ``size`` batches after ``warmup``:
    the functions with the most own time, per batch."""
    obj = build()
    it = iter(obj)
    for _ in itertools.islice(it, warmup):
        pass
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    for _ in itertools.islice(it, size):
        pass
    prof.disable()
    wall = time.perf_counter() - t0
    obj.close()
    stats = pstats.Stats(prof).stats  # {(file, line, name): (cc, ncalls, tt, ct, callers)}
    rows = []
    for (file, line, name), (_, ncalls, tt, ct, _) in stats.items():
        where = f"{Path(file).name}:{line}({name})" if file != "~" else name
        rows.append((tt, ct, ncalls, where))
    rows.sort(reverse=True)
    areas: dict[str, float] = {}
    for (file, _, name), (_, _, tt, _, _) in stats.items():
        area = _area(file, name)
        areas[area] = areas.get(area, 0.0) + tt
    return {
        "areas_us_per_batch": {k: 1e6 * v / size for k, v in areas.items()},
        "batches": size,
        "wall_ms_per_batch_profiled": 1000 * wall / size,
        "own_ms_per_batch_total": 1000 * sum(r[0] for r in rows) / size,
        "top": [
            {
                "function": where,
                "calls_per_batch": n / size,
                "own_us_per_batch": 1e6 * tt / size,
                "cumulative_us_per_batch": 1e6 * ct / size,
            }
            for tt, ct, n, where in rows[:top]
        ],
    }


def main(quick: bool = False) -> dict[str, Any]:
    cfg = QUICK if quick else FULL
    t_start = time.perf_counter()
    tok = BpeTokenize(train_tokenizer())
    docs = all_docs()
    table = dict(zip((d["id"] for d in docs), tok.encode([d["text"] for d in docs])))
    lookup = LookupIds(table, "lookup:" + tok.zephon_fingerprint())
    mean_len = {
        name: float(np.mean([len(table[d["id"]]) for d in ds]))
        for name, ds in (("prose", corpora.prose()), ("code", corpora.code()))
    }
    win, warm, lwin = cfg["window"], cfg["warmup"], cfg["lookup_window"]

    real_variants = {
        BARE: _window(lambda: BareLoop(tok.encode, by_id=False), win, warm),
        P1: _window(lambda: zephon_pipeline(tok).iterate(), win, warm),
        P2: _window(lambda: zephon_pipeline(tok, parallelism=2).iterate(), win, warm),
    }
    for w in WORKERS:
        # + 2 batches per worker: the window starts after the batches the workers
        # prefetched (prefetch_factor 2) while the first was awaited
        real_variants[_workers(w)] = _window(
            lambda w=w: zephon_pipeline(tok).dataloader(num_workers=w), win, warm + 2 * w
        )
    lookup_variants = {
        BARE: _window(lambda: BareLoop(lookup.encode, by_id=True), lwin, 4 * warm),
        P1: _window(lambda: zephon_pipeline(lookup).iterate(), lwin, 4 * warm),
        NO_PUMP: _window(
            lambda: zephon_pipeline(lookup, prefetch=0).iterate(), lwin, 4 * warm
        ),
        _workers(2): _window(
            lambda: zephon_pipeline(lookup).dataloader(num_workers=2), lwin, 4 * warm + 4
        ),
        "bare loop behind DataLoader(num_workers=2)": _window(
            lambda: bare_loader(lookup.encode, True, 2), lwin, 4 * warm + 4
        ),
    }
    with warnings.catch_warnings():  # torch's advice against 4+ workers on 2 cores: known
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        real = rounds.run(real_variants, cfg["rounds"])
        look = rounds.run(lookup_variants, cfg["rounds"])
        prof_real = profile_main(
            lambda: zephon_pipeline(tok).dataloader(num_workers=2), win, warm + 4
        )
        prof_lookup = profile_main(
            lambda: zephon_pipeline(lookup).dataloader(num_workers=2), lwin, 4 * warm + 4
        )
        # the framework's own cost in process, by area, beside the bare loop's
        prof_own = {
            BARE: profile_main(lambda: BareLoop(lookup.encode, by_id=True), lwin, 4 * warm),
            NO_PUMP: profile_main(
                lambda: zephon_pipeline(lookup, prefetch=0).iterate(), lwin, 4 * warm
            ),
        }
    best = _best_in_process(real)
    steady_ms = 1000 / real.rate(P1, "batches").median
    restore = bench_restore(
        tok, steady_ms, mean_len, repeats=1 if quick else 3, restore_at=cfg["restore"]
    )
    restore.pop("shape")
    threads = restore.pop("threads")
    result = {
        "workload": f"0.7/0.3 docs, BPE {VOCAB}, split/pack {SEQ} (bins {BINS}), shuffle "
        f"{SHUFFLE}, batch {BATCH}; {LANES} lanes, chunks of {CHUNK}, flush every {K}",
        "cpu_count": os.cpu_count(),
        "config": cfg,
        "quick": quick,
        "real_tokenizer": {
            "best_in_process": best,
            "rows": _summary(real, best),
            "load": real.load,
        },
        "lookup_no_tokenizer": {"rows": _summary(look, P1), "load": look.load},
        "profile_main_workers_2": {"real_tokenizer": prof_real, "lookup": prof_lookup},
        "profile_in_process_lookup": prof_own,
        "wire": bench_wire(tok),
        "restore": restore,
        "threads_main_process_iterate": threads,
        "seconds_total": time.perf_counter() - t_start,
    }
    return result


# -- tables ---------------------------------------------------------------------------------
_s, _load = rounds.cell, rounds.load_range


def _rate_table(title: str, sec: dict, base_name: str, note: str) -> dict:
    rows = [
        [
            r["variant"],
            _s(r["batches_per_s"], 1),
            _s(r["real_tokens_per_s"], 0),
            f"{100 * r['padding']:.1f} %",
            _ms(r["main_cpu_ms_per_batch"]),
            _s(r["vs_bare_batches"], 2, "x"),
            _s(r["vs_bare_real_tokens"], 2, "x"),
            _s(r["vs_best_in_process_real_tokens"], 2, "x"),
            _s(r["cpu_vs_bare_real_tokens"], 2, "x"),
        ]
        for r in sec["rows"]
    ]
    return {
        "title": title,
        "columns": [
            "variant",
            "batches/s",
            "real tokens/s",
            "padding",
            "main-process CPU ms/batch",
            "vs bare loop (batches)",
            "vs bare loop (real tokens)",
            f"vs {base_name} (real tokens)",
            "this process's CPU per real token vs bare loop",
        ],
        "rows": rows,
        "note": note + f" Load average (1 min) over the rounds: {_load(sec['load'])}.",
    }


def _ms(x: dict) -> str:
    return rounds.cell(x, 3, scale=1000)


def _goal(sec: dict, best: str, quick: bool) -> str:
    row = next(r for r in sec["rows"] if r["variant"] == _workers(2))
    got = row["vs_best_in_process_real_tokens"]
    if quick:  # windows shorter than a flush epoch: bursts, not rates
        verdict = "not judged on a quick run's windows"
    elif got["median"] >= 1.0:
        verdict = "met"
    else:
        verdict = f"not met: gap {1 - got['median']:.2f}"
    return (
        f"Goal (issue 23 item 4): dataloader(num_workers=2) >= 1.0x Zephon's best in-process "
        f"configuration ({best}) per real token, median over rounds: {_s(got, 2, 'x')}, "
        f"{verdict}."
    )


def _own_cost_goal(sec: dict) -> str:
    rows = {r["variant"]: r["cpu_vs_bare_real_tokens"] for r in sec["rows"]}
    got = rows[NO_PUMP]
    verdict = (
        "met"
        if got["median"] <= OWN_COST_GOAL
        else f"not met: {got['median'] / OWN_COST_GOAL:.2f}x the goal"
    )
    return (
        f"Goal (issue 23 item 5): Zephon's own cost in process <= {OWN_COST_GOAL:g}x the bare "
        f"loop's, by this process's CPU per real token: {_s(got, 2, 'x')} without the pump "
        f"thread, {_s(rows[P1], 2, 'x')} with it (the default; the pump's hand-over between "
        f"two threads is the difference); {verdict}. Where the time goes: the next table."
    )


def _area_table(prof: dict) -> dict:
    bare, own = prof[BARE], prof[NO_PUMP]
    names = sorted(set(own["areas_us_per_batch"]) | set(bare["areas_us_per_batch"]))
    total = {k: sum(p["areas_us_per_batch"].values()) for k, p in prof.items()}
    names.sort(key=lambda a: -own["areas_us_per_batch"].get(a, 0.0))
    rows = []
    for a in names:
        z, b = own["areas_us_per_batch"].get(a, 0.0), bare["areas_us_per_batch"].get(a, 0.0)
        if z < 1 and b < 1:
            continue
        rows.append([a, f"{z:,.0f}", f"{100 * z / total[NO_PUMP]:.0f} %", f"{b:,.0f}"])
    rows.append(["total", f"{total[NO_PUMP]:,.0f}", "100 %", f"{total[BARE]:,.0f}"])
    return {
        "title": "Own cost in process (lookup, no pump): where the time goes",
        "columns": ["area", "Zephon us/batch", "share", "bare loop us/batch"],
        "rows": rows,
        "note": (
            f"cProfile own time per batch over {own['batches']} batches, grouped by file "
            "(the profiler inflates call-heavy code, so read shares, not absolute times). The "
            "bare loop does the same packing and collation with none of the rest: what a "
            "record per fragment passing through per-record operators, the deterministic "
            "work source and per-offset tracking cost. Cutting it further needs the "
            "operators to work on a lane's fragments as arrays (an operator-contract change)."
        ),
    }


def _profile_table(title: str, prof: dict) -> dict:
    rows = [
        [
            t["function"],
            f"{t['calls_per_batch']:.1f}",
            f"{t['own_us_per_batch']:,.0f}",
            f"{t['cumulative_us_per_batch']:,.0f}",
        ]
        for t in prof["top"]
    ]
    return {
        "title": title,
        "columns": ["function", "calls/batch", "own us/batch", "cumulative us/batch"],
        "rows": rows,
        "note": (
            f"cProfile of the training (main) process over {prof['batches']} batches: "
            f"{prof['wall_ms_per_batch_profiled']:.2f} ms wall per batch under the profiler, "
            f"{prof['own_ms_per_batch_total']:.2f} ms of it in functions. Time in poll/wait/"
            "acquire is the main process waiting for a worker (the workers are the limit); "
            "time in _pickle.loads, reading the pipe and packed_fields is what the main "
            "process itself spends per batch (receive, unpickle, build tensors)."
        ),
    }


def tables(result: dict) -> list[dict]:
    cfg = result["config"]
    real, look = result["real_tokenizer"], result["lookup_no_tokenizer"]
    best = real["best_in_process"]
    method = (
        f"{cfg['rounds']} interleaved rounds (order rotated per round), each ratio taken "
        "within a round; median (min-max) over the rounds. Real tokens (padding excluded) are "
        "counted in one untimed pass over the same, deterministic batches; the timed pass "
        "drops each batch as a trainer does."
    )
    out = [
        _rate_table(
            "Real tokenizer: rates per real token",
            real,
            "Zephon best in-process",
            f"{result['workload']}. Window {cfg['window']} batches after {cfg['warmup']} of "
            f"warm-up per variant and round; {method} Zephon's best in-process configuration "
            f"here: {best}. {_goal(real, best, result.get('quick', False))}",
        ),
        _rate_table(
            "Framework cost: the tokenizer replaced by a lookup of precomputed ids",
            look,
            P1,
            f"The same workload with ids looked up, window {cfg['lookup_window']} batches; "
            f"{method} {_own_cost_goal(look)}",
        ),
        _area_table(result["profile_in_process_lookup"]),
        _profile_table(
            "Main process of dataloader(num_workers=2), real tokenizer: top functions by own "
            "time",
            result["profile_main_workers_2"]["real_tokenizer"],
        ),
        _profile_table(
            "Main process of dataloader(num_workers=2), lookup: top functions by own time",
            result["profile_main_workers_2"]["lookup"],
        ),
    ]
    w = result["wire"]
    out.append(
        {
            "title": "Bytes per batch from a DataLoader worker to the training process",
            "columns": ["what", "bytes"],
            "rows": [
                [f"wire array {k} ({v['dtype']})", f"{v['bytes']:,}"]
                for k, v in w["wire_arrays"].items()
            ]
            + [
                ["pickled per batch (median)", f"{w['pickled_bytes_per_batch_median']:,}"],
                [
                    "of which the state delta (median / max)",
                    f"{w['delta_bytes_median']:,} / {w['delta_bytes_max']:,}",
                ],
                ["tensors the consumer gets", f"{w['consumer_tensor_bytes']:,}"],
            ],
            "note": "Pickled as torch's worker queue does (ForkingPickler), 40 batches.",
        }
    )
    rows = []
    for k, v in result["restore"].items():
        rows.append(
            [
                k,
                f"{v['first_batch_ms']:.0f}",
                f"{v['first_batch_ms_no_pump']:.0f}",
                str(v["documents_tokenized_to_first_batch"]),
                f"{v['work_depth_batches']}",
                f"{v['ratio_vs_steady_x_work_depth']:.2f}x",
                str(v.get("chunks_replayed_all_lanes", "-")),
            ]
        )
    out.append(
        {
            "title": "First batch after a restore, real tokenizer",
            "columns": [
                "checkpoint at batch",
                "ms to first batch",
                "ms without the pump",
                "documents tokenized first",
                "= batches' worth",
                "ms / (steady ms x that)",
                "chunks replayed",
            ],
            "rows": rows,
            "note": "Restored into a freshly built pipeline (compile and admission "
            "included, the tokenizer loaded); best of the repeats; steady ms from "
            f"{P1}'s median rate.",
        }
    )
    t = result["threads_main_process_iterate"]
    out.append(
        {
            "title": "Threads of the main process during iterate()",
            "columns": ["python threads", "OS threads", "names"],
            "rows": [[str(t["python_threads"]), str(t["os_threads"]), ", ".join(t["names"])]],
            "note": "OS threads include the tokenizer's own pool.",
        }
    )
    return out


if __name__ == "__main__":
    import json

    res = main(quick="--quick" in sys.argv)
    print(json.dumps(res, indent=2, default=str))
