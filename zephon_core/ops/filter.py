"""filter: drops records, emitting tombstones so their offsets still close."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..records import Record
from .base import Operator, OpTraits, callable_name


class FilterOp(Operator):
    """Keeps records whose payload satisfies ``predicate``; the others become tombstones."""

    traits = OpTraits(preserves_cursor_order=True, stateless=True)

    def __init__(self, predicate: Callable[[Any], bool], parallelism: int = 1,
                 name: str | None = None, runner: str = "threads"):
        self.predicate = predicate
        self.parallelism = parallelism
        self.runner = runner
        self.name = name or "filter"

    def process(self, record: Record, lane_id: int) -> list[Record]:
        return [record if self.predicate(record.payload) else record.to_tombstone()]

    def process_many(self, records: list[Record], lane_id: int) -> list[Record]:
        pred = self.predicate
        return [r if pred(r.payload) else r.to_tombstone() for r in records]

    def describe(self) -> dict:
        return {"op": "filter", "name": self.name, "fn": callable_name(self.predicate)}
