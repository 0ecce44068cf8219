"""The consumer core: how a handle takes turns and assembles its state (``docs/design.md`` §5).

Both ways of consuming a run -- :class:`~zephon_core.engine.handle.PipelineIterator` (the
run in this process) and a pass of :class:`~zephon_core.engine.torch_data.ZephonDataLoader`
(the run in its workers) -- take a turn the same way, so they share this code:

1. *prepare* the next output (not yet delivered; None once this process's stream ended);
2. with several ranks on a finite stream, *agree* that every rank has one
   (``distributed/finite_end.py``), else all end here;
3. *commit* it: adopt the lane state that travelled with it, then hand it out -- or, when
   its global position is one the run skips (``skip_batches``,
   ``checkpoint/data_changes.py``), *drop* it: adopt its state, hand it to no one, and
   take the next turn. Skipped steps are whole steps of every rank, so ranks still agree
   step by step.

An error escaping a turn is remembered: the consumer never pretends the stream ended, and
every later call raises :func:`failed_earlier`'s error. Its state up to the last delivered
output stays exact. :func:`state_at` assembles a state from lane states the same way for
both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ..checkpoint.data_changes import NO_CHANGES, DataChanges
from ..checkpoint.state import LaneState, PipelineState
from ..errors import PipelineError
from .compile import Plan
from .restore_log import RestoreLog

__all__ = ["ConsumerSteps", "failed_earlier", "state_at"]


def failed_earlier(where: str, failure: BaseException, restore_hint: str) -> PipelineError:
    """The error of every call after a failed turn (``where`` failed; how to go on)."""
    return PipelineError(
        f"this {where} failed earlier ({type(failure).__name__}: {failure}) and cannot "
        f"continue; its state up to the last delivered output is intact: {restore_hint}"
    )


def state_at(
    plan: Plan,
    position: int,
    lanes: Mapping[int, LaneState],
    changes: DataChanges = NO_CHANGES,
) -> PipelineState:
    """The state of ``lanes`` at global ``position`` under ``plan`` (recording the run's
    skipped positions and excluded rows, ``changes``)."""
    return PipelineState(
        plan.fingerprint, plan.config, position, dict(lanes), plan.content, changes=changes
    )


class ConsumerSteps(Iterator[Any]):
    """The turn protocol (see the module docstring); subclasses say how to prepare, commit,
    end, refuse (closed) and fail."""

    _failure: BaseException | None = None
    _done: bool = False
    _agree: Callable[[bool], bool] | None = None
    _restore_log: RestoreLog = RestoreLog(None, ())
    #: names the consumer in the "failed earlier" error, and how to continue
    _what: str = "iterator"
    _continue_hint: str = ""

    def __iter__(self) -> ConsumerSteps:
        return self

    def __next__(self) -> Any:
        if self._failure is not None:
            raise failed_earlier(self._what, self._failure, self._continue_hint) from self._failure
        self._refuse()
        if self._done:
            raise StopIteration
        try:
            while True:
                step = self.prepare()
                if self._agree is not None and not self._agree(step is not None):
                    step = None  # another rank's position of this step is empty: all end here
                if step is None:
                    self.end()
                    raise StopIteration
                if not self.skips(step):
                    break
                self.drop(step)  # produced, so later positions are exact; handed to no one
            out = self.commit(step)
            self._restore_log.first_output()
            return out
        except StopIteration:
            raise
        except BaseException as e:
            self._failure = e
            self._fail()
            raise

    # -- the two steps of a turn, public for lockstep callers (testing.SimulatedRanks
    # -- steps several ranks in one process: all prepare, then all commit or all end)
    def prepare(self) -> Any:
        """The next output, not yet delivered; None at this process's end. Commit it (or
        end) before preparing again: ``next()`` does both, which is what you want unless
        you step several ranks in lockstep."""
        raise NotImplementedError

    def commit(self, step: Any) -> Any:
        """Deliver a prepared output: adopt its lane state; returns what the caller gets."""
        raise NotImplementedError

    def end(self) -> None:
        """End the stream here (another rank has no output for this step)."""
        self._done = True

    def skips(self, step: Any) -> bool:
        """The prepared output's global position is one the run skips: :meth:`drop` it
        instead of committing it."""
        changes = self._changes
        return bool(changes.skip) and changes.skipped(self.position_of(step))

    def position_of(self, step: Any) -> int:
        """The global position of a prepared output."""
        raise NotImplementedError

    def drop(self, step: Any) -> None:
        """Take a prepared output's turn without handing it out: its lane state is adopted
        (the position counts), the output is discarded."""
        raise NotImplementedError

    @property
    def skipped_ranges(self) -> list[tuple[int, int]]:
        """The global position ranges this run skips (``skip_batches``, as recorded)."""
        return list(self._changes.skip)

    @property
    def _changes(self) -> DataChanges:
        return NO_CHANGES

    # -- what a consumer provides ------------------------------------------------------
    def _refuse(self) -> None:
        """Raise if this consumer may not take a turn (it was closed)."""

    def _fail(self) -> None:
        """Stop the work behind this consumer after an error escaped a turn."""
