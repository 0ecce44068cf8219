"""``benchmarks/bpe_workload.real_tokens`` counts the real (non-padding) tokens of packed
batches exactly, for Zephon's batches and the bare loop's alike."""

from __future__ import annotations

import numpy as np
import pytest
from benchmods import load

from zephon_core.ops.packed_batch import packed_fields

workload = load("bpe_workload")

WIDTH = 16
# rows as segment lengths: padded, full, a full row ending in a 1-token segment, a padded
# row whose last real segment is 1 token
ROWS = [[5, 3], [10, 6], [15, 1], [4, 1]]


def _ids(rng: np.random.Generator, rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    ids = np.zeros((len(rows), WIDTH), np.int64)
    lens = np.array([sum(r) for r in rows])
    for r, n in enumerate(lens):
        ids[r, :n] = rng.integers(1, 1000, n)  # token 0 is the pad id
    return ids, lens


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_counts_real_tokens_of_zephon_packed_batches(seed):
    ids, lens = _ids(np.random.default_rng(seed), ROWS)
    batch = packed_fields(
        ids.copy(), lens, [np.array(r) for r in ROWS], "position_ids", "float32", False
    )
    got = workload.real_tokens([workload.keep_fields(batch)] * 3)
    assert got == {"batches": 3.0, "real_tokens": 3.0 * lens.sum()}


def test_counts_real_tokens_of_the_bare_loops_batches(monkeypatch):
    monkeypatch.setattr(workload, "SEQ", WIDTH)
    monkeypatch.setattr(workload, "_ARANGE", np.arange(WIDTH, dtype=np.int64))
    ids, lens = _ids(np.random.default_rng(7), ROWS)
    batch = workload.collate([(ids[r, : lens[r]], seg) for r, seg in enumerate(ROWS)])
    assert workload.real_tokens([workload.keep_fields(batch)])["real_tokens"] == lens.sum()
