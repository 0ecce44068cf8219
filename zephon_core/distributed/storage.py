"""Coordination storage for aggregation rounds: a directory (or fsspec URL) or a torch Store.

Both offer the same small key/value interface, and every call takes the round's
deadline. Directory writes are atomic: a file system writes a temporary name and renames
it (the temporary file is removed if the write fails, e.g. on a full disk); an object
store (an async fsspec file system: S3, GCS, Azure) puts the object in one request,
which is atomic already. Object-store calls are cut at the deadline, retries included
(s3fs and botocore retry throttling on their own, for longer than a round may last); a
call cut short raises :class:`StorageTimeout`. Waits poll with exponential backoff
capped at 5 s. The torch Store (torchrun's TCPStore) uses its own blocking waits.
"""

from __future__ import annotations

import datetime
import time
import uuid
from typing import Any

from ..errors import ConfigError

MAX_BACKOFF_S = 5.0
MIN_CALL_S = 0.05  # a call started at (or past) its deadline still gets this long


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
        try:
            return sync(self.fs.loop, getattr(self.fs, f"_{name}"), *args, timeout=left)
        except TimeoutError as e:  # fsspec's FSTimeoutError is one
            raise StorageTimeout(
                f"{name} {args[0]!r} did not finish within the round's time budget "
                f"({left:.1f} s left); the storage is slow or throttling"
            ) from e

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

    def wait(self, key: str, deadline: float) -> bytes | None:
        """The value of ``key`` once it exists, or None at ``deadline``."""
        delay = 0.005
        while True:
            try:
                value = self.get(key, deadline)
            except StorageTimeout:
                return None
            if value is not None:
                return value
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            time.sleep(min(delay, left))
            delay = min(delay * 2, MAX_BACKOFF_S)


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

    def wait(self, key: str, deadline: float) -> bytes | None:
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
