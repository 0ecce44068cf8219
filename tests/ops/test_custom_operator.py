"""User-defined operators through pipe.then(op), and what breaking the contract does.

A well-behaved buffering operator (preserves_cursor_order=False, state in its per-lane
instance, a flush that emits everything, randomness keyed by seed/lane/replayed
cursor) passes assert_resume_equivalent. One whose RNG survives a flush (its
``for_lane`` shares one instance) must be caught -- as ReplayDivergence or
ResumeMismatch, never silently -- and one whose flush keeps a record loses it, which
the runner reports as a ContractViolation.
"""

from __future__ import annotations

import numpy as np
import pytest
from opkit import run, token_source

from zephon_core import Operator, OpTraits, Pipeline
from zephon_core.errors import ContractViolation, ReplayDivergence
from zephon_core.records import Record
from zephon_core.rng import generator
from zephon_core.testing import ResumeMismatch, assert_resume_equivalent, take


class LengthSortBuffer(Operator):
    """Holds up to ``size`` records and releases the shortest (ties: cursor). Its state is
    the instance's own: each lane gets an instance, and a fresh one after every flush."""

    traits = OpTraits(preserves_cursor_order=False)

    def __init__(self, size: int = 4, name: str = "length_sort"):
        self.size = size
        self.name = name
        self._held: list[Record] = []

    @staticmethod
    def _key(r: Record):
        return (len(r.payload["input_ids"]), tuple(r.cursor))

    def process(self, record):
        held = self._held
        held.append(record)
        if len(held) < self.size:
            return []
        held.sort(key=self._key)
        return [held.pop(0)]

    def flush(self):
        held, self._held = sorted(self._held, key=self._key), []
        return held

    def describe(self):
        return {"op": "length_sort", "name": self.name, "size": self.size}


class SeededReservoir(Operator):
    """A buffer shuffle keyed by (operator seed, lane, its first record's cursor)."""

    traits = OpTraits(preserves_cursor_order=False)

    def __init__(self, size: int = 5, name: str = "reservoir"):
        self.size = size
        self.name = name
        self._held: list[Record] = []
        self._rng: np.random.Generator | None = None

    def _make_rng(self, record):
        return generator(self.ctx.seed, self.ctx.lane, *record.cursor)

    def process(self, record):
        if self._rng is None:
            self._rng = self._make_rng(record)
        self._held.append(record)
        if len(self._held) <= self.size:
            return []
        return [self._held.pop(int(self._rng.integers(len(self._held))))]

    def flush(self):
        held, self._held = self._held, []
        return [held[i] for i in self._rng.permutation(len(held))] if held else []


class KeyedTokenDropout(Operator):
    """Stateless and order-keeping (runs on worker threads): drops ~10% of the tokens of
    each record with randomness keyed by (operator seed, cursor) only."""

    traits = OpTraits(preserves_cursor_order=True, stateless=True)

    def __init__(self, parallelism: int = 3, name: str = "token_dropout"):
        self.parallelism = parallelism
        self.name = name

    def process(self, record):
        ids = record.payload["input_ids"]
        keep = generator(self.ctx.seed, *record.cursor).random(len(ids)) >= 0.1
        return [record.with_payload({**record.payload, "input_ids": ids[keep]})]


class StickyRngReservoir(SeededReservoir):
    """BROKEN: ``for_lane`` hands out the template itself, so one instance (and its RNG,
    created once) survives every flush instead of the lane getting a fresh one."""

    def __init__(self, size: int = 5, name: str = "sticky_reservoir"):
        super().__init__(size, name)

    def for_lane(self, lane):
        return self

    def _make_rng(self, record):
        return generator(self.ctx.seed)


class LeakyFlush(LengthSortBuffer):
    """BROKEN: flush keeps the last record (and the instance is dropped after it)."""

    def flush(self):
        held = sorted(self._held, key=self._key)
        self._held = held[-1:]
        return held[:-1]


class PairUp(Operator):
    """BROKEN: releases records in pairs and keeps an odd one over flushes (as
    ``batch(drop_last=True)`` keeps its partial batch), but its ``finish()`` -- the
    default, ``flush()`` -- drops that record without a tombstone at the end."""

    traits = OpTraits(preserves_cursor_order=False, holds_across_flush=True)

    def __init__(self, name: str = "pair_up"):
        self.name = name
        self._odd: list[Record] = []

    def process(self, record):
        if not self._odd:
            self._odd = [record]
            return []
        pair, self._odd = [*self._odd, record], []
        return pair

    def held(self):
        return list(self._odd)


def _tokenize_ids(p):
    return {"input_ids": p["input_ids"], "id": p["id"]}


def build(op_factory, *, lanes=1, k=1, prefetch=0, chunk_size=4, batch=False):
    def fn():
        op = op_factory()
        monotone = op.traits.preserves_cursor_order
        pipe = (
            Pipeline(
                token_source(chunk_size=chunk_size),
                canonical_replicas=lanes,
                flush_every_k_chunks=None if monotone else k,
                seed=21,
                prefetch=prefetch,
            )
            .fetch()
            .map(_tokenize_ids)
            .then(op)
        )
        return pipe.batch(2, drop_last=True) if batch else pipe

    return fn


@pytest.mark.parametrize("factory", [LengthSortBuffer, SeededReservoir, KeyedTokenDropout])
@pytest.mark.parametrize(
    ("lanes", "k", "prefetch", "batch"), [(1, 1, 0, False), (3, 2, 2, False), (2, 3, 1, True)]
)
def test_good_custom_operator_resumes_exactly(factory, lanes, k, prefetch, batch):
    fn = build(factory, lanes=lanes, k=k, prefetch=prefetch, batch=batch)
    total = 60
    out = run(fn(), total)
    assert len(out) == total
    report = assert_resume_equivalent(fn, [0, 1, 7, 20, 33, 45, 59, total], total)
    # bounded replay; a pump thread may have pulled up to ``prefetch`` outputs ahead of
    # the consumer (their chunks are replayed too): how many depends on thread timing
    assert max(report.chunks_replayed) <= lanes * (k + 2 + prefetch)


def _next_ids(batch):
    return {**batch, "input_ids": batch["input_ids"] + 1}


@pytest.mark.parametrize("factory", [LengthSortBuffer, SeededReservoir])
def test_buffering_operator_then_batch_then_parallel_map(factory):
    """batch(drop_last=True) keeps its partial batch over a flush while the parallel map
    after it pulls the next segment through it: nothing is reported lost, and cuts
    resume exactly."""

    def fn():
        # 3 records per epoch: batch(2) keeps one over every other flush
        pipe = build(factory, lanes=2, k=1, chunk_size=3, batch=True)()
        return pipe.map(_next_ids, parallelism=3, name="after_batch")

    assert fn().compile().stages[-1].runner == "threads"
    report = assert_resume_equivalent(fn, [0, 1, 6, 13, 22, 35], 45)
    assert report.total == 45


def test_stateless_custom_operator_runs_on_threads():
    plan = build(KeyedTokenDropout, k=2)().compile()
    assert any(
        st.runner == "threads" and any(op.name == "token_dropout" for op in st.ops)
        for st in plan.stages
    )


def test_good_custom_operator_really_reorders():
    plain = [p["id"] for p in run(Pipeline(token_source(), seed=21).fetch(), 40)]
    for factory in (LengthSortBuffer, SeededReservoir):
        got = [p["id"] for p in run(build(factory, k=2)(), 40)]
        assert got != plain
        assert sorted(got[:8]) == sorted(plain[:8])  # one epoch = 2 chunks of 4


def test_custom_operator_instance_is_not_shared_between_runs():
    op = SeededReservoir()
    pipe = Pipeline(token_source(), seed=21, flush_every_k_chunks=1).fetch().then(op)
    a = [p["id"] for p in run(pipe, 30)]
    pipe2 = Pipeline(token_source(), seed=21, flush_every_k_chunks=1).fetch().then(op)
    b = [p["id"] for p in run(pipe2, 30)]
    assert a == b
    assert op._held == [] and not hasattr(op, "ctx")  # the pipeline worked on its own copies


@pytest.mark.parametrize("cut", [13, 22, 37, 50])
@pytest.mark.parametrize(("lanes", "prefetch"), [(1, 0), (1, 2), (2, 0)])
def test_rng_surviving_reset_is_caught(cut, lanes, prefetch):
    fn = build(StickyRngReservoir, lanes=lanes, k=1, prefetch=prefetch)
    # uninterrupted runs are perfectly deterministic ...
    assert [p["id"] for p in run(fn(), 60)] == [p["id"] for p in run(fn(), 60)]
    # ... but a resume from a later epoch starts the RNG over: this must not pass
    with pytest.raises((ReplayDivergence, ResumeMismatch)):
        assert_resume_equivalent(fn, [cut], 60)


class StickyRngDrop(Operator):
    """BROKEN, order-keeping: drops half the records with an RNG that is never re-keyed
    (a counter over the whole run), so a replay starting mid-stream draws other numbers."""

    traits = OpTraits(preserves_cursor_order=True)

    def __init__(self, name: str = "sticky_drop"):
        self.name = name
        self._rng: np.random.Generator | None = None

    def process(self, record):
        if self._rng is None:
            self._rng = generator(5, self.ctx.lane)
        return [record.to_tombstone() if self._rng.random() < 0.5 else record]


@pytest.mark.parametrize("cut", [7, 13, 22, 31])
def test_order_keeping_rng_counter_is_caught(cut):
    def fn():
        return Pipeline(token_source(), seed=3, prefetch=0).fetch().then(StickyRngDrop())

    assert [p["id"] for p in run(fn(), 60)] == [p["id"] for p in run(fn(), 60)]
    # depending on the cut the replay either produces other records after the target
    # (ResumeMismatch) or drops the target itself (ReplayDivergence) -- never silence,
    # and always one of the two documented error types
    with pytest.raises((ReplayDivergence, ResumeMismatch)):
        assert_resume_equivalent(fn, [cut], 60)


def test_flush_that_keeps_data_is_a_contract_violation():
    with pytest.raises(ContractViolation, match="length_sort"):
        run(build(LeakyFlush, k=1)(), 40)


def test_record_held_at_the_end_is_a_contract_violation():
    """What a holds_across_flush operator still holds when the stream ends is lost: it
    must emit or tombstone it in finish() (41 + 30 rows: one is left at the end)."""
    pipe = (
        Pipeline(token_source(n_a=41, num_epochs=1), flush_every_k_chunks=2, seed=3)
        .fetch()
        .then(PairUp())
    )
    with pytest.raises(ContractViolation, match=r"end of the stream.*finish\(\).*pair_up"):
        run(pipe, 10_000)


# -- divergence must surface as ReplayDivergence ------------------------------------

_DROP: set[str] = set()


@pytest.fixture(autouse=True)
def _clear_drop():
    _DROP.clear()
    yield
    _DROP.clear()


def _not_dropped(p):
    return p["id"] not in _DROP


def _checkpoint_then_change_data(build_fn, n):
    """Consume n outputs, checkpoint, then make the data drop the last delivered row."""
    pipe = build_fn()
    try:
        out = take(pipe, n)
        state = pipe.checkpoint()
    finally:
        pipe.close()
    _DROP.add(out[-1]["id"])
    resumed = build_fn()
    resumed.load_state_dict(state)
    return resumed


@pytest.mark.parametrize("prefetch", [0, 2])
def test_divergence_epoch_based_is_typed(prefetch):
    def fn():
        return (
            Pipeline(token_source(), seed=3, prefetch=prefetch, flush_every_k_chunks=2)
            .fetch()
            .filter(_not_dropped)
            .shuffle(3)
        )

    resumed = _checkpoint_then_change_data(fn, 10)
    with pytest.raises(ReplayDivergence, match="lane 0"):
        run(resumed, 5)


@pytest.mark.parametrize("prefetch", [0, 2])
def test_divergence_monotone_is_typed(prefetch):
    def fn():
        return Pipeline(token_source(), seed=3, prefetch=prefetch).fetch().filter(_not_dropped)

    resumed = _checkpoint_then_change_data(fn, 10)
    with pytest.raises(ReplayDivergence, match="lane 0"):
        run(resumed, 5)


def test_divergence_at_end_of_stream_is_typed():
    def fn():
        return (
            Pipeline(token_source(n_a=6, n_b=5, num_epochs=1), seed=3, prefetch=0)
            .fetch()
            .filter(_not_dropped)
        )

    n = len(run(fn(), 1000))
    resumed = _checkpoint_then_change_data(fn, n)
    with pytest.raises(ReplayDivergence, match="end of the stream"):
        run(resumed, 5)
