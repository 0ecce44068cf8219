"""Small helpers shared by the operator unit tests (tests/ops/).

Records are built by hand with proper cursors and contributors, operators are
bound with an explicit OpContext and driven through process/flush/finish.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from zephon_core import Pipeline, StaticMixtureWorkSource
from zephon_core.ops import OpContext, Operator
from zephon_core.records import Contributor, Record, SampleCursor
from zephon_core.testing import take


def toks(n: int, start: int = 0) -> np.ndarray:
    """``n`` distinct int32 tokens starting at ``start``."""
    return np.arange(start, start + n, dtype=np.int32)


def rec(
    chunk: int,
    offset: int,
    tokens: Any = None,
    *,
    child: int = 0,
    last: bool = True,
    comp: int = 0,
    lane: int = 0,
    payload: Any = None,
    n_tokens: int | None = None,
    **extra: Any,
) -> Record:
    """A record of one fragment: cursor (lane, chunk, offset, child), one contributor."""
    if payload is None:
        if isinstance(tokens, int):
            tokens = toks(tokens, 1000 * chunk + 100 * offset + 10 * child)
        payload = {"input_ids": np.asarray(tokens, dtype=np.int32), **extra}
    if n_tokens is None:
        n_tokens = (
            len(payload["input_ids"]) if isinstance(payload, dict) and "input_ids" in payload else 0
        )
    return Record(
        payload,
        SampleCursor(lane, chunk, offset, child),
        [Contributor(chunk, offset, child, last, comp, n_tokens)],
    )


def bind(
    op: Operator,
    *,
    seed: int = 1234,
    names: Sequence[str] = ("prose", "code"),
    weights: Sequence[float] = (0.5, 0.5),
    source: Any = None,
    upstream: tuple = (),
    index: int = 0,
    lane: int = 0,
) -> Operator:
    """The instance of ``op`` that serves ``lane``: the template bound with an explicit
    OpContext, then ``for_lane`` (stateless operators serve every lane themselves)."""
    op.bind(
        OpContext(
            seed=seed,
            index=index,
            component_names=tuple(names),
            weights=tuple(weights),
            source=source,
            upstream=upstream,
        )
    )
    return op if op.traits.stateless else op.for_lane(lane)


def feed(op: Operator, records: Iterable[Record]) -> list[Record]:
    out: list[Record] = []
    for r in records:
        out.extend(op.process(r))
    return out


def pending(op: Operator) -> bool:
    """Whether the instance holds records (flushing a copy of it, which changes nothing)."""
    if op.traits.holds_across_flush:
        return bool(op.held())
    return bool(list(copy.deepcopy(op).flush()))


def cursors(records: Iterable[Record]) -> list[tuple]:
    return [tuple(r.cursor) for r in records]


def run(pipe: Pipeline, n: int) -> list[Any]:
    try:
        return take(pipe, n)
    finally:
        pipe.close()


def run_all(pipe: Pipeline, limit: int = 100_000) -> list[Any]:
    """Every output of a finite pipeline (asserts it ends within ``limit``)."""
    try:
        out = take(pipe, limit + 1)
    finally:
        pipe.close()
    assert len(out) <= limit, "the finite pipeline did not end"
    return out


class CountingDataset:
    """A random-access dataset that records every batched read (thread-safe)."""

    def __init__(self, rows: Sequence[Any]):
        self.rows = list(rows)
        self.calls: list[list[int]] = []
        self.single_reads = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> Any:
        with self._lock:
            self.single_reads += 1
        return self.rows[i]

    def __getitems__(self, idxs: list[int]) -> list[Any]:
        with self._lock:
            self.calls.append(list(idxs))
        return [self.rows[i] for i in idxs]


def token_source(
    n_a: int = 40,
    n_b: int = 30,
    chunk_size: int = 4,
    num_epochs: int | None = None,
    weights: tuple[float, float] = (0.5, 0.5),
    seed: int = 5,
    shuffle: bool = True,
) -> StaticMixtureWorkSource:
    """Two small token datasets: component 0 rows have 5..40 tokens, component 1 20..90."""
    rng = np.random.default_rng(seed)
    a = [
        {"input_ids": toks(int(n), 10_000 + 100 * i), "id": f"a{i}"}
        for i, n in enumerate(rng.integers(5, 40, n_a))
    ]
    b = [
        {"input_ids": toks(int(n), 50_000 + 100 * i), "id": f"b{i}"}
        for i, n in enumerate(rng.integers(20, 90, n_b))
    ]
    return StaticMixtureWorkSource(
        {"a": a, "b": b},
        {"a": weights[0], "b": weights[1]},
        chunk_size=chunk_size,
        seed=seed,
        shuffle=shuffle,
        num_epochs=num_epochs,
    )
