"""LightningCLI configures ZephonDataModule from typed init args (a factory by import path)."""

from __future__ import annotations

import pytest
from lightning.pytorch.cli import LightningCLI
from lightning_helpers import Tiny, fit, global_stream, step_checkpoint

from zephon_integrations.lightning import ZephonDataModule

# trains models in this process for many seconds per test: `make test-fast` leaves
# them to `make test`
pytestmark = pytest.mark.slow


def test_cli_builds_the_datamodule_from_a_factory_import_path(tmp_path):
    cli = LightningCLI(
        Tiny,
        ZephonDataModule,
        run=False,
        args=[
            "--data.pipeline=lightning_helpers.make_pipeline",
            "--data.num_workers=0",
            "--data.log_every_n_steps=0",
            "--trainer.max_steps=4",
            "--trainer.logger=false",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
            "--trainer.enable_checkpointing=false",
            f"--trainer.default_root_dir={tmp_path}",
        ],
    )
    assert isinstance(cli.datamodule, ZephonDataModule)
    assert cli.datamodule.num_workers == 0
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert [fp for _, fp in cli.model.seen] == global_stream(4)
    state = cli.datamodule.state_dict()["zephon"]
    assert state["position"] == 4 and len(state["lanes"]) == 4


def test_cli_passes_allow_changes_to_a_re_mixing_resume(tmp_path):
    """``--data.allow_changes=[weights]``: a typed init arg, so a CLI job can resume a
    checkpoint saved with weights 0.7/0.3 under a 0.5/0.5 factory."""
    fit(max_steps=3, ckpt_dir=str(tmp_path / "a"), every_n_train_steps=3)
    cli = LightningCLI(
        Tiny,
        ZephonDataModule,
        run=False,
        args=[
            "--data.pipeline=lightning_helpers.make_remixed_pipeline",
            "--data.allow_changes=[weights]",
            "--data.log_every_n_steps=0",
            "--trainer.max_steps=5",
            "--trainer.logger=false",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
            "--trainer.enable_checkpointing=false",
            f"--trainer.default_root_dir={tmp_path}",
        ],
    )
    assert set(cli.datamodule.allow_changes) == {"weights"}
    cli.trainer.fit(
        cli.model, datamodule=cli.datamodule, ckpt_path=step_checkpoint(str(tmp_path / "a"), 3)
    )
    assert [s for s, _ in cli.model.seen] == [3, 4]
