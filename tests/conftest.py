"""Suite-wide rule: a test that starts a process is marked ``@pytest.mark.slow``.

``make test-fast`` runs ``-m "not slow"`` as the inner loop; it stays fast only if every
test that starts a process (a subprocess, torchrun, a multiprocessing or DataLoader
worker, a Lightning ``ddp_spawn`` child) carries the marker. Process starts are counted
here during each test's setup, call and teardown, and an unmarked test that started one
fails with a message saying so.
"""

from __future__ import annotations

import _posixsubprocess
import functools
import multiprocessing.process
import os
from typing import Any

import pytest

_started: list[str] = []  # every process start of this session, by how it started
_FIRST = pytest.StashKey[int]()  # where a test's starts begin in _started


def _counting(owner: Any, name: str, what: str) -> None:
    original = getattr(owner, name)

    @functools.wraps(original)
    def start(*args: Any, **kwargs: Any) -> Any:
        _started.append(what)
        return original(*args, **kwargs)

    setattr(owner, name, start)


def pytest_configure(config: pytest.Config) -> None:
    # subprocess and multiprocessing's spawn/forkserver start processes through
    # fork_exec; the fork context through os.fork; a forkserver's children through
    # BaseProcess.start in this process
    _counting(_posixsubprocess, "fork_exec", "a subprocess")
    _counting(os, "fork", "os.fork")
    for name in ("posix_spawn", "posix_spawnp"):
        if hasattr(os, name):
            _counting(os, name, name)
    _counting(multiprocessing.process.BaseProcess, "start", "a multiprocessing process")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    item.stash[_FIRST] = len(_started)
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    outcome = yield
    report = outcome.get_result()
    if call.when == "setup" or not report.passed or item.get_closest_marker("slow"):
        return
    first = item.stash.get(_FIRST, len(_started))
    how = sorted(set(_started[first:]))
    item.stash[_FIRST] = len(_started)  # report each start once (call, then teardown)
    if how:
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} started processes ({', '.join(how)}) but is not marked "
            "@pytest.mark.slow: mark it (make test-fast runs -m 'not slow', in-process only)"
        )
