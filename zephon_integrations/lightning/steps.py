"""Where Lightning's training micro-steps begin and end: the global RNG each one draws
from, and the optimizer-step boundary a checkpoint records.

The RNG rule, in every run -- uninterrupted or resumed, whatever the checkpoint
schedule (``restore_rng=True``, the default):

* training micro-step ``n+1`` draws from the global RNGs (python, numpy, torch, CUDA)
  exactly where micro-step ``n``'s draws ended: they are snapshotted when ``n``'s
  ``on_train_batch_end`` begins (after its forward, backward and optimizer step) and
  set back right before ``n+1``'s batch reaches the LightningModule
  (``on_before_batch_transfer``). Whatever draws in between -- validation, saving a
  checkpoint, a new epoch's loader iterator, the LightningModule's ``on_train_batch_end``,
  other callbacks' -- never reaches training, so checkpointing observes a run without
  altering it;
* the first micro-step of a fresh fit draws from the RNGs as it finds them (after
  ``seed_everything``, model and loader creation); the first of a resumed fit from the
  snapshot its checkpoint saved.

A checkpoint records the last **optimizer-step boundary**: the batches consumed up to
the last micro-step that ended with an optimizer step, the RNG snapshot the next
micro-step starts from, and Lightning's loop counters there (:mod:`.loop_counters`).
Taken inside a gradient-accumulation window (a save at validation end, or the re-save a
resumed fit makes at its first micro-step), it is the checkpoint of the window's start,
and a resume redoes the window's micro-batches exactly -- the partial gradient is in
no checkpoint. The one thing that cannot be redone is a buffer the forward pass updates
(BatchNorm running statistics): it counts those micro-batches twice (a warning says so).

State (in memory only; a checkpoint holds the boundary): ``consumed`` (training batches
of the current loader that reached a micro-step), ``next_rng``, ``boundary``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import rng
from . import loop_counters
from .loop_counters import Counters


@dataclass
class Boundary:
    """An optimizer-step boundary: what a checkpoint taken there (or in the window after
    it) records. ``rng`` / ``counters`` are None when not known yet (filled by the
    window's first micro-step)."""

    consumed: int
    rng: rng.Snapshot | None = None
    counters: Counters | None = None


class StepTracker:
    """Counts micro-steps, keeps the RNG between them and the last optimizer-step boundary.

    Example (what ``ZephonDataModule`` and its checkpoint hook do)::

        steps = StepTracker(restore_rng=True)
        steps.begin()                       # a new loader for a new fit
        steps.start(trainer)                # on_before_batch_transfer of a training batch
        steps.end(trainer)                  # on_train_batch_end
        point = steps.save_point(trainer)   # what a checkpoint records
    """

    def __init__(self, restore_rng: bool = True):
        self.restore_rng = restore_rng
        self.consumed = 0
        self.next_rng: rng.Snapshot | None = None
        self.boundary = Boundary(0)
        self._pending = Boundary(0)  # where the next fit starts (set by a resume)
        self._open = False  # a micro-step started and has not ended
        self._step_at_start = 0

    # -- fit start ----------------------------------------------------------------------
    def resume_at(self, state: dict[str, Any] | None, counters: Counters | None) -> None:
        """The next fit resumes a checkpoint holding this rank's RNG ``state`` (checkpoint
        form; None: not restored) and Lightning's loop ``counters``."""
        snap = rng.from_checkpoint(state) if state is not None and self.restore_rng else None
        self._pending = Boundary(0, snap, counters)

    def begin(self) -> None:
        """A new loader for a new fit: count from 0, from the resumed boundary if any."""
        pending, self._pending = self._pending, Boundary(0)
        self.consumed = 0
        self.boundary = pending
        self.next_rng = pending.rng
        self._open = False

    def rebase(self) -> None:
        """The loader was re-created within the fit, from the batches consumed so far."""
        if self._open:
            self._open = False  # no training step runs across a loader change
        self.boundary.consumed -= self.consumed
        self.consumed = 0

    # -- micro-steps ----------------------------------------------------------------------
    def start(self, trainer: Any) -> None:
        """A training batch is about to reach the LightningModule."""
        if self._open:  # the last one ended without on_train_batch_end (skipped epoch)
            self.end(trainer)
        if self.restore_rng:
            if self.next_rng is not None:
                rng.reinstate(self.next_rng)
            else:
                self.next_rng = rng.snapshot()  # a fresh fit's first step draws from here
        b = self.boundary
        if self.consumed == b.consumed:  # this micro-step opens a window
            if b.rng is None:
                b.rng = self.next_rng
            if b.counters is None:
                b.counters = loop_counters.capture(trainer)
        self.consumed += 1
        self._open = True
        self._step_at_start = trainer.global_step

    def end(self, trainer: Any) -> None:
        """The micro-step's training work is done (idempotent)."""
        if not self._open:
            return
        self._open = False
        snap = rng.snapshot() if self.restore_rng else None
        self.next_rng = snap
        if trainer.global_step != self._step_at_start:  # it ended with an optimizer step
            self.boundary = Boundary(self.consumed, snap, loop_counters.capture(trainer))

    def save_point(self, trainer: Any) -> Boundary:
        """What a checkpoint taken now records: the last optimizer-step boundary. A save
        during a micro-step whose optimizer step already ran (a callback's
        ``on_train_batch_end`` before ours) ends that micro-step first."""
        if self._open and trainer is not None and trainer.global_step != self._step_at_start:
            self.end(trainer)
        return self.boundary

    @property
    def inside_window(self) -> bool:
        """Batches were consumed since the last optimizer-step boundary."""
        return self.consumed != self.boundary.consumed
