"""The replay filter: drops the consumed prefix by cursor *equality*, as tombstones.

docs/design.md §6: on resume the filter drops records until it sees the saved cursor
(by equality), drops it too, and forwards everything after it; dropped records become
tombstones; divergence is detected (ReplayDivergence naming lane and target), never
silent.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from helpers import byte_tokenize, source

from zephon_core import Operator, OpTraits, Pipeline, ReplayDivergence
from zephon_core.engine.replay_filter import ReplayFilter
from zephon_core.ops import OpContext
from zephon_core.records import Contributor, Record, SampleCursor


def lane_filter(
    lane: int = 0,
    monotone: bool = False,
    name: str = "batch_replay_filter",
    target: SampleCursor | None = None,
) -> ReplayFilter:
    """The replay filter instance of one lane (the template bound as compile does)."""
    template = ReplayFilter(name, monotone=monotone)
    template.bind(OpContext(seed=1, index=0, component_names=("a",), weights=(1.0,)))
    rf = template.for_lane(lane)
    rf.set_target(target)
    return rf


def rec(lane: int, cid: int, off: int, child: int = 0, payload=None) -> Record:
    return Record(
        payload if payload is not None else {"x": (cid, off, child)},
        SampleCursor(lane, cid, off, child),
        [Contributor(cid, off, child, True, 0, 3)],
    )


# Five records of lane 0, chunk 0, in the shuffled original-run order C2 C1 C3 C4 C5.
C = {i: rec(0, 0, i) for i in range(6)}


def test_equality_match_drops_prefix_as_tombstones_and_forwards_the_rest():
    rf = lane_filter(0, False, "batch_replay_filter", C[3].cursor)
    out = []
    for r in (C[2], C[1], C[3], C[4], C[5]):
        out.extend(rf.process(r))
    assert len(out) == 5
    assert [o.is_tombstone for o in out] == [True, True, True, False, False]
    assert [o.cursor for o in out] == [C[i].cursor for i in (2, 1, 3, 4, 5)]
    # tombstones carry the dropped records' contributors, so their offsets close
    assert [o.contributors for o in out[:3]] == [C[i].contributors for i in (2, 1, 3)]
    assert out[3] is C[4] and out[4] is C[5]
    # The match is equality, not a threshold: a later record below C3 is forwarded.
    late = rf.process(C[0])
    assert late == [C[0]] and not late[0].is_tombstone
    assert rf.target is None


def test_threshold_would_be_wrong_records_below_target_after_it_pass():
    rf = lane_filter(0, False, "x_replay_filter", SampleCursor(0, 2, 5, 1))
    before = [rec(0, 3, 0), rec(0, 2, 6), rec(0, 2, 5, 0)]
    assert all(o.is_tombstone for r in before for o in rf.process(r))
    assert rf.process(rec(0, 2, 5, 1))[0].is_tombstone  # the target itself is dropped
    after = [rec(0, 1, 0), rec(0, 2, 5, 0), rec(0, 0, 0)]
    for r in after:
        assert rf.process(r) == [r]


def test_process_many_matches_process():
    rf = lane_filter(0, False, "batch_replay_filter", C[3].cursor)
    out = rf.process_many([C[2], C[1], C[3], C[4], C[5], C[0]])
    assert [o.is_tombstone for o in out] == [True, True, True, False, False, False]
    assert out[3:] == [C[4], C[5], C[0]]


def test_targets_are_per_lane():
    rf0 = lane_filter(0, target=SampleCursor(0, 0, 3, 0))
    rf1 = lane_filter(1)  # each lane has its own instance
    r1 = rec(1, 0, 0)
    assert rf1.process(r1) == [r1]  # lane 1 has no target: pass-through
    assert rf0.process(rec(0, 0, 0))[0].is_tombstone
    rf1.set_target(SampleCursor(1, 0, 1, 0))
    assert rf1.process(rec(1, 0, 1))[0].is_tombstone
    assert rf1.process(rec(1, 0, 2))[0].is_tombstone is False
    assert rf0.target is not None and rf1.target is None
    rf0.set_target(None)
    assert rf0.target is None


def test_pass_through_without_target():
    rf = lane_filter(0, monotone=True)
    recs = [rec(0, c, o) for c in range(3) for o in range(3)]
    for r in recs:
        assert rf.process(r) == [r]
    assert rf.process_many(recs) == recs
    assert not any(r.is_tombstone for r in rf.process_many(recs))
    rf.check_epoch_end(100)  # no target: never diverges
    assert list(rf.finish()) == []


def _assert_names(e: pytest.ExceptionInfo, lane: int, target: SampleCursor) -> None:
    msg = str(e.value)
    assert f"lane {lane}" in msg
    assert str(tuple(target)) in msg


def test_divergence_when_an_epoch_past_the_target_ends():
    target = SampleCursor(2, 3, 1, 0)
    rf = lane_filter(2, False, "batch_replay_filter", target)
    rf.check_epoch_end(2)  # an earlier epoch ending is fine
    rf.check_epoch_end(3)  # the flush before chunk 3 does not end the target's epoch
    lane_filter(1, target=SampleCursor(1, 0, 0, 0))  # another lane's filter is another object
    with pytest.raises(ReplayDivergence) as e:
        rf.check_epoch_end(4)
    _assert_names(e, 2, target)


def test_no_divergence_once_target_was_seen():
    target = SampleCursor(0, 0, 1, 0)
    rf = lane_filter(0, target=target)
    rf.process(rec(0, 0, 1))
    rf.check_epoch_end(10)
    assert list(rf.finish()) == []


def test_divergence_at_the_end_of_the_stream():
    target = SampleCursor(0, 7, 0, 0)
    rf = lane_filter(0, False, "batch_replay_filter", target)
    with pytest.raises(ReplayDivergence) as e:
        rf.finish()
    _assert_names(e, 0, target)


def test_monotone_divergence_on_a_later_chunk_record():
    target = SampleCursor(1, 4, 2, 0)
    rf = lane_filter(1, True, "tokenize_replay_filter", target)
    assert rf.process(rec(1, 3, 9))[0].is_tombstone
    assert rf.process(rec(1, 4, 3))[0].is_tombstone  # same chunk, different offset: wait
    with pytest.raises(ReplayDivergence) as e:
        rf.process(rec(1, 5, 0))
    _assert_names(e, 1, target)


def test_non_monotone_later_chunk_record_is_not_divergence():
    rf = lane_filter(0, False, "batch_replay_filter", SampleCursor(0, 4, 2, 0))
    assert rf.process(rec(0, 5, 0))[0].is_tombstone  # reordered tail: keep waiting


# -- end to end: a non-deterministic operator is caught on resume -------------------------

_RUNS = [0]


class RunStamped(Operator):
    """A broken operator: its output identity depends on which run it is in."""

    traits = OpTraits(preserves_cursor_order=False)
    name = "stamp"

    def bind(self, ctx) -> None:
        super().bind(ctx)
        _RUNS[0] += 1
        self.run_id = _RUNS[0]

    def process(self, record):
        c = record.cursor
        return [
            Record(
                record.payload,
                SampleCursor(c.lane, c.chunk_id, c.offset, self.run_id),
                record.contributors,
            )
        ]


_tok = byte_tokenize


@pytest.mark.parametrize("prefetch", [0, 2])
def test_non_deterministic_operator_raises_replay_divergence_on_resume(prefetch):
    def build():
        return (
            Pipeline(
                source(), canonical_replicas=2, flush_every_k_chunks=2, seed=1, prefetch=prefetch
            )
            .fetch()
            .map(_tok, name="tokenize")
            .then(RunStamped())
        )

    first = build()
    it = iter(first)
    for _ in range(21):
        next(it)
    state = first.checkpoint()
    first.close()
    second = build()
    second.load_state_dict(state)
    with pytest.raises(ReplayDivergence) as e:
        for _ in range(500):
            next(iter(second))
    second.close()
    msg = str(e.value)
    targets = {ls["lane"]: tuple(ls["cursor"]) for ls in state["lanes"]}
    assert any(f"replay on lane {ln} " in msg and str(t) in msg for ln, t in targets.items()), msg
    assert "not deterministic" in msg
    # where to look: the record's dataset and row, and the operators that made it
    assert "through the operators source -> fetch -> tokenize -> stamp" in msg
    assert re.search(r"\(chunk \d+, dataset '(prose|code)' row \d+ \(chunk \d+ offset \d+\)\)", msg)


# -- a divergence names where to look ------------------------------------------------------


def _named_filter(target: SampleCursor, digest: int | None = None) -> ReplayFilter:
    """Lane 1's filter after fetch -> tokenize, with two restored inflight chunks."""
    from zephon_core.chunk import WorkChunk
    from zephon_core.ops import FetchOp, MapOp

    upstream = (FetchOp(), MapOp(_tok, name="tokenize"))
    template = ReplayFilter("batch_replay_filter", monotone=True)
    template.bind(
        OpContext(
            seed=1,
            index=2,
            component_names=("prose", "code"),
            weights=(0.7, 0.3),
            upstream=upstream,
        )
    )
    rf = template.for_lane(1)
    chunks = [WorkChunk(1, 4, (0, 1, 0), (12, 33, 7), 99), WorkChunk(1, 5, (1, 1), (2, 3), 98)]
    rf.set_target(target, digest, chunks)
    return rf


def test_a_divergence_names_the_chunk_the_documents_and_the_operators():
    target = SampleCursor(1, 4, 1, 0)
    rf = _named_filter(target)
    with pytest.raises(ReplayDivergence) as e:
        rf.process(rec(1, 5, 0))  # a later chunk first: the target never came
    msg = str(e.value)
    assert (
        "lane 1 reached a record of later chunk 5 without reproducing the saved cursor "
        f"{tuple(target)}" in msg
    )
    assert "(chunk 4, dataset 'code' row 33 (chunk 4 offset 1))" in msg
    assert "through the operators source -> fetch -> tokenize" in msg


def test_a_value_divergence_names_every_document_behind_the_record():
    target = SampleCursor(1, 4, 0, 0)
    rf = _named_filter(target, digest=0)  # the values before the checkpoint (no match)
    packed = Record(
        {"input_ids": np.arange(4)},
        target,
        [
            Contributor(4, 0, 0, True, 0, 2),
            Contributor(4, 2, 0, True, 0, 1),
            Contributor(5, 1, 0, True, 1, 1),
        ],
    )
    with pytest.raises(ReplayDivergence, match="other values") as e:
        rf.process(packed)
    msg = str(e.value)
    assert (
        "comes from dataset 'prose' row 12 (chunk 4 offset 0), dataset 'prose' row 7 "
        "(chunk 4 offset 2), dataset 'code' row 3 (chunk 5 offset 1), through the operators "
        "source -> fetch -> tokenize" in msg
    )
    assert "allow_changes={'data'} or {'functions'}" in msg
