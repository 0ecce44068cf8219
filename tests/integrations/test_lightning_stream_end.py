"""A finite Zephon stream ends the Lightning fit (``lightning/stream_end.py``)."""

from __future__ import annotations

import logging

import lightning.pytorch as pl
import pytest
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning_helpers import fingerprint, fit, make_finite_pipeline, step_checkpoint

from zephon_core import ConfigError

# trains models in this process for many seconds per test: `make test-fast` leaves
# them to `make test`
pytestmark = pytest.mark.slow

STREAM_END = "zephon_integrations.lightning.stream_end"


class EpochGuard(pl.Callback):
    """Fails a fit that keeps starting epochs (instead of letting it spin forever)."""

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if trainer.current_epoch >= 3:
            raise AssertionError(f"epoch {trainer.current_epoch} at step {trainer.global_step}")


def _finite_stream() -> list[str]:
    pipe = make_finite_pipeline()
    try:
        return [fingerprint(b) for b in pipe]
    finally:
        pipe.close()


def _ended(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == STREAM_END and r.levelno == logging.WARNING
    ]


@pytest.mark.parametrize(
    "limits",
    [{"max_steps": 1000}, {"max_steps": -1, "trainer_kwargs": {"max_epochs": 2}}],
    ids=["max_steps-beyond", "max_epochs-2"],
)
def test_a_finite_stream_ends_the_fit_with_one_warning(tmp_path, caplog, limits):
    stream = _finite_stream()
    n = len(stream)
    caplog.set_level(logging.WARNING, logger=STREAM_END)
    at_end = ModelCheckpoint(tmp_path / "end", every_n_epochs=1, save_on_train_epoch_end=True)
    kw = dict(
        pipeline=make_finite_pipeline, every_n_train_steps=10, callbacks=(EpochGuard(), at_end)
    )
    model, trainer, _ = fit(ckpt_dir=str(tmp_path / "a"), **kw, **limits)
    assert [fp for _, fp in model.seen] == stream  # one pass, nothing repeated
    assert trainer.global_step == n and trainer.current_epoch == 1
    assert (
        _ended(caplog) == [_ended(caplog)[0]] and f"ended at global_step {n} " in _ended(caplog)[0]
    )
    if "trainer_kwargs" in limits:
        return
    # resumed near the end (step 30) or at the end (saved at the epoch end): the rest of
    # the stream, then the same end
    for ckpt, start in [
        (step_checkpoint(str(tmp_path / "a"), 30), 30),
        (step_checkpoint(str(tmp_path / "end"), n), n),
    ]:
        caplog.clear()
        again, trainer, _ = fit(
            ckpt_dir=str(tmp_path / f"r{start}"), ckpt_path=ckpt, **kw, **limits
        )
        assert again.seen == model.seen[start:] and trainer.global_step == n
        assert len(_ended(caplog)) == 1 and f"ended at global_step {n} " in _ended(caplog)[0]


def test_a_finite_stream_shorter_than_min_steps_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="min_steps=100"):
        fit(
            max_steps=1000,
            ckpt_dir=str(tmp_path / "a"),
            pipeline=make_finite_pipeline,
            callbacks=(EpochGuard(),),
            trainer_kwargs={"min_steps": 100},
        )
