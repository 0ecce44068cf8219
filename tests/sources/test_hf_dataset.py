"""HF datasets.Dataset works as a mixture component through duck typing (len + __getitems__)."""

from __future__ import annotations

import datasets
from helpers import byte_tokenize

from zephon_core import Pipeline, StaticMixtureWorkSource
from zephon_core.testing import assert_resume_equivalent, take


class CountingDataset:
    """Wraps an HF Dataset and counts batched reads."""

    def __init__(self, ds):
        self.ds = ds
        self.calls = 0

    def __len__(self):
        return len(self.ds)

    def __getitems__(self, keys):
        self.calls += 1
        return self.ds.__getitems__(keys)


def _hf(n: int, prefix: str) -> datasets.Dataset:
    return datasets.Dataset.from_dict(
        {"text": [f"{prefix}{i} " * (1 + i % 7) for i in range(n)], "idx": list(range(n))}
    )


_tokenize = byte_tokenize


def _build(a, b) -> Pipeline:
    src = StaticMixtureWorkSource({"a": a, "b": b}, {"a": 0.6, "b": 0.4}, chunk_size=8, seed=3)
    return (
        Pipeline(src, canonical_replicas=2, seed=3)
        .fetch()
        .map(_tokenize)
        .split(16)
        .pack(16, bins=3)
        .shuffle(8)
        .batch(2)
    )


def test_hf_rows_are_fetched_with_one_batched_read_per_dataset_per_chunk():
    a, b = CountingDataset(_hf(50, "a")), CountingDataset(_hf(30, "b"))
    src = StaticMixtureWorkSource({"a": a, "b": b}, {"a": 0.5, "b": 0.5}, chunk_size=10, seed=1)
    pipe = Pipeline(src, canonical_replicas=1, prefetch=0).fetch()
    pipe.compile()  # the content fingerprint reads each dataset once, when compiling
    a.calls = b.calls = 0
    rows = take(pipe, 30)  # three chunks
    pipe.close()
    assert a.calls == 3 and b.calls == 3
    assert all(set(r) == {"text", "idx"} for r in rows)
    # each row is the one its pointer names
    texts = {r["text"] for r in rows}
    assert len(texts) == 30


def test_hf_dataset_components_resume_exactly():
    a, b = _hf(60, "x"), _hf(40, "y")
    report = assert_resume_equivalent(lambda: _build(a, b), [0, 3, 11, 40], total=70)
    assert report.cuts == [0, 3, 11, 40]


def test_hf_with_format_columns_are_respected():
    ds = _hf(20, "z").with_format(columns=["text"])
    src = StaticMixtureWorkSource({"z": ds}, chunk_size=4, seed=0)
    pipe = Pipeline(src, prefetch=0).fetch()
    rows = take(pipe, 8)
    pipe.close()
    assert all(set(r) == {"text"} for r in rows)
