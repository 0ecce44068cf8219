"""Trainer options that do not apply to a Zephon stream are named in one WARNING.

transformers ignores a sampler strategy, a ``_get_train_sampler`` override, ``data_seed``
and ``dataloader_drop_last`` for an IterableDataset with at most an INFO line, and the
callback takes over the DataLoader workers; ``dataloader_prefetch_factor`` follows the
workers into Zephon's loader.
"""

from __future__ import annotations

import logging

import pytest
from hf_helpers import make_pipeline, tiny_model, zephon_warnings
from transformers import Trainer, TrainerCallback, TrainingArguments

from zephon_integrations.hf import ZephonCallback, ZephonTrainer

logging.getLogger("transformers").setLevel(logging.ERROR)

IGNORED = dict(
    train_sampling_strategy="group_by_length",
    data_seed=3,
    dataloader_drop_last=True,
    dataloader_persistent_workers=True,
    dataloader_in_order=False,
)


class SamplerTrainer(Trainer):
    def _get_train_sampler(self, train_dataset=None):
        return None


class SamplerZephonTrainer(ZephonTrainer):
    def _get_train_sampler(self, train_dataset=None):
        return None


def build(path: str, out, trainer_cls=None, **options):
    args = TrainingArguments(
        output_dir=str(out), max_steps=1, per_device_train_batch_size=4, save_strategy="no",
        report_to=[], use_cpu=True, disable_tqdm=True, **options,
    )  # fmt: skip
    if path == "trainer":
        cls = trainer_cls or ZephonTrainer
        return cls(model=tiny_model(), args=args, pipeline=make_pipeline)
    zephon = ZephonCallback(make_pipeline)
    return (trainer_cls or Trainer)(
        model=tiny_model(), args=args, train_dataset=zephon.train_dataset,
        callbacks=[zephon],
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("path", ["callback", "trainer"])
def test_each_ignored_option_is_named_once(tmp_path, caplog, path):
    caplog.set_level(logging.WARNING, logger="zephon_integrations")
    build(path, tmp_path / "plain", dataloader_num_workers=2, dataloader_prefetch_factor=4)
    assert zephon_warnings(caplog) == []  # the defaults, and options Zephon applies
    cls = SamplerTrainer if path == "callback" else SamplerZephonTrainer
    build(path, tmp_path / "a", cls, dataloader_num_workers=2, **IGNORED)
    [warning] = zephon_warnings(caplog)
    who = "ZephonTrainer" if path == "trainer" else "ZephonCallback"
    assert warning.startswith(f"{who}: these Trainer options have no effect on the Zephon")
    for name in (*IGNORED, f"{cls.__name__}._get_train_sampler"):
        assert name in warning


class PrefetchSeen(TrainerCallback):
    """The ``prefetch_factor`` of the Zephon loader feeding ``trainer``, at every step."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.seen: list[int] = []

    def on_step_end(self, args, state, control, **kwargs):
        zephon = [
            c for c in self.trainer.callback_handler.callbacks if isinstance(c, ZephonCallback)
        ]
        loader = zephon[0].loader if zephon else self.trainer.zephon_loader
        self.seen.append(loader.prefetch_factor)


@pytest.mark.slow
@pytest.mark.parametrize("path", ["callback", "trainer"])
def test_prefetch_factor_reaches_zephons_workers(tmp_path, path):
    trainer = build(path, tmp_path / "a", dataloader_num_workers=2, dataloader_prefetch_factor=4)
    seen = PrefetchSeen(trainer)
    trainer.add_callback(seen)
    trainer.train()
    assert seen.seen == [4]
