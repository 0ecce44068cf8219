"""filter: drops records, emitting tombstones (same cursor and contributors) for them."""

from __future__ import annotations

import numpy as np
from opkit import bind, cursors, pending, rec, run, token_source

from zephon_core import Pipeline
from zephon_core.ops import FilterOp


def _even_len(p):
    return len(p["input_ids"]) % 2 == 0


def test_kept_records_pass_unchanged_dropped_become_tombstones():
    op = bind(FilterOp(_even_len))
    recs = [rec(0, i, i + 1, comp=i % 2) for i in range(6)]  # lengths 1..6
    out = op.process_many(recs)
    assert len(out) == 6  # 1:1, in order
    assert cursors(out) == cursors(recs)
    for r_in, r_out in zip(recs, out):
        assert r_out.contributors == r_in.contributors
        if len(r_in.payload["input_ids"]) % 2 == 0:
            assert r_out is r_in and not r_out.is_tombstone
        else:
            assert r_out.is_tombstone
    # process() agrees with process_many()
    single = [op.process(r)[0] for r in recs]
    assert [r.is_tombstone for r in single] == [r.is_tombstone for r in out]


def test_tombstone_of_a_fragment_keeps_its_child_metadata():
    op = bind(FilterOp(lambda p: False))
    r = rec(4, 7, 3, child=2, last=True, comp=1)
    (t,) = op.process(r)
    assert t.is_tombstone and t.cursor == r.cursor
    c = t.contributors[0]
    assert (c.chunk_id, c.offset, c.child, c.is_last_child, c.component) == (4, 7, 2, True, 1)


def test_traits_and_no_state():
    op = bind(FilterOp(_even_len))
    assert op.traits.preserves_cursor_order and op.traits.stateless
    assert list(op.flush()) == [] and not pending(op)


def _keep70(p):
    """Drops ~30% of rows, deterministically from the payload."""
    return int(p["input_ids"][-1]) % 10 >= 3


def test_pipeline_output_is_the_filtered_stream():
    base = run(Pipeline(token_source(), canonical_replicas=1, seed=2).fetch(), 200)
    got = run(
        Pipeline(token_source(), canonical_replicas=1, seed=2)
        .fetch()
        .filter(_keep70, parallelism=2),
        100,
    )
    kept = [_keep70(p) for p in base]
    want = [p for p, k in zip(base, kept) if k][:100]
    assert len(got) == 100
    assert [p["id"] for p in got] == [p["id"] for p in want]
    dropped = 1 - sum(kept) / len(kept)
    assert 0.1 < dropped < 0.5


def test_tombstones_let_chunks_evict():
    """Dropped records close their offsets: the inflight set stays bounded."""
    pipe = (
        Pipeline(
            token_source(chunk_size=4),
            canonical_replicas=1,
            seed=2,
            flush_every_k_chunks=2,
            prefetch=0,
        )
        .fetch()
        .filter(_keep70)
        .shuffle(buffer_size=3)
    )
    try:
        it = iter(pipe)
        sizes = []
        for i in range(300):
            next(it)
            if i % 50 == 49:
                sizes.append(len(pipe.checkpoint()["lanes"][0]["chunks"]))
    finally:
        pipe.close()
    assert max(sizes) <= 4, sizes  # one or two epochs of 2 chunks, never growing


def test_filter_everything_of_one_component():
    got = run(
        Pipeline(token_source(), canonical_replicas=2, seed=2)
        .fetch()
        .filter(lambda p: p["id"].startswith("a")),
        40,
    )
    assert all(p["id"].startswith("a") for p in got)
    assert len({p["id"] for p in got}) == 40
    assert np.all([len(p["input_ids"]) > 0 for p in got])
