"""Suite-wide rule: a test that starts a process is marked ``@pytest.mark.slow``.

``make test-fast`` runs ``-m "not slow"`` as the inner loop; it stays fast only if every
test that starts a process (a subprocess, torchrun, a multiprocessing or DataLoader
worker, a Lightning ``ddp_spawn`` child) carries the marker. Process starts are counted
here during each test's setup, call and teardown, and an unmarked test that started one
fails with a message saying so; so does an unmarked test using a fixture that started
processes, even when another test set that (module-scoped) fixture up first. Tests that
run for many seconds in this process (a Trainer or Lightning fit, a long search) carry
the marker too, by hand, so that the inner loop stays within about two minutes.
"""

from __future__ import annotations

import _posixsubprocess
import functools
import multiprocessing.process
import os
import subprocess
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

# Hypothesis's defaults fail an example that takes over 200 ms, or whose data takes long to
# draw: wall-clock limits that a loaded machine trips. Progress decides here, not speed.
settings.register_profile("zephon", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("zephon")

_started: list[str] = []  # every process start of this session, by how it started
_FIRST = pytest.StashKey[int]()  # where a test's starts begin in _started
_patched: list[tuple[Any, str, Any]] = []  # what pytest_configure wrapped, to unwrap at the end
_spawning: dict[Any, list[str]] = {}  # fixture definitions whose setup started processes


def _counting(owner: Any, name: str, what: str) -> None:
    original = getattr(owner, name)

    @functools.wraps(original)
    def start(*args: Any, **kwargs: Any) -> Any:
        _started.append(what)
        return original(*args, **kwargs)

    setattr(owner, name, start)
    _patched.append((owner, name, original))


def pytest_configure(config: pytest.Config) -> None:
    # subprocess starts processes through the fork_exec it bound at import (or through
    # os.posix_spawn), multiprocessing's spawn/forkserver through _posixsubprocess's,
    # the fork context through os.fork; a forkserver's children through
    # BaseProcess.start in this process
    if getattr(subprocess, "_fork_exec", None) is not None:
        _counting(subprocess, "_fork_exec", "a subprocess")
    _counting(_posixsubprocess, "fork_exec", "a spawned process")
    _counting(os, "fork", "os.fork")
    for name in ("posix_spawn", "posix_spawnp"):
        if hasattr(os, name):
            _counting(os, name, name)
    _counting(multiprocessing.process.BaseProcess, "start", "a multiprocessing process")


def pytest_unconfigure(config: pytest.Config) -> None:
    for owner, name, original in _patched:
        setattr(owner, name, original)
    _patched.clear()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    item.stash[_FIRST] = len(_started)
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef, request: pytest.FixtureRequest) -> Any:
    # a module- or session-scoped fixture starts its processes during the setup of the
    # first test that asks for it: remember the fixture, so that every test using it
    # needs the marker, whichever test happened to run first (-m "not slow" changes that)
    first = len(_started)
    yield
    if len(_started) > first:
        _spawning[fixturedef] = sorted(set(_started[first:]))


def _through_fixtures(item: pytest.Item) -> list[str]:
    """How processes were started by the fixtures ``item`` uses (whenever they were set up)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return []
    return [
        f"{how} (fixture {name!r})"
        for name, defs in info.name2fixturedefs.items()
        for d in defs
        if d in _spawning
        for how in _spawning[d]
    ]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    outcome = yield
    report = outcome.get_result()
    if call.when == "setup" or not report.passed or item.get_closest_marker("slow"):
        return
    first = item.stash.get(_FIRST, len(_started))
    how = sorted(set(_started[first:]))
    if call.when == "call":
        how = sorted(set(how) | set(_through_fixtures(item)))
    item.stash[_FIRST] = len(_started)  # report each start once (call, then teardown)
    if how:
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} started processes ({', '.join(how)}) but is not marked "
            "@pytest.mark.slow: mark it (make test-fast runs -m 'not slow', in-process only)"
        )
