"""batch: per-lane collation into dicts of torch tensors; drop_last stalls across flushes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from opkit import bind, feed, pending, rec, run, run_all, token_source

from zephon_core import Pipeline, StaticMixtureWorkSource
from zephon_core.errors import ConfigError
from zephon_core.ops import BatchOp, PackOp
from zephon_core.records import Contributor, Record, SampleCursor


def batcher(batch_size=2, drop_last=True, upstream=(), **kw):
    return bind(BatchOp(batch_size, drop_last, **kw), upstream=upstream)


def packed(offset, segments, chunk=0):
    ids = np.concatenate(
        [np.full(n, 10 * (j + 1) + offset, np.int32) for j, n in enumerate(segments)]
    )
    contribs = [
        Contributor(chunk, offset, j, j == len(segments) - 1, 0, n) for j, n in enumerate(segments)
    ]
    return Record(
        {"input_ids": ids, "segment_lengths": np.asarray(segments, np.int32)},
        SampleCursor(0, chunk, offset, 0),
        contribs,
    )


def test_unpacked_rows_dtypes_shapes_labels_and_mask():
    op = batcher(2, seq_len=6)
    r1, r2 = rec(0, 0, [5, 6, 7]), rec(0, 1, [1, 2, 3, 4, 9])
    assert op.process(r1) == []
    (b,) = op.process(r2)
    out = b.payload
    assert set(out) == {"input_ids", "labels", "attention_mask"}
    for k in out:
        assert out[k].shape == (2, 6)
    assert out["input_ids"].dtype == out["labels"].dtype == torch.int64
    assert out["attention_mask"].dtype in (torch.int64, torch.bool)
    assert out["input_ids"].tolist() == [[5, 6, 7, 0, 0, 0], [1, 2, 3, 4, 9, 0]]
    assert out["labels"].tolist() == [[5, 6, 7, -100, -100, -100], [1, 2, 3, 4, 9, -100]]
    assert out["attention_mask"].long().tolist() == [[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 0]]
    assert b.cursor == r2.cursor  # the last member's cursor
    assert b.contributors == r1.contributors + r2.contributors


def test_pad_id_and_pad_to_longest():
    op = batcher(2, seq_len=8, pad_to="longest", pad_id=7)
    (b,) = feed(op, [rec(0, 0, [1, 2]), rec(0, 1, [3, 4, 5])])
    assert b.payload["input_ids"].tolist() == [[1, 2, 7], [3, 4, 5]]
    assert b.payload["labels"].tolist() == [[1, 2, -100], [3, 4, 5]]  # labels ignore pad_id


def test_width_without_seq_len_and_pack_is_the_longest_row():
    (b,) = feed(batcher(2), [rec(0, 0, 4), rec(0, 1, 2)])
    assert b.payload["input_ids"].shape == (2, 4)


def test_width_defaults_to_upstream_pack_seq_len():
    op = batcher(2, upstream=(PackOp(12, 2),))
    (b,) = feed(op, [packed(0, [3, 2]), packed(1, [4])])
    assert b.payload["input_ids"].shape == (2, 12)


def test_packed_rows_tell_the_model_where_documents_start():
    op = batcher(2, seq_len=10)
    (b,) = feed(op, [packed(0, [3, 4]), packed(1, [2, 5, 3])])
    out = b.payload
    # default attention="position_ids": no attention_mask (it would switch off the
    # per-document mask Transformers derives from restarting position_ids)
    assert set(out) == {"input_ids", "labels", "position_ids"}
    for k in out:
        assert out[k].shape == (2, 10) and out[k].dtype == torch.int64, k
    assert out["position_ids"][0].tolist() == [0, 1, 2, 0, 1, 2, 3, 0, 1, 2]  # padding: 0..
    assert out["position_ids"][1].tolist() == [0, 1, 0, 1, 2, 3, 4, 0, 1, 2]
    assert out["input_ids"][0].tolist() == [10, 10, 10, 20, 20, 20, 20, 0, 0, 0]
    # -100 on padding and on each document's first token (never predicted across)
    assert out["labels"][0].tolist() == [-100, 10, 10, -100, 20, 20, 20, -100, -100, -100]
    assert out["labels"][1].tolist() == [-100, 11, -100, 21, 21, 21, 21, -100, 31, 31]


def test_packed_rows_mask_2d_keeps_segment_ids_for_custom_models():
    op = batcher(2, seq_len=10, attention="mask_2d")
    (b,) = feed(op, [packed(0, [3, 4]), packed(1, [2, 5, 3])])
    out = b.payload
    assert set(out) == {"input_ids", "labels", "attention_mask", "position_ids", "segment_ids"}
    assert out["segment_ids"].tolist() == [
        [1, 1, 1, 2, 2, 2, 2, 0, 0, 0],
        [1, 1, 2, 2, 2, 2, 2, 3, 3, 3],
    ]
    assert out["attention_mask"].long().tolist() == [[1] * 7 + [0] * 3, [1] * 10]
    assert out["labels"][0].tolist() == [-100, 10, 10, -100, 20, 20, 20, -100, -100, -100]


def test_packed_rows_mask_4d_is_block_diagonal_and_causal():
    op = batcher(1, seq_len=6, attention="mask_4d", mask_dtype="bfloat16")
    (b,) = feed(op, [packed(0, [2, 3])])
    m = b.payload["attention_mask"]
    assert m.shape == (1, 1, 6, 6) and m.dtype == torch.bfloat16
    allowed = (m[0, 0] == 0).int().tolist()
    assert allowed == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [0, 0, 1, 0, 0, 0],
        [0, 0, 1, 1, 0, 0],
        [0, 0, 1, 1, 1, 0],
        [0, 0, 0, 0, 0, 1],  # padding attends only itself
    ]
    assert (m[m != 0] == torch.finfo(torch.bfloat16).min).all()


def test_flash_kwargs_match_transformers_flattening_collator():
    transformers = pytest.importorskip("transformers")
    op = batcher(2, seq_len=10, flash_kwargs=True)
    (b,) = feed(op, [packed(0, [3, 4]), packed(1, [2, 5, 3])])
    out = b.payload
    # the collator flattens the same segments (row 0's 3 padding tokens are one more)
    segments = [[10] * 3, [20] * 4, [0] * 3, [11] * 2, [21] * 5, [31] * 3]
    ref = transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=True)(
        [{"input_ids": s} for s in segments]
    )
    assert out["cu_seq_lens_q"].tolist() == ref["cu_seq_lens_q"].tolist()
    assert out["cu_seq_lens_k"].tolist() == ref["cu_seq_lens_k"].tolist()
    assert out["max_length_q"] == ref["max_length_q"] == 5
    assert out["position_ids"].reshape(1, -1).tolist() == ref["position_ids"].tolist()


@pytest.mark.parametrize(
    "kw, match",
    [({"attention": "causal"}, "attention="), ({"mask_dtype": "int8"}, "mask_dtype=")],
)
def test_bad_attention_options_are_config_errors(kw, match):
    with pytest.raises(ConfigError, match=match):
        BatchOp(2, **kw)


def test_row_longer_than_seq_len_is_a_config_error():
    op = batcher(1, seq_len=4)
    with pytest.raises(ConfigError, match="seq_len=4"):
        op.process(rec(0, 0, 5))


def test_drop_last_true_stalls_across_flush_and_drops_at_finish():
    op = batcher(3, drop_last=True)
    recs = [rec(0, i, 2) for i in range(8)]
    assert feed(op, recs[:2]) == []
    assert list(op.flush()) == []  # the stall: nothing leaves ...
    assert pending(op)  # ... and the partial batch is kept
    (b,) = op.process(recs[2])  # completes across the flush
    assert [c.offset for c in b.contributors] == [0, 1, 2]
    assert feed(op, recs[3:8]) != []
    assert pending(op)  # recs 6, 7 wait
    assert list(op.flush()) == []
    dropped = list(op.finish())  # end of stream: dropped as tombstones
    assert all(t.is_tombstone for t in dropped)
    assert sorted(c.offset for t in dropped for c in t.contributors) == [6, 7]
    assert not pending(op)
    assert list(op.finish()) == []


def test_drop_last_false_emits_partial_batches_at_flush_and_finish():
    op = batcher(3, drop_last=False)
    recs = [rec(0, i, 2) for i in range(6)]
    assert feed(op, recs[:2]) == []
    (p,) = op.flush()
    assert p.payload["input_ids"].shape[0] == 2 and p.cursor == recs[1].cursor
    assert not pending(op)
    assert list(op.flush()) == []
    assert feed(op, recs[2:6]) != []
    (last,) = op.finish()
    assert not last.is_tombstone and last.payload["input_ids"].shape[0] == 1
    assert not pending(op)


def test_lanes_collate_separately():
    op = batcher(2)
    op1 = op.for_lane(1)  # each lane has its own instance
    assert op.process(rec(0, 0, 2, lane=0)) == []
    assert op1.process(rec(0, 0, 2, lane=1)) == []
    (b,) = op1.process(rec(0, 1, 2, lane=1))
    assert b.cursor == (1, 0, 1, 0)
    assert pending(op) and not pending(op1)


def test_generic_payloads_use_default_collate():
    op = batcher(3)
    recs = [
        Record(
            {"x": float(i), "y": i, "v": np.arange(3) + i, "s": f"s{i}"},
            SampleCursor(0, 0, i, 0),
            [Contributor(0, i, 0, True, 0, 0)],
        )
        for i in range(3)
    ]
    (b,) = feed(op, recs)
    out = b.payload
    assert out["x"].dtype == torch.float64 and out["x"].tolist() == [0.0, 1.0, 2.0]
    assert out["y"].dtype == torch.int64 and out["y"].tolist() == [0, 1, 2]
    assert out["v"].shape == (3, 3) and out["v"][2].tolist() == [2, 3, 4]
    assert out["s"] == ["s0", "s1", "s2"]
    ints = [
        Record(i, SampleCursor(0, 1, i, 0), [Contributor(1, i, 0, True, 0, 0)]) for i in range(3)
    ]
    (b2,) = feed(batcher(3), ints)
    assert torch.equal(b2.payload, torch.tensor([0, 1, 2]))


@pytest.mark.parametrize(
    "kw",
    [
        dict(batch_size=0),
        dict(batch_size=2.0),
        dict(batch_size=2, pad_to="min"),
        dict(batch_size=2, seq_len=0),
    ],
)
def test_bad_config(kw):
    with pytest.raises(ConfigError):
        BatchOp(**kw)


def test_traits():
    assert BatchOp.traits.preserves_cursor_order and not BatchOp.traits.stateless


# -- through a pipeline --------------------------------------------------------------


def _rows(name, n, start=0):
    return [{"v": start + i, "name": f"{name}{start + i}"} for i in range(n)]


def _generic_source(chunk_size=2, num_epochs=None):
    return StaticMixtureWorkSource(
        {"a": _rows("a", 11), "b": _rows("b", 7, 100)},
        {"a": 0.5, "b": 0.5},
        chunk_size=chunk_size,
        seed=1,
        shuffle=False,
        num_epochs=num_epochs,
    )


def _order_keeping_flusher(src, drop_last, k=1, batch_size=3):
    # shuffle(1) keeps order but is not order-preserving by trait: flushes happen
    return (
        Pipeline(src, seed=1, flush_every_k_chunks=k)
        .fetch()
        .shuffle(1)
        .batch(batch_size, drop_last=drop_last)
    )


def test_pipeline_drop_last_true_batches_span_flushes():
    records = run(Pipeline(_generic_source(), seed=1).fetch(), 30)
    batches = run(_order_keeping_flusher(_generic_source(), True), 10)
    # epochs are 2 records (k=1, chunk_size=2) but batches of 3 span them
    assert [b["v"].tolist() for b in batches] == [
        [r["v"] for r in records[i : i + 3]] for i in range(0, 30, 3)
    ]
    assert batches[0]["name"] == [r["name"] for r in records[:3]]


def test_pipeline_drop_last_false_emits_partial_at_each_flush():
    records = run(Pipeline(_generic_source(), seed=1).fetch(), 20)
    batches = run(_order_keeping_flusher(_generic_source(), False), 10)
    assert [b["v"].tolist() for b in batches] == [
        [r["v"] for r in records[i : i + 2]] for i in range(0, 20, 2)
    ]


@pytest.mark.parametrize("drop_last", [True, False])
def test_pipeline_finite_stream_end(drop_last):
    # 18 rows over 2-row chunks, flush every 2 chunks: epochs of 4, batches of 3
    records = run_all(Pipeline(_generic_source(num_epochs=1), seed=1).fetch())
    assert len(records) == 18
    pipe = _order_keeping_flusher(_generic_source(num_epochs=1), drop_last, k=2)
    batches = run_all(pipe)
    vs = [b["v"].tolist() for b in batches]
    if drop_last:  # full batches only, spanning epochs
        assert vs == [[r["v"] for r in records[i : i + 3]] for i in range(0, 18, 3)]
    else:  # every epoch of 4 ends with a partial batch of 1; 2 left at the end
        want = []
        for e in range(0, 18, 4):
            ep = [r["v"] for r in records[e : e + 4]]
            want += [ep[i : i + 3] for i in range(0, len(ep), 3)]
        assert vs == want
    # nothing is lost or duplicated (18 rows: full batches only, nothing left to drop)
    assert sorted(v for b in vs for v in b) == sorted(r["v"] for r in records)


def test_pipeline_finite_stream_drop_last_drops_the_tail():
    records = run_all(Pipeline(_generic_source(num_epochs=1), seed=1).fetch())
    batches = run_all(
        _order_keeping_flusher(_generic_source(num_epochs=1), True, k=2, batch_size=4)
    )
    assert [b["v"].tolist() for b in batches] == [
        [r["v"] for r in records[i : i + 4]] for i in range(0, 16, 4)
    ]
    pipe = _order_keeping_flusher(_generic_source(num_epochs=1), True, k=2, batch_size=4)
    try:
        it = iter(pipe)
        assert len(list(it)) == 4
        state = pipe.checkpoint()
    finally:
        pipe.close()
    assert all(lane["exhausted"] for lane in state["lanes"])


def test_pipeline_packed_batches():
    seq_len, bs = 32, 4
    rows = run(
        Pipeline(token_source(), seed=2, flush_every_k_chunks=2)
        .fetch()
        .split(max_len=seq_len)
        .pack(seq_len=seq_len, bins=3),
        4 * bs,
    )
    batches = run(
        Pipeline(token_source(), seed=2, flush_every_k_chunks=2)
        .fetch()
        .split(max_len=seq_len)
        .pack(seq_len=seq_len, bins=3)
        .batch(bs, drop_last=True, attention="mask_2d"),
        4,
    )
    for i, b in enumerate(batches):
        assert b["input_ids"].shape == (bs, seq_len)
        for j in range(bs):
            row = rows[i * bs + j]
            n = len(row["input_ids"])
            assert b["input_ids"][j, :n].tolist() == row["input_ids"].tolist()
            assert b["attention_mask"][j].sum().item() == n
            assert (b["labels"][j, n:] == -100).all()
            seg = np.repeat(np.arange(1, len(row["segment_lengths"]) + 1), row["segment_lengths"])
            assert b["segment_ids"][j, :n].tolist() == seg.tolist()
            assert (b["segment_ids"][j, n:] == 0).all()
            starts = np.r_[0, np.cumsum(row["segment_lengths"])[:-1]]
            assert (
                b["position_ids"][j, :n].tolist()
                == (np.arange(n) - np.repeat(starts, row["segment_lengths"])).tolist()
            )


def test_pipeline_pad_to_longest_without_pack():
    batches = run(Pipeline(token_source(), seed=2).fetch().batch(4, pad_to="longest"), 5)
    rows = run(Pipeline(token_source(), seed=2).fetch(), 20)
    for i, b in enumerate(batches):
        lens = [len(r["input_ids"]) for r in rows[4 * i : 4 * i + 4]]
        assert b["input_ids"].shape == (4, max(lens))
        assert b["attention_mask"].sum(1).tolist() == lens


@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(bs=st.integers(1, 5), drop_last=st.booleans(), data=st.data())
def test_batches_partition_the_input(bs, drop_last, data):
    lens = data.draw(st.lists(st.integers(1, 9), max_size=30), label="lengths")
    flush_after = set(data.draw(st.lists(st.integers(0, 30), max_size=4), label="flushes"))
    op = batcher(bs, drop_last=drop_last, seq_len=9)
    recs = [rec(i // 4, i % 4, n) for i, n in enumerate(lens)]
    batches, partial_ok = [], []
    for i, r in enumerate(recs):
        batches += op.process(r)
        partial_ok += [False] * (len(batches) - len(partial_ok))
        if i in flush_after:
            batches += op.flush()
            partial_ok += [True] * (len(batches) - len(partial_ok))
            waiting = i + 1 - sum(b.payload["input_ids"].shape[0] for b in batches)
            assert pending(op) == (waiting > 0)
            assert waiting == 0 or drop_last  # only drop_last=True stalls
    end = list(op.finish())
    assert not pending(op)
    live = [b for b in batches if not b.is_tombstone]
    assert len(live) == len(batches)
    rows = []
    for b, ok in zip(live, partial_ok):
        m = b.payload["attention_mask"].bool()
        n = b.payload["input_ids"].shape[0]
        assert n == bs or (ok and not drop_last)
        assert b.cursor == recs[len(rows) + n - 1].cursor
        rows += [b.payload["input_ids"][j][m[j]].tolist() for j in range(n)]
    if drop_last:
        assert all(t.is_tombstone for t in end)
        assert len(rows) == len(recs) // bs * bs
        assert sorted(c.offset + 4 * c.chunk_id for t in end for c in t.contributors) == list(
            range(len(rows), len(recs))
        )
    else:
        for b in end:
            rows += [
                x[m].tolist()
                for x, m in zip(b.payload["input_ids"], b.payload["attention_mask"].bool())
            ]
        assert len(rows) == len(recs)
    assert rows == [r.payload["input_ids"].tolist() for r in recs[: len(rows)]]


@pytest.mark.parametrize(
    "tokens, word",
    [
        (np.arange(8, dtype=np.float64) + 0.7, "float64"),
        (np.ones((2, 4), dtype=np.int64), "2-D"),
    ],
)
def test_batch_refuses_non_integer_or_2d_token_ids(tokens, word):
    from zephon_core.errors import ContractViolation

    op = bind(BatchOp(batch_size=2, seq_len=16))
    records = [rec(0, 0, 4), rec(0, 1, payload={"input_ids": tokens})]
    with pytest.raises(ContractViolation, match="'batch'") as ei:
        feed(op, records)
    assert word in str(ei.value)


@pytest.mark.parametrize(
    "attention, flash", [("position_ids", True), ("mask_4d", False), ("mask_2d", False)]
)
def test_every_packed_attention_mode_resumes_exactly(attention, flash):
    from zephon_core.testing import assert_resume_equivalent

    def build():
        return (
            Pipeline(token_source(), canonical_replicas=2, seed=2, flush_every_k_chunks=2)
            .fetch()
            .split(max_len=12)
            .pack(seq_len=12, bins=3)
            .batch(3, attention=attention, flash_kwargs=flash)
        )

    assert_resume_equivalent(build, cut_points=[0, 4, 9], total=15)
