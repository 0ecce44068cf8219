"""Sharded Parquet as a random-access component, over any fsspec filesystem.

Why this shape: pretraining corpora are many Parquet shards in object storage
(``s3://``, ``gs://``, ``hf://``, local paths). A :class:`StaticMixtureWorkSource`
needs ``len()`` and batched reads by row index, so a component is an **index** built
once from the shards' footers -- files sorted, rows per row group -- and reads go by row
group with column projection, through a bounded in-memory cache of decoded row groups
(``cache_bytes``). Nothing is downloaded up front; a chunk's rows cost one read per
distinct row group they fall in.

The content fingerprint (``zephon_fingerprint``) covers every shard's path, size, ETag
or modification time and row counts, and the columns read: a shard rewritten or added
under a checkpoint is ``IncompatibleCheckpoint`` naming the component at restore.

Example::

    src = StaticMixtureWorkSource({
        "web": parquet_component("s3://corpus/web/*.parquet", columns=["text"],
                                 storage_options={"endpoint_url": ...}),
        "code": parquet_component("/data/code/", columns=["text"]),
    }, weights={"web": 0.8, "code": 0.2})
"""

from __future__ import annotations

import errno
import hashlib
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ConfigError, PipelineError, SourceChanged

__all__ = ["ParquetComponent", "parquet_component"]


@dataclass(frozen=True)
class _Shard:
    path: str
    size: int
    version: str  # ETag, else modification time: what changes when the file is rewritten
    row_groups: tuple[int, ...]  # rows per row group


def parquet_component(
    urls: str | Sequence[str],
    columns: Sequence[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    cache_bytes: int = 256 << 20,
) -> ParquetComponent:
    """A component over Parquet shards: a glob (``s3://bucket/prefix/*.parquet``), a
    directory (every ``*.parquet`` below it) or a list of files, read through fsspec.

    Raises:
        ConfigError: no shard found, a shard is not Parquet, or a column is missing.
    """
    import fsspec

    urls = [urls] if isinstance(urls, str) else list(urls)
    if not urls:
        raise ConfigError("parquet_component: give a path, a glob or a list of files")
    fs, _, _ = fsspec.core.get_fs_token_paths(urls[0], storage_options=storage_options or {})
    paths: list[str] = []
    for url in urls:
        stripped = fs._strip_protocol(url)
        if any(ch in stripped for ch in "*?["):
            paths += fs.glob(stripped)
        elif fs.isdir(stripped):
            paths += [p for p in fs.find(stripped) if p.endswith(".parquet")]
        else:
            paths.append(stripped)
    paths = sorted(set(paths))
    if not paths:
        raise ConfigError(f"parquet_component: no Parquet files match {urls!r}")
    return ParquetComponent(fs, paths, columns, cache_bytes)


#: attempts per row-group read, and the backoff between them (doubling, capped)
ATTEMPTS = 6
BACKOFF_S, MAX_BACKOFF_S = 0.05, 5.0
_TRANSIENT = ("SlowDown", "503", "Service Unavailable", "ServiceUnavailable", "Connection reset",
              "reset by peer", "ServerDisconnected", "timed out", "Timeout")  # fmt: skip


_TRANSIENT_ERRNOS = {errno.EBUSY, errno.EAGAIN, errno.ECONNRESET, errno.ETIMEDOUT}


def transient(e: BaseException | None) -> bool:
    """Throttling, resets and timeouts of object storage: worth retrying the same read.
    (s3fs reports S3's SlowDown as ``OSError(EBUSY)``; the chain is searched too.)"""
    seen = 0
    while e is not None and seen < 8:
        if isinstance(e, (ConnectionError, TimeoutError)):
            return True
        if isinstance(e, OSError) and e.errno in _TRANSIENT_ERRNOS:
            return True
        if any(t in f"{type(e).__name__}: {e}" for t in _TRANSIENT):
            return True
        e, seen = e.__cause__ or e.__context__, seen + 1
    return False


class ParquetComponent:
    """``len()`` rows over sorted shards; ``__getitems__`` reads by row group (cached).

    A read that fails transiently (throttling such as S3's 503 SlowDown, a connection
    reset, a timeout) is retried up to ``ATTEMPTS`` times with capped exponential
    backoff; the same row group is read again, so nothing is lost or duplicated.
    ``io_stats()`` counts reads, cache hits and retries (of this process).
    """

    def __init__(
        self, fs: Any, paths: Sequence[str], columns: Sequence[str] | None, cache_bytes: int
    ):
        self.fs = fs
        self.columns = list(columns) if columns is not None else None
        self.cache_bytes = int(cache_bytes)
        self.shards = tuple(self._index(p) for p in paths)
        # global row-group table: starting row, shard, row group within the shard
        starts, where = [0], []
        for s, shard in enumerate(self.shards):
            for g, n in enumerate(shard.row_groups):
                where.append((s, g))
                starts.append(starts[-1] + n)
        self._starts = np.asarray(starts, dtype=np.int64)
        self._where = where
        self._setup_cache()

    def _setup_cache(self) -> None:
        self._cache: OrderedDict[int, Any] = OrderedDict()  # row group -> pyarrow Table
        self._cached = 0
        self._lock = threading.Lock()
        self._meta: dict[int, Any] = {}
        self._pid = os.getpid()
        self._io = {"row_group_reads": 0, "cache_hits": 0, "retries": 0}

    def io_stats(self) -> dict[str, int]:
        """Row groups read, cache hits and retried reads, in this process."""
        return dict(self._io)

    def _filesystem(self) -> Any:
        """The filesystem of this process: a forked DataLoader worker builds its own
        (s3fs and gcsfs clients are not fork-safe), from the same storage options."""
        if os.getpid() != self._pid:
            self.fs = type(self.fs)(**self.fs.storage_options)
            self._setup_cache()
        return self.fs

    def _index(self, path: str) -> _Shard:
        import pyarrow.parquet as pq

        info = self.fs.info(path)
        version = str(info.get("ETag") or info.get("etag") or info.get("mtime") or "")
        try:
            with self.fs.open(path, "rb") as fh:
                md = pq.ParquetFile(fh).metadata
                schema = md.schema.to_arrow_schema()
        except Exception as e:  # noqa: BLE001 - named
            raise ConfigError(
                f"parquet_component: {path} is not a readable Parquet file: {e}"
            ) from e
        if self.columns is not None:
            missing = [c for c in self.columns if c not in schema.names]
            if missing:
                raise ConfigError(
                    f"parquet_component: {path} has no columns {missing} (it has {schema.names})"
                )
        groups = tuple(md.row_group(i).num_rows for i in range(md.num_row_groups))
        return _Shard(path, int(info.get("size") or 0), version, groups)

    # -- the component protocol -----------------------------------------------------------

    def __len__(self) -> int:
        return int(self._starts[-1])

    def zephon_fingerprint(self) -> str:
        """Paths, sizes, versions and row counts of every shard, and the columns read."""
        h = hashlib.sha256(repr(self.columns).encode())
        for s in self.shards:
            h.update(repr((s.path, s.size, s.version, s.row_groups)).encode())
        return h.hexdigest()[:32]

    def __getitems__(self, rows: Sequence[int]) -> list[dict]:
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) and (rows.min() < 0 or rows.max() >= len(self)):
            raise IndexError(f"rows {rows.min()}..{rows.max()} outside 0..{len(self) - 1}")
        groups = np.searchsorted(self._starts, rows, side="right") - 1
        out: list[Any] = [None] * len(rows)
        for g in dict.fromkeys(groups.tolist()):
            pick = np.flatnonzero(groups == g)
            table = self._row_group(g)
            local = rows[pick] - self._starts[g]
            for i, rec in zip(pick.tolist(), table.take(local).to_pylist()):
                out[i] = rec
        return out

    def __getitem__(self, row: int) -> dict:
        return self.__getitems__([row])[0]

    # -- row groups -------------------------------------------------------------------------

    def _row_group(self, g: int) -> Any:
        self._filesystem()  # after a fork: this process's own client and cache
        with self._lock:
            table = self._cache.get(g)
            if table is not None:
                self._cache.move_to_end(g)
                self._io["cache_hits"] += 1
                return table
        table = self._read_retrying(g)
        with self._lock:
            if g not in self._cache:
                self._cache[g] = table
                self._cached += table.nbytes
                while self._cached > self.cache_bytes and len(self._cache) > 1:
                    _, old = self._cache.popitem(last=False)
                    self._cached -= old.nbytes
        return table

    def _read_retrying(self, g: int) -> Any:
        delay, attempt = BACKOFF_S, 1
        while True:
            try:
                table = self._read(g)
                self._io["row_group_reads"] += 1
                return table
            except PipelineError as e:
                cause = e.__cause__
                if cause is None or not transient(cause) or attempt >= ATTEMPTS:
                    raise
            self._io["retries"] += 1
            attempt += 1
            time.sleep(delay)  # backoff before reading the same row group again
            delay = min(2 * delay, MAX_BACKOFF_S)

    def _read(self, g: int) -> Any:
        import pyarrow.parquet as pq

        s, rg = self._where[g]
        shard = self.shards[s]
        fs = self._filesystem()
        try:
            with fs.open(shard.path, "rb") as fh:
                size = getattr(fh, "size", None)  # known from the open, no extra request
                if size is not None and shard.size and size != shard.size:
                    raise SourceChanged(
                        f"shard {shard.path} changed under the running job ({size} bytes, "
                        f"{shard.size} when indexed): restore the file, or start a new run "
                        "(a checkpoint of this one would not restore over the new file)",
                        operator="fetch",
                    )
                pf = pq.ParquetFile(fh, metadata=self._meta.get(s))
                self._meta.setdefault(s, pf.metadata)
                return pf.read_row_group(rg, columns=self.columns)
        except SourceChanged:
            raise
        except FileNotFoundError as e:
            raise SourceChanged(
                f"shard {shard.path} was deleted under the running job: restore it, or "
                "start a new run",
                operator="fetch",
            ) from e
        except Exception as e:  # noqa: BLE001 - named: which shard and row group
            raise PipelineError(
                f"reading row group {rg} of {shard.path} failed"
                + (f" {ATTEMPTS} times" if transient(e) else "")
                + f": {type(e).__name__}: {e}",
                operator="fetch",
            ) from e

    # -- pickling (DataLoader workers): the index travels, the cache does not ---------------

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for k in ("_cache", "_cached", "_lock", "_meta", "_pid", "_io"):
            state.pop(k, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._setup_cache()
