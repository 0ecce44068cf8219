"""fetch: sample pointers -> raw rows, one batched read per dataset per chunk."""

from __future__ import annotations

from ..errors import ContractViolation, CorruptData, PipelineError, SourceChanged, StorageThrottled
from ..records import Record
from .base import Operator, OpTraits


class FetchOp(Operator):
    """Replaces each pointer payload ``(component, row)`` by the row it points to.

    Stateless and order-keeping, so with ``parallelism > 1`` it runs on worker
    threads, a chunk's records (a microbatch) at a time.
    """

    traits = OpTraits(preserves_cursor_order=True, stateless=True)

    def __init__(self, parallelism: int | str = 1, name: str = "fetch"):
        self.parallelism = parallelism
        self.name = name

    def process(self, record: Record) -> list[Record]:
        return self.process_many([record])

    def process_many(self, records: list[Record]) -> list[Record]:
        by_component: dict[int, list[int]] = {}
        for i, r in enumerate(records):
            by_component.setdefault(r.payload[0], []).append(i)
        out: list[Record] = list(records)
        read = self.ctx.source.read
        for component, idxs in by_component.items():
            wanted = [records[i].payload[1] for i in idxs]
            try:
                rows = read(component, wanted)
            except (SourceChanged, CorruptData, StorageThrottled):
                raise  # already typed, names its file
            except Exception as e:  # noqa: BLE001 - re-raised naming the dataset and row
                raise self._failed(component, [records[i] for i in idxs], e) from e
            if len(rows) != len(wanted):
                raise ContractViolation(
                    f"fetch: dataset {self._name(component)!r} returned {len(rows)} rows for "
                    f"the {len(wanted)} requested ({wanted[:8]}...); a batched read must return "
                    "one row per index, in order"
                )
            for i, row in zip(idxs, rows):
                out[i] = records[i].with_payload(row)
        return out

    def _name(self, component: int) -> str:
        names = self.ctx.component_names
        return names[component] if 0 <= component < len(names) else str(component)

    def _failed(self, component: int, records: list[Record], e: Exception) -> PipelineError:
        """Which row failed: re-read them one by one (reads have no side effects)."""
        culprit = records[0]
        for r in records:
            try:
                self.ctx.source.read(component, [r.payload[1]])
            except Exception:  # noqa: BLE001
                culprit = r
                break
        return PipelineError(
            f"fetch: reading row {culprit.payload[1]} of dataset {self._name(component)!r} "
            f"failed on lane {culprit.cursor.lane} at cursor {tuple(culprit.cursor)}: "
            f"{type(e).__name__}: {e}",
            operator=self.name,
            cursor=culprit.cursor,
        )

    def describe(self) -> dict:
        return {"op": "fetch", "name": self.name}
