"""runner=processes: a stage's stateless operators on a pool of worker processes.

For user functions that hold the GIL (pure-Python tokenizers, regex cleaning). The
stage's operators are sent to each worker once, when it starts; a job is one
microbatch (a chunk's records) and returns its output in order, so the stream is the
same as under ``runner=threads`` -- the runner is not part of the fingerprint and a
checkpoint resumes under either. Workers come from a ``forkserver`` (``spawn`` where
there is none): forking a process that runs pump and stage threads could copy a held
lock into the child.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import time
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from typing import TYPE_CHECKING, Any

from ..errors import PipelineError, ZephonError
from ..records import Record
from .run_ops import run_ops
from .shipping import shippable
from .stats import OpStats

if TYPE_CHECKING:
    from ..ops.base import Operator
    from .compile import Plan

log = logging.getLogger(__name__)

_STAGES: dict[int, tuple[Operator, ...]] = {}  # in a worker: stage index -> its operators


def _install(stages: dict[int, tuple[Operator, ...]]) -> None:
    _STAGES.clear()
    _STAGES.update(stages)


def _run_job(
    stage: int, lane: int, records: list[Record]
) -> tuple[list[Record], list[Record], list[OpStats]]:
    ops = _STAGES[stage]
    stats = [OpStats() for _ in ops]  # this job's counts, added to the run's by collect()
    tombs: list[Record] = []
    out = run_ops(ops, records, lane, tombs, stats)
    return out, tombs, stats


def _deaths(codes: set[int]) -> str:
    """How workers ended, the likely first death first: once one dies, the pool ends the
    others (SIGTERM, or exit code 255 when their queue breaks)."""

    def describe(c: int) -> str:
        if c > 0:
            return f"exited with code {c}"
        return f"was killed by signal {-c}" + (
            " (out of memory? an external kill?)" if c == -9 else ""
        )

    aftermath = {-15, 255}
    ordered = sorted(codes, key=lambda c: (c in aftermath, c < 0, c))
    return "; ".join(describe(c) for c in ordered)


def can_start_processes() -> bool:
    """False inside daemonic processes (DataLoader workers), which may not have children."""
    return not mp.current_process().daemon


class StagePool:
    """The worker processes of every ``runner=processes`` stage of a plan (started on the
    first microbatch, so a run that is only checkpointed starts none)."""

    def __init__(self, plan: Plan):
        stages = {i: st.ops for i, st in enumerate(plan.stages) if st.runner == "processes"}
        self.ops = stages
        self._shipped = {i: tuple(shippable(op) for op in ops) for i, ops in stages.items()}
        self._cap = max(sum(op.parallelism for op in ops) for ops in stages.values())
        self._pool: ProcessPoolExecutor | None = None
        self._closed = False
        self._workers: dict[int, Any] = {}  # every worker process seen, for its exit code

    @property
    def pool(self) -> ProcessPoolExecutor:
        if self._pool is None:
            if self._closed:
                raise BrokenProcessPool("the stage's process pool was closed")
            if "forkserver" in mp.get_all_start_methods():
                ctx = mp.get_context("forkserver")
                # workers fork from a server that imported the engine (and torch) once
                ctx.set_forkserver_preload(["zephon_core"])
            else:
                ctx = mp.get_context("spawn")
            self._pool = ProcessPoolExecutor(
                self._cap, mp_context=ctx, initializer=_install, initargs=(self._shipped,)
            )
        return self._pool

    def _failed(self, stage: int, e: BaseException) -> PipelineError:
        names = ", ".join(repr(op.name) for op in self.ops[stage])
        if isinstance(e, (BrokenProcessPool, BrokenPipeError, EOFError, ConnectionError)):
            deadline = time.monotonic() + 2.0  # a dying worker is reaped a moment later
            for p in list(self._workers.values()):
                p.join(max(0.0, deadline - time.monotonic()))
            codes = {p.exitcode for p in list(self._workers.values()) if p.exitcode is not None}
            how = _deaths(codes) if codes else "died or could not start"
            why = (
                f"{how}: functions run there must be importable (defined in a module "
                "file, not a notebook cell; scripts need an `if __name__ == '__main__':` "
                "guard) and must not exit the process; the run cannot continue, restore "
                "from a checkpoint"
            )
        else:
            why = (
                f"could not exchange a microbatch ({type(e).__name__}: {e}); "
                "records and results must pickle"
            )
        return PipelineError(
            f"a worker process of the runner='processes' stage ({names}) {why}",
            operator=self.ops[stage][0].name,
        )

    def submit(self, stage: int, lane: int, records: list[Record]) -> Future:
        try:
            fut = self.pool.submit(_run_job, stage, lane, records)
        except (BrokenProcessPool, BrokenPipeError) as e:
            raise self._failed(stage, e) from e
        # the pool forgets workers once it breaks; keep them to report how they ended
        if len(self._workers) < len(self._pool._processes or {}):
            self._workers.update(self._pool._processes)
        return fut

    def collect(
        self, stage: int, future: Future, stats: list[OpStats], timeout: float | None = None
    ) -> tuple[list[Record], list[Record]]:
        """The job's (outputs, tombstones); its counts are added to ``stats`` (the run's
        counters of the stage's operators)."""
        try:
            out, tombs, counts = future.result(timeout)
        except (ZephonError, FutureTimeout):  # typed in the worker / the caller's watchdog
            raise
        except Exception as e:  # noqa: BLE001 - the pool's own failures, named here
            raise self._failed(stage, e) from e
        for st, job in zip(stats, counts):
            st.add(job)
        return out, tombs

    def close(self) -> None:
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
