"""Parquet components at scale: the saved index, the footer progress bar, the local disk
cache, and read counters shipped from DataLoader workers."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import parquet_pipe, small_packed
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_core import ConfigError, Pipeline, StaticMixtureWorkSource
from zephon_core.sources import parquet_index
from zephon_core.sources.parquet import parquet_component
from zephon_core.testing import assert_resume_equivalent, assert_streams_equal, take
from zephon_core.testing.s3 import FaultProxy, s3_server


def _rows(shard: int, n: int = 40) -> list[dict]:
    rng = np.random.default_rng(shard)
    return [
        {"text": f"s{shard}r{i} " + "z" * int(rng.integers(5, 120)), "meta": "m" * 50}
        for i in range(n)
    ]


def _write(open_fn, path: str, rows: list[dict]) -> None:
    with open_fn(path, "wb") as fh:
        pq.write_table(pa.Table.from_pylist(rows), fh, row_group_size=8)


@pytest.fixture()
def shards(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for s in range(6):
        _write(open, str(data / f"part-{s:03d}.parquet"), _rows(s))
    return data


@pytest.fixture()
def footers(monkeypatch):
    """Counts footer reads (our own indexing step, not the Parquet library)."""
    calls: list[str] = []
    real = parquet_index._read_footer

    def counting(fs, path, *args, **kw):
        calls.append(path)
        return real(fs, path, *args, **kw)

    monkeypatch.setattr(parquet_index, "_read_footer", counting)
    return calls


def test_a_saved_index_is_reused_while_the_shards_are_unchanged(shards, tmp_path, footers):
    index = str(tmp_path / "cache" / "index.json")
    first = parquet_component(str(shards), columns=["text"], index_path=index)
    assert len(footers) == 6 and json.loads(open(index).read())["version"] == 1
    again = parquet_component(str(shards), columns=["text"], index_path=index)
    assert len(footers) == 6  # nothing read again
    assert again.zephon_fingerprint() == first.zephon_fingerprint()
    assert again.__getitems__([0, 100, 239]) == first.__getitems__([0, 100, 239])

    _write(open, str(shards / "part-002.parquet"), _rows(2, n=33))  # rewritten
    changed = parquet_component(str(shards), columns=["text"], index_path=index)
    assert footers[6:] == [str(shards / "part-002.parquet")]  # only the changed shard
    assert len(changed) == 5 * 40 + 33
    assert changed.zephon_fingerprint() != first.zephon_fingerprint()
    assert sum(json.loads(open(index).read())["shards"][2]["row_groups"]) == 33


def test_a_saved_index_still_checks_columns_and_corruption_is_named(shards, tmp_path):
    index = tmp_path / "index.json"
    parquet_component(str(shards), columns=["text"], index_path=str(index))
    with pytest.raises(ConfigError, match="no columns"):
        parquet_component(str(shards), columns=["nope"], index_path=str(index))
    index.write_text('{"version": 1, "shards": [{"path": 3}]}')
    with pytest.raises(ConfigError, match="index.json is corrupt.*delete it"):
        parquet_component(str(shards), columns=["text"], index_path=str(index))


def test_indexing_many_shards_shows_a_progress_bar(shards, capsys):
    parquet_component(str(shards), columns=["text"], progress=True)
    assert "indexing Parquet footers" in capsys.readouterr().err
    parquet_component(str(shards), columns=["text"])  # 6 shards, not a terminal: quiet
    assert "indexing" not in capsys.readouterr().err


def _pipe(comp, **kw) -> Pipeline:
    return parquet_pipe(comp, shuffle_block="row_group", **kw)


@pytest.mark.slow
def test_workers_ship_their_read_counters(shards):
    comp = parquet_component(str(shards), columns=["text"])
    with _pipe(comp).dataloader(num_workers=2) as loader:
        it = iter(loader)
        for _ in range(6):
            next(it)
        io = loader.stats()["io"]["docs"]
    assert io["row_group_reads"] > 0 and io["retries"] == 0
    assert comp.io_stats()["row_group_reads"] == 0  # the reads happened in the workers


@pytest.mark.slow  # many seconds in this process
def test_s3_index_next_to_the_data_and_a_disk_cache(tmp_path):
    """The index lives in the bucket; a second component with the same disk cache streams
    the same records without reading row-group bytes from the endpoint again."""
    import s3fs

    with s3_server("corpus") as (endpoint, options):
        fs = s3fs.S3FileSystem(**options)
        for s in range(4):
            _write(fs.open, f"corpus/web/part-{s:03d}.parquet", _rows(s))
        proxy = FaultProxy(endpoint, fail=0)
        try:
            via = dict(
                options,
                client_kwargs=dict(options["client_kwargs"], endpoint_url=proxy.url),
                skip_instance_cache=True,
            )
            url, index = "s3://corpus/web/*.parquet", "s3://corpus/web/_index.json"

            def build():
                return parquet_component(
                    url,
                    columns=["text"],
                    storage_options=via,
                    index_path=index,
                    disk_cache=str(tmp_path / "blocks"),
                )

            comp = build()
            assert fs.exists("corpus/web/_index.json")
            with _pipe(comp) as pipe:
                first = take(pipe, 30)
            cold = proxy.bytes_out
            comp2 = build()
            proxy.reset_counts()
            with _pipe(comp2) as pipe:
                again = take(pipe, 30)
            warm = proxy.bytes_out
        finally:
            proxy.close()
    assert_streams_equal(first, again, "disk-cached vs first read")
    assert cold > 0 and warm < cold / 10  # only the shards' HEADs go out again


# -- exact resume on this source at random cuts ----------------------------------------------


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    for s in range(5):
        _write(open, str(root / f"part-{s:03d}.parquet"), _rows(s, n=23 + 9 * s))
    return root


@pytest.mark.slow  # many seconds in this process
@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(
    cuts=st.lists(st.integers(0, 60), min_size=1, max_size=3, unique=True),
    lanes=st.integers(1, 5),
    window=st.integers(1, 4),
    cache=st.sampled_from([1, 1 << 20]),
)
def test_random_cuts_resume_exactly_on_parquet_blocks(corpus, cuts, lanes, window, cache):
    def build():
        comp = parquet_component(str(corpus), columns=["text"], cache_bytes=cache)
        src = StaticMixtureWorkSource(
            {"docs": comp, "more": list(_rows(9, n=30))},
            chunk_size=4,
            seed=8,
            shuffle_block="row_group",
            shuffle_window=window,
        )
        return small_packed(
            Pipeline(src, canonical_replicas=lanes, flush_every_k_chunks=2, seed=1), shuffle=4
        )

    assert_resume_equivalent(build, sorted(cuts), total=70)


@pytest.mark.slow
def test_parquet_blocks_resume_across_topologies(corpus):
    def build():
        comp = parquet_component(str(corpus), columns=["text"])
        return _pipe(comp)

    assert_resume_equivalent(
        build, [0, 10, 22], total=30, dp_size=2, num_workers=1, resume_dp_size=1,
        resume_num_workers=2,
    )  # fmt: skip


@pytest.mark.slow
def test_workers_share_one_disk_cache_and_stream_the_same(corpus, tmp_path):
    """DataLoader workers (separate processes) read through one cache directory, twice:
    the stream is the uncached one."""

    def build(cache):
        comp = parquet_component(str(corpus), columns=["text"], disk_cache=cache)
        return _pipe(comp)

    want = take(build(None), 25)
    cache = str(tmp_path / "blocks")
    for _ in range(2):  # cold, then warm
        with build(cache).dataloader(num_workers=2) as loader:
            assert_streams_equal(want, take(loader, 25), "through a shared disk cache")
