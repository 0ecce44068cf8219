"""Merging the lane states reported by every rank into one checkpoint.

The leader validates before it merges, and raises rather than guessing:
every report must come from the same pipeline (fingerprint) and the same
global position (ranks checkpointed at the same step), must hold exactly the
lanes its data-parallel rank owns at that position, peers of one DP group
(model-parallel ranks) must report identical lane states, and together the
reports must cover every canonical lane.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..checkpoint.state import LaneState, PipelineState, check_progress
from ..digests.content_diff import content_diff
from ..errors import IncompatibleCheckpoint, TopologyError


@dataclass(frozen=True)
class RankReport:
    rank: int
    dp_rank: int
    dp_size: int
    state: PipelineState


def expected_lanes(num_lanes: int, dp_size: int, dp_rank: int, position: int) -> set[int]:
    """The lanes ``dp_rank`` owns at global position ``position``: ``(lane - position) mod
    D == dp_rank``, i.e. every D-th lane from ``(position + dp_rank) mod D`` (the leader
    checks every report with it: O(C/D) each, not O(C))."""
    return set(range((position + dp_rank) % dp_size, num_lanes, dp_size))


def check_report(report: RankReport, num_lanes: int) -> None:
    """A report must hold exactly its DP rank's lanes (raises on a mapping mismatch)."""
    st = report.state
    want = expected_lanes(num_lanes, report.dp_size, report.dp_rank, st.position)
    got = set(st.lanes)
    if got != want:
        raise TopologyError(
            f"rank {report.rank} (dp_rank {report.dp_rank} of {report.dp_size}) reported lanes "
            f"{sorted(got)} at position {st.position}, but its lane mapping gives "
            f"{sorted(want)}; all ranks must use the same canonical_replicas and dp layout"
        )


def peer_difference(a: LaneState, b: LaneState) -> str | None:
    """How two peers' states of one lane disagree, ignoring how far each pump ran ahead.

    What follows from delivered outputs must be equal; chunks both peers fetched must be
    identical. Chunks, boundaries and source state beyond that only show that one peer's
    pump fetched more, and either state restores the same stream.
    """
    for f in ("floor", "cursor", "delivered", "exhausted", "tokens"):
        if getattr(a, f) != getattr(b, f):
            return f"{f}: {getattr(a, f)!r} vs {getattr(b, f)!r}"
    common = min(a.next_chunk, b.next_chunk)
    if [c for c in a.chunks if c.chunk_id < common] != [c for c in b.chunks if c.chunk_id < common]:
        return "the chunks both fetched differ"
    if [x for x in a.boundaries if x <= common] != [x for x in b.boundaries if x <= common]:
        return "epoch boundaries differ"
    return None


def merge_reports(reports: list[RankReport], num_lanes: int) -> PipelineState:
    if not reports:
        raise IncompatibleCheckpoint("no rank reported a state")
    first = reports[0].state
    for r in reports[1:]:
        if r.state.fingerprint != first.fingerprint:
            raise IncompatibleCheckpoint(
                f"rank {r.rank} runs a differently configured pipeline than rank "
                f"{reports[0].rank} (fingerprints {r.state.fingerprint} vs {first.fingerprint})"
            )
        if r.state.content != first.content:
            differ = [c.text for c in content_diff(first.content or {}, r.state.content or {})]
            raise IncompatibleCheckpoint(
                f"rank {r.rank} runs over other data or functions than rank {reports[0].rank} "
                f"({'; '.join(differ[:4]) or 'their content fingerprints differ'}); every "
                "rank must read the same datasets with the same code"
            )
        if r.state.changes != first.changes:
            raise IncompatibleCheckpoint(
                f"rank {r.rank} follows other skip_batches/exclude than rank {reports[0].rank} "
                f"({r.state.changes.to_state()} vs {first.changes.to_state()}); pass the same "
                "skip_batches and exclude on every rank"
            )
    layouts = {r.rank: r.dp_size for r in reports}
    if len(set(layouts.values())) > 1:
        raise TopologyError(
            "ranks use different data-parallel layouts (dp_size "
            + ", ".join(f"rank {k}: {v}" for k, v in sorted(layouts.items()))
            + "); bind the same dp_size on every rank"
        )
    positions = {r.rank: r.state.position for r in reports}
    if len(set(positions.values())) > 1:
        raise IncompatibleCheckpoint(
            "ranks checkpointed at different steps (global positions "
            + ", ".join(f"rank {k}: {v}" for k, v in sorted(positions.items()))
            + "); call checkpoint() on every rank at the same step"
        )
    lanes: dict[int, LaneState] = {}
    owner: dict[int, int] = {}
    for r in reports:
        check_report(r, num_lanes)
        for lane, ls in r.state.lanes.items():
            if lane not in lanes:
                lanes[lane], owner[lane] = ls, r.rank
                continue
            diff = peer_difference(lanes[lane], ls)
            if diff:
                raise IncompatibleCheckpoint(
                    f"model-parallel peers disagree on lane {lane} ({diff}): rank "
                    f"{owner[lane]} and rank {r.rank} share a data-parallel rank but consumed "
                    "different data; peers must see identical batches (check bind(dp_rank=...))"
                )
            if ls.next_chunk > lanes[lane].next_chunk:
                lanes[lane], owner[lane] = ls, r.rank  # the peer whose pump fetched furthest
    missing = sorted(set(range(num_lanes)) - set(lanes))
    if missing:
        raise IncompatibleCheckpoint(f"no rank reported lanes {missing}")
    merged = PipelineState(
        first.fingerprint, first.config, first.position, lanes, first.content,
        changes=first.changes,
    )  # fmt: skip
    check_progress(merged, num_lanes)
    return merged
