"""Handles: the objects that own a running stream (``docs/design.md`` §5).

A :class:`~zephon_core.Pipeline` is a frozen description. A handle is built from a
:class:`~zephon_core.engine.run_spec.RunSpec` (the plan, where this process sits, where
it starts, how ranks merge) and owns the run; it is the one place to ask for its state:

* :class:`PipelineIterator` -- ``pipe.iterate(restore=state)``, or ``PipelineIterator(spec)``;
* :class:`~zephon_core.engine.torch_data.ZephonDataLoader` -- ``pipe.dataloader(...)``.

Both offer ``checkpoint()`` (the merged state of every lane; an aggregation round when
several ranks hold lanes), ``save(path)`` (writes it), ``local_checkpoint()``, ``stats()``,
``close()``, the context-manager protocol, and DCP's ``Stateful`` protocol:
``state_dict()`` is this rank's lanes only, one ``bytes`` value per lane, with no
collective (``distributed/dcp.py``), and ``load_state_dict(state)`` -- before the first
output -- restores a merged state or a per-rank one holding at least this rank's lanes,
so ``dcp.save({"data": loader}, ...)`` / ``dcp.load`` checkpoint the data per rank and
resume on any data-parallel size dividing ``canonical_replicas``. A handle never refers to
the pipeline that made it (it may be collected while the handle runs) and is closed by the
garbage collector when dropped.

After an error escapes ``next()`` (an operator failure, a stall, a
``KeyboardInterrupt``), the iterator never pretends the stream ended: every later call
raises a ``PipelineError`` saying where it failed (``engine/consumer.py``). Its state up
to the last delivered output stays valid, so ``checkpoint()`` still gives an exact
restore point.
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Iterable, Mapping
from typing import Any

from ..checkpoint import codec
from ..checkpoint.data_changes import DataChanges, check_aligned, with_data_changes
from ..checkpoint.state import PipelineState
from ..distributed import dcp
from ..distributed.finite_end import is_finite, step_agreement
from ..errors import ConfigError, LifecycleError
from .consumer import ConsumerSteps
from .restore_log import RestoreLog
from .run import PipelineRun
from .run_spec import RunSpec

log = logging.getLogger(__name__)


class StreamHandle:
    """State, stats and shutdown shared by every handle (see the module docstring)."""

    spec: RunSpec

    def _init_handle(self, spec: RunSpec) -> None:
        self.spec = spec
        self._aggregator: Any = None
        self._closed = False

    # -- state ------------------------------------------------------------------------
    def _local_state(self, served: int | None) -> PipelineState:
        raise NotImplementedError

    def checkpoint(self, served: int | None = None) -> dict[str, Any]:
        """The state of every lane as delivered to the consumer, as a plain dict that shares
        nothing with the running stream.

        Args:
            served: (loaders) the state right after the first ``served`` batches the loader
                handed out, for a trainer that reads ahead; default: all handed out.
        """
        spec = self.spec
        if not spec.plan.checkpointing:
            raise ConfigError(
                "this pipeline was built with checkpointing=False; build it "
                "with checkpointing=True to take checkpoints"
            )
        local = self._local_state(served)
        topo = spec.topology
        if len(local.lanes) == spec.plan.num_lanes and topo.world_size == 1:
            return local.to_dict()
        if spec.aggregator is None:
            raise ConfigError(
                f"this handle serves {len(local.lanes)} of {spec.plan.num_lanes} lanes and "
                "its RunSpec has no aggregator to merge the ranks' states: build the spec "
                "with pipe.run_spec(), or merge local_checkpoint() reports yourself "
                "(zephon_core.distributed.merge_local_checkpoints)"
            )
        if self._aggregator is None:
            self._aggregator = spec.aggregator(topo)
        return self._aggregator.round(local)

    def state_dict(self, served: int | None = None) -> dict[str, Any]:
        """This rank's lanes, shaped for ``torch.distributed.checkpoint`` (DCP):
        ``{"meta": bytes, "slots": {"00007": bytes, ...}}`` with one key per lane
        (``distributed/dcp.py``). Local and cheap: no aggregation round, no collective, no
        worker start; a new dict of immutable values on every call (``dcp.async_save`` keeps
        the state at the call). A loader's is the state after the batches it handed out
        (``served``: after the first ``served`` of them, as in :meth:`checkpoint`).
        On a fresh handle it names exactly the slots this rank owns: DCP's load template.
        ``served``: as in :meth:`checkpoint` (a trainer that reads ahead).

        For one dict holding every lane of every rank (a round), use :meth:`checkpoint`.
        """
        plan = self.spec.plan
        if not plan.checkpointing:
            raise ConfigError(
                "this pipeline was built with checkpointing=False; build it "
                "with checkpointing=True to take checkpoints"
            )
        return dcp.encode(self._local_state(served), plan.num_lanes)

    def load_state_dict(
        self,
        state: dict[str, Any],
        *,
        allow_changes: Iterable[str] = (),
        origin: str | None = None,
        skip_batches: Iterable[tuple[int, int]] | None = None,
        exclude: Mapping[str, Iterable[int]] | None = None,
    ) -> None:
        """Start this handle from ``state`` instead (before its first output): a merged
        state (:meth:`checkpoint`) or a per-rank one (:meth:`state_dict`, e.g. filled in by
        ``dcp.load``) holding at least the lanes this rank owns at the state's position.
        Validated as ``pipe.load_state_dict`` validates (``allow_changes``, ``origin``,
        ``skip_batches``, ``exclude``: the same); only this rank's lanes are decoded.

        Raises:
            LifecycleError: the handle already delivered an output or was closed.
            MissingLanes: a per-rank state without a lane this rank owns.
            CorruptCheckpoint / IncompatibleCheckpoint: see ``checkpoint/restore.py``.
        """
        if self._closed or self._started():
            raise LifecycleError(
                "load_state_dict() must come before the first output of this handle (it "
                "already delivered or was closed); build a new one from the state: "
                "pipe.iterate(restore=state) / pipe.dataloader(restore=state), then "
                "dcp.load into it before iterating"
            )
        spec = self.spec
        if not spec.plan.checkpointing:
            raise ConfigError("cannot restore into a pipeline built with checkpointing=False")
        start = dcp.admit_any(state, spec.plan, spec.topology, allow_changes, origin)
        start = with_data_changes(start, skip_batches, exclude, allow_changes)
        check_aligned(start.changes, start.position, spec.topology.dp_size)
        self._restart(start)

    def _started(self) -> bool:
        raise NotImplementedError

    def _restart(self, start: PipelineState) -> None:
        raise NotImplementedError

    def local_checkpoint(self, served: int | None = None) -> dict[str, Any]:
        """This rank's lanes only, without an aggregation round: the report a rank sends
        (merge all ranks' reports with ``zephon_core.distributed.merge_local_checkpoints``)."""
        topo = self.spec.topology
        return {
            "rank": topo.rank,
            "dp_rank": topo.dp_rank,
            "dp_size": topo.dp_size,
            "state": self._local_state(served).to_dict(),
        }

    def save(self, path: str | os.PathLike, served: int | None = None) -> int:
        """Write :meth:`checkpoint` to ``path`` atomically; returns the size in bytes."""
        data = codec.encode(self.checkpoint(served))
        codec.write_atomic(path, data)
        return len(data)

    # -- lifetime -----------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    def _close_aggregator(self) -> None:
        if self._aggregator is not None:
            self._aggregator.close()
            self._aggregator = None

    def __enter__(self) -> StreamHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        raise NotImplementedError


class PipelineIterator(StreamHandle, ConsumerSteps):
    """Iterates a pipeline in this process and owns the run (threads, workers, state).

    Example::

        with pipe.iterate(restore=state) as it:
            for batch in it: ...
            state = it.checkpoint()

    Args:
        spec: what to run (``pipe.run_spec(restore=...)``); nothing else is consulted.
    """

    _continue_hint = "state = it.checkpoint(); it = pipe.iterate(restore=state)"

    def __init__(self, spec: RunSpec):
        self._init_handle(spec)
        self._run = PipelineRun(spec.plan, spec.start, spec.topology, changes=spec.changes)
        self._agree = step_agreement(spec.topology, is_finite(spec.plan.source))
        self._finalizer = weakref.finalize(self, self._run.close)
        self._restore_log = RestoreLog(spec.start, self._run.order)

    def _started(self) -> bool:
        return self._run.turn > 0 or self._done or self._failure is not None

    def _restart(self, start: PipelineState) -> None:
        self._finalizer.detach()
        self._run.close()
        self.spec = spec = self.spec.restarted(start)
        self._run = PipelineRun(spec.plan, start, spec.topology, changes=spec.changes)
        self._finalizer = weakref.finalize(self, self._run.close)
        self._restore_log = RestoreLog(start, self._run.order)

    def __iter__(self) -> PipelineIterator:
        return self

    @property
    def _what(self) -> str:  # type: ignore[override]
        return f"iterator (global position {self._run.position()})"

    # -- the turn (engine/consumer.py) ------------------------------------------------------
    def _refuse(self) -> None:
        if self._closed:
            raise LifecycleError(
                "this iterator was closed; take a new one "
                "(pipe.iterate(restore=it.checkpoint()) continues exactly)"
            )

    def prepare(self) -> Any:
        """The next output, not yet delivered (see ``engine/consumer.py``)."""
        return None if self._done else self._run.prepare()

    def commit(self, step: Any) -> Any:
        """Deliver a prepared output (see ``engine/consumer.py``)."""
        return self._run.commit(step)

    def position_of(self, step: Any) -> int:
        """The global position of a prepared output (see ``engine/consumer.py``)."""
        return self._run.position() + self.spec.topology.dp_rank

    def drop(self, step: Any) -> None:
        """Take a skipped output's turn (see ``engine/consumer.py``)."""
        self._run.commit(step, served=False)

    @property
    def _changes(self) -> DataChanges:
        return self.spec.changes

    def _fail(self) -> None:
        self._run.close(join_timeout=0.5)  # a stalled thread may never return

    # -- state and stats ------------------------------------------------------------------
    def _local_state(self, served: int | None) -> PipelineState:
        if served is not None:
            raise ConfigError("checkpoint(served=...) applies to pipe.dataloader() consumers")
        return self._run.snapshot()

    def stats(self) -> dict[str, Any]:
        """Live counters: outputs/s, per-operator records, queue depths, inflight chunks,
        mixture shares, padding ratio."""
        return self._run.stats()

    @property
    def position(self) -> int:
        """The global position this process reached."""
        return self._run.position()

    @property
    def chunks_replayed(self) -> int:
        """Restored inflight chunks replayed by this process's lanes."""
        return self._run.chunks_replayed

    @property
    def run(self) -> PipelineRun:
        """The engine object behind this iterator (tests and diagnostics)."""
        return self._run

    def close(self) -> None:
        """Stop threads and worker processes (idempotent); the state stays readable. Waits
        for the threads to end (a failed run's threads too): up to 5 s for one inside a
        blocking call, which the garbage collector and the exit hook then wait for again."""
        self._closed = True
        if not self._run.close():
            log.warning(
                "zephon: close(): a thread of this pipeline run is still inside a call that "
                "has not returned (an operator or a read); it stops when the call returns "
                "and is waited for again at interpreter exit"
            )
        self._close_aggregator()
