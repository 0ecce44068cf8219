"""Live per-operator counters of a run (informational; updated without locks).

A run holds one :class:`OpStats` per operator of its plan, shared by its lanes;
operators themselves carry no counters. A DataLoader worker ships its counters to the
training process now and then (:class:`WorkerStats` on a ``LaneDelta``, every
``SHIP_EVERY`` batches); the loader's ``stats()`` sums the latest of each worker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


@dataclass
class OpStats:
    records_in: int = 0
    records_out: int = 0
    seconds: float = 0.0

    def add(self, other: OpStats) -> None:
        self.records_in += other.records_in
        self.records_out += other.records_out
        self.seconds += other.seconds

    def as_dict(self) -> dict[str, float]:
        busy = self.seconds
        return {
            "records_in": self.records_in,
            "records_out": self.records_out,
            "busy_s": round(busy, 6),
            "records_per_busy_s": round(self.records_in / busy, 1) if busy > 0 else 0.0,
        }


#: a worker attaches its counters to every this-many-th delta (a few dozen bytes)
SHIP_EVERY = 16


class WorkerStats(NamedTuple):
    """One worker's cumulative counters: per operator (in, out, busy seconds), padding,
    and the reads of datasets that count them (``{dataset: {counter: n}}``)."""

    worker: int  # the worker's first lane: a key unique within a rank
    ops: tuple[tuple[int, int, float], ...]
    pad_tokens: int
    total_tokens: int
    io: dict[str, dict[str, int]] = {}  # shared default, never mutated
    #: repetition warnings this worker deferred: the training process logs them once
    warnings: tuple = ()


def sum_worker_stats(names: list[str], workers: list[WorkerStats]) -> dict:
    """Per-operator counters (``OpStats.as_dict``), padding and io summed over workers."""
    totals = [OpStats() for _ in names]
    pad = slots = 0
    io: dict[str, dict[str, int]] = {}
    for w in workers:
        for name, counters in w.io.items():
            mine = io.setdefault(name, {})
            for k, v in counters.items():
                mine[k] = mine.get(k, 0) + v
        for st, (i, o, sec) in zip(totals, w.ops):
            st.add(OpStats(i, o, sec))
        pad += w.pad_tokens
        slots += w.total_tokens
    return {
        "operators": {n: st.as_dict() for n, st in zip(names, totals)},
        "padding_ratio": pad / slots if slots else 0.0,
        "io": io,
    }
