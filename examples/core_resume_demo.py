"""Core demo: interrupt a pipeline at batch 137 and resume it bit-exactly in a fresh process.

Data: the embedded mixture (pydoc_data.topics prose 0.7 / stdlib source 0.3).
Tokenizer: a small byte-level BPE trained on the spot with `tokenizers`.
Pipeline: fetch -> tokenize -> split -> pack(512) -> shuffle -> ensure_mixture -> batch(8).

It runs 300 batches uninterrupted, then the same job in two fresh processes
(the first stops at batch 137 and saves a checkpoint, the second restores it
and continues), and compares the two streams batch by batch.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from embedded import build_pipeline, train_tokenizer

from zephon_core import Pipeline

SEQ_LEN, BATCH, TOTAL, CUT = 512, 8, 300, 137


def build(tokenizer_path: Path) -> Pipeline:
    return build_pipeline(tokenizer_path, seq_len=SEQ_LEN, batch_size=BATCH)


def fingerprint(batch: dict) -> str:
    h = hashlib.sha256()
    for k in sorted(batch):
        h.update(k.encode())
        h.update(batch[k].numpy().tobytes())
    return h.hexdigest()[:16]


def run_phase(args: argparse.Namespace) -> None:
    """Runs inside a fresh process: 'head' stops at CUT and saves, 'tail' restores."""
    pipe = build(Path(args.tokenizer))  # a description; iterating returns a handle
    out: dict = {}
    if args.phase == "head":
        with pipe.iterate() as it:
            out["fingerprints"] = [fingerprint(next(it)) for _ in range(CUT)]
            out["checkpoint_bytes"] = it.save(args.checkpoint)
    else:
        t0 = time.perf_counter()
        with pipe.iterate(restore=Pipeline.load(args.checkpoint)) as it:
            first = next(it)
            out["restore_to_first_batch_s"] = time.perf_counter() - t0
            out["chunks_replayed"] = it.chunks_replayed
            out["fingerprints"] = [fingerprint(first)] + [
                fingerprint(next(it)) for _ in range(TOTAL - CUT - 1)
            ]
    Path(args.result).write_text(json.dumps(out))


def main() -> None:
    print(__doc__.strip().splitlines()[0], "\n")
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        tok_path, ckpt = d / "tokenizer.json", d / "zephon_state.msgpack.zst"
        t0 = time.perf_counter()
        train_tokenizer(tok_path)
        print(f"trained a BPE tokenizer (2048 tokens) in {time.perf_counter() - t0:.1f}s")
        pipe = build(tok_path)
        print("\nPipeline.explain():\n" + pipe.explain() + "\n")
        t0 = time.perf_counter()
        with pipe.iterate() as it:
            reference = [fingerprint(next(it)) for _ in range(TOTAL)]
            elapsed = time.perf_counter() - t0
            stats = it.stats()
        print(
            f"uninterrupted run: {TOTAL} batches of {BATCH}x{SEQ_LEN} in {elapsed:.2f}s "
            f"({TOTAL / elapsed:.0f} batches/s), padding {stats['padding_ratio']:.1%}, "
            "token share "
            + ", ".join(
                f"{k} {m['token_share']:.1%} (target {m['token_share_target']:.0%})"
                for k, m in stats["mixture"].items()
            )
        )
        results = {}
        for phase in ("head", "tail"):
            res = d / f"{phase}.json"
            subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--phase",
                    phase,
                    "--tokenizer",
                    str(tok_path),
                    "--checkpoint",
                    str(ckpt),
                    "--result",
                    str(res),
                ],
                check=True,
            )
            results[phase] = json.loads(res.read_text())
        resumed = results["head"]["fingerprints"] + results["tail"]["fingerprints"]
        print(
            f"interrupted run: process 1 stopped after batch {CUT} and saved "
            f"{results['head']['checkpoint_bytes']} bytes; process 2 restored it, replayed "
            f"{results['tail']['chunks_replayed']} inflight chunks and had its first batch "
            f"after {results['tail']['restore_to_first_batch_s'] * 1000:.0f} ms"
        )
        diverged = [i for i, (a, b) in enumerate(zip(reference, resumed)) if a != b]
        for i in (CUT - 2, CUT - 1, CUT, CUT + 1):
            mark = "==" if reference[i] == resumed[i] else "!="
            print(f"  batch {i + 1:3d}: uninterrupted {reference[i]} {mark} resumed {resumed[i]}")
        if diverged or len(resumed) != len(reference):
            first = diverged[0] + 1 if diverged else len(resumed) + 1
            print(f"\nSTREAMS DIFFER: first divergence at batch {first}")
            sys.exit(1)
        print(f"\nidentical: all {TOTAL} batches match bit for bit across the interruption.")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--phase", choices=["head", "tail"])
    ap.add_argument("--tokenizer")
    ap.add_argument("--checkpoint")
    ap.add_argument("--result")
    a = ap.parse_args()
    run_phase(a) if a.phase else main()
