"""One lane's stream: source -> stages -> outputs, each carrying its lane state.

The engine source stream works in two phases (``docs/design.md`` §6):

1. restored inflight chunks are yielded first, by chunk id, with flush
   sentinels re-injected at the stored boundaries;
2. new chunks come from the restored WorkSource, with a sentinel after every
   ``k``-th chunk of the lane.

Both phases ask one place -- the tracker's boundary list -- whether a sentinel
follows a chunk. A boundary is recorded when the chunk before it is pulled
from the source (atomically with the chunk and the source state), so a
checkpoint always knows about the sentinel that follows its last chunk (the
trailing boundary).

The lane owns one instance of every stateful operator (``Operator.for_lane``); a
flush drains them in order and replaces each with a fresh instance, except those
whose traits say ``holds_across_flush``. After the flush every offset of the epoch
must have been delivered or tombstoned, or be held by such an operator: anything
else was lost by a flush that did not emit everything (``ContractViolation``).
What such an operator holds is noted when it is flushed, not when the output side
sees the flush: a parallel stage downstream pulls records of the next segment
through it before that (``queue_size`` ahead), so by then it may hold other records,
and the ones it held may be on their way (``_held_at``).

Events flowing between stages are ``(RECS, [Record, ...])``, ``(FLUSH,
boundary)`` and ``(END, None)``.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Executor, Future
from concurrent.futures import TimeoutError as FutureTimeout
from time import perf_counter
from typing import Any, NamedTuple

from ..checkpoint.remix import prior_targets
from ..checkpoint.state import Delivery, LaneState, plain_copy
from ..chunk import WorkChunk
from ..digests.value_digest import value_digest
from ..errors import ContractViolation, PipelineError, ZephonError
from ..ops.base import Operator
from ..ops.batch_provenance import OriginTable
from ..records import TOMBSTONE, Contributor, Record, SampleCursor
from ..tracking.eviction import LaneTracker
from ..tracking.ledger import LaneLedger
from .compile import Plan, Stage
from .processes import StagePool
from .run_ops import call_failed, run_ops
from .stats import OpStats
from .watchdog import Activity, stalled

RECS, FLUSH, END = 0, 1, 2

END_OF_LANE: Any = object()  # payload of the last output of a finite lane


class Output(NamedTuple):
    payload: Any
    state: Delivery | None


def pointer_records(chunk: WorkChunk) -> list[Record]:
    lane, cid, new = chunk.lane, chunk.chunk_id, tuple.__new__
    # tuple.__new__ builds the same named tuples without their Python-level constructor
    recs = [
        Record(
            (comp, row),
            new(SampleCursor, (lane, cid, i, 0)),
            [new(Contributor, (cid, i, 0, True, comp, 0))],
        )
        for i, (comp, row) in enumerate(zip(chunk.components, chunk.rows))
    ]
    for i in chunk.dropped:  # excluded when the chunk was read: closed, never fetched
        recs[i] = recs[i].to_tombstone()
    return recs


def with_exclusions(chunk: WorkChunk, excluded: dict[int, frozenset[int]]) -> WorkChunk:
    """``chunk`` with the offsets of ``excluded`` rows (per component) marked dropped
    (``checkpoint/data_changes.py``): the mark is stored with the chunk, so a replay of it
    drops the same rows whatever the exclusion is by then."""
    dropped = tuple(
        i
        for i, (comp, row) in enumerate(zip(chunk.components, chunk.rows))
        if row in excluded.get(comp, ())
    )
    return dataclasses.replace(chunk, dropped=dropped) if dropped else chunk


def start_state(plan: Plan, lane: int, restored: LaneState | None, source: Any) -> LaneState:
    """A lane's state before its first output: ``restored`` (with token counters for the
    components added since), or a fresh one at ``source`` (the lane's opened WorkSource)."""
    n_comp = len(plan.source.component_names)
    if restored is not None:
        state = restored.copy()
        state.tokens += [0] * (n_comp - len(state.tokens))
        return state
    start = plain_copy(source.state_dict()) if plan.checkpointing else {}
    return LaneState(lane=lane, source=start, tokens=[0] * n_comp)


class LaneStream:
    """The producer side of one lane. ``outputs`` is a generator of :class:`Output`."""

    def __init__(
        self,
        plan: Plan,
        lane: int,
        restored: LaneState | None,
        pool: Executor | None,
        procs: StagePool | None,
        stats: list[OpStats],
        compact_outputs: bool = False,
        excluded: dict[int, frozenset[int]] | None = None,
    ):
        self.plan = plan
        self.lane = lane
        #: rows (per component) that chunks read from the source drop (``exclude=``)
        self.excluded = excluded or {}
        #: a trailing batch emits TokenBatch (built by a consumer in another process)
        self.compact_outputs = compact_outputs
        self.pool = pool
        self.procs = procs  # None: processes stages run on the thread pool
        self.stats = stats  # the run's counters, one per operator of the plan
        self.source = plan.source.open_lane(lane, plan.num_lanes, plan.seed)
        if restored is not None:
            self.source.load_state_dict(plain_copy(restored.source))
        state = start_state(plan, lane, restored, self.source)
        #: with ``batch(provenance=True)``: the dataset row and epoch of each pointer of the
        #: chunks whose records may still reach batch (``ops/batch_provenance.py``)
        self.origins = _origin_table(plan, self.source, state.chunks)
        self.replay = deque(state.chunks)
        self.chunks_replayed = len(state.chunks)
        self.next_id = state.next_chunk
        self.tracker = LaneTracker(plan.epoch_based, state)
        self.ledger = LaneLedger(state)
        self.initial = state.progress()
        # the lane's operators: its own instance of each stateful one, templates otherwise
        self.prior = state.prior
        self.ops = [
            op if op.traits.stateless else self._instance(i, state.floor)
            for i, op in enumerate(plan.ops)
        ]
        if plan.replay_index is not None:
            self.ops[plan.replay_index].set_target(state.cursor, state.digest, state.chunks)
        # without batch the replay filter sits at the tail: an output is the record it
        # will look for, so its digest is taken here (batch records carry their own)
        self._digest_outputs = (
            plan.replay_index is not None and plan.replay_index == len(plan.ops) - 1
        )
        #: boundary -> (chunk, offset) held over that flush by ``holds_across_flush``
        #: operators, noted as each stage drains and read when the output side sees the flush
        self._held_at: dict[int, set[tuple[int, int]]] = {}
        self.activity = Activity()
        self.clock = perf_counter()  # when the lane last produced (or was asked for) output
        self.outputs: Iterator[Output] = self._outputs(state.exhausted)

    def _instance(self, i: int, segment_start: int) -> Operator:
        """The lane's instance of operator ``i`` for the flush segment starting at chunk
        ``segment_start`` (after a re-mix, segments that started before it keep the
        old mixture targets, see ``checkpoint/remix.py``)."""
        op = self.plan.ops[i].for_lane(self.lane)
        if self.compact_outputs and i == self.plan.batch_index == len(self.plan.ops) - 1:
            op.compact = True  # the consumer builds the batch's tensors (token_batch.py)
        if i == self.plan.batch_index:
            op.origins = self.origins
        prior = self.prior
        if (
            prior is not None
            and segment_start < prior.chunk
            and (op.mixture_keys or op.reads_source_weights)
        ):
            targets = prior_targets(prior, op)
            if targets is not None:
                op.set_targets(targets)
        return op

    def _source_state(self) -> dict:
        return plain_copy(self.source.state_dict())

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
                raise PipelineError(
                    f"WorkSource of lane {self.lane} failed at chunk "
                    f"{self.next_id}: {type(e).__name__}: {e}"
                ) from e
            if chunk is None:
                if checkpointing:
                    ledger.mark_exhausted(self._source_state())
                yield END, None
                return
            if chunk.lane != self.lane or chunk.chunk_id != self.next_id or len(chunk) == 0:
                raise ContractViolation(
                    f"WorkSource of lane {self.lane} returned chunk (lane={chunk.lane}, "
                    f"chunk_id={chunk.chunk_id}, {len(chunk)} pointers); expected lane "
                    f"{self.lane}, chunk_id {self.next_id} and at least one pointer"
                )
            self.next_id += 1
            if self.excluded:
                chunk = with_exclusions(chunk, self.excluded)
            if self.origins is not None:
                epochs = self.plan.source.pointer_epochs(self.source, [chunk])
                self.origins.add(chunk, None if epochs is None else epochs[0])
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
        counts = ", ".join(
            f"{op.name}: {st.records_in} in / {st.records_out} out"
            for op, st in zip(self.plan.ops, self.stats)
        )
        return stalled(
            f"lane {self.lane} pulled chunks up to {self.next_id - 1} without "
            f"producing an output (an operator drops or holds every record? "
            f"records per operator, all lanes: {counts})",
            timeout,
        )

    # -- stages ----------------------------------------------------------------
    def _parallel_stage(self, index: int, stage: Stage, events: Iterator) -> Iterator:
        """Order-preserving parallel map over microbatches, ``queue_size`` ahead.
        Its operators are stateless: the plan's templates serve every lane."""
        lane, ops, pool, procs = self.lane, stage.ops, self.pool, self.procs
        stats = [self.stats[i] for i in stage.indices]
        label = _stage_label(index, stage)
        activity = self.activity

        def job(recs: list[Record]) -> tuple[list[Record], list[Record]]:
            tombs: list[Record] = []
            out = run_ops(ops, recs, lane, tombs, stats)
            return out, tombs

        if stage.runner == "processes" and procs is not None:

            def submit(recs: list[Record]) -> Future:
                return procs.submit(index, lane, recs)

            def result(fut: Future, timeout: float | None) -> tuple[list[Record], list[Record]]:
                return procs.collect(index, fut, stats, timeout)
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
                    raise stalled(
                        f"lane {lane}: {label} did not return{at} within the "
                        "timeout (a function blocked in I/O or a lock?)",
                        timeout,
                        operator=stage.ops[0].name,
                        cursor=first,
                    ) from None
                yield RECS, out + tombs if tombs else out
            else:
                yield kind, x

    def _inline_stage(self, index: int, stage: Stage, events: Iterator) -> Iterator:
        lane, indices, lane_ops = self.lane, stage.indices, self.ops
        stats = [self.stats[i] for i in indices]
        rf = self.plan.replay_index
        label = _stage_label(index, stage)
        activity = self.activity
        for kind, x in events:
            tombs: list[Record] = []
            if kind == RECS:
                activity.set(label, x[0].cursor if x else None)
                out = run_ops([lane_ops[i] for i in indices], x, lane, tombs, stats)
            else:
                out = self._drain(indices, tombs, final=(kind == END), boundary=x)
                if kind == FLUSH and rf in indices:
                    lane_ops[rf].check_epoch_end(x)
            if out or tombs:
                yield RECS, out + tombs if tombs else out
            if kind != RECS:
                yield kind, x

    def _drain(
        self, indices: tuple[int, ...], tombs: list[Record], final: bool, boundary: Any
    ) -> list[Record]:
        """Flush (or finish) each operator in order, feeding what it emits downstream; a
        flushed operator's instance is replaced by a fresh one for the segment starting
        at ``boundary``."""
        lane, lane_ops = self.lane, self.ops
        carry: list[Record] = []
        for i in indices:
            op = lane_ops[i]
            carry = run_ops((op,), carry, lane, tombs, (self.stats[i],))
            try:
                emitted = list(op.finish() if final else op.flush())
            except ZephonError:  # already typed and located
                raise
            except Exception as e:  # noqa: BLE001
                raise call_failed(op, lane, None, e) from e
            self.stats[i].records_out += len(emitted)
            carry.extend(emitted)
            if final or op.traits.stateless:
                continue  # nothing to replace (at the end nothing may stay held)
            if op.traits.holds_across_flush:
                if self.plan.epoch_based and self.plan.checkpointing:  # for _check_flushed
                    held = self._held_at.setdefault(boundary, set())
                    held.update((c.chunk_id, c.offset) for r in op.held() for c in r.contributors)
            else:
                lane_ops[i] = self._instance(i, boundary)
        return carry

    def _check_flushed(self, boundary: int, final: bool = False) -> None:
        """Every offset of the chunks before ``boundary`` was delivered or tombstoned,
        unless an operator that holds records across flushes held it at that flush
        (``final``: the end of the lane, where nothing may be held)."""
        held = set() if final else self._held_at.pop(boundary, set())
        missing = self.tracker.open_offsets(boundary)
        if not missing:
            return
        lost = [m for m in missing if m not in held]
        if lost:
            stateful = [op.name for op in self.ops if not op.traits.stateless]
            where, call = (
                ("at the end of the stream", "finish()")
                if final
                else (f"after the flush before chunk {boundary}", "flush()")
            )
            raise ContractViolation(
                f"{where}, lane {self.lane} lost offsets {lost[:8]} (chunk, offset): "
                f"neither delivered nor tombstoned. An operator's {call} did not emit "
                f"everything it held (stateful operators: {stateful}); {call} must emit "
                "(or tombstone) every record the instance holds"
            )

    # -- outputs ---------------------------------------------------------------
    def _outputs(self, exhausted: bool) -> Iterator[Output]:
        if exhausted:
            yield Output(END_OF_LANE, self.initial)
            return
        events: Iterator = self._chunks()
        for i, stage in enumerate(self.plan.stages):
            events = (
                self._parallel_stage(i, stage, events)
                if stage.parallel
                else self._inline_stage(i, stage, events)
            )
        tracker, track = self.tracker, self.plan.checkpointing
        check = track and self.plan.epoch_based
        digest_outputs = self._digest_outputs
        origins = self.origins
        # in cursor order, no record of a chunk below a delivered one's can still come
        forget_delivered = origins is not None and not self.plan.epoch_based
        for kind, x in events:
            if kind == RECS:
                for r in x:
                    if r.payload is TOMBSTONE:
                        if track:
                            tracker.close(r.contributors)
                        continue
                    if forget_delivered:
                        origins.evict_below(r.cursor.chunk_id)
                    if track:
                        digest = value_digest(r.payload) if digest_outputs else r.digest
                        yield Output(r.payload, tracker.deliver(r.contributors, r.cursor, digest))
                    else:
                        yield Output(r.payload, None)
                    self.clock = perf_counter()
            elif kind == FLUSH:
                if origins is not None:  # every record of the chunks before it went through
                    origins.evict_below(x)
                if check:
                    self._check_flushed(x)
            else:
                if check:
                    self._check_flushed(self.next_id, final=True)
                yield Output(END_OF_LANE, tracker.finish(self.next_id) if track else None)
                return


def _origin_table(plan: Plan, lane_source: Any, restored: list[WorkChunk]) -> OriginTable | None:
    """The lane's origin table when its batch adds provenance (None otherwise), holding
    the restored inflight chunks (their epochs counted back from the restored source)."""
    batch = plan.ops[plan.batch_index] if plan.batch_index is not None else None
    if batch is None or not batch.provenance:
        return None
    table = OriginTable()
    epochs = plan.source.pointer_epochs(lane_source, restored) if restored else []
    for i, chunk in enumerate(restored):
        table.add(chunk, None if epochs is None else epochs[i])
    return table


def _stage_label(index: int, stage: Stage) -> str:
    return f"stage[{index}] ({', '.join(op.name for op in stage.ops)}, runner={stage.runner})"
