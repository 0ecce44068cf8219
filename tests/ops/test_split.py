"""split: long token sequences become children of <= max_len tokens."""

from __future__ import annotations

import numpy as np
import pytest
from opkit import bind, cursors, rec, run, token_source

from zephon_core import Pipeline
from zephon_core.errors import ConfigError, PipelineError
from zephon_core.ops import SplitOp
from zephon_core.records import Contributor, Record, SampleCursor


def test_children_cursors_last_flag_and_token_counts():
    op = bind(SplitOp(4))
    r = rec(7, 3, 10, comp=1, lane=2)
    out = op.process(r)
    assert cursors(out) == [(2, 7, 3, 0), (2, 7, 3, 1), (2, 7, 3, 2)]
    assert [len(c.payload["input_ids"]) for c in out] == [4, 4, 2]
    assert (
        np.concatenate([c.payload["input_ids"] for c in out]).tolist()
        == r.payload["input_ids"].tolist()
    )
    assert [c.contributors for c in out] == [
        [Contributor(7, 3, 0, False, 1, 4)],
        [Contributor(7, 3, 1, False, 1, 4)],
        [Contributor(7, 3, 2, True, 1, 2)],
    ]


@pytest.mark.parametrize(("n", "lens"), [(8, [4, 4]), (9, [4, 4, 1]), (4, [4]), (1, [1]), (0, [0])])
def test_boundaries(n, lens):
    out = bind(SplitOp(4)).process(rec(0, 0, n))
    assert [len(c.payload["input_ids"]) for c in out] == lens
    assert [c.contributors[0].is_last_child for c in out] == [False] * (len(lens) - 1) + [True]
    assert [c.contributors[0].n_tokens for c in out] == lens
    assert [c.cursor.child for c in out] == list(range(len(lens)))


def test_short_record_keeps_cursor_and_payload_and_gets_n_tokens():
    r = rec(1, 1, 3, comp=1, n_tokens=0, id="doc")
    (out,) = bind(SplitOp(5)).process(r)
    assert out.cursor == r.cursor
    assert out.payload is r.payload
    assert out.contributors == [Contributor(1, 1, 0, True, 1, 3)]


def test_arrays_of_the_same_length_are_cut_alongside_others_copied():
    n = 7
    payload = {
        "input_ids": np.arange(n, dtype=np.int32),
        "loss_mask": np.arange(100, 100 + n),
        "other_len": np.arange(3),
        "as_list": list(range(n)),
        "id": "d0",
    }
    out = bind(SplitOp(3)).process(rec(0, 0, payload=payload, n_tokens=0))
    assert [c.payload["loss_mask"].tolist() for c in out] == [
        [100, 101, 102],
        [103, 104, 105],
        [106],
    ]
    for c in out:
        assert c.payload["id"] == "d0"
        assert c.payload["other_len"].tolist() == [0, 1, 2]  # different length: copied
        assert c.payload["as_list"] == list(range(n))  # not an array: copied
        assert len(c.payload["input_ids"]) == len(c.payload["loss_mask"])
    assert payload["input_ids"].tolist() == list(range(n))  # input not mutated


def test_merged_or_already_split_records_are_rejected():
    op = bind(SplitOp(4))
    merged = Record(
        {"input_ids": np.arange(10, dtype=np.int32)},
        SampleCursor(0, 0, 0, 0),
        [Contributor(0, 0, 0, True, 0, 5), Contributor(0, 1, 0, True, 0, 5)],
    )
    with pytest.raises(ConfigError, match="split"):
        op.process(merged)
    with pytest.raises(ConfigError, match="split"):
        op.process(rec(0, 0, 10, child=1, last=True))


def test_missing_token_array_is_a_config_error():
    with pytest.raises(ConfigError, match="input_ids"):
        bind(SplitOp(4)).process(rec(0, 0, payload={"text": "abc"}))


@pytest.mark.parametrize("bad", [0, -1, 2.5, None])
def test_bad_max_len(bad):
    with pytest.raises(ConfigError):
        SplitOp(bad)


def test_custom_key():
    payload = {"ids": np.arange(5, dtype=np.int64)}
    out = bind(SplitOp(2, key="ids")).process(rec(0, 0, payload=payload))
    assert [c.payload["ids"].tolist() for c in out] == [[0, 1], [2, 3], [4]]


def test_traits():
    assert SplitOp.traits.preserves_cursor_order and SplitOp.traits.stateless


def test_pipeline_children_reassemble_the_documents():
    base = run(Pipeline(token_source(), canonical_replicas=1, seed=4).fetch(), 30)
    pieces = run(
        Pipeline(token_source(), canonical_replicas=1, seed=4).fetch().split(max_len=16), 200
    )
    assert all(0 < len(p["input_ids"]) <= 16 for p in pieces)
    docs, i = [], 0
    while len(docs) < 30 and i < len(pieces):
        doc_id, parts = pieces[i]["id"], []
        while i < len(pieces) and pieces[i]["id"] == doc_id and (not parts or len(parts[-1]) == 16):
            parts.append(pieces[i]["input_ids"])
            i += 1
        docs.append((doc_id, np.concatenate(parts)))
    assert [d for d, _ in docs] == [p["id"] for p in base][: len(docs)]
    for (_, got), want in zip(docs, base):
        assert got.tolist() == want["input_ids"].tolist()


def test_pipeline_split_after_pack_is_rejected():
    pipe = (
        Pipeline(token_source(), seed=1, prefetch=0, flush_every_k_chunks=2)
        .fetch()
        .split(max_len=32)
        .pack(seq_len=32, bins=2)
        .then(SplitOp(8, name="split2"))
    )
    with pytest.raises((ConfigError, PipelineError), match="split"):
        run(pipe, 50)


def test_bos_and_eos_frame_each_document_once():
    op = bind(SplitOp(4, bos_id=1, eos_id=2))
    r = rec(0, 0, 6)
    out = op.process(r)
    ids = np.concatenate([c.payload["input_ids"] for c in out]).tolist()
    assert ids == [1, *r.payload["input_ids"].tolist(), 2]  # one BOS, one EOS, not per child
    assert [len(c.payload["input_ids"]) for c in out] == [4, 4]
    assert out[0].payload["input_ids"].dtype == r.payload["input_ids"].dtype
    assert sum(c.contributors[0].n_tokens for c in out) == 8  # the mixture counts them
    (short,) = bind(SplitOp(8, eos_id=2)).process(rec(0, 1, 3))
    assert short.payload["input_ids"].tolist()[-1] == 2 and len(short.payload["input_ids"]) == 4


def test_framing_refuses_per_token_side_arrays():
    r = rec(0, 0, 5)
    r = r.with_payload({**r.payload, "loss_mask": np.ones(5, np.int8)})
    with pytest.raises(ConfigError, match="loss_mask"):
        bind(SplitOp(4, eos_id=2)).process(r)


def test_framed_packed_pipeline_resumes_exactly():
    from zephon_core.testing import assert_resume_equivalent

    def build():
        return (
            Pipeline(token_source(), canonical_replicas=2, flush_every_k_chunks=2, seed=4)
            .fetch()
            .split(max_len=16, bos_id=1, eos_id=2)
            .pack(seq_len=16, bins=2)
            .batch(batch_size=2)
        )

    assert_resume_equivalent(build, cut_points=[0, 3, 11], total=20)
    batches = take_batches(build(), 20)
    assert any((b["input_ids"] == 1).any() for b in batches)
    assert any((b["input_ids"] == 2).any() for b in batches)


def take_batches(pipe, n):
    from zephon_core.testing import take

    with pipe:
        return take(pipe, n)


@pytest.mark.parametrize("arg", ["bos_id", "eos_id"])
def test_a_token_id_beyond_any_vocabulary_is_refused_when_the_pipeline_is_described(arg):
    """split(eos_id=2**40) used to fail only at the first batch (a wrapped OverflowError)."""
    with pytest.raises(ConfigError, match=rf"split\({arg}=1099511627776\): must be an int >= 0 "):
        Pipeline(token_source(), canonical_replicas=2).fetch().split(max_len=16, **{arg: 2**40})
    SplitOp(16, **{arg: 2**31 - 1})  # the largest id split accepts


def test_special_tokens_wider_than_the_tokens_widen_the_framed_array():
    r = rec(0, 0, 5)
    r = r.with_payload({"input_ids": r.payload["input_ids"].astype(np.uint8)})  # byte tokens
    (out,) = bind(SplitOp(8, bos_id=256, eos_id=70_000)).process(r)
    ids = out.payload["input_ids"]
    assert ids.dtype == np.uint32
    assert ids.tolist() == [256, *r.payload["input_ids"].tolist(), 70_000]
    (same,) = bind(SplitOp(8, eos_id=2)).process(r)  # ids that fit keep the tokens' dtype
    assert same.payload["input_ids"].dtype == np.uint8
