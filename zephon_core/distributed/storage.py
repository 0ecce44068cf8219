"""Coordination storage for aggregation rounds: a directory (or fsspec URL) or a torch Store.

Both offer the same small key/value interface, and every call takes the round's
deadline. Directory writes are atomic: a file system writes a temporary name and renames
it (the temporary file is removed if the write fails, e.g. on a full disk); an object
store (an async fsspec file system: S3, GCS, Azure) puts the object in one request,
which is atomic already. Object-store calls are cut at the deadline, retries included
(s3fs and botocore retry throttling on their own, for longer than a round may last); a
call cut short raises :class:`StorageTimeout`. Waits poll with exponential backoff and
jitter (:class:`Backoff`: on a file system or a torch Store from 5 ms up to 1 s, on an
object store from 50 ms up to 5 s; never past the deadline), so a thousand waiting ranks
do not flood one prefix with GETs.
Waiting for many keys (the leader: every rank's report, every acknowledgement) lists the
directory once per poll and reads what arrived concurrently (:meth:`DirStorage.arrivals`),
instead of polling key by key; deleting many keys is one batched call on an object store
(S3's DeleteObjects). The torch Store (torchrun's TCPStore) uses its own blocking waits.
"""

from __future__ import annotations

import asyncio
import datetime
import random
import time
import uuid
from collections.abc import Iterator
from typing import Any

from ..errors import ConfigError

MAX_BACKOFF_S = 5.0
SLICE_S = 1.0  # on a file system or a torch Store, polls never pause longer than this
MIN_CALL_S = 0.05  # a call started at (or past) its deadline still gets this long
FIRST_BACKOFF_S = 0.005  # a file system: a poll costs a stat
FIRST_OBJECT_BACKOFF_S = 0.05  # an object store: a poll is a billed, rate-limited request
READ_BATCH = 64  # concurrent reads of one batch on an object store


class Backoff:
    """Exponential backoff with equal jitter: each pause is between half and all of the
    current delay, which doubles up to ``cap``; never past the deadline. Jitter spreads
    the polls of ranks that started together; keeping half the delay bounds the number of
    polls (logarithmic in the wait, then one per ``cap``)."""

    def __init__(self, first: float, cap: float = MAX_BACKOFF_S):
        self.delay = first
        self.cap = cap
        self.pauses = 0
        self._rng = random.Random()

    def sleep(self, deadline: float) -> bool:
        """Pause; False (at once) when the deadline has passed."""
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(self._rng.uniform(self.delay / 2, self.delay), left))
        self.delay = min(self.delay * 2, self.cap)
        self.pauses += 1
        return True


class StorageTimeout(TimeoutError):
    """A coordination storage call did not finish by the round's deadline."""


class DirStorage:
    def __init__(self, url: str):
        import fsspec
        from fsspec.asyn import AsyncFileSystem

        self.url = url
        self.fs, self.root = fsspec.core.url_to_fs(url)
        self.objects = isinstance(self.fs, AsyncFileSystem)  # atomic puts, cut at deadlines
        self.fs.makedirs(self.root, exist_ok=True)

    def _path(self, key: str) -> str:
        return f"{self.root.rstrip('/')}/{key}"

    def _call(self, deadline: float | None, name: str, *args: Any) -> Any:
        """``fs._<name>(*args)`` on the file system's event loop, cancelled at ``deadline``."""
        from fsspec.asyn import sync

        left = None if deadline is None else max(MIN_CALL_S, deadline - time.monotonic())
        call = self._cat_file_all if name == "cat_file_all" else getattr(self.fs, f"_{name}")
        try:
            return sync(self.fs.loop, call, *args, timeout=left)
        except TimeoutError as e:  # fsspec's FSTimeoutError is one
            raise StorageTimeout(
                f"{name} {args[0]!r} did not finish within the round's time budget "
                f"({left:.1f} s left); the storage is slow or throttling"
            ) from e

    async def _cat_file_all(self, paths: list[str]) -> dict[str, Any]:
        """Every path's bytes, or the exception reading it raised; READ_BATCH at a time."""
        out: dict[str, Any] = {}
        for i in range(0, len(paths), READ_BATCH):
            batch = paths[i : i + READ_BATCH]
            got = await asyncio.gather(
                *(self.fs._cat_file(p) for p in batch), return_exceptions=True
            )
            out.update(zip(batch, got))
        return out

    def put(self, key: str, value: bytes, deadline: float | None = None) -> None:
        if self.objects:
            self._call(deadline, "pipe_file", self._path(key), value)
            return
        tmp = self._path(f".tmp-{uuid.uuid4().hex}-{key}")
        try:
            with self.fs.open(tmp, "wb") as f:
                f.write(value)
            self.fs.mv(tmp, self._path(key))
        except BaseException:
            try:  # a full disk leaves an empty temporary file behind
                self.fs.rm(tmp)
            except OSError:
                pass
            raise

    def get(self, key: str, deadline: float | None = None) -> bytes | None:
        try:
            if self.objects:
                return self._call(deadline, "cat_file", self._path(key))
            with self.fs.open(self._path(key), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def delete(self, key: str, deadline: float | None = None) -> None:
        try:
            if self.objects:
                self._call(deadline, "rm_file", self._path(key))
            else:
                self.fs.rm(self._path(key))
        except FileNotFoundError:
            pass

    def keys(self, deadline: float | None = None) -> list[str]:
        """Every name in the directory (protocol files and leftovers alike)."""
        self.fs.invalidate_cache(self.root)
        if self.objects:
            paths = self._call(deadline, "ls", self.root, False)
        else:
            paths = self.fs.ls(self.root, detail=False)
        return [p.rstrip("/").rsplit("/", 1)[-1] for p in paths]

    def backoff(self) -> Backoff:
        if self.objects:
            return Backoff(FIRST_OBJECT_BACKOFF_S)
        return Backoff(FIRST_BACKOFF_S, SLICE_S)

    def wait(self, key: str, deadline: float, backoff: Backoff | None = None) -> bytes | None:
        """The value of ``key`` once it exists, or None at ``deadline``; ``backoff`` carries
        the delay on from earlier waits of the same caller."""
        backoff = backoff or self.backoff()
        while True:
            try:
                value = self.get(key, deadline)
            except StorageTimeout:
                return None
            if value is not None or not backoff.sleep(deadline):
                return value

    def arrivals(self, keys: list[str], deadline: float) -> Iterator[tuple[str, bytes]]:
        """``(key, value)`` for each of ``keys`` as it appears, until all did or the
        deadline passed: one listing per poll, then the new keys read together."""
        pending, backoff = set(keys), self.backoff()
        while pending:
            try:
                ready = sorted(pending.intersection(self.keys(deadline)))
                values = self._read_all(ready, deadline)
            except StorageTimeout:
                return
            for key in ready:
                value = values.get(key)
                if value is not None:
                    pending.discard(key)
                    yield key, value
            if pending and not backoff.sleep(deadline):
                return

    def _read_all(self, keys: list[str], deadline: float) -> dict[str, bytes]:
        """The values of ``keys`` (a key deleted meanwhile is left out); concurrent
        requests on an object store."""
        if not self.objects:
            got = {k: self.get(k, deadline) for k in keys}
            return {k: v for k, v in got.items() if v is not None}
        if not keys:
            return {}
        out = self._call(deadline, "cat_file_all", [self._path(k) for k in keys])
        by_path = dict(zip((self._path(k) for k in keys), keys))
        errors = [v for v in out.values() if isinstance(v, BaseException)]
        for e in errors:
            if not isinstance(e, FileNotFoundError):
                raise e
        return {by_path[p]: v for p, v in out.items() if not isinstance(v, BaseException)}

    def delete_many(self, keys: list[str], deadline: float | None = None) -> None:
        """Delete ``keys`` (missing ones are fine): one batched request per 1000 keys on
        S3, one call per file on a file system."""
        if not keys:
            return
        if not self.objects:
            for key in keys:
                self.delete(key, deadline)
            return
        try:
            self._call(deadline, "rm", [self._path(k) for k in keys])
        except FileNotFoundError:
            pass


class StoreStorage:
    """A ``torch.distributed.Store``; keys are namespaced under ``zephon/``. Its calls are
    bounded by the store's own timeout; it cannot list keys (a store's keys live as long
    as the store)."""

    def __init__(self, store: Any, prefix: str = "zephon/"):
        self.store = store
        self.prefix = prefix
        self.url = "the torch Store"

    def put(self, key: str, value: bytes, deadline: float | None = None) -> None:
        self.store.set(self.prefix + key, value)

    def get(self, key: str, deadline: float | None = None) -> bytes | None:
        k = self.prefix + key
        if not self.store.check([k]):
            return None
        return bytes(self.store.get(k))

    def delete(self, key: str, deadline: float | None = None) -> None:
        self.store.delete_key(self.prefix + key)

    def keys(self, deadline: float | None = None) -> None:
        return None

    def backoff(self) -> Backoff:
        return Backoff(FIRST_BACKOFF_S, SLICE_S)

    def delete_many(self, keys: list[str], deadline: float | None = None) -> None:
        for key in keys:
            self.delete(key, deadline)

    def arrivals(self, keys: list[str], deadline: float) -> Iterator[tuple[str, bytes]]:
        """``(key, value)`` for each of ``keys`` as it appears (in order: the store's own
        blocking wait, no polling), until all did or the deadline passed."""
        for key in keys:
            value = self.wait(key, deadline)
            if value is None:
                return
            yield key, value

    def wait(self, key: str, deadline: float, backoff: Backoff | None = None) -> bytes | None:
        left = deadline - time.monotonic()
        if left <= 0:
            return self.get(key)
        try:
            self.store.wait([self.prefix + key], datetime.timedelta(seconds=left))
        except RuntimeError:  # the store's own timeout
            return self.get(key)
        return self.get(key)


def open_storage(directory: str | None, store: Any) -> DirStorage | StoreStorage:
    if directory is not None:
        return DirStorage(directory)
    if store is None or store == "torch://":
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise ConfigError(
                "checkpoint() on several ranks merges lane states through coordination "
                "storage: pass aggregate_dir=<shared dir or URL> or aggregate_store=<Store>, "
                "or initialize torch.distributed to use aggregate_store='torch://'"
            )
        from torch.distributed.distributed_c10d import _get_default_store

        return StoreStorage(_get_default_store())
    if isinstance(store, str):
        raise ConfigError(
            f"aggregate_store={store!r}: use 'torch://' or a torch.distributed.Store object"
        )
    return StoreStorage(store)
