"""Sharded Parquet in object storage (issue 13), side by side with Mosaic streaming.

Goals: an epoch fetches about what the projected column holds (<= 1.1x), memory stays
bounded by ``cache_bytes`` and flat over the epoch, a restore reads only the row groups of
its inflight chunks, and Zephon reads at least as many rows/s as Mosaic from the same
endpoint, with a shuffle at least as good.

One run against a moto S3 server started here on 127.0.0.1; the data is the embedded
corpus (prose + code) cut into rows, ``--scale`` copies, written as Parquet shards with
a projected ``text`` column and an unprojected ``meta`` column of the same size. Zephon
reads ``parquet_component(..., columns=["text"])`` through a ``StaticMixtureWorkSource``
(4 canonical lanes, one epoch, ``fetch(parallelism=4)``) with the storage options a user
passes (the component turns s3fs's read-ahead off itself); object-storage traffic is
counted by a proxy in front of the server (``zephon_core.testing.s3.FaultProxy``).

1. bytes fetched per epoch / compressed size of the ``text`` column chunks, with
   ``shuffle_block="row_group"`` (``cache_bytes`` 16 MB, and 64 MB) and with the
   row-level shuffle (5 % of an epoch, extrapolated: it reads a row group per row);
2. RSS of the reading process (a subprocess), ``cache_bytes`` 16 MB and 64 MB: after
   imports, after building the pipeline, after warm-up (10 %), peak, the Arrow pool at
   the end, first vs last quarter of the epoch (growth beyond the cache filling up
   would be a leak);
3. rows/s of one cold epoch, straight to the server: Zephon with ``fetch(parallelism=4)``
   (reads up to 4 chunks ahead on threads) and ``parallelism=1`` (no read-ahead: what
   the fetch stage's read-ahead buys), vs Mosaic ``StreamingDataset`` (py1e shuffle at
   Zephon's window size, the same rows as zstd MDS shards); each reader in its own
   process, best of 2 alternating rounds;
4. restore from checkpoints at 10/50/90 % of the epoch into a fresh component and
   pipeline: ms, GETs and bytes to the first record (the fresh component's footer reads
   counted apart), and whether only row groups of the inflight chunks were read;
5. shuffle quality of the stream order, no server: Zephon's block shuffle vs Mosaic's
   py1e at the same block size vs Zephon's row-level shuffle vs a uniform permutation.

Mosaic (``mosaicml-streaming==0.13.0``) pins numpy and transformers below this venv's,
so it may live in its own venv: ``MOSAIC_PYTHON=/path/to/python`` names its interpreter
(default: this one). Without an importable ``streaming`` its parts are skipped.

Run: ``python benchmarks/bench_parquet.py [--scale 8]`` (JSON on stdout, table on stderr)
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

BUCKET = "bench"
SHARDS, RG_ROWS = 8, 256  # Parquet shards, rows per row group
CHUNK, LANES, WINDOW, SEED = 64, 4, 4, 2026
CACHE_BYTES = 16 << 20
SPEED_ROUNDS = 5  # interleaved rounds (rounds.py); 2 with --quick
RESTORE_REPEATS = 3
MAX_CHARS = 2000  # documents cut at line boundaries into rows of at most this
CHECKPOINTS = (0.1, 0.5, 0.9)
ROW_LEVEL_FRACTION = 0.05  # the row-level shuffle reads this much of an epoch
MOSAIC_BATCH = 8
MOSAIC_WORKERS = 2  # DataLoader workers for Mosaic, as its docs use it; 2 cores here
HERE = Path(__file__).resolve()
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def log(*args: Any) -> None:
    print(*args, file=sys.stderr, flush=True)


# -- data -----------------------------------------------------------------------------------


def corpus_rows(scale: int) -> list[str]:
    """The embedded corpus cut into rows of <= MAX_CHARS, ``scale`` tagged copies."""
    from zephon_core.testing import corpora

    pieces = []
    for doc in (*corpora.prose(), *corpora.code()):
        piece, n = [], 0
        for line in doc["text"].splitlines(keepends=True):
            if piece and n + len(line) > MAX_CHARS:
                pieces.append("".join(piece))
                piece, n = [], 0
            piece.append(line)
            n += len(line)
        if piece:
            pieces.append("".join(piece))
    return [f"[copy {k}] {p}" for k in range(scale) for p in pieces]


def write_parquet(texts: list[str], out: Path) -> dict[str, Any]:
    """Shards with ``id``, ``text`` and ``meta`` (another row's text: as large and as
    compressible, so reading it would show); returns sizes read back from the footers."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = len(texts)
    per = -(-n // SHARDS)
    out.mkdir(parents=True)
    text_bytes = file_bytes = groups = 0
    for s in range(SHARDS):
        lo, hi = s * per, min(n, (s + 1) * per)
        table = pa.table(
            {
                "id": np.arange(lo, hi, dtype=np.int64),
                "text": texts[lo:hi],
                "meta": [texts[(i + n // 2) % n] for i in range(lo, hi)],
            }
        )
        path = out / f"part-{s:03d}.parquet"
        pq.write_table(table, path, row_group_size=RG_ROWS, compression="zstd")
        md = pq.ParquetFile(path).metadata
        col = md.schema.names.index("text")
        text_bytes += sum(
            md.row_group(g).column(col).total_compressed_size for g in range(md.num_row_groups)
        )
        groups += md.num_row_groups
        file_bytes += path.stat().st_size
    return {"rows": n, "row_groups": groups, "text_bytes": text_bytes, "file_bytes": file_bytes}


# -- Zephon ---------------------------------------------------------------------------------


def zephon_pipeline(comp: Any, block: str | None, prefetch: int = 3, parallelism: int = 4):
    from zephon_core import Pipeline, StaticMixtureWorkSource

    shuffle = {} if block is None else {"shuffle_block": block, "shuffle_window": WINDOW}
    src = StaticMixtureWorkSource(
        {"web": comp}, chunk_size=CHUNK, seed=SEED, num_epochs=1, **shuffle
    )
    return Pipeline(src, canonical_replicas=LANES, seed=SEED, prefetch=prefetch).fetch(parallelism)


def rss_mb(field: str = "VmRSS") -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def zephon_child(cfg: dict) -> None:
    """One epoch (or a ``fraction`` of it) in this fresh process; says ``built`` and waits for
    a line on stdin before reading, so the parent can count the index reads apart."""
    import pyarrow as pa

    from zephon_core.sources.parquet import parquet_component

    rss_imports = rss_mb()
    t0 = time.perf_counter()
    comp = parquet_component(
        cfg["url"],
        columns=["text"],
        storage_options=cfg["options"],
        cache_bytes=cfg.get("cache_bytes", CACHE_BYTES),
    )
    pipe = zephon_pipeline(comp, cfg["block"], parallelism=cfg.get("parallelism", 4))
    built_s = time.perf_counter() - t0
    n = len(comp)
    _emit({"event": "built", "rss_imports_mb": rss_imports, "rss_built_mb": rss_mb()})
    sys.stdin.readline()
    limit = int(n * cfg.get("fraction", 1.0))
    marks = {max(1, int(f * n)): f for f in cfg.get("checkpoints", ())}
    every = max(1, n // 200)
    samples, states, rows = [], [], 0
    t0 = time.perf_counter()
    with pipe.iterate() as it:
        for _ in it:
            rows += 1
            if rows % every == 0:
                samples.append([rows, rss_mb()])
            if rows in marks:
                states.append([marks[rows], it.checkpoint()])
            if rows >= limit:
                break
    seconds = time.perf_counter() - t0
    _emit(
        {
            "event": "done",
            "rows": rows,
            "of": n,
            "seconds": seconds,
            "built_s": built_s,
            "samples": samples,
            "rss_peak_mb": rss_mb("VmHWM"),
            "cache_bytes": comp.cache_bytes,
            "arrow_pool": [pa.default_memory_pool().backend_name, pa.total_allocated_bytes()],
            "io": comp.io_stats(),
            "states": states,
        }
    )


def _emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def run_zephon(cfg: dict, proxy: Any = None) -> dict:
    """``zephon_child`` in a subprocess; with ``proxy``, the index reads and the epoch's
    reads are counted apart (the counter is reset between the two)."""
    if proxy is not None:
        proxy.reset_counts()
    child = subprocess.Popen(
        [sys.executable, str(HERE), "--zephon-child", json.dumps(cfg)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    line = child.stdout.readline()
    if not line:
        raise RuntimeError(f"the Zephon child failed (exit {child.wait()})")
    built = json.loads(line)
    index = proxy.counts() if proxy is not None else None
    if proxy is not None:
        proxy.reset_counts()
    child.stdin.write("go\n")
    child.stdin.flush()
    line = child.stdout.readline()
    rc = child.wait()
    if not line:
        raise RuntimeError(f"the Zephon child failed (exit {rc})")
    done = json.loads(line)
    if rc != 0:  # seen once: SIGABRT at exit after a run stopped mid-epoch, reads in flight
        log(f"   (the Zephon child exited with {rc} after reporting its numbers)")
    out = {**built, **done, "index": index, "exit_code": rc}
    if proxy is not None:
        out["epoch"] = proxy.counts()
    return out


def rss_summary(run: dict, cache_mb: float) -> dict:
    rss = np.asarray([r for _, r in run["samples"]])
    q = max(1, len(rss) // 4)
    warm = rss[max(0, len(rss) // 10 - 1)]
    return {
        "rss_after_imports_mb": round(run["rss_imports_mb"], 1),
        "rss_built_mb": round(run["rss_built_mb"], 1),
        "rss_after_warmup_mb": round(float(warm), 1),
        "rss_peak_mb": round(run["rss_peak_mb"], 1),
        "peak_over_built_mb": round(run["rss_peak_mb"] - run["rss_built_mb"], 1),
        "cache_mb": cache_mb,
        "first_quarter_mean_mb": round(float(rss[:q].mean()), 1),
        "last_quarter_mean_mb": round(float(rss[-q:].mean()), 1),
        "slope_mb": round(float(rss[-q:].mean() - rss[:q].mean()), 1),
        "arrow_pool": run["arrow_pool"][0],
        "arrow_allocated_mb_at_end": round(run["arrow_pool"][1] / 2**20, 1),
    }


def restores(url: str, options: dict, proxy: Any, states: list) -> list[dict]:
    """Each checkpoint restored into a fresh component and pipeline (no pump, one fetch
    thread: what the first record costs, nothing read ahead); times are the median of
    RESTORE_REPEATS restores (the server shares this process)."""
    out = []
    for frac, state in states:
        runs = [_restore_once(url, options, proxy, state) for _ in range(RESTORE_REPEATS)]
        first = runs[0]
        for key in ("first_record_ms", "index_ms"):
            first[key] = round(float(np.median([x[key] for x in runs])), 1)
        out.append({"at": frac, **first})
    return out


def _restore_once(url: str, options: dict, proxy: Any, state: dict) -> dict:
    from zephon_core.sources.parquet import parquet_component

    proxy.reset_counts()
    t0 = time.perf_counter()
    comp = parquet_component(
        url, columns=["text"], storage_options=options, cache_bytes=CACHE_BYTES
    )
    index_ms = 1000 * (time.perf_counter() - t0)
    index = proxy.counts()
    proxy.reset_counts()
    t0 = time.perf_counter()
    pipe = zephon_pipeline(comp, "row_group", prefetch=0, parallelism=1)
    with pipe.iterate(restore=state) as it:
        next(it)
        ms = 1000 * (time.perf_counter() - t0)
        got = proxy.counts()
    bounds = np.asarray(comp.block_bounds())
    inflight = {
        int(g)
        for lane in state["lanes"]
        for chunk in lane["chunks"]
        for g in np.searchsorted(bounds, chunk[3], side="right") - 1
    }
    read = set(comp._cache)  # row groups read (the cache holds every one of them here)
    return {
        "first_record_ms": ms,
        "gets": got["gets"],
        "bytes": got["bytes_out"],
        "row_groups_read": comp.io_stats()["row_group_reads"],
        "read_within_inflight": read <= inflight,
        "inflight_chunks": sum(len(lane["chunks"]) for lane in state["lanes"]),
        "inflight_row_groups": len(inflight),
        "index_ms": index_ms,
        "index_gets": index["gets"],
        "index_bytes": index["bytes_out"],
    }


# -- Mosaic (possibly another interpreter) --------------------------------------------------


def mosaic_python() -> str:
    return os.environ.get("MOSAIC_PYTHON") or sys.executable


def _import_streaming():
    import types

    # streaming/__init__ imports its vision datasets, hence torchvision, whose PyPI wheel
    # is a CUDA build that does not load against torch+cpu; nothing here uses them
    sys.modules.setdefault("streaming.vision", types.ModuleType("streaming.vision"))
    import streaming

    return streaming


def mosaic_child(mode: str, cfg: dict) -> None:
    streaming = _import_streaming()
    if mode == "probe":
        _emit({"version": streaming.__version__})
    elif mode == "write":
        texts = json.loads(Path(cfg["texts"]).read_text())
        with streaming.MDSWriter(
            out=cfg["out"],
            columns={"text": "str"},
            compression="zstd",
            size_limit=cfg["size_limit"],
        ) as w:
            for t in texts:
                w.write({"text": t})
        _emit({"written": len(texts)})
    elif mode == "read":
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
        t0 = time.perf_counter()
        ds = _mosaic_dataset(streaming, cfg)
        built_s = time.perf_counter() - t0
        rows, chars = 0, 0
        t0 = time.perf_counter()
        if cfg.get("workers", 0):
            # Mosaic's docs pair StreamingDataset with a DataLoader of the same batch size
            # and several workers; each worker reads its share of the partition
            from torch.utils.data import DataLoader

            loader = DataLoader(ds, batch_size=MOSAIC_BATCH, num_workers=cfg["workers"])
            for batch in loader:
                rows += len(batch["text"])
                chars += sum(len(x) for x in batch["text"])
        else:
            for sample in ds:
                rows += 1
                chars += len(sample["text"])
        _emit(
            {
                "rows": rows,
                "chars": chars,
                "seconds": time.perf_counter() - t0,
                "built_s": built_s,
                "rss_peak_mb": rss_mb("VmHWM"),
            }
        )
    elif mode in ("exact-ref", "exact-resume"):
        _emit(_mosaic_exact(streaming, mode, cfg))
    elif mode == "shuffle":
        from streaming.base.partition import get_partitions
        from streaming.base.shuffle import get_shuffle

        sizes = np.asarray(cfg["shard_sizes"], dtype=np.int64)
        n = int(sizes.sum())
        shuffle = get_shuffle("py1e", sizes, cfg["nodes"], SEED, 0, cfg["block_size"])
        # the order one rank with one worker sees (what StreamingDataset does with them)
        ids = get_partitions("relaxed", n, cfg["nodes"], 1, 1, 1, MOSAIC_BATCH).flatten()
        order = shuffle[ids[ids >= 0]]
        np.save(cfg["out"], order)
        _emit({"rows": len(order)})


def _batch_digest(texts: list[str]) -> str:
    import hashlib

    return hashlib.sha256("\x00".join(texts).encode()).hexdigest()[:16]


def _mosaic_dataset(streaming: Any, cfg: dict) -> Any:
    """Mosaic's dataset as both the timed read and the exactness check build it."""
    return streaming.StreamingDataset(
        remote=cfg["remote"],
        local=cfg["local"],
        shuffle=True,
        shuffle_algo="py1e",
        shuffle_seed=SEED,
        shuffle_block_size=cfg["block_size"],
        num_canonical_nodes=LANES,
        batch_size=MOSAIC_BATCH,
    )


def _mosaic_exact(streaming: Any, mode: str, cfg: dict) -> dict:
    """Mosaic's documented resume: ``StreamingDataLoader.state_dict()`` after a cut,
    ``load_state_dict()`` on a fresh dataset and loader (in a fresh process)."""
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    ds = _mosaic_dataset(streaming, cfg)
    loader = streaming.StreamingDataLoader(
        ds, batch_size=MOSAIC_BATCH, num_workers=cfg["workers"]
    )
    if mode == "exact-resume":
        loader.load_state_dict(cfg["state"])
    digests, states = [], {}
    for i, batch in enumerate(itertools.islice(loader, cfg["n"]), 1):
        digests.append(_batch_digest(list(batch["text"])))
        if i in cfg.get("cuts", ()):
            states[i] = loader.state_dict()
    return {"digests": digests, "states": states}


def exact_mosaic(local: Path, endpoint: str, cuts: tuple[int, ...], n: int) -> str:
    """Cut, restore into a fresh process's dataset and loader, compare batch digests."""
    cfg = {
        "remote": f"s3://{BUCKET}/mds",
        "local": str(local),
        "block_size": WINDOW * RG_ROWS,
        "workers": MOSAIC_WORKERS,
    }
    env = {**CREDENTIALS, "S3_ENDPOINT_URL": endpoint}
    ref = run_mosaic("exact-ref", {**cfg, "n": n, "cuts": list(cuts)}, env)
    if ref is None:
        return "no: its resume failed (see the log)"
    for at, state in ref["states"].items():
        at = int(at)
        got = run_mosaic("exact-resume", {**cfg, "n": n - at, "state": state}, env)
        if got is None:
            return f"no: resuming at batch {at} failed (see the log)"
        for i, (x, y) in enumerate(zip(ref["digests"][at:], got["digests"])):
            if x != y:
                return f"no: batch {at + i} differs after a cut at {at}"
        if len(got["digests"]) != n - at:
            return f"no: {len(got['digests'])} batches after a cut at {at}, not {n - at}"
    return f"yes ({len(cuts)} cuts in {n} batches of {MOSAIC_BATCH})"


def exact_zephon(url: str, options: dict, cuts: tuple[int, ...], n: int) -> str:
    """The same check for Zephon: ``checkpoint()`` at each cut, restored into a freshly
    built component and pipeline, the records after the cut compared."""
    from zephon_core.sources.parquet import parquet_component

    def build():
        comp = parquet_component(url, columns=["text"], storage_options=options)
        return zephon_pipeline(comp, "row_group")

    rows = n * MOSAIC_BATCH
    marks = {c * MOSAIC_BATCH for c in cuts}
    reference, states = [], {}
    with build().iterate() as it:
        for i, rec in enumerate(itertools.islice(it, rows), 1):
            reference.append(json.dumps(rec, sort_keys=True, default=str))
            if i in marks:
                states[i] = it.checkpoint()
    for at, state in states.items():
        with build().iterate(restore=state) as it:
            got = [
                json.dumps(r, sort_keys=True, default=str)
                for r in itertools.islice(it, rows - at)
            ]
        if got != reference[at:]:
            first = next(i for i, (x, y) in enumerate(zip(reference[at:], got)) if x != y)
            return f"no: record {at + first} differs after a cut at {at}"
    return f"yes ({len(cuts)} cuts in {rows} records)"


def run_mosaic(mode: str, cfg: dict, env: dict | None = None) -> dict | None:
    proc = subprocess.run(
        [mosaic_python(), str(HERE), "--mosaic-child", mode, json.dumps(cfg)],
        capture_output=True,
        text=True,
        env=None if env is None else {**os.environ, **env},
    )
    if proc.returncode != 0:
        err = proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"]
        log(
            f"Mosaic {mode}: {err[-1]}"
            if mode == "probe"
            else f"Mosaic {mode} failed:\n{proc.stderr[-2000:]}"
        )
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- 5. shuffle quality ---------------------------------------------------------------------


def zephon_order(n: int, block: int | None, window: int = WINDOW) -> tuple[np.ndarray, list]:
    """The stream order of one epoch (lanes interleaved chunk by chunk, as the pipeline
    serves them) and each lane's own order."""
    from zephon_core import StaticMixtureWorkSource

    shuffle = {} if block is None else {"shuffle_block": block, "shuffle_window": window}
    src = StaticMixtureWorkSource(
        {"d": list(range(n))}, chunk_size=CHUNK, seed=SEED, num_epochs=1, **shuffle
    )
    lanes = [src.open_lane(lane, LANES, SEED) for lane in range(LANES)]
    per_lane: list[list[int]] = [[] for _ in lanes]
    order: list[int] = []
    while lanes:
        alive = []
        for lane in lanes:
            chunk = lane.next_chunk()
            if chunk is not None:
                order += chunk.rows
                per_lane[lane.lane] += chunk.rows
                alive.append(lane)
        lanes = alive
    return np.asarray(order, dtype=np.int64), per_lane


def order_quality(
    order: np.ndarray, shard_rows: int, block_rows: int, lanes: list | None = None
) -> dict:
    """Displacement quantiles, and how often neighbours share a shard: in the stream, and
    within each lane (default: every LANES-th item, as Mosaic interleaves its canonical
    nodes sample by sample); and within a lane, a block."""
    n = len(order)
    assert np.array_equal(np.sort(order), np.arange(n)), "not a permutation of the epoch"
    disp = np.abs(order - np.arange(n)) / n  # |stream position - source position| / N
    q10, q50, q90 = np.quantile(disp, [0.1, 0.5, 0.9])
    shard = order // shard_rows
    lanes = [order[k::LANES] for k in range(LANES)] if lanes is None else lanes
    lanes = [np.asarray(x) for x in lanes]
    same = [x[1:] // shard_rows == x[:-1] // shard_rows for x in lanes]
    same_block = [x[1:] // block_rows == x[:-1] // block_rows for x in lanes]
    return {
        "disp_q10": round(float(q10), 4),
        "disp_q50": round(float(q50), 4),
        "disp_q90": round(float(q90), 4),
        "same_shard_neighbours": round(float(np.mean(shard[1:] == shard[:-1])), 4),
        "same_shard_neighbours_in_lane": round(float(np.mean(np.concatenate(same))), 4),
        "same_block_neighbours_in_lane": round(float(np.mean(np.concatenate(same_block))), 4),
    }


def shuffle_quality(have_mosaic: bool, tmp: Path) -> dict:
    """Orders of one epoch of ``n`` rows in 16 shards. Mosaic's py1e mixes shards only
    when its block exceeds them, so it runs twice: over the same shards (each is then
    shuffled alone), and over MDS shards of Zephon's block size (what it downloads then
    is what Zephon reads: ``window`` of them are shuffled together)."""
    n, shards, block = 1 << 16, 16, 512  # 8 blocks per shard, windows of 4 blocks
    shard_rows = n // shards
    out: dict[str, Any] = {
        "rows": n,
        "shards": shards,
        "block_rows": block,
        "window_blocks": WINDOW,
        "lanes": LANES,
    }
    order, per_lane = zephon_order(n, block)
    z = order_quality(order, shard_rows, block, per_lane)
    blocks = n // block
    touched = [len({r // block for r in rows}) for rows in per_lane]
    lane_chunks = [[rows[i : i + CHUNK] for i in range(0, len(rows), CHUNK)] for rows in per_lane]
    per_chunk = sum(len({r // block for r in c}) for chunks in lane_chunks for c in chunks)
    z["blocks_per_lane"] = touched
    z["block_reads_per_epoch_over_blocks"] = round(sum(touched) / blocks, 3)
    z["without_cache_over_blocks"] = round(per_chunk / blocks, 2)
    out["zephon_block"] = z
    rows, rows_lanes = zephon_order(n, None)
    out["zephon_row_level"] = order_quality(rows, shard_rows, block, rows_lanes)
    rng = np.random.default_rng(SEED)
    out["uniform"] = order_quality(rng.permutation(n), shard_rows, block)
    if not have_mosaic:
        return out
    for name, mds_rows in (("mosaic_py1e", shard_rows), ("mosaic_py1e_block_shards", block)):
        path = tmp / f"{name}.npy"
        cfg = {
            "shard_sizes": [mds_rows] * (n // mds_rows),
            "nodes": LANES,
            "block_size": WINDOW * block,
            "out": str(path),
        }
        if run_mosaic("shuffle", cfg) is not None:
            out[name] = order_quality(np.load(path), shard_rows, block)
    return out


# -- the run --------------------------------------------------------------------------------


def main(quick: bool = False, scale: int = 8) -> dict:
    scale = 1 if quick else scale
    import s3fs

    from zephon_core.testing.s3 import FaultProxy, s3_server

    started = time.perf_counter()
    have_mosaic = run_mosaic("probe", {}) is not None
    if not have_mosaic:
        log(
            f"Mosaic streaming is not importable by {mosaic_python()} (install "
            "mosaicml-streaming==0.13.0, or set MOSAIC_PYTHON): its parts are skipped"
        )
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as d, s3_server(BUCKET) as (endpoint, options):
        tmp = Path(d)
        texts = corpus_rows(scale)
        data = write_parquet(texts, tmp / "parquet")
        fs = s3fs.S3FileSystem(**options)
        fs.put(str(tmp / "parquet") + "/", f"{BUCKET}/parquet/", recursive=True)
        result["data"] = data
        url = f"s3://{BUCKET}/parquet/*.parquet"
        proxy = FaultProxy(endpoint)

        def via_proxy(opts: dict) -> dict:
            ck = dict(opts["client_kwargs"], endpoint_url=proxy.url)
            return dict(opts, client_kwargs=ck, skip_instance_cache=True)

        try:
            # 1 + 2: bytes and memory of an epoch, checkpoints for 4
            runs = {}
            for name, block, extra in (
                ("row_group", "row_group", {"checkpoints": list(CHECKPOINTS)}),
                ("row_group_cache64", "row_group", {"cache_bytes": 64 << 20}),
                ("row_level", None, {"fraction": ROW_LEVEL_FRACTION}),
            ):
                log(f"zephon: {name} through the counting proxy ...")
                cfg = {"url": url, "options": via_proxy(options), "block": block, **extra}
                runs[name] = run_zephon(cfg, proxy)
            result["bytes_per_epoch"] = {
                "projected_text_bytes": data["text_bytes"],
                **{name: _bytes(run, data) for name, run in runs.items()},
            }
            # the row-level run reads 5 % of an epoch: its RSS would not compare
            result["memory"] = {
                name: rss_summary(run, run["cache_bytes"] / 2**20)
                for name, run in runs.items()
                if name.startswith("row_group")
            }
            log("zephon: restores ...")
            states = runs["row_group"]["states"]
            result["restore"] = restores(url, via_proxy(options), proxy, states)
        finally:
            proxy.close()
        # 3: every reader cold, straight to the server, in its own process; rounds in
        # alternating order, the best of each reader kept. parallelism=1 reads one chunk
        # at a time: against it, what the fetch stage's read-ahead on threads buys
        readers = {
            "zephon": lambda r: zephon_speed(url, options, parallelism=4),
            "zephon_parallelism_1": lambda r: zephon_speed(url, options, parallelism=1),
        }
        if have_mosaic and prepare_mosaic(texts, fs, tmp):
            readers["mosaic"] = lambda r: read_mosaic(tmp / f"mosaic-cache-{r}", endpoint)
            mds = [p for p in (tmp / "mds").iterdir() if p.name != "index.json"]
            data["mds_shards"] = len(mds)
            data["mds_bytes"] = sum(p.stat().st_size for p in mds)
        result["rows_per_s"] = speed_rounds(readers, 2 if quick else SPEED_ROUNDS)
        cuts, n = ((3, 10), 16) if quick else ((3, 20, 50), 64)
        result["exact"] = {"zephon": exact_zephon(url, options, cuts, n)}
        if "mosaic" in readers:
            result["exact"]["mosaic"] = exact_mosaic(tmp / "mosaic-cache-exact", endpoint, cuts, n)
        result["shuffle_quality"] = shuffle_quality(have_mosaic, tmp)
    result["seconds"] = round(time.perf_counter() - started, 1)
    report(result)
    return result


def _bytes(run: dict, data: dict) -> dict:
    frac = run["rows"] / run["of"]
    got = run["epoch"]["bytes_out"]
    out = {
        "fraction_of_epoch": round(frac, 3),
        "bytes": got,
        "gets": run["epoch"]["gets"],
        "over_projected": round(got / frac / data["text_bytes"], 3),
        "row_group_reads_over_row_groups": round(
            run["io"]["row_group_reads"] / frac / data["row_groups"], 2
        ),
        "index_bytes": run["index"]["bytes_out"],
        "index_gets": run["index"]["gets"],
        # what an epoch fetches in all: the footers read once to build the index, too
        "over_projected_with_index": round(
            (got / frac + run["index"]["bytes_out"]) / data["text_bytes"], 3
        ),
        "seconds": round(run["seconds"], 2),
    }
    if frac < 1:
        out["extrapolated_from_fraction"] = True
    return out


def speed_rounds(readers: dict[str, Callable[[int], dict | None]], n: int) -> dict[str, Any]:
    """Every reader once per round, the order rotating (``rounds.py``); ratios of rows/s
    taken within a round. A reader that fails (Mosaic missing) leaves the comparison."""
    import rounds

    counter = itertools.count()

    def variant(name: str) -> Callable[[], dict]:
        def sample() -> dict:
            got = readers[name](next(counter))
            if got is None:
                raise RuntimeError(f"{name} failed (see the log above)")
            runs[name].append(got)
            return {"seconds": got["epoch_s"], "rows": float(got["rows"])}

        return sample

    runs: dict[str, list[dict]] = {name: [] for name in readers}
    try:
        r = rounds.run({name: variant(name) for name in readers}, n)
    except RuntimeError as e:
        log(str(e))
        return {"failed": str(e)}
    out: dict[str, Any] = {"rounds": n, "load": r.load}
    for name in readers:
        last = runs[name][-1]
        out[name] = {
            "rows_per_s": r.rate(name, "rows").to_json(),
            "index_s": last["index_s"],
            "rss_peak_mb": max(x["rss_peak_mb"] for x in runs[name]),
        }
        for base in readers:
            if base != name:
                out[name][f"vs_{base}"] = r.ratio(name, base, "rows").to_json()
    return out


def zephon_speed(url: str, options: dict, parallelism: int) -> dict:
    cfg = {"url": url, "options": options, "block": "row_group", "parallelism": parallelism}
    run = run_zephon(cfg)
    return {
        "parallelism": parallelism,
        "rows_per_s": round(run["rows"] / run["seconds"], 1),
        "rows": run["rows"],
        "epoch_s": run["seconds"],
        "index_s": round(run["built_s"], 2),
        "rss_peak_mb": round(run["rss_peak_mb"], 1),
    }


def prepare_mosaic(texts: list[str], fs: Any, tmp: Path) -> bool:
    """MDS shards of the same ``text`` rows (zstd, as many shards as Parquet ones),
    uploaded next to the Parquet ones."""
    (tmp / "texts.json").write_text(json.dumps(texts))
    size_limit = sum(len(t.encode()) for t in texts) // SHARDS + (1 << 16)
    cfg = {"texts": str(tmp / "texts.json"), "out": str(tmp / "mds"), "size_limit": size_limit}
    if run_mosaic("write", cfg) is None:
        return False
    fs.put(str(tmp / "mds") + "/", f"{BUCKET}/mds/", recursive=True)
    return True


def read_mosaic(local: Path, endpoint: str, workers: int = MOSAIC_WORKERS) -> dict | None:
    """One epoch from a cold local cache, py1e at Zephon's window size in rows, through a
    DataLoader with ``workers`` workers (0: iterated in one process)."""
    cfg = {
        "remote": f"s3://{BUCKET}/mds",
        "local": str(local),
        "block_size": WINDOW * RG_ROWS,
        "workers": workers,
    }
    got = run_mosaic("read", cfg, {**CREDENTIALS, "S3_ENDPOINT_URL": endpoint})
    if got is None:
        return None
    return {
        "rows_per_s": round(got["rows"] / got["seconds"], 1),
        "epoch_s": got["seconds"],
        "index_s": round(got["built_s"], 2),
        "rss_peak_mb": round(got["rss_peak_mb"], 1),
        "rows": got["rows"],  # its partition pads to whole batches per canonical node
    }


def report(r: dict) -> None:
    d = r["data"]
    log(
        f"\nParquet: {d['rows']} rows, {SHARDS} shards, {d['row_groups']} row groups of "
        f"{RG_ROWS} rows, {d['file_bytes'] / 2**20:.1f} MB, text column "
        f"{d['text_bytes'] / 2**20:.1f} MB (zstd). Zephon: {LANES} lanes, chunks of {CHUNK}, "
        f"fetch(parallelism=4), cache_bytes {CACHE_BYTES >> 20} MB"
        + (
            f"; MDS: {d['mds_shards']} shards, {d['mds_bytes'] / 2**20:.1f} MB"
            if "mds_bytes" in d
            else ""
        )
    )
    b = r["bytes_per_epoch"]
    log("\n1. bytes per epoch / projected text column (goal <= 1.1)")
    for name, x in b.items():
        if name == "projected_text_bytes":
            continue
        frac = x["fraction_of_epoch"]
        note = f"  (from {frac:.0%} of an epoch)" if frac < 1 else ""
        log(
            f"   {name:20s} {x['over_projected']:8.3f}x  {x['gets']:5d} GETs  "
            f"row-group reads / row groups {x['row_group_reads_over_row_groups']:6.2f}{note}"
        )
    x = b["row_group"]
    log(f"   index (footers, apart): {x['index_gets']} GETs, {x['index_bytes'] / 2**20:.2f} MB")
    log(f"   row_group with the index reads: {x['over_projected_with_index']:.3f}x")
    log(
        f"\n2. RSS (MB) {'':9s} imports  built warm-up    peak  -built  cache  arrow  "
        "quarters 1st -> last"
    )
    for name, m in r["memory"].items():
        log(
            f"   {name:20s} {m['rss_after_imports_mb']:6.1f} {m['rss_built_mb']:6.1f} "
            f"{m['rss_after_warmup_mb']:7.1f} {m['rss_peak_mb']:7.1f} "
            f"{m['peak_over_built_mb']:7.1f} {m['cache_mb']:6.0f} "
            f"{m['arrow_allocated_mb_at_end']:6.1f}  {m['first_quarter_mean_mb']:.1f} -> "
            f"{m['last_quarter_mean_mb']:.1f} ({m['slope_mb']:+.1f})"
        )
    s = r["rows_per_s"]
    log("\n3. rows/s, one cold epoch, straight to the server, interleaved rounds")
    labels = {
        "zephon": "fetch(parallelism=4): reads up to 4 chunks ahead on threads",
        "zephon_parallelism_1": "fetch(parallelism=1): no read-ahead",
        "mosaic": f"StreamingDataset, py1e, DataLoader(num_workers={MOSAIC_WORKERS})",
    }
    if "failed" in s:
        log(f"   {s['failed']}")
    for name, label in labels.items():
        if name in s:
            x = s[name]
            ratios = ", ".join(
                f"{k} {v['median']:.2f} ({v['min']:.2f}-{v['max']:.2f})"
                for k, v in x.items()
                if k.startswith("vs_")
            )
            log(f"   {name:20s} {label}")
            log(
                f"   {'':20s} {x['rows_per_s']['median']:9.1f} rows/s (median of "
                f"{s['rounds']}); {ratios}; peak RSS {x['rss_peak_mb']:.0f} MB"
            )
    if "mosaic" not in s:
        log("   Mosaic skipped")
    log("\n4. restore -> first record (fresh component, one fetch thread; its index apart)")
    for x in r["restore"]:
        log(
            f"   at {x['at']:3.0%}: {x['first_record_ms']:6.1f} ms, {x['gets']:3d} GETs, "
            f"{x['bytes'] / 2**20:.2f} MB, {x['row_groups_read']} row groups read (inflight: "
            f"{x['inflight_chunks']} chunks in {x['inflight_row_groups']} row groups; only "
            f"those read: {x['read_within_inflight']}); index {x['index_gets']} GETs "
            f"{x['index_bytes'] / 2**20:.2f} MB {x['index_ms']:.0f} ms"
        )
    q = r["shuffle_quality"]
    log(
        f"\n5. shuffle quality: {q['rows']} rows, {q['shards']} shards, blocks of "
        f"{q['block_rows']} rows, windows of {q['window_blocks']} blocks, {q['lanes']} lanes"
    )
    log(
        f"   {'':24s} |pos - src|/N q10 / q50 / q90   neighbours in the same shard: stream, "
        "lane; same block: lane"
    )
    names = ("zephon_block", "mosaic_py1e", "mosaic_py1e_block_shards", "zephon_row_level")
    for name in (*names, "uniform"):
        if name in q:
            x = q[name]
            log(
                f"   {name:24s} {x['disp_q10']:.3f} / {x['disp_q50']:.3f} / {x['disp_q90']:.3f}"
                f"{x['same_shard_neighbours']:21.3f} {x['same_shard_neighbours_in_lane']:6.3f}"
                f"{x['same_block_neighbours_in_lane']:17.3f}"
            )
    z = q["zephon_block"]
    log(
        f"   Zephon blocks per lane {z['blocks_per_lane']}; block reads per epoch / blocks "
        f"{z['block_reads_per_epoch_over_blocks']} (without a cache "
        f"{z['without_cache_over_blocks']})"
    )
    log(f"\ntotal {r['seconds']} s")


_NOTE = (
    "Against a local moto S3 server; see the module docstring for each figure's method."
)


def _spread(x: dict, unit: str = "") -> str:
    import rounds

    return rounds.cell(x, 2, unit)


def _speed_table(s: dict, exact: dict) -> dict:
    names = [n for n in ("zephon", "zephon_parallelism_1", "mosaic") if n in s]
    label = {
        "zephon": "Zephon fetch(parallelism=4)",
        "zephon_parallelism_1": "Zephon fetch(parallelism=1)",
        "mosaic": f"Mosaic StreamingDataset, DataLoader(num_workers={MOSAIC_WORKERS})",
    }
    cols = [
        "reader",
        "rows/s",
        *(f"vs {label[b]}" for b in names),
        "peak RSS MB",
        "exact resume (cut, restore, compare)",
    ]
    rows = []
    for n in names:
        x = s[n]
        ratios = [_spread(x[f"vs_{b}"], "x") if b != n else "1x" for b in names]
        ok = exact.get(n.removesuffix("_parallelism_1"), "not measured")
        rows.append([label[n], _spread(x["rows_per_s"]), *ratios, f"{x['rss_peak_mb']:.0f}", ok])
    loads = [v for pair in s["load"] for v in pair]
    return {
        "title": "Parquet over S3: rows/s of one cold epoch",
        "columns": cols,
        "rows": rows,
        "note": (
            f"Each reader in its own process, straight to the local S3 server; {s['rounds']} "
            "interleaved rounds, ratios within a round, median (min-max). Mosaic goes "
            "through a DataLoader with workers as its docs use it (2 here, the machine's "
            "cores). Exactness: Zephon checkpoint() / Mosaic StreamingDataLoader.state_dict() "
            "at several batches of 8 rows, restored into a freshly built reader (Mosaic: in a "
            "fresh process), the rows after the cut compared with an uninterrupted run. "
            f"Load average (1 min): {min(loads):.2f}-{max(loads):.2f}."
            + (
                ""
                if "mosaic" in s
                else " Mosaic not measured: `streaming` (mosaicml-streaming 0.13.0) is not "
                "importable by MOSAIC_PYTHON (`make bench` builds .venv-mosaic for it)."
            )
        ),
    }


def _bytes_table(b: dict) -> dict:
    rows = [
        [
            name,
            f"{x['over_projected']:.3f}x",
            f"{x['over_projected_with_index']:.3f}x",
            f"{x['index_bytes'] / 2**20:.2f} MB in {x['index_gets']} GETs",
            f"{x['gets']:,}",
            f"{x['fraction_of_epoch']:.0%}",
        ]
        for name, x in b.items()
        if name != "projected_text_bytes"
    ]
    return {
        "title": "Parquet over S3: bytes per epoch over the projected text column",
        "columns": [
            "shuffle",
            "data reads / column",
            "with the index (footer) reads",
            "index reads",
            "GETs",
            "of an epoch read",
        ],
        "rows": rows,
        "note": (
            f"Projected text column: {b['projected_text_bytes'] / 2**20:.2f} MB (zstd). "
            "The index reads are the Parquet footers read once per process to build the "
            "index; a part-epoch run is extrapolated to a whole epoch."
        ),
    }


def tables(result: dict) -> list[dict]:
    """The speed and bytes tables, then the rest of the result as it is."""
    from report import flat_tables

    out = [_bytes_table(result["bytes_per_epoch"])]
    speed = result["rows_per_s"]
    if "failed" not in speed:
        out.append(_speed_table(speed, result.get("exact", {})))
    skip = ("bytes_per_epoch", "rows_per_s", "exact")
    rest = {k: v for k, v in result.items() if k not in skip}
    if "failed" in speed:
        rest["rows_per_s"] = speed
    return out + flat_tables(rest, _NOTE)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--zephon-child":
        zephon_child(json.loads(sys.argv[2]))
    elif len(sys.argv) > 3 and sys.argv[1] == "--mosaic-child":
        mosaic_child(sys.argv[2], json.loads(sys.argv[3]))
    else:
        ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
        ap.add_argument("--scale", type=int, default=8, help="copies of the corpus")
        args = ap.parse_args()
        print(json.dumps(main(scale=args.scale), indent=2))
