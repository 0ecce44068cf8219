"""A finite Zephon stream ends the Lightning fit.

``ZephonDataModule`` serves one stream per fit: a Lightning epoch is a stretch of it
(``limit_train_batches`` long, or until the stream ends) and the next epoch continues
where the last one stopped -- nothing is read twice; repeating data is the source's job
(``StaticMixtureWorkSource(num_epochs=...)``). So once a finite stream has ended, no
later epoch has a batch, and Lightning -- which starts epochs until ``max_steps`` or
``max_epochs`` -- would run empty epochs forever (``max_steps`` beyond the stream, no
``max_epochs``) or silently (``max_epochs=2``). At the end of the epoch in which the
stream ended, :func:`stop_if_ended` sets ``trainer.should_stop`` and logs one WARNING
(INFO when the fit was about to end anyway); if ``min_steps`` / ``min_epochs`` forbid
stopping it raises :class:`~zephon_core.ConfigError` instead of looping.
"""

from __future__ import annotations

import logging
from typing import Any

from zephon_core import ConfigError

log = logging.getLogger(__name__)


def stop_if_ended(trainer: Any, loader: Any) -> None:
    """Called at every training epoch end; ``loader`` is the module's ZephonDataLoader."""
    if loader is None or not getattr(loader, "ended", False):
        return
    fit = trainer.fit_loop
    step, epochs_done = trainer.global_step, trainer.current_epoch + 1
    unmet = []
    if fit.min_steps and step < fit.min_steps:
        unmet.append(f"min_steps={fit.min_steps}")
    if fit.min_epochs and epochs_done < fit.min_epochs:
        unmet.append(f"min_epochs={fit.min_epochs}")
    if unmet:
        raise ConfigError(
            f"the Zephon data stream ended at global_step {step} (epoch {epochs_done - 1}), "
            f"but Trainer({', '.join(unmet)}) does not let the fit stop there, and every "
            "later epoch would be empty (a ZephonDataModule continues one stream across "
            "epochs, it does not re-read it). Lower them, or let the source repeat its "
            "data (StaticMixtureWorkSource(num_epochs=...))"
        )
    trainer.should_stop = True
    if not trainer.is_global_zero:
        return
    if fit.max_steps not in (None, -1) and step < fit.max_steps:
        wanted = f"max_steps={fit.max_steps}"
    elif fit.max_epochs in (None, -1):
        wanted = "the next epoch (max_epochs=-1)"
    elif epochs_done < fit.max_epochs:
        wanted = f"max_epochs={fit.max_epochs}"
    else:
        wanted = ""
    if wanted:
        log.warning(
            "the Zephon data stream ended at global_step %d (epoch %d): ending the fit "
            "before %s. A ZephonDataModule continues one stream across Lightning epochs "
            "rather than re-reading it, so no later epoch has data; to train longer, let "
            "the source repeat its data (StaticMixtureWorkSource(num_epochs=...))",
            step,
            epochs_done - 1,
            wanted,
        )
    else:
        log.info("the Zephon data stream ended at global_step %d, with the fit", step)
