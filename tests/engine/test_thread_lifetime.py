"""Threads of a failed or interrupted run end at ``close()``, at garbage collection and
at interpreter exit: repeated stalls and Ctrl-C never pile threads up.

The stalls here are made of a map that blocks until the test releases it; the small
``stall_timeout_s`` is the feature under test (it fires however slow the machine is),
not synchronisation.
"""

from __future__ import annotations

import _thread
import threading

import pytest
from helpers import byte_tokenize, source

from zephon_core import Pipeline, PipelineStalled
from zephon_core.engine import pump as pump_module

ROUNDS = 6  # each stall costs STALL_S plus the failure's short join
STALL_S = 0.3


class Blocker:
    """A map that blocks (as on a throttled read) until released."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def __call__(self, payload: dict) -> dict:
        self.release.wait(60)
        return byte_tokenize(payload)


class Interrupt:
    """A map whose first call delivers Ctrl-C to the main thread (the consumer)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sent = False

    def __call__(self, payload: dict) -> dict:
        with self.lock:
            send, self.sent = not self.sent, True
        if send:
            _thread.interrupt_main()
        return byte_tokenize(payload)


def _pipe(fn, parallelism: int, stall_timeout_s: float | None = None) -> Pipeline:
    return (
        Pipeline(
            source(8), canonical_replicas=2, seed=3, prefetch=3, stall_timeout_s=stall_timeout_s
        )
        .fetch()
        .map(fn, parallelism=parallelism, name="fetch_remote")
    )


def _run_threads(it) -> list[threading.Thread]:
    run = it.run
    threads = list(getattr(run.pool, "_threads", ()))
    if run.pump is not None:
        threads.append(run.pump._thread)
    return threads


def _zephon_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("zephon-")]


def test_repeated_stalls_join_every_thread_at_close():
    before = len(threading.enumerate())
    for i in range(ROUNDS):
        blocker = Blocker()
        it = _pipe(blocker, parallelism=2, stall_timeout_s=STALL_S).iterate()
        with pytest.raises(PipelineStalled):
            next(it)
        threads = _run_threads(it)
        blocker.release.set()  # the blocked read returns (the storm ends)
        it.close()
        alive = [t.name for t in threads if t.is_alive()]
        assert not alive, f"round {i}: close() returned with the run's threads alive: {alive}"
    assert len(threading.enumerate()) <= before, [t.name for t in threading.enumerate()]


def test_repeated_interrupts_join_every_thread_at_close():
    before = len(threading.enumerate())
    for i in range(ROUNDS):
        it = _pipe(Interrupt(), parallelism=2).iterate()
        with pytest.raises(KeyboardInterrupt):
            for _ in range(1000):
                next(it)
        threads = _run_threads(it)
        it.close()
        alive = [t.name for t in threads if t.is_alive()]
        assert not alive, f"round {i}: close() returned with the run's threads alive: {alive}"
    assert len(threading.enumerate()) <= before, [t.name for t in threading.enumerate()]


def test_a_dropped_failed_iterator_joins_its_threads_when_collected():
    import gc

    blocker = Blocker()
    it = _pipe(blocker, parallelism=2, stall_timeout_s=STALL_S).iterate()
    with pytest.raises(PipelineStalled):
        next(it)
    threads = _run_threads(it)
    blocker.release.set()
    del it
    gc.collect()
    alive = [t.name for t in threads if t.is_alive()]
    assert not alive, f"a collected failed iterator left threads alive: {alive}"


def test_a_pump_blocked_at_failure_is_still_joined_by_the_exit_hook():
    """The pump thread itself is inside the blocked map when the consumer gives up: the
    failure's short close() cannot join it, so the exit hook must still know it."""
    blocker = Blocker()
    it = _pipe(blocker, parallelism=1, stall_timeout_s=STALL_S).iterate()
    with pytest.raises(PipelineStalled):
        next(it)
    pump = it.run.pump
    assert pump._thread.is_alive(), "the pump should still be inside the blocked map"
    assert pump in pump_module._live, "a pump that did not end must stay registered for exit"
    blocker.release.set()
    pump_module.stop_live_pumps()  # what atexit runs
    assert not pump._thread.is_alive() and pump not in pump_module._live
    it.close()
    assert not [t for t in _zephon_threads() if t in _run_threads(it) and t.is_alive()]
