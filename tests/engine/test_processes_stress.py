"""runner=processes under random layouts: equal to threads, exact on resume, never hung.

Long random runs once hung in rare cases that did not reproduce in isolation. This test
walks a fixed random sample of configurations (links of processes stages, lanes, k,
prefetch, queue sizes, restores, early closes) with a finite ``stall_timeout_s``: a hang
becomes a ``PipelineStalled`` with every thread's stack in the log instead of a frozen
CI job. ``benchmarks/soak_processes.py`` runs the same cases for as long as you like.
"""

from __future__ import annotations

import random

import pytest
from helpers import byte_tokenize, drop_some, hang_guard_s, source

from zephon_core import Pipeline
from zephon_core.testing import assert_streams_equal, take

# every test here starts processes (see tests/conftest.py)
pytestmark = pytest.mark.slow

STALL_S = hang_guard_s(120.0)  # far above any step, also on a loaded machine


def case_pipeline(case: dict, runner: str) -> Pipeline:
    pipe = Pipeline(
        source(case["chunk"]),
        canonical_replicas=case["lanes"],
        flush_every_k_chunks=case["k"],
        seed=case["seed"],
        prefetch=case["prefetch"],
        queue_size=case["queue"],
        stall_timeout_s=STALL_S,
    ).fetch(parallelism=case["fetch_p"])
    for i, link in enumerate(case["links"]):
        if link == "map":
            pipe = pipe.map(byte_tokenize, parallelism=case["map_p"], name=f"tok{i}", runner=runner)
        else:
            pipe = pipe.filter(drop_some, parallelism=case["map_p"], name=f"drop{i}", runner=runner)
    return (
        pipe.split(max_len=64).pack(seq_len=64, bins=2).shuffle(buffer_size=4).batch(batch_size=2)
    )


def random_case(rng: random.Random) -> dict:
    links = ["map"] + ["filter"] * rng.randint(0, 2)  # tokenize once, then filters
    return dict(
        lanes=rng.choice([1, 2, 4]),
        k=rng.choice([1, 2, 3]),
        chunk=rng.choice([1, 4, 8]),
        seed=rng.randrange(1000),
        prefetch=rng.choice([0, 1, 3]),
        queue=rng.choice([1, 2, 4]),
        fetch_p=rng.choice([1, 2]),
        map_p=rng.choice([1, 2, 3]),
        links=links,
        total=(total := rng.randint(10, 40)),
        cut=rng.randint(0, min(12, total)),
        close_early=rng.random() < 0.3,
    )


def run_case(case: dict) -> None:
    ref = case_pipeline(case, "threads")
    try:
        want = take(ref, case["total"])
    finally:
        ref.close()
    pipe = case_pipeline(case, "processes")
    try:
        head = take(pipe, case["cut"])
        state = pipe.checkpoint()
        if not case["close_early"]:
            assert_streams_equal(
                want, head + take(pipe, case["total"] - case["cut"]), f"processes vs threads {case}"
            )
    finally:
        pipe.close()
    resumed = case_pipeline(case, "processes")
    try:
        resumed.load_state_dict(state)
        tail = take(resumed, case["total"] - case["cut"])
    finally:
        resumed.close()
    assert_streams_equal(want[case["cut"] :], tail, f"resumed under processes {case}")


CASES = [random_case(random.Random(i)) for i in range(6)]


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_processes_random_layouts_are_exact_and_never_hang(case):
    run_case(case)
