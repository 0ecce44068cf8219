"""Helpers for the Lightning integration tests.

Everything a ``ddp_spawn`` child has to unpickle (the model, the pipeline factory)
lives here, at module level: the test module itself is imported by pytest in
importlib mode and is not importable by name from a spawned process.
"""

from __future__ import annotations

import glob
import os
from typing import Any

import lightning.pytorch as pl
import torch
from helpers import PROSE, batch_digest, reference_pipeline, small_packed
from lightning.pytorch.callbacks import ModelCheckpoint

from zephon_core import Pipeline, StaticMixtureWorkSource
from zephon_integrations.lightning import ZephonDataModule

LANES = 4


def make_pipeline() -> Pipeline:
    """The pipeline factory handed to ZephonDataModule (picklable, unlike a lambda; the
    return annotation lets LightningCLI accept it as ``--data.pipeline=<import path>``)."""
    return reference_pipeline(lanes=LANES)


def make_remixed_pipeline() -> Pipeline:
    """``make_pipeline`` with the mixture's weights changed from 0.7/0.3 to 0.5/0.5."""
    return reference_pipeline(lanes=LANES, weights=(0.5, 0.5))


def make_finite_pipeline() -> Pipeline:
    """A finite stream of 37 small batches (12 documents read once, 2 lanes)."""
    src = StaticMixtureWorkSource({"prose": PROSE[:12]}, chunk_size=4, seed=3, num_epochs=1)
    return small_packed(Pipeline(src, canonical_replicas=2, seed=1))


fingerprint = batch_digest  # a digest of every tensor of a batch (keys in order)


_GLOBAL: list[str] = []


def global_stream(n: int) -> list[str]:
    """Fingerprints of the first ``n`` batches of the single-process global stream,
    read by iterating the pipeline directly (no DataLoader, no Lightning)."""
    if len(_GLOBAL) < n:
        pipe = make_pipeline()
        it = iter(pipe)
        _GLOBAL[:] = [fingerprint(next(it)) for _ in range(n)]
        pipe.close()
    return _GLOBAL[:n]


class Tiny(pl.LightningModule):
    """Embedding + mean loss. Records (global_step, fingerprint) of every batch its
    training_step sees; with ``record_dir`` also appends them to
    ``record_dir/rank{global_rank}.txt`` (ddp_spawn children do not send attributes back).
    """

    def __init__(
        self,
        record_dir: str | None = None,
        read_stepping_batches: bool = False,
        dropout: float = 0.0,
    ):
        super().__init__()
        self.emb = torch.nn.Embedding(256, 8)
        self.drop = torch.nn.Dropout(dropout)  # draws from the global torch RNG
        self.record_dir = record_dir
        self.read_stepping_batches = read_stepping_batches
        self.seen: list[tuple[int, str]] = []
        self.losses: list[float] = []
        self.val_batches = 0

    def training_step(self, batch, batch_idx):
        fp = fingerprint(batch)
        self.seen.append((self.global_step, fp))
        loss = self.drop(self.emb(batch["input_ids"].clamp(min=0, max=255))).mean()
        self.losses.append(float(loss))
        if self.record_dir is not None:
            path = os.path.join(self.record_dir, f"rank{self.global_rank}.txt")
            with open(path, "a") as fh:
                fh.write(f"{self.global_step} {batch_idx} {fp} {float(loss)!r}\n")
        return loss

    def validation_step(self, batch, batch_idx):
        self.val_batches += 1
        if self.record_dir is not None:
            path = os.path.join(self.record_dir, f"val_rank{self.global_rank}.txt")
            with open(path, "a") as fh:
                fh.write(f"{self.global_step} {batch_idx}\n")
        (x,) = batch
        return self.emb(x.clamp(min=0, max=255)).mean()

    def configure_optimizers(self):
        if self.read_stepping_batches:
            # a common pattern (LR schedulers); with a finite max_epochs it makes
            # Lightning build the train loader early, before it restores its loops
            assert self.trainer.estimated_stepping_batches > 0
        return torch.optim.SGD(self.parameters(), lr=0.1)


def small_val_loader():
    """A plain validation DataLoader (module-level so ddp_spawn can pickle it)."""
    data = torch.utils.data.TensorDataset(torch.arange(16))
    return torch.utils.data.DataLoader(data, batch_size=4)


def fit(
    *,
    max_steps: int,
    ckpt_dir: str,
    ckpt_path: str | None = None,
    num_workers: int = 0,
    accumulate: int = 1,
    every_n_train_steps: int = 5,
    val_check_interval: int | None = None,
    devices: int = 1,
    strategy: str = "auto",
    record_dir: str | None = None,
    logger: Any = False,
    dm_kwargs: dict | None = None,
    read_stepping_batches: bool = False,
    dropout: float = 0.0,
    dm_class: type | None = None,
    trainer_kwargs: dict | None = None,
    pipeline: Any = make_pipeline,
    checkpoint_kwargs: dict | None = None,
    seed: int | None = None,
    callbacks: tuple = (),
    model_class: type | None = None,
) -> tuple[Tiny, pl.Trainer, ZephonDataModule]:
    """One ``trainer.fit`` with a fresh Trainer, model and ZephonDataModule; ``seed``
    re-seeds the global RNGs first (a resumed fit given another seed than the run it
    resumes stands for a new process)."""
    if seed is not None:
        pl.seed_everything(seed, verbose=False)
    model = (model_class or Tiny)(
        record_dir=record_dir, read_stepping_batches=read_stepping_batches, dropout=dropout
    )
    kwargs = dict(dm_kwargs or {})
    if val_check_interval is not None:
        kwargs.setdefault("val_dataloader_fn", small_val_loader)
    dm = (dm_class or ZephonDataModule)(pipeline=pipeline, num_workers=num_workers, **kwargs)
    cb = ModelCheckpoint(
        **{
            "dirpath": ckpt_dir,
            "every_n_train_steps": every_n_train_steps,
            "save_top_k": -1,
            "save_last": True,
            **(checkpoint_kwargs or {}),
        }
    )
    trainer_kwargs = dict(trainer_kwargs or {})
    if val_check_interval is not None:
        trainer_kwargs.update(
            val_check_interval=val_check_interval,
            limit_val_batches=2,
            check_val_every_n_epoch=None,
            num_sanity_val_steps=0,
        )
    elif "val_dataloader_fn" in kwargs:  # validation at epoch ends
        trainer_kwargs.setdefault("limit_val_batches", 2)
        trainer_kwargs.setdefault("num_sanity_val_steps", 0)
    else:
        trainer_kwargs.setdefault("limit_val_batches", 0)
    trainer = pl.Trainer(
        max_steps=max_steps,
        callbacks=[cb, *callbacks],
        logger=logger,
        enable_progress_bar=False,
        enable_model_summary=False,
        accumulate_grad_batches=accumulate,
        accelerator="cpu",
        devices=devices,
        strategy=strategy,
        **trainer_kwargs,
    )
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)
    return model, trainer, dm


def step_checkpoint(ckpt_dir: str, step: int) -> str:
    """The ModelCheckpoint file written at ``global_step == step``."""
    found = glob.glob(os.path.join(ckpt_dir, f"*step={step}.ckpt"))
    assert len(found) == 1, (step, sorted(os.listdir(ckpt_dir)))
    return found[0]


def read_rank_records(record_dir: str, rank: int) -> list[tuple[int, int, str, float]]:
    """(global_step, batch_idx, batch fingerprint, loss) of every training step of a rank."""
    path = os.path.join(record_dir, f"rank{rank}.txt")
    out = []
    with open(path) as fh:
        for line in fh:
            step, idx, fp, loss = line.split()
            out.append((int(step), int(idx), fp, float(loss)))
    return out
