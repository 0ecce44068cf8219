"""Several ranks in one process: how the tests (and you) check a multi-rank layout.

:class:`SimulatedRanks` builds ``dp_size`` data-parallel ranks, each with
``mp`` model-parallel peers, each bound to its place (``Pipeline.bind``) and
iterated directly or through ``dataloader(num_workers=...)`` with real worker
processes. Steps advance in lockstep and a step is delivered only when every rank
has an output for it -- the rule real ranks follow at a finite stream's end
(``docs/design.md`` §7). Checkpoints are the ranks' ``local_checkpoint()`` reports
merged as the aggregation leader merges them.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from ..checkpoint import codec
from ..errors import ContractViolation

__all__ = ["SimulatedRanks"]


class SimulatedRanks:
    """``dp_size`` data-parallel ranks (times ``mp`` model-parallel peers) in this process.

    Example::

        with SimulatedRanks(build_pipeline, dp_size=2, num_workers=2) as ranks:
            head = ranks.take(10)             # the global stream: rank outputs interleaved
            state = ranks.checkpoint()        # all lanes, as the aggregation round merges

    Args:
        build_fn: builds a fresh, identically configured Pipeline.
        dp_size: data-parallel ranks.
        num_workers: DataLoader workers of every global rank (0: iterate directly), or
            one count per global rank.
        state: a checkpoint every rank restores.
        restore_kwargs: more arguments of every rank's restore (``skip_batches``,
            ``exclude``, ``allow_changes``).
        mp: model-parallel peers per data-parallel rank (global ranks ``d*mp ..
            d*mp+mp-1`` share dp_rank ``d`` and must see identical data).
        loader_kwargs: more ``dataloader()`` arguments.
    """

    def __init__(
        self,
        build_fn: Callable[[], Any],
        dp_size: int,
        num_workers: int | list[int] = 0,
        state: dict | None = None,
        *,
        mp: int = 1,
        loader_kwargs: dict | None = None,
        restore_kwargs: dict | None = None,
    ):
        self.dp_size, self.mp = dp_size, mp
        world = dp_size * mp
        workers = num_workers if isinstance(num_workers, list) else [num_workers] * world
        self.workers = workers
        self.handles: list[Any] = []
        self.iters: list[Any] = []
        try:
            for rank in range(world):
                pipe = build_fn()
                if world > 1:
                    pipe = pipe.bind(
                        rank=rank, world_size=world, dp_rank=rank // mp, dp_size=dp_size
                    )
                more = restore_kwargs or {}
                handle = (
                    pipe.dataloader(
                        num_workers=workers[rank], restore=state, **more, **(loader_kwargs or {})
                    )
                    if workers[rank]
                    else pipe.iterate(restore=state, **more)
                )
                self.handles.append(handle)
                self.iters.append(iter(handle))
        except BaseException:
            self.close()
            raise

    @property
    def lanes(self) -> int:
        return self.handles[0].spec.plan.num_lanes

    def step(self) -> list[Any] | None:
        """One step: the output of every global rank in rank order, or None at the end
        (when any rank has no output for the step, none delivers it)."""
        if len(self.iters) == 1:
            return list(itertools.islice(self.iters[0], 1)) or None
        while True:
            prepared = [it.prepare() for it in self.iters]
            if any(p is None for p in prepared):
                for it in self.iters:
                    it.end()
                return None
            skipped = {it.skips(p) for it, p in zip(self.iters, prepared)}
            if skipped != {True}:
                break
            for it, p in zip(self.iters, prepared):  # a skipped step (skip_batches): all drop
                it.drop(p)
        if skipped != {False}:
            raise ContractViolation("the ranks disagree on skipping this step")
        return [it.commit(p) for it, p in zip(self.iters, prepared)]

    def steps(self, n: int) -> list[Any]:
        """``n`` steps of the global stream (one output per data-parallel rank per step)."""
        out: list[Any] = []
        for _ in range(n):
            outs = self.step()
            if outs is None:
                break
            out += outs[:: self.mp]
        return out

    def take(self, n: int) -> list[Any]:
        """The next ``n`` outputs of the global stream (fewer if it ends)."""
        out: list[Any] = []
        while len(out) < n:
            outs = self.step()
            if outs is None:
                break
            out += outs[:: self.mp]
        return out

    def reports(self) -> list[dict]:
        """Every rank's ``local_checkpoint()``."""
        return [h.local_checkpoint() for h in self.handles]

    def checkpoint(self, through_bytes: bool = False) -> dict:
        """The merged state of all lanes (through the byte format when asked)."""
        if len(self.handles) == 1:
            state = self.handles[0].checkpoint()
        else:
            from ..distributed import merge_local_checkpoints

            state = merge_local_checkpoints(self.reports(), self.lanes)
        return codec.decode(codec.encode(state)) if through_bytes else state

    @property
    def chunks_replayed(self) -> int:
        """Chunks replayed on restore (-1: unknown, counted inside worker processes)."""
        if any(self.workers):
            return -1
        return sum(h.chunks_replayed for h in self.handles)

    def close(self) -> None:
        self.iters = []
        for h in self.handles:
            h.close()

    def __enter__(self) -> SimulatedRanks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
