"""Shared pieces of the benchmarks: the embedded mixture and the reference pipelines."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

from zephon_core import Pipeline, StaticMixtureWorkSource
from zephon_core.testing import corpora


def mixture_source(chunk_size: int = 64, seed: int = 1234) -> StaticMixtureWorkSource:
    return StaticMixtureWorkSource(
        {"prose": corpora.prose(), "code": corpora.code()},
        {"prose": 0.7, "code": 0.3},
        chunk_size=chunk_size,
        seed=seed,
    )


def bar_pipeline(checkpointing: bool = True, lanes: int = 1, prefetch: int = 3) -> Pipeline:
    """The bar: 0.7/0.3 prose/code -> byte tokens -> split -> shuffle 64 -> pack 512 -> batch 8."""
    return (
        Pipeline(
            mixture_source(),
            canonical_replicas=lanes,
            flush_every_k_chunks=4,
            seed=1234,
            prefetch=prefetch,
            checkpointing=checkpointing,
        )
        .fetch()
        .map(corpora.byte_tokens, name="byte_tokens")
        .split(max_len=512)
        .shuffle(buffer_size=64)
        .pack(seq_len=512, bins=8)
        .batch(batch_size=8)
    )


def reference_pipeline(
    checkpointing: bool = True, lanes: int = 4, prefetch: int = 3, parallelism: int = 2, **kwargs
) -> Pipeline:
    """fetch -> tokenize -> split -> pack -> shuffle -> ensure_mixture -> batch."""
    return (
        Pipeline(
            mixture_source(),
            canonical_replicas=lanes,
            flush_every_k_chunks=4,
            seed=1234,
            prefetch=prefetch,
            checkpointing=checkpointing,
            **kwargs,
        )
        .fetch(parallelism=parallelism)
        .map(corpora.byte_tokens, parallelism=parallelism, name="tokenize")
        .split(max_len=512)
        .pack(seq_len=512, bins=8)
        .shuffle(buffer_size=64)
        .ensure_mixture(window=16)
        .batch(batch_size=8)
    )


def rate(build: Callable[[], Any], n: int, warmup: int) -> float:
    """Items/s of a freshly built iterable over ``n`` items after ``warmup``."""
    obj = build()
    it = iter(obj)
    for _ in itertools.islice(it, warmup):
        pass
    t0 = time.perf_counter()
    for _ in itertools.islice(it, n):
        pass
    per_s = n / (time.perf_counter() - t0)
    if hasattr(obj, "close"):
        obj.close()
    return per_s


def throughput(build: Callable[[], Pipeline], n: int, warmup: int = 50, repeats: int = 3) -> float:
    """Best-of-``repeats`` outputs/s over ``n`` outputs after ``warmup``."""
    return max(rate(build, n, warmup) for _ in range(repeats))
