"""fetch: sample pointers -> raw rows, one batched read per dataset per chunk."""

from __future__ import annotations

from ..records import Record
from .base import Operator, OpTraits


class FetchOp(Operator):
    """Replaces each pointer payload ``(component, row)`` by the row it points to.

    Stateless and order-keeping, so with ``parallelism > 1`` it runs on worker
    threads, a chunk's records (a microbatch) at a time.
    """

    traits = OpTraits(preserves_cursor_order=True, stateless=True)

    def __init__(self, parallelism: int = 1, name: str = "fetch"):
        self.parallelism = parallelism
        self.name = name

    def process(self, record: Record, lane_id: int) -> list[Record]:
        return self.process_many([record], lane_id)

    def process_many(self, records: list[Record], lane_id: int) -> list[Record]:
        by_component: dict[int, list[int]] = {}
        for i, r in enumerate(records):
            by_component.setdefault(r.payload[0], []).append(i)
        out: list[Record] = list(records)
        read = self.ctx.source.read
        for component, idxs in by_component.items():
            rows = read(component, [records[i].payload[1] for i in idxs])
            for i, row in zip(idxs, rows):
                out[i] = records[i].with_payload(row)
        return out

    def describe(self) -> dict:
        return {"op": "fetch", "name": self.name}
