"""Child of ``tests/engine/test_exit.py`` and ``benchmarks/stress_exit.py``: a run fails
while its pump thread is inside a native call that released the GIL, then the program
ends the normal way, through interpreter teardown.

Why this aborts when the exit does not wait for the pump: CPython ends a thread that
takes the GIL back during teardown with ``pthread_exit``; from inside a C++ destructor
(pybind11's ``gil_scoped_release``, here around a torch matmul; a Parquet read, a
tokenizer call or a collective is the same), the unwinding calls ``std::terminate``:
"terminate called without an active exception", SIGABRT, and a finished job is
reported as failed.

    python exit_worker.py {interrupt|stall} [native_s]

Prints ``failed as planned: <error type>`` once the run failed as intended.
"""

from __future__ import annotations

import _thread
import os
import sys
import threading
import time

import torch
from helpers import byte_tokenize, hang_guard_s, source

from zephon_core import Pipeline


class NativeBlock:
    """A map whose first call once ``armed`` (the consumer has taken an output) spends
    ``native_s`` in native code with the GIL released (matmuls of ~0.1 s each), after
    sending Ctrl-C to the consumer when ``interrupt``."""

    def __init__(self, native_s: float, interrupt: bool):
        self.native_s, self.interrupt = native_s, interrupt
        self.armed = False
        self.thread: int | None = None  # the native id of the thread that blocked
        self.a = torch.randn(768, 768)

    def __call__(self, payload: dict) -> dict:
        if self.armed and self.thread is None:
            self.thread = threading.get_native_id()
            if self.interrupt:
                _thread.interrupt_main()
            end = time.monotonic() + self.native_s
            while time.monotonic() < end:
                torch.mm(self.a, self.a)
        return byte_tokenize(payload)


class UntilThreadEnds:
    """Freed when teardown clears this module: teardown then waits here until the blocked
    thread has ended, so a thread still inside the native call when teardown began is
    caught taking the GIL back (instead of vanishing with the process)."""

    def __init__(self, native_id: int | None):
        self.task = f"/proc/self/task/{native_id}" if native_id else None
        self.exists, self.monotonic, self.sleep = os.path.exists, time.monotonic, time.sleep

    def __del__(self) -> None:
        give_up = self.monotonic() + hang_guard_s(120)
        while self.task and self.exists(self.task) and self.monotonic() < give_up:
            self.sleep(0.01)


def main() -> UntilThreadEnds:
    how = sys.argv[1]
    native_s = float(sys.argv[2]) if len(sys.argv) > 2 else 3.0
    fn = NativeBlock(native_s, interrupt=how == "interrupt")
    stall = 0.5 if how == "stall" else None  # fires while the map blocks (native_s > it)
    pipe = (
        Pipeline(source(8), canonical_replicas=2, seed=3, prefetch=3, stall_timeout_s=stall)
        .fetch()
        .map(fn, name="native")
    )
    it = pipe.iterate()
    try:
        next(it)
        fn.armed = True
        while True:
            next(it)
    except BaseException as e:  # noqa: BLE001 - the planned failure
        print(f"failed as planned: {type(e).__name__}", flush=True)
    return UntilThreadEnds(fn.thread)


if __name__ == "__main__":
    finale = main()  # a module global: freed during teardown
