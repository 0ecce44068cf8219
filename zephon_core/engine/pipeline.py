"""Pipeline: the user-facing description of a data pipeline, and its handle.

A ``Pipeline`` is a frozen, picklable description: builder methods return a
new Pipeline. Iterating it compiles the description and starts a private
:class:`~zephon_core.engine.run.PipelineRun`, which holds all mutable state.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from ..checkpoint import codec
from ..checkpoint.fingerprint import config_diff
from ..checkpoint.state import PipelineState, check_progress
from ..distributed.topology import Topology, detect, validate
from ..errors import ConfigError, IncompatibleCheckpoint
from ..ops import (
    BatchOp,
    EnsureMixtureOp,
    FetchOp,
    FilterOp,
    MapOp,
    Operator,
    PackOp,
    ShuffleOp,
    SplitOp,
)
from ..sources.base import SourceSpec
from .compile import Plan, compile_plan
from .run import PipelineRun
from .torch_data import ZephonDataLoader, ZephonIterableDataset


class Pipeline:
    """A deterministic, checkpointable stream of records or batches.

    Example::

        pipe = (Pipeline(source, canonical_replicas=8, seed=1234)
                .fetch(parallelism=4)
                .map(tokenize, parallelism=4, name="tokenize")
                .split(max_len=2048).pack(seq_len=2048).shuffle(buffer_size=1024)
                .ensure_mixture().batch(batch_size=8))
        it = iter(pipe); batch = next(it)
        state = pipe.checkpoint()          # plain dict; pipe2.load_state_dict(state) resumes

    Args:
        source: a :class:`~zephon_core.sources.base.SourceSpec`, e.g.
            :class:`~zephon_core.StaticMixtureWorkSource`.
        canonical_replicas: number of lanes C; fixed for a training run.
        flush_every_k_chunks: a flush sentinel after every k chunks of a lane.
            ``None`` picks 0 for order-keeping pipelines and 4 otherwise.
        seed: seeds per-chunk and per-operator randomness.
        prefetch: outputs per lane the pump thread may run ahead (0: no pump
            thread, everything runs on the consumer's thread).
        queue_size: microbatches in flight per lane in a threads stage.
        checkpointing: False disables tracking (for measuring its overhead).
        aggregate_dir: shared directory or fsspec URL through which ranks merge their
            lane states in ``checkpoint()`` (several ranks only).
        aggregate_store: ``"torch://"`` (the default process group's store, e.g.
            torchrun's TCPStore) or a ``torch.distributed.Store``; used instead of
            ``aggregate_dir``. With neither, ``"torch://"`` is used when
            torch.distributed is initialized.
        aggregate_timeout_s: one time budget for a whole aggregation round.
    """

    def __init__(self, source: SourceSpec, canonical_replicas: int = 1,
                 flush_every_k_chunks: int | None = None, seed: int = 0, *,
                 prefetch: int = 3, queue_size: int = 2, checkpointing: bool = True,
                 aggregate_dir: str | os.PathLike | None = None,
                 aggregate_store: Any = None, aggregate_timeout_s: float = 300.0):
        for attr in ("open_lane", "read", "describe", "component_names", "weights"):
            if not hasattr(source, attr):
                raise ConfigError(f"source {type(source).__name__} lacks {attr!r}; pass a "
                                  "StaticMixtureWorkSource or implement the SourceSpec protocol")
        if isinstance(canonical_replicas, bool) or not isinstance(canonical_replicas, int) \
                or canonical_replicas < 1:
            raise ConfigError(f"canonical_replicas={canonical_replicas!r} must be an int >= 1")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ConfigError(f"seed={seed!r} must be an int")
        for name, v in (("prefetch", prefetch), ("queue_size", queue_size)):
            if isinstance(v, bool) or not isinstance(v, int) or v < (0 if name == "prefetch"
                                                                     else 1):
                raise ConfigError(f"{name}={v!r} must be an int >= "
                                  f"{0 if name == 'prefetch' else 1}")
        self.source = source
        self.canonical_replicas = canonical_replicas
        self.flush_every_k_chunks = flush_every_k_chunks
        self.seed = seed
        self.prefetch = prefetch
        self.queue_size = queue_size
        self.checkpointing = checkpointing
        if aggregate_dir is not None and aggregate_store is not None:
            raise ConfigError("pass aggregate_dir or aggregate_store, not both")
        if not (isinstance(aggregate_timeout_s, (int, float)) and aggregate_timeout_s > 0):
            raise ConfigError(f"aggregate_timeout_s={aggregate_timeout_s!r} must be > 0")
        self.aggregate_dir = os.fspath(aggregate_dir) if aggregate_dir is not None else None
        self.aggregate_store = aggregate_store
        self.aggregate_timeout_s = float(aggregate_timeout_s)
        self._bind: dict[str, int] = {}
        self._ops: tuple[Operator, ...] = ()
        self._plan: Plan | None = None
        self._run: PipelineRun | None = None
        self._loader: ZephonDataLoader | None = None
        self._aggregator: Any = None
        self._restore: PipelineState | None = None

    # -- building -------------------------------------------------------------------
    def then(self, op: Operator) -> Pipeline:
        """A new pipeline with ``op`` appended (custom operators go through here)."""
        if not isinstance(op, Operator):
            raise ConfigError(f"then({op!r}): expected a zephon_core.Operator instance")
        new = self.description()
        new._ops = self._ops + (op,)
        return new

    @property
    def operators(self) -> tuple[Operator, ...]:
        """The operator chain, in order."""
        return self._ops

    @staticmethod
    def for_rank(pipeline: Pipeline | Callable[[], Pipeline], rank: int,
                 world_size: int) -> Pipeline:
        """A fresh description from a Pipeline or a zero-argument factory, bound to
        ``rank`` of ``world_size`` when there are several ranks (used by integrations)."""
        pipe = pipeline if isinstance(pipeline, Pipeline) else pipeline()
        if not isinstance(pipe, Pipeline):
            raise ConfigError(f"the pipeline factory returned {type(pipe).__name__}, "
                              "expected a zephon_core.Pipeline")
        pipe = pipe.description()
        return pipe.bind(rank=rank, world_size=world_size) if world_size > 1 else pipe

    def description(self) -> Pipeline:
        """A copy holding only the description (no run, no pending restore)."""
        new = copy.copy(self)
        new._plan = new._run = new._restore = new._loader = new._aggregator = None
        return new

    def bind(self, *, rank: int | None = None, world_size: int | None = None,
             dp_rank: int | None = None, dp_size: int | None = None) -> Pipeline:
        """Override the topology taken from torch.distributed (model-parallel peers share a
        ``dp_rank`` and get identical data). Call before iterating."""
        if self._run is not None or self._loader is not None:
            raise ConfigError("bind() must be called before the pipeline is iterated")
        self._bind = {k: v for k, v in dict(rank=rank, world_size=world_size, dp_rank=dp_rank,
                                            dp_size=dp_size).items() if v is not None}
        if "rank" in self._bind and "dp_rank" not in self._bind and "dp_size" not in self._bind:
            self._bind.update(dp_rank=self._bind["rank"],
                              dp_size=self._bind.get("world_size", 1))
        self.topology()  # validate now
        return self

    def topology(self) -> Topology:
        """Where this process sits (torch.distributed defaults + ``bind()`` overrides)."""
        topo = detect(**self._bind)
        validate(self.canonical_replicas, topo.dp_size, 0)
        return topo

    def fetch(self, parallelism: int = 1) -> Pipeline:
        return self.then(FetchOp(parallelism))

    def map(self, fn: Callable[[Any], Any], parallelism: int = 1, name: str | None = None,
            batched: bool = False, runner: str = "threads") -> Pipeline:
        """``runner="processes"`` runs ``fn`` on worker processes (GIL-bound functions;
        ``fn`` must be picklable, e.g. defined at module level)."""
        return self.then(MapOp(fn, parallelism, name, batched, runner))

    def filter(self, predicate: Callable[[Any], bool], parallelism: int = 1,
               name: str | None = None, runner: str = "threads") -> Pipeline:
        return self.then(FilterOp(predicate, parallelism, name, runner))

    def split(self, max_len: int, key: str = "input_ids") -> Pipeline:
        return self.then(SplitOp(max_len, key))

    def pack(self, seq_len: int, bins: int = 8, strategy: str = "first_fit",
             key: str = "input_ids") -> Pipeline:
        return self.then(PackOp(seq_len, bins, key, strategy))

    def shuffle(self, buffer_size: int) -> Pipeline:
        return self.then(ShuffleOp(buffer_size))

    def ensure_mixture(self, weights: Mapping[str, float] | Sequence[float] | None = None,
                       window: int = 16) -> Pipeline:
        return self.then(EnsureMixtureOp(weights, window))

    def batch(self, batch_size: int, drop_last: bool = True, seq_len: int | None = None,
              pad_to: str = "max", pad_id: int = 0) -> Pipeline:
        return self.then(BatchOp(batch_size, drop_last, seq_len, pad_to, pad_id))

    # -- planning -------------------------------------------------------------------
    def compile(self) -> Plan:
        if self._plan is None:
            self._plan = compile_plan(self.source, list(self._ops),
                                      num_lanes=self.canonical_replicas,
                                      k=self.flush_every_k_chunks, seed=self.seed,
                                      prefetch=self.prefetch, queue_size=self.queue_size,
                                      checkpointing=self.checkpointing)
        return self._plan

    def explain(self) -> str:
        return self.compile().explain()

    # -- running --------------------------------------------------------------------
    def _get_run(self) -> PipelineRun:
        if self._loader is not None:
            raise ConfigError("this pipeline is consumed through pipe.dataloader(); iterate "
                              "the loader, not the pipeline")
        if self._run is None:
            plan = self.compile()
            topo = self.topology()
            self._run = PipelineRun(plan, self._restore, Topology(
                topo.rank, topo.world_size, topo.dp_rank, topo.dp_size))
        return self._run

    def __iter__(self) -> Iterator[Any]:
        return self._get_run()

    def torch_dataset(self) -> ZephonIterableDataset:
        """A torch IterableDataset yielding ``(batch, LaneDelta)``; prefer ``dataloader()``."""
        topo = self.topology()
        return ZephonIterableDataset(self, Topology(topo.rank, topo.world_size, topo.dp_rank,
                                                    topo.dp_size), self._restore)

    def dataloader(self, num_workers: int = 0, pin_memory: bool = False,
                   max_read_ahead: int = 16, **kwargs: Any) -> ZephonDataLoader:
        """A ready DataLoader serving this rank's lanes; ``checkpoint()`` then follows the
        batches it handed out. ``(canonical_replicas / dp_size) % num_workers`` must be 0.
        ``max_read_ahead``: how many batches the training loop may take beyond the last
        one it consumed and still ``checkpoint(served=...)`` at that one."""
        if self._run is not None:
            raise ConfigError("this pipeline is already being iterated directly; build the "
                              "dataloader before iterating")
        topo = self.topology()
        self._loader = ZephonDataLoader(self, Topology(topo.rank, topo.world_size,
                                                       topo.dp_rank, topo.dp_size),
                                        self._restore, num_workers=num_workers,
                                        pin_memory=pin_memory, max_read_ahead=max_read_ahead,
                                        **kwargs)
        return self._loader

    def stats(self) -> dict[str, Any]:
        return self._get_run().stats()

    def close(self) -> None:
        if self._run is not None:
            self._run.close()
        if self._aggregator is not None:
            self._aggregator.close()
            self._aggregator = None

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_plan"] = state["_run"] = state["_loader"] = state["_aggregator"] = None
        return state

    # -- checkpointing ------------------------------------------------------------------
    def checkpoint(self, served: int | None = None) -> dict[str, Any]:
        """The state of every lane as delivered to the consumer, as a plain dict.

        Args:
            served: with ``dataloader()``, the state right after the first ``served``
                batches the loader handed out (a trainer that reads one batch ahead passes
                the number its training step consumed); default: all handed out.
        """
        if not self.checkpointing:
            raise ConfigError("this pipeline was built with checkpointing=False; build it "
                              "with checkpointing=True to take checkpoints")
        local = self._local_state(served)
        if len(local.lanes) == self.canonical_replicas and self.topology().world_size == 1:
            return local.to_dict()
        return self._aggregate(local)

    state_dict = checkpoint

    def _local_state(self, served: int | None = None) -> PipelineState:
        if not self.checkpointing:
            raise ConfigError("this pipeline was built with checkpointing=False; build it "
                              "with checkpointing=True to take checkpoints")
        if self._loader is not None:
            return self._loader.consumer.snapshot(served)
        if served is not None:
            raise ConfigError("checkpoint(served=...) applies to pipe.dataloader() consumers")
        return self._get_run().snapshot()

    def local_checkpoint(self, served: int | None = None) -> dict[str, Any]:
        """This rank's lanes only, without an aggregation round: the report a rank sends.
        Merge the reports of all ranks with ``zephon_core.distributed.merge_local_checkpoints``
        (what the aggregation leader does)."""
        topo = self.topology()
        return {"rank": topo.rank, "dp_rank": topo.dp_rank, "dp_size": topo.dp_size,
                "state": self._local_state(served).to_dict()}

    def _aggregate(self, local: PipelineState) -> dict[str, Any]:
        from ..distributed.aggregate import Aggregator

        if self._aggregator is None:
            self._aggregator = Aggregator.create(self.topology(), self.aggregate_dir,
                                                 self.aggregate_store,
                                                 self.aggregate_timeout_s,
                                                 self.canonical_replicas)
        return self._aggregator.round(local).to_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state``; iteration then continues exactly where it was taken."""
        if not self.checkpointing:
            raise ConfigError("cannot restore into a pipeline built with checkpointing=False")
        parsed = PipelineState.from_dict(state)
        plan = self.compile()
        if parsed.fingerprint != plan.fingerprint:
            diff = config_diff(parsed.config, plan.config)
            raise IncompatibleCheckpoint(
                "the checkpoint was written by a differently configured pipeline: "
                + ("; ".join(diff[:10]) if diff else "fingerprints differ")
                + ". Rebuild the pipeline exactly as it was when the checkpoint was taken.")
        check_progress(parsed, self.canonical_replicas)
        if self._run is not None:
            self._run.close()
        self._run = self._loader = None
        self._plan = None  # fresh operator state for the new run
        self._restore = parsed

    def save(self, path: str | os.PathLike) -> int:
        """Write ``checkpoint()`` to ``path`` atomically; returns the size in bytes."""
        data = codec.encode(self.checkpoint())
        codec.write_atomic(path, data)
        return len(data)

    @staticmethod
    def load(path: str | os.PathLike) -> dict[str, Any]:
        """Read a state written by :meth:`save` (pass it to :meth:`load_state_dict`)."""
        return codec.decode(codec.read_bytes(path))

    def restore(self, path: str | os.PathLike) -> None:
        """``load_state_dict(Pipeline.load(path))``."""
        self.load_state_dict(self.load(path))

    @property
    def chunks_replayed(self) -> int:
        """Restored inflight chunks replayed by this process's lanes."""
        return self._get_run().chunks_replayed
