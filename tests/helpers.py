"""Shared builders for tests: small deterministic corpora and reference pipelines."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from zephon_core import Pipeline, StaticMixtureWorkSource
from zephon_core.testing.s3 import s3_server  # noqa: F401

TESTS = Path(__file__).resolve().parent


def worker_env(**extra: str) -> dict[str, str]:
    """The environment of a worker process started with subprocess: it imports the test
    helpers by name, as pytest's ``pythonpath`` setting lets the tests do."""
    dirs = [TESTS, TESTS / "integrations", TESTS / "ops", TESTS / "distributed"]
    path = os.pathsep.join([str(d) for d in dirs] + [os.environ.get("PYTHONPATH", "")])
    return dict(os.environ, PYTHONPATH=path.rstrip(os.pathsep), **extra)


def timeout_scale() -> float:
    """``ZEPHON_TEST_TIMEOUT_SCALE`` (default 1): multiplies every limit in the tests that
    only stops a hang, and the slack allowed past a time budget; raise it on a machine so
    loaded that even those fire."""
    return float(os.environ.get("ZEPHON_TEST_TIMEOUT_SCALE", "1"))


def hang_guard_s(seconds: float) -> float:
    """A limit that stops a hung test, never a measure of speed: generous, and scaled by
    :func:`timeout_scale`. A correct run finishes long before it, however loaded the machine."""
    return seconds * timeout_scale()


def make_docs(n: int, lo: int, hi: int, seed: int, letter: str) -> list[dict]:
    """``n`` documents of random length in [lo, hi) with distinct contents."""
    rng = np.random.default_rng(seed)
    docs = []
    for i, length in enumerate(rng.integers(lo, hi, n)):
        body = f"{letter}{i}:" + "".join(chr(97 + int(x)) for x in rng.integers(0, 26, int(length)))
        docs.append({"text": body, "id": f"{letter}{i}"})
    return docs


PROSE = make_docs(160, 5, 700, 1, "p")
CODE = make_docs(90, 5, 1500, 2, "c")


def byte_tokenize(payload: dict) -> dict:
    """Byte-level tokens (int32) of ``payload["text"]``, keeping the document id if any."""
    ids = np.frombuffer(payload["text"].encode(), dtype=np.uint8).astype(np.int32)
    return {"input_ids": ids, "id": payload["id"]} if "id" in payload else {"input_ids": ids}


def source(
    chunk_size: int = 8,
    seed: int = 7,
    num_epochs: int | None = None,
    weights=(0.7, 0.3),
    unit: str = "documents",
    shuffle_block: int | None = None,
) -> StaticMixtureWorkSource:
    """The test mixture; ``unit="tokens"`` leaves the lengths to the pipeline's estimate;
    ``shuffle_block`` switches to the block shuffle."""
    return StaticMixtureWorkSource(
        {"prose": PROSE, "code": CODE},
        {"prose": weights[0], "code": weights[1]},
        chunk_size=chunk_size,
        seed=seed,
        num_epochs=num_epochs,
        weights_unit=unit,
        shuffle_block=shuffle_block,
        shuffle_window=2,
    )


def reference_pipeline(
    *,
    lanes: int = 4,
    k: int | None = 2,
    chunk_size: int = 8,
    seq_len: int = 128,
    batch_size: int = 4,
    prefetch: int = 3,
    parallelism: int = 2,
    num_epochs: int | None = None,
    attention: str = "position_ids",
    weights=(0.7, 0.3),
    provenance: bool = False,
) -> Pipeline:
    """fetch -> tokenize -> split -> pack -> shuffle -> ensure_mixture -> batch."""
    return (
        Pipeline(
            source(chunk_size, num_epochs=num_epochs, weights=weights),
            canonical_replicas=lanes,
            flush_every_k_chunks=k,
            seed=11,
            prefetch=prefetch,
        )
        .fetch(parallelism=parallelism)
        .map(byte_tokenize, parallelism=parallelism, name="tokenize")
        .split(max_len=seq_len)
        .pack(seq_len=seq_len, bins=4)
        .shuffle(buffer_size=16)
        .ensure_mixture(window=8)
        .batch(batch_size=batch_size, attention=attention, provenance=provenance)
    )


class FailingTokenizer:
    """``byte_tokenize`` that raises on documents whose id starts with ``prefix``
    (picklable, for worker processes)."""

    def __init__(self, prefix: str):
        self.prefix = prefix

    def __call__(self, payload: dict) -> dict:
        if payload["id"].startswith(self.prefix):
            raise ValueError(f"cannot tokenize {payload['id']}")
        return byte_tokenize(payload)


def exit_process(payload: dict) -> dict:
    """Kills the process it runs in (a worker that dies mid-job)."""
    import os

    os._exit(3)


def kill_process(payload: dict) -> dict:
    """SIGKILLs the process it runs in (as the OOM killer would)."""
    import os
    import signal

    os.kill(os.getpid(), signal.SIGKILL)


def drop_some(payload: dict) -> bool:
    """Keeps documents whose token count is not a multiple of 3 (drops about a third)."""
    return len(payload["input_ids"]) % 3 != 0


def returns_unpicklable(payload: dict):
    """A result that cannot travel back from a worker process."""
    import threading

    return threading.Lock()


def batch_digest(out, keys=None) -> str:
    """A short digest of one output (a batch of tensors, or a record of arrays): the
    given keys (default all, sorted), each with its name and shape."""
    import hashlib

    import torch

    h = hashlib.sha256()
    for k in sorted(out) if keys is None else [k for k in keys if out.get(k) is not None]:
        v = out[k]
        h.update(k.encode())
        if isinstance(v, torch.Tensor):
            v = v.detach().cpu().contiguous().numpy()
        if isinstance(v, np.ndarray):
            h.update(str(v.shape).encode())
            h.update(np.ascontiguousarray(v).tobytes())
        else:
            h.update(repr(v).encode())
    return h.hexdigest()[:16]


def finite_pipeline(prefetch: int = 2) -> Pipeline:
    """A finite stream whose lanes end at different outputs (documents differ in length)."""
    return (
        Pipeline(source(4, num_epochs=1), canonical_replicas=4, seed=3, prefetch=prefetch)
        .fetch()
        .map(byte_tokenize, name="tokenize")
        .split(max_len=256)
    )


def small_packed(pipe: Pipeline, shuffle: int | None = None) -> Pipeline:
    """``pipe`` -> fetch -> byte tokens -> split 64 -> [shuffle] -> pack 64 (2 bins) ->
    batches of 2: the small token tail of the source tests."""
    pipe = pipe.fetch().map(byte_tokenize, name="tok").split(max_len=64)
    if shuffle is not None:
        pipe = pipe.shuffle(buffer_size=shuffle)
    return pipe.pack(seq_len=64, bins=2).batch(batch_size=2)


def parquet_pipe(comp, shuffle_block=None, **pipe_kw) -> Pipeline:
    """A small token pipeline over one component (``parquet_component``, ...) as ``docs``."""
    src = StaticMixtureWorkSource({"docs": comp}, chunk_size=8, seed=3, shuffle_block=shuffle_block)
    return small_packed(
        Pipeline(src, canonical_replicas=2, flush_every_k_chunks=2, seed=1, **pipe_kw)
    )
