"""A finished program exits 0, also when a run failed while its pump thread was inside
native code: interpreter teardown must not begin before that thread has left it (the
abort it otherwise causes is explained in ``exit_worker.py``).

One child process per way a run fails (Ctrl-C, a stall); each takes a few seconds. The
repeated version, and the two-process HF Trainer launches, are
``benchmarks/stress_exit.py``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import hang_guard_s, worker_env

# every test here starts processes (see tests/conftest.py)
pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("exit_worker.py")
ABORT = "terminate called without an active exception"


def test_a_run_that_failed_with_its_pump_in_native_code_exits_cleanly():
    procs = {
        how: subprocess.Popen(
            [sys.executable, str(WORKER), how],
            env=worker_env(OMP_NUM_THREADS="1"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for how in ("interrupt", "stall")
    }
    outcomes = {}
    for how, proc in procs.items():
        out, err = proc.communicate(timeout=hang_guard_s(600))
        outcomes[how] = (proc.returncode, out, err)
    expected = {"interrupt": "KeyboardInterrupt", "stall": "PipelineStalled"}
    for how, (code, out, err) in outcomes.items():
        assert f"failed as planned: {expected[how]}" in out, (how, out, err[-2000:])
        assert code == 0 and ABORT not in err, (
            f"{how}: the program exited with {code} after the run failed "
            f"(a thread was still inside native code at teardown?)\n{err[-3000:]}"
        )
