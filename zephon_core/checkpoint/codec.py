"""Checkpoint bytes: msgpack inside zstd behind a magic header; atomic file writes.
(``docs/design.md`` §8)

Decoding never executes code (no pickle) and bounds the decompressed size,
so a hostile or corrupted file yields :class:`CorruptCheckpoint`.

A local write goes to ``.<name>.zephon-<host>-<pid>-<random>.tmp`` next to the target
and is renamed over it. A writer killed mid-save leaves that file behind; the next
save or load of the same path removes such leftovers of this host whose process is
gone (another host's, or a live writer's, are left alone).
"""

from __future__ import annotations

import glob
import os
import socket
import tempfile
from typing import Any

import msgpack
import zstandard

from ..errors import CorruptCheckpoint

MAGIC = b"ZEPHON\x01"
MAX_DECOMPRESSED = 512 * 1024 * 1024


def encode(state: dict[str, Any], level: int = 3) -> bytes:
    raw = msgpack.packb(state, use_bin_type=True)
    cctx = zstandard.ZstdCompressor(level=level, write_content_size=True, write_checksum=True)
    return MAGIC + cctx.compress(raw)


def decode(data: bytes, max_size: int = MAX_DECOMPRESSED) -> dict[str, Any]:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise CorruptCheckpoint(f"expected bytes, got {type(data).__name__}")
    data = bytes(data)
    if not data.startswith(MAGIC):
        raise CorruptCheckpoint("not a Zephon checkpoint file (bad magic header)")
    frame = data[len(MAGIC) :]
    try:
        declared = zstandard.get_frame_parameters(frame).content_size
        if declared > max_size:  # 0 means "unknown"; then max_output_size bounds it
            raise CorruptCheckpoint(
                f"checkpoint declares {declared} decompressed bytes, more "
                f"than the {max_size}-byte limit"
            )
        raw = zstandard.ZstdDecompressor().decompress(frame, max_output_size=max_size)
    except zstandard.ZstdError as e:
        raise CorruptCheckpoint(f"checkpoint is truncated or corrupted (zstd: {e})") from e
    try:
        state = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as e:
        raise CorruptCheckpoint(f"checkpoint payload is corrupted (msgpack: {e})") from e
    if not isinstance(state, dict):
        raise CorruptCheckpoint("checkpoint payload is not a mapping")
    return state


def _is_url(path: str) -> bool:
    return "://" in path and not path.startswith("file://")


def write_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` so readers see either the old file or the whole new one."""
    path = os.fspath(path)
    if _is_url(path):
        import fsspec

        fs, p = fsspec.core.url_to_fs(path)
        tmp = f"{p}.tmp-{os.getpid()}"
        with fs.open(tmp, "wb") as f:
            f.write(data)
        fs.mv(tmp, p)
        return
    path = path.removeprefix("file://")
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    remove_stale_temps(path)
    fd, tmp = tempfile.mkstemp(
        dir=d, prefix=f"{_temp_prefix(path)}{_HOST}-{os.getpid()}-", suffix=".tmp"
    )
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_bytes(path: str | os.PathLike) -> bytes:
    path = os.fspath(path)
    if _is_url(path):
        import fsspec

        with fsspec.open(path, "rb") as f:
            return f.read()
    path = path.removeprefix("file://")
    remove_stale_temps(path)
    with open(path, "rb") as f:
        return f.read()


_HOST = socket.gethostname().replace("-", "_")


def _temp_prefix(path: str) -> str:
    return f".{os.path.basename(path)}.zephon-"


def remove_stale_temps(path: str | os.PathLike) -> list[str]:
    """Remove the temporary files an interrupted save of ``path`` left (this host's, whose
    writer process is gone). Returns the removed paths."""
    path = os.fspath(path)
    d = os.path.dirname(os.path.abspath(path))
    removed = []
    for tmp in glob.glob(os.path.join(glob.escape(d), glob.escape(_temp_prefix(path)) + "*.tmp")):
        rest = os.path.basename(tmp)[len(_temp_prefix(path)) :]
        host, _, tail = rest.partition("-")
        pid = tail.partition("-")[0]
        if host != _HOST or not pid.isdigit() or _alive(int(pid)):
            continue
        try:
            os.unlink(tmp)
            removed.append(tmp)
        except FileNotFoundError:
            pass
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
