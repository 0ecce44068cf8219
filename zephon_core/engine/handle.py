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
garbage collector when dropped. An iterator builds its run (every lane's operators and
source, the threads) at its first use, so a ``load_state_dict()`` before it builds only
the restored run; a fresh iterator's state needs no run (``run.unstarted``).

After an error escapes ``next()`` (an operator failure, a stall, a
``KeyboardInterrupt``), the iterator never pretends the stream ended: every later call
raises a ``PipelineError`` saying where it failed (``engine/consumer.py``). Its state up
to the last delivered output stays valid, so ``checkpoint()`` still gives an exact
restore point.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import weakref
from collections.abc import Iterable, Mapping
from typing import Any

from ..checkpoint import codec, lane_cache
from ..checkpoint.data_changes import DataChanges, check_aligned, with_data_changes
from ..checkpoint.lane_cache import EncodedState
from ..checkpoint.state import PipelineState
from ..distributed import dcp
from ..distributed.finite_end import is_finite, step_agreement
from ..distributed.topology import validate
from ..errors import ConfigError, LifecycleError
from .consumer import ConsumerSteps
from .restore_log import RestoreLog
from .run import PipelineRun, lane_order, unstarted
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

    def _encoded_state(self, served: int | None) -> EncodedState:
        """:meth:`_local_state`, each lane encoded (only the lanes that changed since the
        last call are encoded again: ``checkpoint/lane_cache.py``)."""
        raise NotImplementedError

    def _local_dict(self, served: int | None) -> dict[str, Any]:
        """``_local_state(served).to_dict()``, unpacked from the lanes' cached bytes (a value
        msgpack cannot write: the plain way)."""
        if lane_cache.caching():
            try:
                return lane_cache.merged(self._encoded_state(served))
            except (TypeError, ValueError, OverflowError):  # msgpack refused a value
                pass
        return self._local_state(served).to_dict()

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
        topo = spec.topology
        if topo.world_size == 1:
            mine = self._local_dict(served)
            if len(mine["lanes"]) == spec.plan.num_lanes:
                return mine
        local = self._local_state(served)
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
        the state at the call), only the lanes that changed since the last call encoded
        again (``checkpoint/lane_cache.py``). A loader's is the state after the batches it handed out
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
        return dcp.encode_cached(self._encoded_state(served), plan.num_lanes)

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
            "state": self._local_dict(served),
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
        validate(spec.plan.num_lanes, spec.topology.dp_size, spec.topology.num_workers)
        # the run is built at its first use: a load_state_dict() before the first output
        # then builds only the restored one (its lanes' operators, sources and threads)
        self._built: PipelineRun | None = None
        self._finalizer: weakref.finalize | None = None
        self._agree = step_agreement(spec.topology, is_finite(spec.plan.source))
        self._restore_log = RestoreLog(
            spec.start, lane_order(spec.plan, spec.position, spec.topology)
        )

    @property
    def _run(self) -> PipelineRun:
        if self._built is None:
            spec = self.spec
            self._built = PipelineRun(spec.plan, spec.start, spec.topology, changes=spec.changes)
            self._finalizer = weakref.finalize(self, self._built.close)
        return self._built

    def _started(self) -> bool:
        built = self._built is not None and self._built.turn > 0
        return built or self._done or self._failure is not None

    def _restart(self, start: PipelineState) -> None:
        if self._finalizer is not None:
            self._finalizer.detach()
        if self._built is not None:
            self._built.close()
            self._built = None
        self.spec = spec = self.spec.restarted(start)
        self._restore_log = RestoreLog(start, lane_order(spec.plan, spec.position, spec.topology))

    def __iter__(self) -> PipelineIterator:
        return self

    @property
    def _what(self) -> str:  # type: ignore[override]
        return f"iterator (global position {self.position})"

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
        if self._built is not None:
            self._built.close(join_timeout=0.5)  # a stalled thread may never return

    # -- state and stats ------------------------------------------------------------------
    def _local_state(self, served: int | None) -> PipelineState:
        if served is not None:
            raise ConfigError("checkpoint(served=...) applies to pipe.dataloader() consumers")
        if self._built is None:  # nothing to build for it (DCP's load template)
            spec = self.spec
            return unstarted(spec.plan, spec.start, spec.topology, spec.changes)
        return self._built.snapshot()

    def _encoded_state(self, served: int | None) -> EncodedState:
        if self._built is None or served is not None:
            state = self._local_state(served)
            lanes = {lane: lane_cache.encode_lane(ls) for lane, ls in state.lanes.items()}
            return EncodedState(dataclasses.replace(state, lanes={}), lanes)
        return self._built.encoded()

    def stats(self) -> dict[str, Any]:
        """Live counters: outputs/s, per-operator records, queue depths, inflight chunks,
        mixture shares, padding ratio."""
        return self._run.stats()

    @property
    def position(self) -> int:
        """The global position this process reached."""
        return self._built.position() if self._built is not None else self.spec.position

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
        if self._built is not None and not self._built.close():
            log.warning(
                "zephon: close(): a thread of this pipeline run is still inside a call that "
                "has not returned (an operator or a read); it stops when the call returns "
                "and is waited for again at interpreter exit"
            )
        self._close_aggregator()
