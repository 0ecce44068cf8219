"""The stall watchdog: no output for ``stall_timeout_s`` is an error, never a hang.
(``docs/design.md`` §5)

Three places watch the clock, each where the waiting happens:

* a lane that keeps pulling chunks without producing an output (an operator drops or
  holds everything) -- ``LaneStream`` checks before each new chunk;
* a microbatch that does not come back from a threads/processes stage (a map blocked
  in I/O) -- the stage waits with a timeout;
* a consumer that waits for the pump thread (which is stuck in one of the above or in
  an inline operator) -- ``Pump.take`` waits with a timeout, a backstop at 1.5x so the
  two checks above, which name the culprit more precisely, fire first.

Each raises :class:`~zephon_core.errors.PipelineStalled` naming the stage, the lane and
the cursor, and logs every thread's stack (a stall is a bug somewhere; the stacks say
where). One case cannot be interrupted: with ``prefetch=0`` an inline operator that
blocks holds the consumer's own thread.
"""

from __future__ import annotations

import logging
import sys
import threading
import traceback
from dataclasses import dataclass
from time import perf_counter
from typing import Any

from ..errors import PipelineStalled

log = logging.getLogger(__name__)


@dataclass
class Activity:
    """What a lane is doing right now (written by whichever thread works on it)."""

    where: str = "the source"
    cursor: Any = None
    since: float = 0.0

    def set(self, where: str, cursor: Any) -> None:
        self.where, self.cursor, self.since = where, cursor, perf_counter()

    def describe(self, lane: int) -> str:
        at = f" at cursor {tuple(self.cursor)}" if self.cursor is not None else ""
        return f"lane {lane} has been in {self.where}{at} for {perf_counter() - self.since:.1f} s"


def thread_stacks() -> str:
    """Every thread's stack, for the log of a stall."""
    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        parts.append(
            f"--- thread {names.get(ident, ident)} ---\n" + "".join(traceback.format_stack(frame))
        )
    return "\n".join(parts)


def stalled(
    message: str, timeout_s: float, *, operator: str | None = None, cursor: Any = None
) -> PipelineStalled:
    """The error for a stall (and one log record with every thread's stack)."""
    log.error("zephon: pipeline stalled: %s\n%s", message, thread_stacks())
    return PipelineStalled(
        f"no progress for stall_timeout_s={timeout_s:g}: {message}. Every thread's stack was "
        "logged (logger zephon_core.engine.watchdog). Raise Pipeline(stall_timeout_s=...) if "
        "this step is just slow, or None to disable the watchdog.",
        operator=operator,
        cursor=cursor,
    )
