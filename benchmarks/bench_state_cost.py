"""State cost vs lanes: ``state_dict()`` / ``checkpoint()`` per call, and restore to the
first batch, with one process owning every lane (issue 23 item 6).

* Steady state, C in (8, 64, 512): the bar pipeline (byte tokens, ``benchmarks/common.py``)
  after every lane delivered once; then one call per batch over a window, so that between
  two calls only the lanes that advanced (or whose producer pulled a chunk) changed. The
  cached path (each lane's encoded bytes reused until the lane changes) and the uncached
  one (every lane encoded on every call, as before the cache) run in interleaved rounds
  (``rounds.py``: order rotated per round): a variant's figure in a round is the median
  call of its window; the cache's saving is the ratio of the two in the same round; then
  the median and min-max over the rounds.
* Restore, C=512: a cold first batch (``pipe.iterate()``) against the first batch after
  ``pipe.iterate(restore=checkpoint())`` and after ``pipe.iterate()`` +
  ``load_state_dict(state_dict())`` (what ``dcp.load`` does), in interleaved rounds, each
  against the same round's cold start; each includes building the handle.

Run: ``python benchmarks/bench_state_cost.py [--quick]``; prints JSON.
"""

from __future__ import annotations

import gc
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import rounds  # noqa: E402
from common import bar_pipeline  # noqa: E402

try:
    from zephon_core.checkpoint import lane_cache
except ImportError:  # a release without the lane cache (a before/after run): one path
    lane_cache = None

LANES = (8, 64, 512)
RESTORE_LANES = 512


def _window(it: Any, call: str, cached: bool, calls: int) -> rounds.Sample:
    """``calls`` calls of ``it.<call>()``, one after each batch: a sample whose
    ``seconds`` is the median call (robust to a GC pause in the window), and the mean number
    of lanes whose bytes changed between two calls (``state_dict`` only)."""
    if lane_cache is not None:
        lane_cache._CACHING = cached  # noqa: SLF001 - the bench's switch (see lane_cache)
    try:
        times, changed, last = [], [], None
        for _ in range(calls):
            next(it)
            fn = getattr(it, call)
            t = time.perf_counter()
            value = fn()
            times.append(time.perf_counter() - t)
            if call == "state_dict":  # a slot's lane moves with the position: by value
                values = set(value["slots"].values())
                if last is not None:
                    changed.append(len(values - last))
                last = values
        return {
            "seconds": statistics.median(times),
            "calls": 1.0,
            "lanes_changed": statistics.mean(changed) if changed else 0.0,
        }
    finally:
        if lane_cache is not None:
            lane_cache._CACHING = True  # noqa: SLF001


CALLS = ("state_dict", "checkpoint")


def _name(call: str, cached: bool) -> str:
    return f"{call}_{'cached' if cached else 'uncached'}"


def steady(lanes: int, n_rounds: int, calls: int) -> dict[str, Any]:
    pipe = bar_pipeline(lanes=lanes)
    out: dict[str, Any] = {"lanes": lanes}
    with pipe.iterate() as it:
        for _ in range(lanes + 8):  # every lane delivered once
            next(it)
        r = rounds.run(
            {
                _name(call, cached): lambda c=call, k=cached: _window(it, c, k, calls)
                for call in CALLS
                for cached in (True, False)
            },
            n_rounds,
        )
        out["slot_bytes"] = sum(map(len, it.state_dict()["slots"].values()))
    for call in CALLS:
        for cached in (True, False):
            out[_name(call, cached)] = r.per(_name(call, cached), "seconds", "calls").to_json()
        # what the cache saves: the uncached call over the cached one, within a round
        out[f"{call}_uncached_vs_cached"] = r.cost_ratio(
            _name(call, False), _name(call, True), "seconds", "calls"
        ).to_json()
    out["lanes_changed_per_call"] = round(r.mean("state_dict_cached", "lanes_changed", "calls"), 2)
    out["load"] = r.load
    return out


def restore(lanes: int, n_rounds: int) -> dict[str, Any]:
    pipe = bar_pipeline(lanes=lanes)
    with pipe.iterate() as it:
        for _ in range(lanes + 8):
            next(it)
        merged, per_rank = it.checkpoint(), it.state_dict()

    def first(make: Callable[[], Any]) -> rounds.Sample:
        """Seconds until the first batch (the handle built, state loaded, one batch), and
        until the handle was ready."""
        gc.collect()  # the last round's handles, not timed
        t = time.perf_counter()
        h = make()
        ready = time.perf_counter()
        with h:
            next(h)
            done = time.perf_counter()
        return {"seconds": done - t, "ready_seconds": ready - t, "batches": 1.0}

    def loaded() -> Any:
        h = pipe.iterate()
        h.load_state_dict(per_rank)
        return h

    starts = {
        "cold": pipe.iterate,
        "restore": lambda: pipe.iterate(restore=merged),
        "load_state_dict": loaded,
    }
    r = rounds.run({k: lambda make=make: first(make) for k, make in starts.items()}, n_rounds)
    out: dict[str, Any] = {"lanes": lanes, "load": r.load}
    for name in starts:
        out[name] = r.per(name, "seconds", "batches").to_json()
        out[f"{name}_ready"] = r.per(name, "ready_seconds", "batches").to_json()
    for name in ("restore", "load_state_dict"):
        out[f"{name}_vs_cold"] = r.cost_ratio(name, "cold", "seconds", "batches").to_json()
    return out


def main(quick: bool = False) -> dict[str, Any]:
    n_rounds, calls = (5, 6) if quick else (7, 20)
    return {
        "quick": quick,
        "rounds": n_rounds,
        "calls_per_window": calls,
        "steady": [steady(c, n_rounds, calls) for c in LANES],
        "restore": restore(RESTORE_LANES, n_rounds),
    }


def _ms(x: dict[str, float]) -> str:
    return rounds.cell(x, 3, scale=1000)


def tables(result: dict[str, Any]) -> list[dict[str, Any]]:
    n, quick = result["rounds"], result.get("quick", False)
    rows = [
        [
            str(s["lanes"]),
            _ms(s["state_dict_cached"]),
            _ms(s["state_dict_uncached"]),
            rounds.cell(s["state_dict_uncached_vs_cached"], 1, "x"),
            _ms(s["checkpoint_cached"]),
            _ms(s["checkpoint_uncached"]),
            rounds.cell(s["checkpoint_uncached_vs_cached"], 1, "x"),
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
                "re-encoded / cached",
                "checkpoint() ms",
                "checkpoint() ms, every lane re-encoded",
                "re-encoded / cached",
                "lanes changed per call",
            ],
            "rows": rows,
            "note": (
                "Bar pipeline (byte tokens), prefetch 3, after every lane delivered once. "
                "'every lane re-encoded': the cache switched off (the cost before it). "
                + rounds.method(
                    n,
                    [x for s in result["steady"] for x in s["load"]],
                    "One call after each batch; a variant's figure in a round is the median "
                    f"call of a window of {result['calls_per_window']} calls.",
                    quick,
                )
            ),
        },
        {
            "title": f"Restore to the first batch, canonical_replicas={r['lanes']}",
            "columns": ["start", "ms to a ready handle", "ms to the first batch", "vs cold"],
            "rows": [
                [label, _ms(r[f"{key}_ready"]), _ms(r[key]), ratio]
                for label, key, ratio in (
                    ("cold: pipe.iterate()", "cold", "1"),
                    (
                        "pipe.iterate(restore=checkpoint())",
                        "restore",
                        rounds.cell(r["restore_vs_cold"], 2, "x"),
                    ),
                    (
                        "pipe.iterate() + load_state_dict(state_dict())",
                        "load_state_dict",
                        rounds.cell(r["load_state_dict_vs_cold"], 2, "x"),
                    ),
                )
            ],
            "note": (
                "Ready: the handle built and the state admitted (no batch yet); the first batch "
                "includes that. 'vs cold': ms to the first batch over the same round's cold "
                "start. " + rounds.method(n, r["load"], "One start of each kind per round.", quick)
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
