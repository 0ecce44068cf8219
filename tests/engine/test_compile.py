"""compile(): eviction mode, flush_every_k_chunks, replay filter placement,
explain() format and validation of bad pipelines."""

from __future__ import annotations

import warnings

import pytest
from helpers import byte_tokenize, source

from zephon_core import ConfigError, Operator, OpTraits, Pipeline
from zephon_core.engine.replay_filter import ReplayFilter
from zephon_core.ops import BatchOp


def base(**kw) -> Pipeline:
    kw.setdefault("canonical_replicas", 2)
    kw.setdefault("prefetch", 0)
    return Pipeline(source(), **kw)


def monotone(**kw) -> Pipeline:
    return base(**kw).fetch().map(byte_tokenize, name="tokenize").split(max_len=64)


def reordering(**kw) -> Pipeline:
    return monotone(**kw).pack(seq_len=64, bins=2)


class Reverser(Operator):
    """A custom reordering operator (holds two records, emits them swapped)."""

    traits = OpTraits(preserves_cursor_order=False)
    name = "reverser"

    def __init__(self):
        self.held = None

    def process(self, record):
        if self.held is not None:
            out, self.held = [record, self.held], None
            return out
        self.held = record
        return []

    def flush(self):
        out, self.held = ([self.held] if self.held is not None else []), None
        return out


# -- eviction mode and k ----------------------------------------------------------------


def test_all_order_keeping_operators_select_monotone_eviction():
    plan = monotone().batch(batch_size=2, seq_len=64).compile()
    assert plan.epoch_based is False
    assert plan.k == 0
    assert plan.ops[plan.replay_index].monotone is True


@pytest.mark.parametrize("tail", ["pack", "shuffle", "ensure_mixture", "custom"])
def test_any_reordering_operator_selects_epoch_based_eviction(tail):
    p = monotone()
    p = {
        "pack": lambda: p.pack(seq_len=64),
        "shuffle": lambda: p.shuffle(buffer_size=4),
        "ensure_mixture": lambda: p.ensure_mixture(),
        "custom": lambda: p.then(Reverser()),
    }[tail]()
    plan = p.batch(batch_size=2, seq_len=64).compile()
    assert plan.epoch_based is True
    assert plan.ops[plan.replay_index].monotone is False


def test_k_none_defaults():
    assert monotone().compile().k == 0
    assert reordering().compile().k == 4


def test_k_zero_on_non_monotone_is_a_config_error_naming_the_fix():
    with pytest.raises(ConfigError) as e:
        reordering(flush_every_k_chunks=0).compile()
    assert isinstance(e.value, ValueError)
    msg = str(e.value)
    assert "flush_every_k_chunks" in msg
    assert "positive" in msg


def test_positive_k_on_monotone_warns_and_is_forced_to_zero():
    with pytest.warns(UserWarning, match="flush_every_k_chunks") as rec:
        plan = monotone(flush_every_k_chunks=3).compile()
    assert any("forced to 0" in str(w.message) for w in rec)
    assert plan.k == 0
    assert plan.config["flush_every_k_chunks"] == 0


def test_positive_k_on_monotone_injects_no_sentinels_at_run_time():
    with pytest.warns(UserWarning):
        pipe = monotone(flush_every_k_chunks=1).batch(batch_size=2, seq_len=64)
        it = iter(pipe)
    for _ in range(40):
        next(it)
    st = pipe.checkpoint()
    pipe.close()
    assert all(ls["boundaries"] == [] for ls in st["lanes"])


def test_positive_k_on_non_monotone_is_kept_and_silent():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan = reordering(flush_every_k_chunks=3).compile()
    assert plan.k == 3


def test_k_sentinel_positions_are_multiples_of_k():
    pipe = reordering(flush_every_k_chunks=3)
    it = iter(pipe)
    seen_bounds, floors = set(), set()
    for i in range(1000):
        next(it)
        if i % 5:
            continue
        for ls in pipe.checkpoint()["lanes"]:
            seen_bounds.update(ls["boundaries"])
            floors.add(ls["floor"])
    pipe.close()
    assert seen_bounds and max(floors) > 0
    assert all(b % 3 == 0 for b in seen_bounds), sorted(seen_bounds)
    # epoch-based eviction only ever moves the floor onto a boundary
    assert all(f % 3 == 0 for f in floors), sorted(floors)


@pytest.mark.parametrize("k", [-1, 1.5, "2", True])
def test_invalid_k(k):
    with pytest.raises(ConfigError, match="flush_every_k_chunks"):
        reordering(flush_every_k_chunks=k).compile()


# -- replay filter placement ------------------------------------------------------------


def test_replay_filter_sits_right_before_batch():
    plan = reordering().ensure_mixture().batch(batch_size=2).compile()
    names = [op.name for op in plan.ops]
    assert names == [
        "fetch",
        "tokenize",
        "split",
        "pack",
        "ensure_mixture",
        "batch_replay_filter",
        "batch",
    ]
    assert isinstance(plan.ops[-2], ReplayFilter)
    assert plan.replay_index == len(plan.ops) - 2 and plan.batch_index == len(plan.ops) - 1
    assert sum(isinstance(op, ReplayFilter) for op in plan.ops) == 1


def test_replay_filter_before_batch_even_with_a_map_after_batch():
    plan = reordering().batch(batch_size=2).map(_identity, name="to_device").compile()
    assert [op.name for op in plan.ops][-3:] == ["batch_replay_filter", "batch", "to_device"]


def test_replay_filter_named_after_a_custom_batch_name():
    plan = reordering().then(BatchOp(2, name="collate")).compile()
    assert [op.name for op in plan.ops][-2:] == ["collate_replay_filter", "collate"]


def test_replay_filter_at_the_tail_named_after_the_last_op():
    plan = reordering().shuffle(buffer_size=4).compile()
    assert [op.name for op in plan.ops][-2:] == ["shuffle", "shuffle_replay_filter"]
    plan = base().fetch().map(byte_tokenize, name="tokenize").compile()
    assert [op.name for op in plan.ops] == ["fetch", "tokenize", "tokenize_replay_filter"]


def test_no_replay_filter_without_checkpointing():
    plan = reordering(checkpointing=False).batch(batch_size=2).compile()
    assert plan.replay_index is None and plan.batch_index == len(plan.ops) - 1
    assert not any(isinstance(op, ReplayFilter) for op in plan.ops)


def _identity(x):
    return x


# -- explain() --------------------------------------------------------------------------

SEED_EXPLAIN = """\
Stage[0] place=local runner=threads cap=8 mode=microbatches
  fetch@p4 -[in_q=16]-> tokenize@p4
  --[stage_out=16]-->
Stage[1] place=local runner=inline cap=1 mode=stream_items
  ensure_mixture@p1 -> batch_replay_filter@p1 -> batch@p1
  ==[final_prefetch=3]==> pipeline_end"""


def seed_pipeline() -> Pipeline:
    return (
        Pipeline(source(), canonical_replicas=8, seed=1234, prefetch=3, queue_size=16)
        .fetch(parallelism=4)
        .map(byte_tokenize, parallelism=4, name="tokenize")
        .ensure_mixture()
        .batch(batch_size=8)
    )


def test_explain_matches_the_seed_page_line_by_line():
    got = seed_pipeline().explain().splitlines()
    want = SEED_EXPLAIN.splitlines()
    for i, (g, w) in enumerate(zip(got, want)):
        assert g == w, f"line {i}: {g!r} != {w!r}"
    assert len(got) == len(want)


def test_explain_stage_structure_and_queues():
    text = (
        Pipeline(source(), canonical_replicas=2, prefetch=5, queue_size=7)
        .fetch(parallelism=2)
        .map(byte_tokenize, name="tokenize")
        .split(max_len=64)
        .shuffle(buffer_size=4)
    ).explain()
    lines = text.splitlines()
    assert lines[0].startswith("Stage[0] place=local runner=threads ")
    assert lines[0].endswith(" mode=microbatches")
    assert lines[1] == "  fetch@p2"
    assert lines[2] == "  --[stage_out=7]-->"
    assert lines[3] == "Stage[1] place=local runner=inline cap=1 mode=stream_items"
    assert lines[4] == ("  tokenize@p1 -> split@p1 -> shuffle@p1 -> shuffle_replay_filter@p1")
    assert lines[5] == "  ==[final_prefetch=5]==> pipeline_end"
    assert len(lines) == 6


def test_explain_single_inline_stage():
    text = base(prefetch=0).fetch().map(byte_tokenize, name="tokenize").explain()
    assert text.splitlines() == [
        "Stage[0] place=local runner=inline cap=1 mode=stream_items",
        "  fetch@p1 -> tokenize@p1 -> tokenize_replay_filter@p1",
        "  ==[final_prefetch=0]==> pipeline_end",
    ]


# -- bad pipelines ----------------------------------------------------------------------


def test_duplicate_operator_names():
    p = base().fetch().map(byte_tokenize).map(_identity)
    with pytest.raises(ConfigError) as e:
        p.compile()
    assert "'map'" in str(e.value) and "name=" in str(e.value)


class Stateful(Operator):
    traits = OpTraits(preserves_cursor_order=True, stateless=False)
    name = "counter"

    def __init__(self, parallelism=2):
        self.parallelism = parallelism

    def process(self, record):
        return [record]


def test_stateful_operator_with_parallelism_above_one():
    with pytest.raises(ConfigError) as e:
        base().fetch().then(Stateful(parallelism=2)).compile()
    msg = str(e.value)
    assert "'counter'" in msg and "parallelism=2" in msg and "parallelism=1" in msg


@pytest.mark.parametrize("p", [0, -1, 1.5, "2"])
def test_invalid_parallelism(p):
    with pytest.raises(ConfigError, match="parallelism"):
        base().fetch(parallelism=p).compile()


@pytest.mark.parametrize("after", ["shuffle", "pack", "custom_reorder", "stateful"])
def test_reordering_or_stateful_operator_after_batch(after):
    p = (
        base()
        .fetch()
        .map(byte_tokenize, name="tokenize")
        .split(max_len=64)
        .batch(batch_size=2, seq_len=64)
    )
    p = {
        "shuffle": lambda: p.shuffle(buffer_size=4),
        "pack": lambda: p.pack(seq_len=64),
        "custom_reorder": lambda: p.then(Reverser()),
        "stateful": lambda: p.then(Stateful(parallelism=1)),
    }[after]()
    with pytest.raises(ConfigError) as e:
        p.compile()
    assert "batch()" in str(e.value)


def test_two_batch_operators():
    p = (
        base()
        .fetch()
        .map(byte_tokenize, name="tokenize")
        .split(max_len=64)
        .batch(batch_size=2, seq_len=64)
        .then(BatchOp(2, name="batch2"))
    )
    with pytest.raises(ConfigError) as e:
        p.compile()
    assert "2 batch operators" in str(e.value)


@pytest.mark.parametrize("obj", [lambda r: r, "fetch", None, BatchOp])
def test_then_rejects_non_operators(obj):
    with pytest.raises(ConfigError) as e:
        base().then(obj)
    assert "Operator" in str(e.value)


@pytest.mark.parametrize("value", [0, -2, 2.0, "4", True, None])
def test_bad_canonical_replicas(value):
    with pytest.raises(ConfigError, match="canonical_replicas"):
        Pipeline(source(), canonical_replicas=value)


@pytest.mark.parametrize("value", [1.5, "7", None, True])
def test_bad_seed(value):
    with pytest.raises(ConfigError, match="seed"):
        Pipeline(source(), seed=value)


@pytest.mark.parametrize("value", [-1, 1.0, "3", True])
def test_bad_prefetch(value):
    with pytest.raises(ConfigError, match="prefetch"):
        Pipeline(source(), prefetch=value)


@pytest.mark.parametrize("value", [0, -1, "2"])
def test_bad_queue_size(value):
    with pytest.raises(ConfigError, match="queue_size"):
        Pipeline(source(), queue_size=value)


def test_bad_source():
    with pytest.raises(ConfigError, match="source"):
        Pipeline([1, 2, 3])


def test_compile_does_not_mutate_the_description():
    pipe = reordering().batch(batch_size=2)
    ops_before = pipe._ops
    pipe.compile()
    assert pipe._ops == ops_before
    assert not any(isinstance(op, ReplayFilter) for op in pipe._ops)
