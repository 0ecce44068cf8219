"""pack(strategy="first_fit"): online first-fit packing, exactly as ops/pack.py states it
(docs/design.md §4). Best fit, the default, is tested in test_pack_best_fit.py.

* a fragment goes into the lowest-index bin with room;
* a bin that becomes exactly full is emitted;
* if no bin has room, the fullest bin (ties: lowest index) is emitted and the
  fragment starts a new bin in that slot;
* flush emits all non-empty bins in slot order, then resets.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opkit import bind, feed, pending, rec, run, token_source

from zephon_core import Pipeline
from zephon_core.errors import ConfigError, PipelineError
from zephon_core.ops import PackOp
from zephon_core.records import Contributor


def frags(*sizes, chunk=0, lane=0, start=0):
    """Fragments with distinct cursors (chunk, offset=start+i) of the given sizes."""
    return [rec(chunk, start + i, n, lane=lane) for i, n in enumerate(sizes)]


def groups(records):
    """Each emitted record as the list of offsets of its fragments."""
    return [[c.offset for c in r.contributors] for r in records]


def packer(seq_len=10, bins=3, strategy="first_fit"):
    return bind(PackOp(seq_len, bins, strategy=strategy))


def test_first_fit_lowest_index_exactly_full_and_fullest_eviction():
    op = packer(10, 3)
    f = frags(6, 7, 5, 8, 4, 2, 2, 5, 1, 3)
    assert feed(op, f[0:3]) == []  # bins: [6] [7] [5]
    assert groups(op.process(f[3])) == [[1]]  # 8 fits nowhere: fullest (7, slot 1) out
    assert groups(op.process(f[4])) == [[0, 4]]  # 6+4: slot 0 exactly full -> emitted
    # slot 0 is empty again and lowest: 2 goes there although 8+2 would fill slot 1
    assert feed(op, f[5:8]) == []  # slot 0: 2+2+5 = 9
    assert groups(op.process(f[8])) == [[5, 6, 7, 8]]  # 9+1 exactly full
    assert pending(op)
    flushed = list(op.flush())
    assert groups(flushed) == [[3], [2]]  # slot order: slot 1 (8), slot 2 (5)
    assert [len(r.payload["input_ids"]) for r in flushed] == [8, 5]
    assert not pending(op)
    assert list(op.flush()) == []
    # after the reset the lane behaves like a fresh packer
    fresh = packer(10, 3)
    again = frags(6, 7, 5, 8, 4, start=20)
    assert groups(feed(op, again)) == groups(feed(fresh, frags(6, 7, 5, 8, 4, start=20)))


def test_ties_go_to_the_lowest_index_among_the_fullest():
    op = packer(10, 3)
    # [4] [8] [8]; 7 fits nowhere; slots 1 and 2 tie at 8 -> slot 1 is emitted
    assert feed(op, frags(4, 8, 8)) == []
    assert groups(op.process(rec(0, 3, 7))) == [[1]]
    assert groups(op.flush()) == [[0], [3], [2]]

    op = packer(10, 3)
    # [7] [7] [5]; 6 fits nowhere; slots 0 and 1 tie at 7 -> slot 0, and 6 starts there
    assert feed(op, frags(7, 7, 5)) == []
    assert groups(op.process(rec(0, 3, 6))) == [[0]]
    assert groups(op.process(rec(0, 4, 4))) == [[3, 4]]  # 6+4 fills slot 0
    assert groups(op.flush()) == [[1], [2]]


def test_full_length_fragment():
    op = packer(10, 2)
    assert groups(op.process(rec(0, 0, 10))) == [[0]]  # into empty slot 0: full at once
    assert not pending(op)
    assert feed(op, frags(7, 6, start=1)) == []  # [7] [6]
    # 10 fits nowhere: the fullest (slot 0) is emitted, the fragment starts slot 0
    # and is exactly full, so it is emitted right after
    assert groups(op.process(rec(0, 3, 10))) == [[1], [3]]
    assert groups(op.process(rec(0, 4, 3))) == []  # lowest empty slot: 0
    assert groups(op.flush()) == [[4], [2]]


def test_packed_record_payload_cursor_and_contributors():
    op = packer(10, 1)
    parts = [
        rec(5, 2, [1, 2, 3], child=1, last=False, comp=1, n_tokens=0),
        rec(6, 0, [4, 5], comp=0),
        rec(4, 9, [6, 7, 8, 9, 10], child=3, last=True, comp=1),
    ]
    (out,) = feed(op, parts)
    assert tuple(out.cursor) == (0, 5, 2, 1)  # the first fragment's cursor
    assert out.payload["input_ids"].tolist() == list(range(1, 11))
    assert out.payload["segment_lengths"].tolist() == [3, 2, 5]
    assert out.payload["segment_lengths"].dtype == np.int32
    assert out.contributors == [
        Contributor(5, 2, 1, False, 1, 3),  # n_tokens filled in
        Contributor(6, 0, 0, True, 0, 2),
        Contributor(4, 9, 3, True, 1, 5),
    ]
    assert set(out.payload) == {"input_ids", "segment_lengths"}


def test_single_fragment_bin_and_dtype_kept():
    op = packer(10, 2)
    op.process(rec(0, 0, 4))
    (out,) = op.flush()
    assert out.payload["input_ids"].dtype == np.int32
    assert out.payload["segment_lengths"].tolist() == [4]
    assert out.cursor == (0, 0, 0, 0)


def test_fragment_longer_than_seq_len_names_split():
    op = packer(10, 2)
    with pytest.raises(ConfigError, match=r"split\(max_len=10\)"):
        op.process(rec(3, 1, 11))


def test_pipeline_without_split_fails_naming_split():
    pipe = (
        Pipeline(token_source(), seed=1, prefetch=0, flush_every_k_chunks=2)
        .fetch()
        .pack(seq_len=8, bins=2)
    )
    with pytest.raises((ConfigError, PipelineError), match=r"split\(max_len=8\)") as ei:
        run(pipe, 3)
    err = ei.value
    assert isinstance(err, ConfigError) or isinstance(err.__cause__, ConfigError)


def test_empty_fragment_becomes_a_tombstone_and_takes_no_room():
    op = packer(10, 1)
    op.process(rec(0, 0, 6))
    (t,) = op.process(rec(0, 1, 0))
    assert t.is_tombstone and t.cursor == (0, 0, 1, 0)
    assert groups(op.process(rec(0, 2, 4))) == [[0, 2]]


def test_missing_tokens_is_a_config_error():
    with pytest.raises(ConfigError, match="input_ids"):
        packer().process(rec(0, 0, payload={"text": "x"}))


def test_lanes_are_independent():
    template = PackOp(10, 1)
    op0, op1 = bind(template, lane=0), template.for_lane(1)  # one instance per lane
    assert feed(op0, frags(6, lane=0)) == []
    assert feed(op1, frags(6, lane=1)) == []
    assert groups(op1.process(rec(0, 1, 4, lane=1))) == [[0, 1]]
    assert pending(op0) and not pending(op1)
    assert groups(op1.flush()) == []
    assert groups(op0.flush()) == [[0]]


@pytest.mark.parametrize(
    "kw", [dict(seq_len=0), dict(seq_len=1.5), dict(bins=0), dict(strategy="worst_fit")]
)
def test_bad_config(kw):
    args = dict(seq_len=8, bins=2) | kw
    with pytest.raises(ConfigError):
        PackOp(**args)


def test_traits():
    assert not PackOp.traits.preserves_cursor_order and not PackOp.traits.stateless


# -- docs/design.md §6: why accumulators must be flushed -----------------------


def _phase_run(prefix_sizes, n):
    """A 2-bin packer of capacity 10, brought into a state by ``prefix_sizes``, then fed
    ``n`` fragments of 3 tokens (offsets 100..). Returns (emitted groups, packer)."""
    op = packer(10, 2)
    feed(op, frags(*prefix_sizes, chunk=0))
    out = feed(op, frags(*([3] * n), chunk=1, start=100))
    return [[c.offset for c in r.contributors if c.chunk_id == 1] for r in out], op


def test_seed_example_packers_stay_phase_shifted_until_flushed():
    n = 600
    # state (10, 10): both bins empty; state (10, 5): slot 1 holds 5 tokens
    # (9 -> slot 0, 5 -> slot 1, 1 fills slot 0 exactly, which is emitted).
    a, op_a = _phase_run([], n)
    b, op_b = _phase_run([9, 5, 1], n)
    # the same periodic cycle: a bin of three 3-token fragments every 3 fragments ...
    assert all(len(g) == 3 for g in a) and all(len(g) == 3 for g in b)
    assert abs(len(a) - len(b)) <= 1 and len(a) >= n // 3 - 2
    assert a[0] == b[0] == [100, 101, 102]
    # ... permanently phase-shifted: after the first emission no emitted group agrees
    later_a, later_b = a[1:], b[1:]
    assert {(g[0] - 100) % 3 for g in later_a} == {0}
    assert {(g[0] - 100) % 3 for g in later_b} == {1}
    assert all(ga != gb for ga, gb in zip(later_a, later_b))
    assert len(set(map(tuple, later_a)) & set(map(tuple, later_b))) == 0
    # a flush brings both to the same clean state: from then on they are identical
    op_a.flush()
    op_b.flush()
    tail = [3, 3, 3, 4, 7, 2, 9, 1, 3, 3, 10, 5, 5] * 20
    out_a = feed(op_a, frags(*tail, chunk=2))
    out_b = feed(op_b, frags(*tail, chunk=2))
    assert groups(out_a) == groups(out_b) and out_a
    assert groups(op_a.flush()) == groups(op_b.flush())


# -- through a pipeline, against an independent model of either strategy -----------


def _model_pack(epochs, seq_len, bins, strategy):
    """Reference first or best fit over epochs of token arrays (flush at every epoch end)."""
    out = []
    for fragments in epochs:
        slots: list[list[np.ndarray]] = [[] for _ in range(bins)]

        def fill(s):
            return sum(len(x) for x in s)

        for f in fragments:
            fits = [s for s in slots if fill(s) + len(f) <= seq_len]
            if strategy == "best_fit":  # the fullest; sorted() is stable: ties keep slot order
                fits = sorted(fits, key=fill, reverse=True)[:1]
            for s in fits[:1]:
                s.append(f)
                if fill(s) == seq_len:
                    out.append(list(s))
                    s.clear()
            if not fits:
                j = max(range(bins), key=lambda i: (fill(slots[i]), -i))
                out.append(list(slots[j]))
                slots[j][:] = [f]
                if len(f) == seq_len:
                    out.append([f])
                    slots[j].clear()
        out += [list(s) for s in slots if s]
    return out


@pytest.mark.parametrize("strategy", ["first_fit", "best_fit"])
@pytest.mark.parametrize(
    ("lanes", "k", "chunk_size", "seq_len", "bins"),
    [(1, 2, 4, 24, 3), (2, 1, 3, 32, 2), (3, 3, 5, 20, 4)],
)
def test_pipeline_matches_the_model(lanes, k, chunk_size, seq_len, bins, strategy):
    n_out = 90
    docs = run(
        Pipeline(token_source(chunk_size=chunk_size), canonical_replicas=lanes, seed=9).fetch(),
        60 * lanes * chunk_size,
    )
    expected_per_lane = []
    for lane in range(lanes):
        lane_docs = docs[lane::lanes]
        epochs = []
        for j, d in enumerate(lane_docs):
            e = j // (chunk_size * k)
            if e == len(epochs):
                epochs.append([])
            ids = d["input_ids"]
            epochs[e] += [ids[i : i + seq_len] for i in range(0, len(ids), seq_len)]
        expected_per_lane.append(_model_pack(epochs[:-1], seq_len, bins, strategy))
    expected = []
    for i in range(n_out // lanes + 1):
        for lane in range(lanes):
            expected.append(expected_per_lane[lane][i])
    got = run(
        Pipeline(
            token_source(chunk_size=chunk_size),
            canonical_replicas=lanes,
            flush_every_k_chunks=k,
            seed=9,
        )
        .fetch()
        .split(max_len=seq_len)
        .pack(seq_len=seq_len, bins=bins, strategy=strategy),
        n_out,
    )
    assert len(got) == n_out
    for g, parts in zip(got, expected):
        assert g["input_ids"].tolist() == np.concatenate(parts).tolist()
        assert g["segment_lengths"].tolist() == [len(p) for p in parts]
        assert len(g["input_ids"]) <= seq_len


def first_fit_bin(fill, n, seq_len):
    """The lowest-index bin with room for ``n``, or None."""
    return next((j for j in range(len(fill)) if fill[j] + n <= seq_len), None)


def model_groups(sizes, flush_after, seq_len, bins, choose=first_fit_bin):
    """Independent online packing on fragment sizes (``choose`` picks a bin with room, or
    None: then the fullest bin, ties to the lowest index, is emitted); returns emitted
    groups of indices."""
    out, slots = [], [[] for _ in range(bins)]
    fill = [0] * bins
    for i, n in enumerate(sizes):
        if n:
            j = choose(fill, n, seq_len)
            if j is None:
                j = max(range(bins), key=lambda b: (fill[b], -b))
                out.append(slots[j])
                slots[j], fill[j] = [], 0
            slots[j] = slots[j] + [i]
            fill[j] += n
            if fill[j] == seq_len:
                out.append(slots[j])
                slots[j], fill[j] = [], 0
        if i in flush_after:
            out += [s for s in slots if s]
            slots, fill = [[] for _ in range(bins)], [0] * bins
    return out


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(seq_len=st.integers(1, 20), bins=st.integers(1, 4), data=st.data())
def test_pack_matches_first_fit_model(seq_len, bins, data):
    sizes = data.draw(st.lists(st.integers(0, seq_len), max_size=60), label="sizes")
    flush_after = set(data.draw(st.lists(st.integers(0, 60), max_size=4), label="flushes"))
    op = packer(seq_len, bins)
    got = []
    for i, n in enumerate(sizes):
        for r in op.process(rec(0, i, n)):
            if not r.is_tombstone:
                got.append([c.offset for c in r.contributors])
        if i in flush_after:
            got += groups(op.flush())
            assert not pending(op)
    assert got == model_groups(sizes, flush_after, seq_len, bins)
    rest = groups(op.flush())
    emitted = sorted(i for g in got + rest for i in g)
    assert emitted == [i for i, n in enumerate(sizes) if n > 0]  # nothing lost or doubled


@pytest.mark.parametrize(
    "tokens, words",
    [
        (np.arange(8, dtype=np.float32), ["float32", "integer"]),
        (np.ones((2, 4), dtype=np.int32), ["2-D", "1-D"]),
        ([0.5, 1.5], ["float64"]),
    ],
)
def test_non_integer_or_2d_token_ids_are_refused_not_truncated(tokens, words):
    from zephon_core.errors import ContractViolation

    r = rec(0, 0, payload={"input_ids": tokens})
    op = bind(PackOp(seq_len=16))  # the default strategy: the check is the same
    with pytest.raises(ContractViolation, match="'pack'") as ei:
        feed(op, [r])
        op.flush()  # float ids are caught when the bin is emitted, 2-D at once
    for w in words:
        assert w in str(ei.value)
