"""HF datasets as mixture components: fast Arrow reads, splits, saved paths, clear refusals."""

from __future__ import annotations

import datasets
import numpy as np
import pytest
from helpers import byte_tokenize

from zephon_core import ConfigError, Pipeline, StaticMixtureWorkSource
from zephon_core.testing import assert_resume_equivalent, take
from zephon_integrations.hf import HFComponent, hf_component, hf_components


def _ds(n: int, prefix: str) -> datasets.Dataset:
    return datasets.Dataset.from_dict(
        {
            "text": [f"{prefix}{i} " * (1 + i % 5) for i in range(n)],
            "idx": list(range(n)),
            "meta": [i % 3 for i in range(n)],
        }
    )


ROWS = [7, 0, 3, 3, 12]


@pytest.mark.parametrize(
    "make, columns",
    [
        (lambda d: d, None),
        (lambda d: d, ["text"]),
        (lambda d: d.select_columns(["idx", "text"]), None),
        (lambda d: d.with_format(columns=["idx"]), None),
        (lambda d: d.shuffle(seed=3), None),  # an indices mapping: no fast path
        (lambda d: d.select(range(5, 20)), ["meta"]),
        (lambda d: d.with_format("numpy"), None),  # a format: the dataset's own reader
    ],
)
def test_rows_equal_what_the_dataset_itself_returns(make, columns):
    ds = make(_ds(30, "r"))
    comp = hf_component(ds, columns=columns)
    expected = ds.select_columns(columns) if columns else ds
    got = comp.__getitems__(ROWS)
    want = expected.__getitems__(ROWS)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.keys() == w.keys()
        for k in g:
            assert np.array_equal(np.asarray(g[k]), np.asarray(w[k]))
    assert len(comp) == len(ds)


def test_fast_path_is_taken_for_plain_datasets_only():
    assert hf_component(_ds(5, "a")).fast
    assert not hf_component(_ds(5, "a").shuffle(seed=1)).fast
    assert not hf_component(_ds(5, "a").with_format("numpy")).fast


def test_datasetdict_split_and_saved_path(tmp_path):
    dd = datasets.DatasetDict({"train": _ds(10, "t"), "test": _ds(4, "v")})
    assert len(hf_component(dd, split="test")) == 4
    with pytest.raises(ConfigError, match="split"):
        hf_component(dd)
    with pytest.raises(ConfigError, match="'valid'"):
        hf_component(dd, split="valid")
    dd.save_to_disk(str(tmp_path / "dd"))
    comp = hf_component(tmp_path / "dd", split="train")
    assert comp.__getitems__([9])[0]["idx"] == 9
    _ds(6, "s").save_to_disk(str(tmp_path / "single"))
    assert len(hf_component(str(tmp_path / "single"))) == 6


@pytest.mark.parametrize("fmt", ["json", "parquet"])
def test_local_load_dataset_files_are_components(tmp_path, fmt):
    """``load_dataset("json"/"parquet", data_files=...)``, split or DatasetDict, offline."""
    src = _ds(25, "f")
    path = str(tmp_path / f"rows.{fmt}")
    src.to_json(path) if fmt == "json" else src.to_parquet(path)
    cache = str(tmp_path / "cache")
    as_split = datasets.load_dataset(fmt, data_files=path, split="train", cache_dir=cache)
    as_dict = datasets.load_dataset(fmt, data_files={"train": path}, cache_dir=cache)
    for comp in (
        hf_component(as_split, columns=["idx", "text"]),
        hf_component(as_dict, split="train", columns=["idx", "text"]),
    ):
        assert len(comp) == 25
        assert comp.__getitems__(ROWS) == src.select_columns(["idx", "text"]).__getitems__(ROWS)
    pipe = Pipeline(
        StaticMixtureWorkSource({"a": hf_component(as_split)}, {"a": 1.0}, chunk_size=4, seed=2),
        canonical_replicas=2,
        seed=2,
    ).fetch()
    rows = [r["idx"] for r in take(pipe, 25)]
    assert sorted(rows) == list(range(25))  # one epoch: every row once


def test_streaming_and_unknown_inputs_are_refused_with_the_fix():
    it = _ds(5, "s").to_iterable_dataset()
    with pytest.raises(ConfigError, match="streaming.*save_to_disk"):
        hf_component(it)
    with pytest.raises(ConfigError, match="datasets.Dataset"):
        hf_component([1, 2, 3])
    with pytest.raises(ConfigError, match="not in the dataset"):
        hf_component(_ds(5, "s"), columns=["nope"])


def _build(comps) -> Pipeline:
    tok = byte_tokenize
    src = StaticMixtureWorkSource(comps, {"a": 0.6, "b": 0.4}, chunk_size=8, seed=5)
    return (
        Pipeline(src, canonical_replicas=2, seed=5)
        .fetch(parallelism=2)
        .map(tok, parallelism=2)
        .split(24)
        .pack(24, bins=3)
        .shuffle(8)
        .batch(2)
    )


def test_components_resume_exactly_through_a_pipeline(tmp_path):
    _ds(40, "b").save_to_disk(str(tmp_path / "b"))
    datasets.DatasetDict({"train": _ds(50, "a")}).save_to_disk(str(tmp_path / "a"))
    datasets.DatasetDict({"train": datasets.load_from_disk(str(tmp_path / "b"))}).save_to_disk(
        str(tmp_path / "b_dict")
    )
    comps = hf_components(
        {"a": str(tmp_path / "a"), "b": str(tmp_path / "b_dict")}, split="train", columns=["text"]
    )
    assert all(isinstance(c, HFComponent) for c in comps.values())
    report = assert_resume_equivalent(lambda: _build(comps), [0, 5, 23], total=60)
    assert report.cuts == [0, 5, 23]


def test_one_batched_read_per_dataset_per_chunk():
    calls = []

    class Counting(HFComponent):
        def __getitems__(self, rows):
            calls.append(len(rows))
            return super().__getitems__(rows)

    a, b = Counting(_ds(30, "a")), Counting(_ds(30, "b"))
    src = StaticMixtureWorkSource({"a": a, "b": b}, {"a": 0.5, "b": 0.5}, chunk_size=10, seed=0)
    pipe = Pipeline(src, prefetch=0).fetch()
    rows = take(pipe, 20)
    pipe.close()
    assert len(calls) == 4 and sum(calls) == 20
    assert all(set(r) == {"text", "idx", "meta"} for r in rows)


def test_a_transformed_hf_dataset_is_incompatible_with_the_checkpoint():
    """``Dataset._fingerprint`` changes with every transform: a checkpoint taken over the
    original rows refuses to restore over mapped ones (and says how to accept it)."""
    from zephon_core import IncompatibleCheckpoint

    def build(ds):
        src = StaticMixtureWorkSource(hf_components({"a": ds}), chunk_size=4, seed=0)
        return Pipeline(src, prefetch=0).fetch()

    ds = _ds(30, "a")
    with build(ds) as pipe:
        take(pipe, 5)
        state = pipe.checkpoint()
    changed = ds.map(lambda r: {"text": r["text"].upper()})
    with pytest.raises(IncompatibleCheckpoint, match="dataset 'a'.*allow_changes"):
        build(changed).load_state_dict(state)
    again = build(ds)  # the same dataset (same fingerprint) restores
    again.load_state_dict(state)
    again.close()
