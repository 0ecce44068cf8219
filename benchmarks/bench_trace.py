"""What ``zephon trace`` costs: the time to trace a step 10 and 10^4 batches past the
checkpoint (the replay is what users wait for), through the command itself (click's
runner in this process: restore, replay, describe, JSON).

Workloads (``--workload``):

* ``bpe``: the real-tokenizer pipeline of ``bpe_workload.py`` (byte-level BPE vocab
  8192, split/pack 2048, shuffle 64, batch 8, 8 lanes);
* ``bytes``: ``common.bar_pipeline`` (byte tokens, pack 512, batch 8), the framework's
  own cost with a trivial tokenizer.

``--workers W`` replays behind W DataLoader workers (``zephon trace --workers``).

The checkpoint is a state file at position ``--at`` (default 100). Each distance is
traced ``--rounds`` times (median, min-max); the replay rate is set against the same
pipeline's plain ``iterate()`` rate over as many batches (provenance off), so the
difference is the trace's own work (provenance, describing the rows, reading the
documents for snippets).

    python benchmarks/bench_trace.py --workload bytes
    python benchmarks/bench_trace.py --workload bpe --far 10000
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bpe_workload import BpeTokenize, train_tokenizer, zephon_pipeline  # noqa: E402
from click.testing import CliRunner  # noqa: E402
from common import bar_pipeline  # noqa: E402

from zephon_core.cli.commands import cli  # noqa: E402


@functools.cache
def _spec() -> str:
    return train_tokenizer()


def bpe():
    """The real-tokenizer workload (a factory for ``zephon trace bench_trace:bpe``)."""
    return zephon_pipeline(BpeTokenize(_spec()))


def bytes_pipeline():
    """Byte tokens (a factory for ``zephon trace bench_trace:bytes_pipeline``)."""
    return bar_pipeline(lanes=8)


FACTORIES = {"bpe": "bpe", "bytes": "bytes_pipeline"}


def _checkpoint(build, at: int, path: Path) -> None:
    with build().iterate() as it:
        for _ in itertools.islice(it, at):
            pass
        state = it.checkpoint()
    from zephon_core.checkpoint import codec

    path.write_bytes(codec.encode(state))


def _plain_rate(build, n: int) -> float:
    """Batches/s of ``iterate()`` (no provenance) over ``n`` batches after 5 warm-up."""
    with build().iterate() as it:
        for _ in itertools.islice(it, 5):
            pass
        t0 = time.perf_counter()
        for _ in itertools.islice(it, n):
            pass
        return n / (time.perf_counter() - t0)


def _trace(state: Path, factory: str, step: int, workers: int) -> tuple[float, dict]:
    old = os.getcwd()
    os.chdir(HERE)
    try:
        t0 = time.perf_counter()
        args = ["trace", str(state), factory, "--step", str(step), "--workers", str(workers)]
        r = CliRunner().invoke(cli, [*args, "--json"])
        wall = time.perf_counter() - t0
    finally:
        os.chdir(old)
    if r.exit_code != 0:
        raise SystemExit(f"trace failed: {r.output} {r.exception!r}")
    return wall, json.loads(r.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", choices=sorted(FACTORIES), default="bytes")
    ap.add_argument("--at", type=int, default=100, help="the checkpoint's position")
    ap.add_argument("--near", type=int, default=10)
    ap.add_argument("--far", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=0, help="zephon trace --workers")
    args = ap.parse_args()
    name = FACTORIES[args.workload]
    build = globals()[name]
    factory = f"bench_trace:{name}"
    with tempfile.TemporaryDirectory() as d:
        state = Path(d) / "state.zst"
        _checkpoint(build, args.at, state)
        print(
            f"workload {args.workload}: checkpoint at position {args.at}, "
            f"{args.workers} DataLoader workers"
        )
        for distance in (args.near, args.far):
            walls, replays = [], []
            for _ in range(args.rounds if distance == args.near else max(1, args.rounds - 2)):
                wall, doc = _trace(state, factory, args.at + distance, args.workers)
                walls.append(wall)
                replays.append(doc["seconds"])
            rows = sum(len(o["rows"]) for s in doc["steps"] for o in s["outputs"])
            print(
                f"  step {distance:>6} past the checkpoint: {statistics.median(walls):7.2f} s "
                f"(min {min(walls):.2f}, max {max(walls):.2f}; replay "
                f"{statistics.median(replays):.2f} s = "
                f"{(distance + 1) / statistics.median(replays):.0f} batches/s; {rows} rows)"
            )
        n = min(args.far, 2000)
        print(f"  plain iterate(), no provenance: {_plain_rate(build, n):.0f} batches/s ({n})")


if __name__ == "__main__":
    main()
