"""The pump thread: runs lanes' streams ahead of the consumer into bounded queues.

The pump never blocks on a full queue -- it simply does not start work for a
lane whose queue holds ``prefetch`` outputs -- so it cannot deadlock against
a consumer that waits on another lane. The consumer wakes it when a queue has run
down to half (an empty queue is always below that). Among lanes with room it advances the
one with the fewest queued outputs, nearest to the consumer's next turn.
What the pump has done never changes what a checkpoint means: every output
carries the lane state as of its own delivery.
"""

from __future__ import annotations

import atexit
import threading
import weakref
from collections import deque
from collections.abc import Callable
from time import monotonic

from ..errors import LifecycleError
from .lane_stream import END_OF_LANE, LaneStream, Output
from .watchdog import stalled

BACKSTOP = 1.5  # the consumer's wait, in multiples of stall_timeout_s
EXIT_JOIN_S = 5.0  # at interpreter exit, how long to wait for each pump to stop

_live: weakref.WeakSet[Pump] = weakref.WeakSet()


@atexit.register
def stop_live_pumps() -> None:
    """Stop pumps a program left running when it exits (no ``close()``, no ``with``).

    Why: the pump is a daemon thread; left running, it may be inside native code (a
    Parquet read, a tokenizer) while the interpreter tears down, which can abort the
    process ("terminate called without an active exception"). Stopped and joined here,
    it finishes the step it is on and exits first. A pump stays registered until its
    thread has ended, also when an earlier ``close()`` gave up waiting for it."""
    for pump in list(_live):
        pump.close(EXIT_JOIN_S)


class Pump:
    def __init__(
        self,
        streams: dict[int, LaneStream],
        order: list[int],
        prefetch: int,
        next_turn: Callable[[], int],
        stall_timeout_s: float | None = None,
    ):
        self._streams = streams
        self._order = order
        self._prefetch = max(1, prefetch)
        # the consumer wakes the pump only when a queue runs this low: the pump then
        # refills several outputs per wake-up instead of switching threads per output
        self._low = (self._prefetch - 1) // 2
        self._next_turn = next_turn
        self._timeout = stall_timeout_s
        self._queues: dict[int, deque[Output]] = {lane: deque() for lane in order}
        self._done: dict[int, bool] = {lane: False for lane in order}
        self._cond = threading.Condition()
        self._stop = False
        self._error: BaseException | None = None
        self._working: int | None = None  # the lane the pump thread is advancing
        self._thread = threading.Thread(target=self._run, name="zephon-pump", daemon=True)

    def start(self) -> None:
        """Start the thread. Separate from construction so that the owner holds the pump
        before its thread runs: a Ctrl-C landing in between leaves no thread unknown."""
        _live.add(self)  # before the thread exists: the exit hook must always know it
        self._thread.start()

    def _pick(self) -> int | None:
        order, n = self._order, len(self._order)
        start = self._next_turn()
        best, best_q = None, self._prefetch
        for i in range(n):
            lane = order[(start + i) % n]
            if self._done[lane]:
                continue
            q = len(self._queues[lane])
            if q < best_q:
                best, best_q = lane, q
        return best

    def _run(self) -> None:
        cond = self._cond
        try:
            while True:
                with cond:
                    lane = None
                    while not self._stop:
                        lane = self._pick()
                        if lane is not None:
                            break
                        cond.wait()
                    if self._stop:
                        return
                    self._working = lane
                out = next(self._streams[lane].outputs)
                with cond:
                    self._working = None
                    self._queues[lane].append(out)
                    if out.payload is END_OF_LANE:
                        self._done[lane] = True
                    cond.notify_all()
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            with cond:
                self._error = e
                cond.notify_all()

    def take(self, lane: int) -> Output:
        cond = self._cond
        timeout = self._timeout
        # a backstop: the lane's own checks (watchdog.py) name the culprit more precisely
        # and fire first, at 1x; this catches what they cannot see
        deadline = None if timeout is None else monotonic() + BACKSTOP * timeout
        with cond:
            q = self._queues[lane]
            while not q:
                if self._error is not None:
                    raise self._error
                if self._stop:
                    raise LifecycleError(
                        f"the pipeline run was closed while waiting for lane {lane}'s next output"
                    )
                left = None if deadline is None else deadline - monotonic()
                if left is not None and left <= 0:
                    raise self._stalled(lane, timeout)
                cond.wait(left)
            out = q.popleft()
            if len(q) <= self._low:
                cond.notify_all()
            return out

    def _stalled(self, lane: int, timeout: float) -> BaseException:
        working = self._working
        if working is None:
            what = "the pump thread is idle (its queues are full)"
            activity = ""
        else:
            stream = self._streams[working]
            what = f"the pump thread is advancing lane {working}"
            activity = ": " + stream.activity.describe(working)
        return stalled(
            f"the consumer waited {BACKSTOP * timeout:g} s for lane {lane}'s next "
            f"output; {what}{activity}",
            timeout,
        )

    def queued(self) -> dict[int, int]:
        return {lane: len(q) for lane, q in self._queues.items()}

    def close(self, timeout: float = 5.0) -> bool:
        """Stop the thread and wait up to ``timeout`` for it to end (idempotent: a later
        call waits again). Returns whether it ended."""
        with self._cond:
            self._stop = True
            # the error's traceback holds the consumer's frames, and so the handle: kept
            # here, it would keep a failed iterator (and its finalizer) from being collected
            self._error = None
            self._cond.notify_all()
        started = self._thread.ident is not None
        if started and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        if self._thread.is_alive():
            return False  # still inside a step: the exit hook waits for it again
        _live.discard(self)
        return True
