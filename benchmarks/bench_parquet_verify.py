"""What verified Parquet reads cost (issue 19): page checksums and row-group digests.

The corpus and shards of ``bench_parquet.py`` (zstd, a projected ``text`` column and an
unprojected ``meta`` column), read from local files and from a moto S3 server on
127.0.0.1. Each measurement runs in its own process (the server's CPU is not counted),
rounds alternate between the variants, and the best round of each is kept:

1. the index build: ``verify="reads"`` (footers only) vs ``verify="index"`` (footers and a
   CRC-32 of every projected column chunk, i.e. the projected bytes read once);
2. every row group once, in order, one thread (the reader's own cost): ``unchecked``
   (what the reader did before: Arrow decodes straight from the file, no checksums),
   ``first read`` (``verify="reads"``: page checksums verified, digest recorded),
   ``re-read`` (the same component again: digest compared), ``index`` (digests from
   the index compared at the first read);
3. one cold epoch through a pipeline (``shuffle_block="row_group"``, 4 lanes,
   ``fetch(parallelism=4)``): unchecked vs verified.

CPU seconds are the reading process's (``time.process_time``); on a shared machine they
are steadier than the wall time, which is reported too. A child that aborts at exit
after reporting ("terminate called without an active exception": seen when Arrow's pool
threads had read through a Python file object in a process that imported torch) is
counted in ``aborted_exits``; the verified reads decode on the calling thread.

Run: ``python benchmarks/bench_parquet_verify.py [--scale 8] [--rounds 3]``
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))

from bench_parquet import corpus_rows, log, write_parquet, zephon_pipeline  # noqa: E402

BUCKET = "verify"
CACHE_BYTES = 16 << 20


def _unchecked(comp: Any) -> Any:
    """``comp`` reading as before the checks: Arrow decodes straight from the file."""
    import pyarrow.parquet as pq

    def read(g: int) -> Any:
        s, rg = comp._where[g]
        with comp._filesystem().open(comp.shards[s].path, "rb", cache_type="none") as fh:
            md, _ = comp._meta.get(s, lambda: pq.ParquetFile(fh).metadata)
            return pq.ParquetFile(fh, metadata=md).read_row_group(rg, columns=comp.columns)

    comp._read_checked = read
    return comp


def child(cfg: dict) -> None:
    from zephon_core.sources.loading_lru import LoadingLRU
    from zephon_core.sources.parquet import parquet_component

    verify = "index" if cfg["variant"] == "index" else "reads"

    def build() -> Any:
        return parquet_component(
            cfg["url"],
            columns=["text"],
            storage_options=cfg["options"],
            cache_bytes=CACHE_BYTES,
            verify=verify,
        )

    c0, t0 = time.process_time(), time.perf_counter()
    comp = build()
    out: dict[str, Any] = {"build_cpu": time.process_time() - c0}
    out["build_wall"] = time.perf_counter() - t0
    if cfg["variant"] == "unchecked":
        _unchecked(comp)

    def every_row_group() -> tuple[float, float, int]:
        comp._cache = LoadingLRU(1, lambda t: t.nbytes)  # nothing kept: every group read
        c0, t0 = time.process_time(), time.perf_counter()
        rows = sum(comp._row_group(g).num_rows for g in range(len(comp._where)))
        return time.process_time() - c0, time.perf_counter() - t0, rows

    if cfg["part"] == "groups":
        out["cpu"], out["wall"], out["rows"] = every_row_group()
        if cfg["variant"] == "reads":  # the same component again: digests compared
            out["reread_cpu"], out["reread_wall"], _ = every_row_group()
    else:  # a cold epoch through the pipeline, on a fresh component
        pipe = zephon_pipeline(comp, "row_group", parallelism=4)
        c0, t0, rows = time.process_time(), time.perf_counter(), 0
        with pipe.iterate() as it:
            for _ in it:
                rows += 1
        out["cpu"], out["wall"], out["rows"] = (
            time.process_time() - c0,
            time.perf_counter() - t0,
            rows,
        )
        out["io"] = comp.io_stats()
    print(json.dumps(out), flush=True)


def run_child(cfg: dict) -> dict:
    proc = subprocess.run(
        [sys.executable, str(HERE), "--child", json.dumps(cfg)],
        capture_output=True,
        text=True,
        check=False,
    )
    lines = proc.stdout.strip().splitlines()
    if not lines:
        raise RuntimeError(f"child {cfg['variant']} failed:\n{proc.stderr[-3000:]}")
    if proc.returncode != 0:  # its numbers are out; an abort at exit is counted apart
        log(f"   (child {cfg['variant']} {cfg['part']} exited with {proc.returncode})")
    return {**json.loads(lines[-1]), "exit_code": proc.returncode}


def measure(url: str, options: dict, rounds: int) -> dict:
    best: dict[str, dict[str, float]] = {}

    def keep(key: str, got: dict) -> None:
        old = best.setdefault(key, {})
        for k, v in got.items():
            if k == "exit_code":
                old["aborted_exits"] = old.get("aborted_exits", 0) + (v != 0)
            elif isinstance(v, (int, float)) and not k.startswith("rows"):
                old[k] = min(old.get(k, float("inf")), v)
            else:
                old[k] = v

    for r in range(rounds):
        log(f"  round {r + 1}/{rounds}")
        for variant in ("unchecked", "reads", "index"):
            cfg = {"url": url, "options": options, "variant": variant}
            keep(f"groups_{variant}", run_child({**cfg, "part": "groups"}))
        for variant in ("unchecked", "reads"):
            cfg = {"url": url, "options": options, "variant": variant}
            keep(f"epoch_{variant}", run_child({**cfg, "part": "epoch"}))
    return best


def summary(best: dict, data: dict) -> dict:
    g = {k[len("groups_") :]: v for k, v in best.items() if k.startswith("groups_")}
    e = {k[len("epoch_") :]: v for k, v in best.items() if k.startswith("epoch_")}
    rows = data["rows"]

    def per_s(seconds: float) -> int:
        return round(rows / seconds)

    return {
        "index_build_s": {
            "footers_only": round(g["reads"]["build_wall"], 3),
            "with_digests": round(g["index"]["build_wall"], 3),
        },
        "row_groups_once_cpu_s": {
            "unchecked": round(g["unchecked"]["cpu"], 3),
            "first_read_verified": round(g["reads"]["cpu"], 3),
            "re_read_digest_compared": round(g["reads"]["reread_cpu"], 3),
            "index_digest_compared": round(g["index"]["cpu"], 3),
        },
        "row_groups_once_rows_per_s_wall": {
            "unchecked": per_s(g["unchecked"]["wall"]),
            "first_read_verified": per_s(g["reads"]["wall"]),
            "re_read_digest_compared": per_s(g["reads"]["reread_wall"]),
            "index_digest_compared": per_s(g["index"]["wall"]),
        },
        # children that aborted at exit after reporting (SIGABRT: see the module docstring)
        "aborted_exits": {k: v.get("aborted_exits", 0) for k, v in best.items()},
        "cold_epoch": {
            "unchecked_rows_per_s": per_s(e["unchecked"]["wall"]),
            "verified_rows_per_s": per_s(e["reads"]["wall"]),
            "unchecked_cpu_s": round(e["unchecked"]["cpu"], 3),
            "verified_cpu_s": round(e["reads"]["cpu"], 3),
        },
    }


def main(scale: int = 8, rounds: int = 3) -> dict:
    import s3fs

    from zephon_core.testing.s3 import s3_server

    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as d, s3_server(BUCKET) as (_, options):
        local = Path(d) / "parquet"
        data = write_parquet(corpus_rows(scale), local)
        s3fs.S3FileSystem(**options).put(str(local) + "/", f"{BUCKET}/parquet/", recursive=True)
        result["data"] = data
        for where, url, opts in (
            ("local", str(local), {}),
            ("s3", f"s3://{BUCKET}/parquet/*.parquet", options),
        ):
            log(f"{where}:")
            result[where] = summary(measure(url, opts, rounds), data)
    log(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(json.loads(sys.argv[2]))
    else:
        ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
        ap.add_argument("--scale", type=int, default=8)
        ap.add_argument("--rounds", type=int, default=3)
        args = ap.parse_args()
        print(json.dumps(main(args.scale, args.rounds), indent=2))
