"""In-process ``batch`` writes its rows straight into the tensors (``token_batch.tensors``);
a worker ships them concatenated (``TokenBatch``) and the training process builds them.
Both must give the same tensors, whatever the rows' dtypes, modes and padding."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from opkit import bind, feed, rec

from zephon_core.errors import ContractViolation
from zephon_core.ops import BatchOp, PackOp
from zephon_core.ops.token_batch import TokenBatch

MODES = [
    dict(attention="position_ids"),
    dict(attention="position_ids", flash_kwargs=True),
    dict(attention="mask_4d", mask_dtype="bfloat16"),
    dict(attention="mask_2d"),
]


def _records(dtypes, packed: bool, seed: int = 0):
    rng = np.random.default_rng(seed)
    out = []
    for i, dtype in enumerate(dtypes):
        segs = rng.integers(1, 5, size=int(rng.integers(1, 3))).astype(np.int32)
        ids = rng.integers(0, 250, size=int(segs.sum())).astype(dtype)
        payload = {"input_ids": ids}
        if packed:
            payload["segment_lengths"] = segs
        out.append(rec(0, i, payload=payload))
    return out


def _both(records, batch_size: int, packed: bool, **kw):
    """The batches of the in-process path and those the wire path builds."""
    upstream = (PackOp(seq_len=12),) if packed else ()
    here = bind(BatchOp(batch_size, seq_len=12, **kw), upstream=upstream)
    wire = bind(BatchOp(batch_size, seq_len=12, **kw), upstream=upstream)
    wire.compact = True
    a = [r.payload for r in feed(here, records)]
    b = [r.payload for r in feed(wire, records)]
    assert all(isinstance(p, TokenBatch) for p in b)
    return a, [p.build() for p in b]


def _same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b) and a
    for x, y in zip(a, b):
        assert list(x) == list(y)
        for k in x:
            if isinstance(x[k], torch.Tensor):
                assert x[k].dtype == y[k].dtype and torch.equal(x[k], y[k]), k
            else:
                assert x[k] == y[k], k


@pytest.mark.parametrize("kw", MODES, ids=str)
@pytest.mark.parametrize("pad_id", [0, 7])
def test_packed_rows_in_process_equal_the_wire_path(kw, pad_id):
    records = _records([np.int32] * 9, packed=True)
    _same(*_both(records, 3, True, pad_id=pad_id, **kw))


@pytest.mark.parametrize("pad_id", [0, -1])
def test_unpacked_rows_in_process_equal_the_wire_path(pad_id):
    records = _records([np.uint16] * 8, packed=False, seed=1)
    _same(*_both(records, 4, False, pad_id=pad_id))


def test_rows_of_different_integer_dtypes_give_the_same_values():
    """Rows of mixed dtypes take the concatenating path: same tensors either way."""
    dtypes = [np.int32, np.int64, np.uint8, np.int16, np.uint16, np.int64]
    records = _records(dtypes, packed=True, seed=2)
    _same(*_both(records, 3, True))
    here, _ = _both(records, 3, True)
    assert all(b["input_ids"].dtype == torch.int64 for b in here)


def test_int64_and_uint64_rows_are_refused_as_their_concatenation_is():
    """Their concatenation is float64: refused, not wrapped around, on both paths."""
    records = _records([np.int64, np.uint64], packed=False)
    for compact in (False, True):
        op = bind(BatchOp(2, seq_len=12))
        op.compact = compact
        with pytest.raises(ContractViolation, match="'batch'"):
            feed(op, records)
