"""Parquet shards as components: local files and a real S3-compatible server (moto's,
started here on 127.0.0.1) reached through s3fs exactly as a user would."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import parquet_pipe, s3_server

from zephon_core import ConfigError, IncompatibleCheckpoint, Pipeline
from zephon_core.sources.parquet import parquet_component
from zephon_core.testing import assert_resume_equivalent, assert_streams_equal, take
from zephon_core.testing.s3 import FaultProxy

SHARDS = 4
ROWS = [23, 17, 31, 9]  # rows per shard, in row groups of 5


def _rows(shard: int) -> list[dict]:
    rng = np.random.default_rng(shard)
    return [
        {"text": f"s{shard}r{i} " + "x" * int(rng.integers(5, 200)), "id": f"{shard}-{i}"}
        for i in range(ROWS[shard])
    ]


def _write(open_fn, path: str, rows: list[dict]) -> None:
    table = pa.Table.from_pylist(rows)
    with open_fn(path, "wb") as fh:
        pq.write_table(table, fh, row_group_size=5)


ALL = [r for s in range(SHARDS) for r in _rows(s)]


@pytest.fixture()
def local(tmp_path):
    for s in range(SHARDS):
        _write(open, str(tmp_path / f"part-{s:03d}.parquet"), _rows(s))
    return tmp_path


def test_a_directory_of_shards_reads_like_one_dataset(local):
    comp = parquet_component(str(local), columns=["text", "id"])
    assert len(comp) == sum(ROWS)
    assert [len(s.row_groups) for s in comp.shards] == [5, 4, 7, 2]
    picks = [0, 22, 23, 40, 79, 5, 6]
    assert comp.__getitems__(picks) == [ALL[i] for i in picks]
    only = parquet_component(str(local / "*.parquet"), columns=["id"])
    assert only.__getitems__([41]) == [{"id": ALL[41]["id"]}]


def test_the_row_group_cache_is_bounded(local):
    comp = parquet_component(str(local), columns=["text"], cache_bytes=1)
    for i in range(0, len(comp), 3):
        assert comp[i]["text"] == ALL[i]["text"]
    assert len(comp._cache) == 1  # only the last row group stays


def test_bad_inputs_are_config_errors(local, tmp_path):
    with pytest.raises(ConfigError, match="no Parquet files"):
        parquet_component(str(tmp_path / "nothing-*.parquet"))
    with pytest.raises(ConfigError, match="no columns"):
        parquet_component(str(local), columns=["missing"])
    (local / "junk.parquet").write_bytes(b"not parquet")
    with pytest.raises(ConfigError, match="not a readable Parquet"):
        parquet_component(str(local))


def _pipe(comp) -> Pipeline:
    return parquet_pipe(comp)


def test_a_parquet_pipeline_resumes_exactly(local):
    assert_resume_equivalent(
        lambda: _pipe(parquet_component(str(local), columns=["text"])), cut_points=[0, 5, 17]
    )


def test_a_rewritten_shard_is_refused_at_restore(local):
    with _pipe(parquet_component(str(local), columns=["text"])) as pipe:
        take(pipe, 4)
        state = pipe.checkpoint()
    _write(open, str(local / "part-002.parquet"), _rows(2)[::-1])  # same rows, other order
    with pytest.raises(IncompatibleCheckpoint, match="dataset 'docs'"):
        _pipe(parquet_component(str(local), columns=["text"])).load_state_dict(state)


# -- a real S3-compatible endpoint ----------------------------------------------------------


@pytest.fixture(scope="module")
def s3():
    import s3fs

    with s3_server("corpus") as (_, options):
        fs = s3fs.S3FileSystem(**options)
        for s in range(SHARDS):
            _write(fs.open, f"corpus/web/part-{s:03d}.parquet", _rows(s))
        yield fs, options


def test_shards_in_s3_read_and_stream_like_local_ones(s3, local):
    fs, options = s3
    comp = parquet_component("s3://corpus/web/*.parquet", columns=["text"], storage_options=options)
    assert len(comp) == sum(ROWS) and all(s.version for s in comp.shards)  # ETags
    with _pipe(comp) as remote, _pipe(parquet_component(str(local), columns=["text"])) as here:
        assert_streams_equal(take(remote, 12), take(here, 12), "s3 vs local shards")


@pytest.mark.slow
def test_s3_shards_through_dataloader_workers_resume_exactly(s3):
    fs, options = s3

    def build():
        return _pipe(
            parquet_component("s3://corpus/web/", columns=["text"], storage_options=options)
        )

    assert_resume_equivalent(build, cut_points=[3, 11], total=16, num_workers=2)


def test_a_shard_rewritten_in_s3_is_refused_at_restore(s3):
    fs, options = s3
    url = "s3://corpus/web/*.parquet"
    with _pipe(parquet_component(url, columns=["text"], storage_options=options)) as pipe:
        take(pipe, 3)
        state = pipe.checkpoint()
    _write(fs.open, "corpus/web/part-001.parquet", _rows(1)[::-1])
    fs.invalidate_cache()
    with pytest.raises(IncompatibleCheckpoint, match="dataset 'docs'"):
        _pipe(parquet_component(url, columns=["text"], storage_options=options)).load_state_dict(
            state
        )
    _write(fs.open, "corpus/web/part-001.parquet", _rows(1))  # leave it as the others expect


def test_a_shard_rewritten_or_deleted_mid_run_is_a_typed_error(local):
    from zephon_core import SourceChanged

    comp = parquet_component(str(local), columns=["text"], cache_bytes=1)
    assert comp[30]["text"] == ALL[30]["text"]
    _write(open, str(local / "part-003.parquet"), _rows(3)[:4])  # rewritten, shorter
    with _pipe(comp) as pipe, pytest.raises(SourceChanged, match="part-003.parquet changed"):
        take(pipe, 40)
    (local / "part-001.parquet").unlink()
    with pytest.raises(SourceChanged, match="part-001.parquet was deleted"):
        comp.__getitems__([30])


# -- faults of object storage: a proxy in front of the server --------------------------------


def _through(proxy: FaultProxy, options: dict):
    """The shards read through ``proxy``, with botocore's and s3fs's own retries turned
    down, so the component's retries are what is exercised."""
    through = dict(
        options,
        client_kwargs=dict(options["client_kwargs"], endpoint_url=proxy.url),
        config_kwargs={"retries": {"max_attempts": 1}},
        skip_instance_cache=True,
    )
    comp = parquet_component("s3://corpus/web/*.parquet", columns=["text"], storage_options=through)
    comp.fs.retries = 1  # s3fs retries SlowDown itself: as if its attempts ran out
    return comp


def test_throttled_reads_are_retried_and_counted_and_nothing_changes(s3, monkeypatch):
    from zephon_core.sources import storage_retry

    fs, options = s3
    monkeypatch.setattr(storage_retry, "BACKOFF_S", 0.001)  # keep the test fast
    proxy = FaultProxy(options["client_kwargs"]["endpoint_url"], fail=0)
    try:
        comp = _through(proxy, options)
        proxy.fail = 3  # the index is built; now the row-group reads are throttled
        with _pipe(comp) as pipe:
            got = take(pipe, 10)
            io = pipe.stats()["io"]["docs"]
        clean = parquet_component(
            "s3://corpus/web/*.parquet", columns=["text"], storage_options=options
        )
        with _pipe(clean) as pipe:
            assert_streams_equal(got, take(pipe, 10), "throttled vs clean reads")
    finally:
        proxy.close()
    # three throttled GETs; some surfaced past s3fs's own (turned down) retries and were
    # retried by the component; the stream is the clean one all the same
    assert proxy.failed == 3 and 1 <= io["retries"] <= 3 and io["row_group_reads"] > 0


def test_a_read_that_keeps_failing_names_the_shard(s3, monkeypatch):
    from zephon_core import StorageThrottled
    from zephon_core.sources import storage_retry

    fs, options = s3
    monkeypatch.setattr(storage_retry, "BACKOFF_S", 0.001)
    proxy = FaultProxy(options["client_kwargs"]["endpoint_url"], fail=0)
    try:
        comp = _through(proxy, options)
        proxy.fail = 10**6
        with pytest.raises(StorageThrottled, match=r"part-00\d\.parquet: the object store thr"):
            comp.__getitems__([0])
        assert comp.io_stats()["retries"] == storage_retry.ATTEMPTS - 1
    finally:
        proxy.close()
