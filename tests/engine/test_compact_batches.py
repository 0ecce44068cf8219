"""Batches cross a DataLoader worker's pipe as tokens + lengths (``ops/token_batch.py``)
and are built in the training process: identical to the in-process batches in every
attention mode, at a fraction of the bytes."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from helpers import byte_tokenize, source

from zephon_core import Pipeline
from zephon_core.ops.token_batch import TokenBatch, wire_dtype
from zephon_core.testing import assert_streams_equal, take

MODES = [
    dict(attention="position_ids"),
    dict(attention="position_ids", flash_kwargs=True),
    dict(attention="mask_4d", mask_dtype="bfloat16"),
    dict(attention="mask_2d"),
]


def _pipe(packed: bool = True, **batch_kw) -> Pipeline:
    pipe = (
        Pipeline(source(8), canonical_replicas=2, flush_every_k_chunks=2 if packed else 0, seed=1)
        .fetch()
        .map(byte_tokenize, name="tok")
        .split(max_len=96)
    )
    if packed:
        pipe = pipe.pack(seq_len=96, bins=2)
    return pipe.batch(batch_size=3, **batch_kw)


@pytest.mark.parametrize("kw", MODES + [dict(packed=False)], ids=str)
def test_worker_batches_equal_in_process_batches(kw):
    here = take(_pipe(**kw), 14)
    with _pipe(**kw).dataloader(num_workers=2) as loader:
        there = take(loader, 14)
    assert_streams_equal(here, there, f"in-process vs 2 workers, {kw}")
    assert all(b["input_ids"].dtype == torch.int64 for b in there)


def test_what_a_worker_yields_is_a_token_batch():
    from torch.utils.data import DataLoader

    raw = DataLoader(
        _pipe().torch_dataset(), batch_size=None, num_workers=1, collate_fn=lambda x: x
    )
    payload, _delta = next(iter(raw))
    assert isinstance(payload, TokenBatch) and payload.ids.dtype == np.int32
    assert payload.build().keys() == take(_pipe(), 1)[0].keys()


def test_a_packed_batch_ships_a_fraction_of_its_tensor_bytes():
    rng = np.random.default_rng(0)
    width, rows = 2048, 8
    seglens = [np.array([700, 900, 400], dtype=np.int64) for _ in range(rows)]
    lens = np.array([s.sum() for s in seglens])
    tokens = rng.integers(0, 8192, size=int(lens.sum())).astype(np.int32)
    ids = np.zeros((rows, width), dtype=wire_dtype(tokens, 0))
    ids[np.arange(width)[None, :] < lens[:, None]] = tokens
    tb = TokenBatch(ids, lens, seglens, "position_ids", "float32", False)
    built = tb.build()
    tensor_bytes = sum(t.numel() * t.element_size() for t in built.values())
    wire = len(pickle.dumps(tb, protocol=pickle.HIGHEST_PROTOCOL))
    assert ids.dtype == np.int32
    assert tensor_bytes >= 5 * wire  # three int64 [8, 2048] tensors vs int32 tokens


def test_wide_tokens_stay_int64():
    assert wire_dtype(np.array([1], dtype=np.int64), 0) is np.int64
    assert wire_dtype(np.array([1], dtype=np.uint32), 0) is np.int64
    assert wire_dtype(np.array([1], dtype=np.int32), 2**31) is np.int64
    assert wire_dtype(np.array([1], dtype=np.uint16), -1) is np.int32


def _env_probe(payload: dict) -> dict:
    import os

    return {"rayon": os.environ.get("RAYON_NUM_THREADS", "unset")}


def test_workers_share_the_cores_among_their_native_pools(monkeypatch):
    from zephon_core.engine.cores import usable_cores

    monkeypatch.delenv("RAYON_NUM_THREADS", raising=False)

    def pipe():
        return Pipeline(source(4), canonical_replicas=2, seed=1).fetch().map(_env_probe)

    with pipe().dataloader(num_workers=2) as loader:
        seen = {out["rayon"] for out in take(loader, 6)}
    assert seen == {str(max(1, usable_cores() // 2))}
    monkeypatch.setenv("RAYON_NUM_THREADS", "7")  # the user's setting wins
    with pipe().dataloader(num_workers=2) as loader:
        assert {out["rayon"] for out in take(loader, 4)} == {"7"}
