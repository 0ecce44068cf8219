"""Running pipelines: contract violations, worker errors, close(), finite streams,
checkpoint/restore edge cases, pickling and stats()."""

from __future__ import annotations

import pickle
import threading
from collections import Counter

import numpy as np
import pytest
from helpers import CODE, PROSE, byte_tokenize, reference_pipeline, source

from zephon_core import (
    ContractViolation,
    LifecycleError,
    Operator,
    OpTraits,
    Pipeline,
    PipelineError,
    SampleCursor,
)
from zephon_core.testing import assert_resume_equivalent, assert_streams_equal, take

ALL_DOCS = {d["id"]: d["text"] for d in PROSE + CODE}


# -- operator contract ------------------------------------------------------------------


class Hoarder(Operator):
    """Breaks the contract: its flush keeps the last record (which the fresh instance the
    lane gets after the flush then never sees: the record is lost)."""

    traits = OpTraits(preserves_cursor_order=False)

    def __init__(self):
        self.name = "hoarder"
        self.buf = []

    def process(self, record):
        self.buf.append(record)
        return []

    def flush(self):
        held = self.buf
        self.buf = held[-1:]
        return held[:-1]


@pytest.mark.parametrize("prefetch", [0, 2])
def test_a_flush_that_loses_a_record_is_a_contract_violation(prefetch):
    pipe = (
        Pipeline(source(), canonical_replicas=2, flush_every_k_chunks=2, seed=1, prefetch=prefetch)
        .fetch()
        .then(Hoarder())
    )
    with pytest.raises(ContractViolation) as e:
        for _ in range(10_000):
            next(iter(pipe))
    pipe.close()
    assert "'hoarder'" in str(e.value)
    assert "lost offsets" in str(e.value) and "flush()" in str(e.value)


class Boom(Operator):
    """Raises on one specific record of lane 0."""

    traits = OpTraits(preserves_cursor_order=True, stateless=False)
    target = SampleCursor(0, 1, 3, 0)

    def __init__(self, name="boom", parallelism=1, stateless=False):
        self.name = name
        self.parallelism = parallelism
        if stateless:
            self.traits = OpTraits(preserves_cursor_order=True, stateless=True)

    def process(self, record):
        if record.cursor == self.target:
            raise ValueError("kaput")
        return [record]


@pytest.mark.parametrize("prefetch", [0, 3])
@pytest.mark.parametrize("runner", ["inline", "threads"])
def test_operator_error_is_reraised_in_the_consumer_with_operator_and_cursor(prefetch, runner):
    op = Boom(parallelism=2, stateless=True) if runner == "threads" else Boom()
    pipe = Pipeline(source(), canonical_replicas=2, seed=1, prefetch=prefetch).fetch().then(op)
    assert f"runner={runner}" in pipe.explain()
    outputs = 0
    with pytest.raises(PipelineError) as e:
        for _ in range(10_000):
            next(iter(pipe))
            outputs += 1
    pipe.close()
    msg = str(e.value)
    assert "'boom'" in msg
    assert "kaput" in msg
    assert isinstance(e.value.__cause__, ValueError)
    assert str(tuple(Boom.target)) in msg, f"cursor not named: {msg}"
    assert outputs < 10_000


def test_source_error_is_a_pipeline_error():
    class BadSpec:
        component_names = ("a",)
        weights = (1.0,)

        def open_lane(self, lane, num_lanes, seed):
            class Lane:
                def next_chunk(self):
                    raise OSError("disk gone")

                def state_dict(self):
                    return {}

                def load_state_dict(self, s):
                    pass

            return Lane()

        def read(self, component, rows):
            return rows

        def describe(self):
            return {"class": "BadSpec"}

    pipe = Pipeline(BadSpec(), prefetch=0).fetch()
    with pytest.raises(PipelineError, match="disk gone"):
        next(iter(pipe))
    pipe.close()


# -- close(), context manager -----------------------------------------------------------


def _live_pumps(before: set[threading.Thread]) -> list[threading.Thread]:
    return [
        t
        for t in threading.enumerate()
        if t.name == "zephon-pump" and t.is_alive() and t not in before
    ]


def _pumping(n: int):
    """A reference pipeline iterated ``n`` outputs: (pipeline, iterator, its pump thread)."""
    pipe = reference_pipeline(prefetch=3)
    it = iter(pipe)
    for _ in range(n):
        next(it)
    return pipe, it, it.run.pump._thread


def test_close_is_idempotent_and_stops_the_pump_thread():
    before = set(threading.enumerate())
    pipe, it, pump_thread = _pumping(20)
    assert pump_thread.is_alive()
    assert _live_pumps(before) == [pump_thread]
    pipe.close()
    assert not pump_thread.is_alive(), "close() must join the pump thread"
    pipe.close()  # idempotent
    pipe.close()
    assert _live_pumps(before) == []
    with pytest.raises(LifecycleError, match="closed"):  # never a silent end of stream
        next(it)


def test_pumps_left_running_are_stopped_at_interpreter_exit():
    """A program that never closes its stream: the exit hook stops and joins its pump
    (a daemon thread left inside native code can abort the interpreter's teardown)."""
    from zephon_core.engine import pump

    before = set(threading.enumerate())
    pipe, it, pump_thread = _pumping(5)
    assert pump_thread in _live_pumps(before) and it.run.pump in pump._live
    pump.stop_live_pumps()  # what atexit runs
    assert not pump_thread.is_alive() and it.run.pump not in pump._live
    pipe.close()


def test_close_before_iterating_and_without_pump():
    reference_pipeline().close()
    pipe = reference_pipeline(prefetch=0)
    it = iter(pipe)
    take(it, 5)
    pipe.close()
    pipe.close()
    assert it.closed and it.run.closed


def test_context_manager_closes():
    before = set(threading.enumerate())
    with reference_pipeline(prefetch=2) as pipe:
        out = take(pipe, 8)
        pump_thread = iter(pipe).run.pump._thread
        assert pump_thread.is_alive()
    assert len(out) == 8
    assert not pump_thread.is_alive()
    assert _live_pumps(before) == []


def test_context_manager_closes_on_error():
    before = set(threading.enumerate())
    with pytest.raises(RuntimeError, match="user bug"):
        with reference_pipeline(prefetch=2) as pipe:
            take(pipe, 3)
            raise RuntimeError("user bug")
    assert _live_pumps(before) == []


# -- finite streams ---------------------------------------------------------------------


def finite_records(prefetch: int = 2) -> Pipeline:
    return (
        Pipeline(source(num_epochs=1), canonical_replicas=4, seed=3, prefetch=prefetch)
        .fetch()
        .map(byte_tokenize, name="tokenize")
        .split(max_len=64)
        .shuffle(buffer_size=8)
    )


def _fragments(text: str, n: int = 64) -> list[bytes]:
    b = text.encode()
    return [b[i : i + n] for i in range(0, len(b), n)]


@pytest.mark.parametrize("prefetch", [0, 2])
def test_finite_stream_ends_and_delivers_every_token_exactly_once(prefetch):
    pipe = finite_records(prefetch)
    it = iter(pipe)
    got: dict[str, Counter] = {}
    n = 0
    with pytest.raises(StopIteration):
        for _ in range(100_000):
            rec = next(it)
            got.setdefault(rec["id"], Counter())[rec["input_ids"].astype(np.uint8).tobytes()] += 1
            n += 1
    with pytest.raises(StopIteration):
        next(it)  # stays ended
    pipe.close()
    assert set(got) == set(ALL_DOCS), "some documents never arrived"
    for doc_id, text in ALL_DOCS.items():
        assert got[doc_id] == Counter(_fragments(text)), doc_id
    assert n == sum(len(_fragments(t)) for t in ALL_DOCS.values())


def test_finite_packed_batches_carry_every_token_exactly_once():
    pipe = (
        Pipeline(
            source(num_epochs=1), canonical_replicas=2, seed=3, prefetch=2, flush_every_k_chunks=2
        )
        .fetch()
        .map(byte_tokenize, name="tokenize")
        .split(max_len=96)
        .pack(seq_len=96, bins=3)
        .shuffle(buffer_size=4)
        .batch(batch_size=3, drop_last=False, attention="mask_2d")  # a 2-D padding mask
    )
    tokens = Counter()
    n_tokens = 0
    for batch in pipe:
        mask = batch["attention_mask"].bool()
        vals = batch["input_ids"][mask].numpy()
        n_tokens += len(vals)
        tokens.update(vals.tolist())
        assert (batch["labels"][~mask] == -100).all()
    pipe.close()
    expected = Counter()
    for text in ALL_DOCS.values():
        expected.update(text.encode())
    assert n_tokens == sum(expected.values())
    assert tokens == expected


def test_checkpoint_after_the_end_restores_to_an_exhausted_iterator():
    pipe = finite_records()
    outs = list(pipe)
    state = pipe.checkpoint()
    pipe.close()
    assert outs
    assert all(ls["exhausted"] for ls in state["lanes"])
    assert all(ls["chunks"] == [] for ls in state["lanes"])
    again = finite_records()
    again.load_state_dict(state)
    with pytest.raises(StopIteration):
        next(iter(again))
    assert again.chunks_replayed == 0
    again.close()


def test_checkpoint_after_the_last_output_before_stop_iteration_restores_to_empty():
    ref = finite_records()
    total = len(list(ref))
    ref.close()
    pipe = finite_records()
    take(pipe, total)  # every output taken, StopIteration not yet observed
    state = pipe.checkpoint()
    pipe.close()
    again = finite_records()
    again.load_state_dict(state)
    assert list(again) == []
    again.close()


def test_finite_stream_resumes_exactly_mid_stream():
    ref = finite_records()
    total = len(list(ref))
    ref.close()
    rep = assert_resume_equivalent(
        finite_records, cut_points=[1, total // 3, total - 1], total=total + 10
    )
    assert rep.total == total


# -- checkpoint / restore edge cases ----------------------------------------------------


def test_checkpoint_before_iterating_restores_to_the_same_stream():
    fresh = reference_pipeline()
    expected = take(fresh, 30)
    fresh.close()

    pipe = reference_pipeline()
    state = pipe.checkpoint()
    assert state["position"] == 0
    assert all(ls["chunks"] == [] and ls["cursor"] is None for ls in state["lanes"])
    assert_streams_equal(expected, take(pipe, 30), "same pipeline after an early checkpoint")
    pipe.close()

    restored = reference_pipeline()
    restored.load_state_dict(state)
    assert_streams_equal(expected, take(restored, 30), "restored from position 0")
    restored.close()


@pytest.mark.parametrize("prefetch", [0, 3])
def test_load_state_dict_after_close_restarts_from_the_state(prefetch):
    """A live iterator does not follow a restore (load_state_dict refuses, naming the
    order); once it is closed, the same pipeline restarts from the loaded state."""
    before = set(threading.enumerate())
    pipe = reference_pipeline(prefetch=prefetch)
    take(pipe, 25)
    state = pipe.checkpoint()
    expected = take(pipe, 30)
    more = take(pipe, 10)
    assert len(more) == 10
    with pytest.raises(LifecycleError, match="before iter"):
        pipe.load_state_dict(state)
    pipe.close()
    pipe.load_state_dict(state)
    assert_streams_equal(expected, take(pipe, 30), "after load_state_dict on the same pipeline")
    pipe.close()
    pipe.load_state_dict(state)  # twice in a row
    assert_streams_equal(expected[:5], take(pipe, 5), "second restore")
    pipe.close()
    assert _live_pumps(before) == []


def test_pickle_before_and_after_iteration():
    pipe = reference_pipeline()
    blob_before = pickle.dumps(pipe)
    expected = take(pipe, 12)
    blob_after = pickle.dumps(pipe)
    state = pipe.checkpoint()
    pipe.close()

    p1 = pickle.loads(blob_before)
    assert_streams_equal(expected, take(p1, 12), "unpickled before iteration")
    p1.close()
    # A Pipeline pickles as its description: the copy starts a run of its own.
    p2 = pickle.loads(blob_after)
    assert_streams_equal(expected, take(p2, 12), "unpickled after iteration")
    p2.close()

    # A restored (not yet iterated) pipeline pickles with its restore point, as
    # when it is sent to DataLoader workers after load_state_dict().
    fresh = reference_pipeline()
    fresh.load_state_dict(state)
    tail = take(fresh, 5)
    fresh.close()
    restored = reference_pipeline()
    restored.load_state_dict(state)
    p3 = pickle.loads(pickle.dumps(restored))
    restored.close()
    assert_streams_equal(tail, take(p3, 5), "unpickled after load_state_dict")
    p3.close()


STATS_KEYS = {
    "outputs",
    "outputs_per_s",
    "position",
    "inflight_chunks",
    "queue_depths",
    "chunks_replayed",
    "mixture",
    "padding_ratio",
}


def test_stats_keys_and_values():
    pipe = reference_pipeline(prefetch=2)
    take(pipe, 40)
    s = pipe.stats()
    state = pipe.checkpoint()
    pipe.close()
    assert STATS_KEYS <= set(s)
    assert s["outputs"] == 40 and s["position"] == 40
    assert s["chunks_replayed"] == 0
    assert set(s["inflight_chunks"]) == {0, 1, 2, 3}
    assert all(
        isinstance(v, int) and v >= len(ls["chunks"])
        for v, ls in zip(s["inflight_chunks"].values(), state["lanes"])
    )
    mix = s["mixture"]
    assert set(mix) == {"prose", "code"}
    assert abs(sum(m["token_share"] for m in mix.values()) - 1) < 1e-9
    assert abs(sum(m["document_share"] for m in mix.values()) - 1) < 1e-9
    # document weights: the target is stated in documents, never as a token share
    assert mix["prose"]["document_share_target"] == pytest.approx(0.7)
    assert "token_share_target" not in mix["prose"]
    assert mix["code"]["epochs"] == pytest.approx(mix["code"]["documents"] / 90)
    assert 0 <= s["padding_ratio"] < 1
    assert s["outputs_per_s"] > 0


def test_stats_count_scheduled_documents_and_delivered_tokens():
    with reference_pipeline(prefetch=0, attention="mask_2d") as pipe:
        outputs = take(pipe, 30)
        mix = pipe.stats()["mixture"]
        state = pipe.checkpoint()
    # documents: what the lanes' sources scheduled (the inflight chunks included)
    docs = sum(sum(ls["source"]["cursors"]) for ls in state["lanes"])
    assert sum(m["documents"] for m in mix.values()) == docs
    # tokens: what the delivered outputs carry, per dataset
    delivered = [sum(ls["tokens"][i] for ls in state["lanes"]) for i in range(2)]
    assert [mix["prose"]["tokens"], mix["code"]["tokens"]] == delivered
    assert sum(delivered) == sum(int(o["attention_mask"].sum()) for o in outputs)


def test_stats_after_restore_reports_replayed_chunks():
    pipe = reference_pipeline()
    take(pipe, 50)
    state = pipe.checkpoint()
    pipe.close()
    again = reference_pipeline()
    again.load_state_dict(state)
    take(again, 1)
    s = again.stats()
    again.close()
    assert s["chunks_replayed"] == sum(len(ls["chunks"]) for ls in state["lanes"]) > 0
    assert s["position"] == 51


def test_stats_report_records_per_second_per_operator():
    """docs/design.md §5: stats() has records/s per operator (keyed by operator name)."""
    pipe = reference_pipeline(prefetch=0)
    take(pipe, 20)
    s = pipe.stats()
    pipe.close()
    names = {"fetch", "tokenize", "split", "pack", "shuffle", "ensure_mixture", "batch"}
    per_op = [v for v in s.values() if isinstance(v, dict) and names <= set(v)]
    assert per_op, f"no per-operator counters in stats(): keys {sorted(s)}"
