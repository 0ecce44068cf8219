"""PyTorch DataLoader integration: worker states travel with their batches (``docs/design.md`` §5).

``pipe.torch_dataset()`` (``ZephonIterableDataset(spec)``) is a torch ``IterableDataset``; in
each DataLoader worker it serves that worker's share of this rank's lanes and yields
``(batch, LaneDelta)`` pairs. :class:`ZephonDataLoader` unwraps them: it
applies the delta of each batch it hands to the training loop to a per-lane
lane state, so its state is the one right after the last batch the consumer
took -- prefetched-but-unconsumed batches are simply produced again after a
resume. The DataLoader's strict worker round-robin reproduces the rank's lane
round-robin because worker ``w`` owns every ``W``-th lane of the rank's list;
a worker whose lanes have all ended stops, and the consumer counts the turns of
ended lanes it no longer sees.

The loader is a handle (``engine/handle.py``) built from a
:class:`~zephon_core.engine.run_spec.RunSpec` alone: it owns its state, and
``iter(loader)`` again continues from what was consumed (workers restart and replay
the inflight chunks). Each pass takes its turns through the consumer core
(``engine/consumer.py``), as the in-process iterator does.
"""

from __future__ import annotations

import time
import weakref
from collections import deque
from collections.abc import Iterator
from functools import partial
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from ..checkpoint import lane_cache
from ..checkpoint.data_changes import NO_CHANGES, DataChanges
from ..checkpoint.lane_cache import EncodedState, LaneCache
from ..checkpoint.state import LaneDelta, LaneState, PipelineState
from ..distributed.finite_end import is_finite, step_agreement
from ..distributed.topology import Topology, rank_lanes, validate
from ..errors import ConfigError, ContractViolation, LifecycleError
from ..ops.token_batch import TokenBatch
from ..sources.repetition import defer_warnings, log_deferred
from ..validate import int_arg
from .compile import Plan
from .consumer import ConsumerSteps, state_at
from .cores import size_worker_threads
from .handle import StreamHandle
from .mixture_report import mixture_report
from .restore_log import RestoreLog
from .run import PipelineRun, Skip, initial_state
from .run_spec import RunSpec
from .stats import WorkerStats, sum_worker_stats


class ZephonIterableDataset(IterableDataset):
    """Yields ``(batch, LaneDelta)``; use :class:`ZephonDataLoader` to consume it."""

    def __init__(self, spec: RunSpec):
        self.spec = spec

    def __iter__(self) -> Iterator[tuple[Any, LaneDelta]]:
        info = get_worker_info()
        topo = self.spec.topology
        if info is not None:
            size_worker_threads(info.num_workers)  # before any native pool starts here
            defer_warnings()  # the training process logs them, once for all workers
            topo = Topology(
                topo.rank, topo.world_size, topo.dp_rank, topo.dp_size, info.id, info.num_workers
            )
        # every run gives its lanes fresh operators: nothing carries over from the last one
        # a worker ships batches as TokenBatch: the training process builds the tensors
        run = PipelineRun(
            self.spec.plan_here(), self.spec.start, topo, emit_skips=True,
            compact_batches=info is not None, changes=self.spec.changes,
        )  # fmt: skip
        wire = _to_wire if info is not None else _identity
        try:
            for payload in run:
                yield wire(payload), run.delta(run.last_lane)
        finally:
            try:
                run.close()
            except Exception:  # noqa: BLE001 - interpreter shutdown may tear modules down first
                pass


MAX_READ_AHEAD = 16  # default: batches a consumer may be behind the loader (Lightning's is 1)


class RankConsumer:
    """The training process's view of its rank's lanes (mirrors fed by deltas).

    It keeps the lane state from before each of the last ``max_read_ahead`` turns, so
    a trainer that reads ahead can still checkpoint the state right after the last
    batch its training step consumed.
    """

    def __init__(
        self,
        plan: Plan,
        topology: Topology,
        restore: PipelineState | None,
        served: int = 0,
        max_read_ahead: int = MAX_READ_AHEAD,
        changes: DataChanges = NO_CHANGES,
    ):
        self.plan = plan
        self.topology = topology
        self.changes = changes  # recorded in every snapshot
        self.start = restore.position if restore is not None else 0
        self.turn = 0  # turns of this rank's lanes consumed, including ended lanes' turns
        self.served = served  # batches handed out by the loader, across its iterators
        self.order = rank_lanes(plan.num_lanes, topology.dp_size, topology.dp_rank, self.start)
        # (lane, its state before, whether the turn handed out a batch, turns it took)
        self.undo: deque[tuple[int, LaneState, bool, int]] = deque(maxlen=max_read_ahead)
        self.workers: dict[int, WorkerStats] = {}  # the latest counters of each worker
        self.started_at: float | None = None
        initial = restore if restore is not None else initial_state(plan, self.order)
        # the lane states as of the last batch handed out, kept up to date by deltas
        self.mirrors: dict[int, LaneState] = {
            lane: initial.lanes[lane].copy() for lane in self.order
        }
        # each mirror's encoded state, kept until a delta changes it (checkpoint/lane_cache.py)
        self.versions = dict.fromkeys(self.order, 0)
        self.lane_cache = LaneCache()

    def apply(self, delta: LaneDelta, served: bool = True) -> None:
        # A worker whose lanes all ended stops, and the DataLoader no longer shows its
        # turns: count them here, so positions match a run that skipped them itself.
        n, taken = len(self.order), 1
        while self.order[self.turn % n] != delta.lane:
            gone = self.order[self.turn % n]
            if not self.mirrors[gone].exhausted:
                raise ContractViolation(
                    f"the DataLoader delivered lane {delta.lane} in the turn of lane {gone}, "
                    "which has not ended: the workers' round-robin broke"
                )
            self.turn += 1
            taken += 1
        mirror = self.mirrors[delta.lane]
        self.undo.append((delta.lane, mirror.copy(), served, taken))
        mirror.apply(delta)
        self.versions[delta.lane] += 1
        self.turn += 1
        self.served += served
        if delta.stats is not None:  # the latest counters of the worker that sent it
            self.workers[delta.stats.worker] = delta.stats
            log_deferred(delta.stats.warnings)
        if self.started_at is None:
            self.started_at = time.perf_counter()

    def position_of(self, lane: int) -> int:
        """The global position of this rank's next output, delivered on ``lane`` (turns
        of ended lanes the DataLoader no longer shows come first, as in :meth:`apply`)."""
        n, turn = len(self.order), self.turn
        for _ in range(n):
            if self.order[turn % n] == lane:
                break
            turn += 1
        return self.position(turn) + self.topology.dp_rank

    def position(self, turn: int | None = None) -> int:
        return self.start + (self.turn if turn is None else turn) * self.topology.dp_size

    def snapshot(self, served: int | None = None) -> PipelineState:
        """The state right after the first ``served`` batches (default: all handed out)."""
        states = {lane: m.copy() for lane, m in self.mirrors.items()}
        turn, rewound = self._rewound(served)
        states.update(rewound)
        return state_at(self.plan, self.position(turn), states, self.changes)

    def encoded(self, served: int | None = None) -> EncodedState:
        """:meth:`snapshot`, encoded: a mirror is encoded again only after a delta changed
        it; a lane rewound to before a read-ahead batch is encoded afresh."""
        turn, rewound = self._rewound(served)
        cache, versions, mirrors = self.lane_cache, self.versions, self.mirrors
        lanes = {
            lane: lane_cache.encode_lane(rewound[lane])
            if lane in rewound
            else cache.encoded(lane, versions[lane], partial(mirrors[lane].copy))
            for lane in self.order
        }
        return EncodedState(state_at(self.plan, self.position(turn), {}, self.changes), lanes)

    def _rewound(self, served: int | None) -> tuple[int, dict[int, LaneState]]:
        """The turn right after the first ``served`` batches, and the lanes whose state
        then was another than their mirror's (from the read-ahead undo entries)."""
        turn, states = self.turn, {}
        if served is not None and served != self.served:
            if served > self.served:
                raise ConfigError(
                    f"checkpoint(served={served}): the loader handed out only {self.served} "
                    "batches; pass the number of batches the training loop consumed"
                )
            back = self.served - served
            entries = list(self.undo)
            if back > sum(e[2] for e in entries):
                raise ConfigError(
                    f"cannot checkpoint after batch {served}: the loader handed out "
                    f"{self.served} batches and remembers the last {self.undo.maxlen} turns "
                    "only; raise dataloader(max_read_ahead=...)"
                )
            for lane, before, was_batch, taken in reversed(entries):
                if back == 0:
                    break
                states[lane] = before.copy()
                turn -= taken
                back -= was_batch
        return turn, states

    def stats(self) -> dict[str, Any]:
        mirrors = list(self.mirrors.values())
        elapsed = time.perf_counter() - self.started_at if self.started_at else 0.0
        return {
            "outputs": self.served,
            "outputs_per_s": self.served / elapsed if elapsed > 0 else 0.0,
            "position": self.position(),
            "lanes": list(self.order),
            "inflight_chunks": {lane: len(m.chunks) for lane, m in self.mirrors.items()},
            "mixture": mixture_report(
                self.plan.source, (m.tokens for m in mirrors), (m.source for m in mirrors)
            ),
            # summed over the workers' latest counters (shipped every SHIP_EVERY batches)
            **sum_worker_stats([op.name for op in self.plan.ops], list(self.workers.values())),
        }


class ZephonDataLoader(StreamHandle, DataLoader):
    """A DataLoader over a Zephon pipeline whose state follows consumed batches.

    Example::

        loader = pipe.dataloader(num_workers=2, pin_memory=True)
        for step, batch in enumerate(loader): ...
        state = loader.checkpoint()     # the state right after the last batch taken

    Args:
        spec: what to run (``pipe.run_spec(restore=...)``); nothing else is consulted.
        num_workers: DataLoader workers; ``(canonical_replicas / dp_size) % num_workers``
            must be 0.
        max_read_ahead: batches the training loop may take beyond the last one it
            consumed and still ``checkpoint(served=...)`` at that one.
        kwargs: more ``torch.utils.data.DataLoader`` arguments (not batching ones).
    """

    def __init__(
        self,
        spec: RunSpec,
        num_workers: int = 0,
        max_read_ahead: int = MAX_READ_AHEAD,
        **kwargs: Any,
    ):
        for bad in ("batch_size", "shuffle", "sampler", "batch_sampler", "collate_fn", "drop_last"):
            if kwargs.get(bad) not in (None, False):
                raise ConfigError(
                    f"dataloader({bad}=...): batching, shuffling and collation "
                    "happen inside the Zephon pipeline; remove this argument"
                )
            kwargs.pop(bad, None)
        if kwargs.get("persistent_workers"):
            raise ConfigError(
                "persistent_workers=True is not supported: a re-created "
                "iterator must restart workers from the consumed state"
            )
        max_read_ahead = int_arg("max_read_ahead", max_read_ahead, minimum=1, where="dataloader")
        validate(spec.plan.num_lanes, spec.topology.dp_size, num_workers)
        self._init_handle(spec)
        self.max_read_ahead = max_read_ahead
        self.consumer = RankConsumer(
            spec.plan, spec.topology, spec.start, max_read_ahead=max_read_ahead,
            changes=spec.changes,
        )  # fmt: skip
        self._agree = step_agreement(spec.topology, is_finite(spec.plan.source))
        self._live: weakref.WeakSet[_LoaderIterator] = weakref.WeakSet()
        dataset = ZephonIterableDataset(spec)
        super().__init__(
            dataset, batch_size=None, num_workers=num_workers, collate_fn=_identity, **kwargs
        )

    def __iter__(self) -> _LoaderIterator:
        if self._closed:
            raise LifecycleError(
                "this loader was closed; take a new one with "
                "pipe.dataloader(restore=loader.checkpoint())"
            )
        for it in list(self._live):  # one live iterator: the new one continues from here
            it.close()
        consumer = self.consumer
        # a new iterator restarts workers from exactly what was consumed so far
        if consumer.turn:
            self.dataset.spec = self.dataset.spec.restarted(consumer.snapshot())
        start = self.dataset.spec.start
        self.consumer = RankConsumer(
            self.spec.plan,
            self.spec.topology,
            start,
            served=consumer.served,
            max_read_ahead=self.max_read_ahead,
            changes=self.dataset.spec.changes,
        )
        it = _LoaderIterator(self, super().__iter__())
        # the first pass logs the restore; later passes continue this loader's own stream
        first, self._iterated = not getattr(self, "_iterated", False), True
        it._restore_log = RestoreLog(start if first else None, self.consumer.order)
        self._live.add(it)
        return it

    def _local_state(self, served: int | None) -> PipelineState:
        return self.consumer.snapshot(served)

    def _encoded_state(self, served: int | None) -> EncodedState:
        return self.consumer.encoded(served)

    def _started(self) -> bool:
        return self.consumer.served > 0 or self.consumer.turn > 0 or bool(self._live)

    def _restart(self, start: PipelineState) -> None:
        self.spec = self.spec.restarted(start)
        self.dataset.spec = self.dataset.spec.restarted(start)
        self.consumer = RankConsumer(
            self.spec.plan,
            self.spec.topology,
            start,
            max_read_ahead=self.max_read_ahead,
            changes=self.spec.changes,
        )

    @property
    def ended(self) -> bool:
        """An iterator of this loader reached the end of this rank's (finite) stream: a
        new ``iter(loader)`` yields nothing."""
        return getattr(self, "_ended", False)

    def stats(self) -> dict[str, Any]:
        """Batches handed out (and per second), position, inflight chunks per lane, the
        mixture per dataset, and the operators' counters and padding ratio summed over
        the workers (each ships its counters with every ``SHIP_EVERY``-th batch)."""
        return self.consumer.stats()

    def close(self) -> None:
        """Shut down the workers of the live iterator (idempotent); the state stays readable."""
        self._closed = True
        for it in list(self._live):
            it.close()
        self._close_aggregator()


class _LoaderIterator(ConsumerSteps):
    """One pass of a :class:`ZephonDataLoader`; applies the delta of each batch it hands
    out. Ends only when the stream ends; after an error it never pretends to."""

    _what = "loader iterator"
    _continue_hint = "iter(loader) restarts from the batches consumed so far"

    def __init__(self, loader: ZephonDataLoader, source: Iterator[Any]):
        self._loader = loader
        self._source: Iterator[Any] | None = source
        self._several = loader.spec.topology.dp_size > 1
        self._agree = loader._agree

    def __iter__(self) -> _LoaderIterator:
        return self

    # -- the turn (engine/consumer.py) ----------------------------------------------------
    def _refuse(self) -> None:
        if self._source is None and not self._done:
            raise LifecycleError(
                "this loader iterator was closed; iter(loader) continues "
                "from the batches consumed so far"
            )

    def prepare(self) -> tuple[Any, LaneDelta] | None:
        """The next batch and its delta (not yet applied); None at this rank's end."""
        consumer = self._loader.consumer
        while True:
            item = next(self._source, None)
            if item is None:
                return None
            payload, delta = item
            if not isinstance(payload, Skip):
                return item
            if self._several:
                return None  # an ended lane's turn: a hole in the step (finite_end.py)
            consumer.apply(delta, served=False)

    def position_of(self, item: tuple[Any, LaneDelta]) -> int:
        """The global position of a prepared batch (see ``engine/consumer.py``)."""
        return self._loader.consumer.position_of(item[1].lane)

    def drop(self, item: tuple[Any, LaneDelta]) -> None:
        """Take a skipped batch's turn: its delta counts, the batch is never built."""
        self._loader.consumer.apply(item[1], served=False)

    @property
    def _changes(self) -> DataChanges:
        return self._loader.consumer.changes

    def commit(self, item: tuple[Any, LaneDelta]) -> Any:
        payload, delta = item
        # built first: if building fails, the batch was not handed out and must not count
        out = _from_wire(payload, self._loader.pin_memory)
        self._loader.consumer.apply(delta, served=True)
        return out

    def end(self) -> None:
        self._done = True
        self._source = None
        self._loader._ended = True

    def _fail(self) -> None:
        self.close()

    def close(self) -> None:
        """Stop this pass's workers or in-process run (a new ``iter(loader)`` continues)."""
        source, self._source = self._source, None
        shutdown = getattr(source, "_shutdown_workers", None)  # worker processes
        if shutdown is not None:
            shutdown()
        fetcher = getattr(source, "_dataset_fetcher", None)  # num_workers=0: our generator
        gen = getattr(fetcher, "dataset_iter", None)
        if gen is not None and hasattr(gen, "close"):
            gen.close()


def _identity(x: Any) -> Any:
    return x


class _Wire(dict):
    """A batch whose tensors travel as numpy arrays: torch moves every tensor a worker
    returns through its own shared-memory segment, which costs far more than pickling a
    few small arrays through the worker's pipe."""


def _to_wire(payload: Any) -> Any:
    if (
        isinstance(payload, dict)
        and payload
        and all(
            isinstance(v, torch.Tensor) and v.device.type == "cpu" and not v.requires_grad
            for v in payload.values()
        )
    ):
        return _Wire({k: v.numpy() for k, v in payload.items()})
    return payload


def _from_wire(payload: Any, pin: bool) -> Any:
    if isinstance(payload, TokenBatch):
        out = payload.build()
    elif isinstance(payload, _Wire):
        out = {k: torch.from_numpy(v) for k, v in payload.items()}
    else:
        return payload
    if pin and torch.cuda.is_available():
        out = {k: v.pin_memory() if torch.is_tensor(v) else v for k, v in out.items()}
    return out
