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
from zephon_core.ops.token_batch import TokenBatch, narrow
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


@pytest.mark.slow
@pytest.mark.parametrize("kw", MODES + [dict(packed=False)], ids=str)
def test_worker_batches_equal_in_process_batches(kw):
    here = take(_pipe(**kw), 14)
    with _pipe(**kw).dataloader(num_workers=2) as loader:
        there = take(loader, 14)
    assert_streams_equal(here, there, f"in-process vs 2 workers, {kw}")
    assert all(b["input_ids"].dtype == torch.int64 for b in there)


@pytest.mark.slow
def test_what_a_worker_yields_is_a_token_batch():
    from torch.utils.data import DataLoader

    raw = DataLoader(
        _pipe().torch_dataset(), batch_size=None, num_workers=1, collate_fn=lambda x: x
    )
    payload, _delta = next(iter(raw))
    assert isinstance(payload, TokenBatch) and payload.tokens.dtype == np.uint16
    assert payload.build().keys() == take(_pipe(), 1)[0].keys()


def test_a_packed_batch_ships_a_fraction_of_its_tensor_bytes():
    rng = np.random.default_rng(0)
    width, rows = 2048, 8
    seglens = [np.array([700, 900, 400], dtype=np.int32) for _ in range(rows)]
    lens = np.array([s.sum() for s in seglens])
    tokens = rng.integers(0, 50_000, size=int(lens.sum())).astype(np.int64)
    tb = TokenBatch(tokens, lens, width, 0, seglens, "position_ids", "float32", False)
    wired = tb.for_wire()
    built = tb.build()
    assert wired.tokens.dtype == np.uint16
    assert all(torch.equal(built[k], wired.build()[k]) for k in built)
    tensor_bytes = sum(t.numel() * t.element_size() for t in built.values())
    wire = len(pickle.dumps(wired, protocol=pickle.HIGHEST_PROTOCOL))
    assert tensor_bytes >= 10 * wire  # three int64 [8, 2048] tensors vs uint16 tokens


def test_narrowing_never_changes_a_value():
    for values, dtype in [
        ([0, 65_535], np.uint16),
        ([-1, 5], np.int32),
        ([0, 65_536], np.int32),
        ([0, 2**31], np.int64),
        ([-(2**31) - 1, 0], np.int64),
    ]:
        got = narrow(np.array(values, dtype=np.int64))
        assert got.dtype == dtype and got.tolist() == values
    assert narrow(np.array([3], dtype=np.uint8)).dtype == np.uint8  # already narrow
    assert narrow(np.array([], dtype=np.int64)).size == 0


def _env_probe(payload: dict) -> dict:
    import os

    return {"rayon": os.environ.get("RAYON_NUM_THREADS", "unset")}


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_batch_whose_tensors_fail_to_build_is_not_counted(monkeypatch):
    """Building happens in the training process: if it fails, that batch was not handed
    out, so the state resumes with it (never one lost silently)."""
    want = take(_pipe(), 6)
    loader = _pipe().dataloader(num_workers=2)
    it = iter(loader)
    got = [next(it) for _ in range(3)]

    def broken(self):
        raise MemoryError("no room for the tensors")

    monkeypatch.setattr(TokenBatch, "build", broken)
    with pytest.raises(MemoryError):
        next(it)
    monkeypatch.undo()
    state = loader.checkpoint()
    loader.close()
    with _pipe().dataloader(num_workers=2, restore=state) as again:
        got += take(again, 3)
    assert_streams_equal(want, got, "a failed build, then resumed")
