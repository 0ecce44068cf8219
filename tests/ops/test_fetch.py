"""fetch: pointers -> rows, one batched read per dataset per chunk, cursor order kept."""

from __future__ import annotations

import pytest
from opkit import CountingDataset, bind, cursors, run

from zephon_core import Pipeline, StaticMixtureWorkSource
from zephon_core.ops import FetchOp
from zephon_core.records import Contributor, Record, SampleCursor


def _source(chunk_size=8, weights=(0.6, 0.4)):
    a = CountingDataset([{"v": f"a{i}"} for i in range(23)])
    b = CountingDataset([{"v": f"b{i}"} for i in range(17)])
    src = StaticMixtureWorkSource(
        {"a": a, "b": b}, {"a": weights[0], "b": weights[1]}, chunk_size=chunk_size, seed=3
    )
    return src, a, b


def _pointer(offset, comp, row, chunk=0, lane=0):
    return Record(
        (comp, row),
        SampleCursor(lane, chunk, offset, 0),
        [Contributor(chunk, offset, 0, True, comp, 0)],
    )


def test_one_batched_read_per_dataset_and_order_kept():
    src, a, b = _source()
    op = bind(FetchOp(), source=src)
    recs = [
        _pointer(0, 0, 5),
        _pointer(1, 1, 3),
        _pointer(2, 0, 7),
        _pointer(3, 0, 1),
        _pointer(4, 1, 16),
    ]
    out = op.process_many(recs)
    assert a.calls == [[5, 7, 1]]
    assert b.calls == [[3, 16]]
    assert a.single_reads == b.single_reads == 0
    assert [r.payload["v"] for r in out] == ["a5", "b3", "a7", "a1", "b16"]
    assert cursors(out) == cursors(recs)
    assert [r.contributors for r in out] == [r.contributors for r in recs]


def test_single_record_and_single_component():
    src, a, b = _source()
    op = bind(FetchOp(), source=src)
    out = op.process(_pointer(0, 1, 2))
    assert [r.payload for r in out] == [{"v": "b2"}]
    assert b.calls == [[2]] and a.calls == []
    op.process_many([_pointer(i, 0, i) for i in range(4)])
    assert a.calls == [[0, 1, 2, 3]]


def test_falls_back_to_getitem_without_getitems():
    src = StaticMixtureWorkSource({"a": ["x", "y", "z"]}, chunk_size=2, seed=0)
    op = bind(FetchOp(), source=src, names=("a",), weights=(1.0,))
    out = op.process_many([_pointer(0, 0, 2), _pointer(1, 0, 0)])
    assert [r.payload for r in out] == ["z", "x"]


def test_traits():
    assert FetchOp.traits.preserves_cursor_order and FetchOp.traits.stateless


def _expected_rows(src, lanes, n_chunks):
    """Every chunk's rows per component, as fetch must read them: {(comp, rows)}."""
    expected = {}
    for lane in range(lanes):
        ws = src.open_lane(lane, lanes, 1)
        for _ in range(n_chunks):
            ch = ws.next_chunk()
            for comp in dict.fromkeys(ch.components):
                rows = [r for c, r in zip(ch.components, ch.rows) if c == comp]
                expected.setdefault(comp, []).append(rows)
    return expected


@pytest.mark.parametrize("parallelism", [1, 3])
@pytest.mark.parametrize("prefetch", [0, 2])
def test_pipeline_reads_once_per_dataset_per_chunk(parallelism, prefetch):
    src, a, b = _source(chunk_size=8)
    pipe = Pipeline(src, canonical_replicas=2, seed=1, prefetch=prefetch).fetch(parallelism)
    pipe.compile()  # the content fingerprint reads each dataset once, when compiling
    assert len(a.calls) == len(b.calls) == 1
    a.calls.clear()
    b.calls.clear()
    out = run(pipe, 60)
    assert len(out) == 60
    assert a.single_reads == b.single_reads == 0
    expected = _expected_rows(src, 2, 40)
    for comp, ds in ((0, a), (1, b)):
        assert ds.calls, "no batched read happened"
        for call in ds.calls:  # each read is exactly one chunk's rows of that dataset
            assert call in expected[comp]
        # ... and no chunk was read twice for the same dataset
        assert len({tuple(c) for c in ds.calls}) == len(ds.calls)
    # every chunk that was needed for the 60 outputs was read: 60 rows over 2 lanes
    # of 8-row chunks means at least 4 chunks per lane
    n_chunks = {len(c) for c in a.calls}
    assert n_chunks and sum(len(c) for c in a.calls) + sum(len(c) for c in b.calls) >= 60


def test_pipeline_rows_match_source_order():
    src, a, b = _source(chunk_size=4)
    pipe = Pipeline(src, canonical_replicas=1, seed=1, prefetch=0).fetch()
    out = run(pipe, 20)
    ws = src.open_lane(0, 1, 1)
    want = []
    while len(want) < 20:
        ch = ws.next_chunk()
        want += [(a, b)[c].rows[r] for c, r in zip(ch.components, ch.rows)]
    assert out == want[:20]


class _BadRow(CountingDataset):
    broken = False  # set after compile: the content fingerprint reads every row once

    def __getitems__(self, idxs):
        if self.broken and 7 in idxs:
            raise OSError("disk read error")
        return super().__getitems__(idxs)


def test_a_failing_read_names_the_dataset_and_the_row():
    from zephon_core import PipelineError

    flaky = _BadRow(list(range(20)))
    src = StaticMixtureWorkSource(
        {"good": CountingDataset(list(range(20))), "flaky": flaky},
        chunk_size=4,
        seed=1,
        shuffle=False,
    )
    pipe = Pipeline(src, canonical_replicas=1, seed=1, prefetch=0).fetch()
    pipe.compile()
    flaky.broken = True
    with pytest.raises(PipelineError, match="row 7 of dataset 'flaky'.*disk read error") as ei:
        run(pipe, 60)
    assert ei.value.operator == "fetch" and ei.value.cursor is not None
