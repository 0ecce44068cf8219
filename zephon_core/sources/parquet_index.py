"""The index of a sharded Parquet component: which shards, how many rows per row group.

Why here and not in the reads: a corpus of thousands of shards in object storage costs a
footer read per shard to index -- seconds to minutes -- and every DataLoader worker and
every restart would pay it again. So the index is built once: the listing gives each
shard's size and ETag (or modification time) in one call per thousand objects, footers
are read in parallel with a progress bar, and the result can be saved (``index_path``:
a small JSON file next to the data or anywhere local). A saved index is used only for
shards whose path, size and version it lists unchanged; the others are read again and the
file is rewritten.

The listing is read afresh (a client's cached listing may predate a rewrite), and every
listing and footer read is retried like a row-group read (``storage_retry.py``): a
throttled store is reported as :class:`StorageThrottled`, never as an unreadable file.
With ``digests=True`` the index also holds a digest of every column chunk read
(``parquet_digest.py``): building it then reads those bytes once, and every later read
of them -- in any process, any job, while the index is reused -- is checked against it.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError, PipelineError, SourceChanged
from ..progress import progress_bar
from .parquet_digest import chunk_digests, leaf_paths, leaves, read_chunks
from .storage_retry import retrying

__all__ = ["Shard", "build_index", "list_shards", "version_of"]

INDEX_VERSION = 1
FOOTER_THREADS = 16  # footer reads are latency-bound: many in flight
PROGRESS_FROM = 16  # show a progress bar from this many footers to read


@dataclass(frozen=True)
class Shard:
    path: str
    size: int
    version: str  # ETag, else modification time: what changes when the file is rewritten
    row_groups: tuple[int, ...]  # rows per row group
    columns: tuple[str, ...] = ()  # the shard's column names (checked against `columns`)
    # leaf column path -> hex digest of its chunk in each row group (``digests=True``)
    digests: dict[str, tuple[str, ...]] | None = field(default=None, compare=False)

    def has_digests(self, columns: Sequence[str] | None) -> bool:
        """Whether every column of ``columns`` (all for ``None``) has digests here."""
        if self.digests is None:
            return False
        want = self.columns if columns is None else columns
        return all(any(p == c or p.startswith(c + ".") for p in self.digests) for c in want)


def version_of(info: dict[str, Any]) -> str:
    return str(info.get("ETag") or info.get("etag") or info.get("mtime") or "")


def list_shards(fs: Any, urls: Sequence[str]) -> list[tuple[str, int, str]]:
    """``(path, size, version)`` of every shard matched by ``urls`` (globs, directories,
    files), sorted by path; sizes and versions come from the listing where it has them.

    Raises:
        ConfigError: a listed file does not exist.
        StorageThrottled: the store throttled the listing past the retries.
    """
    fs.invalidate_cache()  # s3fs & co. cache listings: a rewrite since must be seen
    found: dict[str, dict[str, Any]] = {}
    for url in urls:
        stripped = fs._strip_protocol(url)
        what = f"parquet_component: listing {url}"
        if any(ch in stripped for ch in "*?["):
            found.update(_retried(what, fs.glob, stripped, detail=True))
        elif _retried(what, fs.isdir, stripped):
            listed = _retried(what, fs.find, stripped, detail=True)
            found.update((p, i) for p, i in listed.items() if p.endswith(".parquet"))
        else:
            found[stripped] = {}
    out = []
    for path in sorted(found):
        info = found[path]
        if "size" not in info or not version_of(info):
            try:
                info = _retried(f"parquet_component: listing {path}", fs.info, path)
            except FileNotFoundError as e:
                raise ConfigError(f"parquet_component: {path} does not exist") from e
        out.append((path, int(info.get("size") or 0), version_of(info)))
    return out


def _retried(what: str, fn: Any, *args: Any, **kw: Any) -> Any:
    return retrying(lambda: fn(*args, **kw), what, operator="index")


def _read_footer(
    fs: Any, path: str, size: int, version: str, digest: Sequence[str] | None | bool = False
) -> tuple[Shard, Any]:
    """The shard's entry and footer; with ``digest`` (the columns to digest, ``None`` for
    all, ``False`` for none) also every row group's column chunks are read and digested.

    Raises:
        ConfigError: not a Parquet file (or gone since the listing).
        StorageThrottled, PipelineError: the store failed past the retries.
        SourceChanged: the object was rewritten while it was being indexed.
    """
    import pyarrow.parquet as pq

    def read() -> tuple[Any, dict[str, tuple[str, ...]] | None]:
        with fs.open(path, "rb", cache_type="none") as fh:  # s3fs: no 50 MB read-ahead
            md = pq.ParquetFile(fh).metadata
            return md, None if digest is False else _digest_all(fh, md, digest)

    try:
        md, digests = retrying(read, f"parquet_component: reading {path}", operator="index")
        names = tuple(md.schema.to_arrow_schema().names)
    except (PipelineError, SourceChanged):
        raise  # throttled, or a fault that outlasted the retries: the file may be fine
    except FileNotFoundError as e:
        raise ConfigError(f"parquet_component: {path} was deleted since it was listed") from e
    except Exception as e:  # noqa: BLE001 - named
        raise ConfigError(f"parquet_component: {path} is not a readable Parquet file: {e}") from e
    groups = tuple(md.row_group(i).num_rows for i in range(md.num_row_groups))
    return Shard(path, size, version, groups, names, digests), md


def _digest_all(fh: Any, md: Any, columns: Sequence[str] | None) -> dict[str, tuple[str, ...]]:
    idx = leaves(md, columns)
    out: dict[str, list[str]] = {p: [] for p in leaf_paths(md, idx)}
    for rg in range(md.num_row_groups):
        for p, d in zip(out, chunk_digests(read_chunks(fh, md, rg, idx)), strict=True):
            out[p].append(d.hex())
    return {p: tuple(v) for p, v in out.items()}


def _load(index_path: str, storage_options: dict[str, Any]) -> dict[tuple, Shard]:
    import fsspec

    fs, path = fsspec.core.url_to_fs(index_path, **_options_for(index_path, storage_options))
    if not fs.exists(path):
        return {}
    try:
        with fs.open(path, "rt") as fh:
            saved = json.load(fh)
        if saved.get("version") != INDEX_VERSION:
            return {}  # another format: rebuilt and rewritten
        shards = [
            Shard(
                s["path"], s["size"], s["version"], tuple(s["row_groups"]), tuple(s["columns"]),
                {str(k): tuple(map(str, v)) for k, v in s["digests"].items()}
                if s.get("digests") else None,
            )
            for s in saved["shards"]
        ]  # fmt: skip
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(
            f"parquet_component: the saved index {index_path} is corrupt ({e}): delete it and "
            "it is rebuilt from the shards' footers"
        ) from e
    return {(s.path, s.size, s.version): s for s in shards}


def _save(index_path: str, storage_options: dict[str, Any], shards: Sequence[Shard]) -> None:
    import fsspec

    fs, path = fsspec.core.url_to_fs(index_path, **_options_for(index_path, storage_options))
    body = json.dumps(
        {"version": INDEX_VERSION, "shards": [_entry(s) for s in shards]}, separators=(",", ":")
    )
    parent = fs._parent(path)
    if parent:
        fs.makedirs(parent, exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"  # a reader never sees half an index
    with fs.open(tmp, "wt") as fh:
        fh.write(body)
    fs.mv(tmp, path)


def _entry(s: Shard) -> dict[str, Any]:
    out = {"path": s.path, "size": s.size, "version": s.version}
    out.update(row_groups=list(s.row_groups), columns=list(s.columns))
    if s.digests is not None:  # only when built with digests: older readers ignore it
        out["digests"] = {k: list(v) for k, v in s.digests.items()}
    return out


def _options_for(index_path: str, storage_options: dict[str, Any]) -> dict[str, Any]:
    """The data's storage options apply to an index in the same kind of storage."""
    return storage_options if "://" in index_path else {}


def build_index(
    fs: Any,
    listed: Sequence[tuple[str, int, str]],
    index_path: str | None = None,
    storage_options: dict[str, Any] | None = None,
    progress: bool | None = None,
    digest: Sequence[str] | None | bool = False,
) -> tuple[tuple[Shard, ...], dict[str, Any]]:
    """The shards of ``listed``, from the saved index where it is current and from the
    footers (in parallel) elsewhere; the saved index is rewritten if anything changed.
    Also returns the footers it read (``{path: FileMetaData}``), for the first reads.

    ``progress``: ``None`` shows a bar from ``PROGRESS_FROM`` footers on a terminal.
    ``digest``: the columns whose chunks are digested (``None``: all; ``False``: none);
    a saved shard without digests of them is read again.
    """
    options = storage_options or {}
    saved = _load(index_path, options) if index_path else {}
    shards: list[Shard | None] = [saved.get(key) for key in listed]
    if digest is not False:
        shards = [s if s is not None and s.has_digests(digest) else None for s in shards]
    todo = [i for i, s in enumerate(shards) if s is None]
    footers: dict[str, Any] = {}
    if todo:
        show = len(todo) >= PROGRESS_FROM and sys.stderr.isatty() if progress is None else progress
        label = "indexing Parquet footers" + (" and digests" if digest is not False else "")
        bar = progress_bar(len(todo), label, "shard", show)

        def read(i: int) -> tuple[Shard, Any]:
            return _read_footer(fs, *listed[i], digest=digest)

        with ThreadPoolExecutor(min(FOOTER_THREADS, len(todo))) as pool:
            for i, (shard, md) in zip(todo, pool.map(read, todo)):
                shards[i], footers[shard.path] = shard, md
                bar.update(1)
        bar.close()
    out = tuple(s for s in shards if s is not None)
    if index_path and (todo or len(saved) != len(out)):
        _save(index_path, options, out)
    return out, footers
