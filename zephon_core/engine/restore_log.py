"""One INFO line per restore: where from, where to, and how long to the first batch.

Why: a resumed run that silently started from the wrong checkpoint, or replays far more
than expected, is only noticed from the losses much later. The line names the
checkpoint's origin (a file, a trainer checkpoint, or "a state dict"), the global
position, this process's lanes, the inflight chunks they replay, and the time from the
restore to the first output -- the number that says recovery is bounded.

Example line::

    zephon: restored from checkpoints/last.ckpt at global position 1200: lanes [0, 1, 2,
    3], 11 inflight chunks to replay, first output after 84 ms
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from ..checkpoint.state import PipelineState

log = logging.getLogger("zephon_core.restore")


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
            log.info("%s, first output after %.0f ms", self._what, ms)
