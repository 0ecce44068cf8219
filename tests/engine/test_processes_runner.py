"""runner=processes: stateless operators on worker processes, same stream as threads.

The runner is not part of the fingerprint: a checkpoint taken under threads resumes
under processes and the other way round.
"""

from __future__ import annotations

import time

import pytest
from helpers import (
    FailingTokenizer,
    byte_tokenize,
    drop_some,
    exit_process,
    hang_guard_s,
    kill_process,
    returns_unpicklable,
    source,
)

from zephon_core import ConfigError, Pipeline, PipelineError
from zephon_core.testing import assert_resume_equivalent, assert_streams_equal, take

# every test here starts processes (see tests/conftest.py)
pytestmark = pytest.mark.slow


def build(runner: str = "processes", lanes: int = 2, fn=byte_tokenize) -> Pipeline:
    return (
        Pipeline(source(8), canonical_replicas=lanes, flush_every_k_chunks=2, seed=3)
        .fetch()
        .map(fn, parallelism=2, name="tokenize", runner=runner)
        .filter(drop_some, runner=runner)  # tombstones cross the processes too
        .split(max_len=64)
        .pack(seq_len=64, bins=4)
        .shuffle(buffer_size=8)
        .batch(batch_size=4)
    )


def test_plan_and_stream_equal_threads():
    pipe = build()
    plan = pipe.explain()
    assert "runner=processes cap=3 mode=microbatches" in plan
    assert "tokenize@p2 -[in_q=2]-> filter@p1" in plan
    try:
        got = take(pipe, 30)
        stats = pipe.stats()["operators"]["tokenize"]
    finally:
        pipe.close()
    ref = build("threads")
    try:
        assert_streams_equal(take(ref, 30), got, "processes vs threads")
    finally:
        ref.close()
    assert stats["records_in"] > 0 and stats["records_in"] == stats["records_out"]
    assert build().compile().fingerprint == build("threads").compile().fingerprint


def test_resume_is_exact_and_crosses_runners():
    assert_resume_equivalent(lambda: build(), cut_points=[3, 17])
    # a checkpoint taken under threads continues under processes
    first = build("threads")
    try:
        head = take(first, 9)
        state = first.checkpoint()
    finally:
        first.close()
    ref = build("threads")
    try:
        want = take(ref, 20)
    finally:
        ref.close()
    second = build("processes")
    try:
        second.load_state_dict(state)
        assert_streams_equal(want, head + take(second, 11), "threads -> processes")
    finally:
        second.close()


def test_worker_errors_name_the_operator_and_record():
    pipe = build(fn=FailingTokenizer("c"), lanes=1)  # every code document fails
    try:
        with pytest.raises(PipelineError, match="'tokenize'.*cursor.*cannot tokenize c"):
            take(pipe, 200)
    finally:
        pipe.close()


def test_what_cannot_run_on_processes_is_refused():
    with pytest.raises(ConfigError, match="module level"):
        build(fn=lambda p: byte_tokenize(p)).compile()
    with pytest.raises(ConfigError, match="runner='gpu'"):
        build(runner="gpu").compile()


def test_inside_dataloader_workers_it_runs_on_threads():
    ref = build("threads")
    try:
        want = take(ref, 12)
    finally:
        ref.close()
    # daemonic DataLoader workers cannot start processes; the stage runs on threads there
    got = take(build().dataloader(num_workers=2), 12)
    assert_streams_equal(want, got, "processes in DataLoader workers")


def test_close_stops_the_worker_processes():
    pipe = build()
    take(pipe, 3)
    procs = list(iter(pipe).run.procs.pool._processes.values())
    assert procs and all(p.is_alive() for p in procs)
    pipe.close()
    deadline = time.monotonic() + hang_guard_s(60)  # a hang guard: they exit at once
    while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
        time.sleep(0.05)  # polling for exit, bounded; not synchronisation
    assert not any(p.is_alive() for p in procs)


def test_a_dying_worker_is_a_named_error():
    pipe = build(fn=exit_process, lanes=1)
    try:
        with pytest.raises(PipelineError, match="'tokenize'.*exited with code 3"):
            take(pipe, 5)
    finally:
        pipe.close()


def test_a_killed_worker_is_named_as_killed_not_as_a_pickling_problem():
    pipe = build(fn=kill_process, lanes=1)
    try:
        with pytest.raises(PipelineError, match="'tokenize'.*killed by signal 9") as ei:
            take(pipe, 5)
        assert "pickle" not in str(ei.value)
    finally:
        pipe.close()


def test_workers_get_the_operators_without_the_source_or_upstream():
    """An unpicklable upstream operator (a lambda on threads) does not matter: workers
    receive their own operators only, not the source or the operators before them."""

    def pipe(runner):
        return (
            Pipeline(source(8), canonical_replicas=1, seed=3)
            .fetch()
            .map(lambda p: p, name="identity")
            .map(byte_tokenize, parallelism=2, name="tokenize", runner=runner)
            .split(max_len=64)
            .batch(batch_size=4)
        )

    got, ref = pipe("processes"), pipe("threads")
    try:
        assert_streams_equal(take(ref, 10), take(got, 10), "lambda upstream")
    finally:
        got.close()
        ref.close()


def test_an_unpicklable_result_names_the_stage():
    pipe = (
        Pipeline(source(8), canonical_replicas=1, seed=3)
        .fetch()
        .map(returns_unpicklable, name="locky", runner="processes")
    )
    try:
        with pytest.raises(PipelineError, match="'locky'.*results must pickle"):
            take(pipe, 5)
    finally:
        pipe.close()
