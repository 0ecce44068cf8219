"""The helpers of ``benchmarks/bench_vs_hf_datasets.py``: the exactness check (cut,
restore into a fresh run, compare) names each cut a broken restore gets wrong, and the
HF packing map keeps every token in rows of at most SEQ."""

from __future__ import annotations

import numpy as np
from benchmods import load

vs_hf = load("bench_vs_hf_datasets")
workload = load("bpe_workload")


class _Run:
    """Batches {"x": [i]}; ``honest=False`` ignores the state, as a lost buffer would."""

    def __init__(self, state, honest: bool):
        self.i = 0 if state is vs_hf.FRESH or not honest else state
        self.closed = False

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        self.i += 1
        return {"x": np.array([self.i])}

    def checkpoint(self) -> int:
        return self.i

    def close(self) -> None:
        self.closed = True


def test_exact_resume_accepts_a_faithful_restore():
    got = vs_hf.exact_resume(lambda s: _Run(s, honest=True), (2, 7), 3)
    assert got == "yes (cuts at 2, 7; 3 batches compared after each)"


def test_exact_resume_names_every_cut_a_broken_restore_gets_wrong():
    got = vs_hf.exact_resume(lambda s: _Run(s, honest=False), (2, 7), 3)
    assert got == "no: batch 2 differs after a cut at 2; batch 7 differs after a cut at 7"


def test_pack_rows_keeps_every_token_in_rows_of_at_most_seq():
    rng = np.random.default_rng(0)
    docs = [rng.integers(1, 100, n).astype(np.int32) for n in (5000, 300, 2048, 1, 900, 1200)]
    out = vs_hf.pack_rows({"input_ids": docs})
    rows = out["input_ids"]
    assert all(len(r) <= workload.SEQ for r in rows)
    assert [sum(s) for s in out["segments"]] == [len(r) for r in rows]
    assert sorted(np.concatenate(rows).tolist()) == sorted(np.concatenate(docs).tolist())
