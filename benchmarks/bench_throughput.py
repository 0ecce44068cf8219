"""Throughput with a real tokenizer, side by side in one run: a bare loop, Zephon in
process, and Zephon behind DataLoader workers.

The workload: 0.7/0.3 prose/code (document weights) -> byte-level BPE (``tokenizers``,
vocab 8192, trained here on the embedded corpus) -> split to <= 2048 -> first-fit pack
2048 (8 bins) -> shuffle (buffer 64) -> batch 8; Zephon with 4 lanes, a flush every 2
chunks of 16 documents. Measured (ms/batch after warm-up, median of alternating rounds):

1. the bare loop: the same steps written out with numpy, no framework;
2. Zephon ``pipe.iterate()``;
3. Zephon ``pipe.dataloader(num_workers=w)``, w = 1, 2, 4, 8;
4. the framework alone: the tokenizer replaced by a lookup of precomputed ids, also with
   2 DataLoader workers next to the bare loop behind the same DataLoader;
5. bytes a DataLoader worker sends per batch (pickled as torch's worker queue does);
6. restore-to-first-batch at several positions, against the replay it implies;
7. threads per process.

Zephon's flushes emit partly filled bins, so its batches carry fewer real tokens than
the bare loop's: ratios are also given per real (non-padding) token.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import statistics
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset

from zephon_core import Pipeline, StaticMixtureWorkSource
from zephon_core.testing import corpora

SEQ, BINS, SHUFFLE, BATCH = 2048, 8, 64, 8
VOCAB, CHUNK, LANES, K, SEED = 8192, 16, 8, 2, 1234  # 8 lanes: 1/2/4/8 workers divide them
WEIGHTS = {"prose": 0.7, "code": 0.3}
WORKERS = (1, 2, 4, 8)
RESTORE_AT = (20, 100, 300)


# -- the tokenizer and the lookup that replaces it ---------------------------------------
def train_tokenizer(vocab_size: int = VOCAB) -> str:
    """A byte-level BPE trained on the embedded corpus (the examples' own), as its JSON."""
    import tempfile
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    from embedded import train_tokenizer as train

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "tokenizer.json"
        train(path, vocab_size)
        return path.read_text()


class BpeTokenize:
    """Batched map: text -> int32 ids. Pickles as its JSON; the Tokenizer is built lazily
    in each process that uses it."""

    def __init__(self, spec: str):
        self.spec = spec
        self._tok: Any = None

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        if self._tok is None:
            from tokenizers import Tokenizer

            self._tok = Tokenizer.from_str(self.spec)
        return [np.asarray(e.ids, dtype=np.int32) for e in self._tok.encode_batch(texts)]

    def __call__(self, payloads: list[dict]) -> list[dict]:
        return [{"input_ids": ids} for ids in self.encode([p["text"] for p in payloads])]

    def __getstate__(self) -> dict:
        return {"spec": self.spec, "_tok": None}

    def zephon_fingerprint(self) -> str:
        return hashlib.sha256(self.spec.encode()).hexdigest()[:32]


class LookupIds:
    """Batched map returning precomputed ids by document id: the framework without the
    tokenizer. Module level, so DataLoader workers can pickle it."""

    def __init__(self, table: dict[str, np.ndarray], tag: str):
        self.table = table
        self.tag = tag

    def encode(self, texts_or_ids: list[str]) -> list[np.ndarray]:
        return [self.table[i] for i in texts_or_ids]

    def __call__(self, payloads: list[dict]) -> list[dict]:
        table = self.table
        return [{"input_ids": table[p["id"]]} for p in payloads]

    def zephon_fingerprint(self) -> str:
        return self.tag  # a digest of the table would cost more than the lookups measured


def _all_docs() -> tuple[dict, ...]:
    return corpora.prose() + corpora.code()


# -- Zephon --------------------------------------------------------------------------------
def zephon_pipeline(fn: Callable, prefetch: int = 3, provenance: bool = False) -> Pipeline:
    source = StaticMixtureWorkSource(
        {"prose": corpora.prose(), "code": corpora.code()}, WEIGHTS, chunk_size=CHUNK, seed=SEED
    )
    return (
        Pipeline(
            source, canonical_replicas=LANES, flush_every_k_chunks=K, seed=SEED, prefetch=prefetch
        )
        .fetch()
        .map(fn, batched=True, name="tokenize")
        .split(max_len=SEQ)
        .pack(seq_len=SEQ, bins=BINS)
        .shuffle(buffer_size=SHUFFLE)
        .batch(batch_size=BATCH, provenance=provenance)
    )


# -- the bare loop -------------------------------------------------------------------------
_ARANGE = np.arange(SEQ, dtype=np.int64)


def _collate(rows: list[tuple[np.ndarray, list[int]]]) -> dict[str, torch.Tensor]:
    """The keys and values Zephon's batch gives packed rows (ops/packed_batch.py)."""
    ids = np.zeros((len(rows), SEQ), np.int64)
    labels = np.full((len(rows), SEQ), -100, np.int64)
    pos = np.empty((len(rows), SEQ), np.int64)
    for r, (toks, segs) in enumerate(rows):
        n = len(toks)
        ids[r, :n] = toks
        labels[r, :n] = toks
        off = 0
        for s in segs:
            pos[r, off : off + s] = _ARANGE[:s]
            labels[r, off] = -100  # a document's first token is not predicted from the last
            off += s
        pos[r, n:] = _ARANGE[: SEQ - n]
    return {
        "input_ids": torch.from_numpy(ids),
        "labels": torch.from_numpy(labels),
        "position_ids": torch.from_numpy(pos),
    }


class BareLoop:
    """Mixture -> tokenize 16 documents at a time -> split -> first-fit pack (8 bins) ->
    64-slot shuffle buffer -> batches of 8, with numpy and nothing else."""

    def __init__(self, encode: Callable[[list], list[np.ndarray]], by_id: bool, seed: int = SEED):
        self.encode, self.by_id = encode, by_id
        self.docs = (corpora.prose(), corpora.code())
        self.rng = np.random.default_rng(seed)
        self.documents = self.real_tokens = self.batches = 0
        self._gen = self._batches()

    def __iter__(self) -> Iterator[dict]:
        return self._gen

    def close(self) -> None:
        self._gen.close()

    def _documents(self) -> Iterator[list]:
        rng, docs = self.rng, self.docs
        perms = [rng.permutation(len(d)) for d in docs]
        at = [0, 0]
        while True:
            picks = []
            for c in (rng.random(CHUNK) >= WEIGHTS["prose"]).astype(int).tolist():
                if at[c] == len(perms[c]):
                    perms[c], at[c] = rng.permutation(len(docs[c])), 0
                doc = docs[c][perms[c][at[c]]]
                at[c] += 1
                picks.append(doc["id"] if self.by_id else doc["text"])
            yield picks

    def _batches(self) -> Iterator[dict]:
        fill, parts = [0] * BINS, [[] for _ in range(BINS)]
        shuffle: list = []
        draws: list[int] = []
        rows: list = []

        def emit(b: int) -> tuple[np.ndarray, list[int]]:
            toks = np.concatenate(parts[b]) if len(parts[b]) > 1 else parts[b][0]
            row = (toks, [len(p) for p in parts[b]])
            fill[b], parts[b] = 0, []
            return row

        def pack(frag: np.ndarray) -> list:
            n = len(frag)
            for b in range(BINS):
                if fill[b] + n <= SEQ:
                    parts[b].append(frag)
                    fill[b] += n
                    return [emit(b)] if fill[b] == SEQ else []
            b = max(range(BINS), key=fill.__getitem__)
            out = [emit(b)]
            parts[b].append(frag)
            fill[b] = n
            return out + [emit(b)] if n == SEQ else out

        for picks in self._documents():
            self.documents += len(picks)
            for ids in self.encode(picks):
                for lo in range(0, len(ids), SEQ):
                    for row in pack(ids[lo : lo + SEQ]):
                        if len(shuffle) < SHUFFLE:
                            shuffle.append(row)
                            continue
                        if not draws:
                            draws = self.rng.integers(0, SHUFFLE, 256).tolist()
                        j = draws.pop()
                        shuffle[j], row = row, shuffle[j]
                        rows.append(row)
                        if len(rows) == BATCH:
                            self.batches += 1
                            self.real_tokens += sum(len(t) for t, _ in rows)
                            yield _collate(rows)
                            rows = []


class BareLoopDataset(IterableDataset):
    """The bare loop behind ``DataLoader(num_workers=w)``: each worker runs its own loop
    (seeded by its id) and yields ready tensors, as a plain torch user would write it.
    What torch's worker machinery costs without Zephon: the denominator for the
    2-worker overhead goal."""

    def __init__(self, encode: Callable, by_id: bool):
        self.encode, self.by_id = encode, by_id

    def __iter__(self) -> Iterator[dict]:
        info = torch.utils.data.get_worker_info()
        return iter(BareLoop(self.encode, self.by_id, SEED + (info.id if info else 0)))


class _Loader:
    """A DataLoader with ``close()`` (the measuring loop closes what it built)."""

    def __init__(self, loader: DataLoader):
        self.loader = loader

    def __iter__(self) -> Iterator:
        self._it = iter(self.loader)
        return self._it

    def close(self) -> None:
        self._it._shutdown_workers()


def bare_loader(encode: Callable, by_id: bool, workers: int) -> _Loader:
    return _Loader(DataLoader(BareLoopDataset(encode, by_id), batch_size=None, num_workers=workers))


# -- measuring -----------------------------------------------------------------------------
def _once(build: Callable, n: int, warmup: int) -> tuple[float, float]:
    """Wall and this process's CPU ms per batch over ``n`` batches after ``warmup`` (which
    also keeps DataLoader worker startup out)."""
    obj = build()
    it = iter(obj)
    for _ in itertools.islice(it, warmup):
        pass
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in itertools.islice(it, n):
        pass
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    obj.close()
    return 1000 * wall / n, 1000 * cpu / n


def _timed(
    builds: dict[str, Callable], n: int, warmup: int, rounds: int
) -> tuple[dict[str, float], dict[str, float]]:
    """Median ms/batch and main-process CPU ms/batch of each variant; variants alternate
    round by round (order reversed every other round) so machine noise hits all alike."""
    runs: dict[str, list[tuple[float, float]]] = {k: [] for k in builds}
    names = list(builds)
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            runs[name].append(_once(builds[name], n, warmup))
    wall = {k: statistics.median(w for w, _ in v) for k, v in runs.items()}
    cpu = {k: statistics.median(c for _, c in v) for k, v in runs.items()}
    return wall, cpu


def _zephon_shape(stats: dict, mean_len: dict[str, float]) -> dict[str, float]:
    """Padding and documents per batch from ``stats()``: delivered tokens per dataset over
    that dataset's mean document length (delivered, not scheduled: the pump runs ahead)."""
    docs = sum(row["tokens"] / mean_len[name] for name, row in stats["mixture"].items())
    return {
        "padding_ratio": stats["padding_ratio"],
        "documents_per_batch": docs / stats["outputs"],
        "real_tokens_per_batch": BATCH * SEQ * (1 - stats["padding_ratio"]),
    }


def _zephon_stats(fn: Callable, n: int) -> dict:
    with zephon_pipeline(fn).iterate() as it:
        for _ in itertools.islice(it, n):
            pass
        return it.stats()


def _bare_stats(encode: Callable, by_id: bool, n: int) -> dict[str, float]:
    loop = BareLoop(encode, by_id)
    for _ in itertools.islice(loop, n):
        pass
    loop.close()
    return {
        "padding_ratio": 1 - loop.real_tokens / (loop.batches * BATCH * SEQ),
        "documents_per_batch": loop.documents / loop.batches,
        "real_tokens_per_batch": loop.real_tokens / loop.batches,
    }


def _threads() -> dict[str, Any]:
    return {
        "python_threads": threading.active_count(),
        "os_threads": len(os.listdir("/proc/self/task")),
        "names": sorted(t.name for t in threading.enumerate()),
    }


def _arrays(obj: Any, name: str = "") -> dict[str, tuple[str, int]]:
    """``{field: (dtype, nbytes)}`` of the arrays in what a worker sends, whatever its form
    (a dict of arrays, or an object holding arrays and lists of them)."""
    if isinstance(obj, (np.ndarray, torch.Tensor)):
        return {name: (str(obj.dtype), int(obj.nbytes))}
    if isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, (list, tuple)):
        found = [_arrays(v) for v in obj]
        if not found or not all(found):
            return {}
        return {f"{name}[{len(obj)}]": (found[0][""][0], sum(f[""][1] for f in found))}
    elif hasattr(obj, "__dict__"):
        items = vars(obj).items()
    else:
        return {}
    out: dict[str, tuple[str, int]] = {}
    for k, v in items:
        for kk, vv in _arrays(v, "").items():
            out[f"{k}{kk}"] = vv
    return out


class _WireProbe(IterableDataset):
    """Runs Zephon's worker-side dataset inside a real DataLoader worker and yields, for
    each ``(batch, delta)`` it would send, what pickling it for the worker queue costs."""

    def __init__(self, inner: IterableDataset, n: int):
        self.inner, self.n = inner, n

    def __iter__(self) -> Iterator[dict]:
        gen = iter(self.inner)
        try:
            for i, (wire, delta) in enumerate(itertools.islice(gen, self.n)):
                arrays = _arrays(wire)
                out = {
                    "item_bytes": len(ForkingPickler.dumps((wire, delta))),
                    "delta_bytes": len(ForkingPickler.dumps(delta)),
                    "array_bytes": sum(b for _, b in arrays.values()),
                    "arrays": arrays,
                    "wire_type": type(wire).__name__,
                }
                if i == self.n // 2:  # mid-run: the pipeline's threads are all up
                    out["threads"] = _threads()
                yield out
        finally:
            gen.close()


def bench_wire(fn: Callable, n: int = 40, provenance: bool = False) -> dict[str, Any]:
    """Bytes per batch through a worker's pipe, next to the tensors the consumer gets."""
    pipe = zephon_pipeline(fn, provenance=provenance)
    loader = DataLoader(
        _WireProbe(pipe.torch_dataset(), n), batch_size=None, num_workers=1, collate_fn=None
    )
    items = list(loader)
    with zephon_pipeline(fn, provenance=provenance).iterate() as it:
        tensors = _arrays(next(it))
    total = [x["item_bytes"] for x in items]
    delta = [x["delta_bytes"] for x in items]
    arrays = int(statistics.median(x["array_bytes"] for x in items))
    return {
        "wire_type": items[0]["wire_type"],
        "wire_arrays": {k: {"dtype": d, "bytes": b} for k, (d, b) in items[0]["arrays"].items()},
        "wire_array_bytes_median": arrays,
        "pickled_bytes_per_batch_median": int(statistics.median(total)),
        "non_array_bytes_median": int(statistics.median(total)) - arrays,
        "delta_bytes_median": int(statistics.median(delta)),
        "delta_bytes_max": max(delta),  # every 16th delta carries the worker's counters
        "consumer_tensors": {k: {"dtype": d, "bytes": b} for k, (d, b) in tensors.items()},
        "consumer_tensor_bytes": sum(b for _, b in tensors.values()),
        "worker_threads": next(x["threads"] for x in items if "threads" in x),
    }


def bench_restore(
    fn: Callable, steady_ms: float, mean_len: dict[str, float], repeats: int = 3
) -> dict[str, Any]:
    """Checkpoints at RESTORE_AT, each restored into a freshly built pipeline (compile and
    admission included, the tokenizer already loaded) and timed to its first batch. The
    same run gives Zephon's padding and documents per batch, and its threads.

    Replay depth, in batches' worth of work at steady state: the replayed chunks'
    documents over documents per batch (all lanes' chunks, as the state holds them), and
    the documents actually tokenized before the first batch (a run without the pump thread,
    which stops at that batch), over documents per batch. The second also counts the new
    chunks a lane must read to reach its next flush, which releases the shuffle buffer.
    """
    states, threads = {}, None
    with zephon_pipeline(fn).iterate() as it:
        for i, _ in enumerate(itertools.islice(it, max(RESTORE_AT)), 1):
            if i in RESTORE_AT:
                states[i] = it.checkpoint()
            if i == RESTORE_AT[0]:
                threads = _threads()
        shape = _zephon_shape(it.stats(), mean_len)
    per_batch = shape["documents_per_batch"]
    out: dict[str, Any] = {"threads": threads, "shape": shape}
    for at, state in ((0, None), *states.items()):
        runs = [_first_batch(fn, state) for _ in range(repeats)]
        ms, replayed = min(r[0] for r in runs), runs[0][1]
        bare_ms, _, docs = _first_batch(fn, state, prefetch=0)
        row = {
            "first_batch_ms": round(ms, 1),
            "first_batch_ms_repeats": [round(r[0], 1) for r in runs],
            "first_batch_ms_no_pump": round(bare_ms, 1),
            "documents_tokenized_to_first_batch": docs,
            "work_depth_batches": round(docs / per_batch, 1),
            "ratio_vs_steady_x_work_depth": round(ms / (steady_ms * docs / per_batch), 2),
        }
        if state is not None:
            depth = replayed * CHUNK / per_batch
            row = {
                "chunks_replayed_all_lanes": replayed,
                # the first batch comes from lane position % C
                "chunks_inflight_first_lane": len(
                    state["lanes"][state["position"] % LANES]["chunks"]
                ),
                "replay_depth_batches_all_lanes": round(depth, 1),
                "ratio_vs_steady_x_replay_depth": round(ms / (steady_ms * depth), 2),
                **row,
            }
        out["cold_start" if state is None else f"at_{at}"] = row
    return out


def _first_batch(fn: Callable, state: dict | None, prefetch: int = 3) -> tuple[float, int, int]:
    t0 = time.perf_counter()
    it = zephon_pipeline(fn, prefetch).iterate(restore=state)
    next(it)
    ms = 1000 * (time.perf_counter() - t0)
    replayed = it.chunks_replayed
    docs = it.stats()["operators"]["tokenize"]["records_in"]  # exact without the pump
    it.close()
    return ms, replayed, docs


# -- the run -------------------------------------------------------------------------------
def main(n_tok: int = 150, n_lookup: int = 1000, rounds: int = 3) -> dict[str, Any]:
    t_start, load_start = time.perf_counter(), os.getloadavg()[0]
    tok = BpeTokenize(train_tokenizer())
    docs = _all_docs()
    table = dict(zip((d["id"] for d in docs), tok.encode([d["text"] for d in docs])))
    lookup = LookupIds(table, "lookup:" + tok.zephon_fingerprint())
    mean_len = {
        name: float(np.mean([len(table[d["id"]]) for d in ds]))
        for name, ds in (("prose", corpora.prose()), ("code", corpora.code()))
    }

    # 1-3: the real tokenizer, every variant in alternating rounds
    builds: dict[str, Callable] = {
        "bare_loop": lambda: BareLoop(tok.encode, by_id=False),
        "zephon_iterate": lambda: zephon_pipeline(tok).iterate(),
    }
    for w in WORKERS:
        builds[f"zephon_workers_{w}"] = lambda w=w: zephon_pipeline(tok).dataloader(num_workers=w)
    with warnings.catch_warnings():  # torch's advice against 4 workers on 2 cores: known
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        real, real_cpu = _timed(builds, n_tok, warmup=12, rounds=rounds)
    # 6-7 (its run also gives Zephon's padding and documents per batch)
    restore = bench_restore(tok, real["zephon_iterate"], mean_len)
    real_shape = {
        "bare_loop": _bare_stats(tok.encode, False, n_tok),
        "zephon": restore.pop("shape"),
    }

    # 4: the framework alone (ids looked up, not computed)
    lk, lk_cpu = _timed(
        {
            "bare_loop": lambda: BareLoop(lookup.encode, by_id=True),
            "zephon_iterate": lambda: zephon_pipeline(lookup).iterate(),
            "zephon_iterate_no_pump": lambda: zephon_pipeline(lookup, prefetch=0).iterate(),
            "zephon_workers_2": lambda: zephon_pipeline(lookup).dataloader(num_workers=2),
            "bare_loop_workers_2": lambda: bare_loader(lookup.encode, True, 2),
        },
        n_lookup,
        warmup=60,
        rounds=rounds,
    )
    lk_shape = {
        "bare_loop": _bare_stats(lookup.encode, True, n_lookup),
        "zephon": _zephon_shape(_zephon_stats(lookup, n_lookup), mean_len),
    }

    def per_token(ms: float, shape: dict) -> float:
        return ms / shape["real_tokens_per_batch"]

    def ratios(ms: dict[str, float], shape: dict) -> dict[str, float]:
        bare, plain = ms["bare_loop"], ms["zephon_iterate"]
        out = {}
        for k, v in ms.items():
            if k.startswith("bare_loop"):
                continue
            out[f"{k}_vs_bare"] = round(v / bare, 2)
            out[f"{k}_vs_bare_per_real_token"] = round(
                per_token(v, shape["zephon"]) / per_token(bare, shape["bare_loop"]), 2
            )
            if k.startswith("zephon_workers"):
                # speed-up over plain iteration (the goal: >= 1.0 with 2 workers)
                out[f"{k}_speedup_vs_iterate"] = round(plain / v, 2)
                bare_w = ms.get(f"bare_loop_{k.removeprefix('zephon_')}")
                if bare_w is not None:  # the same DataLoader around the bare loop
                    out[f"{k}_vs_bare_loop_same_workers"] = round(v / bare_w, 2)
        return out

    # 5
    wire = bench_wire(tok)
    result = {
        "cpu_count": os.cpu_count(),
        "workload": f"0.7/0.3 docs, BPE {VOCAB}, split/pack {SEQ} (bins {BINS}), shuffle "
        f"{SHUFFLE}, batch {BATCH}; {LANES} lanes, chunks of {CHUNK}, flush every {K}",
        "real_tokenizer": {
            "ms_per_batch": {k: round(v, 2) for k, v in real.items()},
            "main_process_cpu_ms_per_batch": {k: round(v, 2) for k, v in real_cpu.items()},
            "shape": _rounded(real_shape),
            "ratios": ratios(real, real_shape),
        },
        "lookup_no_tokenizer": {
            "ms_per_batch": {k: round(v, 3) for k, v in lk.items()},
            "main_process_cpu_ms_per_batch": {k: round(v, 3) for k, v in lk_cpu.items()},
            "shape": _rounded(lk_shape),
            "ratios": ratios(lk, lk_shape),
        },
        "wire": wire,
        "restore": restore,
        "threads_main_process_iterate": restore.pop("threads"),
        "seconds_total": round(time.perf_counter() - t_start, 1),
        # other jobs on a shared machine take cores from the parallel variants
        "load_average_1min_start_end": [round(load_start, 2), round(os.getloadavg()[0], 2)],
    }
    _print_table(result)
    return result


def _rounded(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    return round(x, 4) if isinstance(x, float) else x


def _print_table(r: dict[str, Any]) -> None:
    def p(line: str) -> None:
        print(line, file=sys.stderr)

    p(f"== bench_throughput: {r['workload']}; cpu_count={r['cpu_count']}")
    for title, key in (("real tokenizer", "real_tokenizer"), ("lookup", "lookup_no_tokenizer")):
        sec = r[key]
        p(f"-- {title}: ms/batch (median), main-process CPU ms/batch | padding, documents/batch")
        for k, v in sec["ms_per_batch"].items():
            shape = sec["shape"]["bare_loop" if k.startswith("bare_loop") else "zephon"]
            cpu = sec["main_process_cpu_ms_per_batch"][k]
            p(
                f"   {k:26s} {v:9.3f} {cpu:9.3f}  |  {shape['padding_ratio']:.3f}, "
                f"{shape['documents_per_batch']:.2f}"
            )
        for k, v in sec["ratios"].items():
            p(f"   {k:52s} {v:6.2f}x")
    w = r["wire"]
    p(f"-- worker -> main per batch: a {w['wire_type']} and a LaneDelta, pickled")
    for k, v in w["wire_arrays"].items():
        p(f"   {k:18s} {v['dtype']:8s} {v['bytes']:8d} B")
    p(
        f"   pickled {w['pickled_bytes_per_batch_median']} B (arrays "
        f"{w['wire_array_bytes_median']} B + {w['non_array_bytes_median']} B), delta alone "
        f"{w['delta_bytes_median']} B (max {w['delta_bytes_max']} B); the consumer's "
        f"tensors: {w['consumer_tensor_bytes']} B"
    )
    for k, v in w["consumer_tensors"].items():
        p(f"   tensor {k:11s} {v['dtype']:12s} {v['bytes']:8d} B")
    p("-- first batch after a restore (cold_start: no state)")
    for k, v in r["restore"].items():
        p(
            f"   {k:10s} {v['first_batch_ms']:6.1f} ms {v['first_batch_ms_repeats']}, no pump "
            f"{v['first_batch_ms_no_pump']} ms; {v['documents_tokenized_to_first_batch']} "
            f"documents tokenized = {v['work_depth_batches']} batches' worth, ms / (steady x "
            f"that) {v['ratio_vs_steady_x_work_depth']}"
        )
        if "chunks_replayed_all_lanes" in v:
            p(
                f"              chunks replayed {v['chunks_replayed_all_lanes']} (first lane "
                f"{v['chunks_inflight_first_lane']}) = {v['replay_depth_batches_all_lanes']} "
                f"batches' worth; ms / (steady x that) {v['ratio_vs_steady_x_replay_depth']}"
            )
    for name, t in (
        ("main process, iterate()", r["threads_main_process_iterate"]),
        ("one DataLoader worker", w["worker_threads"]),
    ):
        p(
            f"-- threads, {name}: python {t['python_threads']}, OS {t['os_threads']} "
            f"({', '.join(t['names'])})"
        )
    load = r["load_average_1min_start_end"]
    p(f"-- total {r['seconds_total']} s; 1-min load average at start/end {load[0]}/{load[1]}")


if __name__ == "__main__":
    import json

    print(json.dumps(main(), indent=2))
