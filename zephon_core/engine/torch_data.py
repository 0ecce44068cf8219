"""PyTorch DataLoader integration: worker states travel with their batches.

``pipe.torch_dataset()`` is a torch ``IterableDataset``; in each DataLoader
worker it serves that worker's share of this rank's lanes and yields
``(batch, LaneDelta)`` pairs. :class:`ZephonDataLoader` unwraps them: it
applies the delta of each batch it hands to the training loop to a per-lane
mirror, so its state is the one right after the last batch the consumer
took -- prefetched-but-unconsumed batches are simply produced again after a
resume. The DataLoader's strict worker round-robin reproduces the rank's lane
round-robin because worker ``w`` owns every ``W``-th lane of the rank's list.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from ..checkpoint.state import LaneState, PipelineState
from ..distributed.topology import Topology, rank_lanes, validate
from ..errors import ConfigError
from ..tracking.mirror import LaneDelta, LaneMirror
from .run import PipelineRun, Skip

if TYPE_CHECKING:
    from .pipeline import Pipeline


class ZephonIterableDataset(IterableDataset):
    """Yields ``(batch, LaneDelta)``; use :class:`ZephonDataLoader` to consume it."""

    def __init__(self, pipeline: Pipeline, topology: Topology,
                 restore: PipelineState | None):
        self.pipeline = pipeline.description()
        self.topology = topology
        self.restore = restore

    def __iter__(self) -> Iterator[tuple[Any, LaneDelta]]:

        info = get_worker_info()
        topo = self.topology
        if info is not None:
            topo = Topology(topo.rank, topo.world_size, topo.dp_rank, topo.dp_size,
                            info.id, info.num_workers)
        run = PipelineRun(self.pipeline.compile(), self.restore, topo, emit_skips=True)
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

    def __init__(self, pipeline: Pipeline, topology: Topology, restore: PipelineState | None,
                 served: int = 0, max_read_ahead: int = MAX_READ_AHEAD):
        plan = pipeline.compile()
        self.plan = plan
        self.topology = topology
        self.start = restore.position if restore is not None else 0
        self.steps = 0
        self.served = served  # batches handed out by the loader, across its iterators
        # (lane, its state before, whether the turn handed out a batch)
        self.undo: deque[tuple[int, LaneState, bool]] = deque(maxlen=max_read_ahead)
        self.mirrors: dict[int, LaneMirror] = {}
        for lane in rank_lanes(plan.num_lanes, topology.dp_size, topology.dp_rank, self.start):
            if restore is not None:
                initial = restore.lanes[lane]
            else:
                src = plan.source.open_lane(lane, plan.num_lanes, plan.seed)
                initial = LaneState(lane=lane, source=src.state_dict(),
                                    tokens=[0] * len(plan.source.component_names))
            self.mirrors[lane] = LaneMirror(initial)

    def apply(self, delta: LaneDelta, served: bool = True) -> None:
        mirror = self.mirrors[delta.lane]
        self.undo.append((delta.lane, mirror.state(), served))
        mirror.apply(delta)
        self.steps += 1
        self.served += served

    def position(self, steps: int | None = None) -> int:
        return self.start + (self.steps if steps is None else steps) * self.topology.dp_size

    def snapshot(self, served: int | None = None) -> PipelineState:
        """The state right after the first ``served`` batches (default: all handed out)."""
        states = {lane: m.state() for lane, m in self.mirrors.items()}
        steps = self.steps
        if served is not None and served != self.served:
            back = self.served - served
            entries = list(self.undo)[-self.steps:] if self.steps else []
            if back < 0 or back > sum(e[2] for e in entries):
                raise ConfigError(
                    f"cannot checkpoint after batch {served}: the loader handed out "
                    f"{self.served} batches and remembers the last {self.undo.maxlen} turns "
                    "only; raise dataloader(max_read_ahead=...)")
            for lane, before, was_batch in reversed(entries):
                if back == 0:
                    break
                states[lane] = before
                steps -= 1
                back -= was_batch
        return PipelineState(self.plan.fingerprint, self.plan.config, self.position(steps),
                             states)


class ZephonDataLoader(DataLoader):
    """A DataLoader over a Zephon pipeline whose state follows consumed batches.

    Example::

        loader = pipe.dataloader(num_workers=2, pin_memory=True)
        for step, batch in enumerate(loader): ...
        state = pipe.checkpoint()       # the state right after the last batch taken
    """

    def __init__(self, pipeline: Pipeline, topology: Topology, restore: PipelineState | None,
                 num_workers: int = 0, max_read_ahead: int = MAX_READ_AHEAD, **kwargs: Any):
        for bad in ("batch_size", "shuffle", "sampler", "batch_sampler", "collate_fn",
                    "drop_last"):
            if kwargs.get(bad) not in (None, False):
                raise ConfigError(f"dataloader({bad}=...): batching, shuffling and collation "
                                  "happen inside the Zephon pipeline; remove this argument")
            kwargs.pop(bad, None)
        if kwargs.get("persistent_workers"):
            raise ConfigError("persistent_workers=True is not supported: a re-created "
                              "iterator must restart workers from the consumed state")
        if isinstance(max_read_ahead, bool) or not isinstance(max_read_ahead, int) \
                or max_read_ahead < 1:
            raise ConfigError(f"max_read_ahead={max_read_ahead!r} must be an int >= 1")
        validate(pipeline.canonical_replicas, topology.dp_size, num_workers)
        self.max_read_ahead = max_read_ahead
        self.consumer = RankConsumer(pipeline, topology, restore, max_read_ahead=max_read_ahead)
        self._zephon_topology = topology
        dataset = ZephonIterableDataset(pipeline, topology, restore)
        super().__init__(dataset, batch_size=None, num_workers=num_workers,
                         collate_fn=_identity, **kwargs)

    def __iter__(self) -> Iterator[Any]:
        # a new iterator restarts workers from exactly what was consumed so far
        self.dataset.restore = (self.consumer.snapshot() if self.consumer.steps
                                else self.dataset.restore)
        self.consumer = RankConsumer(self.dataset.pipeline, self._zephon_topology,
                                     self.dataset.restore, served=self.consumer.served,
                                     max_read_ahead=self.max_read_ahead)
        pin = self.pin_memory
        for payload, delta in super().__iter__():
            skip = isinstance(payload, Skip)
            self.consumer.apply(delta, served=not skip)
            if not skip:
                yield _from_wire(payload, pin)


def _identity(x: Any) -> Any:
    return x


class _Wire(dict):
    """A batch whose tensors travel as numpy arrays: torch moves every tensor a worker
    returns through its own shared-memory segment, which costs far more than pickling a
    few small arrays through the worker's pipe."""


def _to_wire(payload: Any) -> Any:
    if isinstance(payload, dict) and payload and all(
            isinstance(v, torch.Tensor) and v.device.type == "cpu" and not v.requires_grad
            for v in payload.values()):
        return _Wire({k: v.numpy() for k, v in payload.items()})
    return payload


def _from_wire(payload: Any, pin: bool) -> Any:
    if isinstance(payload, _Wire):
        out = {k: torch.from_numpy(v) for k, v in payload.items()}
        if pin and torch.cuda.is_available():
            out = {k: v.pin_memory() for k, v in out.items()}
        return out
    return payload
