"""A finite Zephon stream that ends before ``max_steps``: training stops at that step.

With ``max_steps`` and an IterableDataset the Trainer takes the end of the data for the
end of an epoch and starts another pass over the same loader. A Zephon loader continues
from what was consumed, so every later pass is empty: accelerate's dispatcher raises an
untyped ``ValueError`` for it, and a Trainer fed directly logs a message of its own. Both
integrations instead end training at the step where the stream ended, with one
WARNING -- also a run resumed from a checkpoint taken at that step, which trains
nothing. The step's partial gradient accumulation is the Trainer's own rule for the last
batches of an epoch.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from transformers import TrainerCallback

log = logging.getLogger(__name__)


class StreamEnd(TrainerCallback):
    """Ends training when a pass over the loader ended because the stream did: the pass
    trained nothing (a resume where the stream had ended), or it ended before
    ``max_steps`` without a callback asking. Every rank decides alike (the passes end at
    the same step on every rank). ``ZephonTrainer`` registers one; ``ZephonCallback``
    forwards its epoch events to its own."""

    def __init__(self, who: str):
        self.who = who
        self._pass_start: int | None = None

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self._pass_start = state.global_step
        return control

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        empty = state.global_step == self._pass_start
        asked = control.should_training_stop or control.should_epoch_stop
        if state.global_step >= state.max_steps or (asked and not empty):
            return control
        control.should_training_stop = True
        log.warning(
            "%s: the Zephon stream ended at step %d, before max_steps=%d: training stops "
            "here (the pipeline's datasets are finite: raise their num_epochs, or lower "
            "max_steps to silence this)",
            self.who,
            state.global_step,
            state.max_steps,
        )
        return control


def end_empty_passes_quietly(loader: Any) -> None:
    """Make accelerate's ``DataLoaderDispatcher`` end a pass that has no batch at all
    instead of raising (a resume at the step where a finite stream ended).

    Rank 0 broadcasts that its stream is empty, so every rank raises at the same point,
    before any batch: every rank ends the pass alike, and the Trainer stops as it does
    for an empty pass of any other loader. accelerate builds the wrapper inside
    ``Trainer.train`` with no hook to choose its class, and hides ``__class__`` behind
    a property, so the instance's class is swapped for a subclass here.
    """
    from accelerate.data_loader import DataLoaderDispatcher

    cls = type(loader)
    if not issubclass(cls, DataLoaderDispatcher) or issubclass(cls, _QuietWhenEmpty):
        return
    quiet = type(cls.__name__, (_QuietWhenEmpty, cls), {})
    object.__dict__["__class__"].__set__(loader, quiet)


class _QuietWhenEmpty:
    def __iter__(self) -> Iterator[Any]:
        passes = super().__iter__()  # type: ignore[misc]
        try:
            first = next(passes)
        except StopIteration:
            return
        except (ValueError, TypeError):
            # One process: ValueError("Batch does not contain any data"); several:
            # broadcast(None) raises TypeError first. Both after every rank received rank
            # 0's "stopped" at the first fetch; an error of rank 0's reading comes before
            # that broadcast and is raised as it is.
            if getattr(self, "_stop_iteration", False):
                return
            raise
        yield first
        yield from passes
