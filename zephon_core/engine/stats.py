"""Live per-operator counters of a run (informational; updated without locks).

A run holds one :class:`OpStats` per operator of its plan, shared by its lanes;
operators themselves carry no counters.
"""

from __future__ import annotations

from dataclasses import dataclass


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
