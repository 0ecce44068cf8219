"""Which global output positions a trainer step consumed (``zephon trace``).

The state's position counts *outputs*: one output is one Zephon batch, i.e. one
micro-batch of one data-parallel rank (``per_device_train_batch_size`` a multiple of the
pipeline's ``batch_size`` makes it several). Every micro-step, the ``D`` ranks consume
the next ``D x m`` outputs together (``m`` outputs per rank's micro-batch): rank ``r``
the ``m`` starting at ``g + r x m`` (``distributed/topology.py``: rank ``r`` at ``g0``
owns the positions ``(g - g0) mod D == r`` when ``m == 1``; accelerate's dispatcher
hands rank ``r`` the ``r``-th slice of what rank 0 read). An optimizer step with ``A``
accumulation micro-steps consumes ``K = A x D x m`` outputs, and the integrations save,
at a checkpoint of optimizer step ``S`` (HF ``checkpoint-S/``, a Lightning ``.ckpt``
with ``global_step == S``), the state after exactly ``S x K`` outputs of their run:
``ZephonCallback``/``ZephonTrainer`` compute it from ``global_step`` x GAS x outputs per
micro-step, ``ZephonDataModule`` records the last optimizer-step boundary
(``zephon_integrations/lightning/steps.py``).

So step ``N`` (0-based: the step the trainer runs while its ``global_step`` is ``N``;
Lightning's ``self.global_step`` inside ``training_step`` and the step its loggers
record; HF's ``log_history`` records that step's loss as step ``N + 1``, logged after
the increment) is the ``K`` outputs starting at ``P + (N - S) x K`` for a checkpoint at
step ``S`` and position ``P``; for a bare state file (no step recorded) ``S = 0`` at
``P = 0`` -- the run started at the stream's beginning.

Skipped outputs (issue 22, item 3) are produced but handed to no trainer, so the
``k``-th output a trainer consumed after a position is the ``k``-th position not skipped:
:func:`handed_positions` walks the ranges :func:`skipped_ranges` returns.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError

__all__ = ["MicroBatch", "StepLayout", "handed_positions", "layout", "skipped_ranges"]


def skipped_ranges(state: dict[str, Any]) -> list[tuple[int, int]]:
    """The global positions ``[start, end)`` the restored ``state`` skips (hands to no
    trainer), sorted and disjoint: what it records (``checkpoint/data_changes.py``). The
    one place ``zephon trace`` learns them."""
    from ..checkpoint.data_changes import skipped_ranges as recorded

    return [(int(a), int(b)) for a, b in recorded(state)]


@dataclass(frozen=True)
class StepLayout:
    """How a trainer step is cut into outputs: ``accum`` micro-steps of ``dp`` ranks,
    each rank's micro-batch ``per_micro`` outputs. ``trainer`` False: a step is one
    output (``--step`` is a global output position)."""

    accum: int = 1
    dp: int = 1
    per_micro: int = 1
    trainer: bool = False

    @property
    def per_step(self) -> int:
        """Outputs one optimizer step consumes (``K``)."""
        return self.accum * self.dp * self.per_micro

    def place(self, index: int) -> tuple[int, int]:
        """(micro-step, dp rank) of the ``index``-th output of a step."""
        micro, within = divmod(index, self.dp * self.per_micro)
        return micro, within // self.per_micro


def layout(
    batch_size: int, global_batch: int | None, accum: int | None, dp: int | None
) -> StepLayout:
    """The layout the trace options describe; ``batch_size`` is the pipeline's rows per
    output.

    Raises:
        ConfigError: the options do not fit together (named with the fix).
    """
    if global_batch is None and accum is None and dp is None:
        return StepLayout()
    a, d = accum or 1, dp or 1
    for name, value in (("--accum", a), ("--dp", d), ("--global-batch", global_batch)):
        if value is not None and value < 1:
            raise ConfigError(f"{name} {value}: must be >= 1")
    if global_batch is None:
        return StepLayout(a, d, 1, True)
    if global_batch % (batch_size * a * d):
        raise ConfigError(
            f"--global-batch {global_batch} is not a multiple of the pipeline's batch_size "
            f"{batch_size} x --accum {a} x --dp {d}: give the rows of one optimizer step "
            "(per-device batch x accumulation x data-parallel ranks)"
        )
    return StepLayout(a, d, global_batch // (batch_size * a * d), True)


def handed_positions(start: int, count: int, skipped: Sequence[tuple[int, int]]) -> list[int]:
    """The positions of the ``count`` outputs a trainer consumed from ``start`` on (the
    outputs in ``skipped`` ranges are produced but not handed out)."""
    out: list[int] = []
    p = start
    for lo, hi in skipped:
        if hi <= p:
            continue
        while p < lo and len(out) < count:
            out.append(p)
            p += 1
        if len(out) == count:
            return out
        p = max(p, hi)
    out.extend(range(p, p + count - len(out)))
    return out


@dataclass(frozen=True)
class MicroBatch:
    """One output a step consumed: its position, micro-step and dp rank."""

    step: int
    position: int
    micro_step: int
    rank: int


def step_outputs(
    lay: StepLayout,
    anchor: tuple[int, int],
    first: int,
    last: int,
    skipped: Sequence[tuple[int, int]],
) -> Iterator[MicroBatch]:
    """The outputs of steps ``first .. last`` (inclusive) with ``anchor = (step S,
    position P)``; ``first >= S`` (the caller checked)."""
    step0, pos0 = anchor
    k = lay.per_step
    # the handed outputs before `first`, then those of the range
    before = (first - step0) * k
    positions = handed_positions(pos0, before + (last - first + 1) * k, skipped)[before:]
    for i, p in enumerate(positions):
        micro, rank = lay.place(i % k)
        yield MicroBatch(first + i // k, p, micro, rank)
