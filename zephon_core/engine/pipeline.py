"""Pipeline: the frozen description of a data pipeline (``docs/design.md`` §5).

A ``Pipeline`` describes; it does not run. Builder methods, :meth:`Pipeline.bind` and
:meth:`Pipeline.with_options` return new pipelines, and setting an attribute raises.
:meth:`Pipeline.run_spec` turns the description into a
:class:`~zephon_core.engine.run_spec.RunSpec` (plan, topology, start state, aggregator
factory), from which a handle (``engine/handle.py``) is built that owns the run and its
state and never calls back here:

* ``pipe.iterate(restore=state)`` -- a :class:`~zephon_core.engine.handle.PipelineIterator`;
* ``pipe.dataloader(num_workers=..., restore=state)`` -- a
  :class:`~zephon_core.engine.torch_data.ZephonDataLoader`.

The conveniences ``iter(pipe)``, ``pipe.checkpoint()`` / ``state_dict()``,
``pipe.load_state_dict()``, ``stats()`` and ``close()`` act on the pipeline's *current
run*, a small holder kept apart from the description (``engine/current_run.py`` states
its rules); they are one-line delegations here.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ..checkpoint import codec
from ..checkpoint.data_changes import (
    NO_CHANGES,
    DataChanges,
    check_aligned,
    fresh_changes,
    with_data_changes,
)
from ..checkpoint.owned_lanes import OwnedLanesState
from ..checkpoint.state import PipelineState
from ..distributed import dcp
from ..distributed.topology import Topology, detect, validate
from ..errors import ConfigError
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
from ..sources.base import SourceSpec, as_source
from ..validate import bool_arg, int_arg, number_arg
from .compile import Plan, compile_plan
from .cores import core_share
from .current_run import CurrentRun
from .handle import PipelineIterator
from .run_spec import RunSpec, open_aggregator
from .torch_data import ZephonDataLoader, ZephonIterableDataset

DEFAULT_STALL_TIMEOUT_S = 600.0
#: runtime options ``with_options`` may change (none of them changes the stream)
_OPTIONS = (
    "prefetch",
    "queue_size",
    "aggregate_dir",
    "aggregate_store",
    "aggregate_timeout_s",
    "stall_timeout_s",
)


class Pipeline:
    """A deterministic, checkpointable stream of records or batches (a frozen description).

    Example::

        pipe = (Pipeline(source, canonical_replicas=8, seed=1234)
                .fetch(parallelism=4)
                .map(tokenize, parallelism=4, name="tokenize")
                .split(max_len=2048).pack(seq_len=2048).shuffle(buffer_size=1024)
                .ensure_mixture().batch(batch_size=8))
        with pipe.iterate() as it:
            batch = next(it)
            state = it.checkpoint()        # a plain dict
        with pipe.iterate(restore=state) as it2: ...   # continues exactly

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
        stall_timeout_s: the longest a lane may work without producing an output, or a
            stage take for one microbatch, before ``PipelineStalled`` (the consumer's own
            wait is a backstop at 1.5x); None disables. See ``engine/watchdog.py``.
    """

    def __init__(
        self,
        source: SourceSpec,
        canonical_replicas: int = 1,
        flush_every_k_chunks: int | None = None,
        seed: int = 0,
        *,
        prefetch: int = 3,
        queue_size: int = 2,
        checkpointing: bool = True,
        aggregate_dir: str | os.PathLike | None = None,
        aggregate_store: Any = None,
        aggregate_timeout_s: float = 300.0,
        stall_timeout_s: float | None = DEFAULT_STALL_TIMEOUT_S,
    ):
        as_source(source)  # refuse an object that is no source now, not at compile
        canonical_replicas = int_arg("canonical_replicas", canonical_replicas, minimum=1)
        seed = int_arg("seed", seed)
        checkpointing = bool_arg("checkpointing", checkpointing)
        values = dict(
            source=source,
            canonical_replicas=canonical_replicas,
            flush_every_k_chunks=flush_every_k_chunks,
            seed=seed,
            checkpointing=checkpointing,
            _bind={},
            _ops=(),
            _memo=_PlanMemo(),
            _current_run=CurrentRun(),
        )
        values.update(
            _checked_options(
                dict(
                    prefetch=prefetch,
                    queue_size=queue_size,
                    aggregate_dir=aggregate_dir,
                    aggregate_store=aggregate_store,
                    aggregate_timeout_s=aggregate_timeout_s,
                    stall_timeout_s=stall_timeout_s,
                )
            )
        )
        self.__dict__.update(values)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(
            f"a Pipeline is a frozen description, so {name!r} cannot be set: "
            "builder methods, bind() and with_options() return new pipelines"
        )

    def _evolve(self, **changes: Any) -> Pipeline:
        """A new description with a fresh current run. A compiled plan is kept
        (it is immutable) unless the operators change; runtime options are swapped in."""
        plan = self._memo.plan
        if plan is not None and "_ops" in changes:
            plan = None
        if plan is not None:
            options = {
                k: changes[k] for k in ("prefetch", "queue_size", "stall_timeout_s") if k in changes
            }
            if options:
                plan = dataclasses.replace(plan, **options)
        new = object.__new__(Pipeline)
        new.__dict__.update(self.__dict__)
        new.__dict__.update(_memo=_PlanMemo(plan), _current_run=CurrentRun())
        new.__dict__.update(changes)
        return new

    # -- building -------------------------------------------------------------------
    def then(self, op: Operator) -> Pipeline:
        """A new pipeline with ``op`` appended (custom operators go through here)."""
        if not isinstance(op, Operator):
            raise ConfigError(f"then({op!r}): expected a zephon_core.Operator instance")
        return self._evolve(_ops=self._ops + (op,))

    @property
    def component_names(self) -> tuple[str, ...]:
        """The source's dataset names: ``batch["provenance"][:, 2]`` indexes them."""
        return tuple(as_source(self.source).component_names)

    @property
    def operators(self) -> tuple[Operator, ...]:
        """The operator chain, in order."""
        return self._ops

    @staticmethod
    def for_rank(
        pipeline: Pipeline | Callable[[], Pipeline], rank: int, world_size: int
    ) -> Pipeline:
        """A fresh description from a Pipeline or a zero-argument factory, bound to
        ``rank`` of ``world_size`` when there are several ranks (used by integrations)."""
        pipe = pipeline if isinstance(pipeline, Pipeline) else pipeline()
        if not isinstance(pipe, Pipeline):
            raise ConfigError(
                f"the pipeline factory returned {type(pipe).__name__}, "
                "expected a zephon_core.Pipeline"
            )
        pipe = pipe.description()
        return pipe.bind(rank=rank, world_size=world_size) if world_size > 1 else pipe

    def description(self) -> Pipeline:
        """A copy with a fresh current run (no current handle, no pending restore): the
        conveniences of the copy start over (``engine/current_run.py``)."""
        return self._evolve()

    def with_options(self, **options: Any) -> Pipeline:
        """A copy with other runtime options (``prefetch``, ``queue_size``,
        ``aggregate_dir``, ``aggregate_store``, ``aggregate_timeout_s``,
        ``stall_timeout_s``); none of them changes the stream or the fingerprint."""
        unknown = sorted(set(options) - set(_OPTIONS))
        if unknown:
            raise ConfigError(
                f"with_options({', '.join(unknown)}=...): not a runtime option; "
                f"use any of {list(_OPTIONS)}"
            )
        merged = {k: getattr(self, k) for k in _OPTIONS}
        merged.update(options)
        return self._evolve(**_checked_options(merged))

    def with_provenance(self, on: bool = True) -> Pipeline:
        """A copy whose ``batch`` adds (or, ``on=False``, leaves out) ``provenance``, as
        ``batch(provenance=on)`` would: for a pipeline a factory built. It changes no
        other value and no position, and is no part of the fingerprint: a checkpoint
        of either resumes in the other.

        Raises:
            ConfigError: the pipeline has no ``batch()``.
        """
        on = bool_arg("on", on, where="with_provenance")
        at = [i for i, op in enumerate(self._ops) if isinstance(op, BatchOp)]
        if not at:
            raise ConfigError(
                "with_provenance(): the pipeline has no batch(); provenance describes the "
                "rows of a batch"
            )
        op = copy.copy(self._ops[at[0]])
        op.provenance = on
        return self._evolve(_ops=self._ops[: at[0]] + (op,) + self._ops[at[0] + 1 :])

    def bind(
        self,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        dp_rank: int | None = None,
        dp_size: int | None = None,
    ) -> Pipeline:
        """A copy with the topology taken from torch.distributed overridden
        (model-parallel peers share a ``dp_rank`` and get identical data)."""
        b = {
            k: v
            for k, v in dict(
                rank=rank, world_size=world_size, dp_rank=dp_rank, dp_size=dp_size
            ).items()
            if v is not None
        }
        if "rank" in b and "dp_rank" not in b and "dp_size" not in b:
            b.update(dp_rank=b["rank"], dp_size=b.get("world_size", 1))
        new = self._evolve(_bind=b)
        new.topology()  # validate now
        return new

    def topology(self) -> Topology:
        """Where this process sits (torch.distributed defaults + ``bind()`` overrides)."""
        topo = detect(**self._bind)
        validate(self.canonical_replicas, topo.dp_size, 0)
        return topo

    def fetch(self, parallelism: int | str = 1) -> Pipeline:
        return self.then(FetchOp(parallelism))

    def map(
        self,
        fn: Callable[[Any], Any],
        parallelism: int | str = 1,
        name: str | None = None,
        batched: bool = False,
        runner: str = "threads",
        version: str | Callable[[], str] | None = None,
    ) -> Pipeline:
        """``parallelism``: threads (or processes) applying ``fn`` to chunks at once;
        ``"auto"`` sizes it to this process's cores, divided among the DataLoader workers
        when it runs in one (``engine/cores.py``). ``runner="processes"`` runs ``fn`` on
        worker processes (GIL-bound functions; ``fn`` must be picklable, e.g. defined at
        module level). ``version`` (a string, or
        a function returning one) names the function's behaviour in place of its
        automatic content fingerprint, which a restore compares."""
        return self.then(MapOp(fn, parallelism, name, batched, runner, version))

    def filter(
        self,
        predicate: Callable[[Any], bool],
        parallelism: int | str = 1,
        name: str | None = None,
        runner: str = "threads",
        version: str | Callable[[], str] | None = None,
    ) -> Pipeline:
        return self.then(FilterOp(predicate, parallelism, name, runner, version))

    def split(
        self,
        max_len: int,
        key: str = "input_ids",
        bos_id: int | None = None,
        eos_id: int | None = None,
    ) -> Pipeline:
        """Cut documents into fragments of at most ``max_len`` tokens; ``bos_id`` /
        ``eos_id`` frame each document first (a packed row then shows where it ends)."""
        return self.then(SplitOp(max_len, key, bos_id=bos_id, eos_id=eos_id))

    def pack(
        self, seq_len: int, bins: int = 8, strategy: str = "best_fit", key: str = "input_ids"
    ) -> Pipeline:
        """Pack fragments into rows of at most ``seq_len`` tokens, online into ``bins`` open
        bins: ``strategy="best_fit"`` (the fullest bin with room) or ``"first_fit"`` (the
        lowest-index bin with room; the default before best fit). A flush emits the open
        bins partly filled (``ops/pack.py``; costs in ``docs/operators.md``)."""
        return self.then(PackOp(seq_len, bins, key, strategy))

    def shuffle(self, buffer_size: int) -> Pipeline:
        return self.then(ShuffleOp(buffer_size))

    def ensure_mixture(
        self, weights: Mapping[str, float] | Sequence[float] | None = None, window: int = 16
    ) -> Pipeline:
        return self.then(EnsureMixtureOp(weights, window))

    def batch(
        self,
        batch_size: int,
        drop_last: bool = True,
        seq_len: int | None = None,
        pad_to: str = "max",
        pad_id: int = 0,
        attention: str = "position_ids",
        mask_dtype: str = "float32",
        flash_kwargs: bool = False,
        provenance: bool = False,
    ) -> Pipeline:
        """Collate into dicts of tensors; for packed rows ``attention`` says how the model
        learns where documents start (``ops/packed_batch.py``). ``provenance=True`` adds
        ``batch["provenance"]``, int64 ``[num_segments, 7]``: per segment of each row its
        row, offset in the row, dataset (an index into ``component_names``), dataset row,
        dataset epoch and token range in the document (``ops/batch_provenance.py``)."""
        return self.then(
            BatchOp(
                batch_size,
                drop_last,
                seq_len,
                pad_to,
                pad_id,
                attention=attention,
                mask_dtype=mask_dtype,
                flash_kwargs=flash_kwargs,
                provenance=provenance,
            )
        )

    # -- planning -------------------------------------------------------------------
    def compile(self) -> Plan:
        """The compiled plan (cached: a description never changes; a plan whose
        ``parallelism="auto"`` was sized for another core share -- a forked DataLoader
        worker inherits its parent's -- is compiled again)."""
        plan = self._memo.plan
        if plan is None or (plan.auto_share is not None and plan.auto_share != core_share()):
            plan = self._memo.plan = self._planner()()
        return plan

    def _planner(self) -> Callable[[], Plan]:
        """``compile_plan`` bound to this description (what a DataLoader worker calls when
        it must plan ``parallelism="auto"`` for its own core share)."""
        return functools.partial(
            compile_plan,
            self.source,
            list(self._ops),
            num_lanes=self.canonical_replicas,
            k=self.flush_every_k_chunks,
            seed=self.seed,
            prefetch=self.prefetch,
            queue_size=self.queue_size,
            checkpointing=self.checkpointing,
            stall_timeout_s=self.stall_timeout_s,
        )

    def explain(self) -> str:
        return self.compile().explain()

    # -- runs ---------------------------------------------------------------------------
    def _admit(
        self,
        state: Any,
        allow_changes: Iterable[str],
        origin: str | None = None,
        skip_batches: Any = None,
        exclude: Any = None,
    ) -> PipelineState:
        if not self.checkpointing:
            raise ConfigError("cannot restore into a pipeline built with checkpointing=False")
        # one rank of several decodes and validates only its own lanes (owned_lanes.py)
        admitted = dcp.admit_any(state, self.compile(), self.topology(), allow_changes, origin)
        admitted = with_data_changes(admitted, skip_batches, exclude, allow_changes)
        self._check_changes(admitted.changes, admitted.position)
        return admitted

    def _check_changes(self, changes: DataChanges, position: int) -> None:
        """Before any work: excluded datasets exist, skips cover whole steps."""
        changes.excluded_by_component(self.compile().source.component_names)
        check_aligned(changes, position, self.topology().dp_size)

    def _fresh(self, skip_batches: Any, exclude: Any) -> DataChanges:
        """The decisions of a run from the beginning (``skip_batches``/``exclude`` without
        a restore)."""
        if skip_batches is None and exclude is None:
            return NO_CHANGES
        if self._current_run.pending is not None:
            raise ConfigError(
                "skip_batches/exclude apply to the restore they come with: pass them to "
                "load_state_dict(state, skip_batches=..., exclude=...), or with restore="
            )
        changes = fresh_changes(skip_batches, exclude)
        self._check_changes(changes, 0)
        return changes

    def _spec(self, start: PipelineState | None, changes: DataChanges = NO_CHANGES) -> RunSpec:
        topo = self.topology()
        plan = self.compile()
        if isinstance(start, OwnedLanesState) and not start.owns(topo.dp_rank, topo.dp_size):
            # admitted for another place (bound, or torch.distributed started, since):
            # this place's lanes are among the others, so admit them (a per-rank share
            # lacking them raises MissingLanes)
            start = dcp.admit_any(start.to_dict(), plan, topo, start.allowed, start.origin)
        return RunSpec(
            plan=plan,
            topology=Topology(topo.rank, topo.world_size, topo.dp_rank, topo.dp_size),
            start=start,
            aggregator=functools.partial(
                open_aggregator,
                directory=self.aggregate_dir,
                store=self.aggregate_store,
                timeout_s=self.aggregate_timeout_s,
                num_lanes=self.canonical_replicas,
            ),
            recompile=self._planner() if plan.auto_share is not None else None,
            changes=start.changes if start is not None else changes,
        )

    def run_spec(
        self,
        restore: Any = None,
        *,
        allow_changes: Iterable[str] = (),
        origin: str | None = None,
        skip_batches: Iterable[tuple[int, int]] | None = None,
        exclude: Mapping[str, Iterable[int]] | None = None,
    ) -> RunSpec:
        """What a handle needs to run this pipeline, and nothing of the pipeline itself:
        :class:`~zephon_core.engine.handle.PipelineIterator` and
        :class:`~zephon_core.engine.torch_data.ZephonDataLoader` are built from it alone.

        Args:
            restore: a state from ``state_dict()``/``checkpoint()`` to continue from
                (validated here, before any work); default: the state given to
                ``load_state_dict()``, else the beginning.
            allow_changes: see :meth:`load_state_dict`.
            origin: see :meth:`load_state_dict`.
            skip_batches: see :meth:`load_state_dict` (also from the beginning).
            exclude: see :meth:`load_state_dict` (also from the beginning).
        """
        if restore is not None:
            return self._spec(self._admit(restore, allow_changes, origin, skip_batches, exclude))
        changes = self._fresh(skip_batches, exclude)
        return self._spec(self._current_run.pending, changes)

    def iterate(
        self,
        restore: Any = None,
        *,
        allow_changes: Iterable[str] = (),
        origin: str | None = None,
        skip_batches: Iterable[tuple[int, int]] | None = None,
        exclude: Mapping[str, Iterable[int]] | None = None,
    ) -> PipelineIterator:
        """An independent iterator owning its own run (the pipeline's current run is not
        touched): ``PipelineIterator(pipe.run_spec(...))``.

        Args:
            restore: a state from ``state_dict()``/``checkpoint()`` to continue from;
                default: the state given to ``load_state_dict()``, else the beginning.
            allow_changes: see :meth:`load_state_dict`.
            origin: see :meth:`load_state_dict`.
            skip_batches: see :meth:`load_state_dict` (also from the beginning).
            exclude: see :meth:`load_state_dict` (also from the beginning).
        """
        spec = self.run_spec(
            restore,
            allow_changes=allow_changes,
            origin=origin,
            skip_batches=skip_batches,
            exclude=exclude,
        )
        return PipelineIterator(spec)

    def dataloader(
        self,
        num_workers: int = 0,
        pin_memory: bool = False,
        max_read_ahead: int = 16,
        *,
        restore: Any = None,
        allow_changes: Iterable[str] = (),
        origin: str | None = None,
        skip_batches: Iterable[tuple[int, int]] | None = None,
        exclude: Mapping[str, Iterable[int]] | None = None,
        **kwargs: Any,
    ) -> ZephonDataLoader:
        """A DataLoader serving this rank's lanes; it becomes the pipeline's current handle
        (``ZephonDataLoader(pipe.run_spec(...), ...)`` makes one that does not).
        ``(canonical_replicas / dp_size) % num_workers`` must be 0. ``max_read_ahead``: how
        many batches the training loop may take beyond the last one it consumed and still
        ``checkpoint(served=...)`` at that one. ``restore``, ``allow_changes``, ``origin``,
        ``skip_batches``, ``exclude``: as in :meth:`iterate`."""
        explicit = None
        changes = NO_CHANGES
        if restore is not None:
            explicit = functools.partial(
                self._admit, restore, allow_changes, origin, skip_batches, exclude
            )
        else:
            changes = self._fresh(skip_batches, exclude)
        start = self._current_run.start("pipe.dataloader()", explicit)
        loader = ZephonDataLoader(
            self._spec(start, changes),
            num_workers=num_workers,
            pin_memory=pin_memory,
            max_read_ahead=max_read_ahead,
            **kwargs,
        )
        self._current_run.adopt(loader)
        return loader

    def torch_dataset(self) -> ZephonIterableDataset:
        """A torch IterableDataset yielding ``(batch, LaneDelta)``; prefer ``dataloader()``."""
        return ZephonIterableDataset(self.run_spec())

    # -- conveniences over the current run (engine/current_run.py) ------------------------
    def __iter__(self) -> PipelineIterator:
        return self._current_run.iterator(lambda start: PipelineIterator(self._spec(start)))

    def load_state_dict(
        self,
        state: dict[str, Any],
        *,
        allow_changes: Iterable[str] = (),
        origin: str | None = None,
        skip_batches: Iterable[tuple[int, int]] | None = None,
        exclude: Mapping[str, Iterable[int]] | None = None,
    ) -> None:
        """Set the state the next ``iter(pipe)`` / ``pipe.dataloader()`` starts from.

        Everything is validated here, before any work (see ``checkpoint/restore.py``).

        Args:
            state: what ``checkpoint()``/``state_dict()`` returned (or ``Pipeline.load``).
            allow_changes: accept a deliberate content change: ``"data"`` (datasets whose
                rows changed) and/or ``"functions"`` (map/filter functions that changed).
                Positions continue; values come from the new content. ``"weights"`` /
                ``"components"`` re-mix (``checkpoint/remix.py``). ``"skip"`` /
                ``"exclude"`` accept ``skip_batches`` / ``exclude`` that differ from what
                the state records.
            origin: where the state came from (a path), named in the restore log line.
            skip_batches: ``[(start, end), ...]`` global output positions (half-open) the
                run produces but hands to no consumer, so every later position is what a
                run that trained on them would get. With ``D`` data-parallel ranks each
                range covers whole steps (``ConfigError`` names the aligned bounds). None:
                the state's recorded skips (``checkpoint/data_changes.py``).
            exclude: ``{"dataset": [row, ...]}``: rows dropped from every chunk read after
                this restore (chunks in flight replay as they were read). None: the
                state's recorded exclusion.

        Raises:
            LifecycleError: the pipeline already has a live iterator or loader.
            CorruptCheckpoint / IncompatibleCheckpoint: see ``checkpoint/restore.py``.
        """
        self._current_run.load(
            functools.partial(self._admit, state, allow_changes, origin, skip_batches, exclude)
        )

    def checkpoint(self, served: int | None = None) -> dict[str, Any]:
        """The current handle's state (see the handle's ``checkpoint``); with none, the state
        the next handle starts from."""
        return self._current_run.checkpoint(served, self.compile)

    state_dict = checkpoint

    def local_checkpoint(self, served: int | None = None) -> dict[str, Any]:
        """This rank's lanes only (see ``StreamHandle.local_checkpoint``)."""
        return self._current_run.local_checkpoint(served, self.compile, self.topology())

    def stats(self) -> dict[str, Any]:
        """The current handle's live counters."""
        return self._current_run.stats()

    @property
    def chunks_replayed(self) -> int:
        """Restored inflight chunks replayed by the current iterator's lanes."""
        return self._current_run.chunks_replayed()

    def close(self) -> None:
        """Close the current handle (idempotent); its state stays readable."""
        self._current_run.close()

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        # a pipeline pickles as its description (plus a pending restore: CurrentRun)
        return {**self.__dict__, "_memo": _PlanMemo()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    # -- files ------------------------------------------------------------------------
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


class _PlanMemo:
    """The compiled plan of one description (a cache, not state: compiling again gives an
    equal plan)."""

    __slots__ = ("plan",)

    def __init__(self, plan: Plan | None = None):
        self.plan = plan


def _checked_options(o: dict[str, Any]) -> dict[str, Any]:
    if o["aggregate_dir"] is not None and o["aggregate_store"] is not None:
        raise ConfigError("pass aggregate_dir or aggregate_store, not both")
    return {
        **o,
        "prefetch": int_arg("prefetch", o["prefetch"], minimum=0),
        "queue_size": int_arg("queue_size", o["queue_size"], minimum=1),
        "aggregate_dir": os.fspath(o["aggregate_dir"]) if o["aggregate_dir"] is not None else None,
        "aggregate_timeout_s": number_arg(
            "aggregate_timeout_s", o["aggregate_timeout_s"], positive=True
        ),
        "stall_timeout_s": number_arg(
            "stall_timeout_s",
            o["stall_timeout_s"],
            positive=True,
            allow_none=True,
            hint=" (None disables the watchdog)",
        ),
    }
