"""The row-group cache: bounded by bytes, and a miss is loaded once however many threads
ask for it at the same moment."""

from __future__ import annotations

import threading

import pytest
from helpers import hang_guard_s

from zephon_core.sources.loading_lru import LoadingLRU


def test_bytes_bound_keeps_the_newest():
    cache = LoadingLRU(capacity=10, size_of=len)
    for key in "abc":
        cache.get(key, lambda key=key: key * 4)
    assert len(cache) == 2  # 12 bytes > 10: "a" went first
    assert cache.get("a", lambda: "new")[1] is False
    cache.get("huge", lambda: "x" * 50)
    assert len(cache) == 1  # alone over capacity, but the newest stays


def test_concurrent_misses_load_once():
    n = 8
    loads: list[int] = []
    release = threading.Event()
    ready = threading.Barrier(n + 1)
    results: list[tuple] = []

    def load():
        loads.append(1)
        release.wait(timeout=hang_guard_s(120))  # a hang guard: released at once
        return "table"

    def worker():
        ready.wait()
        results.append(cache.get("g", load))

    cache = LoadingLRU(capacity=100, size_of=len)
    threads = [threading.Thread(target=worker) for _ in range(n)]
    for t in threads:
        t.start()
    ready.wait()  # every thread is about to ask
    release.set()
    for t in threads:
        t.join(timeout=hang_guard_s(120))  # a hang guard
    assert len(loads) == 1 and len(results) == n
    assert sorted(hit for _, hit in results) == [False] + [True] * (n - 1)


def test_a_failed_load_is_retried_by_the_next_caller():
    cache = LoadingLRU(capacity=100, size_of=len)

    def boom():
        raise OSError("reset")

    with pytest.raises(OSError):
        cache.get("g", boom)
    assert cache.get("g", lambda: "ok") == ("ok", False)
