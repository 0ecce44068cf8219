"""Stress: short two-process HF Trainer launches that end through interpreter teardown.

A finished run must exit 0: a rank that aborts at exit (``terminate called without an
active exception``, SIGABRT) makes torchrun stop the others and exit 1, and a scheduler
then counts the finished run as failed. Each launch is torchrun with 2 ranks over gloo
running ``tests/integrations/hf_dist_worker.py`` (tiny GPT-2, ``ZephonCallback`` by
default, 8 steps, checkpoints every 3) with ``--teardown 1``: the ranks return from
``main()`` instead of ``os._exit``, as a user's script does.

    PYTHONPATH=. python benchmarks/stress_exit.py --launches 30
    PYTHONPATH=. python benchmarks/stress_exit.py --launches 30 --path trainer

Prints one line per launch and a JSON summary (launches, failures, aborts).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"
WORKER = TESTS / "integrations" / "hf_dist_worker.py"
ABORT = "terminate called without an active exception"


def launch(tmp: Path, i: int, args: argparse.Namespace) -> tuple[int, str, float]:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(WORKER),
        "--out",
        str(tmp / f"out{i}"),
        "--record",
        str(tmp / f"rec{i}"),
        "--max-steps",
        str(args.steps),
        "--path",
        args.path,
        "--dispatch",
        str(args.dispatch),
        "--workers",
        str(args.workers),
        "--teardown",
        "1",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    paths = [str(TESTS), str(TESTS / "integrations")]
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")])
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    return proc.returncode, proc.stdout + proc.stderr, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--launches", type=int, default=30)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--path", choices=["callback", "trainer"], default="callback")
    ap.add_argument("--dispatch", type=int, default=1)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--keep-logs", default="", help="directory for the logs of failed launches")
    args = ap.parse_args()
    failures = aborts = 0
    seconds = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for i in range(args.launches):
            code, log, s = launch(tmp, i, args)
            seconds.append(s)
            aborted = ABORT in log or "SIGABRT" in log or "Signals.SIGABRT" in log
            failures += code != 0
            aborts += aborted
            print(f"launch {i}: exit {code}{' ABORT' if aborted else ''} ({s:.1f} s)", flush=True)
            if code != 0 and args.keep_logs:
                Path(args.keep_logs).mkdir(parents=True, exist_ok=True)
                Path(args.keep_logs, f"launch{i}.log").write_text(log)
    summary = {
        "launches": args.launches,
        "path": args.path,
        "dispatch": args.dispatch,
        "workers": args.workers,
        "failures": failures,
        "aborts": aborts,
        "mean_s": round(sum(seconds) / len(seconds), 1),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
