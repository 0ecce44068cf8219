"""A function is identified by what determines its outputs, not by where it lives.

Real separate processes, as a user runs them: a state saved by ``python train.py``
(functions in ``__main__``) resumes exactly in a script that imports ``train``, and
with the same functions moved to another module, and ``zephon diff STATE
train.py:build`` reports no difference. The map closes over the script's
``argparse.Namespace``; the arguments the code does not read (``--out``,
``--resume-from``) differ between the runs.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import hang_guard_s, worker_env

# every test here starts processes (see tests/conftest.py)
pytestmark = pytest.mark.slow

TRAIN = '''
"""A training script: `python train.py --out STATE`, or imported by a resume script."""
import argparse
import pickle
import sys

import numpy as np

from zephon_core import Pipeline, StaticMixtureWorkSource
from zephon_core.testing import take

CUT, TAIL = 7, 12
DOCS = [{"text": f"document {i}: " + "abc " * (i % 13 + 1)} for i in range(300)]


def parse(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-tokens", type=int, default=40)
    ap.add_argument("--out", default="state.zst")
    ap.add_argument("--resume-from", default=None)
    return ap.parse_args(argv)


def tok(p):
    return {"input_ids": np.frombuffer(p["text"].encode(), dtype=np.uint8).astype(np.int32)}


class Clip:
    def __init__(self, limit):
        self.limit = limit

    def __call__(self, p):
        return {"input_ids": p["input_ids"][: self.limit]}


def build(args=None):
    args = args if args is not None else parse([])

    def shorten(p):  # reads args.max_tokens only
        return {"input_ids": p["input_ids"][: args.max_tokens]}

    src = StaticMixtureWorkSource({"docs": DOCS}, chunk_size=8, seed=1)
    return (
        Pipeline(src, canonical_replicas=2, seed=3, prefetch=0)
        .fetch()
        .map(tok, name="tok")
        .map(Clip(200), name="clip")
        .map(shorten, name="shorten")
        .split(max_len=32)
        .pack(seq_len=32)
        .batch(batch_size=2)
    )


if __name__ == "__main__":
    args = parse(sys.argv[1:])
    with build(args) as pipe:
        take(pipe, CUT)
        pipe.save(args.out)
        with open(args.out + ".tail", "wb") as f:  # what the uninterrupted run delivers next
            pickle.dump(take(pipe, TAIL), f)
'''

RESUME = """
import pickle
import sys

import train
from zephon_core.testing import assert_streams_equal, take

state_path = sys.argv[1]
args = train.parse(["--resume-from", state_path, "--out", "elsewhere.zst"])
with open(state_path + ".tail", "rb") as f:
    expected = pickle.load(f)


def resume(what):
    pipe = train.build(args)
    pipe.load_state_dict(pipe.load(state_path))
    assert_streams_equal(expected, take(pipe, train.TAIL), what)
    pipe.close()
    print("EXACT", what, flush=True)


resume("imported")
import moved  # the same functions, now in another module

train.tok, train.Clip = moved.tok, moved.Clip
resume("moved")
"""

MOVED = """
import numpy as np


def tok(p):
    return {"input_ids": np.frombuffer(p["text"].encode(), dtype=np.uint8).astype(np.int32)}


class Clip:
    def __init__(self, limit):
        self.limit = limit

    def __call__(self, p):
        return {"input_ids": p["input_ids"][: self.limit]}
"""


def _run(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*args],
        cwd=cwd,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=hang_guard_s(600),
    )


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("location")
    (d / "train.py").write_text(TRAIN)
    (d / "resume.py").write_text(RESUME)
    (d / "moved.py").write_text(MOVED)
    r = _run(d, sys.executable, "train.py", "--out", "state.zst")
    assert r.returncode == 0, r.stderr
    return d


@pytest.fixture(scope="module")
def resumed(saved) -> subprocess.CompletedProcess:
    return _run(saved, sys.executable, "resume.py", "state.zst")


def test_a_state_saved_as_main_resumes_exactly_where_train_is_imported(resumed):
    assert "EXACT imported" in resumed.stdout, resumed.stderr[-3000:]


def test_the_same_functions_moved_to_another_module_resume_exactly(resumed):
    assert resumed.returncode == 0 and "EXACT moved" in resumed.stdout, resumed.stderr[-3000:]


def test_zephon_diff_of_the_state_and_the_script_finds_no_difference(saved):
    zephon = Path(sys.executable).parent / "zephon"
    r = _run(saved, str(zephon), "diff", "state.zst", "train.py:build")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "restores" in r.stdout
