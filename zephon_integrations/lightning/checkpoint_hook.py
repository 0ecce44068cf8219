"""Where a Lightning checkpoint keeps Zephon's state, and the checks on resume.

Lightning stores a datamodule's ``state_dict()`` under the class's qualified name and
silently skips it when the name differs on resume (a subclass renamed between runs),
and a checkpoint written without ``ZephonDataModule`` has no state at all: either way
the data would restart from its first batch with no warning. So
:class:`ZephonCheckpointHook`, a callback the datamodule installs (first) in ``setup()``:

* on save, moves the datamodule's entry to the fixed top-level key ``"zephon"``
  (``{"state": pipeline state, "rng": [per-rank RNG states]}``), gathering every
  rank's RNG state to rank 0, which is the rank whose dict Lightning writes. Both are
  taken at the last optimizer-step boundary (``steps.py``): the RNG is the one the next
  training step starts from -- in this run and in a run resumed from the checkpoint --
  also when the save comes before a resumed fit's first step (an epoch-end re-save).
  Inside a gradient-accumulation window it also writes Lightning's loop counters of the
  window's start (``loop_counters.py``), so a resume redoes the window. With
  ``state_layout="per_rank"`` and several ranks there is neither round nor gather:
  every rank writes its own lanes and RNG into ``<ckpt>.zephon/`` (the path
  ``Trainer.save_checkpoint`` was given, read from its frame: Lightning tells callbacks
  no path, and every rank calls it with the same one), and ``"zephon"`` holds a
  manifest (``{"per_rank": ...}``, ``distributed/rank_files.py``); rank 0 removes the
  files of checkpoints deleted since (``save_top_k``);
* on load, finds the state under ``"zephon"`` (or this rank's share through the
  manifest: its own file, or on another number of ranks the files holding its lanes)
  -- or, for checkpoints of earlier releases, under any top-level entry holding
  ``{"zephon": <pipeline state>}`` -- and hands it, the rank's RNG state and the loop
  counters to the datamodule; a resumed ``fit`` (``global_step > 0``) whose checkpoint
  holds none raises :class:`~zephon_core.MissingCheckpointState`, unless the datamodule
  was built with ``allow_fresh_start=True``;
* ends each training micro-step (``on_train_batch_end``) for the datamodule's
  :class:`~.steps.StepTracker`, and ends the fit when a finite stream ended
  (``stream_end.py``);
* at fit start (after the LightningModule's ``setup`` and ``configure_model``, where
  large models are built) turns the KV cache off for the datamodule's packed rows, and
  back on when fit ends or fails (``zephon_integrations/packed_cache.py``).

The hook sees the datamodule only through :class:`HookedDataModule`, the public members
it uses, so the two modules do not import each other.
"""

from __future__ import annotations

import logging
import os
import secrets
import sys
from typing import Any, ClassVar, Protocol

import lightning.pytorch as pl
import torch

from zephon_core import MissingCheckpointState, Pipeline, ZephonDataLoader
from zephon_core.checkpoint.trainer_files import (
    LIGHTNING_KEY,
    legacy_lightning_state,
    lightning_entry,
    lightning_manifest,
)
from zephon_core.distributed import rank_files
from zephon_core.distributed.topology import Topology
from zephon_core.errors import CheckpointError

from .. import rng
from ..packed_cache import restore_cache, turn_cache_off
from . import loop_counters
from .steps import StepTracker
from .stream_end import stop_if_ended

CHECKPOINT_KEY = LIGHTNING_KEY

log = logging.getLogger(__name__)


class HookedDataModule(Protocol):
    """What the hook uses of :class:`~.datamodule.ZephonDataModule`."""

    STATE_KEY: ClassVar[str]
    pipeline: Pipeline | None
    steps: StepTracker
    allow_fresh_start: bool
    per_rank: bool

    @property
    def loader(self) -> ZephonDataLoader | None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...

    def resume_rng(self, states: list[dict[str, Any]] | None, trainer: Any) -> dict | None: ...

    def resume_rank_rng(
        self, state: dict[str, Any] | None, saved_ranks: int, trainer: Any
    ) -> dict | None: ...


class ZephonCheckpointHook(pl.Callback):
    """Installed by :class:`ZephonDataModule`; not meant to be added by hand."""

    def __init__(self, datamodule: HookedDataModule):
        self.datamodule = datamodule
        self._warned_buffers = False
        self._cache_off: list[Any] = []  # model configs whose KV cache this fit turned off
        self._save_nonce: str | None = None  # per_rank: this fit's, the same on every rank
        self._saves = 0  # per_rank: saves of this fit (every rank saves alike)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: Any) -> None:
        if self.datamodule.per_rank:  # one small collective per fit, none per save
            self._save_nonce = trainer.strategy.broadcast(secrets.token_hex(6))
            self._saves = 0
        # after every setup hook and configure_model(): models built there exist now
        pipeline = self.datamodule.pipeline
        if pipeline is not None:
            self._cache_off = turn_cache_off(pl_module, pipeline)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        self._restore_cache()

    def on_exception(self, trainer: pl.Trainer, pl_module: Any, exception: BaseException) -> None:
        self._restore_cache()

    def _restore_cache(self) -> None:
        restore_cache(self._cache_off)
        self._cache_off = []

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.datamodule.steps.end(trainer)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        stop_if_ended(trainer, self.datamodule.loader)

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: Any, checkpoint: dict[str, Any]
    ) -> None:
        dm = self.datamodule
        entry = checkpoint.pop(type(dm).__qualname__, None)  # Lightning keyed it by class
        state = entry[dm.STATE_KEY] if entry else dm.state_dict()[dm.STATE_KEY]
        point = dm.steps.save_point(trainer)
        snap = point.rng if point.rng is not None else rng.snapshot()
        if dm.per_rank:
            checkpoint[CHECKPOINT_KEY] = {"per_rank": self._write_share(trainer, state, snap)}
        else:
            mine = rng.to_checkpoint(snap)
            checkpoint[CHECKPOINT_KEY] = {"state": state, "rng": _gather(mine, trainer.world_size)}
        if dm.steps.inside_window and point.counters is not None:
            loop_counters.write(checkpoint, point.counters)
            self._warn_if_buffers_update(pl_module, trainer)

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: Any, checkpoint: dict[str, Any]
    ) -> None:
        dm = self.datamodule
        counters = loop_counters.from_checkpoint(checkpoint)
        manifest = lightning_manifest(checkpoint)
        if manifest is not None:
            share = self._read_share(trainer, manifest)
            dm.load_state_dict({dm.STATE_KEY: share.state})
            own_rng = share.extra.get("rng") if share.extra is not None else None
            dm.steps.resume_at(
                dm.resume_rank_rng(own_rng, manifest["world_size"], trainer), counters
            )
            return
        entry = lightning_entry(checkpoint)
        if entry is not None:
            dm.load_state_dict({dm.STATE_KEY: entry["state"]})
            dm.steps.resume_at(dm.resume_rng(entry.get("rng"), trainer), counters)
            return
        legacy = legacy_lightning_state(checkpoint)
        if legacy is not None:
            dm.load_state_dict({dm.STATE_KEY: legacy})
            dm.steps.resume_at(None, counters)
            return
        fitting = trainer.state.fn == "fit"
        if fitting and checkpoint.get("global_step", 0) > 0 and not dm.allow_fresh_start:
            raise MissingCheckpointState(
                f"trainer.fit(ckpt_path={trainer.ckpt_path!r}) resumes at step "
                f"{checkpoint.get('global_step')}, but the checkpoint holds no Zephon state "
                "(it was not written by a ZephonDataModule), so the data would silently "
                "restart from the first batch. Resume from a checkpoint written with "
                "ZephonDataModule, or pass ZephonDataModule(..., allow_fresh_start=True) to "
                "start the data stream from its beginning on purpose"
            )

    # -- state_layout="per_rank" ---------------------------------------------------------
    def _topology(self, trainer: pl.Trainer) -> Topology:
        pipe = self.datamodule.pipeline
        if pipe is not None:
            return pipe.topology()
        return Topology(trainer.global_rank, trainer.world_size, trainer.global_rank,
                        trainer.world_size)  # fmt: skip

    def _write_share(
        self, trainer: pl.Trainer, state: dict[str, Any], snap: rng.Snapshot
    ) -> dict[str, Any]:
        """Write this rank's file; the manifest (what rank 0's ``.ckpt`` keeps)."""
        if self._save_nonce is None:  # a save outside fit (trainer.save_checkpoint later)
            self._save_nonce = trainer.strategy.broadcast(secrets.token_hex(6))
        save_id = f"{self._save_nonce}-step{trainer.global_step}-{self._saves}"
        self._saves += 1
        target = _saving_to()
        if target is not None:
            directory = f"{target}.zephon"
            files = os.path.basename(directory)
            if trainer.is_global_zero and not _writes_later(trainer):
                # files of checkpoints ModelCheckpoint deleted since (with an asynchronous
                # CheckpointIO a checkpoint may still be on its way: nothing is pruned)
                rank_files.prune_orphans(os.path.dirname(os.path.abspath(target)), directory)
        else:  # not saved through Trainer.save_checkpoint: beside the checkpoints
            cb = trainer.checkpoint_callback
            base = getattr(cb, "dirpath", None) or trainer.default_root_dir
            files = f"zephon-per-rank/{save_id}"
            directory = os.path.join(os.fspath(base), files)
        topo = self._topology(trainer)
        extra = {"rng": rng.to_msgpack(snap)}
        rank_files.write_rank_file(directory, save_id=save_id, topology=topo, state=state,
                                   extra=extra)  # fmt: skip
        absolute = directory if "://" in directory else os.path.abspath(directory)
        return rank_files.manifest(
            save_id=save_id, state=state, topology=topo, files=files, files_abs=absolute
        )

    def _read_share(self, trainer: pl.Trainer, manifest: dict[str, Any]) -> rank_files.Share:
        """This rank's share; every rank raises if any rank cannot read its own."""
        ckpt = trainer.ckpt_path
        share, error = None, None
        try:
            where = os.path.dirname(os.fspath(ckpt)) if ckpt else None
            directory = rank_files.locate(manifest, where)
            share = rank_files.read_share(manifest, directory, self._topology(trainer))
        except (CheckpointError, OSError) as e:
            error = e
        rank_files.agree(error)
        return share

    def _warn_if_buffers_update(self, pl_module: Any, trainer: pl.Trainer) -> None:
        """A resume redoes the window's micro-batches; running statistics that forward
        updated during them are in the checkpoint already and would count them twice."""
        if self._warned_buffers or not trainer.is_global_zero:
            return
        norms = [
            m
            for m in pl_module.modules()
            # (a save at validation end sees the model in eval mode: training is not asked)
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.track_running_stats
        ]
        if norms:
            self._warned_buffers = True
            log.warning(
                "a checkpoint at global_step %d was taken inside a gradient-accumulation "
                "window: it records the window's start, and a resume redoes the window's "
                "micro-batches exactly -- except %d BatchNorm layer(s), whose running "
                "statistics already include them and will count them twice. Save at "
                "optimizer steps (ModelCheckpoint(every_n_train_steps=...)) to avoid this",
                trainer.global_step,
                len(norms),
            )


def _writes_later(trainer: pl.Trainer) -> bool:
    from lightning.pytorch.plugins.io import AsyncCheckpointIO

    return isinstance(getattr(trainer.strategy, "checkpoint_io", None), AsyncCheckpointIO)


def _saving_to() -> str | None:
    """The path the running ``Trainer.save_checkpoint`` writes (None: not inside one)."""
    code = pl.Trainer.save_checkpoint.__code__
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is code:
            path = frame.f_locals.get("filepath")
            return os.fspath(path) if path is not None else None
        frame = frame.f_back
    return None


def _gather(state: dict[str, Any], world_size: int) -> list[dict[str, Any]]:
    """Every rank's RNG state, in rank order (one collective; all ranks save together)."""
    if world_size <= 1:
        return [state]
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [state]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, state)
    return out
