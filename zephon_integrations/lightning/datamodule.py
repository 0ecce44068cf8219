"""ZephonDataModule: exact resume of a Zephon pipeline under Lightning's ``ckpt_path``.

What it takes care of (Lightning 2.x traps):

* Lightning's fetcher reads one batch ahead for loaders without ``len()``, so at
  checkpoint time the loader has already produced the next batch. The module counts
  the training batches that reach ``on_before_batch_transfer`` (called right before
  each ``training_step``) and saves the state right after the last of them
  (``loader.checkpoint(served=n)``).
* ``state_dict()`` runs on every rank (Lightning dumps the checkpoint on all ranks but
  persists rank 0's dict), so it is where the aggregation round happens; it never
  returns an empty dict.
* The state lives under a fixed checkpoint key, and a resumed fit whose checkpoint has
  none is an error rather than a silent restart (``checkpoint_hook.py``).
* The global RNGs (python, numpy, torch, CUDA): training step ``n+1`` draws from where
  step ``n``'s draws ended, and draws between steps (validation, checkpointing, a new
  loader iterator) never reach training -- in every run, whatever the checkpoint
  schedule. Every rank's RNG at the last optimizer-step boundary is saved with the
  state, and a resumed fit's first step starts from it, so dropout continues exactly
  (``steps.py`` states the rule).
* A checkpoint taken inside a gradient-accumulation window records the window's start
  (data position, RNG, Lightning's loop counters: ``steps.py``, ``loop_counters.py``),
  so a resume redoes the window instead of skipping its first micro-batches.
* ``train_dataloader()`` serves this rank's lanes (no DistributedSampler) through a
  loader handle the module owns; asked again within one fit, it continues the stream.
  One stream per fit: a Lightning epoch is a stretch of it (``limit_train_batches``
  long, or until it ends) and the next epoch continues it; a finite stream that ended
  ends the fit with a warning (``stream_end.py``).
* ``allow_changes`` accepts a deliberate change at resume (re-mixed weights, edited data
  or functions), as ``Pipeline.load_state_dict(allow_changes=...)`` does.
* ``batch(provenance=True)``: each training batch's ``provenance`` is taken out before
  Lightning moves the batch to the device; ``training_step`` reads it as
  ``self.trainer.datamodule.provenance``.
* Packed rows told apart by ``position_ids`` (the default): every Transformers model in
  the LightningModule -- also one built in its ``setup`` or ``configure_model`` -- gets
  ``config.use_cache = False`` at fit start, with a warning, and it back at fit end --
  with a cache, Transformers lets attention cross the documents of a row
  (``packed_cache.py``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import ExitStack
from typing import Any

import lightning.pytorch as pl
import torch

from zephon_core import ConfigError, Pipeline, ZephonDataLoader
from zephon_core.checkpoint.state import PipelineState
from zephon_core.distributed import dcp, rank_files
from zephon_core.distributed.topology import rank_lanes
from zephon_core.engine.handle import StreamHandle
from zephon_core.engine.restore_log import restore_lines_to

from .. import rng
from ..allow_changes import checked, checked_data_changes, named_in_refusals
from ..metrics import loader_metrics
from .checkpoint_hook import ZephonCheckpointHook
from .restore_line import shown_by_lightning
from .steps import StepTracker

STATE_KEY = "zephon"


class _ModuleLoader(ZephonDataLoader):
    """The module's loader, without DCP's ``state_dict``/``load_state_dict``: Lightning's
    CombinedLoader saves and reloads any loader that has them, with the state after the
    batches read ahead and rank 0's lanes only. The module keeps the data state instead
    (``checkpoint(served=...)``, merged over the ranks)."""

    state_dict = None  # type: ignore[assignment]
    load_state_dict = None  # type: ignore[assignment]


# batches the loader may hand out past a checkpoint's position: Lightning reads one ahead,
# and a checkpoint inside an accumulation window records the window's start
_READ_AHEAD = 16

log = logging.getLogger(__name__)


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
        aggregate_dir: how ranks merge lane states in ``state_dict()`` (see
            ``Pipeline``); with several ranks and neither this nor ``aggregate_store``
            given, the process group's store (``"torch://"``) is used.
        aggregate_store: see ``aggregate_dir``.
        aggregate_timeout_s: one time budget for a whole aggregation round.
        log_every_n_steps: every how many optimizer steps the ``zephon/*`` data metrics
            go to the trainer's loggers (default None: the Trainer's
            ``log_every_n_steps``, as Lightning's own metrics; 0: never).
        val_dataloader_fn: optional zero-argument factory of a validation DataLoader.
        allow_fresh_start: resume from a checkpoint without Zephon state by starting the
            data stream from its beginning (default: ``MissingCheckpointState``).
        restore_rng: start every training step from the RNG the previous one left (and a
            resumed fit's first step from the checkpoint's); False leaves the global RNGs
            to Lightning (a resume then draws other dropout masks).
        allow_changes: accept a deliberate change when resuming a checkpoint, as
            ``Pipeline.load_state_dict(allow_changes=...)``: ``"weights"`` (and
            ``"components"``) re-mix, ``"data"`` / ``"functions"`` accept edited rows or
            map/filter functions. The re-mixed run's own checkpoints resume exactly.
            ``"skip"`` / ``"exclude"`` accept ``skip_batches`` / ``exclude`` that differ
            from what the checkpoint records.
        skip_batches: ``[(start, end), ...]`` global positions (half-open) the resumed fit
            produces but never trains on (``Pipeline.load_state_dict``); the positions of
            optimizer steps are ``zephon_core.checkpoint.data_changes.step_positions(first,
            end, per_step=world_size * accumulate_grad_batches, skipped=...)``. Recorded
            in the checkpoints the fit writes: later resumes repeat it. None: as recorded.
        exclude: ``{"dataset": [row, ...]}`` rows removed from every chunk read after the
            resume (recorded likewise). None: as recorded.
        state_layout: where the data state goes with several ranks. ``"merged"`` (the
            default): rank 0's ``.ckpt`` holds the state of every lane (an aggregation
            round at each save) and every rank's RNG (gathered): one portable file.
            ``"per_rank"``: every rank writes its own lanes' state and RNG into its own
            file beside the ``.ckpt`` (``<ckpt>.zephon/``), with no round and no gather;
            the ``.ckpt`` holds a small manifest. A resume on the same number of ranks
            restores data and RNG exactly, on another (dividing ``canonical_replicas``)
            the data exactly. With one process both write the merged state.
    """

    STATE_KEY = STATE_KEY

    def __init__(
        self,
        pipeline: Pipeline | Callable[[], Pipeline],
        num_workers: int = 0,
        pin_memory: bool = False,
        aggregate_dir: str | None = None,
        aggregate_store: Any = None,
        aggregate_timeout_s: float = 300.0,
        log_every_n_steps: int | None = None,
        val_dataloader_fn: Callable[[], Any] | None = None,
        allow_fresh_start: bool = False,
        restore_rng: bool = True,
        allow_changes: Iterable[str] = (),
        state_layout: str = "merged",
        skip_batches: Iterable[tuple[int, int]] | None = None,
        exclude: Mapping[str, Iterable[int]] | None = None,
    ):
        super().__init__()
        if not (isinstance(pipeline, Pipeline) or callable(pipeline)):
            raise ConfigError(
                "ZephonDataModule(pipeline=...) takes a Pipeline or a "
                "zero-argument function returning one"
            )
        self._factory = pipeline
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.aggregate_dir = aggregate_dir
        self.aggregate_store = aggregate_store
        self.aggregate_timeout_s = aggregate_timeout_s
        self.log_every_n_steps = log_every_n_steps
        self.allow_fresh_start = allow_fresh_start
        self.restore_rng = restore_rng
        self.allow_changes = checked(allow_changes, "ZephonDataModule")
        self.state_layout = rank_files.check_layout(state_layout, "ZephonDataModule")
        self.skip_batches, self.exclude = checked_data_changes(
            skip_batches, exclude, "ZephonDataModule"
        )
        self._val_fn = val_dataloader_fn
        if (
            val_dataloader_fn is None
            and type(self).val_dataloader is ZephonDataModule.val_dataloader
        ):
            # no validation data: Lightning then sees no val_dataloader and does not warn
            # "you passed a val_dataloader but have no validation_step"
            self.val_dataloader = None
        self.pipeline: Pipeline | None = None  # this rank's description
        self._restore: dict[str, Any] | None = None  # where the next loader starts
        self._loader: ZephonDataLoader | None = None
        self._loader_trainer: Any = None
        self.steps = StepTracker(restore_rng)  # micro-steps, their RNG, the last boundary
        self._hook = ZephonCheckpointHook(self)
        self._meter = _Meter()
        self._logged_step = -1  # the last global step whose data metrics were logged
        self._restore_line: ExitStack | None = None  # Lightning shows it during fit
        #: with ``batch(provenance=True)``: the ``provenance`` tensor of the batch the
        #: current (or last) ``training_step`` received, taken out of the batch before
        #: Lightning moves it to the device
        self.provenance: torch.Tensor | None = None

    # -- building -------------------------------------------------------------------
    def _build(self) -> Pipeline:
        trainer = self._trainer_or_none()
        rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        pipe = Pipeline.for_rank(self._factory, rank, world)
        options: dict[str, Any] = {"aggregate_timeout_s": float(self.aggregate_timeout_s)}
        if self.aggregate_dir is not None or self.aggregate_store is not None:
            options.update(aggregate_dir=self.aggregate_dir, aggregate_store=self.aggregate_store)
        return pipe.with_options(**options)

    def _trainer_or_none(self):
        return getattr(self, "trainer", None)

    def setup(self, stage: str) -> None:
        trainer = self._trainer_or_none()
        if trainer is not None and all(cb is not self._hook for cb in trainer.callbacks):
            # before Lightning restores a checkpoint; first, so that a step's end is seen
            # before any other callback's on_train_batch_end (ModelCheckpoint saves there)
            trainer.callbacks.insert(0, self._hook)
        if stage == "fit" and trainer is not None:
            self._end_restore_line()
            self._restore_line = ExitStack()
            self._restore_line.enter_context(restore_lines_to(shown_by_lightning(trainer)))
        if self.pipeline is None:
            self.pipeline = self._build()
            if self._restore is not None:
                self._validate(self._restore)

    def _validate(self, state: dict[str, Any]) -> None:
        # everything is checked now, before any work (a throwaway description)
        with named_in_refusals("ZephonDataModule"):
            self.pipeline.description().load_state_dict(
                state,
                allow_changes=self.allow_changes,
                skip_batches=self.skip_batches,
                exclude=self.exclude,
            )

    def train_dataloader(self):
        if self.pipeline is None:
            self.setup("fit")
        trainer = self._trainer_or_none()
        restore, allow = self._restore, self.allow_changes
        continuing = self._loader is not None and self._loader_trainer is trainer
        if self._loader is not None:
            if continuing and trainer is not None:
                # asked again within one fit: continue after the consumed batches
                restore, allow = self._loader.checkpoint(served=self.steps.consumed), ()
            self._loader.close()
        origin = getattr(trainer, "ckpt_path", None) if restore is self._restore else None
        accumulate = int(getattr(trainer, "accumulate_grad_batches", 1) or 1)
        given = restore is self._restore  # the resume (or start) the decisions are given to
        spec = self.pipeline.description().run_spec(
            restore,
            allow_changes=allow if restore is not None else (),
            origin=str(origin) if origin else None,
            skip_batches=self.skip_batches if given else None,
            exclude=self.exclude if given else None,
        )
        self._loader = _ModuleLoader(
            spec,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            max_read_ahead=max(_READ_AHEAD, accumulate + 2),
        )
        if continuing and trainer is not None:
            self.steps.rebase()
        else:
            self.steps.begin()
        self._loader_trainer = trainer
        self._restore = None
        return self._loader

    @property
    def loader(self) -> ZephonDataLoader | None:
        """The current train loader (None before ``train_dataloader()``)."""
        return self._loader

    def val_dataloader(self):
        if self._val_fn is None:
            return []
        return self._val_fn()

    # -- consumption tracking ---------------------------------------------------------
    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        trainer = self._trainer_or_none()
        if trainer is not None and trainer.training:
            if isinstance(batch, dict) and "provenance" in batch:
                # data about the batch, not model input: kept here, read in training_step
                self.provenance = batch.pop("provenance")
            self.steps.start(trainer)  # counts the batch; the RNG this step draws from
            self._meter.observe(batch)
            self._log_metrics(trainer)
        return batch

    def _log_metrics(self, trainer: Any) -> None:
        # at the steps where Lightning logs its own metrics ((step + 1) % n == 0), once
        # per optimizer step (its first micro-batch)
        n = self.log_every_n_steps
        n = trainer.log_every_n_steps if n is None else n
        step = trainer.global_step
        if n and (step + 1) % n == 0 and step != self._logged_step and trainer.loggers:
            self._logged_step = step
            metrics = self.data_metrics()
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=step)

    def data_metrics(self) -> dict[str, float]:
        """records/s, tokens/s, padding ratio, inflight chunks and, per dataset, shares
        with their unit: ``zephon/token_share/<name>``, ``zephon/token_share_target/<name>``
        (token weights) or ``zephon/document_share_target/<name>`` (document weights),
        ``zephon/document_share/<name>``, ``zephon/tokens/<name>``,
        ``zephon/documents/<name>``, ``zephon/epochs/<name>``."""
        out = self._meter.metrics()
        if self._loader is not None:
            out.update(loader_metrics(self._loader))
        return out

    # -- state ----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """``{"zephon": state}``: the state right after the last batch a training step
        consumed up to the last optimizer step (inside an accumulation window: at the
        window's start; an aggregation round with several ranks -- or, with
        ``state_layout="per_rank"``, this rank's lanes only, in the per-rank shape of
        ``handle.state_dict()``, which the checkpoint hook writes to this rank's file);
        never empty."""
        if self._loader is not None:
            served = self.steps.save_point(self._trainer_or_none()).consumed
            if served < 0:
                raise ConfigError(
                    "cannot checkpoint inside this accumulation window: it began before the "
                    "train loader was re-created (reload_dataloaders_every_n_epochs); save at "
                    "an optimizer step"
                )
            if self.per_rank:  # this rank's lanes only: no round (the hook writes them)
                return {STATE_KEY: StreamHandle.state_dict(self._loader, served=served)}
            return {STATE_KEY: self._loader.checkpoint(served=served)}
        if self._restore is not None:
            return {STATE_KEY: self._share(self._restore) if self.per_rank else self._restore}
        pipe = self.pipeline if self.pipeline is not None else self._build()
        start = pipe.description().checkpoint()  # the beginning: no run needed
        return {STATE_KEY: self._share(start) if self.per_rank else start}

    @property
    def per_rank(self) -> bool:
        """Whether checkpoints keep this rank's state in a file of its own (several ranks
        and ``state_layout="per_rank"``)."""
        trainer = self._trainer_or_none()
        world = trainer.world_size if trainer is not None else 1
        return self.state_layout == "per_rank" and world > 1

    def _share(self, state: dict[str, Any]) -> dict[str, Any]:
        """This rank's lanes of ``state`` in the per-rank shape (unchanged if it has it)."""
        if dcp.is_per_rank(state):
            return state
        pipe = self.pipeline if self.pipeline is not None else self._build()
        full = PipelineState.from_dict(state)
        topo = pipe.topology()
        mine = rank_lanes(pipe.canonical_replicas, topo.dp_size, topo.dp_rank, full.position)
        full.lanes = {lane: full.lanes[lane] for lane in mine}
        return dcp.encode(full, pipe.canonical_replicas)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not isinstance(state_dict, dict) or STATE_KEY not in state_dict:
            raise ConfigError(
                f"the datamodule state has no {STATE_KEY!r} entry; was the "
                "checkpoint written with ZephonDataModule?"
            )
        if self.pipeline is not None:
            self._validate(state_dict[STATE_KEY])
        if self._loader is not None:
            self._loader.close()
            self._loader = None
        self._restore = state_dict[STATE_KEY]

    def resume_rng(self, states: list[dict[str, Any]] | None, trainer: Any) -> dict | None:
        """This rank's RNG state of a checkpoint's per-rank list, or None (not restored;
        with another number of ranks, a warning says so)."""
        if not self.restore_rng or not states:
            return None
        if len(states) != trainer.world_size:
            _rng_cannot_follow(len(states), trainer.world_size)
            return None
        return states[trainer.global_rank]

    def resume_rank_rng(
        self, state: dict[str, Any] | None, saved_ranks: int, trainer: Any
    ) -> dict | None:
        """This rank's RNG state of its own per-rank file (``state_layout="per_rank"``):
        None when not restored (with another number of ranks, a warning says so)."""
        if not self.restore_rng:
            return None
        if state is None or saved_ranks != trainer.world_size:
            _rng_cannot_follow(saved_ranks, trainer.world_size)
            return None
        return rng.to_checkpoint(rng.from_msgpack(state))

    def teardown(self, stage: str) -> None:
        if stage == "fit":
            self._end_restore_line()
        if self._loader is not None and stage == "fit":
            self._loader.close()  # its state stays readable for state_dict()

    def on_exception(self, exception: BaseException) -> None:
        self._end_restore_line()

    def _end_restore_line(self) -> None:
        if self._restore_line is not None:
            self._restore_line.close()
            self._restore_line = None


def _rng_cannot_follow(saved: int, now: int) -> None:
    log.warning(
        "the checkpoint holds RNG states of %d ranks and this run has %d: "
        "the data stream continues exactly, but random model operations "
        "(dropout) will not repeat the uninterrupted run's draws",
        saved,
        now,
    )


class _Meter:
    """Rows and labelled tokens per second of consumed training batches, and the share
    of slots without a label (padding, plus each packed document's first token)."""

    def __init__(self) -> None:
        self.t0: float | None = None
        self.rows = self.tokens = self.slots = 0

    def observe(self, batch: Any) -> None:
        if self.t0 is None:
            self.t0 = time.perf_counter()
        # tokens that carry a label (packed rows have no 2-D attention_mask; their
        # padding and each document's first token are -100)
        labels = batch.get("labels") if isinstance(batch, dict) else None
        if isinstance(labels, torch.Tensor) and labels.ndim == 2:
            self.rows += labels.shape[0]
            self.tokens += int((labels != -100).sum())
            self.slots += labels.numel()

    def metrics(self) -> dict[str, float]:
        dt = time.perf_counter() - self.t0 if self.t0 is not None else 0.0
        return {
            "zephon/records_per_s": self.rows / dt if dt > 0 else 0.0,
            "zephon/tokens_per_s": self.tokens / dt if dt > 0 else 0.0,
            "zephon/padding_ratio": 1 - self.tokens / self.slots if self.slots else 0.0,
        }
