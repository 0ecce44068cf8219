"""Elastic determinism (docs/design.md §7) and checkpoint consistency with DataLoader workers (§5).

D data-parallel ranks are simulated inside this one process: D pipelines, each bound to its
rank, iterated directly (W=0) or through ``pipe.dataloader(num_workers=W)``. The global
stream is built step by step -- at every step rank 0, 1, .., D-1 each deliver one output --
and must be the stream a plain single-process ``iter(pipe)`` delivers, for every (D, W).
Checkpoints are the ranks' ``local_checkpoint()`` reports merged by
``merge_local_checkpoints`` (what the aggregation leader does), restored into freshly built
pipelines bound to another topology.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from functools import cache

import pytest
from helpers import hang_guard_s, reference_pipeline
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zephon_core.distributed import merge_local_checkpoints
from zephon_core.errors import IncompatibleCheckpoint, TopologyError
from zephon_core.testing import (
    SimulatedRanks,
    assert_streams_equal,
    first_difference,
    reseed_globals,
    take,
)

C8 = 8


def build(lanes: int = C8, **kw):
    return reference_pipeline(lanes=lanes, **kw)


@cache
def _reference(lanes: int, n: int, prefetch: int = 3) -> tuple:
    pipe = build(lanes, prefetch=prefetch)
    try:
        return tuple(take(pipe, n))
    finally:
        pipe.close()


def reference(lanes: int, n: int) -> list:
    """The uninterrupted single-process stream (plain ``iter(pipe)``)."""
    return list(_reference(lanes, n))


def Job(
    build_fn: Callable,
    D: int,
    W: int | list[int],
    state=None,
    *,
    mp: int = 1,
    loader_kwargs: dict | None = None,
) -> SimulatedRanks:
    """``D`` simulated data-parallel ranks (times ``mp`` peers), ``W`` workers each."""
    return SimulatedRanks(build_fn, D, W, state, mp=mp, loader_kwargs=loader_kwargs)


def run_global(lanes: int, D: int, W: int, steps: int, **kw) -> list:
    with Job(lambda: build(lanes, **kw), D, W) as job:
        return job.steps(steps)


def cut_and_resume(
    lanes: int,
    before: tuple[int, int],
    k: int,
    after: tuple[int, int],
    more: int,
    salt: int = 0,
    build_fn: Callable | None = None,
):
    """Run ``k`` steps at ``before`` = (D, W), checkpoint, resume at ``after`` for ``more``
    steps. Returns (head, merged state, tail)."""
    build_fn = build_fn or (lambda: build(lanes))
    with Job(build_fn, *before) as job:
        head = job.steps(k)
        state = job.checkpoint(through_bytes=True)
    reseed_globals(salt)
    with Job(build_fn, *after, state=state) as job:
        tail = job.steps(more)
    return head, state, tail


# -- the same global stream for every layout -----------------------------------------------


@pytest.mark.parametrize("lanes", [4, 8])
@pytest.mark.parametrize(
    "D, W",
    [(1, 0), pytest.param(1, 2, marks=pytest.mark.slow), (2, 0)]
    + [pytest.param(2, 2, marks=pytest.mark.slow), (4, 0)],
)
def test_global_stream_is_independent_of_layout(lanes, D, W):
    if lanes % D:
        pytest.skip("D must divide C")
    n = 24
    got = run_global(lanes, D, W, n // D)
    assert_streams_equal(reference(lanes, n), got, f"C={lanes} D={D} W={W}")


# -- model-parallel peers -----------------------------------------------------------------------


@pytest.mark.slow
def test_model_parallel_peers_get_identical_batches_and_merge():
    """world 4 = 2 DP groups x 2 model-parallel peers. ``prefetch=0`` keeps every rank's
    state a pure function of what it consumed, so the peer check is exact."""

    def build_fn():
        return build(4, prefetch=0)

    ref = reference(4, 16)
    with Job(build_fn, D=2, W=0, mp=2) as job:
        stream = []
        for _ in range(5):
            outs = job.step()
            assert first_difference(outs[0], outs[1]) is None  # peers of dp_rank 0
            assert first_difference(outs[2], outs[3]) is None  # peers of dp_rank 1
            stream += [outs[0], outs[2]]
        assert_streams_equal(ref[:10], stream, "DP groups of world 4")
        reports = job.reports()
        assert [(r["rank"], r["dp_rank"], r["dp_size"]) for r in reports] == [
            (0, 0, 2),
            (1, 0, 2),
            (2, 1, 2),
            (3, 1, 2),
        ]
        assert reports[0]["state"] == reports[1]["state"]
        merged = merge_local_checkpoints(reports, num_lanes=4)
        assert merged["position"] == 10
        assert [ls["lane"] for ls in merged["lanes"]] == [0, 1, 2, 3]

        # a peer that diverged (another replay cursor in one lane) is named, never merged
        for victim in (1, 3):
            bad = copy.deepcopy(reports)
            lane_states = bad[victim]["state"]["lanes"]
            target = lane_states[-1]
            cur = list(target["cursor"])
            cur[2] += 1  # another offset
            target["cursor"] = cur
            with pytest.raises(IncompatibleCheckpoint) as ei:
                merge_local_checkpoints(bad, num_lanes=4)
            msg = str(ei.value)
            assert f"lane {target['lane']}" in msg
            assert f"rank {victim}" in msg and f"rank {victim - 1}" in msg

    # the merged checkpoint resumes exactly, here on 1 rank with 2 workers
    reseed_globals(1)
    with Job(build_fn, D=1, W=2, state=merged) as job:
        assert_streams_equal(ref[10:16], job.steps(6), "resume of the world-4 checkpoint")


@pytest.mark.slow
def test_model_parallel_peers_with_different_worker_counts_see_the_same_data():
    """Peers of one DP rank may consume through different loaders; the data is the same."""
    ref = reference(4, 12)
    with Job(lambda: build(4), D=2, W=[0, 2, 2, 0], mp=2) as job:
        stream = []
        for _ in range(6):
            outs = job.step()
            assert first_difference(outs[0], outs[1]) is None
            assert first_difference(outs[2], outs[3]) is None
            stream += [outs[0], outs[2]]
    assert_streams_equal(ref, stream, "world 4, mixed worker counts")


@pytest.mark.parametrize("other", ["dataloader0", "prefetch0"])
def test_model_parallel_peer_reports_do_not_depend_on_pump_progress(other):
    """Peers that consumed identical data hold identical checkpoints, whatever their pump
    threads fetched ahead (docs/design.md §5: a checkpoint is defined by delivered outputs; §8: the
    leader checks that peers agree). Peer 0 iterates directly with the default prefetch and
    is given time to pump ahead; peer 1 consumes the same outputs through
    ``dataloader(num_workers=0)`` (or without a pump thread). Merging must succeed and the
    result must resume exactly."""

    def peer(rank: int):
        pipe = build(4, prefetch=0 if (rank == 1 and other == "prefetch0") else 3)
        return pipe.bind(rank=rank, world_size=2, dp_rank=0, dp_size=1)

    ref = reference(4, 10)
    pipes = [peer(0), peer(1)]
    try:
        it0 = iter(pipes[0])
        it1 = iter(pipes[1].dataloader()) if other == "dataloader0" else iter(pipes[1])
        a, b = next(it0), next(it1)
        assert first_difference(a, b) is None
        deadline = time.monotonic() + hang_guard_s(60)  # it fetches ahead at once
        while pipes[0].stats()["inflight_chunks"][1] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)  # let peer 0's pump fetch ahead on lane 1
        reports = [p.local_checkpoint() for p in pipes]
        merged = merge_local_checkpoints(reports, num_lanes=4)
    finally:
        if other == "dataloader0":
            it1.close()
        for p in pipes:
            p.close()
    with Job(lambda: build(4), D=1, W=0, state=merged) as job:
        assert_streams_equal(ref[1:10], job.steps(9), "resume of the peers' checkpoint")


# -- exact resume across topologies ------------------------------------------------------------

RESUMES = [
    ((2, 2), (1, 0)),
    ((2, 2), (2, 1)),
    ((2, 2), (1, 2)),
    ((1, 0), (2, 2)),
    ((1, 2), (2, 2)),
    ((2, 0), (4, 1)),
]


@pytest.mark.slow
@pytest.mark.parametrize("k", [0, 3, 5])  # C/D = 4 (or 8): 3 and 5 are no multiples
@pytest.mark.parametrize("before, after", RESUMES, ids=[f"{b}->{a}" for b, a in RESUMES])
def test_exact_resume_across_topologies(before, after, k):
    more = 6
    D, D2 = before[0], after[0]
    g = k * D
    ref = reference(C8, g + more * D2)
    head, state, tail = cut_and_resume(C8, before, k, after, more, salt=k)
    assert state["position"] == g
    assert sorted(ls["lane"] for ls in state["lanes"]) == list(range(C8))
    assert_streams_equal(ref[:g], head, f"{before}: stream before the cut")
    assert_streams_equal(ref[g:], tail, f"{before} -> {after} at step {k}: resumed stream")


@pytest.mark.slow
def test_resume_twice_across_three_topologies():
    """(2,2) -> (1,0) -> (4,1): positions 6 -> 11 -> continue; the odd position 11 then has
    to be split over 4 ranks."""
    ref = reference(C8, 6 + 5 + 4 * 4)
    with Job(lambda: build(), 2, 2) as job:
        out = job.steps(3)
        s1 = job.checkpoint(through_bytes=True)
    reseed_globals(3)
    with Job(lambda: build(), 1, 0, state=s1) as job:
        out += job.steps(5)
        s2 = job.checkpoint(through_bytes=True)
    assert s2["position"] == 11
    reseed_globals(4)
    with Job(lambda: build(), 4, 1, state=s2) as job:
        out += job.steps(4)
    assert_streams_equal(ref, out, "two resumes")


# -- prefetched batches, pipe.checkpoint() and re-iteration with workers -------------------------


@pytest.mark.slow
@pytest.mark.parametrize("k", [0, 1, 5])
def test_prefetched_unconsumed_batches_are_reproduced_world1(k):
    ref = reference(4, k + 6)
    pipe = build(4)
    loader = pipe.dataloader(num_workers=2, prefetch_factor=4)
    it = iter(loader)
    try:
        head = [next(it) for _ in range(k)]
        time.sleep(0.3)  # workers fill their prefetch queues (up to 8 batches)
        state = pipe.checkpoint()
    finally:
        it.close()
        pipe.close()
    assert_streams_equal(ref[:k], head, "head")
    assert state["position"] == k
    reseed_globals(k)
    again = build(4)
    again.load_state_dict(state)
    it = iter(again.dataloader(num_workers=2, prefetch_factor=4))
    try:
        first = next(it)
        rest = [next(it) for _ in range(5)]
    finally:
        it.close()
        again.close()
    assert first_difference(ref[k], first) is None, "first batch after restore is not ref[k]"
    assert_streams_equal(ref[k + 1 :], rest, "after restore")


@pytest.mark.slow
def test_prefetched_unconsumed_batches_are_reproduced_two_ranks():
    k, more = 3, 5
    ref = reference(C8, 2 * (k + more))
    job = Job(lambda: build(), 2, 2, loader_kwargs=dict(prefetch_factor=4))
    with job:
        head = job.steps(k)
        time.sleep(0.3)
        state = job.checkpoint(through_bytes=True)
    assert_streams_equal(ref[: 2 * k], head, "head")
    reseed_globals(7)
    with Job(lambda: build(), 2, 2, state=state, loader_kwargs=dict(prefetch_factor=4)) as job:
        tail = job.steps(more)
    assert_streams_equal(ref[2 * k :], tail, "resume after prefetching workers")


DELIVERY_KEYS = ("lane", "floor", "cursor", "delivered", "exhausted", "tokens")


@pytest.mark.slow
@pytest.mark.parametrize("k", [0, 1, 6, 9])
def test_world1_loader_checkpoint_is_the_full_plain_state(k):
    """Without a pump thread (prefetch=0) the state is a pure function of the outputs taken:
    the loader's checkpoint must equal the plain iteration's, key for key."""
    plain = build(4, prefetch=0)
    try:
        take(plain, k)
        want = plain.checkpoint()
    finally:
        plain.close()
    pipe = build(4, prefetch=0)
    it = iter(pipe.dataloader(num_workers=2))
    try:
        for _ in range(k):
            next(it)
        got = pipe.checkpoint()
    finally:
        it.close()
        pipe.close()
    assert sorted(ls["lane"] for ls in got["lanes"]) == [0, 1, 2, 3]
    assert first_difference(want, got) is None, first_difference(want, got)


@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 6, 9])
def test_world1_loader_checkpoint_matches_plain_delivery_state(k):
    """With the default pump (prefetch=3) how far chunks were fetched ahead is timing; what
    was delivered is not: position, floors, replay cursors, progress and token counts match,
    and the inflight chunks agree where both hold them. Both resume to the same stream."""
    ref = reference(4, k + 5)
    plain = build(4)
    try:
        take(plain, k)
        want = plain.checkpoint()
    finally:
        plain.close()
    pipe = build(4)
    it = iter(pipe.dataloader(num_workers=2))
    try:
        for _ in range(k):
            next(it)
        got = pipe.checkpoint()
    finally:
        it.close()
        pipe.close()
    assert got["position"] == want["position"] == k
    assert got["fingerprint"] == want["fingerprint"]
    assert len(got["lanes"]) == 4
    for a, b in zip(want["lanes"], got["lanes"]):
        for key in DELIVERY_KEYS:
            assert a[key] == b[key], (a["lane"], key, a[key], b[key])
        n = min(len(a["chunks"]), len(b["chunks"]))
        assert a["chunks"][:n] == b["chunks"][:n], a["lane"]
    for state in (want, got):
        again = build(4)
        again.load_state_dict(state)
        try:
            assert_streams_equal(ref[k:], take(again, 5), "resume")
        finally:
            again.close()


@pytest.mark.slow
def test_reiterating_the_loader_continues_where_consumption_stopped():
    ref = reference(4, 16)
    pipe = build(4)
    loader = pipe.dataloader(num_workers=2, prefetch_factor=3)
    try:
        it = iter(loader)
        out = [next(it) for _ in range(3)]
        it.close()
        del it
        it = iter(loader)  # workers restart from the consumed state
        out += [next(it) for _ in range(4)]
        assert pipe.checkpoint()["position"] == 7
        del it  # dropped without close(): same
        it = iter(loader)
        out += [next(it) for _ in range(5)]
        it.close()
        it = iter(loader)  # a new iterator that takes nothing ...
        it.close()
        it = iter(loader)  # ... changes nothing
        out += [next(it) for _ in range(4)]
        it.close()
        assert pipe.checkpoint()["position"] == 16
    finally:
        pipe.close()
    assert_streams_equal(ref, out, "re-iterated loader")


@pytest.mark.slow
def test_reiterating_a_restored_loader():
    ref = reference(C8, 20)
    with Job(lambda: build(), 2, 0) as job:
        job.steps(2)
        state = job.checkpoint(through_bytes=True)
    pipe = build().bind(rank=1, world_size=2)
    pipe.load_state_dict(state)
    loader = pipe.dataloader(num_workers=2)
    try:
        it = iter(loader)
        out = [next(it) for _ in range(2)]
        it.close()
        it = iter(loader)
        out += [next(it) for _ in range(3)]
        it.close()
        assert pipe.local_checkpoint()["state"]["position"] == 4 + 2 * 5
    finally:
        pipe.close()
    # rank 1's outputs are the odd global positions from 4 on
    assert_streams_equal(ref[5:15:2], out, "rank 1 after restore and re-iteration")


# -- inconsistent reports ------------------------------------------------------------------------


def test_reports_from_different_steps_are_rejected():
    with Job(lambda: build(prefetch=0), 2, 0) as job:
        job.steps(2)
        r0 = job.handles[0].local_checkpoint()
        next(job.iters[1])  # rank 1 is one step further
        r1 = job.handles[1].local_checkpoint()
    with pytest.raises(IncompatibleCheckpoint, match="different steps") as ei:
        merge_local_checkpoints([r0, r1], num_lanes=C8)
    assert "rank 0: 4" in str(ei.value) and "rank 1: 6" in str(ei.value)


def test_lane_progress_inconsistent_with_one_position_is_rejected():
    """Ranks checkpointed at different steps, with the position of the laggard's report made
    to look right: the lanes' progress does not fit one global position. Merging or restoring
    it is an error, not a guess."""
    with Job(lambda: build(prefetch=0), 2, 0) as job:
        job.steps(2)
        r0 = job.handles[0].local_checkpoint()
        job.steps(1)
        r1 = job.handles[1].local_checkpoint()
    r1 = copy.deepcopy(r1)
    r1["state"]["position"] = r0["state"]["position"]
    fresh = build()
    try:
        # rank 1 delivered on lanes 1, 3, 5 (positions 1, 3, 5); position 4 implies that
        # lane 5 delivered nothing yet
        with pytest.raises(IncompatibleCheckpoint, match="lane 5"):
            merged = merge_local_checkpoints([r0, r1], num_lanes=C8)
            fresh.load_state_dict(merged)
    finally:
        fresh.close()

    # a merged checkpoint whose lane progress was edited is refused at restore, naming the lane
    with Job(lambda: build(prefetch=0), 1, 0) as job:
        job.steps(6)
        state = job.checkpoint(through_bytes=True)
    bad = copy.deepcopy(state)
    bad["lanes"][3]["delivered"] += 1
    fresh = build()
    try:
        with pytest.raises(IncompatibleCheckpoint, match="lane 3"):
            fresh.load_state_dict(bad)
    finally:
        fresh.close()


def test_report_with_the_wrong_lane_mapping_is_a_topology_error():
    with Job(lambda: build(prefetch=0), 2, 0) as job:
        job.steps(1)
        reports = job.reports()
    # rank 0 presents rank 1's lanes: they do not fit dp_rank 0 at position 2
    swapped = copy.deepcopy(reports)
    swapped[0]["state"], swapped[1]["state"] = swapped[1]["state"], swapped[0]["state"]
    with pytest.raises(TopologyError) as ei:
        merge_local_checkpoints(swapped, num_lanes=C8)
    assert "rank 0" in str(ei.value) or "rank 1" in str(ei.value)

    # rank 1 was bound with another DP layout (dp_rank 1 of 4: lanes {1, 5}), but reports as
    # dp_rank 1 of 2
    other = build(prefetch=0).bind(rank=1, world_size=4, dp_rank=1, dp_size=4)
    try:
        rep = other.local_checkpoint()
    finally:
        other.close()
    with Job(lambda: build(prefetch=0), 2, 0) as job:
        r0 = job.handles[0].local_checkpoint()
    assert sorted(ls["lane"] for ls in rep["state"]["lanes"]) == [1, 5]
    rep = dict(rep, dp_rank=1, dp_size=2)
    with pytest.raises(TopologyError) as ei:
        merge_local_checkpoints([r0, rep], num_lanes=C8)
    assert "[1, 5]" in str(ei.value) and "[1, 3, 5, 7]" in str(ei.value)

    # the leader's lane count must be the pipeline's
    with pytest.raises(TopologyError):
        merge_local_checkpoints(reports, num_lanes=4)


# -- finite streams through the DataLoader -----------------------------------------------------


def _finite(lanes: int = 4):
    return build(lanes, num_epochs=1, prefetch=0)


@pytest.mark.parametrize(
    "W", [0, pytest.param(1, marks=pytest.mark.slow), pytest.param(2, marks=pytest.mark.slow)]
)
def test_finite_stream_through_loader_is_the_plain_stream(W):
    """Lanes of a finite stream end at different times; the loader must still deliver the
    plain round-robin stream (skipping exhausted lanes), for every worker count."""
    plain = _finite()
    try:
        ref = list(plain)
    finally:
        plain.close()
    pipe = _finite()
    try:
        got = list(pipe.dataloader(num_workers=W))
    finally:
        pipe.close()
    assert_streams_equal(ref, got, f"finite stream, W={W}")


@pytest.mark.parametrize(
    "W", [0, pytest.param(1, marks=pytest.mark.slow)]
)  # W=2 also reorders the tail (test above)
def test_finite_stream_loader_checkpoint_after_a_lane_ended(W):
    """A checkpoint taken through the loader after some lanes ended (and after the very end)
    must be restorable and continue the stream exactly (docs/design.md §8: after the end it
    restores to an exhausted iterator)."""
    plain = _finite()
    try:
        ref = list(plain)
    finally:
        plain.close()
    for k in (len(ref) - 20, len(ref)):
        plain = _finite()
        try:
            take(plain, k + 1 if k < len(ref) else k)
            assert any(ls["exhausted"] for ls in plain.checkpoint()["lanes"]), (
                "pick a cut after the first lane ended"
            )
        finally:
            plain.close()
        pipe = _finite()
        it = iter(pipe.dataloader(num_workers=W))
        try:
            head = [next(it) for _ in range(k)]
            state = pipe.checkpoint()
        finally:
            it.close()
            pipe.close()
        assert_streams_equal(ref[:k], head, f"W={W} head to {k}")
        again = _finite()
        try:
            again.load_state_dict(state)
            tail = list(again)
        finally:
            again.close()
        assert_streams_equal(ref[k:], tail, f"W={W}: resume at {k} of {len(ref)}")


# -- property: any layout, any cut, any new layout -------------------------------------------------


@st.composite
def layouts(draw, lanes: int):
    D = draw(st.sampled_from([d for d in (1, 2, 3, 4, 6, 8) if lanes % d == 0]))
    W = draw(st.sampled_from([w for w in (0, 1, 2) if w == 0 or (lanes // D) % w == 0]))
    return D, W


@st.composite
def elastic_cases(draw):
    lanes = draw(st.sampled_from([2, 4, 6, 8]))
    before = draw(layouts(lanes))
    after = draw(layouts(lanes).filter(lambda lw: lw != before))
    k = draw(st.integers(0, 7))
    return lanes, before, after, k


@pytest.mark.slow
@settings(
    max_examples=15,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(case=elastic_cases())
def test_property_resume_at_another_layout(case):
    lanes, before, after, k = case
    more = 3
    g = k * before[0]
    ref = reference(lanes, g + more * after[0])
    head, state, tail = cut_and_resume(lanes, before, k, after, more, salt=g)
    assert state["position"] == g
    assert_streams_equal(ref[:g], head, f"C={lanes} {before}: before the cut")
    assert_streams_equal(ref[g:], tail, f"C={lanes} {before} -> {after} at step {k}")
