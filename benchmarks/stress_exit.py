"""Stress: short launches that end through interpreter teardown must all exit 0.

A rank that aborts at exit ("terminate called without an active exception", SIGABRT)
makes torchrun stop the other ranks and exit 1: a scheduler counts the finished run as
failed. Two kinds of launch:

* ``--kind hf`` (default): torchrun with 2 ranks over gloo running
  ``tests/integrations/hf_dist_worker.py`` (tiny GPT-2, ``ZephonCallback`` by default,
  8 steps, checkpoints every 3) with ``--teardown 1``: the ranks return from ``main()``
  after ``train()`` instead of leaving with ``os._exit``, as a user's script does.
* ``--kind failed-run``: ``tests/engine/exit_worker.py``, one process whose run fails
  (Ctrl-C or a stall, alternately) while its pump thread is inside a native call; the
  minimal form of the abort (see that file for why it happens).

    PYTHONPATH=. python benchmarks/stress_exit.py --launches 30
    PYTHONPATH=. python benchmarks/stress_exit.py --launches 30 --kind failed-run

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
ABORT = "terminate called without an active exception"


def _env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    paths = [str(TESTS), str(TESTS / "integrations"), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return env


def hf_command(tmp: Path, i: int, args: argparse.Namespace) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(TESTS / "integrations" / "hf_dist_worker.py"),
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


def failed_run_command(tmp: Path, i: int, args: argparse.Namespace) -> list[str]:
    how = ("stall", "interrupt")[i % 2]
    return [sys.executable, str(TESTS / "engine" / "exit_worker.py"), how]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--launches", type=int, default=30)
    ap.add_argument("--kind", choices=["hf", "failed-run"], default="hf")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--path", choices=["callback", "trainer"], default="callback")
    ap.add_argument("--dispatch", type=int, default=1)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--keep-logs", default="", help="directory for the logs of failed launches")
    args = ap.parse_args()
    command = hf_command if args.kind == "hf" else failed_run_command
    failures = aborts = 0
    seconds = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for i in range(args.launches):
            t0 = time.perf_counter()
            proc = subprocess.run(
                command(tmp, i, args),
                env=_env(),
                capture_output=True,
                text=True,
                timeout=args.timeout,
            )
            seconds.append(time.perf_counter() - t0)
            log = proc.stdout + proc.stderr
            aborted = ABORT in log or "SIGABRT" in log or proc.returncode == -6
            failures += proc.returncode != 0
            aborts += aborted
            mark = " ABORT" if aborted else ""
            print(f"launch {i}: exit {proc.returncode}{mark} ({seconds[-1]:.1f} s)", flush=True)
            if proc.returncode != 0 and args.keep_logs:
                Path(args.keep_logs).mkdir(parents=True, exist_ok=True)
                Path(args.keep_logs, f"launch{i}.log").write_text(log)
    summary = {"launches": args.launches, "kind": args.kind}
    if args.kind == "hf":
        summary.update(path=args.path, dispatch=args.dispatch, workers=args.workers)
    summary.update(failures=failures, aborts=aborts, mean_s=round(sum(seconds) / len(seconds), 1))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
