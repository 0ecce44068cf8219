"""A Parquet corpus in S3, trained on with Lightning, interrupted and resumed exactly.

``build_pipeline`` is the part to copy: two ``parquet_component`` s over ``s3://`` shards
(only the ``text`` column is read, by row group), mixed 70/30 by tokens, shuffled by row
group (``shuffle_block="row_group"``: each row group is read about once per epoch),
tokenized, packed and batched, served by ``ZephonDataModule`` with 2 DataLoader workers.

Without ``--endpoint`` the script starts an S3-compatible server on 127.0.0.1 (moto's)
and uploads the embedded corpus (Python's docs as prose, its standard library as code)
as Parquet shards first, so it runs anywhere. With ``--endpoint URL`` (and the usual
``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``) it reads ``--prose`` and ``--code``
globs from your own server.

Run A trains 2N steps; run B trains N steps and stops; run C is a new Trainer and a new
DataModule resuming B's ``last.ckpt``. The batches and losses of C equal A's, bit for bit.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import tempfile
import time
import warnings
from pathlib import Path

from embedded import BatchTokenizer, train_tokenizer
from lightning_resume import BATCH, SEQ_LEN, fit

from zephon_core import Pipeline, StaticMixtureWorkSource
from zephon_core.sources.parquet import parquet_component
from zephon_core.testing import corpora


def build_pipeline(prose: str, code: str, storage_options: dict, tokenizer: Path) -> Pipeline:
    """The pipeline of the example: what a pre-training job over S3 Parquet looks like."""

    def shards(url: str):
        return parquet_component(
            url, columns=["text"], storage_options=storage_options, cache_bytes=64 << 20
        )

    source = StaticMixtureWorkSource(
        {"prose": shards(prose), "code": shards(code)},
        {"prose": 0.7, "code": 0.3},
        weights_unit="tokens",  # lengths: estimated by the pipeline with its tokenizer
        shuffle_block="row_group",
        chunk_size=16,
        seed=2026,
    )
    return (
        Pipeline(source, canonical_replicas=4, flush_every_k_chunks=2, seed=2026)
        .fetch(parallelism=2)
        .map(BatchTokenizer(tokenizer), parallelism=2, name="tokenize", batched=True)
        .split(max_len=SEQ_LEN)
        .pack(seq_len=SEQ_LEN, bins=8)
        .shuffle(buffer_size=64)
        .batch(batch_size=BATCH)
    )


def upload_corpus(endpoint_options: dict, bucket: str) -> tuple[str, str]:
    """The embedded corpus as Parquet shards (row groups of 32 documents) in ``bucket``."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import s3fs

    fs = s3fs.S3FileSystem(**endpoint_options)
    for name, docs in (("prose", corpora.prose()), ("code", corpora.code())):
        texts = [d["text"] for d in docs]
        per = -(-len(texts) // 4)
        for s in range(4):
            table = pa.table({"text": texts[s * per : (s + 1) * per], "id": [
                d["id"] for d in docs[s * per : (s + 1) * per]
            ]})  # fmt: skip
            with fs.open(f"{bucket}/{name}/part-{s:03d}.parquet", "wb") as fh:
                pq.write_table(table, fh, row_group_size=32)
    return f"s3://{bucket}/prose/*.parquet", f"s3://{bucket}/code/*.parquet"


@contextlib.contextmanager
def corpus(args: argparse.Namespace):
    """``(prose glob, code glob, storage options)``: the user's server, or a local one."""
    if args.endpoint:
        yield args.prose, args.code, {"client_kwargs": {"endpoint_url": args.endpoint}}
        return
    from zephon_core.testing.s3 import s3_server

    with s3_server("corpus") as (endpoint, options):
        print(f"started an S3-compatible server (moto) at {endpoint}; uploading shards ...")
        prose, code = upload_corpus(options, "corpus")
        yield prose, code, options


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40, help="N: stop at N, resume to 2N")
    ap.add_argument("--endpoint", help="your S3 endpoint (default: start a local one)")
    ap.add_argument("--prose", default="s3://corpus/prose/*.parquet")
    ap.add_argument("--code", default="s3://corpus/code/*.parquet")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    print(__doc__.strip().splitlines()[0], "\n")
    n = args.steps
    with tempfile.TemporaryDirectory() as d, corpus(args) as (prose, code, options):
        d = Path(d)
        tok = d / "tokenizer.json"
        train_tokenizer(tok)

        def pipeline():
            return build_pipeline(prose, code, options, tok)

        print(pipeline().explain(), "\n")
        t0 = time.perf_counter()
        full, _ = fit(tok, 2 * n, d / "A", pipeline=pipeline)
        print(f"run A: {2 * n} steps uninterrupted in {time.perf_counter() - t0:.0f}s")
        fit(tok, n, d / "B", pipeline=pipeline)
        print(f"run B: stopped at step {n}")
        resumed, dm = fit(tok, 2 * n, d / "C", resume=str(d / "B" / "last.ckpt"), pipeline=pipeline)
        print(f"run C: new Trainer + new ZephonDataModule, resumed at step {n}")
        io = dm.final_metrics
    tail, again = full.record[n:], resumed.record
    same = len(tail) == len(again) and all(
        a[1] == b[1] and a[2] == b[2] for a, b in zip(tail, again)
    )
    for (s, fa, la), (_, fb, lb) in list(zip(tail, again))[:2] + list(zip(tail, again))[-2:]:
        same_batch = "==" if fa == fb else "!="
        print(f"  step {s:3d}: batch {fa} {same_batch} {fb}   loss {la:.4f} vs {lb:.4f}")
    reads = {k: v for k, v in io.items() if k.startswith("zephon/io/")}
    if reads:
        print("reads of run C (summed over its workers):", reads)
    if not same:
        for (s, fa, la), (_, fb, lb) in zip(tail, again):
            if fa != fb or la != lb:
                print(f"  step {s:3d} differs: batch {fa} vs {fb}   loss {la!r} vs {lb!r}")
        if len(tail) != len(again):
            print(f"  run A has {len(tail)} steps after {n}, run C has {len(again)}")
        raise SystemExit("\nSTREAMS DIFFER after the resume")
    print(f"\nidentical: the {len(tail)} batches and losses after the resume match, bit for bit.")


if __name__ == "__main__":
    main()
