"""Soak: runner=processes under random layouts for a while (the hunt for rare hangs).

Runs the cases of ``tests/engine/test_processes_stress.py`` with fresh random draws until
the time budget is spent. A hang becomes ``PipelineStalled`` (``stall_timeout_s`` 30 s)
with every thread's stack in the log, and the case that produced it is printed so it
can be replayed. Usage: ``python benchmarks/soak_processes.py [minutes]``.
"""

from __future__ import annotations

import json
import logging
import random
import sys
import time
from pathlib import Path

sys.path[:0] = [
    str(Path(__file__).parents[1] / "tests"),
    str(Path(__file__).parents[1] / "tests" / "engine"),
]

from test_processes_stress import random_case, run_case  # noqa: E402


def main(minutes: float = 5.0, seed: int = 0) -> dict:
    logging.basicConfig(level=logging.ERROR)
    deadline = time.monotonic() + 60 * minutes
    rng = random.Random(seed)
    done, failures = 0, []
    while time.monotonic() < deadline:
        case = random_case(rng)
        try:
            run_case(case)
        except Exception as e:  # noqa: BLE001 - reported with the case that caused it
            failures.append({"case": case, "error": f"{type(e).__name__}: {e}"[:2000]})
            print(json.dumps(failures[-1]), flush=True)
        done += 1
    return {"cases": done, "failures": len(failures), "minutes": minutes}


if __name__ == "__main__":
    print(json.dumps(main(float(sys.argv[1]) if len(sys.argv) > 1 else 5.0)))
