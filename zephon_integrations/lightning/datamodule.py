"""ZephonDataModule: exact resume of a Zephon pipeline under Lightning's ``ckpt_path``.

What it takes care of (Lightning 2.x traps, see SPEC §8):

* Lightning's fetcher reads one batch ahead for loaders without ``len()``, so at
  checkpoint time the loader has already produced the next batch. The module counts
  the training batches that reach ``on_before_batch_transfer`` (called right before
  each ``training_step``) and saves the state right after the last of them
  (``Pipeline.checkpoint(served=n)``).
* ``state_dict()`` runs on every rank (Lightning dumps the checkpoint on all ranks but
  persists rank 0's dict), so it is where the aggregation round happens; it never
  returns an empty dict, which Lightning would drop.
* The module restores its own state (``load_state_dict`` runs after ``setup()`` and
  before ``train_dataloader()``), independent of Lightning's loader-state restore,
  which some configurations skip.
* ``train_dataloader()`` serves this rank's lanes (no DistributedSampler).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch

from zephon_core import ConfigError, Pipeline

STATE_KEY = "zephon"


class ZephonDataModule(pl.LightningDataModule):
    """A LightningDataModule serving a Zephon pipeline.

    Example::

        dm = ZephonDataModule(pipeline=build_pipeline, num_workers=2)
        trainer = L.Trainer(max_steps=1000, callbacks=[ModelCheckpoint(every_n_train_steps=100,
                                                                       save_last=True)])
        trainer.fit(model, datamodule=dm)
        trainer.fit(model, datamodule=ZephonDataModule(pipeline=build_pipeline),
                    ckpt_path="last")                      # continues the stream exactly

    Args:
        pipeline: a Pipeline or a zero-argument factory returning one.
        num_workers: DataLoader worker processes per rank.
        pin_memory: forwarded to the DataLoader.
        aggregate_dir / aggregate_store / aggregate_timeout_s: how ranks merge lane
            states in ``state_dict()`` (see ``Pipeline``); with several ranks and none
            given, the process group's store (``"torch://"``) is used.
        log_every_n_steps: how often data metrics go to the trainer's logger (0: never).
        val_dataloader_fn: optional zero-argument factory of a validation DataLoader.
    """

    def __init__(self, pipeline: Pipeline | Callable[[], Pipeline], num_workers: int = 0,
                 pin_memory: bool = False, aggregate_dir: str | None = None,
                 aggregate_store: Any = None, aggregate_timeout_s: float = 300.0,
                 log_every_n_steps: int = 50,
                 val_dataloader_fn: Callable[[], Any] | None = None):
        super().__init__()
        if not (isinstance(pipeline, Pipeline) or callable(pipeline)):
            raise ConfigError("ZephonDataModule(pipeline=...) takes a Pipeline or a "
                              "zero-argument function returning one")
        self._factory = pipeline
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.aggregate_dir = aggregate_dir
        self.aggregate_store = aggregate_store
        self.aggregate_timeout_s = aggregate_timeout_s
        self.log_every_n_steps = log_every_n_steps
        self._val_fn = val_dataloader_fn
        self.pipeline: Pipeline | None = None
        self._pending: dict[str, Any] | None = None
        self._consumed = 0           # training batches that reached training_step
        self._loader = None
        self._meter = _Meter()

    # -- building -------------------------------------------------------------------
    def _build(self) -> Pipeline:
        trainer = self._trainer_or_none()
        rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        pipe = Pipeline.for_rank(self._factory, rank, world)
        if self.aggregate_dir is not None or self.aggregate_store is not None:
            pipe.aggregate_dir, pipe.aggregate_store = self.aggregate_dir, self.aggregate_store
        pipe.aggregate_timeout_s = float(self.aggregate_timeout_s)
        return pipe

    def _trainer_or_none(self):
        return getattr(self, "trainer", None)

    def setup(self, stage: str) -> None:
        if self.pipeline is None:
            self.pipeline = self._build()
            if self._pending is not None:
                self.pipeline.load_state_dict(self._pending)
                self._pending = None

    def train_dataloader(self):
        if self.pipeline is None:
            self.setup("fit")
        self._loader = self.pipeline.dataloader(num_workers=self.num_workers,
                                                pin_memory=self.pin_memory)
        self._consumed = 0
        return self._loader

    def val_dataloader(self):
        if self._val_fn is None:
            return []
        return self._val_fn()

    # -- consumption tracking ---------------------------------------------------------
    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        trainer = self._trainer_or_none()
        if trainer is not None and trainer.training:
            self._consumed += 1
            self._meter.observe(batch)
            n = self.log_every_n_steps
            if n and self._consumed % n == 0 and trainer.logger is not None:
                trainer.logger.log_metrics(self.data_metrics(), step=trainer.global_step)
        return batch

    def data_metrics(self) -> dict[str, float]:
        """records/s, tokens/s, padding ratio, realized vs target mixture, inflight chunks."""
        out = self._meter.metrics()
        if self._loader is not None:
            consumer = self._loader.consumer
            names = consumer.plan.source.component_names
            tokens = [0] * len(names)
            inflight = 0
            for m in consumer.mirrors.values():
                inflight += len(m.chunks)
                for i, t in enumerate(m.tokens):
                    tokens[i] += t
            total = sum(tokens) or 1
            for i, name in enumerate(names):
                out[f"zephon/mix_{name}"] = tokens[i] / total
                out[f"zephon/mix_{name}_target"] = consumer.plan.source.weights[i]
            out["zephon/inflight_chunks"] = float(inflight)
        return out

    # -- state ----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        if self.pipeline is None:
            if self._pending is not None:
                return {STATE_KEY: self._pending}
            self.setup("fit")
        served = self._consumed if self._loader is not None else None
        return {STATE_KEY: self.pipeline.checkpoint(served=served)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if STATE_KEY not in state_dict:
            raise ConfigError(f"the datamodule state has no {STATE_KEY!r} entry; was the "
                              "checkpoint written with ZephonDataModule?")
        if self.pipeline is None:
            self._pending = state_dict[STATE_KEY]
        else:
            self.pipeline.load_state_dict(state_dict[STATE_KEY])

    def teardown(self, stage: str) -> None:
        if self.pipeline is not None and stage == "fit":
            self.pipeline.close()


class _Meter:
    """Rows and tokens per second of consumed training batches, and padding."""

    def __init__(self) -> None:
        self.t0: float | None = None
        self.rows = self.tokens = self.slots = 0

    def observe(self, batch: Any) -> None:
        if self.t0 is None:
            self.t0 = time.perf_counter()
        mask = batch.get("attention_mask") if isinstance(batch, dict) else None
        if isinstance(mask, torch.Tensor):
            self.rows += mask.shape[0]
            self.tokens += int(mask.sum())
            self.slots += mask.numel()

    def metrics(self) -> dict[str, float]:
        dt = time.perf_counter() - self.t0 if self.t0 is not None else 0.0
        return {"zephon/records_per_s": self.rows / dt if dt > 0 else 0.0,
                "zephon/tokens_per_s": self.tokens / dt if dt > 0 else 0.0,
                "zephon/padding_ratio": 1 - self.tokens / self.slots if self.slots else 0.0}
