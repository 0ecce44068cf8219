"""Padding: the real-token fraction of packed rows against ``flush_every_k_chunks``,
``bins``, the shuffle buffer and the packing strategy, and what each knob costs in replay.

The workload is the examples': 0.7/0.3 prose/code (document weights), chunks of 16
documents, byte-level BPE with 8,192 tokens (trained here on the embedded corpus; a
lookup of the ids it gives, so the token counts are the tokenizer's), ``split(2048)`` ->
``pack(2048)`` -> ``shuffle`` (after pack, as in the examples) -> ``batch(8)``. Two corpora:

* ``demo``: one document per ``pydoc`` topic and per standard-library module
  (median 401 / 4,292 tokens);
* ``long``: the same text joined into long documents, 16 consecutive topics or 8
  consecutive modules each (~23k / ~57k tokens).

Real-token fraction = tokens / (rows x 2048): every packed row becomes one row of a
``[8, 2048]`` batch (``pad_to="max"``), so it is the share of a trainer's batch that is
not padding. Measured on one lane over a fixed number of flush epochs (each lane packs
alone: more lanes change nothing but the sampling); deterministic, so no rounds.

The library's defaults (``flush_every_k_chunks=None`` -> 4, ``pack(bins=8)``, the source's
``chunk_size=64``) are measured beside the grid's chunks of 16, for both strategies.

Pack's own CPU per fragment (first fit vs best fit, 8 and 64 bins): the operator alone over
the demo corpus's fragments, in interleaved rounds (``rounds.py``: order rotated per round,
each ratio taken within a round, median and min-max over the rounds).

Replay cost, measured on the examples' 4 lanes with ``batch(8)`` and the real tokenizer
(replay re-tokenizes): checkpoints at several steps; per checkpoint the chunks a restore
replays (``state["lanes"][i]["chunks"]``, what restore reads and re-processes), the
documents processed before the first batch after a restore (the critical path, no pump
thread), and the wall time to that batch (compile, admission, replay), median and min-max
over cuts x rounds, knobs interleaved per round.
"""

from __future__ import annotations

import itertools
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

import rounds  # noqa: E402
from bench_throughput import BpeTokenize, LookupIds, train_tokenizer  # noqa: E402

from zephon_core import Pipeline, StaticMixtureWorkSource  # noqa: E402
from zephon_core.ops import OpContext, PackOp  # noqa: E402
from zephon_core.records import Contributor, Record, SampleCursor  # noqa: E402
from zephon_core.testing import corpora  # noqa: E402

SEQ, CHUNK, BATCH, SEED = 2048, 16, 8, 1234
WEIGHTS = {"prose": 0.7, "code": 0.3}
KS, BINS, SHUFFLES = (1, 2, 4, 8, 16), (8, 16, 32, 64), (0, 64, 256)
STRATEGIES = ("first_fit", "best_fit")
EPOCHS = 12  # flush epochs per measurement
MIN_ROWS = 3000
#: replay: the knobs varied one at a time around the examples' setting
REPLAY_LANES, REPLAY_BASE = 4, {"k": 2, "bins": 8, "shuffle": 64, "strategy": "best_fit"}
REPLAY_CUTS = (60, 130, 210)


# -- the corpora ---------------------------------------------------------------------------
def _joined(docs: tuple[dict, ...], per: int, tag: str) -> tuple[dict, ...]:
    groups = [docs[i : i + per] for i in range(0, len(docs), per)]
    return tuple(
        {"text": "\n\n".join(d["text"] for d in g), "id": f"{tag}:{i}"}
        for i, g in enumerate(groups)
    )


def corpus(name: str) -> dict[str, tuple[dict, ...]]:
    prose, code = corpora.prose(), corpora.code()
    if name == "demo":
        return {"prose": prose, "code": code}
    return {"prose": _joined(prose, 16, "long-topics"), "code": _joined(code, 8, "long-modules")}


def lookup_table() -> tuple[BpeTokenize, LookupIds, dict[str, dict[str, float]]]:
    """The real tokenizer, the ids it gives every document of both corpora, and their
    lengths."""
    tok = BpeTokenize(train_tokenizer())
    table: dict[str, np.ndarray] = {}
    lengths: dict[str, dict[str, float]] = {}
    for name in ("demo", "long"):
        for comp, docs in corpus(name).items():
            ids = tok.encode([d["text"] for d in docs])
            table.update(zip((d["id"] for d in docs), ids))
            n = np.array([len(x) for x in ids])
            lengths[f"{name}/{comp}"] = {
                "documents": len(docs),
                "median_tokens": float(np.median(n)),
                "mean_tokens": round(float(n.mean()), 1),
            }
    return tok, LookupIds(table, "lookup:" + tok.zephon_fingerprint()), lengths


# -- the pipeline --------------------------------------------------------------------------
def pipeline(
    name: str,
    fn: Callable,
    *,
    k: int,
    bins: int,
    shuffle: int,
    strategy: str,
    lanes: int = 1,
    batch: bool = False,
    prefetch: int = 0,
    chunk: int = CHUNK,
) -> Pipeline:
    source = StaticMixtureWorkSource(corpus(name), WEIGHTS, chunk_size=chunk, seed=SEED)
    pipe = (
        Pipeline(
            source, canonical_replicas=lanes, flush_every_k_chunks=k, seed=SEED, prefetch=prefetch
        )
        .fetch()
        .map(fn, batched=True, name="tokenize")
        .split(max_len=SEQ)
        .pack(seq_len=SEQ, bins=bins, strategy=strategy)
    )
    if shuffle:
        pipe = pipe.shuffle(buffer_size=shuffle)
    return pipe.batch(batch_size=BATCH) if batch else pipe


def real_fraction(pipe: Pipeline, rows: int) -> dict[str, Any]:
    """Tokens over ``rows`` x SEQ of the first ``rows`` packed rows."""
    with pipe.iterate() as it:
        n = sum(len(r["input_ids"]) for r in itertools.islice(it, rows))
    return {"rows": rows, "real_fraction": n / (rows * SEQ)}


def rows_for(name: str, k: int, tokens_per_doc: float, chunk: int = CHUNK) -> int:
    """Rows that cover EPOCHS flush epochs of one lane (at least MIN_ROWS)."""
    per_epoch = k * chunk * tokens_per_doc / SEQ
    return max(MIN_ROWS, int(EPOCHS * per_epoch))


def padding_grid(fn: Callable, lengths: dict, quick: bool) -> list[dict]:
    ks, bins_, shuffles = (KS[:3], BINS[:2], SHUFFLES[:2]) if quick else (KS, BINS, SHUFFLES)
    out = []
    for name in ("demo", "long"):
        per_doc = sum(w * lengths[f"{name}/{c}"]["mean_tokens"] for c, w in WEIGHTS.items())
        for k, bins, shuffle, strategy in itertools.product(ks, bins_, shuffles, STRATEGIES):
            rows = rows_for(name, k, per_doc) // (4 if quick else 1)
            knobs = {"k": k, "bins": bins, "shuffle": shuffle, "strategy": strategy}
            res = real_fraction(pipeline(name, fn, **knobs), rows)
            out.append({"corpus": name, **knobs, **res})
    return out


def defaults(fn: Callable, lengths: dict, quick: bool) -> list[dict]:
    """The library's defaults: k=4 (``flush_every_k_chunks=None``), 8 bins, chunks of 64
    (``StaticMixtureWorkSource``'s) and of 16 (the examples'); no shuffle."""
    out = []
    for name, chunk, strategy in itertools.product(("demo", "long"), (16, 64), STRATEGIES):
        per_doc = sum(w * lengths[f"{name}/{c}"]["mean_tokens"] for c, w in WEIGHTS.items())
        rows = rows_for(name, 4, per_doc, chunk) // (4 if quick else 1)
        knobs = {"k": 4, "bins": 8, "shuffle": 0, "strategy": strategy}
        res = real_fraction(pipeline(name, fn, chunk=chunk, **knobs), rows)
        out.append({"corpus": name, "chunk_size": chunk, **knobs, **res})
    return out


# -- pack's own CPU ------------------------------------------------------------------------
def _fragments(fn: LookupIds, n_docs: int) -> list[Record]:
    """The demo corpus's fragments of at most SEQ tokens, documents in a fixed order."""
    rng = np.random.default_rng(SEED)
    docs = [d for ds in corpus("demo").values() for d in ds]
    out = []
    for i, j in enumerate(rng.integers(0, len(docs), n_docs).tolist()):
        ids = fn.table[docs[j]["id"]]
        for c, lo in enumerate(range(0, len(ids), SEQ)):
            part = ids[lo : lo + SEQ]
            last = lo + SEQ >= len(ids)
            out.append(
                Record(
                    {"input_ids": part},
                    SampleCursor(0, i // CHUNK, i % CHUNK, c),
                    [Contributor(i // CHUNK, i % CHUNK, c, last, 0, len(part))],
                )
            )
    return out


def _pack(frags: list[Record], bins: int, strategy: str, flush_every: int) -> rounds.Sample:
    """One pass of the operator over ``frags``, timed from the first fragment in."""
    op = PackOp(SEQ, bins, strategy=strategy)
    op.bind(OpContext(seed=SEED, index=0, component_names=("demo",), weights=(1.0,)))
    lane = op.for_lane(0)
    t0 = time.perf_counter()
    for i, r in enumerate(frags, 1):
        lane.process(r)
        if i % flush_every == 0:
            lane.flush()
            lane = op.for_lane(0)  # as a flush does: a fresh instance
    lane.flush()
    return {"seconds": time.perf_counter() - t0, "fragments": float(len(frags))}


def _variant(bins: int, strategy: str) -> str:
    return f"{strategy}, {bins} bins"


def pack_cpu(fn: LookupIds, quick: bool, n_rounds: int) -> dict[str, Any]:
    frags = _fragments(fn, 800 if quick else 4000)
    flush_every = 4 * CHUNK * len(frags) // (800 if quick else 4000)  # ~ k=4: 64 documents
    grid = [(b, s) for b in (8, 64) for s in STRATEGIES]
    r = rounds.run(
        {_variant(b, s): lambda b=b, s=s: _pack(frags, b, s, flush_every) for b, s in grid},
        n_rounds,
    )
    base = _variant(8, "first_fit")
    return {
        "fragments": len(frags),
        "load": r.load,
        "rows": [
            {
                "variant": _variant(b, s),
                "s_per_fragment": r.per(_variant(b, s), "seconds", "fragments").to_json(),
                # time per fragment over the base's and over first fit's at the same bins,
                # both within a round
                "vs_first_fit_8": r.cost_ratio(
                    _variant(b, s), base, "seconds", "fragments"
                ).to_json(),
                "vs_first_fit_same_bins": r.cost_ratio(
                    _variant(b, s), _variant(b, "first_fit"), "seconds", "fragments"
                ).to_json(),
            }
            for b, s in grid
        ],
    }


# -- replay --------------------------------------------------------------------------------
def _replay_variants(quick: bool) -> dict[str, dict]:
    base = REPLAY_BASE
    variants = {"base": dict(base)}
    for k in (1, 4, 8, 16) if not quick else (8,):
        variants[f"k={k}"] = {**base, "k": k}
    for bins in (16, 32, 64) if not quick else (32,):
        variants[f"bins={bins}"] = {**base, "bins": bins}
    for shuffle in (0, 256):
        variants[f"shuffle={shuffle}"] = {**base, "shuffle": shuffle}
    variants["first_fit"] = {**base, "strategy": "first_fit"}
    return variants


def _first_batch(build: Callable[[], Pipeline], state: dict) -> tuple[float, int]:
    t0 = time.perf_counter()
    it = build().iterate(restore=state)
    next(it)
    ms = 1000 * (time.perf_counter() - t0)
    docs = it.stats()["operators"]["fetch"]["records_in"]  # exact: no pump thread
    it.close()
    return ms, docs


def replay_costs(fn: Callable, quick: bool, n_rounds: int) -> dict[str, dict]:
    variants = _replay_variants(quick)
    builds = {
        v: (lambda kn=kn: pipeline("demo", fn, lanes=REPLAY_LANES, batch=True, **kn))
        for v, kn in variants.items()
    }
    states: dict[str, list[dict]] = {}
    chunks: dict[str, list[int]] = {}
    for v, build in builds.items():
        states[v] = []
        with build().iterate() as it:
            for i, _ in enumerate(itertools.islice(it, max(REPLAY_CUTS)), 1):
                if i in REPLAY_CUTS:
                    states[v].append(it.checkpoint())
        chunks[v] = [len(lane["chunks"]) for s in states[v] for lane in s["lanes"]]
    times: dict[str, list[float]] = {v: [] for v in variants}
    docs: dict[str, list[int]] = {v: [] for v in variants}
    names = list(variants)
    for r in range(n_rounds):  # A B C ... then reversed: noise hits every variant alike
        for v in names if r % 2 == 0 else reversed(names):
            for state in states[v]:
                ms, d = _first_batch(builds[v], state)
                times[v].append(ms)
                docs[v].append(d)
    return {
        v: {
            **variants[v],
            "chunks_per_lane_mean": round(statistics.mean(chunks[v]), 2),
            "chunks_per_lane_max": max(chunks[v]),
            "documents_to_first_batch_median": statistics.median(docs[v]),
            "restore_ms_median": round(statistics.median(times[v]), 1),
            "restore_ms_min_max": [round(min(times[v]), 1), round(max(times[v]), 1)],
        }
        for v in variants
    }


# -- the run -------------------------------------------------------------------------------
def main(quick: bool = False) -> dict:
    t0, load_start = time.perf_counter(), os.getloadavg()
    tok, fn, lengths = lookup_table()
    grid = padding_grid(fn, lengths, quick)
    at_defaults = defaults(fn, lengths, quick)
    cpu = pack_cpu(fn, quick, n_rounds=3 if quick else 7)
    replay = replay_costs(tok, quick, n_rounds=2 if quick else 5)  # the tokenizer is replayed
    return {
        "workload": f"split/pack {SEQ}, chunks of {CHUNK}, 0.7/0.3 documents, BPE 8192 (ids "
        "looked up for the fractions and pack's CPU, tokenized for replay); shuffle after pack",
        "corpora": lengths,
        "grid": grid,
        "defaults": at_defaults,
        "pack_cpu": cpu,
        "replay": replay,
        "quick": quick,
        "seconds_total": round(time.perf_counter() - t0, 1),
        "load_average_start_end": [
            [round(x, 2) for x in load_start],
            [round(x, 2) for x in os.getloadavg()],
        ],
    }


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def tables(result: dict) -> list[dict]:
    grid = result["grid"]
    load = result["load_average_start_end"]
    out = []
    shuffles = sorted({g["shuffle"] for g in grid})
    for name in ("demo", "long"):
        rows = [g for g in grid if g["corpus"] == name]
        ks = sorted({g["k"] for g in rows})
        bins_ = sorted({g["bins"] for g in rows})
        at = {(g["k"], g["bins"], g["shuffle"], g["strategy"]): g["real_fraction"] for g in rows}
        body = []
        for strategy in STRATEGIES:
            for bins in bins_:
                cells = [_pct(at[(k, bins, shuffles[0], strategy)]) for k in ks]
                body.append([strategy, str(bins), *cells])
        spread = max(
            abs(at[(k, b, s, st)] - at[(k, b, shuffles[0], st)])
            for k in ks
            for b in bins_
            for s in shuffles
            for st in STRATEGIES
        )
        out.append(
            {
                "title": f"Real-token fraction at seq_len {SEQ}, {name} corpus",
                "columns": ["strategy", "bins", *[f"k={k}" for k in ks]],
                "rows": body,
                "note": (
                    f"k = flush_every_k_chunks, chunks of {CHUNK} documents; "
                    f"{EPOCHS} flush epochs (>= {MIN_ROWS} rows) of one lane per cell. "
                    f"Shown without shuffle; a shuffle buffer of {shuffles[1:]} rows after pack "
                    f"moves no cell by more than {100 * spread:.2f} pp (it reorders rows, it "
                    "makes none: only which rows fall in the measured window changes)."
                ),
            }
        )
    out.append(
        {
            "title": "Real-token fraction at the defaults (k=4, 8 bins), seq_len 2048",
            "columns": ["corpus", "chunk_size", "first_fit", "best_fit (the default)"],
            "rows": [
                [
                    name,
                    str(chunk),
                    *[
                        _pct(d["real_fraction"])
                        for st in STRATEGIES
                        for d in result["defaults"]
                        if (d["corpus"], d["chunk_size"], d["strategy"]) == (name, chunk, st)
                    ],
                ]
                for name in ("demo", "long")
                for chunk in (16, 64)
            ],
            "note": "flush_every_k_chunks=None resolves to 4 for a pipeline that packs; "
            "chunk_size 64 is StaticMixtureWorkSource's default, 16 the examples'.",
        }
    )
    cpu = result["pack_cpu"]
    out.append(
        {
            "title": "pack's own CPU per fragment (demo corpus, a flush every 64 documents)",
            "columns": [
                "strategy, bins",
                "us per fragment",
                "vs first fit, 8 bins",
                "vs first fit, same bins",
            ],
            "rows": [
                [
                    r["variant"],
                    rounds.cell(r["s_per_fragment"], 2, scale=1e6),
                    rounds.cell(r["vs_first_fit_8"], 2, "x"),
                    rounds.cell(r["vs_first_fit_same_bins"], 2, "x"),
                ]
                for r in cpu["rows"]
            ],
            "note": "The operator alone; ratios of time per fragment. "
            + rounds.method(
                len(cpu["load"]),
                cpu["load"],
                f"Each variant packs the same {cpu['fragments']:,} fragments once per round.",
                result.get("quick", False),
            ),
        }
    )
    replay = result["replay"]
    out.append(
        {
            "title": "Replay cost of each knob (demo corpus, real tokenizer, 4 lanes, batch 8)",
            "columns": [
                "variant",
                "chunks replayed per lane (mean / max)",
                "documents to the first batch",
                "restore to first batch, ms (median, min-max)",
            ],
            "rows": [
                [
                    v,
                    f"{r['chunks_per_lane_mean']:.1f} / {r['chunks_per_lane_max']}",
                    f"{r['documents_to_first_batch_median']:.0f}",
                    f"{r['restore_ms_median']:.0f} ({r['restore_ms_min_max'][0]:.0f}-"
                    f"{r['restore_ms_min_max'][1]:.0f})",
                ]
                for v, r in replay.items()
            ],
            "note": (
                f"base: k={REPLAY_BASE['k']}, bins={REPLAY_BASE['bins']}, shuffle "
                f"{REPLAY_BASE['shuffle']}, best fit; checkpoints at batches {REPLAY_CUTS}; "
                f"load average {load[0][0]}-{load[1][0]}"
            ),
        }
    )
    return out


if __name__ == "__main__":
    import json

    res = main(quick="--quick" in sys.argv)
    print(json.dumps(res, indent=1))
    for t in tables(res):
        print(f"\n## {t['title']}\n")
        print("| " + " | ".join(t["columns"]) + " |")
        print("| " + " | ".join("---" for _ in t["columns"]) + " |")
        for row in t["rows"]:
            print("| " + " | ".join(row) + " |")
        print(f"\n{t['note']}")
