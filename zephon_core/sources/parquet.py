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
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import ConfigError, PipelineError, SourceChanged
from ..validate import int_arg
from .loading_lru import LoadingLRU
from .parquet_index import Shard, build_index, list_shards

__all__ = ["ParquetComponent", "parquet_component"]


def parquet_component(
    urls: str | Sequence[str],
    columns: Sequence[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    cache_bytes: int = 256 << 20,
    index_path: str | None = None,
    disk_cache: str | None = None,
    progress: bool | None = None,
) -> ParquetComponent:
    """A component over Parquet shards: a glob (``s3://bucket/prefix/*.parquet``), a
    directory (every ``*.parquet`` below it) or a list of files, read through fsspec.

    Args:
        cache_bytes: decoded row groups kept in memory (per process).
        index_path: where to save the index (a local path or a URL, e.g. next to the
            data); reused while the shards it lists are unchanged (``parquet_index.py``).
        disk_cache: a local directory for the bytes read (fsspec's block cache): a
            second epoch or a restarted job reads them from disk, not the endpoint.
        progress: a progress bar while footers are read (default: on a terminal, from
            16 shards).

    Raises:
        ConfigError: no shard found, a shard is not Parquet, or a column is missing.
    """
    import fsspec

    urls = [urls] if isinstance(urls, str) else list(urls)
    if not urls:
        raise ConfigError("parquet_component: give a path, a glob or a list of files")
    options = dict(storage_options or {})
    fs, _, _ = fsspec.core.get_fs_token_paths(urls[0], storage_options=options)
    listed = list_shards(fs, urls)
    if not listed:
        raise ConfigError(f"parquet_component: no Parquet files match {urls!r}")
    shards, footers = build_index(fs, listed, index_path, options, progress)
    return ParquetComponent(fs, shards, columns, cache_bytes, disk_cache, footers)


#: footers kept per process (string statistics can make them 100s of KB per shard)
FOOTER_BYTES = 64 << 20
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
        self,
        fs: Any,
        shards: Sequence[Shard],
        columns: Sequence[str] | None,
        cache_bytes: int,
        disk_cache: str | None = None,
        footers: dict[str, Any] | None = None,
    ):
        self.target = fs  # the data's filesystem; reads may go through a disk cache
        self.disk_cache = disk_cache
        self.columns = list(columns) if columns is not None else None
        self.cache_bytes = int_arg("cache_bytes", cache_bytes, minimum=1, where="parquet_component")
        self.shards = tuple(shards)
        for shard in self.shards:
            missing = [c for c in self.columns or () if shard.columns and c not in shard.columns]
            if missing:
                raise ConfigError(
                    f"parquet_component: {shard.path} has no columns {missing} (it has "
                    f"{list(shard.columns)})"
                )
        self.fs = self._reader_fs()
        # global row-group table: starting row, shard, row group within the shard
        starts, where = [0], []
        for s, shard in enumerate(self.shards):
            for g, n in enumerate(shard.row_groups):
                where.append((s, g))
                starts.append(starts[-1] + n)
        self._starts = np.asarray(starts, dtype=np.int64)
        self._where = where
        self._setup_cache(footers)

    def _setup_cache(self, footers: dict[str, Any] | None = None) -> None:
        self._cache = LoadingLRU(self.cache_bytes, lambda table: table.nbytes)  # row groups
        self._meta = LoadingLRU(FOOTER_BYTES, lambda md: md.serialized_size)  # per shard
        for s, shard in enumerate(self.shards):
            if shard.path in (footers or {}):  # read by the index in this process
                self._meta.get(s, lambda md=footers[shard.path]: md)
        self._pid = os.getpid()
        self._io = {"row_group_reads": 0, "cache_hits": 0, "retries": 0}

    def io_stats(self) -> dict[str, int]:
        """Row groups read, cache hits and retried reads, in this process."""
        return dict(self._io)

    def _reader_fs(self) -> Any:
        if self.disk_cache is None:
            return self.target
        import fsspec

        # check_files: a shard rewritten in storage is not served from stale blocks
        return fsspec.filesystem(
            "blockcache", fs=self.target, cache_storage=self.disk_cache, check_files=True
        )

    def _filesystem(self) -> Any:
        """The filesystem of this process: a forked DataLoader worker builds its own
        (s3fs and gcsfs clients are not fork-safe), from the same storage options."""
        if os.getpid() != self._pid:
            self.target = type(self.target)(**self.target.storage_options)
            self.fs = self._reader_fs()
            self._setup_cache()
        return self.fs

    # -- the component protocol -----------------------------------------------------------

    def __len__(self) -> int:
        return int(self._starts[-1])

    def block_bounds(self) -> np.ndarray:
        """Row offsets of the row groups (the blocks of ``shuffle_block="row_group"``)."""
        return self._starts.copy()

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
        table, hit = self._cache.get(g, lambda: self._read_retrying(g))
        if hit:
            self._io["cache_hits"] += 1
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
            # no read-ahead: s3fs would fetch its block size (50 MB) beyond every read
            # (the disk cache reads whole blocks, its own way)
            kw = {} if self.disk_cache else {"cache_type": "none"}
            with fs.open(shard.path, "rb", **kw) as fh:
                size = getattr(fh, "size", None)  # known from the open, no extra request
                if size is not None and shard.size and size != shard.size:
                    raise SourceChanged(
                        f"shard {shard.path} changed under the running job ({size} bytes, "
                        f"{shard.size} when indexed): restore the file, or start a new run "
                        "(a checkpoint of this one would not restore over the new file)",
                        operator="fetch",
                    )
                md, _ = self._meta.get(s, lambda: pq.ParquetFile(fh).metadata)
                return pq.ParquetFile(fh, metadata=md).read_row_group(rg, columns=self.columns)
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
        for k in ("_cache", "_meta", "_pid", "_io"):
            state.pop(k, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._setup_cache()
