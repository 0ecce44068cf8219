"""What ``batch(provenance=True)`` costs: the real-tokenizer workload of
``bench_throughput.py`` with provenance off and on, side by side.

Variants run in interleaved rounds (off, on, on, off, off, on, ...: each round reverses
the order, so drift and other jobs on the machine hit both alike); per variant the
median ms/batch over the rounds and its min-max. Measured: ``iterate()`` and
``dataloader(num_workers=2)`` with the real BPE tokenizer (the goal: <= 3 % of
throughput), and ``iterate()`` with the tokenizer replaced by a lookup (the framework
alone, where the per-record work of provenance shows most). CPU time (all threads of
the process) is less disturbed by other jobs than wall time; the lookup's added CPU per
batch, over the real tokenizer's CPU per batch, is provenance's share of the work. Also
the bytes a worker pickles per batch with and without it.
"""

from __future__ import annotations

import itertools
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from bpe_workload import BpeTokenize, LookupIds, all_docs, train_tokenizer, zephon_pipeline
from throughput_probes import bench_wire


def _ms_per_batch(build: Callable[[], Any], n: int, warmup: int) -> tuple[float, float]:
    """Wall and this process's CPU (all its threads) ms per batch after ``warmup``."""
    handle = build()
    it = iter(handle)
    for _ in itertools.islice(it, warmup):
        pass
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in itertools.islice(it, n):
        pass
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    handle.close()
    return 1000 * wall / n, 1000 * cpu / n


def _pair(build: Callable[[bool], Any], n: int, warmup: int, rounds: int) -> dict[str, Any]:
    runs: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    for r in range(rounds):
        for on in (False, True) if r % 2 == 0 else (True, False):
            runs[on].append(_ms_per_batch(lambda on=on: build(on), n, warmup))
    out: dict[str, Any] = {"rounds": rounds}
    for i, what in enumerate(("wall", "cpu")):
        off = [r[i] for r in runs[False]]
        on_ = [r[i] for r in runs[True]]
        m_off, m_on = statistics.median(off), statistics.median(on_)
        out[what] = {
            "off_ms_per_batch": {"median": round(m_off, 3), "min_max": _span(off)},
            "on_ms_per_batch": {"median": round(m_on, 3), "min_max": _span(on_)},
            "overhead_pct_of_median": round(100 * (m_on - m_off) / m_off, 2),
            "overhead_pct_of_min": round(100 * (min(on_) - min(off)) / min(off), 2),
        }
    return out


def _span(values: list[float]) -> list[float]:
    return [round(min(values), 3), round(max(values), 3)]


def _wire(fn: Callable, on: bool) -> dict[str, Any]:
    """What a DataLoader worker pickles per batch (``throughput_probes.bench_wire``)."""
    w = bench_wire(fn, provenance=on)
    keep = ("pickled_bytes_per_batch_median", "wire_array_bytes_median")
    return {k: w[k] for k in keep} | {
        "provenance_array": w["wire_arrays"].get("provenance", {"bytes": 0}),
    }


def main(
    quick: bool = False, n_tok: int = 80, n_lookup: int = 400, rounds: int = 8
) -> dict[str, Any]:
    n_tok, n_lookup, rounds = (10, 40, 2) if quick else (n_tok, n_lookup, rounds)
    tok = BpeTokenize(train_tokenizer())
    docs = all_docs()
    table = dict(zip((d["id"] for d in docs), tok.encode([d["text"] for d in docs])))
    lookup = LookupIds(table, "lookup:" + tok.zephon_fingerprint())
    t0 = time.perf_counter()
    result = {
        "real_tokenizer_iterate": _pair(
            lambda on: zephon_pipeline(tok, provenance=on).iterate(), n_tok, 10, rounds
        ),
        "real_tokenizer_workers_2": _pair(
            lambda on: zephon_pipeline(tok, provenance=on).dataloader(num_workers=2),
            n_tok,
            10,
            rounds,
        ),
        "lookup_iterate": _pair(
            lambda on: zephon_pipeline(lookup, provenance=on).iterate(), n_lookup, 40, rounds
        ),
        # one thread, short rounds, many of them: the least disturbed measure
        "lookup_iterate_no_pump": _pair(
            lambda on: zephon_pipeline(lookup, prefetch=0, provenance=on).iterate(),
            n_lookup,
            40,
            4 * rounds,
        ),
        "wire_off": _wire(lookup, False),
        "wire_on": _wire(lookup, True),
    }
    # provenance's own work is a fixed cost per batch: measured where nothing hides it
    # (the lookup), set against what a batch costs with the real tokenizer
    lk = result["lookup_iterate_no_pump"]["cpu"]
    real = result["real_tokenizer_iterate"]["cpu"]
    added = lk["on_ms_per_batch"]["median"] - lk["off_ms_per_batch"]["median"]
    result["added_cpu_ms_per_batch"] = round(added, 3)
    result["added_cpu_pct_of_real_tokenizer_batch"] = round(
        100 * added / real["off_ms_per_batch"]["median"], 2
    )
    result["seconds_total"] = round(time.perf_counter() - t0, 1)
    for k, v in result.items():
        print(f"{k}: {v}", file=sys.stderr)
    return result


_NOTE = (
    "Provenance on vs off, alternating rounds (medians inside)."
)


def tables(result: dict) -> list[dict]:
    """The result as tables for ``docs/measurements.md``."""
    from report import flat_tables

    return flat_tables(result, _NOTE)


if __name__ == "__main__":
    import json

    print(json.dumps(main(), indent=2))
