"""map: a 1:1 payload transform, optionally batched; cursor order and provenance kept."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from opkit import bind, cursors, rec, run, token_source

from zephon_core import Pipeline
from zephon_core.errors import ContractViolation, PipelineError
from zephon_core.ops import MapOp


def _double(p):
    return {**p, "input_ids": p["input_ids"] * 2}


def test_process_keeps_identity_and_provenance():
    op = bind(MapOp(_double))
    r = rec(3, 2, [1, 2, 3], child=1, last=False, comp=1)
    (out,) = op.process(r)
    assert out.cursor == r.cursor and out.contributors == r.contributors
    assert out.payload["input_ids"].tolist() == [2, 4, 6]
    assert r.payload["input_ids"].tolist() == [1, 2, 3]  # input left alone


def test_process_many_unbatched_calls_per_record():
    calls = []
    op = bind(MapOp(lambda p: calls.append(1) or {"input_ids": p["input_ids"] + 1}))
    recs = [rec(0, i, [i]) for i in range(5)]
    out = op.process_many(recs)
    assert len(calls) == 5
    assert [r.payload["input_ids"].tolist() for r in out] == [[i + 1] for i in range(5)]
    assert cursors(out) == cursors(recs)


def test_batched_gets_the_whole_microbatch_once():
    seen = []

    def fn(payloads):
        seen.append(len(payloads))
        return [{"n": len(p["input_ids"])} for p in payloads]

    op = bind(MapOp(fn, batched=True))
    recs = [rec(0, i, i + 1) for i in range(6)]
    out = op.process_many(recs)
    assert seen == [6]
    assert [r.payload for r in out] == [{"n": i + 1} for i in range(6)]
    assert cursors(out) == cursors(recs)
    assert [r.contributors for r in out] == [r.contributors for r in recs]
    # process() on one record of a batched map calls fn with a list of one
    (single,) = op.process(rec(1, 0, 4))
    assert seen[-1] == 1 and single.payload == {"n": 4}


@pytest.mark.parametrize("delta", [-1, +1])
def test_batched_not_one_to_one_is_a_contract_violation(delta):
    op = bind(
        MapOp(
            lambda ps: list(ps) + [ps[0]] if delta > 0 else list(ps)[:-1], batched=True, name="tok"
        )
    )
    with pytest.raises(ContractViolation, match="'tok'.*1:1"):
        op.process_many([rec(0, i, 2) for i in range(3)])


def test_batched_violation_through_pipeline_names_the_operator():
    def drop_one(ps):
        return list(ps)[1:]

    pipe = Pipeline(token_source(), prefetch=0).fetch().map(drop_one, batched=True, name="dropper")
    with pytest.raises((ContractViolation, PipelineError)) as ei:
        run(pipe, 3)
    err = ei.value
    assert isinstance(err, ContractViolation) or isinstance(err.__cause__, ContractViolation)
    assert "dropper" in str(err)


def test_traits():
    assert MapOp.traits.preserves_cursor_order and MapOp.traits.stateless


def _strip(p):
    return {"n": int(len(p["input_ids"])), "id": p["id"]}


def _strip_batched(ps):
    return [_strip(p) for p in ps]


@pytest.mark.parametrize("parallelism", [1, 3])
def test_pipeline_batched_equals_unbatched_and_is_called_per_chunk(parallelism):
    calls = []
    lock = threading.Lock()

    def counted(ps):
        with lock:
            calls.append(len(ps))
        return _strip_batched(ps)

    src_kw = dict(chunk_size=5)
    plain = run(
        Pipeline(token_source(**src_kw), canonical_replicas=2, seed=2)
        .fetch(parallelism)
        .map(_strip, parallelism=parallelism),
        50,
    )
    batched = run(
        Pipeline(token_source(**src_kw), canonical_replicas=2, seed=2)
        .fetch(parallelism)
        .map(counted, parallelism=parallelism, batched=True),
        50,
    )
    assert plain == batched
    assert calls and all(n == 5 for n in calls)  # one call per chunk (5 pointers each)


def test_pipeline_output_is_the_mapped_fetch_output():
    base = run(Pipeline(token_source(), canonical_replicas=3, seed=2).fetch(), 40)
    mapped = run(
        Pipeline(token_source(), canonical_replicas=3, seed=2).fetch().map(_strip, parallelism=2),
        40,
    )
    assert mapped == [_strip(p) for p in base]
    assert all(isinstance(p["n"], int) for p in mapped)
    assert np.all([p["n"] > 0 for p in mapped])
