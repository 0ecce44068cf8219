"""The aggregation protocol: every rank's checkpoint() returns the merged state of all lanes.
(``docs/design.md`` §8)

One round, over a shared directory or a torch Store (same protocol):

Leader (global rank 0)                        Followers
  announce round id ("announce")      ->      wait for the announcement, read the id
  write own state ("<id>.state.<rank>")       write own state
  wait until every rank reported (each must hold every lane its DP group owns and
    agree with its lane mapping: mismatches raise at once)
  close the round (delete "announce")
  merge, publish "<id>.merged"                wait for "<id>.merged", read it
  delete own state                            delete own state, write "<id>.ack.<rank>"
  wait for every ack, delete the acks and the previous round's merged result

``aggregate_timeout_s`` is one budget for the whole round. A leader that fails
before publishing publishes a failure notice under the merged key instead, so
followers fail at once. The merged result stays as the marker that the round
closed until the next round is acknowledged or the pipeline shuts down.
"""

from __future__ import annotations

import time
import uuid

from ..checkpoint import codec
from ..checkpoint.state import PipelineState
from ..errors import CorruptCheckpoint, ZephonError
from .merge import RankReport, check_report, expected_lanes, merge_reports
from .storage import MAX_BACKOFF_S, open_storage
from .topology import Topology

FAILED = b"ZEPHON-ROUND-FAILED\n"
ROUND_SLICE_S = 1.0  # a follower re-reads the announcement at least this often


class AggregationError(ZephonError, RuntimeError):
    """An aggregation round failed (timeout, failure notice, or inconsistent reports)."""


class Aggregator:
    def __init__(self, topology: Topology, storage, timeout_s: float, num_lanes: int):
        self.topology = topology
        self.storage = storage
        self.timeout_s = timeout_s
        self.num_lanes = num_lanes
        # leader: rounds whose merged result (or failure notice) is still stored, with the
        # time a failure notice went out (None for a merged result)
        self.markers: list[tuple[str, float | None]] = []

    @classmethod
    def create(
        cls, topology: Topology, directory: str | None, store, timeout_s: float, num_lanes: int
    ) -> Aggregator:
        return cls(topology, open_storage(directory, store), timeout_s, num_lanes)

    # -- the round -------------------------------------------------------------------
    def round(self, local: PipelineState) -> PipelineState:
        deadline = time.monotonic() + self.timeout_s
        report = codec.encode(
            {
                "rank": self.topology.rank,
                "dp_rank": self.topology.dp_rank,
                "dp_size": self.topology.dp_size,
                "state": local.to_dict(),
            }
        )
        if self.topology.rank == 0:
            return self._lead(report, local, deadline)
        return self._follow(report, local.position, deadline)

    def _lead(self, report: bytes, local: PipelineState, deadline: float) -> PipelineState:
        s, world = self.storage, self.topology.world_size
        # the id starts with the global position so followers join only their own step
        rid = f"{local.position}-{uuid.uuid4().hex[:12]}"
        s.put("announce", rid.encode())
        s.put(f"{rid}.state.0", report)
        try:
            reports = {0: _decode_report(report)}
            check_report(reports[0], self.num_lanes)
            for rank in range(1, world):
                data = s.wait(f"{rid}.state.{rank}", deadline)
                if data is None:
                    missing = [r for r in range(world) if r not in reports]
                    raise AggregationError(self._missing_message(rid, missing, reports))
                rep = _decode_report(data)
                check_report(rep, self.num_lanes)
                reports[rank] = rep
            s.delete("announce")  # close the round
            merged = merge_reports([reports[r] for r in sorted(reports)], self.num_lanes)
        except BaseException as e:
            # The notice goes out before anything else, and the announcement stays, so
            # followers -- also late ones -- find it at once; the next round replaces it.
            s.put(f"{rid}.merged", FAILED + f"{type(e).__name__}: {e}".encode())
            self.markers.append((rid, time.monotonic()))
            self._cleanup(rid, states=True, acks=False)
            raise
        s.put(f"{rid}.merged", codec.encode(merged.to_dict()))
        self.markers.append((rid, None))
        s.delete(f"{rid}.state.0")
        missing = [r for r in range(1, world) if s.wait(f"{rid}.ack.{r}", deadline) is None]
        self._cleanup(rid, states=bool(missing), acks=True)
        if missing:
            raise AggregationError(
                f"aggregation round {rid}: ranks {missing} did not acknowledge the merged "
                f"state within aggregate_timeout_s={self.timeout_s}; the merged result stays "
                "for them until the next acknowledged round"
            )
        for old, _ in self.markers[:-1]:  # fully acknowledged: older markers can go
            s.delete(f"{old}.merged")
        self.markers = [(rid, None)]
        return merged

    def _follow(self, report: bytes, position: int, deadline: float) -> PipelineState:
        """Join the round the leader announced.

        The announcement is re-read while waiting, so a new round (a restarted leader)
        supersedes one whose leader died. A round that already concluded when this rank
        arrives counts only if it failed at this rank's own step (a late follower gets the
        notice at once); otherwise it is a leftover of an earlier step and is ignored.
        """
        s, rank = self.storage, self.topology.rank
        rid: str | None = None
        delay = 0.005
        while True:
            ann = s.get("announce")
            current = ann.decode() if ann is not None else None
            if current is not None and current != rid:
                concluded = s.get(f"{current}.merged")
                if concluded is None:
                    if rid is not None:
                        s.delete(f"{rid}.state.{rank}")
                    rid = current
                    s.put(f"{rid}.state.{rank}", report)
                elif concluded.startswith(FAILED) and current.startswith(f"{position}-"):
                    raise self._failed(current, concluded)
            now = time.monotonic()
            if now >= deadline:
                break
            if rid is None:
                time.sleep(min(delay, deadline - now))
                delay = min(delay * 2, MAX_BACKOFF_S)
                continue
            data = s.wait(f"{rid}.merged", min(deadline, now + ROUND_SLICE_S))
            if data is None:
                continue
            if data.startswith(FAILED):
                newer = s.get("announce")
                if (
                    newer is not None
                    and newer.decode() != rid
                    and s.get(f"{newer.decode()}.merged") is None
                ):
                    continue  # a restarted leader opened a new round
                s.delete(f"{rid}.state.{rank}")
                raise self._failed(rid, data)
            merged = PipelineState.from_dict(codec.decode(data))
            s.delete(f"{rid}.state.{rank}")
            s.put(f"{rid}.ack.{rank}", b"1")
            return merged
        if rid is None:
            raise AggregationError(
                f"rank {rank}: the leader (rank 0) did not announce an aggregation round "
                f"within aggregate_timeout_s={self.timeout_s}; is rank 0 calling "
                "checkpoint() at the same step?"
            )
        s.delete(f"{rid}.state.{rank}")
        raise AggregationError(
            f"rank {rank}: no merged state for round {rid} within "
            f"aggregate_timeout_s={self.timeout_s}"
        )

    def _failed(self, rid: str, notice: bytes) -> AggregationError:
        return AggregationError(
            f"rank {self.topology.rank}: the leader failed aggregation "
            f"round {rid}: " + notice[len(FAILED) :].decode(errors="replace")
        )

    # -- helpers --------------------------------------------------------------------
    def _missing_message(self, rid: str, missing: list[int], reports: dict) -> str:
        covered = {lane for r in reports.values() for lane in r.state.lanes}
        lanes = sorted(set(range(self.num_lanes)) - covered)
        position = next(iter(reports.values())).state.position
        own = (
            {
                r: sorted(
                    expected_lanes(
                        self.num_lanes, self.topology.dp_size, r % self.topology.dp_size, position
                    )
                )
                for r in missing
            }
            if self.topology.dp_size == self.topology.world_size
            else {}
        )
        detail = "; ".join(f"rank {r} owns lanes {v}" for r, v in own.items())
        return (
            f"aggregation round {rid} timed out after aggregate_timeout_s={self.timeout_s}: "
            f"ranks {missing} never reported (lanes not covered: {lanes}"
            + (f"; {detail}" if detail else "")
            + "). Every rank must call checkpoint() at "
            "the same step."
        )

    def _cleanup(self, rid: str, *, states: bool, acks: bool) -> None:
        for r in range(self.topology.world_size):
            if states:
                self.storage.delete(f"{rid}.state.{r}")
            if acks and r:
                self.storage.delete(f"{rid}.ack.{r}")

    def close(self) -> None:
        """Shutdown: the leader removes the merged markers it left. A failure notice stays
        until its round's budget has passed, so followers still waiting get it."""
        if self.topology.rank != 0:
            return
        now, keep = time.monotonic(), []
        for rid, failed_at in self.markers:
            if failed_at is not None and now - failed_at < self.timeout_s:
                keep.append((rid, failed_at))
            else:
                self.storage.delete(f"{rid}.merged")
        self.markers = keep


def _decode_report(data: bytes) -> RankReport:
    return report_from_dict(codec.decode(data))


def report_from_dict(d: dict) -> RankReport:
    try:
        return RankReport(
            int(d["rank"]),
            int(d["dp_rank"]),
            int(d["dp_size"]),
            PipelineState.from_dict(d["state"]),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise CorruptCheckpoint(f"aggregation report is corrupted: {e}") from e
