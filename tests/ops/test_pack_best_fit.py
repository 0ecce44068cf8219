"""pack(strategy="best_fit"), the default: a fragment goes into the fullest bin that still
holds it (ties: the lowest index); the other rules are first fit's (ops/pack.py). Its
streams resume exactly, and a state first fit wrote is refused naming the fix."""

from __future__ import annotations

import golden
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opkit import feed, pending, rec, run, token_source
from test_pack import model_groups, frags, groups, packer

from zephon_core import Pipeline
from zephon_core.errors import IncompatibleCheckpoint
from zephon_core.ops import PackOp
from zephon_core.testing import assert_resume_equivalent, take


def best(seq_len=10, bins=3):
    return packer(seq_len, bins, strategy="best_fit")


def test_the_default_is_best_fit():
    assert PackOp(8).strategy == "best_fit"
    pipe = Pipeline(token_source(), seed=1).fetch().split(max_len=8).pack(seq_len=8)
    assert pipe.compile().config["ops"][-1]["strategy"] == "best_fit"


def test_fullest_bin_that_fits_ties_lowest_index_empty_only_when_nothing_fits():
    op = best(10, 3)
    assert feed(op, frags(6, 8)) == []  # [6] [8] []: 8 fits only the empty slot 1
    # 2 fits slots 0 (6+2) and 1 (8+2): the fuller one, exactly full -> emitted
    # (first fit would put it in slot 0)
    assert groups(op.process(rec(0, 2, 2))) == [[1, 2]]
    assert feed(op, frags(3, start=3)) == []  # [9] [] []: slot 0 (6) beats two empties
    assert feed(op, frags(7, start=4)) == []  # nothing partly filled holds 7: slot 1
    assert groups(op.process(rec(0, 5, 1))) == [[0, 3, 5]]  # 9+1 beats 7+1: full
    # [] [7] []: 2 goes to slot 1, not to the empty lowest slot (first fit's choice)
    assert feed(op, frags(2, start=6)) == []
    assert groups(op.flush()) == [[4, 6]]
    assert not pending(op)


def test_ties_and_the_no_room_rule():
    op = best(10, 3)
    assert feed(op, frags(7, 7)) == []  # [7] [7] []
    assert groups(op.process(rec(0, 2, 3))) == [[0, 2]]  # tie at 7: slot 0, full
    assert feed(op, frags(6, start=3)) == []  # [] [7] [] -> 6 fits only empties: slot 0
    assert groups(op.process(rec(0, 4, 9))) == []  # 9 fits only slot 2 (empty)
    # [6] [7] [9]; 5 fits nowhere: the fullest (slot 2) is emitted, 5 starts there
    assert groups(op.process(rec(0, 5, 5))) == [[4]]
    assert groups(op.flush()) == [[3], [1], [5]]  # slot order
    assert not pending(op)


def best_fit_bin(fill, n, seq_len):
    """The fullest bin with room for ``n`` (ties: the lowest index), or None."""
    fits = [j for j in range(len(fill)) if fill[j] + n <= seq_len]
    return min(fits, key=lambda b: (seq_len - fill[b], b)) if fits else None


def _model_best_fit(sizes, flush_after, seq_len, bins):
    """Independent best fit on fragment sizes; returns emitted groups of indices."""
    return model_groups(sizes, flush_after, seq_len, bins, choose=best_fit_bin)


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(seq_len=st.integers(1, 20), bins=st.integers(1, 5), data=st.data())
def test_best_fit_matches_the_model(seq_len, bins, data):
    sizes = data.draw(st.lists(st.integers(0, seq_len), max_size=60), label="sizes")
    flush_after = set(data.draw(st.lists(st.integers(0, 60), max_size=4), label="flushes"))
    op = best(seq_len, bins)
    got = []
    for i, n in enumerate(sizes):
        out = op.process(rec(0, i, n))
        got += [[c.offset for c in r.contributors] for r in out if not r.is_tombstone]
        if i in flush_after:
            got += groups(op.flush())
            assert not pending(op)
    assert got == _model_best_fit(sizes, flush_after, seq_len, bins)
    emitted = sorted(i for g in got + groups(op.flush()) for i in g)
    assert emitted == [i for i, n in enumerate(sizes) if n > 0]  # nothing lost or doubled


# -- resume equivalence ------------------------------------------------------------------


def build(k=2, seq_len=24, bins=3, lanes=2, shuffle=4, strategy="best_fit"):
    def make():
        pipe = (
            Pipeline(token_source(), canonical_replicas=lanes, flush_every_k_chunks=k, seed=7)
            .fetch()
            .split(max_len=seq_len)
            .pack(seq_len=seq_len, bins=bins, strategy=strategy)
        )
        if shuffle:
            pipe = pipe.shuffle(buffer_size=shuffle)
        return pipe.batch(batch_size=2)

    return make


def test_best_fit_stream_resumes_exactly_at_many_cuts():
    report = assert_resume_equivalent(build(), cut_points=[0, 1, 2, 5, 9, 14, 23, 37], total=60)
    assert max(report.chunks_replayed) > 0  # restores that replayed work
    # the cuts exercise best fit: its stream is not first fit's
    a, b = run(build()(), 30), run(build(strategy="first_fit")(), 30)
    assert any(not np.array_equal(x["input_ids"], y["input_ids"]) for x, y in zip(a, b))


@settings(max_examples=12, deadline=None, derandomize=True, database=None)
@given(
    k=st.integers(1, 4),
    seq_len=st.integers(8, 64),
    bins=st.integers(1, 8),
    lanes=st.integers(1, 3),
    shuffle=st.sampled_from([0, 3]),
    cuts=st.lists(st.integers(0, 30), min_size=1, max_size=3, unique=True),
)
def test_best_fit_resumes_exactly_property(k, seq_len, bins, lanes, shuffle, cuts):
    assert_resume_equivalent(build(k, seq_len, bins, lanes, shuffle), cut_points=cuts, total=40)


# -- states packed first fit --------------------------------------------------------------


def test_a_state_packed_first_fit_is_refused_by_a_best_fit_pipeline_naming_the_fix():
    """A state an earlier release wrote with the default of its time (first fit)."""
    state = Pipeline.load(golden.DATA / "main-03a95f2.state")
    with pytest.raises(IncompatibleCheckpoint, match=r"strategy='first_fit'") as ei:
        with golden.build(strategy="best_fit") as pipe:
            pipe.load_state_dict(state)
            take(pipe, 1)
    assert "strategy: 'first_fit' in checkpoint, 'best_fit' now" in str(ei.value)
    assert "cannot resume" not in str(ei.value)  # no advice to go back to the old release
    with golden.build() as pipe:  # first fit, as the state says: it resumes
        pipe.load_state_dict(state)
        assert take(pipe, 1)
