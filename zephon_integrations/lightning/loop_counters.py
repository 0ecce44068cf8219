"""Lightning's fit-loop progress counters at an optimizer-step boundary.

A checkpoint taken inside a gradient-accumulation window holds no partial gradient, so
it can only resume exactly from the window's start. :mod:`.steps` records the data
position and RNG there; this module records Lightning's own counters there (batches
ready/started/processed/completed in the epoch and in total, epochs, optimizer and
scheduler steps, validation batches, ``_batches_that_stepped``) and writes them into
the checkpoint, so the checkpoint is the one Lightning would have written in the
boundary's ``on_train_batch_end`` -- a case Lightning's own resume handles -- and the
resumed fit's accumulation windows line up with the uninterrupted run's.

Reading the counters costs a few microseconds (their ``state_dict()`` goes through
``dataclasses.asdict`` and costs ten times more); :func:`capture` runs once per
optimizer step.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, is_dataclass
from typing import Any

from zephon_core import ConfigError

# checkpoint["loops"]["fit_loop"] key -> attribute path from trainer.fit_loop (Lightning 2.x)
_PROGRESS = {
    "epoch_progress": ("epoch_progress",),
    "epoch_loop.batch_progress": ("epoch_loop", "batch_progress"),
    "epoch_loop.scheduler_progress": ("epoch_loop", "scheduler_progress"),
    "epoch_loop.automatic_optimization.optim_progress": (
        "epoch_loop",
        "automatic_optimization",
        "optim_progress",
    ),
    "epoch_loop.manual_optimization.optim_step_progress": (
        "epoch_loop",
        "manual_optimization",
        "optim_step_progress",
    ),
    "epoch_loop.val_loop.batch_progress": ("epoch_loop", "val_loop", "batch_progress"),
}
_EPOCH_LOOP_STATE = "epoch_loop.state_dict"  # {"_batches_that_stepped": n}
KEYS = (*_PROGRESS, _EPOCH_LOOP_STATE)


@dataclass(frozen=True)
class Counters:
    """The fit loop's counters (``checkpoint["loops"]["fit_loop"]`` entries) and epoch."""

    values: dict[str, Any]
    epoch: int | None


def capture(trainer: Any) -> Counters:
    """The counters now, as the fit loop's ``state_dict()`` would give them."""
    fit = trainer.fit_loop
    values: dict[str, Any] = {}
    try:
        for key, path in _PROGRESS.items():
            obj = fit
            for name in path:
                obj = getattr(obj, name)
            values[key] = _plain(obj)
        values[_EPOCH_LOOP_STATE] = dict(fit.epoch_loop.on_save_checkpoint())
    except AttributeError as e:
        raise _unknown_layout(f"its fit loop has no {e.name!r}") from e
    return Counters(values, trainer.current_epoch)


def from_checkpoint(checkpoint: dict[str, Any]) -> Counters | None:
    """The counters a Lightning checkpoint holds (None: it holds no fit-loop state)."""
    fit = checkpoint.get("loops", {}).get("fit_loop")
    if not isinstance(fit, dict):
        return None
    values = {key: copy.deepcopy(fit[key]) for key in KEYS if key in fit}
    return Counters(values, checkpoint.get("epoch"))


def write(checkpoint: dict[str, Any], counters: Counters) -> None:
    """Put ``counters`` into the checkpoint being saved, in place of the current ones."""
    fit = checkpoint.get("loops", {}).get("fit_loop")
    if not isinstance(fit, dict):
        return
    missing = sorted(set(counters.values) - set(fit))
    if missing:  # a renamed key: the checkpoint would keep the counters inside the window
        raise _unknown_layout(f"its checkpoint has no fit_loop keys {missing}")
    for key, value in counters.values.items():
        if key == _EPOCH_LOOP_STATE:
            fit[key] = {**fit.get(key, {}), **value}
        else:
            fit[key] = copy.deepcopy(value)
    if counters.epoch is not None:
        checkpoint["epoch"] = counters.epoch


def _plain(obj: Any) -> Any:
    """``dataclasses.asdict`` for Lightning's progress dataclasses, without its cost."""
    return {k: _plain(v) if is_dataclass(v) else v for k, v in vars(obj).items()}


def _unknown_layout(what: str) -> ConfigError:
    import lightning

    return ConfigError(
        f"Lightning {lightning.__version__} keeps its loop progress differently ({what}), "
        "so ZephonDataModule cannot write a checkpoint inside a gradient-accumulation "
        "window as of the window's start. Use the Lightning version Zephon was tested "
        "with (2.6), or save only at optimizer-step boundaries"
    )
