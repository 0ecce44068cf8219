"""What a demo shows while it runs, and how it stops.

* stdout and stderr are line-buffered: a pipe, ``make`` or a CI log sees each line when
  it is printed (Python block-buffers them when they are not a terminal, so a demo
  that ran for minutes looked silent until it ended);
* ``step(...)`` prints a progress line every ``every`` training steps (and at the first
  and the last) and remembers where the demo is;
* SIGTERM and SIGINT stop the demo at once, inside the step that is running: the
  handler raises :class:`Stopped` (a ``BaseException``, so no library's
  ``except Exception`` swallows it; Lightning runs its exception hooks and tears the
  fit down, closing the loaders, on the way out); ``stoppable()`` turns it into one line
  on stderr, "stopped by SIGTERM during run A, after step 12 of 300", and exit status
  128 + the signal number, with no traceback, once the block has unwound. A second
  signal exits at once.
  Processes forked from the demo (DataLoader workers) inherit the handler and ignore
  the signal: Ctrl-C reaches the whole process group, and a worker that raised or died
  would print its own traceback; the demo's process shuts them down on its way out.
  (torch's workers still die on a SIGTERM sent by anyone but their parent, so the
  handler also stops torch's SIGCHLD handler from raising about each of them.)
* ``interruptible(fn)`` runs a long call into native code (training the tokenizer) in a
  thread, so that the main thread, waiting for it, handles a signal at once.

Lightning's own SIGTERM handling only stops at the end of the running step and exits
with status 0, as if the demo had finished; the handler here is chained after it
(Lightning keeps a handler that was installed before ``fit``).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = ["Stopped", "at", "interruptible", "step", "stoppable"]

_where = "the setup"
_stopping = False
_main_pid = -1  # the process that called stoppable()


class Stopped(BaseException):
    """Raised in the main thread by SIGTERM or SIGINT."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def at(where: str) -> None:
    """Where the demo is now (named if a signal stops it)."""
    global _where
    _where = where


def step(
    run: str, done: int, total: int, loss: float, rate: float, first: bool, every: int
) -> None:
    """After training step ``done`` (1-based) of ``total`` of run ``run``: remember it,
    and print a line at the run's first step, every ``every`` steps and at the last."""
    at(f"run {run}, after step {done} of {total}")
    if first or done % every == 0 or done == total:
        print(f"run {run}: step {done}/{total}, loss {loss:.4f}, {rate:.1f} steps/s")


def _ignore(signum: int, frame: object) -> None:
    pass


def _on_signal(signum: int, frame: object) -> None:
    global _stopping
    if os.getpid() != _main_pid:  # a forked worker: its parent stops it
        return
    if _stopping:  # a second signal while shutting down: no more waiting
        os._exit(128 + signum)
    _stopping = True
    # a no-op, not SIG_DFL: a SIGCHLD already pending would then raise OSError
    signal.signal(signal.SIGCHLD, _ignore)
    raise Stopped(signum)


def interruptible(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, run in a daemon thread while this one waits (a signal handler runs
    in the main thread only, between bytecodes: not during one long native call)."""
    out: list[Any] = []

    def call() -> None:
        try:
            out.append((True, fn(*args)))
        except BaseException as e:  # handed to the waiting thread
            out.append((False, e))

    worker = threading.Thread(target=call, name=getattr(fn, "__name__", "call"), daemon=True)
    worker.start()
    worker.join()  # a signal interrupts the wait on POSIX
    ok, value = out[0]
    if not ok:
        raise value
    return value


@contextmanager
def stoppable() -> Iterator[None]:
    """Line-buffered output, and SIGTERM/SIGINT stop the block with one line on stderr
    and exit status 128 + signal number."""
    global _main_pid
    _main_pid = os.getpid()
    sys.stdout.reconfigure(line_buffering=True)
    sys.stderr.reconfigure(line_buffering=True)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _on_signal)
    try:
        yield
    except Stopped as e:
        print(f"\nstopped by {e} during {_where}", file=sys.stderr)
        sys.stdout.flush()
        # the block has unwound (its finally clauses and context managers ran: loaders
        # closed, temporary files removed); a normal interpreter exit would wait for
        # a native call still running in an interruptible() thread
        os._exit(128 + e.signum)
