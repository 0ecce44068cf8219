"""The RNG between Lightning training steps and the optimizer-step boundary a checkpoint
records (``zephon_integrations/lightning/steps.py``, ``loop_counters.py``).

Every fit uses dropout 0.5, so a loss is bit-identical only if its step drew the same
random numbers. A resumed fit runs in a fresh Trainer, model and datamodule, with the
global RNGs re-seeded differently from the run it resumes (as a new process would).
"""

from __future__ import annotations

import logging

import pytest
import torch
from lightning_helpers import Tiny, fit, global_stream, small_val_loader, step_checkpoint

# trains models in this process for many seconds per test: `make test-fast` leaves
# them to `make test`
pytestmark = pytest.mark.slow

DROP = 0.5


def _zephon(ckpt: str) -> dict:
    return torch.load(ckpt, map_location="cpu", weights_only=False)["zephon"]


def test_the_uninterrupted_run_does_not_depend_on_the_checkpoint_schedule(tmp_path):
    """Saving every 2 or every 3 steps, with validation between steps (whose loader draws
    from the global torch RNG) or without: the same dropout draws, the same losses. A
    resume from a checkpoint of either schedule continues them bit for bit."""
    runs = {}
    for name, every, val in [("every3", 3, None), ("every3-val", 3, 2), ("every2-val", 2, 2)]:
        runs[name] = fit(
            max_steps=8,
            ckpt_dir=str(tmp_path / name),
            every_n_train_steps=every,
            val_check_interval=val,
            dropout=DROP,
            seed=1,
        )[0]
    base = runs["every3"]
    assert base.seen == list(enumerate(global_stream(8)))
    for name, model in runs.items():
        assert model.losses == base.losses, f"{name}: the save schedule changed training"
    assert runs["every3-val"].val_batches > 0
    for name, step in [("every3-val", 3), ("every2-val", 4)]:
        tail, _, _ = fit(
            max_steps=8,
            ckpt_dir=str(tmp_path / f"{name}-resumed"),
            ckpt_path=step_checkpoint(str(tmp_path / name), step),
            val_check_interval=2,
            dropout=DROP,
            seed=99,
        )
        assert tail.seen == base.seen[step:], name
        assert tail.losses == base.losses[step:], name


def test_an_epoch_end_resave_before_the_first_resumed_step_keeps_the_restored_rng(tmp_path):
    """ModelCheckpoint(every_n_epochs=1, save_on_train_epoch_end=True), validation at each
    epoch end, epochs of 4 batches and max_steps: the resumed fit re-runs the epoch end it
    was saved at and saves again before its first step. That save holds the RNG restored
    from the checkpoint (not the resumed process's), and the losses match."""
    kw = dict(
        max_steps=12,
        every_n_train_steps=None,
        dropout=DROP,
        dm_kwargs={"val_dataloader_fn": small_val_loader},
        checkpoint_kwargs={"every_n_epochs": 1, "save_on_train_epoch_end": True},
        trainer_kwargs={"limit_train_batches": 4},
    )
    full, trainer, _ = fit(ckpt_dir=str(tmp_path / "a"), seed=1, **kw)
    # one stream across epochs: epoch e continues where epoch e-1 stopped
    assert trainer.current_epoch == 3 and full.val_batches > 0
    assert full.seen == list(enumerate(global_stream(12)))
    saved = step_checkpoint(str(tmp_path / "a"), 4)
    tail, _, _ = fit(ckpt_dir=str(tmp_path / "b"), ckpt_path=saved, seed=2, **kw)
    resaved = step_checkpoint(str(tmp_path / "b"), 4)  # written before the first step
    assert torch.equal(_zephon(resaved)["rng"][0]["torch"], _zephon(saved)["rng"][0]["torch"])
    assert _zephon(resaved)["state"]["position"] == 4
    assert tail.seen == full.seen[4:]
    assert tail.losses == full.losses[4:]


def test_a_checkpoint_inside_an_accumulation_window_resumes_at_its_start(tmp_path):
    """accumulate_grad_batches=4, a save every 2 optimizer steps. A fit resumed from
    step 2 saves ``step=2`` again after the first micro-batch of step 3 (ModelCheckpoint
    does not know it saved step 2). That checkpoint records batch 8, the window's start,
    and Lightning's counters there: resuming from it redoes the window, exactly."""
    kw = dict(max_steps=5, accumulate=4, every_n_train_steps=2, dropout=DROP)
    full, _, _ = fit(ckpt_dir=str(tmp_path / "a"), seed=1, **kw)
    assert [s for s, _ in full.seen] == [i // 4 for i in range(20)]
    fit(
        ckpt_dir=str(tmp_path / "b"),
        ckpt_path=step_checkpoint(str(tmp_path / "a"), 2),
        seed=2,
        **kw,
    )
    inside = step_checkpoint(str(tmp_path / "b"), 2)  # only the re-save writes it in b
    assert _zephon(inside)["state"]["position"] == 8
    third, _, _ = fit(ckpt_dir=str(tmp_path / "c"), ckpt_path=inside, seed=3, **kw)
    assert third.seen == full.seen[8:]
    assert third.losses == full.losses[8:]


class NormedTiny(Tiny):
    """Tiny with a BatchNorm, whose running statistics every training forward updates."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.norm = torch.nn.BatchNorm1d(8)

    def training_step(self, batch, batch_idx):
        self.seen.append((self.global_step, ""))
        return self.norm(self.emb(batch["input_ids"].clamp(0, 255)).flatten(0, 1)).mean()


def test_a_checkpoint_inside_a_window_warns_about_batchnorm_statistics(tmp_path, caplog):
    """The one thing a redone window cannot repeat exactly: running statistics the
    skipped-back forward passes already updated (saved at validation end, batch 3 of
    accumulation windows of 2)."""
    caplog.set_level(logging.WARNING, logger="zephon_integrations.lightning.checkpoint_hook")
    kw = dict(accumulate=2, val_check_interval=3, every_n_train_steps=None)
    fit(max_steps=4, ckpt_dir=str(tmp_path / "a"), model_class=NormedTiny, **kw)
    warned = [r.getMessage() for r in caplog.records if "BatchNorm" in r.getMessage()]
    assert len(warned) == 1 and "global_step 1" in warned[0], warned
    caplog.clear()
    fit(max_steps=4, ckpt_dir=str(tmp_path / "b"), **kw)  # no BatchNorm: nothing to say
    assert not [r for r in caplog.records if "BatchNorm" in r.getMessage()]


def test_loop_counters_read_as_lightnings_own_state_dict(tmp_path):
    """``loop_counters.capture`` reads the counters without ``dataclasses.asdict``; it
    must give what Lightning writes into a checkpoint."""
    from zephon_core import ConfigError
    from zephon_integrations.lightning import loop_counters  # (new module: imported here)

    _, trainer, _ = fit(max_steps=3, ckpt_dir=str(tmp_path / "a"), accumulate=2)
    fit_state = trainer.fit_loop.state_dict()
    counters = loop_counters.capture(trainer)
    assert set(counters.values) == set(loop_counters.KEYS)
    for key, value in counters.values.items():
        assert value == fit_state[key], key
    # a Lightning whose checkpoint lacks one of those keys (a rename) is refused loudly:
    # writing the others would keep the counters from inside the window
    kept = {k: v for k, v in fit_state.items() if k != loop_counters.KEYS[0]}
    renamed = {"loops": {"fit_loop": kept}}
    with pytest.raises(ConfigError, match="keeps its loop progress differently"):
        loop_counters.write(renamed, counters)
