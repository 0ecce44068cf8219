"""ZephonTrainer: the clean per-rank path for ``transformers.Trainer``.

Every rank reads its own Zephon lanes through ``Pipeline.dataloader()``; the loader
is not passed through ``accelerator.prepare`` (no dispatching from rank 0, no
``IterableDatasetShard`` reading the whole stream, no extra look-ahead), and
``ignore_data_skip`` is forced on so a resume never reads and discards batches.
Each checkpoint directory gets ``zephon_state.msgpack.zst`` -- the merged state of
all lanes right after the batches the saved optimizer steps consumed -- and
``train(resume_from_checkpoint=True|path)`` restores it before the first batch.
What the checkpoint lacks for a bit-identical run (RNG, optimizer) is logged as a
WARNING; a finite stream that ends before ``max_steps`` ends training at that step
(``stream_end.py``); options that do not apply to a stream are named once
(``ignored_options.py``). A ``batch(provenance=True)`` batch's ``provenance`` is taken out
before the model call and kept in ``trainer.zephon_provenance`` (one tensor per
micro-batch of the current optimizer step).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from transformers import Trainer

from zephon_core import ConfigError, Pipeline, ZephonDataLoader
from zephon_core.distributed import rank_files
from zephon_core.engine.restore_log import restore_lines_to

from ..allow_changes import checked, checked_data_changes, named_in_refusals
from ..metrics import loader_metrics
from ..packed_cache import restore_cache, turn_cache_off
from .checkpoint_dir import (
    STATE_FILE,
    last_checkpoint,
    read_state,
    save_nonce,
    step_dir,
    warn_resume_gaps,
    write_share,
    write_state,
)
from .ignored_options import warn_ignored_options
from .restore_line import shown_by_transformers
from .stream_end import StreamEnd

__all__ = ["STATE_FILE", "ZephonTrainer"]


class ZephonTrainer(Trainer):
    """A ``transformers.Trainer`` fed by a Zephon pipeline (pass ``max_steps`` in args).

    Example::

        trainer = ZephonTrainer(model=model, args=TrainingArguments(..., max_steps=1000),
                                pipeline=build_pipeline)
        trainer.train()                                  # later: resume_from_checkpoint=True

    Args:
        pipeline: a Pipeline or a zero-argument factory returning one.
        allow_changes: accepted on resume, as in ``Pipeline.load_state_dict``:
            ``{"weights"}`` / ``{"components"}`` re-mix from the checkpoint's position,
            ``{"data"}`` / ``{"functions"}`` accept changed rows or map/filter functions.
            The resumed run's own checkpoints then resume exactly without it.
            ``"skip"`` / ``"exclude"`` accept ``skip_batches`` / ``exclude`` that differ
            from what the checkpoint records.
        skip_batches: ``[(start, end), ...]`` global positions (half-open) the resumed
            ``train()`` produces but never trains on (``Pipeline.load_state_dict``); the
            positions of optimizer steps are ``zephon_core.checkpoint.data_changes.
            step_positions(first, end, per_step=world_size * gradient_accumulation_steps,
            skipped=...)`` (one pipeline output per process per micro-batch). Recorded in
            the checkpoints it writes: later resumes repeat it. None: as recorded.
        exclude: ``{"dataset": [row, ...]}`` rows removed from every chunk read after the
            resume (recorded likewise). None: as recorded.
        state_layout: ``"merged"`` (default): rank 0 writes the state of every lane to
            ``checkpoint-N/`` (an aggregation round at each save with several ranks).
            ``"per_rank"``: every rank writes its own lanes' state into a file of its own
            there (beside its ``rng_state_<r>.pth``), with no round, and rank 0 a small
            manifest; a resume on another number of processes reads the files holding
            its lanes. With one process both write the merged state.
        *args: as for ``transformers.Trainer``.
        **kwargs: as for ``transformers.Trainer`` (no ``data_collator``).
    """

    def __init__(
        self,
        *args: Any,
        pipeline: Pipeline | Callable[[], Pipeline],
        allow_changes: Iterable[str] = (),
        state_layout: str = "merged",
        skip_batches: Iterable[tuple[int, int]] | None = None,
        exclude: Mapping[str, Iterable[int]] | None = None,
        **kwargs: Any,
    ):
        if kwargs.get("data_collator") is not None:
            raise ConfigError(
                "ZephonTrainer feeds the pipeline's batches to the model as they "
                "are; collate inside the pipeline (a map after batch) or use "
                "ZephonCallback with an unmodified Trainer"
            )
        super().__init__(*args, **kwargs)
        if self.args.max_steps is None or self.args.max_steps <= 0:
            raise ConfigError("a Zephon stream has no length: set TrainingArguments(max_steps=...)")
        self.args.ignore_data_skip = True  # never read and throw away batches on resume
        warn_ignored_options(self.args, self, "ZephonTrainer")
        self.add_callback(StreamEnd("ZephonTrainer"))
        self._zephon_factory = pipeline
        self._zephon_allow_changes = checked(allow_changes, "ZephonTrainer")
        self.zephon_state_layout = rank_files.check_layout(state_layout, "ZephonTrainer")
        self._zephon_nonce: str | None = None  # per_rank: this train()'s, alike on every rank
        self._zephon_skip, self._zephon_exclude = checked_data_changes(
            skip_batches, exclude, "ZephonTrainer"
        )
        self._zephon_given = True  # the next loader starts the run the decisions apply to
        self.zephon_pipeline: Pipeline | None = None
        self.zephon_loader: ZephonDataLoader | None = None  # the handle of the running train()
        self._zephon_restore: dict[str, Any] | None = None  # where the next loader starts
        self._zephon_served = 0  # batches of the current loader that reached training_step
        self._zephon_rng_from: str | None = None
        self._zephon_cache_off: list[Any] = []  # configs whose KV cache train() turned off
        #: with ``batch(provenance=True)``: the ``provenance`` tensor of each micro-batch
        #: of the current optimizer step (complete in ``on_step_end``), taken out of the
        #: inputs before the model sees them
        self.zephon_provenance: list[Any] = []

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        """The Trainer's logs plus the ``zephon/*`` mixture metrics, before any reporting
        integration sees them."""
        if self.zephon_loader is not None and not self.zephon_loader.closed:
            logs = {**logs, **loader_metrics(self.zephon_loader)}
        super().log(logs, *args, **kwargs)

    def _zephon(self) -> Pipeline:
        if self.zephon_pipeline is None:
            self.zephon_pipeline = Pipeline.for_rank(
                self._zephon_factory, self.args.process_index, self.args.world_size
            )
        return self.zephon_pipeline

    def get_train_dataloader(self):
        if self.zephon_loader is not None:
            self.zephon_loader.close()
        self._zephon_served = 0
        self._zephon_cache_off += turn_cache_off(self.model, self._zephon())
        restore, self._zephon_restore = self._zephon_restore, None
        given, self._zephon_given = self._zephon_given, False
        workers = self.args.dataloader_num_workers
        prefetch = self.args.dataloader_prefetch_factor
        self.zephon_loader = (
            self._zephon()
            .description()
            .dataloader(
                num_workers=workers,
                pin_memory=self.args.dataloader_pin_memory,
                restore=restore,
                allow_changes=self._zephon_allow_changes if restore is not None else (),
                origin=getattr(self, "_zephon_origin", None) if restore is not None else None,
                skip_batches=self._zephon_skip if given else None,
                exclude=self._zephon_exclude if given else None,
                **({"prefetch_factor": prefetch} if workers and prefetch else {}),
            )
        )
        return self.zephon_loader

    def training_step(self, model: Any, inputs: Any, *args: Any, **kwargs: Any):
        if self._zephon_rng_from is not None:
            # ignore_data_skip makes the Trainer skip its own RNG restore on resume; without
            # it dropout after a resume would differ from the uninterrupted run
            self._load_rng_state(self._zephon_rng_from)
            self._zephon_rng_from = None
        self._zephon_served += 1
        if isinstance(inputs, dict) and "provenance" in inputs:
            # the model takes no such argument; the step's micro-batches keep it readable
            if (self._zephon_served - 1) % self.args.gradient_accumulation_steps == 0:
                self.zephon_provenance = []
            self.zephon_provenance.append(inputs.pop("provenance"))
        return super().training_step(model, inputs, *args, **kwargs)

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any):
        path = resume_from_checkpoint
        if path is True:
            path = last_checkpoint(self.args.output_dir)
        self._zephon_nonce = None
        if self.zephon_state_layout == "per_rank" and self.args.world_size > 1:
            self._zephon_nonce = save_nonce()  # on every rank (a broadcast)
        if path:
            state = read_state(path, self._zephon().topology())  # per_rank: this rank's share
            # validated before any work
            with named_in_refusals("ZephonTrainer"):
                self._zephon().description().load_state_dict(
                    state,
                    allow_changes=self._zephon_allow_changes,
                    origin=str(path),
                    skip_batches=self._zephon_skip,
                    exclude=self._zephon_exclude,
                )
            warn_resume_gaps(
                str(path),
                self.args.process_index,
                self.args.world_size,
                "ZephonTrainer",
                bool(self.args.deepspeed),
            )
            self._zephon_restore = state
            self._zephon_rng_from = path
            self._zephon_origin = str(path)
        self._zephon_given = True
        try:
            with restore_lines_to(shown_by_transformers(self.args)):
                return super().train(path or None, *args, **kwargs)
        finally:
            if self.zephon_loader is not None:
                self.zephon_loader.close()  # its state stays readable
            restore_cache(self._zephon_cache_off)  # generate() after training wants it
            self._zephon_cache_off = []

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        # the state right after the batches the saved optimizer steps consumed; merged
        # before saving, as rank 0 may then spend minutes writing the model while the
        # other ranks would wait for it inside the aggregation round
        served = self._zephon_served
        if self._zephon_nonce is not None:  # per_rank: this rank's lanes, no round
            state = self.zephon_loader.state_dict(served=served)
        else:
            state = self.zephon_loader.checkpoint(served=served)  # a round on every rank
        super()._save_checkpoint(model, trial)
        where = step_dir(self._get_output_dir(trial=trial), self.state.global_step)
        if self._zephon_nonce is not None:
            write_share(
                where,
                state,
                save_id=f"{self._zephon_nonce}-step{self.state.global_step}",
                topology=self._zephon().topology(),
                with_manifest=self.args.should_save,
            )
        elif self.args.should_save:
            write_state(where, state)
