"""One line per restore: where from, where to, and how long to the first batch.

Why: a resumed run that silently started from the wrong checkpoint, or replays far more
than expected, is only noticed from the losses much later. The line names the
checkpoint's origin (a file, a trainer checkpoint, or "a state dict"), the global
position, this process's lanes, the inflight chunks they replay, and the time from the
restore to the first output -- the number that says recovery is bounded.

Example line::

    zephon: restored from checkpoints/last.ckpt at global position 1200: lanes [0, 1, 2,
    3], 11 inflight chunks to replay, first output after 84 ms

It goes to the ``zephon_core.restore`` logger at INFO, which a default Python logging
setup hides. A trainer integration shows it where its users look instead: inside
``restore_lines_to(show)`` (set around a ``fit``/``train``, in the thread that consumes
the batches) the line goes to ``show``, e.g. Lightning's or the HF Trainer's own logger
at the level they print by default; ``show`` returns False to leave it to
``zephon_core.restore`` (a rank that does not print).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from ..checkpoint.state import PipelineState

__all__ = ["RestoreLog", "restore_lines_to"]

log = logging.getLogger("zephon_core.restore")

# context-scoped (per thread), set only by restore_lines_to
_SHOW: ContextVar[Callable[[str], bool] | None] = ContextVar("zephon_restore_show", default=None)


@contextmanager
def restore_lines_to(show: Callable[[str], bool]) -> Iterator[None]:
    """Within the block, in this thread, a restore's line goes to ``show(line)``; a
    False result logs it to ``zephon_core.restore`` as outside the block."""
    token = _SHOW.set(show)
    try:
        yield
    finally:
        _SHOW.reset(token)


class RestoreLog:
    """Started when a handle restores; ``first_output()`` logs once."""

    def __init__(self, state: PipelineState | None, lanes: Iterable[int]):
        self._pending = state is not None
        if state is None:
            return
        lanes = sorted(set(lanes) & set(state.lanes))
        self._t0 = time.perf_counter()
        self._what = (
            f"zephon: restored from {state.origin or 'a state dict'} at global position "
            f"{state.position}: lanes {lanes}, "
            f"{sum(len(state.lanes[lane].chunks) for lane in lanes)} inflight chunks to replay"
        )

    def first_output(self) -> None:
        if self._pending:
            self._pending = False
            ms = 1000 * (time.perf_counter() - self._t0)
            line = f"{self._what}, first output after {ms:.0f} ms"
            show = _SHOW.get()
            if show is None or not show(line):
                log.info("%s", line)
