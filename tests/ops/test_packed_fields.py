"""``packed_fields`` (written row by row for speed) equals the direct vectorized
definition of what a packed batch holds, for random layouts and every attention mode."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_core.ops.packed_batch import ATTENTION_MODES, _block_causal, packed_fields


def reference(ids, lens, seglens, attention):
    """The definition, with full-size masks (the implementation before it was optimized)."""
    b, width = ids.shape
    maskb = np.arange(width)[None, :] < lens[:, None]
    flen = np.concatenate(seglens).astype(np.int64)
    fstart = np.cumsum(flen) - flen
    pos = np.arange(width, dtype=np.int64)[None, :] - maskb.sum(axis=1, keepdims=True)
    pos[maskb] = np.arange(int(flen.sum())) - np.repeat(fstart, flen)
    labels = np.where(maskb, ids, -100)
    labels[maskb & (pos == 0)] = -100
    out = {"input_ids": ids, "labels": labels, "position_ids": pos}
    if attention == "mask_2d":
        per_row = np.array([len(x) for x in seglens])
        seg = np.zeros((b, width), dtype=np.int64)
        idx = np.arange(len(flen)) - np.repeat(np.cumsum(per_row) - per_row, per_row)
        seg[maskb] = np.repeat(idx + 1, flen)
        out["attention_mask"] = maskb.astype(np.int64)
        out["segment_ids"] = seg
    elif attention == "mask_4d":
        out["attention_mask"] = _block_causal(pos, torch.float32)
    return {k: torch.as_tensor(v) for k, v in out.items()}


@pytest.mark.slow  # many seconds in this process
@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(
    width=st.integers(1, 40),
    rows=st.lists(st.lists(st.integers(1, 12), min_size=1, max_size=5), min_size=1, max_size=6),
    attention=st.sampled_from(ATTENTION_MODES),
    data=st.data(),
)
def test_row_by_row_equals_the_definition(width, rows, attention, data):
    seglens, lens = [], []
    for segs in rows:
        kept, total = [], 0
        for n in segs:
            if total + n <= width:
                kept.append(n)
                total += n
        kept = kept or [width]
        seglens.append(np.array(kept, dtype=np.int64))
        lens.append(sum(kept))
    lens = np.array(lens, dtype=np.int64)
    ids = np.zeros((len(rows), width), dtype=np.int64)
    for r, n in enumerate(lens.tolist()):
        ids[r, :n] = data.draw(st.lists(st.integers(1, 9999), min_size=n, max_size=n))
    got = packed_fields(ids, lens, seglens, attention, "float32", False)
    want = reference(ids, lens, seglens, attention)
    assert got.keys() == want.keys()
    for k in want:
        assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]), k
