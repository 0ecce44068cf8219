"""LightningCLI configures ZephonDataModule from typed init args (a factory by import path)."""

from __future__ import annotations

from lightning.pytorch.cli import LightningCLI
from lightning_helpers import Tiny, global_stream

from zephon_integrations.lightning import ZephonDataModule


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
