"""What an aggregation round's errors say: each names what this rank saw and the fix.

A follower cannot see the leader's error, only the coordination storage: its message
says how far the round it joined got (never announced, still open, closed but not
published), so a throttled or full storage is not mistaken for a rank that skips
``checkpoint()``.
"""

from __future__ import annotations

import errno
from typing import Any

from .merge import expected_lanes
from .storage import StorageTimeout
from .topology import Topology

FAILED = b"ZEPHON-ROUND-FAILED\n"


def is_notice(data: bytes) -> bool:
    """A failure notice: its text, or an empty merged file (a full disk took no text)."""
    return not data or data.startswith(FAILED)


def leader_failed(rank: int, rid: str, notice: bytes) -> str:
    if notice:
        why = notice[len(FAILED) :].decode(errors="replace")
    else:
        why = (
            "it could not write why (an empty failure notice: its storage is full or "
            "failing; see rank 0's error)"
        )
    return f"rank {rank}: the leader failed aggregation round {rid}: {why}"


def empty_announcement(rank: int, where: str) -> str:
    return (
        f"rank {rank}: rank 0 could not announce the aggregation round (it left an empty "
        f"announcement: its writes to {where} fail, e.g. on a full disk); see rank 0's error"
    )


def follower_timeout(
    rank: int, rid: str | None, *, closed: bool, slow: bool, empty: bool, budget: float, where: str
) -> str:
    """What a follower knows when the budget ran out: whether a round was announced,
    and whether the leader closed it (it then had every report)."""
    if rid is None:
        msg = (
            f"rank {rank}: the leader (rank 0) did not announce an aggregation round within "
            f"aggregate_timeout_s={budget}: rank 0 is not calling checkpoint() at the same "
            f"step, or its writes to {where} fail or do not finish (storage slow, throttled "
            "or full; see rank 0's error)"
        )
        if empty:
            msg += (
                "; the announcement was empty, as a leader that could not write the round "
                "id leaves it (now or in an earlier round)"
            )
    elif closed:
        msg = (
            f"rank {rank}: rank 0 announced round {rid} and closed it (every rank had "
            f"reported) but published no merged state within aggregate_timeout_s={budget}: "
            f"its writes to {where} fail or do not finish (storage slow or throttled, e.g. "
            "S3 SlowDown, or full), or rank 0 died; see rank 0's error"
        )
    else:
        msg = (
            f"rank {rank}: round {rid}, announced by rank 0, was still open after "
            f"aggregate_timeout_s={budget} (this rank had reported): rank 0 is waiting for "
            "another rank's report (its error names the rank), its storage calls to "
            f"{where} are slow or throttled, or rank 0 died"
        )
    if slow:
        msg += "; this rank's own storage calls ran into the deadline too (slow storage?)"
    return msg


def storage_failed(rank: int, what: str, key: str, e: OSError, budget: float, where: str) -> str:
    if isinstance(e, StorageTimeout):
        fix = (
            f"it did not finish within aggregate_timeout_s={budget}: the storage is slow or "
            "throttling requests (S3 SlowDown?); raise aggregate_timeout_s or use a less "
            "loaded bucket or prefix"
        )
    elif e.errno == errno.ENOSPC:
        fix = "the coordination storage is full: free space there"
    else:
        fix = "every rank must be able to read and write aggregate_dir"
    return f"rank {rank} could not {what} ({key!r} in {where}; {type(e).__name__}: {e}): {fix}"


def missing_ranks(
    rid: str,
    missing: list[int],
    reports: dict[int, Any],
    num_lanes: int,
    topo: Topology,
    budget: float,
) -> str:
    """The leader's timeout: the ranks that never reported and the lanes they own."""
    covered = {lane for r in reports.values() for lane in r.state.lanes}
    lanes = sorted(set(range(num_lanes)) - covered)
    position = next(iter(reports.values())).state.position
    own = {}
    if topo.dp_size == topo.world_size:
        for r in missing:
            own[r] = sorted(expected_lanes(num_lanes, topo.dp_size, r % topo.dp_size, position))
    detail = "".join(f"; rank {r} owns lanes {v}" for r, v in own.items())
    return (
        f"aggregation round {rid} timed out after aggregate_timeout_s={budget}: ranks "
        f"{missing} never reported (lanes not covered: {lanes}{detail}). Every rank must "
        "call checkpoint() at the same step."
    )
