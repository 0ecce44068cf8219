"""Coordination storage for aggregation rounds: a directory (or fsspec URL) or a torch Store.

Both offer the same small key/value interface. Directory writes are atomic
(temporary name + rename), so a reader never sees half a file; waits poll
with exponential backoff capped at 5 s. The torch Store (torchrun's TCPStore)
uses its own blocking waits.
"""

from __future__ import annotations

import datetime
import time
import uuid
from typing import Any

from ..errors import ConfigError

MAX_BACKOFF_S = 5.0


class DirStorage:
    def __init__(self, url: str):
        import fsspec

        self.fs, self.root = fsspec.core.url_to_fs(url)
        self.fs.makedirs(self.root, exist_ok=True)

    def _path(self, key: str) -> str:
        return f"{self.root.rstrip('/')}/{key}"

    def put(self, key: str, value: bytes) -> None:
        tmp = self._path(f".tmp-{uuid.uuid4().hex}-{key}")
        with self.fs.open(tmp, "wb") as f:
            f.write(value)
        self.fs.mv(tmp, self._path(key))

    def get(self, key: str) -> bytes | None:
        try:
            with self.fs.open(self._path(key), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def delete(self, key: str) -> None:
        try:
            self.fs.rm(self._path(key))
        except FileNotFoundError:
            pass

    def wait(self, key: str, deadline: float) -> bytes | None:
        """The value of ``key`` once it exists, or None at ``deadline``."""
        delay = 0.005
        while True:
            value = self.get(key)
            if value is not None:
                return value
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            time.sleep(min(delay, left))
            delay = min(delay * 2, MAX_BACKOFF_S)


class StoreStorage:
    """A ``torch.distributed.Store``; keys are namespaced under ``zephon/``."""

    def __init__(self, store: Any, prefix: str = "zephon/"):
        self.store = store
        self.prefix = prefix

    def put(self, key: str, value: bytes) -> None:
        self.store.set(self.prefix + key, value)

    def get(self, key: str) -> bytes | None:
        k = self.prefix + key
        if not self.store.check([k]):
            return None
        return bytes(self.store.get(k))

    def delete(self, key: str) -> None:
        self.store.delete_key(self.prefix + key)

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
