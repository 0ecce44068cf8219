"""Sharded Parquet as a random-access component, over any fsspec filesystem.

Why this shape: pretraining corpora are many Parquet shards in object storage
(``s3://``, ``gs://``, ``hf://``, local paths). A :class:`StaticMixtureWorkSource`
needs ``len()`` and batched reads by row index, so a component is an **index** built
once from the shards' footers -- files sorted, rows per row group -- and reads go by row
group with column projection, through a bounded in-memory cache of decoded row groups
(``cache_bytes``). Nothing is downloaded up front; a chunk's rows cost one read per
distinct row group they fall in.

The content fingerprint (``zephon_fingerprint``) covers every shard's path, size, ETag
or modification time and row counts, and the columns read: a shard rewritten, added or
deleted under a checkpoint is ``IncompatibleCheckpoint`` at restore, naming the dataset
and the shards (the fingerprint carries a manifest: ``digests/manifest.py``).

Reads are verified (``parquet_digest.py``): page checksums where the writer wrote them,
and a digest of each row group's column chunks -- from the index when it was built with
``verify="index"``, else from the row group's first read in this process -- compared at
every read. A failed check is read once more from the store (a bit can flip in transit,
or in the local disk cache); failing again it is :class:`CorruptData` naming the shard and
row group. A file rewritten under the running job is :class:`SourceChanged`, never
retried.

Example::

    src = StaticMixtureWorkSource({
        "web": parquet_component("s3://corpus/web/*.parquet", columns=["text"],
                                 storage_options={"endpoint_url": ...}),
        "code": parquet_component("/data/code/", columns=["text"]),
    }, weights={"web": 0.8, "code": 0.2})
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..digests.manifest import with_manifest
from ..errors import ConfigError, CorruptData, PipelineError, SourceChanged
from ..validate import int_arg
from .loading_lru import LoadingLRU
from .parquet_digest import RowGroupDigests, SpanFile, leaves, read_chunks
from .parquet_index import Shard, build_index, list_shards, version_of
from .storage_retry import expired, retrying, transient

__all__ = ["ParquetComponent", "parquet_component"]

log = logging.getLogger(__name__)

VERIFY = ("reads", "index")


def parquet_component(
    urls: str | Sequence[str],
    columns: Sequence[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    cache_bytes: int = 256 << 20,
    index_path: str | None = None,
    disk_cache: str | None = None,
    progress: bool | None = None,
    verify: str = "reads",
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
        verify: ``"reads"`` (page checksums where written; each row group's bytes
            digested at its first read in this process and checked at every later
            read) or ``"index"`` (the digests are taken when the index is built --
            which then reads the projected columns once -- and saved with it, so every
            read is checked, the first of every later job too; pair it with
            ``index_path``). Digests found in a saved index are used either way.

    Raises:
        ConfigError: no shard found, a shard is not Parquet, or a column is missing.
        StorageThrottled: the store throttled the listing or the footers past the retries.
    """
    import fsspec

    if verify not in VERIFY:
        raise ConfigError(f"parquet_component: verify={verify!r}; use one of {VERIFY}")
    urls = [urls] if isinstance(urls, str) else list(urls)
    if not urls:
        raise ConfigError("parquet_component: give a path, a glob or a list of files")
    options = dict(storage_options or {})
    fs, _ = fsspec.core.url_to_fs(urls[0], **options)  # no glob yet: list_shards retries
    listed = list_shards(fs, urls)
    if not listed:
        raise ConfigError(f"parquet_component: no Parquet files match {urls!r}")
    digest = (list(columns) if columns is not None else None) if verify == "index" else False
    shards, footers = build_index(fs, listed, index_path, options, progress, digest)
    return ParquetComponent(fs, shards, columns, cache_bytes, disk_cache, footers)


#: footers kept per process (string statistics can make them 100s of KB per shard)
FOOTER_BYTES = 64 << 20


class _Damaged(Exception):
    """A read whose bytes failed a check (internal: read again, then ``CorruptData``)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class ParquetComponent:
    """``len()`` rows over sorted shards; ``__getitems__`` reads by row group (cached).

    A read that fails transiently (throttling such as S3's 503 SlowDown, a connection
    reset, a timeout) is retried up to ``ATTEMPTS`` times with capped exponential
    backoff (``storage_retry.py``); the same row group is read again, so nothing is lost
    or duplicated. A read whose bytes fail a check (see the module docstring) is read
    once more from the store. ``io_stats()`` counts reads, cache hits, retries and
    re-reads after a failed check (of this process).
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
        # a local file's modification time is checked at every read (a stat): a shard
        # rewritten in place under the job is SourceChanged, as an object's ETag is
        protocol = getattr(fs, "protocol", ())
        self._local = "file" in ((protocol,) if isinstance(protocol, str) else protocol)
        # global row-group table: starting row, shard, row group within the shard
        starts, where = [0], []
        for s, shard in enumerate(self.shards):
            for g, n in enumerate(shard.row_groups):
                where.append((s, g))
                starts.append(starts[-1] + n)
        self._starts = np.asarray(starts, dtype=np.int64)
        self._where = where
        self._digests = RowGroupDigests(self.shards, where, self.columns)
        # the index's digest strings are in the table now (9 bytes per row group)
        self.shards = tuple(dataclasses.replace(s, digests=None) for s in self.shards)
        self._setup_cache(footers)

    def _setup_cache(self, footers: dict[str, Any] | None = None) -> None:
        self._cache = LoadingLRU(self.cache_bytes, lambda table: table.nbytes)  # row groups
        self._meta = LoadingLRU(FOOTER_BYTES, lambda md: md.serialized_size)  # per shard
        for s, shard in enumerate(self.shards):
            if shard.path in (footers or {}):  # read by the index in this process
                self._meta.get(s, lambda md=footers[shard.path]: md)
        self._pid = os.getpid()
        self._io = {"row_group_reads": 0, "cache_hits": 0, "retries": 0, "reread_checks": 0}

    def io_stats(self) -> dict[str, int]:
        """Row groups read, cache hits, retried reads and row groups read again after a
        failed check, in this process."""
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
        """Row offsets of the row groups (the blocks of ``shuffle_block="row_group"``);
        empty row groups and shards hold no block."""
        return np.unique(self._starts)

    def zephon_fingerprint(self) -> str:
        """Paths, sizes, versions and row counts of every shard, and the columns read;
        followed by a manifest of the shards (names, rows), to name what changed."""
        h = hashlib.sha256(repr(self.columns).encode())
        for s in self.shards:
            h.update(repr((s.path, s.size, s.version, s.row_groups)).encode())
        parts = [
            (s.path, sum(s.row_groups), _short(repr((s.size, s.version, s.row_groups))))
            for s in self.shards
        ]
        return with_manifest(h.hexdigest()[:32], parts)

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
        table, hit = self._cache.get(g, lambda: self._read_checked(g))
        if hit:
            self._io["cache_hits"] += 1
        return table

    def _read_checked(self, g: int) -> Any:
        """Row group ``g``; a read that fails its check is read again from the store."""
        try:
            return self._read_retrying(g, fresh=False)
        except _Damaged as first:
            s, rg = self._where[g]
            self._io["reread_checks"] += 1
            log.warning(
                "row group %d of %s failed its check (%s): reading it again from the store",
                rg, self.shards[s].path, first.reason,
            )  # fmt: skip
            self._forget(s)
            try:
                return self._read_retrying(g, fresh=True)
            except _Damaged as second:
                raise self._corrupt(g, second.reason) from None

    def _read_retrying(self, g: int, fresh: bool) -> Any:
        s, rg = self._where[g]

        def count(_: BaseException) -> None:
            self._io["retries"] += 1

        what = f"reading row group {rg} of {self.shards[s].path}"
        table = retrying(lambda: self._read(g, fresh), what, on_retry=count)
        self._io["row_group_reads"] += 1
        return table

    def _read(self, g: int, fresh: bool) -> Any:
        """One attempt; ``fresh``: from the store itself (not the disk cache)."""
        s, rg = self._where[g]
        shard = self.shards[s]
        fs = self.target if fresh else self._filesystem()
        try:
            # no read-ahead: s3fs would fetch its block size (50 MB) beyond every read
            # (the disk cache reads whole blocks, its own way)
            kw = {"cache_type": "none"} if fs is self.target else {}
            with fs.open(shard.path, "rb", **kw) as fh:
                size = getattr(fh, "size", None)  # known from the open, no extra request
                if size is not None and shard.size and size != shard.size:
                    raise self._changed(shard, f"{size} bytes, {shard.size} when indexed")
                if self._local:
                    now = version_of(self.target.info(shard.path))
                    if now != shard.version:
                        raise self._changed(
                            shard, f"modified at {now}, {shard.version} when indexed"
                        )
                md, _ = self._meta.get(s, lambda: _footer(fh))
                idx = leaves(md, self.columns)
                try:
                    chunks = read_chunks(fh, md, rg, idx)
                except EOFError as e:
                    raise _Damaged(f"it is shorter than its footer says ({e})") from None
                end = max((start + len(buf) for start, buf in chunks), default=0)
                return self._decode(g, fh, md, idx, chunks, size or shard.size or end)
        except (SourceChanged, _Damaged):
            raise
        except FileNotFoundError as e:
            raise SourceChanged(
                f"shard {shard.path} was deleted under the running job: restore it, or "
                "start a new run",
                operator="fetch",
            ) from e
        except Exception as e:  # noqa: BLE001 - named: which shard and row group
            if expired(e):  # s3fs's FileExpired: the ETag moved since the listing
                raise self._changed(shard, f"its ETag changed: {type(e).__name__}") from e
            if transient(e):
                raise  # retried (or named as throttled) by storage_retry
            raise PipelineError(
                f"reading row group {rg} of {shard.path} failed: {type(e).__name__}: {e}",
                operator="fetch",
            ) from e

    def _decode(self, g: int, fh: Any, md: Any, idx: list[int], chunks: list, size: int) -> Any:
        """Check the bytes against the row group's digest, then decode them (with page
        checksums); the first good read of a row group sets its digest."""
        import pyarrow.parquet as pq

        problem, digest = self._digests.check(g, md, idx, chunks)
        if problem:
            raise _Damaged(problem)
        s, rg = self._where[g]
        try:
            # decoded on this thread: Arrow's pool threads reading a Python file object
            # made interpreter exit abort ("terminate called without an active
            # exception") in up to 30 % of short runs importing torch, 0 of 80 like this
            table = pq.ParquetFile(
                SpanFile(chunks, size, fh), metadata=md, page_checksum_verification=True,
                pre_buffer=False,
            ).read_row_group(rg, columns=self.columns, use_threads=False)  # fmt: skip
        except Exception as e:  # noqa: BLE001 - the bytes are in memory: they are bad
            raise _Damaged(f"it cannot be decoded: {type(e).__name__}: {e}") from None
        rows = self.shards[s].row_groups[rg]
        if table.num_rows != rows:  # a damaged page header can drop values
            raise _Damaged(f"it decodes to {table.num_rows} rows, {rows} in its footer")
        self._digests.record(g, digest)
        return table

    def _forget(self, s: int) -> None:
        """Before reading shard ``s`` again from the store: drop its disk-cached blocks
        and the client's cached listing."""
        path = self.shards[s].path
        pop = getattr(self.fs, "pop_from_cache", None)
        if pop is not None and self.fs is not self.target:
            try:
                pop(path)
            except (OSError, KeyError) as e:  # noqa: PERF203 - best effort: read fresh anyway
                log.debug("could not drop %s from the disk cache: %s", path, e)
        self.target.invalidate_cache(path)

    def _corrupt(self, g: int, reason: str) -> PipelineError:
        """The error for a row group that failed its check twice: the file changed (its
        size or version moved: ``SourceChanged``) or is damaged (``CorruptData``)."""
        s, rg = self._where[g]
        shard = self.shards[s]
        try:
            info = self.target.info(shard.path)
        except FileNotFoundError:
            info = {}
        if info and (int(info.get("size") or 0), version_of(info)) != (shard.size, shard.version):
            return self._changed(shard, f"row group {rg}: {reason}")
        first, last = int(self._starts[g]), int(self._starts[g + 1]) - 1
        maybe = (
            ""
            if self._digests.from_index(g)
            else " (or its first read in this process was "
            "damaged on the way, and its rows were delivered)"
        )
        return CorruptData(
            f"row group {rg} of {shard.path} (rows {first}..{last} of the dataset) is "
            f"corrupt: {reason}; read twice, the second time from the store"
            + (" (not the disk cache)" if self.disk_cache else "")
            + f". The file is damaged where it is stored{maybe}: restore it from a good "
            "copy or write it again, then resume from a checkpoint (if the repaired file "
            "has another ETag or modification time, the restore names it as changed data: "
            "allow_changes={'data'} accepts it)",
            operator="fetch",
        )

    def _changed(self, shard: Shard, what: str) -> SourceChanged:
        self.target.invalidate_cache(shard.path)  # a later index sees the new file
        return SourceChanged(
            f"shard {shard.path} changed under the running job ({what}): restore the "
            "file, or start a new run (a checkpoint of this one would not restore over "
            "the new file)",
            operator="fetch",
        )

    # -- pickling (DataLoader workers): the index travels, the cache does not ---------------

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for k in ("_cache", "_meta", "_pid", "_io"):
            state.pop(k, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._setup_cache()


def _footer(fh: Any) -> Any:
    import pyarrow.parquet as pq

    return pq.ParquetFile(fh).metadata


def _short(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=4).hexdigest()
