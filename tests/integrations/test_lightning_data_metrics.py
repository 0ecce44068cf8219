"""``ZephonDataModule`` logs its ``zephon/*`` metrics at the Trainer's
``log_every_n_steps`` (its own argument overrides it), to the Trainer's loggers: a
short fit with a CSVLogger has them in ``metrics.csv``."""

from __future__ import annotations

import csv

import pytest
from lightning.pytorch.loggers import CSVLogger
from lightning_helpers import fit


def _logged_steps(tmp_path, every: int, **dm_kwargs) -> list[int]:
    """The steps of ``metrics.csv`` rows that carry Zephon's data metrics."""
    logger = CSVLogger(str(tmp_path / "logs"), name="run", version=0)
    fit(
        max_steps=16,
        ckpt_dir=str(tmp_path / "ckpt"),
        every_n_train_steps=100,
        logger=logger,
        trainer_kwargs={"log_every_n_steps": every},
        dm_kwargs=dm_kwargs,
    )
    path = tmp_path / "logs" / "run" / "version_0" / "metrics.csv"
    if not path.exists():  # nothing was logged at all
        return []
    with open(path) as fh:
        rows = list(csv.DictReader(fh))
    return [
        int(row["step"])
        for row in rows
        if row.get("zephon/token_share/prose") and 0 < float(row["zephon/token_share/prose"])
    ]


def test_metrics_follow_the_trainers_log_every_n_steps(tmp_path):
    assert _logged_steps(tmp_path, every=1) == list(range(16))


@pytest.mark.parametrize(("override", "steps"), [(4, [3, 7, 11, 15]), (0, [])])
def test_the_datamodules_own_setting_overrides_it(tmp_path, override, steps):
    assert _logged_steps(tmp_path, every=1, log_every_n_steps=override) == steps
