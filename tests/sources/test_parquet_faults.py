"""Damaged, changing and throttled Parquet data (issue 19, section 3): real files with a
flipped byte (snappy and uncompressed, with and without page checksums), local and in a
real S3-compatible server (moto's, on 127.0.0.1) read through s3fs, with faults injected
by the proxy in ``zephon_core.testing.s3``."""

from __future__ import annotations

import copy
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import parquet_pipe, s3_server, small_packed

from zephon_core import (
    CorruptCheckpoint,
    IncompatibleCheckpoint,
    Pipeline,
    SourceChanged,
    StaticMixtureWorkSource,
    ZephonError,
)
from zephon_core.sources import storage_retry
from zephon_core.sources.parquet import parquet_component
from zephon_core.testing import assert_streams_equal, take
from zephon_core.testing.s3 import FaultProxy

ROWS = [23, 17, 31, 9]  # per shard, in row groups of 5
FORMATS = [("snappy", False), ("snappy", True), ("none", False), ("none", True)]


def _rows(shard: int, n: int | None = None) -> list[dict]:
    rng = np.random.default_rng(shard)
    n = ROWS[shard] if n is None else n
    return [
        {"text": f"s{shard}r{i} " + "".join(chr(97 + int(x)) for x in rng.integers(0, 26, 80))}
        for i in range(n)
    ]


def _write(open_fn, path: str, rows: list[dict], compression="snappy", crc=False) -> None:
    table = pa.Table.from_pylist(rows, schema=pa.schema([("text", pa.string())]))
    with open_fn(path, "wb") as fh:
        pq.write_table(
            table, fh, row_group_size=5, compression=compression, write_page_checksum=crc
        )


def _shards(root, compression="snappy", crc=False) -> list[dict]:
    for s in range(len(ROWS)):
        _write(open, str(root / f"part-{s:03d}.parquet"), _rows(s), compression, crc)
    return [r for s in range(len(ROWS)) for r in _rows(s)]


def _inside(md, rg: int, where: float) -> int:
    """An offset ``where`` (0..1) into row group ``rg``'s column chunk."""
    cc = md.row_group(rg).column(0)
    start = cc.data_page_offset
    if cc.has_dictionary_page and 0 < cc.dictionary_page_offset < start:
        start = cc.dictionary_page_offset
    return start + int(cc.total_compressed_size * where)


def _flip(path, rg: int, where: float = 0.6) -> None:
    """Flips one bit inside row group ``rg``'s column chunk, keeping the modification
    time (bit rot, not a rewrite)."""
    st = os.stat(path)
    data = bytearray(open(path, "rb").read())
    data[_inside(pq.ParquetFile(path).metadata, rg, where)] ^= 0x10
    open(path, "wb").write(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _corrupt(call):
    """``call()`` must raise ``CorruptData`` (checked by name: on a build without it, a
    wrong result or another error fails here)."""
    with pytest.raises(ZephonError) as err:
        call()
    assert type(err.value).__name__ == "CorruptData", err.value
    return str(err.value)


# -- a flipped byte: local files ---------------------------------------------------------------


@pytest.mark.parametrize(("compression", "crc"), FORMATS)
def test_a_byte_flipped_after_the_first_read_is_corrupt_data(tmp_path, compression, crc):
    """Every row group's bytes are digested at their first read; a later read (a second
    epoch, after eviction) that differs is read once more, then named."""
    want = _shards(tmp_path, compression, crc)
    comp = parquet_component(str(tmp_path), columns=["text"], cache_bytes=1)
    everything = list(range(len(comp)))
    assert comp.__getitems__(everything) == want
    _flip(tmp_path / "part-001.parquet", rg=2)
    msg = _corrupt(lambda: comp.__getitems__(everything))
    assert "row group 2 of " in msg and "part-001.parquet (rows 33..37 " in msg
    assert "restore it from a good copy" in msg
    assert comp.io_stats()["reread_checks"] == 1  # read once more before failing


@pytest.mark.parametrize("compression", ["snappy", "none"])
def test_page_checksums_catch_a_byte_flipped_before_the_first_read(tmp_path, compression):
    _shards(tmp_path, compression, crc=True)
    _flip(tmp_path / "part-002.parquet", rg=4, where=0.5)
    with parquet_pipe(parquet_component(str(tmp_path), columns=["text"])) as pipe:
        msg = _corrupt(lambda: take(pipe, 10**4))  # through the pipeline: typed, not wrapped
    assert "row group 4 of " in msg and "part-002.parquet" in msg


def test_digests_in_a_saved_index_check_the_first_read_of_a_later_job(tmp_path):
    """verify="index": the digests are taken once, with the index; a later job that
    reuses the index (reads no footer) checks even its first read."""
    data = tmp_path / "data"
    data.mkdir()
    _shards(data, "none", crc=False)  # no page checksums: only the digest can tell
    index = str(tmp_path / "index.json")
    parquet_component(str(data), columns=["text"], index_path=index, verify="index")
    saved = json.loads(open(index).read())["shards"]
    assert [len(s["digests"]["text"]) for s in saved] == [5, 4, 7, 2]
    _flip(data / "part-003.parquet", rg=1)
    later = parquet_component(str(data), columns=["text"], index_path=index)  # reuses it
    msg = _corrupt(lambda: later.__getitems__([len(later) - 1]))
    assert "row group 1 of " in msg and "when the index was built" in msg


def test_a_file_rewritten_in_place_is_source_changed(tmp_path):
    """Same size, new bytes, new modification time: a rewrite, not damage."""
    _shards(tmp_path, "none")
    comp = parquet_component(str(tmp_path), columns=["text"], cache_bytes=1)
    comp.__getitems__([0])
    path = tmp_path / "part-000.parquet"
    data = path.read_bytes().replace(b"s0r3 ", b"s0r4 ")
    path.write_bytes(data)
    os.utime(path, ns=(1, 10**18))
    with pytest.raises(SourceChanged, match="part-000.parquet changed under the running job"):
        comp.__getitems__([7])  # another row group: read now


# -- empty shards and row groups --------------------------------------------------------------


def test_empty_shards_and_row_groups_are_skipped_by_the_row_group_shuffle(tmp_path):
    want = _shards(tmp_path)
    _write(open, str(tmp_path / "part-001a.parquet"), [])  # no rows: one empty row group
    with pq.ParquetWriter(tmp_path / "part-002a.parquet", pa.schema([("text", pa.string())])):
        pass  # no row group at all
    comp = parquet_component(str(tmp_path), columns=["text"])
    assert len(comp) == len(want) and len(comp.shards) == 6
    src = StaticMixtureWorkSource(
        {"docs": comp}, chunk_size=4, seed=2, num_epochs=1, shuffle_block="row_group"
    )
    with Pipeline(src, canonical_replicas=3, seed=1).fetch() as pipe:
        got = take(pipe, 10**4)
    assert sorted(r["text"] for r in got) == sorted(r["text"] for r in want)


# -- a dataset whose length changed -------------------------------------------------------------


def _checkpoint(pipe: Pipeline, n: int = 4) -> dict:
    with pipe:
        take(pipe, n)
        return pipe.checkpoint()


def test_a_deleted_or_appended_shard_is_named_and_data_changes_continue(tmp_path):
    _shards(tmp_path)

    def build():
        return parquet_pipe(parquet_component(str(tmp_path), columns=["text"]))

    state = _checkpoint(build())
    gone = tmp_path / "part-001.parquet"
    kept = gone.read_bytes()
    gone.unlink()
    with pytest.raises(IncompatibleCheckpoint) as err:
        build().load_state_dict(state)
    msg = str(err.value)
    assert "dataset 'docs': shards deleted: part-001.parquet (17 rows); 80 rows -> 63" in msg
    assert "allow_changes={'data'}" in msg and "Only the mixture" not in msg
    # what the message offers works: positions continue over the new data
    with build() as pipe:
        pipe.load_state_dict(state, allow_changes={"data"})
        assert len(take(pipe, 6)) == 6

    gone.write_bytes(kept)
    _write(open, str(tmp_path / "part-004.parquet"), _rows(0, 12))
    with pytest.raises(IncompatibleCheckpoint, match=r"appended: part-004.parquet \(12 rows\)"):
        build().load_state_dict(state)


@pytest.mark.parametrize("unit", ["documents", "tokens"])
def test_a_grown_list_is_a_data_change_not_a_mixture_change(unit):
    """Token shares over given lengths too: the lengths' digest moves with the rows."""
    docs = [{"text": f"d{i} " + "q" * (i % 40)} for i in range(90)]

    def build(rows, **more):
        data = {"docs": rows, "more": docs[:30], **more}
        lengths = {n: [len(r["text"]) for r in ds] for n, ds in data.items()}
        src = StaticMixtureWorkSource(
            data, chunk_size=8, seed=3, weights_unit=unit,
            lengths=lengths if unit == "tokens" else None,
        )  # fmt: skip
        return small_packed(Pipeline(src, canonical_replicas=2, flush_every_k_chunks=2, seed=1))

    state = _checkpoint(build(docs))
    grown = docs + [{"text": f"new{i}"} for i in range(10)]
    with pytest.raises(IncompatibleCheckpoint, match=r"dataset 'docs': 90 rows -> 100\. To resume"):
        build(grown).load_state_dict(state)
    with build(grown) as pipe:
        pipe.load_state_dict(state, allow_changes={"data"})
        assert len(take(pipe, 4)) == 4
    # grown while a dataset is added: a re-mix still names the length, then accepts both
    extra = {"extra": docs[:20]}
    with pytest.raises(IncompatibleCheckpoint, match="'docs': 90 rows -> 100. To resume"):
        build(grown, **extra).load_state_dict(state, allow_changes={"weights", "components"})
    with build(grown, **extra) as pipe:
        pipe.load_state_dict(state, allow_changes={"weights", "components", "data"})
        assert len(take(pipe, 4)) == 4
    # allowing a re-mix that is not needed changes nothing: the same stream as {"data"}
    with build(grown) as a, build(grown) as b:
        a.load_state_dict(state, allow_changes={"data"})
        b.load_state_dict(state, allow_changes={"data", "weights"})
        assert_streams_equal(take(a, 12), take(b, 12))
    # and an inflight chunk changed after the save is refused before it is translated
    tampered = copy.deepcopy(state)
    lane = next(ls for ls in tampered["lanes"] if ls["chunks"])
    lane["chunks"][-1][3][0] = (lane["chunks"][-1][3][0] + 1) % 30  # a row in range
    with pytest.raises(CorruptCheckpoint, match="does not match its digest"):
        build(grown).load_state_dict(tampered, allow_changes={"data"})


# -- object storage: moto's server through s3fs -------------------------------------------------


@pytest.fixture(scope="module")
def s3():
    import s3fs

    with s3_server("corpus") as (endpoint, options):
        fs = s3fs.S3FileSystem(**options)
        for compression, crc in (("snappy", False), ("none", True)):
            for s in range(len(ROWS)):
                _write(fs.open, f"corpus/{compression}/part-{s:03d}.parquet", _rows(s),
                       compression, crc)  # fmt: skip
        yield fs, endpoint, options


def _via(proxy: FaultProxy, options: dict) -> dict:
    """Storage options through ``proxy`` with botocore's own retries off (and s3fs's, by
    ``fast_retries``), so Zephon's retries are what is exercised."""
    return dict(
        options,
        client_kwargs=dict(options["client_kwargs"], endpoint_url=proxy.url),
        config_kwargs={"retries": {"total_max_attempts": 1}},  # no botocore retry at all
        skip_instance_cache=True,
    )


@pytest.fixture()
def fast_retries(monkeypatch):
    import s3fs

    monkeypatch.setattr(storage_retry, "BACKOFF_S", 0.001)
    monkeypatch.setattr(s3fs.S3FileSystem, "retries", 1)  # as if its attempts ran out


@pytest.mark.parametrize("prefix", ["snappy", "none"])
def test_a_bit_flipped_in_transit_is_read_again_and_a_lasting_one_is_named(
    s3, prefix, fast_retries
):
    fs, endpoint, options = s3
    proxy = FaultProxy(endpoint)
    try:
        url = f"s3://corpus/{prefix}/*.parquet"
        comp = parquet_component(url, columns=["text"], storage_options=_via(proxy, options),
                                 cache_bytes=1)  # fmt: skip
        everything = list(range(len(comp)))
        clean = comp.__getitems__(everything)
        proxy.flip = 1  # one damaged transfer: read again, nothing changes
        assert comp.__getitems__(everything) == clean
        assert proxy.flipped == 1 and comp.io_stats()["reread_checks"] == 1
        proxy.flip = 10**6  # every transfer damaged: named after one more read
        msg = _corrupt(lambda: comp.__getitems__([0]))
        assert f"row group 0 of corpus/{prefix}/part-000.parquet" in msg
    finally:
        proxy.close()


def test_a_damaged_disk_cache_is_read_again_from_the_store(s3, tmp_path):
    fs, endpoint, options = s3
    cache = tmp_path / "blocks"
    url = "s3://corpus/snappy/*.parquet"
    comp = parquet_component(url, columns=["text"], storage_options=options,
                             disk_cache=str(cache), cache_bytes=1)  # fmt: skip
    everything = list(range(len(comp)))
    clean = comp.__getitems__(everything)
    with fs.open("corpus/snappy/part-000.parquet", "rb") as fh:
        at = _inside(pq.ParquetFile(fh).metadata, 1, 0.5)  # in shard 0's row group 1
    for p in cache.iterdir():  # cache files hold the blocks at the objects' offsets
        data = bytearray(p.read_bytes())
        if p.name != "cache" and len(data) > at and data[at]:  # a block that was read
            data[at] ^= 0x10
            p.write_bytes(bytes(data))
    assert comp.__getitems__(everything) == clean
    assert comp.io_stats()["reread_checks"] >= 1  # row group 1 of shard 0 at least


def test_an_object_rewritten_under_the_job_is_source_changed_at_once(s3, fast_retries):
    """Another client rewrites a shard with as many bytes: the reader's listing still has
    the old ETag, S3 answers the new object, s3fs raises FileExpired -- never retried --
    and a restore in the same process lists afresh and names the shard."""
    import s3fs

    fs, endpoint, options = s3
    key = "corpus/rewrite/part-001.parquet"
    for s in range(3):
        _write(fs.open, f"corpus/rewrite/part-{s:03d}.parquet", _rows(s), "none")
    url = "s3://corpus/rewrite/*.parquet"

    def build():
        comp = parquet_component(url, columns=["text"], storage_options=options, cache_bytes=1)
        return parquet_pipe(comp)

    pipe = build()
    state = _checkpoint(pipe, 2)
    other = s3fs.S3FileSystem(skip_instance_cache=True, **options)
    data = other.cat(key).replace(b"s1r7 ", b"s1r8 ")
    other.pipe(key, data)
    comp = pipe.source._datasets[0]
    with pytest.raises(SourceChanged, match="part-001.parquet changed under the running job"):
        comp.__getitems__(list(range(len(comp))))
    assert comp.io_stats()["retries"] == 0
    with pytest.raises(IncompatibleCheckpoint, match=r"rewritten: part-001.parquet \(17 -> 17"):
        build().load_state_dict(state)


@pytest.mark.slow  # many seconds in this process
def test_a_throttled_index_build_is_retried_then_named_throttled(s3, fast_retries):
    from zephon_core import StorageThrottled

    fs, endpoint, options = s3
    url = "s3://corpus/snappy/*.parquet"
    every_get = FaultProxy(endpoint, throttle=lambda method, path: method == "GET")
    try:
        every_get.fail = 4  # the listing and footers are throttled for a while
        comp = parquet_component(url, columns=["text"], storage_options=_via(every_get, options))
        assert len(comp) == sum(ROWS) and every_get.failed == 4
        every_get.fail, every_get.failed = 10**6, 0  # a storm that outlasts the retries
        with pytest.raises(StorageThrottled, match="throttled 6 attempts") as err:
            parquet_component(url, columns=["text"], storage_options=_via(every_get, options))
        assert "listing" in str(err.value) and "not a readable" not in str(err.value)
        assert every_get.failed == storage_retry.ATTEMPTS  # ours: the client's are off
    finally:
        every_get.close()
    footers = FaultProxy(endpoint, fail=10**6)  # only the Parquet objects
    try:
        with pytest.raises(StorageThrottled, match=r"reading corpus/snappy/part-00\d.parquet: "):
            parquet_component(url, columns=["text"], storage_options=_via(footers, options))
    finally:
        footers.close()
