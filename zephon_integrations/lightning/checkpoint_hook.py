"""Where a Lightning checkpoint keeps Zephon's state, and the checks on resume.

Lightning stores a datamodule's ``state_dict()`` under the class's qualified name and
silently skips it when the name differs on resume (a subclass renamed between runs),
and a checkpoint written without ``ZephonDataModule`` has no state at all: either way
the data would restart from its first batch with no warning. So
:class:`ZephonCheckpointHook`, a callback the datamodule installs in ``setup()``:

* on save, moves the datamodule's entry to the fixed top-level key ``"zephon"``
  (``{"state": pipeline state, "rng": [per-rank RNG states]}``), gathering every
  rank's RNG state to rank 0, which is the rank whose dict Lightning writes. The next
  training step starts from that RNG state in this run as in a run resumed from the
  checkpoint, so what draws between a save and the next step (a validation loader
  creating its iterator, say) cannot make the two differ;
* on load, finds the state under ``"zephon"`` -- or, for checkpoints of earlier
  releases, under any top-level entry holding ``{"zephon": <pipeline state>}`` -- and
  hands it to the datamodule; a resumed ``fit`` (``global_step > 0``) whose checkpoint
  holds none raises :class:`~zephon_core.MissingCheckpointState`, unless the datamodule
  was built with ``allow_fresh_start=True``;
* at fit start (after the LightningModule's ``setup`` and ``configure_model``, where
  large models are built) has the datamodule turn the KV cache off for packed rows, and
  back on when fit ends or fails (``zephon_integrations/packed_cache.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import lightning.pytorch as pl

from zephon_core import MissingCheckpointState
from zephon_core.checkpoint.trainer_files import (
    LIGHTNING_KEY,
    legacy_lightning_state,
    lightning_entry,
)

from .. import rng

if TYPE_CHECKING:
    from .datamodule import ZephonDataModule

CHECKPOINT_KEY = LIGHTNING_KEY


class ZephonCheckpointHook(pl.Callback):
    """Installed by :class:`ZephonDataModule`; not meant to be added by hand."""

    def __init__(self, datamodule: ZephonDataModule):
        self.datamodule = datamodule

    def on_fit_start(self, trainer: pl.Trainer, pl_module: Any) -> None:
        # after every setup hook and configure_model(): models built there exist now
        self.datamodule._turn_cache_off(pl_module)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        self.datamodule._restore_cache()

    def on_exception(self, trainer: pl.Trainer, pl_module: Any, exception: BaseException) -> None:
        self.datamodule._restore_cache()

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: Any, checkpoint: dict[str, Any]
    ) -> None:
        dm = self.datamodule
        entry = checkpoint.pop(type(dm).__qualname__, None)  # Lightning keyed it by class
        state = entry[dm.STATE_KEY] if entry else dm.state_dict()[dm.STATE_KEY]
        mine = rng.capture()
        checkpoint[CHECKPOINT_KEY] = {"state": state, "rng": _gather(mine, trainer.world_size)}
        dm._pin_rng(mine)

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: Any, checkpoint: dict[str, Any]
    ) -> None:
        dm = self.datamodule
        entry = lightning_entry(checkpoint)
        if entry is not None:
            dm.load_state_dict({dm.STATE_KEY: entry["state"]})
            dm._resume_rng(entry.get("rng"), trainer)
            return
        legacy = legacy_lightning_state(checkpoint)
        if legacy is not None:
            dm.load_state_dict({dm.STATE_KEY: legacy})
            return
        fitting = trainer.state.fn == "fit"
        if fitting and checkpoint.get("global_step", 0) > 0 and not dm.allow_fresh_start:
            raise MissingCheckpointState(
                f"trainer.fit(ckpt_path={trainer.ckpt_path!r}) resumes at step "
                f"{checkpoint.get('global_step')}, but the checkpoint holds no Zephon state "
                "(it was not written by a ZephonDataModule), so the data would silently "
                "restart from the first batch. Resume from a checkpoint written with "
                "ZephonDataModule, or pass ZephonDataModule(..., allow_fresh_start=True) to "
                "start the data stream from its beginning on purpose"
            )


def _gather(state: dict[str, Any], world_size: int) -> list[dict[str, Any]]:
    """Every rank's RNG state, in rank order (one collective; all ranks save together)."""
    if world_size <= 1:
        return [state]
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [state]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, state)
    return out
