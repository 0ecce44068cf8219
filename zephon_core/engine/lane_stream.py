"""One lane's stream: source -> stages -> outputs, each carrying its lane state.

The engine source stream works in two phases (see the seed page):

1. restored inflight chunks are yielded first, by chunk id, with flush
   sentinels re-injected at the stored boundaries;
2. new chunks come from the restored WorkSource, with a sentinel after every
   ``k``-th chunk of the lane.

Both phases ask one place -- the tracker's boundary list -- whether a sentinel
follows a chunk. A boundary is recorded when the chunk before it is pulled
from the source (atomically with the chunk and the source state), so a
checkpoint always knows about the sentinel that follows its last chunk (the
trailing boundary).

Events flowing between stages are ``(RECS, [Record, ...])``, ``(FLUSH,
boundary)`` and ``(END, None)``.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Executor, Future
from concurrent.futures import TimeoutError as FutureTimeout
from time import perf_counter
from typing import Any, NamedTuple

from ..checkpoint.state import LaneState
from ..checkpoint.value_digest import value_digest
from ..errors import ContractViolation, PipelineError, ZephonError
from ..ops.base import Operator
from ..ops.batch import BatchOp
from ..records import TOMBSTONE, Contributor, Record, SampleCursor
from ..sources.chunk import WorkChunk
from ..tracking.eviction import Delivery, LaneTracker
from ..tracking.ledger import LaneLedger
from .compile import Plan, Stage
from .processes import StagePool
from .watchdog import Activity, stalled

RECS, FLUSH, END = 0, 1, 2

END_OF_LANE: Any = object()  # payload of the last output of a finite lane


class Output(NamedTuple):
    payload: Any
    state: Delivery | None


def pointer_records(chunk: WorkChunk) -> list[Record]:
    lane, cid = chunk.lane, chunk.chunk_id
    return [Record((comp, row), SampleCursor(lane, cid, i, 0),
                   [Contributor(cid, i, 0, True, comp, 0)])
            for i, (comp, row) in enumerate(zip(chunk.components, chunk.rows))]


def _call_failed(op: Operator, lane: int, record: Record | None, e: Exception) -> PipelineError:
    where = f" at cursor {tuple(record.cursor)}" if record is not None else ""
    return PipelineError(f"operator {op.name!r} failed on lane {lane}{where}: "
                         f"{type(e).__name__}: {e}", operator=op.name,
                         cursor=record.cursor if record is not None else None)


def _failing_record(op: Operator, records: list[Record], lane: int) -> Record | None:
    """Which record made a stateless operator fail (re-running it is side-effect free)."""
    if len(records) == 1 or not op.traits.stateless or getattr(op, "batched", False):
        # a stateful operator cannot be re-run to find the culprit
        return records[0] if records else None
    for r in records:
        try:
            op.process(r, lane)
        except Exception:  # noqa: BLE001
            return r
    return None


def run_ops(ops: tuple[Operator, ...], records: list[Record], lane: int,
            tombs: list[Record]) -> list[Record]:
    """Push a microbatch through ``ops`` layer by layer; tombstones skip to ``tombs``.

    Layer-by-layer equals item-by-item because each operator's output depends
    only on the sequence of its own inputs.
    """
    for op in ops:
        if not records:
            return records
        live = [r for r in records if r.payload is not TOMBSTONE]
        if len(live) != len(records):
            tombs.extend(r for r in records if r.payload is TOMBSTONE)
        t0 = perf_counter()
        if op.traits.stateless or type(op).process_many is not Operator.process_many:
            try:
                records = op.process_many(live, lane)
            except ZephonError:  # already typed and located
                raise
            except Exception as e:  # noqa: BLE001 - re-raised with where it came from
                raise _call_failed(op, lane, _failing_record(op, live, lane), e) from e
        else:
            records = []
            r = None
            try:
                for r in live:
                    records.extend(op.process(r, lane))
            except ZephonError:  # already typed and located
                raise
            except Exception as e:  # noqa: BLE001
                raise _call_failed(op, lane, r, e) from e
        st = op.stats
        st.seconds += perf_counter() - t0
        st.records_in += len(live)
        st.records_out += len(records)
    return records


class LaneStream:
    """The producer side of one lane. ``outputs`` is a generator of :class:`Output`."""

    def __init__(self, plan: Plan, lane: int, restored: LaneState | None,
                 pool: Executor | None, procs: StagePool | None = None):
        self.plan = plan
        self.lane = lane
        self.pool = pool
        self.procs = procs  # None: processes stages run on the thread pool
        self.source = plan.source.open_lane(lane, plan.num_lanes, plan.seed)
        n_comp = len(plan.source.component_names)
        if restored is not None:
            self.source.load_state_dict(copy.deepcopy(restored.source))
            self.replay = deque(restored.chunks)
            self.chunks_replayed = len(restored.chunks)
            floor, next_id = restored.floor, restored.next_chunk
            boundaries, cursor = restored.boundaries, restored.cursor
            delivered, exhausted = restored.delivered, restored.exhausted
            tokens = list(restored.tokens) + [0] * (n_comp - len(restored.tokens))
            source_state, digest = copy.deepcopy(restored.source), restored.digest
        else:
            self.replay = deque()
            self.chunks_replayed = 0
            floor = next_id = delivered = 0
            boundaries, cursor, exhausted, tokens = [], None, False, [0] * n_comp
            source_state = self._source_state() if plan.checkpointing else {}
            digest = None
        self.next_id = next_id
        self.tracker = LaneTracker(plan.epoch_based, floor, boundaries, cursor, delivered,
                                   n_comp)
        self.tracker.tokens = tokens
        self.ledger = LaneLedger(lane, list(self.replay), boundaries, source_state, next_id)
        self.initial = Delivery(floor, cursor, delivered, exhausted, tuple(tokens), digest)
        if plan.replay_filter is not None:
            plan.replay_filter.set_target(lane, cursor, digest)
        # without batch the replay filter sits at the tail: an output is the record it
        # will look for, so its digest is taken here (batch records carry their own)
        self._digest_outputs = (plan.replay_filter is not None
                                and plan.ops[-1] is plan.replay_filter)
        self.activity = Activity()
        self.clock = perf_counter()  # when the lane last produced (or was asked for) output
        self.outputs: Iterator[Output] = self._outputs(exhausted)

    def _source_state(self) -> dict:
        return copy.deepcopy(self.source.state_dict())

    # -- phase 1 and phase 2 -------------------------------------------------
    def _chunks(self) -> Iterator[tuple[int, Any]]:
        tracker, checkpointing = self.tracker, self.plan.checkpointing
        while self.replay:
            chunk = self.replay.popleft()
            tracker.register(chunk)  # restored chunks exist only when checkpointing
            yield RECS, pointer_records(chunk)
            if tracker.has_boundary(chunk.chunk_id + 1):
                yield FLUSH, chunk.chunk_id + 1
        k, ledger = self.plan.k, self.ledger
        timeout = self.plan.stall_timeout_s
        self.clock = perf_counter()  # replaying is not stalling
        while True:
            if timeout is not None and perf_counter() - self.clock > timeout:
                raise self._busy_without_output(timeout)
            self.activity.set("the source", None)
            try:
                chunk = self.source.next_chunk()
            except Exception as e:  # noqa: BLE001
                raise PipelineError(f"WorkSource of lane {self.lane} failed at chunk "
                                    f"{self.next_id}: {type(e).__name__}: {e}") from e
            if chunk is None:
                if checkpointing:
                    ledger.mark_exhausted(self._source_state())
                yield END, None
                return
            if chunk.lane != self.lane or chunk.chunk_id != self.next_id or len(chunk) == 0:
                raise ContractViolation(
                    f"WorkSource of lane {self.lane} returned chunk (lane={chunk.lane}, "
                    f"chunk_id={chunk.chunk_id}, {len(chunk)} pointers); expected lane "
                    f"{self.lane}, chunk_id {self.next_id} and at least one pointer")
            self.next_id += 1
            boundary = k > 0 and (chunk.chunk_id + 1) % k == 0
            if checkpointing:
                ledger.register(chunk, self._source_state(), boundary)
                tracker.register(chunk)
            if boundary:
                tracker.add_boundary(chunk.chunk_id + 1)
            yield RECS, pointer_records(chunk)
            if boundary:
                yield FLUSH, chunk.chunk_id + 1

    def _busy_without_output(self, timeout: float) -> PipelineError:
        counts = ", ".join(f"{op.name}: {op.stats.records_in} in / {op.stats.records_out} out"
                           for op in self.plan.ops)
        return stalled(f"lane {self.lane} pulled chunks up to {self.next_id - 1} without "
                       f"producing an output (an operator drops or holds every record? "
                       f"records per operator, all lanes: {counts})", timeout)

    # -- stages ----------------------------------------------------------------
    def _parallel_stage(self, index: int, stage: Stage, events: Iterator) -> Iterator:
        """Order-preserving parallel map over microbatches, ``queue_size`` ahead."""
        lane, ops, pool, procs = self.lane, stage.ops, self.pool, self.procs
        label = _stage_label(index, stage)
        activity = self.activity

        def job(recs: list[Record]) -> tuple[list[Record], list[Record]]:
            tombs: list[Record] = []
            out = run_ops(ops, recs, lane, tombs)
            return out, tombs

        if stage.runner == "processes" and procs is not None:
            def submit(recs: list[Record]) -> Future:
                return procs.submit(index, lane, recs)

            def result(fut: Future, timeout: float | None) -> tuple[list[Record], list[Record]]:
                return procs.collect(index, fut, timeout)
        else:
            def submit(recs: list[Record]) -> Future:
                return pool.submit(job, recs)

            def result(fut: Future, timeout: float | None) -> tuple[list[Record], list[Record]]:
                return fut.result(timeout)

        pending: deque = deque()
        ahead = self.plan.queue_size
        timeout = self.plan.stall_timeout_s
        upstream_done = False
        while True:
            while not upstream_done and len(pending) < ahead:
                ev = next(events, None)
                if ev is None:
                    upstream_done = True
                elif ev[0] == RECS:
                    first = ev[1][0].cursor if ev[1] else None
                    pending.append((RECS, (submit(ev[1]), first)))
                else:
                    pending.append(ev)
            if not pending:
                return
            kind, x = pending.popleft()
            if kind == RECS:
                fut, first = x
                activity.set(label, first)  # what the lane waits for: the oldest microbatch
                try:
                    out, tombs = result(fut, timeout)
                except FutureTimeout:
                    at = f" on the microbatch starting at cursor {tuple(first)}" if first else ""
                    raise stalled(f"lane {lane}: {label} did not return{at} within the "
                                  "timeout (a function blocked in I/O or a lock?)", timeout,
                                  operator=stage.ops[0].name, cursor=first) from None
                yield RECS, out + tombs if tombs else out
            else:
                yield kind, x

    def _inline_stage(self, index: int, stage: Stage, events: Iterator) -> Iterator:
        lane, ops = self.lane, stage.ops
        rf = self.plan.replay_filter
        label = _stage_label(index, stage)
        activity = self.activity
        for kind, x in events:
            tombs: list[Record] = []
            if kind == RECS:
                activity.set(label, x[0].cursor if x else None)
                out = run_ops(ops, x, lane, tombs)
            else:
                out = self._drain(ops, tombs, final=(kind == END))
                if kind == FLUSH and rf is not None and rf in ops:
                    rf.check_epoch_end(lane, x)
            if out or tombs:
                yield RECS, out + tombs if tombs else out
            if kind != RECS:
                yield kind, x

    def _drain(self, ops: tuple[Operator, ...], tombs: list[Record], final: bool) -> list[Record]:
        """Flush (or finish) each operator in order, feeding what it emits downstream."""
        lane = self.lane
        carry: list[Record] = []
        for op in ops:
            carry = run_ops((op,), carry, lane, tombs)
            try:
                emitted = list(op.finish(lane) if final else op.flush(True, lane))
            except ZephonError:  # already typed and located
                raise
            except Exception as e:  # noqa: BLE001
                raise _call_failed(op, lane, None, e) from e
            op.stats.records_out += len(emitted)
            carry.extend(emitted)
            if not final and op.has_pending(lane) and not isinstance(op, BatchOp):
                raise ContractViolation(
                    f"operator {op.name!r} still holds data for lane {lane} after "
                    "flush(reset=True); flush must emit everything and reset the lane "
                    "(only batch(drop_last=True) may stall)")
        return carry

    # -- outputs ---------------------------------------------------------------
    def _outputs(self, exhausted: bool) -> Iterator[Output]:
        if exhausted:
            yield Output(END_OF_LANE, self.initial)
            return
        events: Iterator = self._chunks()
        for i, stage in enumerate(self.plan.stages):
            events = (self._parallel_stage(i, stage, events) if stage.parallel
                      else self._inline_stage(i, stage, events))
        tracker, track = self.tracker, self.plan.checkpointing
        digest_outputs = self._digest_outputs
        for kind, x in events:
            if kind == RECS:
                for r in x:
                    if r.payload is TOMBSTONE:
                        if track:
                            tracker.close(r.contributors)
                    elif track:
                        digest = value_digest(r.payload) if digest_outputs else r.digest
                        yield Output(r.payload, tracker.deliver(r.contributors, r.cursor,
                                                                digest))
                        self.clock = perf_counter()
                    else:
                        yield Output(r.payload, None)
                        self.clock = perf_counter()
            elif kind == END:
                yield Output(END_OF_LANE, tracker.finish(self.next_id) if track else None)
                return


def _stage_label(index: int, stage: Stage) -> str:
    return (f"stage[{index}] ({', '.join(op.name for op in stage.ops)}, "
            f"runner={stage.runner})")
