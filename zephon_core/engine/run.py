"""A running pipeline: lane streams, the pump, and the consumer's view of progress.

The consumer takes outputs round-robin over its lanes; after each one it
adopts the state that travelled with it and trims that lane's ledger. A
checkpoint is therefore defined by delivered outputs, however far the pump
ran ahead.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..checkpoint.state import LaneState, PipelineState
from ..errors import IncompatibleCheckpoint
from ..tracking.eviction import Delivery
from .compile import Plan
from .lane_stream import END_OF_LANE, LaneStream, Output
from .lanes import lane_of, turns_of_lane
from .pump import Pump


class PipelineRun:
    def __init__(self, plan: Plan, restored: PipelineState | None):
        self.plan = plan
        n = plan.num_lanes
        self.order = list(range(n))
        self.position = restored.position if restored is not None else 0
        cap = max((st.cap for st in plan.stages if st.runner == "threads"), default=0)
        self.pool = ThreadPoolExecutor(cap, thread_name_prefix="zephon-stage") if cap else None
        self.streams = {lane: LaneStream(plan, lane,
                                         restored.lanes[lane] if restored else None, self.pool)
                        for lane in self.order}
        self.delivered: dict[int, Delivery] = {lane: s.initial for lane, s in
                                               self.streams.items()}
        self.pump: Pump | None = None
        self.closed = False
        self.chunks_replayed = sum(s.chunks_replayed for s in self.streams.values())
        self.started_at: float | None = None
        self.outputs_taken = 0

    # -- consuming ----------------------------------------------------------------
    def _take(self, lane: int) -> Output:
        if self.plan.prefetch > 0:
            if self.pump is None:
                self.pump = Pump(self.streams, self.order, self.plan.prefetch,
                                 lambda: self.position)
            return self.pump.take(lane)
        return next(self.streams[lane].outputs)

    def __iter__(self) -> PipelineRun:
        return self

    def __next__(self) -> Any:
        if self.closed:
            raise StopIteration
        if self.started_at is None:
            self.started_at = time.perf_counter()
        n = len(self.order)
        while not all(d.exhausted for d in self.delivered.values()):
            lane = self.order[lane_of(self.position, n)]
            if self.delivered[lane].exhausted:
                self.position += 1
                continue
            out = self._take(lane)
            self.position += 1
            if out.state is not None:
                self.delivered[lane] = out.state
                self.streams[lane].ledger.trim(out.state.floor)
            elif out.payload is END_OF_LANE:
                d = self.delivered[lane]
                self.delivered[lane] = d._replace(exhausted=True)
            if out.payload is END_OF_LANE:
                continue
            self.outputs_taken += 1
            return out.payload
        raise StopIteration

    # -- checkpoint -----------------------------------------------------------------
    def snapshot(self) -> PipelineState:
        lanes = {}
        for lane, stream in self.streams.items():
            d = self.delivered[lane]
            chunks, bounds, source_state, next_id = stream.ledger.snapshot(d.floor)
            lanes[lane] = LaneState(lane=lane, floor=d.floor, next_chunk=max(next_id, d.floor),
                                    chunks=chunks, boundaries=bounds, source=source_state,
                                    cursor=d.cursor, delivered=d.delivered,
                                    exhausted=d.exhausted, tokens=list(d.tokens))
        return PipelineState(self.plan.fingerprint, self.plan.config, self.position, lanes)

    def stats(self) -> dict[str, Any]:
        elapsed = time.perf_counter() - self.started_at if self.started_at else 0.0
        tokens = [0] * len(self.plan.source.component_names)
        for d in self.delivered.values():
            for i, t in enumerate(d.tokens):
                tokens[i] += t
        total = sum(tokens) or 1
        names = self.plan.source.component_names
        batch = next((op for op in self.plan.ops if type(op).__name__ == "BatchOp"), None)
        return {
            "outputs": self.outputs_taken,
            "outputs_per_s": self.outputs_taken / elapsed if elapsed > 0 else 0.0,
            "position": self.position,
            "inflight_chunks": {lane: len(s.ledger) for lane, s in self.streams.items()},
            "queue_depths": self.pump.queued() if self.pump else {},
            "chunks_replayed": self.chunks_replayed,
            "operators": {op.name: op.stats.as_dict() for op in self.plan.ops},
            "mixture_share": {names[i]: t / total for i, t in enumerate(tokens)},
            "mixture_target": dict(zip(names, self.plan.source.weights)),
            "padding_ratio": (batch.pad_tokens / batch.total_tokens
                              if batch is not None and batch.total_tokens else 0.0),
        }

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.pump is not None:
            self.pump.close()
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)


def check_progress(state: PipelineState, n: int) -> None:
    """Lane progress must be consistent with one global position."""
    if sorted(state.lanes) != list(range(n)):
        raise IncompatibleCheckpoint(f"checkpoint holds lanes {sorted(state.lanes)}, the "
                                     f"pipeline has canonical_replicas={n}")
    bad = []
    for lane, ls in state.lanes.items():
        turns = turns_of_lane(lane, state.position, n)
        ok = ls.delivered <= turns if ls.exhausted else ls.delivered == turns
        if not ok:
            bad.append(f"lane {lane}: {ls.delivered} outputs delivered, position "
                       f"{state.position} implies {turns}")
    if bad:
        raise IncompatibleCheckpoint(
            "lane progress is inconsistent with a single global position (were lane states "
            "from ranks that checkpointed at different steps merged?): " + "; ".join(bad))
