"""The replay filter: drops the prefix the consumer already received (``docs/design.md`` §6).

Compile inserts it immediately before ``batch`` (or at the tail) and names it
after that neighbour (``batch_replay_filter``). Each lane has its own instance, which
keeps its target over flushes (``holds_across_flush``). On a fresh run it passes
everything through. After a restore, it drops records until it sees
the saved cursor -- by *equality*, because a shuffled tail does not arrive in
cursor order -- drops that one too, and forwards everything after it. Every
dropped record becomes a tombstone so its offsets close and its chunks can be
evicted again.

Divergence is detected, never silent: the target was produced by chunks that
were fetched before the checkpoint, so it must reappear before the flush that
ends its epoch (monotone pipelines: before any record of a later chunk). When it
reappears, its values must match too: the state carries the value digest of the
record behind the last delivered output (``digests/value_digest.py``), so data or a
function that changed under an unchanged position is caught as well.

A divergence names where to look: the lane, the chunk and cursor, the documents behind
the record (dataset and row, from the restored inflight chunks) and the operators that
produced it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from ..chunk import WorkChunk
from ..digests.value_digest import value_digest
from ..errors import ReplayDivergence
from ..ops.base import Operator, OpTraits
from ..records import Record, SampleCursor


class ReplayFilter(Operator):
    traits = OpTraits(preserves_cursor_order=True, stateless=False, holds_across_flush=True)

    def __init__(self, name: str, monotone: bool):
        self.name = name
        self.monotone = monotone
        self.target: SampleCursor | None = None
        self.digest: int | None = None
        self.chunks: dict[int, WorkChunk] = {}  # the restored inflight chunks, for messages

    def for_lane(self, lane: int) -> ReplayFilter:
        new = ReplayFilter(self.name, self.monotone)
        new.ctx = dataclasses.replace(self.ctx, lane=lane)
        return new

    def set_target(
        self,
        cursor: SampleCursor | None,
        digest: int | None = None,
        chunks: Iterable[WorkChunk] = (),
    ) -> None:
        """The replay cursor of the lane's last delivered output (None: nothing to drop),
        its value digest, and the inflight chunks replay reads (named in a divergence)."""
        self.target, self.digest = cursor, digest if cursor is not None else None
        self.chunks = {c.chunk_id: c for c in chunks} if cursor is not None else {}

    def process(self, record: Record) -> list[Record]:
        target = self.target
        if target is None:
            return [record]
        if record.cursor == target:
            self.target = None
            want, self.digest = self.digest, None
            if want is not None and value_digest(record.payload) != want:
                docs = [(c.chunk_id, c.offset) for c in record.contributors]
                raise ReplayDivergence(
                    f"replay on lane {self.ctx.lane} reproduced the saved cursor {tuple(target)} "
                    f"(chunk {target.chunk_id}) with other values (digest "
                    f"{value_digest(record.payload):#010x}, {want:#010x} before the "
                    f"checkpoint). The record comes from {self._documents(docs)}, through "
                    f"{self._chain()}. The content fingerprints (sampled rows, function code) "
                    "saw no change, so a row outside the sample was edited, or one of these "
                    "operators is not deterministic. Restore the data and code of the "
                    "checkpointed run, or pass load_state_dict(state, allow_changes="
                    "{'data'} or {'functions'}) to accept the change"
                )
        elif self.monotone and record.cursor.chunk_id > target.chunk_id:
            self._diverged(target, f"a record of later chunk {record.cursor.chunk_id}")
        return [record.to_tombstone()]

    def process_many(self, records: list[Record]) -> list[Record]:
        if self.target is None:
            return records
        return super().process_many(records)

    def check_epoch_end(self, boundary: int) -> None:
        """Called by the runner after the flush that ends the epoch before ``boundary``."""
        target = self.target
        if target is not None and target.chunk_id < boundary:
            self._diverged(target, f"the flush before chunk {boundary}")

    def finish(self) -> list[Record]:
        if self.target is not None:
            self._diverged(self.target, "the end of the stream")
        return []

    def _diverged(self, target: SampleCursor, where: str) -> None:
        raise ReplayDivergence(
            f"replay on lane {self.ctx.lane} reached {where} without reproducing the saved "
            f"cursor {tuple(target)} (chunk {target.chunk_id}, "
            f"{self._documents([(target.chunk_id, target.offset)])}) through "
            f"{self._chain()}; one of these operators is not deterministic or keeps state "
            "outside its per-lane instance (randomness must be keyed by seed, lane and "
            "replayed cursors), or the data or pipeline changed since the checkpoint"
        )

    def _documents(self, where: list[tuple[int, int]]) -> str:
        """'dataset 'prose' row 12 (chunk 3 offset 5), ...' for (chunk, offset) pairs."""
        names = self.ctx.component_names
        out = []
        for chunk_id, offset in dict.fromkeys(where):
            chunk = self.chunks.get(chunk_id)
            if chunk is None or offset >= len(chunk):
                out.append(f"chunk {chunk_id} offset {offset}")
                continue
            d, row = chunk.components[offset], chunk.rows[offset]
            name = names[d] if d < len(names) else str(d)
            out.append(f"dataset {name!r} row {row} (chunk {chunk_id} offset {offset})")
        shown = ", ".join(out[:6]) + (f" and {len(out) - 6} more" if len(out) > 6 else "")
        return shown or "no document"

    def _chain(self) -> str:
        ops = [op.name for op in self.ctx.upstream]
        return "the operators " + " -> ".join(["source", *ops]) if ops else "the source"

    def describe(self) -> dict:
        return {"op": "replay_filter", "name": self.name}
