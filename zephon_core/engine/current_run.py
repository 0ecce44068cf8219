"""The conveniences' current run: ``iter(pipe)``, ``pipe.checkpoint()``, ``pipe.load_state_dict()``.
(``docs/design.md`` §5)

A :class:`~zephon_core.Pipeline` is a frozen description and a handle owns a run; the
explicit way is ``pipe.iterate(restore=state)`` / ``pipe.dataloader(restore=state)``,
whose handles answer for their own state. The short way -- ``for batch in pipe``,
``pipe.checkpoint()``, ``pipe.load_state_dict(state)`` -- needs somewhere to remember
which handle is current and where the next one starts. That is this object, one per
pipeline object (``pipe.description()`` makes a copy with a fresh one). Its rules keep the
short way unambiguous:

* at most one live current handle: ``iter(pipe)`` returns it again (a second ``for``
  loop continues the stream), ``pipe.dataloader()`` replaces a closed one;
* ``load_state_dict(state)`` sets where the next current handle starts; it is refused
  while a current handle is live (the handle would not follow it);
* a handle made after a closed one needs a new ``load_state_dict`` or an explicit
  ``restore=``: it would otherwise repeat the data from the same start;
* ``checkpoint()`` asks the current handle; with none, it is where the next one starts.

Nothing here runs or validates: handles come from the pipeline's
:class:`~zephon_core.engine.run_spec.RunSpec`, states from ``checkpoint/restore.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..checkpoint.state import PipelineState
from ..distributed.topology import Topology, rank_lanes
from ..errors import ConfigError, LifecycleError
from .compile import Plan
from .handle import PipelineIterator, StreamHandle
from .run import initial_state

__all__ = ["CurrentRun"]


class CurrentRun:
    """One pipeline object's current handle and pending restore (see the module docstring)."""

    def __init__(self, pending: PipelineState | None = None):
        self.pending = pending  # where the next current handle starts (None: the beginning)
        self.used = False  # a current handle already started from ``pending``
        self.handle: StreamHandle | None = None

    def __getstate__(self) -> dict[str, Any]:
        # a pickled pipeline carries its pending restore, never a run
        return {"pending": self.pending}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["pending"])  # type: ignore[misc]

    def live(self) -> StreamHandle | None:
        cur = self.handle
        return cur if cur is not None and not cur.closed else None

    def _kind(self, handle: StreamHandle) -> str:
        return "iterator" if isinstance(handle, PipelineIterator) else "loader"

    # -- starting the current handle ------------------------------------------------------
    def start(self, what: str, restore: Callable[[], PipelineState] | None) -> PipelineState | None:
        """Where the next current handle starts: ``restore()`` (an explicit ``restore=``),
        else the pending state, once."""
        live = self.live()
        if live is not None:
            raise LifecycleError(
                f"{what}: this pipeline already has a live {self._kind(live)}; close it "
                "first (pipe.close()), or use pipe.iterate() for an independent iterator"
            )
        if restore is not None:
            return restore()
        if self.used:
            where = "the loaded state" if self.pending is not None else "the beginning"
            raise LifecycleError(
                f"{what}: this pipeline's stream was started by a handle that is now "
                f"closed; another would repeat its data from {where}. Continue with "
                f"restore=pipe.checkpoint(), or call load_state_dict() first"
            )
        return self.pending

    def adopt(self, handle: StreamHandle) -> StreamHandle:
        """Make ``handle`` the current one."""
        self.handle, self.used = handle, True
        return handle

    def iterator(self, make: Callable[[PipelineState | None], PipelineIterator]) -> Any:
        """``iter(pipe)``: the live current iterator, or a new one ``make(start)``."""
        live = self.live()
        if isinstance(live, PipelineIterator):
            return live
        if live is not None:
            raise LifecycleError(
                "this pipeline is consumed through pipe.dataloader(); "
                "iterate the loader, not the pipeline"
            )
        return self.adopt(make(self.start("iter(pipe)", None)))

    def load(self, admit: Callable[[], PipelineState]) -> None:
        """``load_state_dict``: ``admit()`` becomes where the next current handle starts."""
        live = self.live()
        if live is not None:
            raise LifecycleError(
                "load_state_dict() must come before iter(pipe) / pipe.dataloader(): this "
                f"pipeline already has a live {self._kind(live)}, which would not follow "
                "the restore. Restore first, pass the state to the handle "
                "(pipe.iterate(restore=state), pipe.dataloader(restore=state)), or "
                "pipe.close() first"
            )
        self.pending, self.used, self.handle = admit(), False, None

    # -- asking the current handle ---------------------------------------------------------
    def checkpoint(self, served: int | None, plan: Callable[[], Plan]) -> dict[str, Any]:
        if self.handle is not None:
            return self.handle.checkpoint(served)
        if served is not None:
            raise ConfigError("checkpoint(served=...) applies to pipe.dataloader() consumers")
        compiled = plan()
        if not compiled.checkpointing:
            raise ConfigError(
                "this pipeline was built with checkpointing=False; build it "
                "with checkpointing=True to take checkpoints"
            )
        start = self.pending or initial_state(compiled, list(range(compiled.num_lanes)))
        out = start.to_dict()  # a rank's admitted share keeps the other lanes as read
        if len(out["lanes"]) != compiled.num_lanes:
            raise ConfigError(
                "the state loaded into this pipeline is one rank's share (a per-rank "
                "state_dict()), not every lane; checkpoint() of a running handle merges "
                "the ranks: start the iterator or loader first"
            )
        return out

    def local_checkpoint(
        self, served: int | None, plan: Callable[[], Plan], topology: Topology
    ) -> dict[str, Any]:
        if self.handle is not None:
            return self.handle.local_checkpoint(served)
        full = PipelineState.from_dict(self.checkpoint(served, plan))
        mine = rank_lanes(plan().num_lanes, topology.dp_size, topology.dp_rank, full.position)
        full.lanes = {lane: full.lanes[lane] for lane in mine}
        return {
            "rank": topology.rank,
            "dp_rank": topology.dp_rank,
            "dp_size": topology.dp_size,
            "state": full.to_dict(),
        }

    def stats(self) -> dict[str, Any]:
        if self.handle is None:
            raise LifecycleError("stats() of a pipeline that is not running: iterate it first")
        return self.handle.stats()

    def chunks_replayed(self) -> int:
        if not isinstance(self.handle, PipelineIterator):
            raise LifecycleError(
                "chunks_replayed is known for an iterator of this process "
                "(iter(pipe) or pipe.iterate()), not before or for a loader"
            )
        return self.handle.chunks_replayed

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()
