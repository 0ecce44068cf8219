"""assert_resume_equivalent: the determinism test every operator and runner must pass.

It runs a pipeline uninterrupted, then, for every cut point, runs a fresh
pipeline to the cut, checkpoints it (through the on-disk byte format), closes
it, deliberately re-seeds the global RNGs of Python, NumPy and torch to other
values, restores into another freshly built pipeline and checks that the
rest of the stream is identical, tensor for tensor.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..checkpoint import codec
from .ranks import SimulatedRanks


@dataclass
class ResumeReport:
    total: int
    cuts: list[int] = field(default_factory=list)
    chunks_replayed: list[int] = field(default_factory=list)
    checkpoint_bytes: list[int] = field(default_factory=list)


class ResumeMismatch(AssertionError):
    """The resumed stream differs from the uninterrupted one."""


def take(pipe: Iterable[Any], n: int) -> list[Any]:
    return list(itertools.islice(iter(pipe), n))


def first_difference(a: Any, b: Any, path: str = "") -> str | None:
    """Where two outputs differ (None if identical), comparing tensors exactly."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return f"{path}: {type(a).__name__} vs {type(b).__name__}"
        if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a, b):
            return (
                f"{path}: tensors differ ({a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)})"
            )
        return None
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
            return f"{path}: {type(a).__name__} vs {type(b).__name__}"
        if a.dtype != b.dtype or a.shape != b.shape or not np.array_equal(a, b):
            return f"{path}: arrays differ"
        return None
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return f"{path}: keys {sorted(map(str, a))} vs {sorted(map(str, b))}"
        for k in a:
            d = first_difference(a[k], b[k], f"{path}[{k!r}]")
            if d:
                return d
        return None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if type(a) is not type(b) or len(a) != len(b):
            return f"{path}: {type(a).__name__}[{len(a)}] vs {type(b).__name__}[{len(b)}]"
        for i, (x, y) in enumerate(zip(a, b)):
            d = first_difference(x, y, f"{path}[{i}]")
            if d:
                return d
        return None
    return None if a == b else f"{path}: {a!r} vs {b!r}"


def assert_streams_equal(expected: Sequence[Any], got: Sequence[Any], what: str = "") -> None:
    if len(expected) != len(got):
        raise ResumeMismatch(f"{what}: expected {len(expected)} outputs, got {len(got)}")
    for i, (a, b) in enumerate(zip(expected, got)):
        d = first_difference(a, b)
        if d is not None:
            raise ResumeMismatch(f"{what}: output {i} differs at {d}")


def reseed_globals(salt: int) -> None:
    """Scramble every global RNG so nothing can lean on global state."""
    random.seed(0xBAD5EED ^ salt)
    np.random.seed((0xBAD5EED ^ salt) & 0xFFFFFFFF)
    torch.manual_seed(0xBAD5EED ^ salt)


def assert_resume_equivalent(
    build_fn: Callable[[], Any],
    cut_points: Iterable[int],
    total: int | None = None,
    *,
    num_workers: int = 0,
    dp_size: int = 1,
    resume_num_workers: int | None = None,
    resume_dp_size: int | None = None,
    through_bytes: bool = True,
) -> ResumeReport:
    """Check that cutting at each of ``cut_points`` and resuming changes nothing.

    Besides the streams, it checks that a restored pipeline reports exactly the
    state it was given (restore is lossless) before it produces anything.

    Example::

        assert_resume_equivalent(lambda: build_pipeline(), cut_points=[0, 1, 17, 90])

    Args:
        build_fn: builds a fresh, identically configured Pipeline.
        cut_points: numbers of outputs consumed before each checkpoint.
        total: outputs to compare per run (default: the largest cut + 50; fewer if
            the stream ends first).
        num_workers: DataLoader workers per rank (real worker processes).
        dp_size: data-parallel ranks, simulated in this process (``bind`` +
            ``local_checkpoint`` + ``merge_local_checkpoints``); cut points must then
            be multiples of ``dp_size``.
        resume_num_workers: the DataLoader workers to resume with (default: the same).
        resume_dp_size: the ranks to resume with (default: the same).
        through_bytes: round-trip each state through the msgpack+zstd codec.

    The reference is always a plain single-process run, so every topology must
    produce the same global stream. (With several ranks a finite stream ends at the first
    step in which a rank has no output, so there the stream must be a prefix of it.)

    Returns:
        A :class:`ResumeReport` with chunks replayed and checkpoint sizes per cut.
    """
    cut_points = list(cut_points)
    if total is None:
        total = max(cut_points, default=0) + 50
    ref_pipe = build_fn()
    try:
        reference = take(ref_pipe, total)
    finally:
        ref_pipe.close()
    rd = dp_size if resume_dp_size is None else resume_dp_size
    rw = num_workers if resume_num_workers is None else resume_num_workers
    single = reference
    if dp_size > 1:  # the ranks' own uninterrupted stream: a prefix of the single one
        whole = SimulatedRanks(build_fn, dp_size, num_workers)
        try:
            reference = whole.take(total)
        finally:
            whole.close()
        assert_streams_equal(
            single[: len(reference)],
            reference,
            f"{dp_size} ranks, uninterrupted (a prefix of one process)",
        )
    report = ResumeReport(total=len(reference))
    for cut in cut_points:
        cut = min(cut, len(reference))
        if cut % dp_size or cut % rd:
            raise ValueError(
                f"cut point {cut} is not a multiple of dp_size {dp_size}/{rd}: "
                "ranks checkpoint at the same step"
            )
        first = SimulatedRanks(build_fn, dp_size, num_workers)
        try:
            head = first.take(cut)
            state = first.checkpoint()
        finally:
            first.close()
        assert_streams_equal(reference[:cut], head, f"cut {cut}: prefix before checkpoint")
        data = codec.encode(state)
        if through_bytes:
            state = codec.decode(data)
        reseed_globals(cut)
        second = SimulatedRanks(build_fn, rd, rw, state)
        try:
            again = second.checkpoint()
            d = first_difference(state, again)
            if d is not None:
                raise ResumeMismatch(
                    f"cut {cut}: restored pipeline reports a different state than it was given: {d}"
                )
            tail = second.take(len(reference) - cut)
            replayed = second.chunks_replayed
        finally:
            second.close()
        if rd == dp_size or rd == 1:
            expected = reference[cut:] if rd == dp_size else single[cut : len(reference)]
            assert_streams_equal(expected, tail, f"cut {cut}: resumed stream")
        else:  # other ranks may end a finite stream elsewhere, but never differently
            assert_streams_equal(
                single[cut : cut + len(tail)],
                tail,
                f"cut {cut}: resumed stream (dp {dp_size} -> {rd})",
            )
        report.cuts.append(cut)
        report.chunks_replayed.append(replayed)
        report.checkpoint_bytes.append(len(data))
    return report
