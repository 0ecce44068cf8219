"""JSONL(.zst/.gz) shards converted to Parquet: the rows, in order, through
``parquet_component``; bad lines named; the ``zephon convert`` script."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
import zstandard
from helpers import hang_guard_s

from zephon_core import ConfigError
from zephon_core.sources.convert import jsonl_to_parquet
from zephon_core.sources.parquet import parquet_component

ROWS = [
    {"text": f"doc {i} " + "w" * (i % 37), "source": "web" if i % 3 else "code"} for i in range(250)
]


def _jsonl(rows) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


@pytest.fixture()
def raw(tmp_path):
    d = tmp_path / "raw"
    d.mkdir()
    (d / "a.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(_jsonl(ROWS[:100])))
    (d / "b.jsonl.gz").write_bytes(gzip.compress(_jsonl(ROWS[100:180]) + b"\n"))
    (d / "c.jsonl").write_bytes(_jsonl(ROWS[180:]))
    return d


def test_converted_shards_read_back_row_for_row(raw, tmp_path):
    out = tmp_path / "pq"
    written = jsonl_to_parquet(str(raw / "*.jsonl*"), str(out), row_group_rows=32)
    assert [Path(p).name for p in written] == ["a.parquet", "b.parquet", "c.parquet"]
    comp = parquet_component(str(out), columns=["text", "source"])
    assert len(comp) == len(ROWS)
    assert comp.__getitems__(list(range(len(ROWS)))) == ROWS
    assert [len(s.row_groups) for s in comp.shards] == [4, 3, 3]  # 32 rows per group


def test_bad_lines_are_named_and_leave_no_shard(raw, tmp_path):
    (raw / "d.jsonl").write_text('{"text": "ok", "source": "x"}\nnot json\n')
    with pytest.raises(ConfigError, match=r"d.jsonl line 2 is not JSON"):
        jsonl_to_parquet(str(raw / "d.jsonl"), str(tmp_path / "o1"))
    assert not (tmp_path / "o1" / "d.parquet").exists()
    (raw / "e.jsonl").write_text('{"text": "a"}\n{"text": "b", "extra": 1}\n')
    with pytest.raises(ConfigError, match=r"keys \['extra'\] are not in"):
        jsonl_to_parquet(str(raw / "e.jsonl"), str(tmp_path / "o2"), row_group_rows=1)
    with pytest.raises(ConfigError, match="no files match"):
        jsonl_to_parquet(str(raw / "nothing-*.jsonl"), str(tmp_path / "o3"))


@pytest.mark.slow
def test_the_zephon_convert_command(raw, tmp_path):
    zephon = Path(sys.executable).parent / "zephon"
    out = tmp_path / "cli"
    done = subprocess.run(
        [str(zephon), "convert", str(raw / "a.jsonl.zst"), str(raw / "c.jsonl"),
         "--out", str(out), "--row-group-rows", "50"],
        capture_output=True, text=True, timeout=hang_guard_s(300),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "wrote 2 Parquet shard(s)" in done.stdout
    comp = parquet_component(str(out), columns=["text"])
    assert [r["text"] for r in comp.__getitems__(list(range(len(comp))))] == [
        r["text"] for r in ROWS[:100] + ROWS[180:]
    ]


def test_converted_shards_carry_page_checksums(raw, tmp_path):
    """A byte flipped in a converted shard's page is found at its very first read."""
    import pyarrow.parquet as pq

    from zephon_core import ZephonError

    out = tmp_path / "pq"
    (path,) = jsonl_to_parquet(str(raw / "c.jsonl"), str(out), row_group_rows=32)
    cc = pq.ParquetFile(path).metadata.row_group(1).column(0)
    start = min(cc.data_page_offset, cc.dictionary_page_offset or cc.data_page_offset)
    data = bytearray(Path(path).read_bytes())
    data[start + cc.total_compressed_size - 3] ^= 0x10  # in the chunk's last page
    Path(path).write_bytes(bytes(data))
    comp = parquet_component(str(out), columns=["text"])
    with pytest.raises(ZephonError) as err:
        comp.__getitems__(list(range(len(comp))))
    assert type(err.value).__name__ == "CorruptData"
    assert "CRC checksum verification failed" in str(err.value)
