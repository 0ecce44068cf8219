"""Weight schedules, per-dataset epoch caps and the repetition warning."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from helpers import CODE, PROSE, byte_tokenize, make_docs

from zephon_core import ConfigError, IncompatibleCheckpoint, Pipeline, StaticMixtureWorkSource
from zephon_core.sources import repetition
from zephon_core.sources.schedule import SHARE_SCALE, WeightSchedule, fixed_point_shares
from zephon_core.testing import assert_resume_equivalent, take

LENS = {
    "prose": [len(d["text"].encode()) for d in PROSE],
    "code": [len(d["text"].encode()) for d in CODE],
}
# 4 lanes x ~30k tokens per lane before the anneal ends
ANNEAL = WeightSchedule.anneal(
    {"prose": 0.9, "code": 0.1}, {"prose": 0.2, "code": 0.8}, total=120_000, last_fraction=0.5
)


def _source(weights=ANNEAL, **kw) -> StaticMixtureWorkSource:
    kw.setdefault("weights_unit", "tokens")
    kw.setdefault("lengths", LENS if kw["weights_unit"] == "tokens" else None)
    return StaticMixtureWorkSource(
        {"prose": PROSE, "code": CODE}, weights, chunk_size=8, seed=3, **kw
    )


def _lane_tokens(src, lane=0, lanes=4, chunks=120):
    ws = src.open_lane(lane, lanes, seed=1)
    out = []
    for _ in range(chunks):
        ch = ws.next_chunk()
        if ch is None:
            break
        out += [(c, LENS[src.component_names[c]][r]) for c, r in zip(ch.components, ch.rows)]
    return out


def test_fixed_point_shares_sum_exactly_and_keep_positive_weights():
    for w in ([0.7, 0.3], [1, 1, 1], [1e-9, 1.0], [0.0, 2.0, 1.0]):
        s = fixed_point_shares(w)
        assert sum(s) == SHARE_SCALE
        assert all((a > 0) == (b > 0) for a, b in zip(s, w))


def test_a_schedule_anneals_the_token_shares():
    picks = _lane_tokens(_source())
    tokens = np.array([t for _, t in picks])
    prose = np.array([t if c == 0 else 0 for c, t in picks])
    pos = np.cumsum(tokens) * 4  # the lane's estimate of the global position
    early, late = pos < 50_000, pos > 130_000
    assert prose[early].sum() / tokens[early].sum() > 0.85
    assert prose[late].sum() / tokens[late].sum() < 0.3


def test_a_schedule_crossing_checkpoints_resumes_exactly():
    def build():
        return (
            Pipeline(_source(), canonical_replicas=4, flush_every_k_chunks=2, seed=9)
            .fetch()
            .map(byte_tokenize)
            .split(max_len=256)
            .pack(seq_len=256, bins=2)
            .batch(batch_size=2)
        )

    # ~1 KB per output: cuts before, inside and after the anneal
    assert_resume_equivalent(build, cut_points=[10, 80, 170], total=230)


def test_the_schedule_is_part_of_the_fingerprint():
    def build(schedule):
        return Pipeline(_source(schedule), canonical_replicas=2).fetch().map(byte_tokenize)

    with build(ANNEAL) as pipe:
        take(pipe, 4)
        state = pipe.checkpoint()
    other = WeightSchedule.anneal(
        {"prose": 0.9, "code": 0.1}, {"prose": 0.5, "code": 0.5}, total=120_000
    )
    with pytest.raises(IncompatibleCheckpoint, match="schedule"):
        build(other).load_state_dict(state)
    pipe = build(other)
    pipe.load_state_dict(state, allow_changes={"weights"})  # an explicit re-mix
    assert len(take(pipe, 3)) == 3
    pipe.close()


def test_a_schedule_by_documents_needs_no_lengths():
    sched = WeightSchedule([(0, [1, 0]), (200, [0, 1])], by="documents")
    src = StaticMixtureWorkSource({"prose": PROSE, "code": CODE}, sched, chunk_size=10, seed=1)
    ws = src.open_lane(0, 2, seed=0)
    comps = [c for _ in range(20) for c in ws.next_chunk().components]
    assert comps[:10] == [0] * 10 and comps[-10:] == [1] * 10


@pytest.mark.parametrize(
    "points, match",
    [([], "non-empty"), ([(5, [1, 0]), (5, [0, 1])], "greater than"), ([(0, [0, 0])], "zero")],
)
def test_bad_schedules_are_config_errors(points, match):
    with pytest.raises(ConfigError, match=match):
        StaticMixtureWorkSource({"a": [1, 2], "b": [3]}, WeightSchedule(points, by="documents"))


def _drain(src, lanes):
    counts: dict[tuple[int, int], int] = {}
    order = []
    for lane in range(lanes):
        ws = src.open_lane(lane, lanes, seed=0)
        for _ in range(400):
            ch = ws.next_chunk()
            if ch is None:
                break
            for c, r in zip(ch.components, ch.rows):
                counts[(c, r)] = counts.get((c, r), 0) + 1
                order.append(c)
    return counts, order


@pytest.mark.parametrize("unit", ["documents", "tokens"])
def test_a_capped_dataset_drops_out_and_the_others_continue(unit):
    src = _source({"prose": 0.5, "code": 0.5}, weights_unit=unit, num_epochs={"code": 2})
    assert not src.finite
    counts, _ = _drain(src, lanes=3)
    code = {r: n for (c, r), n in counts.items() if c == 1}
    assert len(code) == len(CODE) and set(code.values()) == {2}
    assert sum(n for (c, _), n in counts.items() if c == 0) > 2 * len(PROSE)  # prose went on


def test_when_exhausted_end_ends_the_lanes_at_the_cap():
    src = _source(
        {"prose": 0.5, "code": 0.5},
        weights_unit="documents",
        num_epochs={"code": 1},
        when_exhausted="end",
    )
    assert src.finite
    counts, _ = _drain(src, lanes=2)
    code = {r: n for (c, r), n in counts.items() if c == 1}
    assert len(code) == len(CODE) and set(code.values()) == {1}
    assert all(n == 1 for (c, _), n in counts.items() if c == 0)


def test_capped_epochs_resume_exactly_through_the_end():
    def build():
        src = _source({"prose": 0.6, "code": 0.4}, num_epochs={"code": 1}, when_exhausted="end")
        return Pipeline(src, canonical_replicas=3, seed=2).fetch().map(byte_tokenize)

    n = len(take(build(), 10_000))
    assert assert_resume_equivalent(build, cut_points=[0, 17, n - 3, n], total=n + 5)


def test_a_dataset_repeating_early_is_warned_about_once(caplog):
    small = make_docs(6, 5, 50, 9, "s")
    repetition._warned.clear()
    src = StaticMixtureWorkSource({"big": PROSE, "small": small}, chunk_size=8, seed=1)
    with caplog.at_level(logging.WARNING, logger="zephon_core.sources"):
        ws = src.open_lane(0, 2, seed=0)
        for _ in range(10):
            ws.next_chunk()
    msgs = [r.getMessage() for r in caplog.records if "second epoch" in r.getMessage()]
    assert len(msgs) == 1 and "'small'" in msgs[0] and "num_epochs" in msgs[0]


def test_ensure_mixture_without_targets_refuses_a_schedule():
    pipe = (
        Pipeline(_source(), canonical_replicas=2, flush_every_k_chunks=2)
        .fetch()
        .map(byte_tokenize)
        .ensure_mixture(window=4)
    )
    with pytest.raises(ConfigError, match="WeightSchedule"):
        pipe.compile()
