"""Finite streams with several data-parallel ranks end together, at a defined point.

Each rank is a real process in a gloo process group (``finite_worker.py``). The global
stream of ``D`` ranks is the single-process stream up to the first step at which one
rank's position falls on an ended lane (``distributed/finite_end.py``); every rank must
stop at that same step -- none may wait forever in the next collective -- and the
checkpoint taken there restores to an iterator that ends at once.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import batch_digest as digest
from helpers import finite_pipeline as build
from helpers import hang_guard_s, worker_env

from zephon_core.testing import take

# every test here starts processes (see tests/conftest.py)
pytestmark = pytest.mark.slow

WORKER = Path(__file__).resolve().with_name("finite_worker.py")
GUARD_S = hang_guard_s(600)  # a hang guard: the ranks print their stacks 30 s before


def run_ranks(tmp_path: Path, world: int, workers: int) -> list[dict]:
    procs, outs = [], []
    for rank in range(world):
        out = tmp_path / f"r{rank}.json"
        spec = dict(
            rank=rank,
            world=world,
            init=str(tmp_path / "pg"),
            out=str(out),
            workers=workers,
            stacks_after_s=GUARD_S - 30,
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, str(WORKER), json.dumps(spec)],
                env=worker_env(PYTHONUNBUFFERED="1"),
            )
        )
        outs.append(out)
    try:
        for p in procs:
            p.wait(timeout=GUARD_S)
    except subprocess.TimeoutExpired:
        pytest.fail(
            f"a rank was still running after {GUARD_S:.0f} s (hang guard) at the end of a "
            "finite stream; the ranks' stacks are in the captured stderr"
        )
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(p.returncode == 0 for p in procs), [p.returncode for p in procs]
    return [json.loads(o.read_text()) for o in outs]


@pytest.fixture(scope="module")
def single() -> list[str]:
    with build() as pipe:
        return [digest(o) for o in take(pipe, 100_000)]


@pytest.mark.parametrize("workers", [0, 1])
def test_ranks_end_together_at_the_first_step_with_an_ended_lane(tmp_path, single, workers):
    world = 2
    ranks = run_ranks(tmp_path, world, workers)
    counts = [len(r["outputs"]) for r in ranks]
    assert len(set(counts)) == 1, f"ranks ended at different steps: {counts}"
    steps = counts[0]
    stream = [ranks[r]["outputs"][i] for i in range(steps) for r in range(world)]
    assert stream == single[: len(stream)], "the multi-rank stream is a prefix of the global one"
    assert len(stream) < len(single), "a lane ended first: the ranks stop before the tail"
    # the checkpoint is the state after the last complete step; it ends at once again
    assert all(r["position"] == ranks[0]["position"] for r in ranks)
    assert all(r["after_restore"] == [] for r in ranks)


@pytest.mark.parametrize("dp,resume_dp,workers", [(2, 2, 0), (2, 1, 0), (1, 2, 0), (2, 2, 1)])
def test_simulated_ranks_resume_a_finite_stream_exactly(single, dp, resume_dp, workers):
    """``assert_resume_equivalent`` simulates the ranks in one process with the same
    lockstep rule; cuts near the end land after the first lane ended."""
    from zephon_core.testing import assert_resume_equivalent

    total = len(single)
    cuts = [c - c % 2 for c in (2, total // 2, total - 40)]
    report = assert_resume_equivalent(
        build,
        cut_points=cuts,
        total=total + 10,
        dp_size=dp,
        resume_dp_size=resume_dp,
        num_workers=workers,
    )
    if dp > 1:
        assert report.total < total  # the ranks' stream ends before the single one
