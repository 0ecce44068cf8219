"""State cost vs lanes: ``state_dict()`` / ``checkpoint()`` per call, and restore to the
first batch, with one process owning every lane (issue 23 item 6).

* Steady state, C in (8, 64, 512): the bar pipeline (byte tokens, ``benchmarks/common.py``)
  after every lane delivered once; then one call per batch over a window, so that between
  two calls only the lanes that advanced (or whose producer pulled a chunk) changed. The
  cached path (each lane's encoded bytes reused until the lane changes) and the uncached
  one (every lane encoded on every call, as before the cache) alternate window by window
  (A B A B ...): per round the median call, then the median and min-max of the rounds.
* Restore, C=512: a cold first batch (``pipe.iterate()``) against the first batch after
  ``pipe.iterate(restore=checkpoint())`` and after ``pipe.iterate()`` +
  ``load_state_dict(state_dict())`` (what ``dcp.load`` does), interleaved round by round;
  each includes building the handle.

Run: ``python benchmarks/bench_state_cost.py [--quick]``; prints JSON.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from common import bar_pipeline  # noqa: E402

try:
    from zephon_core.checkpoint import lane_cache
except ImportError:  # a release without the lane cache (a before/after run): one path
    lane_cache = None

LANES = (8, 64, 512)
RESTORE_LANES = 512


def _ms(f: Callable[[], Any]) -> float:
    t = time.perf_counter()
    f()
    return (time.perf_counter() - t) * 1e3


def _window(it: Any, call: str, cached: bool, calls: int) -> tuple[float, float]:
    """Median ms of ``calls`` calls of ``it.<call>()``, one after each batch; and the mean
    number of lanes whose bytes changed between two calls (``state_dict`` only)."""
    if lane_cache is not None:
        lane_cache._CACHING = cached  # noqa: SLF001 - the bench's switch (see lane_cache)
    try:
        times, changed, last = [], [], None
        for _ in range(calls):
            next(it)
            fn = getattr(it, call)
            out: dict[str, Any] = {}
            times.append(_ms(lambda fn=fn, out=out: out.setdefault("v", fn())))
            if call == "state_dict":  # a slot's lane moves with the position: by value
                values = set(out["v"]["slots"].values())
                if last is not None:
                    changed.append(len(values - last))
                last = values
        return statistics.median(times), statistics.mean(changed) if changed else 0.0
    finally:
        if lane_cache is not None:
            lane_cache._CACHING = True  # noqa: SLF001


def steady(lanes: int, rounds: int, calls: int) -> dict[str, Any]:
    pipe = bar_pipeline(lanes=lanes)
    out: dict[str, Any] = {"lanes": lanes}
    variants = [
        ("state_dict", True),
        ("state_dict", False),
        ("checkpoint", True),
        ("checkpoint", False),
    ]
    meds: dict[str, list[float]] = {f"{c}_{'cached' if k else 'uncached'}": [] for c, k in variants}
    changed: list[float] = []
    with pipe.iterate() as it:
        for _ in range(lanes + 8):  # every lane delivered once
            next(it)
        for r in range(rounds):
            for call, cached in variants if r % 2 == 0 else reversed(variants):
                med, ch = _window(it, call, cached, calls)
                meds[f"{call}_{'cached' if cached else 'uncached'}"].append(med)
                if call == "state_dict" and cached:
                    changed.append(ch)
        out["slot_bytes"] = sum(map(len, it.state_dict()["slots"].values()))
    for name, ms in meds.items():
        out[name] = _summary(ms)
    out["lanes_changed_per_call"] = round(statistics.mean(changed), 2)
    return out


def restore(lanes: int, rounds: int) -> dict[str, Any]:
    pipe = bar_pipeline(lanes=lanes)
    with pipe.iterate() as it:
        for _ in range(lanes + 8):
            next(it)
        merged, per_rank = it.checkpoint(), it.state_dict()

    def first(make: Callable[[], Any]) -> tuple[float, float]:
        """ms until the handle is ready (built, state loaded), and until its first batch."""
        gc.collect()  # the last round's handles, not timed
        t = time.perf_counter()
        h = make()
        ready = time.perf_counter()
        with h:
            next(h)
            return (ready - t) * 1e3, (time.perf_counter() - t) * 1e3

    def loaded() -> Any:
        h = pipe.iterate()
        h.load_state_dict(per_rank)
        return h

    runs = {
        "cold": pipe.iterate,
        "restore": lambda: pipe.iterate(restore=merged),
        "load_state_dict": loaded,
    }
    times: dict[str, list[float]] = {k: [] for k in runs}
    ready: dict[str, list[float]] = {k: [] for k in runs}
    names = list(runs)
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            a, b = first(runs[name])
            ready[name].append(a)
            times[name].append(b)
    out: dict[str, Any] = {"lanes": lanes}
    for name, ts in times.items():
        out[name] = _summary(ts)
        out[f"{name}_ready"] = _summary(ready[name])
    for name in ("restore", "load_state_dict"):
        ratios = [a / b for a, b in zip(times[name], times["cold"])]
        out[f"{name}_vs_cold"] = _summary(ratios, digits=2)
    return out


def _summary(xs: list[float], digits: int = 3) -> dict[str, float]:
    return {
        "median": round(statistics.median(xs), digits),
        "min": round(min(xs), digits),
        "max": round(max(xs), digits),
    }


def main(quick: bool = False) -> dict[str, Any]:
    rounds, calls = (5, 6) if quick else (7, 20)
    load_before = os.getloadavg()
    result: dict[str, Any] = {
        "rounds": rounds,
        "calls_per_window": calls,
        "steady": [steady(c, rounds, calls) for c in LANES],
        "restore": restore(RESTORE_LANES, rounds),
    }
    result["loadavg"] = [round(x, 2) for x in load_before] + [round(os.getloadavg()[0], 2)]
    return result


def _fmt(s: dict[str, float], unit: str = "") -> str:
    return f"{s['median']:g}{unit} ({s['min']:g}–{s['max']:g})"


def tables(result: dict[str, Any]) -> list[dict[str, Any]]:
    load = result["loadavg"]
    rows = [
        [
            str(s["lanes"]),
            _fmt(s["state_dict_cached"]),
            _fmt(s["state_dict_uncached"]),
            _fmt(s["checkpoint_cached"]),
            _fmt(s["checkpoint_uncached"]),
            f"{s['lanes_changed_per_call']:g}",
        ]
        for s in result["steady"]
    ]
    r = result["restore"]
    return [
        {
            "title": "State cost per call vs lanes (one process owns every lane)",
            "columns": [
                "canonical_replicas",
                "state_dict() ms",
                "state_dict() ms, every lane re-encoded",
                "checkpoint() ms",
                "checkpoint() ms, every lane re-encoded",
                "lanes changed per call",
            ],
            "rows": rows,
            "note": (
                "Bar pipeline (byte tokens), prefetch 3, after every lane delivered once; one "
                "call after each batch, median per window of "
                f"{result['calls_per_window']} calls, median (min–max) over "
                f"{result['rounds']} interleaved rounds. 'every lane re-encoded': the cache "
                "switched off (the cost before it). Load average "
                f"{load[0]:g}/{load[1]:g}/{load[2]:g} at the start, {load[3]:g} at the end."
            ),
        },
        {
            "title": f"Restore to the first batch, canonical_replicas={r['lanes']}",
            "columns": ["start", "ms to a ready handle", "ms to the first batch", "vs cold"],
            "rows": [
                [label, _fmt(r[f"{key}_ready"]), _fmt(r[key]), ratio]
                for label, key, ratio in (
                    ("cold: pipe.iterate()", "cold", "1"),
                    (
                        "pipe.iterate(restore=checkpoint())",
                        "restore",
                        _fmt(r["restore_vs_cold"], "x"),
                    ),
                    (
                        "pipe.iterate() + load_state_dict(state_dict())",
                        "load_state_dict",
                        _fmt(r["load_state_dict_vs_cold"], "x"),
                    ),
                )
            ],
            "note": (
                "Ready: the handle built and the state admitted (no batch yet); the first batch "
                "includes that. The three alternate round by round, "
                f"{result['rounds']} rounds, ratio per round against that round's cold start."
            ),
        },
    ]


if __name__ == "__main__":
    res = main(quick="--quick" in sys.argv)
    print(json.dumps(res, indent=2))
    for t in tables(res):
        print(f"\n{t['title']}\n" + " | ".join(t["columns"]))
        for row in t["rows"]:
            print(" | ".join(row))
