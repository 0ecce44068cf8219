"""The suite's own rules (``tests/conftest.py``): a test that starts a process, itself or
through a fixture of any scope, must be marked ``slow``, or it fails; ``make test-fast``
(``-m "not slow"``) then runs in-process tests only. Checked by running pytest on a
small suite that uses this conftest."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import hang_guard_s

CONFTEST = Path(__file__).with_name("conftest.py")

SUITE = """
import multiprocessing
import subprocess
import sys

import pytest


def start_one():
    subprocess.run([sys.executable, "-c", "pass"], check=True)


@pytest.fixture(scope="module")
def server():
    start_one()  # set up by whichever test asks first
    return "up"


def test_in_process():
    assert sum(range(4)) == 6


def test_unmarked_subprocess():
    start_one()


@pytest.mark.slow
def test_marked_subprocess():
    start_one()


def test_unmarked_multiprocessing():
    p = multiprocessing.get_context("spawn").Process(target=print)
    p.start()
    p.join()


@pytest.mark.slow
def test_marked_uses_the_module_fixture_first(server):
    assert server == "up"


def test_unmarked_uses_the_module_fixture_already_set_up(server):
    assert server == "up"


def test_unmarked_fixture_starts_in_its_setup(tmp_path):
    start_one()
"""


def run_suite(tmp_path: Path, *args: str) -> dict[str, str]:
    (tmp_path / "conftest.py").write_text(CONFTEST.read_text())
    (tmp_path / "test_rules.py").write_text(SUITE)
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nmarkers =\n    slow: starts a process\naddopts = --strict-markers\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", *args, "test_rules.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=hang_guard_s(600),
    )
    outcomes = dict(
        (name, outcome)
        for outcome, name in re.findall(
            r"^(PASSED|FAILED|ERROR) test_rules.py::(\w+)", done.stdout, re.M
        )
    )
    assert outcomes, done.stdout + done.stderr
    return outcomes | {"_stdout": done.stdout}


@pytest.mark.slow
def test_an_unmarked_test_that_starts_a_process_fails(tmp_path):
    got = run_suite(tmp_path)
    out = got.pop("_stdout")
    assert got == {
        "test_in_process": "PASSED",
        "test_unmarked_subprocess": "FAILED",
        "test_marked_subprocess": "PASSED",
        "test_unmarked_multiprocessing": "FAILED",
        "test_marked_uses_the_module_fixture_first": "PASSED",
        "test_unmarked_uses_the_module_fixture_already_set_up": "FAILED",
        "test_unmarked_fixture_starts_in_its_setup": "FAILED",
    }, out
    assert "is not marked @pytest.mark.slow" in out and "fixture 'server'" in out, out


@pytest.mark.slow
def test_not_slow_runs_what_is_left_and_still_catches_an_unmarked_start(tmp_path):
    got = run_suite(tmp_path, "-m", "not slow")
    got.pop("_stdout")
    assert got == {
        "test_in_process": "PASSED",
        "test_unmarked_subprocess": "FAILED",
        "test_unmarked_multiprocessing": "FAILED",
        "test_unmarked_uses_the_module_fixture_already_set_up": "FAILED",
        "test_unmarked_fixture_starts_in_its_setup": "FAILED",
    }
