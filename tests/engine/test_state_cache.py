"""The lane cache (``checkpoint/lane_cache.py``) never hands out a stale state.

A handle encodes a lane again only after the lane changed. Random interleavings of
``next()``, ``state_dict()`` and ``checkpoint()``: every state equals the one computed
with the cache switched off at the same moment (its test-only switch), and every state,
restored into a freshly built pipeline, continues exactly as the uninterrupted run.
In process (``PipelineIterator``, with and without a pump thread) and through a
DataLoader with 2 workers (``RankConsumer``'s mirrors, read-ahead ``served=`` included).
"""

from __future__ import annotations

import contextlib

import pytest
from helpers import hang_guard_s, reference_pipeline
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zephon_core.checkpoint import lane_cache
from zephon_core.testing import assert_streams_equal, take

C = 6
EXTRA = 6  # outputs compared after each resume point

CASES = settings(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
ops_lists = st.lists(
    st.sampled_from(["next", "next", "next", "state_dict", "checkpoint"]), min_size=1, max_size=30
)


def build(prefetch: int, num_epochs: int | None = None):
    # parallelism 1: with no pump thread (prefetch 0) nothing changes a lane between calls
    return reference_pipeline(
        lanes=C, prefetch=prefetch, parallelism=1, chunk_size=4, num_epochs=num_epochs
    )


_REF: dict = {}


def reference(prefetch: int, n: int) -> list:
    if len(_REF.get(prefetch, ())) < n:
        pipe = build(prefetch)
        try:
            _REF[prefetch] = take(pipe, n + 16)
        finally:
            pipe.close()
    return _REF[prefetch][:n]


@contextlib.contextmanager
def uncached():
    lane_cache._CACHING = False  # noqa: SLF001 - the module's test-only switch
    try:
        yield
    finally:
        lane_cache._CACHING = True  # noqa: SLF001


def resumes_exactly(prefetch: int, kind: str, state: dict, taken: int) -> None:
    pipe = build(prefetch)
    try:
        if kind == "checkpoint":
            it = pipe.iterate(restore=state)
        else:
            it = pipe.iterate()
            it.load_state_dict(state)
        with it:
            got = take(it, EXTRA)
    finally:
        pipe.close()
    want = reference(prefetch, taken + EXTRA)[taken:]
    assert_streams_equal(want, got, f"{kind} after {taken} outputs")


@settings(CASES, max_examples=30)
@given(ops=ops_lists, prefetch=st.sampled_from([0, 3]), data=st.data())
def test_in_process_states_are_fresh_and_resume_exactly(ops, prefetch, data):
    pipe = build(prefetch)
    states = []
    with pipe.iterate() as it:
        taken = 0
        for op in ops:
            if op == "next":
                next(it)
                taken += 1
                continue
            state = getattr(it, op)()
            if prefetch == 0:  # no producer thread: the state cannot move between the calls
                with uncached():
                    assert getattr(it, op)() == state, f"{op} after {taken} outputs"
            states.append((op, state, taken))
    pipe.close()
    if states:  # the last state and one drawn at random resume exactly
        picked = {len(states) - 1, data.draw(st.integers(0, len(states) - 1))}
        for i in sorted(picked):
            resumes_exactly(prefetch, *states[i])


@settings(CASES, max_examples=30)
@given(
    pulls=st.lists(st.tuples(st.integers(0, C - 1), st.integers(1, 12)), min_size=1, max_size=20),
    every=st.integers(1, 3),
    num_epochs=st.sampled_from([None, 1]),
)
def test_a_lane_pulled_ahead_of_the_consumer_is_encoded_again(pulls, every, num_epochs):
    # what the pump does between two states: a lane's producer pulls chunks (and reaches
    # its end) while the consumer delivers nothing; driven here, so without a race (a
    # chunk feeds several outputs: pulls of up to 12)
    pipe = build(0, num_epochs)
    with pipe.iterate() as it:
        take(it, C + 1)
        run = it.run
        for i, (lane, n) in enumerate(pulls):
            for _ in range(n):
                next(run.streams[lane].outputs, None)
            if i % every == 0:
                sd, ck = it.state_dict(), it.checkpoint()
                with uncached():
                    assert it.state_dict() == sd, f"state_dict after pulling lane {lane}"
                    assert it.checkpoint() == ck, f"checkpoint after pulling lane {lane}"
    pipe.close()


def test_a_state_taken_twice_is_equal_and_shares_nothing_mutable():
    pipe = build(0)
    with pipe.iterate() as it:
        take(it, 7)
        a, b = it.checkpoint(), it.checkpoint()
        assert a == b
        a["lanes"][0]["chunks"][0][3].append(-1)  # editing one changes nothing else
        assert it.checkpoint() == b
        sd1, sd2 = it.state_dict(), it.state_dict()
        assert sd1 == sd2 and sd1 is not sd2 and sd1["slots"] is not sd2["slots"]
        next(it)
        sd3 = it.state_dict()
        assert sd3 != sd1 and it.state_dict() == sd3  # the earlier dict kept its values
        with uncached():
            assert it.state_dict() == sd3
    pipe.close()


@pytest.mark.slow
@settings(CASES, max_examples=4)
@given(
    ops=st.lists(
        st.sampled_from(["next", "next", "state_dict", "checkpoint", "served"]),
        min_size=4,
        max_size=24,
    ),
    data=st.data(),
)
def test_loader_states_are_fresh_and_resume_exactly(ops, data):
    guard = hang_guard_s(120)
    pipe = build(3)
    states = []
    with pipe.dataloader(num_workers=2, timeout=guard) as loader:
        it, taken = iter(loader), 0
        for op in ops:
            if op == "next":
                next(it)
                taken += 1
                continue
            if op == "served":  # a trainer one batch behind the loader
                if taken == 0:
                    continue
                state, at = loader.checkpoint(served=taken - 1), taken - 1
                with uncached():
                    assert loader.checkpoint(served=at) == state
                states.append(("checkpoint", state, at))
                continue
            state = getattr(loader, op)()
            with uncached():
                assert getattr(loader, op)() == state, f"{op} after {taken} outputs"
            states.append((op, state, taken))
    pipe.close()
    if states:
        picked = {len(states) - 1, data.draw(st.integers(0, len(states) - 1))}
        for i in sorted(picked):
            kind, state, at = states[i]
            want = loader_reference(at + EXTRA)[at:]
            p = build(3)
            restore = state if kind == "checkpoint" else None
            with p.dataloader(num_workers=2, timeout=guard, restore=restore) as resumed:
                if restore is None:
                    resumed.load_state_dict(state)  # DCP's way: into a fresh loader
                got = take(resumed, EXTRA)
            p.close()
            assert_streams_equal(want, got, f"loader {kind} after {at} outputs")


_LOADER_REF: list = []


def loader_reference(n: int) -> list:
    if len(_LOADER_REF) < n:
        pipe = build(3)
        with pipe.dataloader(num_workers=2, timeout=hang_guard_s(120)) as loader:
            _LOADER_REF[:] = take(loader, n + 16)
        pipe.close()
    return _LOADER_REF[:n]
