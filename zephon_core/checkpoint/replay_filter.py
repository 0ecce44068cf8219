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
record behind the last delivered output (``value_digest.py``), so data or a
function that changed under an unchanged position is caught as well.
"""

from __future__ import annotations

import dataclasses

from ..errors import ReplayDivergence
from ..ops.base import Operator, OpTraits
from ..records import Record, SampleCursor
from .value_digest import value_digest


class ReplayFilter(Operator):
    traits = OpTraits(preserves_cursor_order=True, stateless=False, holds_across_flush=True)

    def __init__(self, name: str, monotone: bool):
        self.name = name
        self.monotone = monotone
        self.target: SampleCursor | None = None
        self.digest: int | None = None

    def for_lane(self, lane: int) -> ReplayFilter:
        new = ReplayFilter(self.name, self.monotone)
        new.ctx = dataclasses.replace(self.ctx, lane=lane)
        return new

    def set_target(self, cursor: SampleCursor | None, digest: int | None = None) -> None:
        """The replay cursor of the lane's last delivered output (None: nothing to drop)."""
        self.target, self.digest = cursor, digest if cursor is not None else None

    def process(self, record: Record) -> list[Record]:
        target = self.target
        if target is None:
            return [record]
        if record.cursor == target:
            self.target = None
            want, self.digest = self.digest, None
            if want is not None and value_digest(record.payload) != want:
                raise ReplayDivergence(
                    f"replay on lane {self.ctx.lane} reproduced the saved cursor {tuple(target)} "
                    f"with other values (digest {value_digest(record.payload):#010x}, "
                    f"{want:#010x} before the checkpoint): the data or a map function changed "
                    "since the checkpoint in a way the content fingerprints did not see (an "
                    "edited row outside the sampled ones?), or an operator is not "
                    "deterministic. Restore the data and code of the checkpointed run, or "
                    "pass load_state_dict(state, allow_changes=...) to accept the change"
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
            f"cursor {tuple(target)}; an operator is not deterministic or keeps state "
            "outside its per-lane instance (randomness must be keyed by seed, lane and "
            "replayed cursors), or the data or pipeline changed since the checkpoint"
        )

    def describe(self) -> dict:
        return {"op": "replay_filter", "name": self.name}
