"""Bounded recovery: checkpoint size, chunks replayed and ledger length do not
grow with the number of steps taken (docs/design.md §6: "a handful of them regardless
of how far into training you are"), and resume stays exact."""

from __future__ import annotations

import pytest
from helpers import byte_tokenize, reference_pipeline, source

from zephon_core import Pipeline
from zephon_core.checkpoint import codec
from zephon_core.testing import assert_resume_equivalent, take

LANES = 4
EARLY, LATE = 100, 3000
# With threads, the ledger also holds what the producer pulled ahead of the consumer:
# up to ``prefetch`` outputs and ``queue_size`` microbatches per threads stage, per lane
# (both pipelines: prefetch 3, two threads stages, queue_size 2). How far it got depends
# on thread timing, so counts taken with threads are bounded with this much added; the
# counts taken inline (no threads) are exact and bounded tightly.
AHEAD_PER_LANE = 3 + 2 * 2


def monotone_pipeline(prefetch: int = 3, parallelism: int = 2) -> Pipeline:
    return (
        Pipeline(source(), canonical_replicas=LANES, seed=11, prefetch=prefetch)
        .fetch(parallelism=parallelism)
        .map(byte_tokenize, parallelism=parallelism, name="tokenize")
        .split(max_len=128)
        .batch(batch_size=4, seq_len=128)
    )


def _measure(build, cut: int) -> tuple[int, int, dict]:
    """Size and chunks replayed of a state taken at ``cut``, inline: the same every run."""
    pipe = build(prefetch=0, parallelism=1)
    take(pipe, cut)
    state = pipe.checkpoint()
    pipe.close()
    size = len(codec.encode(state))
    again = build(prefetch=0, parallelism=1).iterate(restore=codec.decode(codec.encode(state)))
    replayed = again.chunks_replayed
    again.close()
    return size, replayed, state


@pytest.mark.parametrize(
    "build", [reference_pipeline, monotone_pipeline], ids=["reference", "monotone"]
)
def test_checkpoint_size_and_replay_do_not_grow_with_steps(build):
    size_e, replayed_e, st_e = _measure(build, EARLY)
    size_l, replayed_l, st_l = _measure(build, LATE)
    assert st_l["position"] == LATE
    # the late checkpoint really is far into the stream
    assert min(ls["floor"] for ls in st_l["lanes"]) > 10 * max(
        ls["next_chunk"] for ls in st_e["lanes"]
    )
    assert size_l <= 1.2 * size_e + 200, (size_e, size_l)
    assert replayed_l <= replayed_e + 2 * LANES, (replayed_e, replayed_l)
    assert replayed_l == sum(len(ls["chunks"]) for ls in st_l["lanes"])
    assert replayed_l <= 4 * LANES, "more than a handful of chunks per lane"


def test_reference_pipeline_resumes_exactly_at_early_and_late_cuts():
    report = assert_resume_equivalent(reference_pipeline, cut_points=[EARLY, LATE], total=LATE + 60)
    assert report.cuts == [EARLY, LATE]
    (b_e, b_l), (r_e, r_l) = report.checkpoint_bytes, report.chunks_replayed
    assert b_l <= 1.2 * b_e + 200, report
    assert 0 < r_l <= r_e + 2 * LANES + AHEAD_PER_LANE * LANES, report


def test_monotone_pipeline_resumes_exactly_at_early_and_late_cuts():
    report = assert_resume_equivalent(monotone_pipeline, cut_points=[EARLY, LATE], total=LATE + 60)
    r_e, r_l = report.chunks_replayed
    assert r_l <= r_e + 2 * LANES + AHEAD_PER_LANE * LANES, report


def _ledger_lengths(pipe: Pipeline, n: int) -> list[int]:
    it = iter(pipe)
    run = it.run
    worst = []
    for _ in range(n):
        next(it)
        worst.append(max(len(run.streams[lane].ledger) for lane in range(LANES)))
    return worst


def test_ledger_stays_bounded_over_3000_outputs():
    pipe = reference_pipeline()
    lengths = _ledger_lengths(pipe, LATE)
    st = pipe.checkpoint()
    pipe.close()
    assert max(st["lanes"][lane]["next_chunk"] for lane in range(LANES)) > 50
    first, last = lengths[: LATE // 3], lengths[-LATE // 3 :]
    assert max(lengths) <= 12 + AHEAD_PER_LANE, max(lengths)
    assert max(last) <= max(first) + 2 + AHEAD_PER_LANE, (max(first), max(last))


def test_ledger_stays_bounded_after_a_restore():
    """Replayed chunks must evict again: the replay filter's tombstones close them."""
    pipe = reference_pipeline()
    take(pipe, EARLY)
    state = pipe.checkpoint()
    pipe.close()
    resumed = reference_pipeline()
    resumed.load_state_dict(state)
    lengths = _ledger_lengths(resumed, 1500)
    st = resumed.checkpoint()
    resumed.close()
    replayed_floor = max(ls["next_chunk"] for ls in state["lanes"])
    assert all(ls["floor"] > replayed_floor for ls in st["lanes"]), (
        "restored chunks were never evicted"
    )
    assert max(lengths) <= 12 + AHEAD_PER_LANE, max(lengths)
