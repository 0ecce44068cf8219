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
  wait for every ack, delete the acks and every leftover of earlier rounds

``aggregate_timeout_s`` is one budget for the whole round, storage calls included
(object-store calls are cut at the deadline, retries and all). A leader that fails
after announcing -- a missing rank, a bad report, a write that fails or does not finish
-- publishes a failure notice under the merged key instead, so followers fail at once;
on a full disk, where the notice's text does not fit, an empty merged file is the
notice. The merged result stays as the marker that the round closed until the next
round is acknowledged or the pipeline shuts down. A fully acknowledged round also
removes what earlier rounds left behind (a leader killed mid-round leaves its states and
merged marker; a killed writer its temporary file): nobody else is inside a round then.
A leader that cannot even write the announcement leaves it empty, which followers
already waiting take as its failure. Messages: ``round_messages.py``.

At scale (issue 21): the leader's storage calls do not grow with the number of ranks --
it waits for the reports and the acknowledgements with one listing per poll, reads what
arrived together (concurrently on an object store) and deletes in batches; followers poll
with a backoff that thins out as the round lasts (``storage.py``); a follower returns the
merged state as decoded bytes without building lane objects (the leader validated every
lane, and each rank's restore admits the lanes it owns: ``checkpoint/owned_lanes.py``).
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from ..checkpoint import codec
from ..checkpoint.state import FORMAT, PipelineState
from ..errors import CorruptCheckpoint, ZephonError
from .merge import RankReport, check_report, merge_reports
from .round_messages import (
    FAILED,
    empty_announcement,
    follower_timeout,
    is_notice,
    leader_failed,
    missing_ranks,
    storage_failed,
)
from .storage import StorageTimeout, open_storage
from .topology import Topology

log = logging.getLogger(__name__)

NOTICE_GRACE_S = 1.0  # a failure notice may still go out this long after the deadline
# every name the protocol writes (and the temporary names of directory writes)
PROTOCOL_FILE = re.compile(
    r"(\.tmp-[0-9a-f]{32}-)?(announce|\d+-[0-9a-f]{12}\.(merged|state\.\d+|ack\.\d+))"
)


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
        # leader: when it left an empty announcement (a notice, kept like one by close())
        self.empty_announce_at: float | None = None

    @classmethod
    def create(
        cls, topology: Topology, directory: str | None, store, timeout_s: float, num_lanes: int
    ) -> Aggregator:
        return cls(topology, open_storage(directory, store), timeout_s, num_lanes)

    # -- the round -------------------------------------------------------------------
    def round(self, local: PipelineState) -> dict[str, Any]:
        """The merged state of every lane, as a plain dict (``PipelineState.to_dict()``).
        A follower returns the merged state as the leader encoded it, without decoding its
        lanes into objects: the leader validated them, and each rank's restore admits
        (and decodes) the lanes it owns."""
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

    def _lead(self, report: bytes, local: PipelineState, deadline: float) -> dict[str, Any]:
        s, world = self.storage, self.topology.world_size
        # the id starts with the global position so followers join only their own step
        rid = f"{local.position}-{uuid.uuid4().hex[:12]}"
        try:
            s.put("announce", rid.encode(), deadline)
        except OSError as e:
            # No round to fail: an empty announcement (a full disk still takes an empty
            # file) tells the followers already waiting; see _follow
            self._best_effort(s.put, "announce", b"", deadline + NOTICE_GRACE_S)
            self.empty_announce_at = time.monotonic()
            raise self._storage_failed("announce the round", "announce", e) from e
        self.empty_announce_at = None  # replaced
        try:
            with self._io("write its report", f"{rid}.state.0"):
                s.put(f"{rid}.state.0", report, deadline)
            reports = {0: _decode_report(report)}
            check_report(reports[0], self.num_lanes)
            # one listing per poll, the reports that arrived read together; a bad report
            # raises as soon as it is read
            keys = {f"{rid}.state.{rank}": rank for rank in range(1, world)}
            with self._io("read the reports", f"{rid}.state.*"):
                for key, data in s.arrivals(list(keys), deadline):
                    rep = _decode_report(data)
                    check_report(rep, self.num_lanes)
                    reports[keys[key]] = rep
            if len(reports) < world:
                missing = [r for r in range(world) if r not in reports]
                topo, budget = self.topology, self.timeout_s
                why = missing_ranks(rid, missing, reports, self.num_lanes, topo, budget)
                raise AggregationError(why)
            with self._io("close the round", "announce"):
                s.delete("announce", deadline)
            merged = merge_reports([reports[r] for r in sorted(reports)], self.num_lanes)
            result = merged.to_dict()
            with self._io("publish the merged state", f"{rid}.merged"):
                s.put(f"{rid}.merged", codec.encode(result), deadline)
        except BaseException as e:
            self._publish_failure(rid, e, deadline)
            raise
        self.markers.append((rid, None))
        self._best_effort(s.delete, f"{rid}.state.0", deadline)
        acks = {f"{rid}.ack.{r}": r for r in range(1, world)}
        with self._io("read the acknowledgements", f"{rid}.ack.*"):
            for key, _ in s.arrivals(list(acks), deadline):
                del acks[key]
        missing = sorted(acks.values())
        self._cleanup(rid, states=bool(missing), acks=True, deadline=deadline)
        if missing:
            raise AggregationError(
                f"aggregation round {rid}: ranks {missing} did not acknowledge the merged "
                f"state within aggregate_timeout_s={self.timeout_s}; the merged result stays "
                "for them until the next acknowledged round"
            )
        self._sweep(rid, deadline)
        self.markers = [(rid, None)]
        return result

    def _publish_failure(self, rid: str, error: BaseException, deadline: float) -> None:
        """The failure notice goes out before anything else, and the announcement stays, so
        followers -- also late ones -- find it at once; the next round replaces it. When its
        text cannot be written (a full disk), an empty merged file says the same."""
        s = self.storage
        until = max(deadline, time.monotonic()) + NOTICE_GRACE_S
        notice = FAILED + f"{type(error).__name__}: {error}".encode()
        reason: OSError | None = None
        for body in (notice, b""):
            try:
                s.put(f"{rid}.merged", body, until)
                break
            except OSError as e:
                reason = e
        else:
            log.warning(
                "zephon: the failure notice of aggregation round %s could not be written "
                "to %s (%s: %s); the other ranks wait out aggregate_timeout_s",
                rid,
                s.url,
                type(reason).__name__,
                reason,
            )
        self.markers.append((rid, time.monotonic()))
        self._cleanup(rid, states=True, acks=False, deadline=until)

    def _follow(self, report: bytes, position: int, deadline: float) -> dict[str, Any]:
        """Join the round the leader announced.

        The announcement is re-read while waiting, so a new round (a restarted leader)
        supersedes one whose leader died. A round that already concluded when this rank
        arrives counts only if it failed at this rank's own step (a late follower gets the
        notice at once); otherwise it is a leftover of an earlier step and is ignored.
        An announcement that turns empty while this rank waits is a leader that could not
        write the round id (an empty one found on arrival may be a leftover: ignored).
        """
        s, rank = self.storage, self.topology.rank
        rid: str | None = None
        closed = False  # the announcement of our round is gone: the leader had every report
        slow = False  # one of this rank's own storage calls ran into the deadline
        first: bytes | None = None  # the announcement as this rank found it
        reads = 0
        # one backoff for the whole wait: polls thin out as the round lasts (on S3 a
        # thousand followers would otherwise poll one prefix thousands of times a second)
        backoff = s.backoff()
        try:
            while True:
                ann = s.get("announce", deadline)
                first, reads = (ann if reads == 0 else first), reads + 1
                if ann == b"" and first != b"":
                    raise AggregationError(empty_announcement(rank, s.url))
                current = ann.decode() if ann else None
                closed = rid is not None and current is None
                if current is not None and current != rid:
                    concluded = s.get(f"{current}.merged", deadline)
                    if concluded is None:
                        if rid is not None:
                            s.delete(f"{rid}.state.{rank}", deadline)
                        rid = current
                        s.put(f"{rid}.state.{rank}", report, deadline)
                    elif is_notice(concluded) and current.startswith(f"{position}-"):
                        raise self._failed(current, concluded)
                now = time.monotonic()
                if now >= deadline:
                    break
                if rid is None:
                    backoff.sleep(deadline)
                    continue
                # one poll: the announcement (above) and the merged result, then a pause
                data = s.get(f"{rid}.merged", deadline)
                if data is None:
                    backoff.sleep(deadline)
                    continue
                if is_notice(data):
                    newer = s.get("announce", deadline)
                    if (
                        newer is not None
                        and newer.decode() != rid
                        and s.get(f"{newer.decode()}.merged", deadline) is None
                    ):
                        continue  # a restarted leader opened a new round
                    self._best_effort(s.delete, f"{rid}.state.{rank}", deadline)
                    raise self._failed(rid, data)
                merged = _decode_merged(data)
                self._best_effort(s.delete, f"{rid}.state.{rank}", deadline)
                with self._io("acknowledge the merged state", f"{rid}.ack.{rank}"):
                    s.put(f"{rid}.ack.{rank}", b"1", deadline)
                return merged
        except StorageTimeout:
            slow = True  # the deadline passed inside a call: what this rank knows follows
        except OSError as e:
            raise self._storage_failed("take part in the round", "announce", e) from e
        if rid is not None:
            self._best_effort(s.delete, f"{rid}.state.{rank}", deadline + NOTICE_GRACE_S)
        raise AggregationError(
            follower_timeout(
                rank,
                rid,
                closed=closed,
                slow=slow,
                empty=first == b"",
                budget=self.timeout_s,
                where=s.url,
            )
        )

    def _failed(self, rid: str, notice: bytes) -> AggregationError:
        return AggregationError(leader_failed(self.topology.rank, rid, notice))

    @contextlib.contextmanager
    def _io(self, what: str, key: str) -> Iterator[None]:
        """Storage failures inside the block become an AggregationError saying what failed."""
        try:
            yield
        except OSError as e:
            raise self._storage_failed(what, key, e) from e

    def _storage_failed(self, what: str, key: str, e: OSError) -> AggregationError:
        rank, url = self.topology.rank, self.storage.url
        return AggregationError(storage_failed(rank, what, key, e, self.timeout_s, url))

    @staticmethod
    def _best_effort(call: Callable[..., Any], *args: Any) -> None:
        """A clean-up call whose failure must not hide the round's outcome (the next
        acknowledged round sweeps what it leaves)."""
        try:
            call(*args)
        except OSError as e:
            log.debug("zephon: aggregation clean-up %s%s failed: %s", call.__name__, args, e)

    def _cleanup(self, rid: str, *, states: bool, acks: bool, deadline: float) -> None:
        world = range(self.topology.world_size)
        names = [f"{rid}.state.{r}" for r in world] if states else []
        names += [f"{rid}.ack.{r}" for r in world if r] if acks else []
        self._best_effort(self.storage.delete_many, names, deadline)

    def _sweep(self, rid: str, deadline: float) -> None:
        """After a fully acknowledged round every rank is out of it, so every protocol
        file but this round's merged marker is a leftover: of this leader's earlier rounds,
        or of a leader or writer killed mid-round in an earlier job. (A torch Store cannot
        list its keys: there only the markers this leader knows go.)"""
        s = self.storage
        try:
            names = s.keys(deadline)
        except OSError as e:
            log.debug("zephon: listing %s for leftovers failed: %s", s.url, e)
            names = None
        if names is None:
            stale = [f"{old}.merged" for old, _ in self.markers if old != rid]
        else:
            stale = [n for n in names if n != f"{rid}.merged" and PROTOCOL_FILE.fullmatch(n)]
        self._best_effort(s.delete_many, stale, deadline)

    def close(self) -> None:
        """Shutdown: the leader removes the merged markers it left. A failure notice (and an
        empty announcement) stays until its round's budget has passed, so followers still
        waiting get it; the next acknowledged round sweeps it."""
        if self.topology.rank != 0:
            return
        now, keep = time.monotonic(), []
        notice_at = self.empty_announce_at
        if notice_at is not None and now - notice_at >= self.timeout_s:
            self._best_effort(self.storage.delete, "announce", now + self.timeout_s)
            self.empty_announce_at = None
        for rid, failed_at in self.markers:
            if failed_at is not None and now - failed_at < self.timeout_s:
                keep.append((rid, failed_at))
            else:
                self._best_effort(self.storage.delete, f"{rid}.merged", now + self.timeout_s)
        self.markers = keep


def _decode_merged(data: bytes) -> dict[str, Any]:
    """The merged state as the leader encoded it (validated by the leader; each rank's
    restore admits the lanes it owns)."""
    merged = codec.decode(data)
    if merged.get("format") != FORMAT:
        raise CorruptCheckpoint("the merged state of the aggregation round is not a Zephon state")
    return merged


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
