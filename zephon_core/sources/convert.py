"""JSONL(.zst/.gz) shards -> Parquet shards, once, streaming (``zephon convert``).

Why convert instead of indexing JSONL in place: random access into a JSONL shard needs a
line-offsets index, and building one reads and decompresses every byte anyway (a .zst
or .gz stream cannot be entered in the middle unless it was written seekable, which
corpora rarely are). The same one pass can write Parquet instead, and then the reader has
one path: row groups, column projection, columnar compression, the footer as the index,
the block shuffle by row group. So JSONL is converted, shard for shard (``a.jsonl.zst``
-> ``a.parquet``), in bounded memory (a row group at a time), with page checksums (CRC-32
per page, verified on read: a damaged file is found even at its first read).

Example::

    jsonl_to_parquet(["s3://raw/web/*.jsonl.zst"], "s3://corpus/web/",
                     storage_options={...})
"""

from __future__ import annotations

import json
import posixpath
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from ..errors import ConfigError
from ..progress import progress_bar
from ..validate import int_arg

__all__ = ["jsonl_to_parquet"]

_SUFFIXES = (".jsonl", ".json", ".ndjson")


def _out_name(path: str) -> str:
    base = posixpath.basename(path)
    for comp in (".zst", ".zstd", ".gz", ".bz2", ".xz"):
        if base.endswith(comp):
            base = base[: -len(comp)]
    for suffix in _SUFFIXES:
        if base.endswith(suffix):
            base = base[: -len(suffix)]
    return base + ".parquet"


def _records(fs: Any, path: str) -> Iterator[dict]:
    with fs.open(path, "rt", compression="infer", encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ConfigError(f"{path} line {number} is not JSON: {e}") from e
            if not isinstance(rec, dict):
                raise ConfigError(f"{path} line {number}: expected an object, got {rec!r:.60}")
            yield rec


def jsonl_to_parquet(
    inputs: str | Sequence[str],
    output: str,
    row_group_rows: int = 1024,
    storage_options: dict[str, Any] | None = None,
    progress: bool | None = None,
) -> list[str]:
    """Convert JSONL shards (globs, files; ``.zst``/``.gz`` by suffix) into one Parquet
    shard each under ``output`` (a directory or prefix, local or a URL). Returns the
    written paths. The schema comes from each shard's first row group; a later row that
    does not fit it is a ``ConfigError`` naming the shard.

    Raises:
        ConfigError: no input matched, a line is not a JSON object, or rows disagree.
    """
    import fsspec
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows_per_group = int_arg("row_group_rows", row_group_rows, minimum=1, where="jsonl_to_parquet")
    inputs = [inputs] if isinstance(inputs, str) else list(inputs)
    options = storage_options or {}
    fs, _, paths = fsspec.core.get_fs_token_paths(inputs, storage_options=options)
    paths = sorted(set(paths))
    if not paths:
        raise ConfigError(f"jsonl_to_parquet: no files match {inputs!r}")
    out_fs, out_dir = fsspec.core.url_to_fs(output, **(options if "://" in output else {}))
    out_fs.makedirs(out_dir, exist_ok=True)
    names = [_out_name(p) for p in paths]
    if len(set(names)) != len(names):
        raise ConfigError("jsonl_to_parquet: two inputs would write the same output name")
    written = []
    show = len(paths) > 1 and sys.stderr.isatty() if progress is None else progress
    bar = progress_bar(len(paths), "converting to Parquet", "shard", show)
    for path, name in zip(paths, names):
        target = posixpath.join(out_dir, name)
        writer, rows, done = None, [], 0
        try:
            with out_fs.open(target, "wb") as sink:
                try:
                    for rec in _records(fs, path):
                        rows.append(rec)
                        if len(rows) == rows_per_group:
                            writer = _write(pa, pq, writer, sink, rows, path)
                            done += len(rows)
                            rows = []
                            bar.note(f"{posixpath.basename(path)}: {done:,} rows")
                    if rows or writer is None:
                        writer = _write(pa, pq, writer, sink, rows, path)
                        done += len(rows)
                finally:
                    if writer is not None:
                        writer.close()  # before the sink closes, on every path
        except BaseException:
            if out_fs.exists(target):
                out_fs.rm(target)  # no half-written shard is left to be indexed
            raise
        written.append(target)
        bar.update(1, note=f"{posixpath.basename(path)}: {done:,} rows")
    bar.close()
    return written


def _write(pa: Any, pq: Any, writer: Any, sink: Any, rows: list[dict], path: str) -> Any:
    schema = writer.schema if writer is not None else None
    extra = set().union(*rows) - set(schema.names) if schema is not None and rows else set()
    if extra:
        raise ConfigError(
            f"{path}: keys {sorted(extra)} are not in the shard's first rows' schema; clean "
            "the shard or convert it on its own"
        )
    try:
        table = pa.Table.from_pylist(rows, schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise ConfigError(
            f"{path}: rows disagree with the shard's first rows' schema ({e}); clean the "
            "shard or convert it on its own"
        ) from e
    if writer is None:
        # page checksums: a reader (ours verifies them) finds a damaged page of this file
        writer = pq.ParquetWriter(sink, table.schema, write_page_checksum=True)
    writer.write_table(table, row_group_size=max(1, len(rows)))
    return writer
