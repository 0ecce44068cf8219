"""The DataLoader path equals plain iteration where plain iteration works.

Regression tests for cases a random-cut oracle found (each fails on the code before the
description/handle split): one output completing several chunks or epochs, an iterator
re-created mid-stream, and a worker's checkpoint after its lanes ended. Then a property
over small random pipelines, worker counts, cuts and re-created iterators.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import byte_tokenize, drop_some, source
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zephon_core import Pipeline, StaticMixtureWorkSource
from zephon_core.testing import assert_streams_equal, take


def varlen(row: int) -> dict:
    """Documents of 1..30 tokens, by row."""
    return {"input_ids": np.arange(0, 1 + (row * 7) % 30, dtype=np.int32)}


def _plain(build, n: int) -> list:
    with build() as pipe:
        return take(pipe, n)


@pytest.mark.parametrize("tail", ["batch2", "filtered", "shuffle_k1"])
def test_one_output_completing_several_chunks(tail):
    def build():
        src = StaticMixtureWorkSource({"a": list(range(40))}, chunk_size=1, seed=1)
        pipe = Pipeline(
            src,
            canonical_replicas=1,
            seed=3,
            prefetch=0,
            flush_every_k_chunks=1 if tail == "shuffle_k1" else None,
        )
        pipe = pipe.fetch().map(varlen, name="tok")
        if tail == "filtered":  # chunks the filter emptied complete with the next output
            pipe = pipe.filter(lambda p: len(p["input_ids"]) % 3 == 0, name="third")
        if tail == "shuffle_k1":
            pipe = pipe.shuffle(4)
        return pipe.batch(4 if tail == "shuffle_k1" else 2, pad_to="longest")

    want = _plain(build, 12)
    loader = build().dataloader(num_workers=0)
    got = take(loader, 12)
    state = loader.checkpoint()
    loader.close()
    assert_streams_equal(want, got, f"loader ({tail})")
    with build().iterate(restore=state) as it:
        assert_streams_equal(_plain(build, 18)[12:], take(it, 6), f"resumed ({tail})")


def test_recreating_the_loader_iterator_mid_stream_changes_nothing():
    def build():
        src = StaticMixtureWorkSource({"a": list(range(40))}, chunk_size=4, seed=1)
        return (
            Pipeline(src, canonical_replicas=1, seed=3, flush_every_k_chunks=2)
            .fetch()
            .map(varlen, name="tok")
            .shuffle(4)
        )

    want = _plain(build, 30)
    loader = build().dataloader(num_workers=0)
    got = []
    for n in (1, 2, 5, 7, 15):  # a new iterator each time, continuing the stream
        got += take(iter(loader), n)
    loader.close()
    assert_streams_equal(want, got, "re-created iterators")


def _finite():
    src = StaticMixtureWorkSource({"a": list(range(12))}, chunk_size=2, seed=1, num_epochs=1)
    return Pipeline(src, canonical_replicas=2, seed=3).fetch().map(varlen, name="tok").split(8)


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_loader_checkpoint_after_a_workers_lanes_ended_restores(workers):
    want = _plain(_finite, 1000)
    for cut in range(len(want) - 8, len(want) + 1):
        loader = _finite().dataloader(num_workers=workers)
        got = take(loader, cut)
        state = loader.checkpoint()
        loader.close()
        assert_streams_equal(want[:cut], got, f"W={workers} head to {cut}")
        with _finite().iterate(restore=state) as it:
            assert_streams_equal(want[cut:], take(it, 1000), f"W={workers} resume at {cut}")


# -- property: the loader is the plain stream, also across re-created iterators and resumes --


@st.composite
def cases(draw):
    lanes = draw(st.sampled_from([1, 2, 4]))
    return dict(
        chunk=draw(st.sampled_from([1, 2, 5])),
        lanes=lanes,
        ops=draw(st.sampled_from(["batch", "filter_batch", "pack_shuffle", "records"])),
        finite=draw(st.booleans()),
        prefetch=draw(st.sampled_from([0, 2])),
        workers=draw(st.sampled_from([w for w in (0, 0, 1, 2) if lanes % max(w, 1) == 0])),
        pieces=draw(st.lists(st.integers(1, 9), min_size=1, max_size=4)),
        resume_workers=draw(st.sampled_from([0, 1])),
    )


def case_pipeline(c: dict) -> Pipeline:
    src = source(c["chunk"], num_epochs=1 if c["finite"] else None)
    k = 1 if c["ops"] == "pack_shuffle" else None
    pipe = (
        Pipeline(
            src,
            canonical_replicas=c["lanes"],
            seed=5,
            prefetch=c["prefetch"],
            flush_every_k_chunks=k,
        )
        .fetch()
        .map(byte_tokenize, name="tok")
    )
    if c["ops"] == "filter_batch":
        pipe = pipe.filter(drop_some, name="drop")
    if c["ops"] == "pack_shuffle":
        return pipe.split(32).pack(32, bins=2).shuffle(3).batch(2, drop_last=False)
    if c["ops"] == "records":
        return pipe.split(16).map(lambda p: {"input_ids": p["input_ids"]}, name="strip")
    return pipe.split(32).batch(2, drop_last=False, pad_to="longest")


@pytest.mark.slow
@settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(c=cases())
def test_property_loader_equals_plain_iteration(c):
    build = lambda: case_pipeline(c)  # noqa: E731
    n = sum(c["pieces"])
    want = _plain(build, n + 6)
    loader = build().dataloader(num_workers=c["workers"])
    got = []
    for piece in c["pieces"]:
        got += take(iter(loader), piece)
    state = loader.checkpoint()
    loader.close()
    assert_streams_equal(want[: len(got)], got, f"loader {c}")
    assert len(got) == min(n, len(want))
    resumed = build().dataloader(num_workers=c["resume_workers"], restore=state)
    tail = take(resumed, 6)
    resumed.close()
    assert_streams_equal(want[len(got) : len(got) + 6], tail, f"resumed {c}")


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_loader_stats_sum_the_workers_operator_counters(workers):
    from helpers import reference_pipeline

    pipe = reference_pipeline()
    loader = pipe.dataloader(num_workers=workers)
    it = iter(loader)
    for _ in range(40):
        next(it)
    s = loader.stats()
    loader.close()
    names = [op.name for op in pipe.compile().ops]
    assert list(s["operators"]) == names
    ops = s["operators"]
    # every worker shipped its counters (with its first batch, then every 16th)
    assert ops["fetch"]["records_in"] > 0 and ops["batch"]["records_out"] >= 40 // 2
    assert ops["tokenize"]["records_in"] == ops["tokenize"]["records_out"]
    assert 0 <= s["padding_ratio"] < 1 and s["outputs"] == 40 and s["outputs_per_s"] > 0
