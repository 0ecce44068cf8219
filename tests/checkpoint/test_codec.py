"""Checkpoint bytes: msgpack + zstd behind a magic header, atomic file writes.

docs/design.md §8: a truncated or corrupted file is an error (CorruptCheckpoint), never
a silent fresh start; reading never executes code and bounds decompressed
size, so hostile input yields a typed error, not a crash or a hang.
"""

from __future__ import annotations

import os
import pickle

import msgpack
import pytest
import zstandard
from helpers import reference_pipeline

from zephon_core import CorruptCheckpoint, Pipeline
from zephon_core.checkpoint import codec
from zephon_core.testing import take

SAMPLE = {
    "format": "x",
    "n": 3,
    "neg": -5,
    "big": (1 << 64) - 1,
    "f": 1.5,
    "none": None,
    "flag": True,
    "s": "é",
    "b": b"\x00\x01",
    "lst": [1, [2, [3]]],
    "d": {"k": {"j": [None]}},
}


@pytest.fixture(scope="module")
def real_state():
    pipe = reference_pipeline(prefetch=0)
    take(pipe, 40)
    st = pipe.checkpoint()
    pipe.close()
    return st


def test_round_trip_preserves_values():
    data = codec.encode(SAMPLE)
    assert isinstance(data, bytes)
    assert data.startswith(codec.MAGIC)
    assert codec.decode(data) == SAMPLE
    assert codec.decode(bytearray(data)) == SAMPLE
    assert codec.decode(memoryview(data)) == SAMPLE


def test_round_trip_of_a_real_checkpoint(real_state):
    data = codec.encode(real_state)
    assert codec.decode(data) == real_state
    assert codec.encode(codec.decode(data)) == data  # deterministic bytes


def test_every_truncation_is_corrupt(real_state):
    data = codec.encode(real_state)
    for n in range(len(data)):
        with pytest.raises(CorruptCheckpoint):
            codec.decode(data[:n])


def _flip_outcomes(data: bytes, original: dict):
    foreign, different = [], []
    for i in range(len(data)):
        for bit in (0x01, 0x80):
            b = bytearray(data)
            b[i] ^= bit
            try:
                got = codec.decode(bytes(b))
            except CorruptCheckpoint:
                continue
            except Exception as e:  # noqa: BLE001 - this is what the test looks for
                foreign.append((i, bit, f"{type(e).__name__}: {e}"))
                continue
            if got != original:
                different.append((i, bit))
    return foreign, different


def test_flipped_bytes_raise_only_corrupt_checkpoint(real_state):
    data = codec.encode(real_state)
    foreign, _ = _flip_outcomes(data, real_state)
    assert not foreign, (
        f"{len(foreign)} corrupted inputs raised something other than "
        f"CorruptCheckpoint, e.g. {foreign[:3]}"
    )


def test_flipped_bytes_never_decode_to_a_different_state(real_state):
    data = codec.encode(real_state)
    _, different = _flip_outcomes(data, real_state)
    assert not different, (
        f"{len(different)} of {2 * len(data)} single-bit corruptions "
        f"decoded silently into a different state, e.g. at {different[:5]}"
    )


def test_unhashable_map_key_payload_is_corrupt():
    raw = b"\x81\x91\x01\x02"  # msgpack {[1]: 2}
    with pytest.raises(CorruptCheckpoint):
        codec.decode(codec.MAGIC + zstandard.ZstdCompressor().compress(raw))


@pytest.mark.parametrize(
    "blob",
    [
        b"",
        b"ZEPHON",
        b"ZEPHON\x02" + b"\x00" * 32,
        b"PK\x03\x04" + b"\x00" * 32,
        pickle.dumps({"format": "zephon.pipeline_state"}),
        zstandard.ZstdCompressor().compress(msgpack.packb({"a": 1})),  # no header
    ],
)
def test_wrong_magic_is_corrupt(blob):
    with pytest.raises(CorruptCheckpoint):
        codec.decode(blob)


def test_wrong_magic_on_an_otherwise_valid_checkpoint(real_state):
    data = bytearray(codec.encode(real_state))
    data[len(codec.MAGIC) - 1] ^= 0x03
    with pytest.raises(CorruptCheckpoint, match="magic"):
        codec.decode(bytes(data))


@pytest.mark.parametrize("obj", ["ZEPHON\x01abc", {"a": 1}, None, 12])
def test_non_bytes_are_corrupt(obj):
    with pytest.raises(CorruptCheckpoint):
        codec.decode(obj)


@pytest.mark.parametrize(
    "raw",
    [
        msgpack.packb([1, 2, 3]),
        msgpack.packb("text"),
        msgpack.packb({"a": 1}) + b"\x01",  # trailing garbage
        b"\xc1",  # never-used msgpack byte
        pickle.dumps({"a": 1}),  # a pickle inside a valid frame
    ],
)
def test_payload_that_is_not_one_msgpack_mapping_is_corrupt(raw):
    with pytest.raises(CorruptCheckpoint):
        codec.decode(codec.MAGIC + zstandard.ZstdCompressor().compress(raw))


BOMB = 64 << 20  # 64 MiB decompressed from ~2 KiB
SMALL = 1 << 20


def _frames(raw: bytes) -> dict[str, bytes]:
    with_size = zstandard.ZstdCompressor(write_content_size=True).compress(raw)
    cobj = zstandard.ZstdCompressor().compressobj()
    streamed = cobj.compress(raw) + cobj.flush()  # frame without a content size
    return {"content_size": codec.MAGIC + with_size, "streamed": codec.MAGIC + streamed}


@pytest.mark.parametrize("kind", ["content_size", "streamed"])
def test_zero_bomb_is_corrupt(kind):
    blob = _frames(b"\x00" * BOMB)[kind]
    assert len(blob) < 10_000
    with pytest.raises(CorruptCheckpoint):
        codec.decode(blob, max_size=SMALL)


@pytest.mark.parametrize("kind", ["content_size", "streamed"])
def test_bomb_of_a_valid_mapping_is_rejected_by_max_size(kind):
    """The bound must hold even when the payload is a perfectly valid mapping.

    Zephon's own encoder writes the content size into the frame header, so a
    hostile file will too; the size limit has to apply to such frames.
    """
    blob = _frames(msgpack.packb({"format": b"\x00" * BOMB}))[kind]
    assert len(blob) < 10_000
    with pytest.raises(CorruptCheckpoint):
        codec.decode(blob, max_size=SMALL)


def test_max_size_allows_payloads_below_it():
    st = {"a": b"\x00" * (SMALL // 2)}
    assert codec.decode(codec.encode(st), max_size=SMALL) == st


# -- files ------------------------------------------------------------------------------


def test_write_atomic_writes_and_leaves_no_temp_file(tmp_path):
    path = tmp_path / "sub" / "dir" / "state.zst"
    codec.write_atomic(path, b"hello")
    assert path.read_bytes() == b"hello"
    assert os.listdir(path.parent) == ["state.zst"]
    assert codec.read_bytes(path) == b"hello"
    assert codec.read_bytes(f"file://{path}") == b"hello"


def test_write_atomic_replaces_by_rename_not_in_place(tmp_path):
    path = tmp_path / "state.zst"
    codec.write_atomic(path, b"old contents")
    ino = os.stat(path).st_ino
    with open(path, "rb") as reader:  # a reader that opened the old file
        codec.write_atomic(path, b"new")
        assert reader.read() == b"old contents", "old file was modified in place"
    assert path.read_bytes() == b"new"
    assert os.stat(path).st_ino != ino
    assert os.listdir(tmp_path) == ["state.zst"]


def test_write_atomic_failure_keeps_old_file_and_no_temp(tmp_path):
    path = tmp_path / "state.zst"
    codec.write_atomic(path, b"old")
    with pytest.raises(TypeError):
        codec.write_atomic(path, 12345)  # not bytes: the write itself fails
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["state.zst"]


def test_write_atomic_accepts_file_url(tmp_path):
    path = tmp_path / "u.zst"
    codec.write_atomic(f"file://{path}", b"abc")
    assert path.read_bytes() == b"abc"
    assert os.listdir(tmp_path) == ["u.zst"]


def test_pipeline_load_of_a_corrupted_file_is_corrupt(tmp_path, real_state):
    path = tmp_path / "ckpt.zst"
    data = codec.encode(real_state)
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CorruptCheckpoint):
        Pipeline.load(path)
    path.write_bytes(b"")
    with pytest.raises(CorruptCheckpoint):
        Pipeline.load(path)


@pytest.mark.slow
def test_a_save_killed_before_its_rename_leaves_nothing_after_the_next_save(tmp_path):
    """An interrupted save leaves its temporary file; the next save or load of the same
    path removes it (the writer is gone), and leaves other paths' and live writers' alone."""
    import subprocess
    import sys

    path = tmp_path / "state.zst"
    killed = (
        "import os, sys; from zephon_core.checkpoint import codec; "
        "os.replace = lambda *a: os._exit(9); codec.write_atomic(sys.argv[1], b'x' * 100)"
    )
    for _ in range(2):  # the second interrupted save already removes the first one's file
        assert subprocess.run([sys.executable, "-c", killed, str(path)]).returncode == 9
    left = sorted(os.listdir(tmp_path))
    assert len(left) == 1 and left[0].startswith(".state.zst.zephon-"), left
    # a live writer's temporary file (this process) and another file's are kept
    live = tmp_path / f".state.zst.zephon-{codec._HOST}-{os.getpid()}-abc.tmp"
    other = tmp_path / f".other.zst.zephon-{codec._HOST}-1-abc.tmp"
    live.write_bytes(b"")
    other.write_bytes(b"")
    codec.write_atomic(path, b"new")
    assert sorted(os.listdir(tmp_path)) == sorted(["state.zst", live.name, other.name])
    # loading cleans up as well
    assert subprocess.run([sys.executable, "-c", killed, str(path)]).returncode == 9
    assert codec.read_bytes(path) == b"new"
    assert sorted(os.listdir(tmp_path)) == sorted(["state.zst", live.name, other.name])
