"""RunSpec: everything a run handle needs, and nothing of the Pipeline that described it.
(``docs/design.md`` §5)

A :class:`~zephon_core.Pipeline` describes; a handle runs. Between them sits this value:
the compiled plan, where this process sits, where the stream starts, and how ranks merge
their lane states in ``checkpoint()``. :class:`~zephon_core.engine.handle.PipelineIterator`
and :class:`~zephon_core.engine.torch_data.ZephonDataLoader` are built from a ``RunSpec``
alone (``pipe.run_spec(restore=state)`` makes one), so a handle never calls back into a
pipeline -- the same split as Grain's ``MapDataset`` / ``DatasetIterator``.

Example::

    spec = pipe.run_spec(restore=state)      # validated here, before any work
    with PipelineIterator(spec) as it: ...
    loader = ZephonDataLoader(spec, num_workers=2)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..checkpoint.data_changes import NO_CHANGES, DataChanges, check_aligned
from ..checkpoint.state import PipelineState
from ..distributed.topology import Topology
from .compile import Plan
from .cores import core_share

__all__ = ["RunSpec", "open_aggregator"]


@dataclass(frozen=True)
class RunSpec:
    """The start of a run (see the module docstring).

    Args:
        plan: the compiled plan (this process's core share).
        topology: where this process sits (rank, data-parallel place); a handle serves
            the lanes it implies, and its checkpoint merges ranks with it. DataLoader
            workers are added by the loader.
        start: the admitted state to continue from (``checkpoint/restore.py``'s
            ``admit``); None: the beginning.
        aggregator: ``aggregator(topology)`` opens what merges the ranks' lane states in
            ``checkpoint()`` (several ranks only); see :func:`open_aggregator`.
        recompile: compiles the plan again for another core share (a DataLoader worker
            when an operator asked for ``parallelism="auto"``); None: never needed.
        changes: the skipped positions and excluded rows the run follows
            (``checkpoint/data_changes.py``): ``start.changes`` when restoring.
    """

    plan: Plan
    topology: Topology
    start: PipelineState | None = None
    aggregator: Callable[[Topology], Any] | None = None
    recompile: Callable[[], Plan] | None = None
    changes: DataChanges = NO_CHANGES

    def __post_init__(self) -> None:
        if self.start is not None and self.start.changes != self.changes:
            object.__setattr__(self, "changes", self.start.changes)  # the state's decisions
        check_aligned(self.changes, self.position, self.topology.dp_size)

    @property
    def position(self) -> int:
        """The global position the run starts at."""
        return self.start.position if self.start is not None else 0

    def restarted(self, start: PipelineState | None) -> RunSpec:
        """The same run, starting from ``start`` (an admitted state; its recorded
        decisions, ``start.changes``, come with it)."""
        return dataclasses.replace(self, start=start)

    def plan_here(self) -> Plan:
        """The plan for this process: ``plan``, or a recompiled one when it resolved
        ``parallelism="auto"`` for another core share (a forked DataLoader worker inherits
        its parent's plan)."""
        plan = self.plan
        if plan.auto_share is None or plan.auto_share == core_share() or self.recompile is None:
            return plan
        return self.recompile()


def open_aggregator(
    topology: Topology,
    *,
    directory: str | None,
    store: Any,
    timeout_s: float,
    num_lanes: int,
) -> Any:
    """An ``Aggregator`` (``distributed/aggregate.py``) for ``topology``; bind the keyword
    arguments with ``functools.partial`` to make a :attr:`RunSpec.aggregator`."""
    from ..distributed.aggregate import Aggregator  # fsspec/torch.distributed: on first use

    return Aggregator.create(topology, directory, store, timeout_s, num_lanes)
