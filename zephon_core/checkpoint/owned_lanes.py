"""A state admitted by one data-parallel rank of several: its own lanes decoded, the
others kept as read. (``restore.py``'s ``admit_owned``)

At a thousand ranks, decoding and validating every lane on every rank costs each rank
the work of all of them (seconds at ``canonical_replicas=1024``) for lanes it never
serves. A rank therefore decodes and validates only the lanes it owns at the state's
position (``distributed/topology.py``: ``(lane - position) mod dp_size == dp_rank``); the
others pass through as the plain dicts they were, after the progress check that needs
only their ``lane``, ``delivered`` and ``exhausted`` (one global position). Their owners
validate them. ``to_dict()`` still returns every lane, so a checkpoint taken before the
first step is the state that was restored.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..validate import is_int
from .state import PipelineState, plain_copy, written_version


class LaneHead(NamedTuple):
    """What the progress check reads of a lane this rank does not own."""

    lane: int
    delivered: int
    exhausted: bool


@dataclass
class OwnedLanesState(PipelineState):
    """``lanes``: the lanes of ``dp_rank`` of ``dp_size``, decoded and validated;
    ``others``: every other lane's dict as read (not validated here: its owner does)."""

    dp_rank: int = 0
    dp_size: int = 1
    others: list[dict[str, Any]] = field(default_factory=list)
    #: the allow_changes it was admitted with
    allowed: frozenset[str] = frozenset()

    @classmethod
    def of(
        cls,
        state: PipelineState,
        dp_rank: int,
        dp_size: int,
        others: list[dict[str, Any]],
        allowed: frozenset[str],
    ) -> OwnedLanesState:
        """``state`` (its own lanes, admitted) with the other lanes' dicts beside it."""
        fields = {f.name: getattr(state, f.name) for f in dataclasses.fields(PipelineState)}
        return cls(**fields, dp_rank=dp_rank, dp_size=dp_size, others=others, allowed=allowed)

    def owns(self, dp_rank: int, dp_size: int) -> bool:
        return (self.dp_rank, self.dp_size) == (dp_rank, dp_size)

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        lanes = out["lanes"] + [plain_copy(d) for d in self.others]
        out["lanes"] = sorted(lanes, key=lambda d: d["lane"])
        out["version"] = written_version(out)  # the other lanes may hold chunks with drops
        return out

    def without_digests(self) -> OwnedLanesState:
        """Every lane's value digest dropped (a deliberate data/function change)."""
        return dataclasses.replace(
            self,
            lanes={lane: dataclasses.replace(ls, digest=None) for lane, ls in self.lanes.items()},
            others=[{**d, "digest": None} for d in self.others],
        )


def lane_heads(lanes: Any) -> dict[int, LaneHead] | None:
    """Each lane's head, or None when anything is not as a well-formed state has it (the
    full admission then runs and names what is wrong)."""
    if not isinstance(lanes, list):
        return None
    heads: dict[int, LaneHead] = {}
    for d in lanes:
        if not isinstance(d, dict):
            return None
        lane, delivered, exhausted = d.get("lane"), d.get("delivered"), d.get("exhausted")
        if not (is_int(lane) and is_int(delivered) and isinstance(exhausted, bool)):
            return None
        if lane in heads:
            return None
        heads[int(lane)] = LaneHead(int(lane), int(delivered), exhausted)
    return heads
