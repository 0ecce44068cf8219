"""``make demo`` (``examples/lightning_resume.py``) run as ``make`` runs it, stdout into a
pipe: its step lines arrive while it trains (not when a buffer fills or it ends), and a
SIGTERM stops it inside the running step, with one line naming where, exit status
128 + 15 and no traceback."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
STEP = re.compile(r"run A: step (\d+)/200000, loss [\d.]+, [\d.]+ steps/s")


@pytest.mark.slow
def test_the_demo_shows_its_steps_and_stops_inside_the_step_on_sigterm(tmp_path):
    cmd = [sys.executable, "lightning_resume.py", "--steps", "100000", "--log-every", "1"]
    with open(tmp_path / "stderr", "w") as err:
        proc = subprocess.Popen(
            [*cmd, "--out", str(tmp_path)],
            cwd=EXAMPLES,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    guard = threading.Timer(900, proc.kill)  # a hang guard only: progress decides below
    guard.start()
    try:
        seen: list[int] = []
        for line in proc.stdout:  # as the demo prints them (it has 199,998 steps to go)
            if m := STEP.fullmatch(line.strip()):
                seen.append(int(m[1]))
                if len(seen) == 2:
                    break
        proc.send_signal(signal.SIGTERM)
        rest = proc.stdout.read()
        proc.wait()
    finally:
        guard.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr = (tmp_path / "stderr").read_text()
    assert seen == [1, 2], stderr[-3000:]
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr[-3000:]
    stop = re.search(r"stopped by SIGTERM during run A, after step (\d+) of 200000\n", stderr)
    assert stop, stderr[-3000:]
    # no step ran to its end after the signal arrived (Lightning alone would finish the
    # running step, and exit with status 0)
    after = [int(m[1]) for m in map(STEP.fullmatch, rest.splitlines()) if m]
    assert all(step <= int(stop[1]) for step in after), (after, stop[0])
