"""The replay filter: drops the prefix the consumer already received.

Compile inserts it immediately before ``batch`` (or at the tail) and names it
after that neighbour (``batch_replay_filter``). On a fresh run it passes
everything through. After a restore, per lane, it drops records until it sees
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

from ..errors import ReplayDivergence
from ..ops.base import Operator, OpTraits
from ..records import Record, SampleCursor
from .value_digest import value_digest


class ReplayFilter(Operator):
    traits = OpTraits(preserves_cursor_order=True, stateless=False)

    def __init__(self, name: str, monotone: bool):
        self.name = name
        self.monotone = monotone
        self.targets: dict[int, SampleCursor] = {}
        self.digests: dict[int, int] = {}

    def set_target(self, lane_id: int, cursor: SampleCursor | None,
                   digest: int | None = None) -> None:
        self.digests.pop(lane_id, None)
        if cursor is None:
            self.targets.pop(lane_id, None)
            return
        self.targets[lane_id] = cursor
        if digest is not None:
            self.digests[lane_id] = digest

    def process(self, record: Record, lane_id: int) -> list[Record]:
        target = self.targets.get(lane_id)
        if target is None:
            return [record]
        if record.cursor == target:
            del self.targets[lane_id]
            want = self.digests.pop(lane_id, None)
            if want is not None and value_digest(record.payload) != want:
                raise ReplayDivergence(
                    f"replay on lane {lane_id} reproduced the saved cursor {tuple(target)} with "
                    f"other values (digest {value_digest(record.payload):#010x}, "
                    f"{want:#010x} before the checkpoint): the data or a map function changed "
                    "since the checkpoint in a way the content fingerprints did not see (an "
                    "edited row outside the sampled ones?), or an operator is not "
                    "deterministic. Restore the data and code of the checkpointed run, or "
                    "pass load_state_dict(state, allow_changes=...) to accept the change")
        elif self.monotone and record.cursor.chunk_id > target.chunk_id:
            self._diverged(lane_id, target, f"a record of later chunk {record.cursor.chunk_id}")
        return [record.to_tombstone()]

    def process_many(self, records: list[Record], lane_id: int) -> list[Record]:
        if lane_id not in self.targets:
            return records
        return super().process_many(records, lane_id)

    def check_epoch_end(self, lane_id: int, boundary: int) -> None:
        """Called by the runner after the flush that ends the epoch before ``boundary``."""
        target = self.targets.get(lane_id)
        if target is not None and target.chunk_id < boundary:
            self._diverged(lane_id, target, f"the flush before chunk {boundary}")

    def finish(self, lane_id: int) -> list[Record]:
        target = self.targets.get(lane_id)
        if target is not None:
            self._diverged(lane_id, target, "the end of the stream")
        return []

    def _diverged(self, lane_id: int, target: SampleCursor, where: str) -> None:
        raise ReplayDivergence(
            f"replay on lane {lane_id} reached {where} without reproducing the saved cursor "
            f"{tuple(target)}; an operator is not deterministic or does not reset fully on "
            "flush(reset=True) (randomness must be keyed by seed, lane and replayed cursors), "
            "or the data or pipeline changed since the checkpoint")

    def describe(self) -> dict:
        return {"op": "replay_filter", "name": self.name}
