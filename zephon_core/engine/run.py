"""A running pipeline: lane streams, the pump, and the consumer's view of progress.
(``docs/design.md`` §5)

The consumer takes outputs round-robin over the lanes this process owns (see
``distributed/topology.py``); after each one it adopts the state that
travelled with it and trims that lane's ledger. A checkpoint is therefore
defined by delivered outputs, however far the pump ran ahead.

A turn is taken in two steps, :meth:`PipelineRun.prepare` (the next output, not yet
delivered) and :meth:`PipelineRun.commit`, so that ranks can agree on a finite
stream's end before any of them delivers the step (``distributed/finite_end.py``).

A turn whose lane has ended (a finite stream) is skipped with one data-parallel
rank. With several, it is a hole in the step every rank serves together, and the
stream ends there for every rank (see ``finite_end.py`` for why).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from ..checkpoint.data_changes import NO_CHANGES, DataChanges
from ..checkpoint.lane_cache import EncodedState, LaneCache
from ..checkpoint.state import Delivery, LaneDelta, LaneState, PipelineState
from ..distributed.topology import Topology, rank_lanes, validate, worker_lanes
from ..errors import LifecycleError
from ..sources.repetition import has_deferred, take_deferred
from ..tracking.ledger import LaneLedger
from .compile import Plan
from .consumer import state_at
from .lane_stream import END_OF_LANE, LaneStream, Output, start_state
from .mixture_report import mixture_report
from .processes import StagePool, can_start_processes
from .pump import Pump
from .stats import SHIP_EVERY, OpStats, WorkerStats, sum_worker_stats


class Skip:
    """A turn that produced no output (its lane has ended); crosses process boundaries."""

    def __reduce__(self) -> tuple:
        return (Skip, ())


SKIP = Skip()

log = logging.getLogger(__name__)


class PipelineRun:
    """Serves this process's lanes; ``turn`` counts the outputs (and exhausted-lane skips)."""

    def __init__(
        self,
        plan: Plan,
        restored: PipelineState | None,
        topology: Topology,
        emit_skips: bool = False,
        compact_batches: bool = False,
        changes: DataChanges = NO_CHANGES,
    ):
        self.plan = plan
        self.topology = topology
        #: skipped positions (applied by the consumer) and excluded rows (by the lanes),
        #: recorded in every snapshot (``checkpoint/data_changes.py``)
        self.changes = changes
        excluded = changes.excluded_by_component(plan.source.component_names)
        validate(plan.num_lanes, topology.dp_size, topology.num_workers)
        self.start = restored.position if restored is not None else 0
        self.order = lane_order(plan, self.start, topology)
        self.turn = 0
        self.ended = False  # a hole ended this rank's stream (several dp ranks)
        self.procs = None
        if any(st.runner == "processes" for st in plan.stages):
            if can_start_processes():
                self.procs = StagePool(plan)
            else:  # same stream either way; DataLoader workers already run in parallel
                log.warning(
                    "runner='processes' stages run on threads inside a DataLoader "
                    "worker (daemonic processes cannot start worker processes)"
                )
        threaded = ("threads",) if self.procs is not None else ("threads", "processes")
        cap = max((st.cap for st in plan.stages if st.runner in threaded), default=0)
        self.pool = ThreadPoolExecutor(cap, thread_name_prefix="zephon-stage") if cap else None
        self.op_stats = [OpStats() for _ in plan.ops]  # shared by this run's lanes
        self.streams = {
            lane: LaneStream(
                plan,
                lane,
                restored.lanes[lane] if restored else None,
                self.pool,
                self.procs,
                self.op_stats,
                compact_batches,
                excluded,
            )
            for lane in self.order
        }
        self.delivered: dict[int, Delivery] = {lane: s.initial for lane, s in self.streams.items()}
        # each lane's encoded state, kept until the lane changes: adoptions counted here,
        # the producer's changes by its ledger (checkpoint/lane_cache.py)
        self.adopted = dict.fromkeys(self.order, 0)
        self.lane_cache = LaneCache()
        self.shipped: dict[int, int] = {}  # lane -> next chunk id already sent as a delta
        self._deltas = 0  # deltas sent (a worker ships its counters with some of them)
        self.pump: Pump | None = None
        self.closed = False
        self.chunks_replayed = sum(s.chunks_replayed for s in self.streams.values())
        self.started_at: float | None = None
        self.outputs_taken = 0
        self.last_lane: int | None = None
        # A consumer in another process must see every turn, also those of ended lanes,
        # so that the DataLoader's strict worker round-robin stays aligned.
        self.emit_skips = emit_skips

    # -- consuming ----------------------------------------------------------------
    def _take(self, lane: int) -> Output:
        if self.plan.prefetch > 0:
            if self.pump is None:
                self.pump = Pump(
                    self.streams,
                    self.order,
                    self.plan.prefetch,
                    lambda: self.turn,
                    self.plan.stall_timeout_s,
                )
                self.pump.start()
            return self.pump.take(lane)
        return next(self.streams[lane].outputs)

    def __iter__(self) -> PipelineRun:
        return self

    def __next__(self) -> Any:
        step = self.prepare()
        if step is None:
            raise StopIteration
        return self.commit(step)

    def prepare(self) -> tuple[int, Output] | None:
        """The next turn's output, not yet delivered; None once this process's stream ended.

        Turns of ended lanes are consumed on the way (a ``SKIP`` output when a consumer in
        another process must see every turn); with several dp ranks such a turn ends the
        stream instead.
        """
        if self.closed:
            raise LifecycleError("this pipeline run was closed")
        if self.started_at is None:
            self.started_at = time.perf_counter()
        n = len(self.order)
        several = self.topology.dp_size > 1
        while not self.ended and not all(d.exhausted for d in self.delivered.values()):
            lane = self.order[self.turn % n]
            if self.delivered[lane].exhausted:
                if self.emit_skips:
                    return lane, Output(SKIP, None)
                if several:
                    self.ended = True
                    break
                self.turn += 1
                continue
            out = self._take(lane)
            if out.payload is not END_OF_LANE:
                return lane, out
            self._adopt(lane, out)
            if self.emit_skips:
                return lane, Output(SKIP, None)
            if several:
                self.ended = True
                break
            self.turn += 1
        return None

    def commit(self, step: tuple[int, Output], served: bool = True) -> Any:
        """Deliver a prepared turn: adopt its lane state, and return its payload
        (``served=False``: a skipped position, adopted but handed to no one)."""
        lane, out = step
        self._adopt(lane, out)
        self.turn += 1
        self.last_lane = lane
        if out.payload is not SKIP and served:
            self.outputs_taken += 1
        return out.payload

    def _adopt(self, lane: int, out: Output) -> None:
        self.adopted[lane] += 1
        if out.state is not None:
            self.delivered[lane] = out.state
            self.streams[lane].ledger.trim(out.state.floor)
        elif out.payload is END_OF_LANE:
            self.delivered[lane] = self.delivered[lane]._replace(exhausted=True)

    # -- checkpoint -----------------------------------------------------------------
    def lane_state(self, lane: int) -> LaneState:
        return self.streams[lane].ledger.snapshot(self.delivered[lane])

    def lane_states(self) -> dict[int, LaneState]:
        return {lane: self.lane_state(lane) for lane in self.order}

    def encoded(self) -> EncodedState:
        """:meth:`snapshot`, encoded: only the lanes that changed since the last call are
        encoded again (``checkpoint/lane_cache.py``)."""
        cache, streams, adopted = self.lane_cache, self.streams, self.adopted
        lanes = {}
        for lane in self.order:
            # the version first: a chunk registered meanwhile leaves a stale version
            version = (streams[lane].ledger.version, adopted[lane])
            lanes[lane] = cache.encoded(lane, version, partial(self.lane_state, lane))
        return EncodedState(state_at(self.plan, self.position(), {}, self.changes), lanes)

    def position(self) -> int:
        """Global position reached by every rank (ranks advance in lockstep)."""
        return self.start + self.turn * self.topology.dp_size

    def snapshot(self) -> PipelineState:
        """This process's lanes at the global position it reached."""
        return state_at(self.plan, self.position(), self.lane_states(), self.changes)

    def delta(self, lane: int) -> LaneDelta:
        """What a consumer in another process needs to mirror ``lane`` after its last output."""
        d = self.delivered[lane]
        delta = self.streams[lane].ledger.delta(d, self.shipped.get(lane, d.floor))
        self.shipped[lane] = delta.next_chunk
        self._deltas += 1
        # the first, then every SHIP_EVERY-th, and any with a warning to show
        if self._deltas % SHIP_EVERY == 1 or has_deferred():
            delta = dataclasses.replace(delta, stats=self.worker_stats())
        return delta

    def worker_stats(self) -> WorkerStats:
        b = self.plan.batch_index
        batches = [s.ops[b] for s in self.streams.values()] if b is not None else []
        return WorkerStats(
            worker=self.order[0] if self.order else -1,
            ops=tuple((st.records_in, st.records_out, st.seconds) for st in self.op_stats),
            pad_tokens=sum(op.pad_tokens for op in batches),
            total_tokens=sum(op.total_tokens for op in batches),
            io=self.io_stats(),
            warnings=take_deferred(),
        )

    def io_stats(self) -> dict[str, dict[str, int]]:
        """Reads, cache hits and retries of datasets that count them (this process)."""
        return self.plan.source.io_stats()

    def stats(self) -> dict[str, Any]:
        elapsed = time.perf_counter() - self.started_at if self.started_at else 0.0
        mixture = mixture_report(
            self.plan.source,
            (d.tokens for d in self.delivered.values()),
            (s.source.state_dict() for s in self.streams.values()),
        )
        return {
            "outputs": self.outputs_taken,
            "outputs_per_s": self.outputs_taken / elapsed if elapsed > 0 else 0.0,
            "position": self.position(),
            "lanes": list(self.order),
            "inflight_chunks": {lane: len(s.ledger) for lane, s in self.streams.items()},
            "queue_depths": self.pump.queued() if self.pump else {},
            "chunks_replayed": self.chunks_replayed,
            "mixture": mixture,
            # operators, padding and io: this run's counters, as a worker reports them
            **sum_worker_stats([op.name for op in self.plan.ops], [self.worker_stats()]),
        }

    def close(self, join_timeout: float = 5.0) -> bool:
        """Stop the pump, the stage threads and worker processes, and wait up to
        ``join_timeout`` for the threads to end. Idempotent; every call waits again for
        threads still running (a failed run's threads may have been inside a blocked
        function when it first closed). Returns whether every thread ended."""
        if not self.closed:
            self.closed = True
            if self.pump is not None:
                self.pump.close(0)
            if self.pool is not None:
                self.pool.shutdown(wait=False, cancel_futures=True)
            if self.procs is not None:
                self.procs.close()
        deadline = time.monotonic() + join_timeout
        ended = self.pump is None or self.pump.close(join_timeout)
        # the pool's threads take no new jobs after shutdown(); each ends after its job
        for t in list(getattr(self.pool, "_threads", ())):
            if t is not threading.current_thread():
                t.join(max(0.0, deadline - time.monotonic()))
            ended = ended and not t.is_alive()
        return ended


def lane_order(plan: Plan, start: int, topology: Topology) -> list[int]:
    """The lanes a run from global position ``start`` serves here, in turn order."""
    lanes = rank_lanes(plan.num_lanes, topology.dp_size, topology.dp_rank, start)
    return worker_lanes(lanes, topology.num_workers, topology.worker_id)


def unstarted(
    plan: Plan, restored: PipelineState | None, topology: Topology, changes: DataChanges
) -> PipelineState:
    """What :meth:`PipelineRun.snapshot` of a run of these arguments gives before its first
    output, without building the run (no operators, threads or workers): a fresh handle's
    state, e.g. DCP's load template."""
    start = restored.position if restored is not None else 0
    lanes = {}
    for lane in lane_order(plan, start, topology):
        state = restored.lanes[lane] if restored is not None else None
        source = None if state else plan.source.open_lane(lane, plan.num_lanes, plan.seed)
        state = start_state(plan, lane, state, source)
        lanes[lane] = LaneLedger(state).snapshot(state.progress())
    return state_at(plan, start, lanes, changes)


def initial_state(plan: Plan, lanes: list[int], position: int = 0) -> PipelineState:
    """The state of ``lanes`` before anything was delivered (no run needed)."""
    n_comp = len(plan.source.component_names)
    states = {
        lane: LaneState(
            lane=lane,
            source=plan.source.open_lane(lane, plan.num_lanes, plan.seed).state_dict(),
            tokens=[0] * n_comp,
        )
        for lane in lanes
    }
    return state_at(plan, position, states)
