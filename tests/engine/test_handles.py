"""The description/handle split: a Pipeline describes, a handle owns the run.

Regression tests for the lifecycle traps that used to resume or end silently:
a temporary pipeline's iterator ending at once, a loader or iterator taken before
``load_state_dict`` ignoring the restore, an error that turned into end-of-stream, and
checkpoints that shared live state.
"""

from __future__ import annotations

import copy
import gc
import threading

import pytest
from helpers import byte_tokenize, hang_guard_s, reference_pipeline, source

from zephon_core import LifecycleError, Pipeline, PipelineError, PipelineIterator
from zephon_core.testing import assert_streams_equal, take

N = 12


@pytest.fixture(scope="module")
def reference() -> list:
    with reference_pipeline() as pipe:
        return take(pipe, 3 * N)


@pytest.fixture(scope="module")
def state_at_n() -> dict:
    with reference_pipeline() as pipe:
        take(pipe, N)
        return pipe.checkpoint()


# -- a handle keeps what it needs alive ------------------------------------------------------


@pytest.mark.slow  # many seconds in this process
def test_for_loop_over_a_temporary_pipeline_delivers_the_stream(reference):
    got = []
    for batch in reference_pipeline():  # nothing else refers to this Pipeline
        gc.collect()
        got.append(batch)
        if len(got) == N:
            break
    assert_streams_equal(reference[:N], got, "for batch in build_pipeline()")


def test_iterator_of_a_collected_pipeline_keeps_running(reference):
    it = iter(reference_pipeline())
    gc.collect()
    assert_streams_equal(reference[:N], take(it, N), "iterator after its pipeline was collected")
    it.close()


def test_dropping_an_iterator_stops_its_threads():
    it = reference_pipeline(prefetch=3).iterate()
    next(it)
    pump = it.run.pump._thread
    assert pump.is_alive()
    del it
    gc.collect()
    pump.join(hang_guard_s(60))
    assert not pump.is_alive(), "a dropped iterator must not leave its pump thread running"


# -- restore order ------------------------------------------------------------------------------


def test_loader_built_before_load_state_dict_is_refused(state_at_n):
    pipe = reference_pipeline()
    loader = pipe.dataloader()
    with pytest.raises(LifecycleError, match="load_state_dict.*before"):
        pipe.load_state_dict(state_at_n)
    loader.close()


def test_iterator_taken_before_load_state_dict_is_refused_and_keeps_going(state_at_n, reference):
    pipe = reference_pipeline()
    it = iter(pipe)
    head = take(it, 2)
    with pytest.raises(LifecycleError, match="before iter"):
        pipe.load_state_dict(state_at_n)
    # the refused restore changed nothing: the iterator continues its own stream
    assert_streams_equal(reference[:5], head + take(it, 3), "after a refused restore")
    pipe.close()


def test_restore_given_to_the_handle_is_followed(state_at_n, reference):
    pipe = reference_pipeline()
    loader = pipe.dataloader(restore=state_at_n)
    assert_streams_equal(reference[N : 2 * N], take(loader, N), "dataloader(restore=state)")
    loader.close()
    with reference_pipeline().iterate(restore=state_at_n) as it:
        assert_streams_equal(reference[N : 2 * N], take(it, N), "iterate(restore=state)")


def test_load_state_dict_then_dataloader_follows_the_restore(state_at_n, reference):
    pipe = reference_pipeline()
    pipe.load_state_dict(state_at_n)
    loader = pipe.dataloader(num_workers=0)
    assert_streams_equal(reference[N : 2 * N], take(loader, N), "restore, then dataloader()")
    loader.close()


def test_a_closed_stream_is_not_restarted_silently(reference):
    pipe = reference_pipeline()
    take(pipe, N)
    pipe.close()
    with pytest.raises(LifecycleError, match="repeat"):
        iter(pipe)  # would start over from the beginning
    with pytest.raises(LifecycleError, match="repeat"):
        pipe.dataloader()
    # continuing explicitly is exact
    with pipe.iterate(restore=pipe.checkpoint()) as it:
        assert_streams_equal(reference[N : 2 * N], take(it, N), "continue after close")


def test_closed_iterator_raises_instead_of_ending():
    it = reference_pipeline().iterate()
    next(it)
    it.close()
    with pytest.raises(LifecycleError, match="closed"):
        next(it)


def test_pipeline_is_frozen():
    pipe = reference_pipeline()
    with pytest.raises(AttributeError, match="frozen"):
        pipe.prefetch = 0
    other = pipe.with_options(prefetch=0)
    assert other.prefetch == 0 and pipe.prefetch == 3
    bound = pipe.bind(rank=1, world_size=2)
    assert bound.topology().rank == 1 and pipe.topology().rank == 0


# -- an error never looks like the end of the stream ---------------------------------------------


class _FailOnce:
    """byte_tokenize that raises ``exc`` the first time it sees document ``doc``."""

    def __init__(self, doc: str, exc: BaseException):
        self.doc, self.exc, self.fired = doc, exc, threading.Event()

    def __call__(self, payload: dict) -> dict:
        if payload["id"] == self.doc and not self.fired.is_set():
            self.fired.set()
            raise self.exc
        return byte_tokenize(payload)


def _failing(fn, prefetch: int) -> Pipeline:
    return (
        Pipeline(source(8), canonical_replicas=2, flush_every_k_chunks=2, seed=3, prefetch=prefetch)
        .fetch()
        .map(fn, name="tokenize")
        .split(max_len=64)
        .pack(seq_len=64, bins=2)
        .batch(batch_size=2)
    )


def _failing_doc(prefetch: int, after: int) -> str:
    """A document the stream reaches after about ``after`` outputs."""
    seen = []
    probe = _failing(lambda p: (seen.append(p["id"]), byte_tokenize(p))[1], prefetch=0)
    with probe:
        take(probe, after)
    return seen[-1]


@pytest.mark.parametrize("prefetch", [0, 3])
@pytest.mark.parametrize(
    "exc", [ValueError("bad row"), KeyboardInterrupt()], ids=["error", "interrupt"]
)
def test_error_then_next_never_stops_iteration(prefetch, exc):
    reference = take(_failing(byte_tokenize, prefetch), 40)
    fn = _FailOnce(_failing_doc(prefetch, 8), exc)
    pipe = _failing(fn, prefetch)
    it = iter(pipe)
    got = []
    with pytest.raises(KeyboardInterrupt if isinstance(exc, KeyboardInterrupt) else PipelineError):
        for _ in range(40):
            got.append(next(it))
    for _ in range(3):  # every later call says the run failed
        with pytest.raises(PipelineError, match="failed earlier"):
            next(it)
    # its state up to the last delivered output is intact: a fresh iterator continues
    state = it.checkpoint()
    assert state["position"] == len(got)
    pipe.close()
    with _failing(fn, prefetch).iterate(restore=state) as again:  # fn raised already
        tail = take(again, 40 - len(got))
    assert_streams_equal(reference, got + tail, f"failure at {len(got)}, then restored")


def test_loader_iterator_error_is_not_end_of_stream():
    reference = take(_failing(byte_tokenize, 0), 30)
    fn = _FailOnce(_failing_doc(0, 8), ValueError("bad row"))
    pipe = _failing(fn, 0)
    loader = pipe.dataloader()
    it = iter(loader)
    got = []
    with pytest.raises(PipelineError, match="bad row"):
        for _ in range(30):
            got.append(next(it))
    with pytest.raises(PipelineError, match="failed earlier"):
        next(it)
    # a new iterator of the same loader restarts from what was consumed
    got += take(iter(loader), 30 - len(got))
    loader.close()
    assert_streams_equal(reference, got, "loader: error, then iter(loader) again")


# -- checkpoints share nothing with the running stream --------------------------------------------


def test_editing_a_returned_state_changes_nothing(state_at_n, reference):
    pipe = reference_pipeline()
    it = iter(pipe)
    take(it, N)
    first = pipe.checkpoint()
    pristine = copy.deepcopy(first)
    for ls in first["lanes"]:
        ls["source"]["cursors"][0] += 1000
        ls["source"]["swrr"][0] += 7
        ls["tokens"][0] += 5
        if ls["chunks"]:
            ls["chunks"][0][3][0] = 10**6
    first["config"]["seed"] = -1
    first["content"]["components"]["prose"] = "edited"
    assert pipe.checkpoint() == pristine, "an edited state leaked into the next checkpoint"
    assert pipe.compile().config["seed"] == 11
    assert_streams_equal(reference[N : 2 * N], take(it, N), "the stream after editing a state")
    pipe.close()


def test_editing_a_state_after_restoring_it_changes_nothing(state_at_n, reference):
    state = copy.deepcopy(state_at_n)
    pipe = reference_pipeline()
    pipe.load_state_dict(state)
    for ls in state["lanes"]:
        ls["source"]["cursors"][0] += 1000
    assert_streams_equal(reference[N : 2 * N], take(pipe, N), "restored, then the dict edited")
    pipe.close()


def test_handles_are_the_public_types():
    pipe = reference_pipeline()
    assert isinstance(iter(pipe), PipelineIterator)
    assert isinstance(pipe.iterate(), PipelineIterator)
    pipe.close()
