"""ZephonCallback: exact resume of a Zephon pipeline under an unmodified ``Trainer``.

What it takes care of (transformers 5.x / accelerate traps):

* On resume the Trainer reads and discards ``global_step x GAS`` batches; the callback
  switches that off (``ignore_data_skip``) in ``on_init_end``, and moves
  ``dataloader_num_workers`` onto Zephon's own loader (the Trainer's workers would each
  run the whole stream).
* accelerate always re-wraps the Trainer's loader. The callback reads the wrapper in
  ``on_train_begin`` and serves exactly what each rank is owed:

  - ``DataLoaderDispatcher`` (the default): rank 0 reads the global stream and sends
    rank ``r`` every ``r``-th batch; the other ranks read nothing.
  - ``IterableDatasetShard`` (``dispatch_batches=False``): each rank serves only its
    own Zephon lanes (see ``rows.py``); states merge in an aggregation round.

* Every wrapper reads ahead (one micro-step, plus GAS batches per optimizer step), so
  the state saved is computed from ``global_step``, not from what was read.
* ``on_save`` runs after ``checkpoint-N/`` is complete; rank 0 writes the merged state
  there atomically. With ``state_layout="per_rank"`` and ranks reading their own lanes,
  there is no round: every rank writes its own lanes' file there (beside its
  ``rng_state_<r>.pth``) and rank 0 a manifest. ``on_train_begin`` finds the directory
  a resume starts from and restores it before the first batch is read; the Trainer's
  RNG state is restored again at the first resumed step, because the loader iterators
  it creates on resume draw from the global RNG after the Trainer's own restore. What
  the checkpoint lacks for a bit-identical run (RNG, optimizer) is logged as a WARNING.
* A finite stream that ends before ``max_steps`` ends training at that step
  (``stream_end.py``); options that do not apply to a stream are named once
  (``ignored_options.py``).
* ``batch(provenance=True)``: the ``provenance`` of each batch is taken out before the
  batch is cut into rows (the Trainer's collator could not stack it, the model takes no
  such argument) and, at each step's end, ``callback.provenance`` holds the step's.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from transformers import TrainerCallback

from zephon_core import ConfigError, Pipeline, ZephonDataLoader
from zephon_core.distributed import rank_files
from zephon_core.distributed.finite_end import is_finite
from zephon_core.distributed.topology import validate
from zephon_core.engine.restore_log import restore_lines_to
from zephon_core.ops import BatchOp

from ..allow_changes import checked, checked_data_changes, named_in_refusals
from ..metrics import loader_metrics
from ..packed_cache import restore_cache, turn_cache_off
from .checkpoint_dir import (
    read_state,
    resolve_resume_dir,
    restore_rng,
    save_nonce,
    step_dir,
    warn_resume_gaps,
    write_share,
    write_state,
)
from .ignored_options import constructing_trainer, warn_ignored_options
from .restore_line import shown_by_transformers
from .rows import Feed, ZephonRows
from .stream_end import StreamEnd, end_empty_passes_quietly

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Layout:
    """How accelerate hands this process its batches."""

    reads: bool  # this process iterates the Zephon stream
    own_lanes: bool  # it reads only its own lanes (else: the global stream)
    num_processes: int
    process_index: int
    rows_per_micro_step: int  # rows this process reads per micro-step


class ZephonCallback(TrainerCallback):
    """Feeds a ``transformers.Trainer`` from a Zephon pipeline with exact resume.

    Example::

        zephon = ZephonCallback(build_pipeline)
        trainer = Trainer(model=model, args=TrainingArguments(..., max_steps=1000),
                          train_dataset=zephon.train_dataset, callbacks=[zephon])
        trainer.train()                              # later: resume_from_checkpoint=True

    The pipeline's ``batch(batch_size=B)`` must equal ``per_device_train_batch_size``.

    Args:
        pipeline: a Pipeline or a zero-argument factory returning one.
        num_workers: Zephon DataLoader workers of the reading process; default: the
            Trainer's ``dataloader_num_workers``, which is then set to 0 (evaluation
            loaders run without workers too).
        resume_from: the checkpoint directory to restore from, when it is neither the
            one given to ``train(resume_from_checkpoint=...)`` nor in ``output_dir``.
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
            ``checkpoint-N/`` (an aggregation round at each save when ranks read their own
            lanes). ``"per_rank"``: every rank writes its own lanes' state into a file of
            its own there, with no round, and rank 0 a small manifest; a resume on another
            number of processes reads the files holding its lanes. It applies when ranks
            read their own lanes (``dispatch_batches=False``); otherwise one process holds
            every lane and writes the merged state either way.
    """

    def __init__(
        self,
        pipeline: Pipeline | Callable[[], Pipeline],
        *,
        num_workers: int | None = None,
        resume_from: str | None = None,
        allow_changes: Iterable[str] = (),
        state_layout: str = "merged",
        skip_batches: Iterable[tuple[int, int]] | None = None,
        exclude: Mapping[str, Iterable[int]] | None = None,
    ):
        self._factory = pipeline
        self.num_workers = num_workers
        self.resume_from = resume_from
        self.allow_changes = checked(allow_changes, "ZephonCallback")
        self.state_layout = rank_files.check_layout(state_layout, "ZephonCallback")
        self._save_nonce: str | None = None  # per_rank: this train()'s, alike on every rank
        self.skip_batches, self.exclude = checked_data_changes(
            skip_batches, exclude, "ZephonCallback"
        )
        self.train_dataset = ZephonRows()
        self.pipeline: Pipeline | None = None  # this process's pipeline in the running train()
        self.loader: ZephonDataLoader | None = None  # ... and the loader handle it reads
        self._layout: _Layout | None = None
        self._start_step = 0
        self._outputs_per_micro_step = 0
        self._rng_from: str | None = None
        self._saved: tuple[int, dict[str, Any] | None] | None = None  # (step, merged state)
        self._cache_off: list[Any] = []  # model configs whose KV cache training turned off
        self._prefetch_factor: int | None = None  # the Trainer's, for Zephon's workers
        self._stream_end = StreamEnd("ZephonCallback")
        self._restore_line: ExitStack | None = None  # the Trainer's log shows it in train()
        #: with ``batch(provenance=True)``: the ``provenance`` tensor of each Zephon batch
        #: this process read for the last optimizer step (set in ``on_step_end``; with
        #: accelerate dispatching, rank 0 holds every rank's, micro-step by micro-step)
        self.provenance: list[Any] = []

    # -- setup --------------------------------------------------------------------------
    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if args.max_steps is None or args.max_steps <= 0:
            raise ConfigError("a Zephon stream has no length: set TrainingArguments(max_steps=...)")
        if args.auto_find_batch_size:
            raise ConfigError(
                "auto_find_batch_size changes the batch size; Zephon's is fixed by "
                "the pipeline's batch(): set auto_find_batch_size=False"
            )
        args.ignore_data_skip = True  # never read and throw away batches on resume
        warn_ignored_options(args, constructing_trainer(), "ZephonCallback")
        # Only rank 0 creates output_dir; resume_from_checkpoint=True lists it on every rank
        # (in Trainer.train, before any callback runs), so without it the other ranks
        # fail with FileNotFoundError while rank 0 says there is no checkpoint.
        if args.output_dir:
            os.makedirs(args.output_dir, exist_ok=True)
        if args.dataloader_num_workers:
            if self.num_workers is None:
                self.num_workers = args.dataloader_num_workers
            self._prefetch_factor = args.dataloader_prefetch_factor
            log.info(
                "ZephonCallback: %d DataLoader workers run inside Zephon's loader",
                args.dataloader_num_workers,
            )
            args.dataloader_num_workers = 0
            args.dataloader_prefetch_factor = None
            args.dataloader_persistent_workers = False

    def on_train_begin(
        self, args: Any, state: Any, control: Any, train_dataloader: Any = None, **kwargs: Any
    ) -> None:
        if not args.ignore_data_skip or args.dataloader_num_workers:
            raise ConfigError(
                "ZephonCallback must be given to Trainer(callbacks=[...]) at "
                "construction (not add_callback) so it can set ignore_data_skip "
                "and take over dataloader_num_workers before the loader is built"
            )
        self._end_restore_line()  # (left by a train() that failed)
        self._restore_line = ExitStack()
        self._restore_line.enter_context(restore_lines_to(shown_by_transformers(args)))
        # Everything that can fail is checked on every rank, also ranks that read nothing:
        # a rank failing alone would leave the others blocked in a collective.
        pipe = Pipeline.for_rank(self._factory, 0, 1)
        if not pipe.checkpointing:
            raise ConfigError(
                "the pipeline was built with checkpointing=False; ZephonCallback "
                "needs checkpointing=True to save the data position"
            )
        rows = _rows_per_output(pipe, args.train_batch_size)
        layout = _read_layout(
            train_dataloader, self.train_dataset, args.train_batch_size, batched=rows > 1
        )
        dispatches_several = (
            layout.num_processes > 1
            and not layout.own_lanes
            and layout.rows_per_micro_step > args.train_batch_size
        )
        if rows > 1 and dispatches_several and not _fixed_shape(pipe):
            raise ConfigError(
                "accelerate's dispatcher concatenates one batch per process, so "
                "batch shapes must not vary: use pack() or batch(seq_len=...), "
                "or accelerator_config={'dispatch_batches': False}, or "
                "ZephonTrainer"
            )
        self._cache_off = turn_cache_off(kwargs.get("model"), pipe)
        if layout.own_lanes:  # TP/CP peers share a data-parallel index and get the same lanes
            pipe = pipe.bind(
                rank=args.process_index,
                world_size=args.world_size,
                dp_rank=layout.process_index,
                dp_size=layout.num_processes,
            )
        else:  # the global stream, whatever the process group says
            pipe = pipe.bind(rank=0, world_size=1)
        workers = self.num_workers or 0
        validate(pipe.canonical_replicas, pipe.topology().dp_size, workers)
        self._layout, self._start_step, self._saved = layout, state.global_step, None
        self._save_nonce = None
        if self.state_layout == "per_rank" and layout.own_lanes:
            self._save_nonce = save_nonce()  # on every rank (a broadcast)
        if state.global_step > 0:  # the Trainer loaded a checkpoint's trainer_state.json
            path = resolve_resume_dir(args.output_dir, state.global_step, self.resume_from)
            saved = read_state(path, pipe.topology())  # a per-rank save: this rank's share
            with named_in_refusals("ZephonCallback"):
                pipe.load_state_dict(
                    saved,
                    allow_changes=self.allow_changes,
                    origin=str(path),
                    skip_batches=self.skip_batches,
                    exclude=self.exclude,
                )
            warn_resume_gaps(
                path, args.process_index, args.world_size, "ZephonCallback", bool(args.deepspeed)
            )
            self._rng_from = path
        # a fresh start takes the decisions with its loader (a resume took them above)
        fresh = {} if state.global_step > 0 else {"skip_batches": self.skip_batches}
        fresh.update({} if state.global_step > 0 else {"exclude": self.exclude})
        if is_finite(pipe.source):  # a resume where the stream ended has nothing to read
            end_empty_passes_quietly(train_dataloader)
        if not layout.reads:
            self.pipeline = self.loader = None
            self.train_dataset.feed = Feed(loader=None)
            return
        self._outputs_per_micro_step = layout.rows_per_micro_step // rows
        # accelerate and the Trainer read at most one micro-step ahead of training; the
        # undo history counts turns, and every lane of this process may add a skip turn
        lanes = pipe.canonical_replicas // pipe.topology().dp_size
        read_ahead = (2 * self._outputs_per_micro_step + 16) * lanes
        prefetch = self._prefetch_factor
        extra = {"prefetch_factor": prefetch} if workers and prefetch else {}
        loader = pipe.dataloader(num_workers=workers, max_read_ahead=read_ahead, **fresh, **extra)
        self.pipeline, self.loader = pipe, loader
        self.train_dataset.feed = Feed(
            loader=loader,
            rows_per_output=rows,
            slots=layout.num_processes if layout.own_lanes else 1,
            slot=layout.process_index if layout.own_lanes else 0,
            slot_rows=args.train_batch_size,
        )

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._rng_from is not None:
            # the RNG as saved with the checkpoint, at the point the uninterrupted run
            # reached it: after the resumed loader iterators drew their seeds
            restore_rng(self._rng_from, args.process_index, args.world_size)
            self._rng_from = None

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        return self._stream_end.on_epoch_begin(args, state, control)

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        return self._stream_end.on_epoch_end(args, state, control)

    # -- saving -------------------------------------------------------------------------
    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._take_provenance(args, state)
        # Merge before the Trainer saves: rank 0 may then spend minutes writing the model
        # while the other ranks would wait for it inside the aggregation round.
        if control.should_save:
            self._saved = (state.global_step, self._merged_state(args, state))

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        saved = self._saved
        if saved is not None and saved[0] == state.global_step:
            merged = saved[1]
        else:  # a save decided after the step (e.g. save_strategy="best")
            merged = self._merged_state(args, state)
        self._saved = None
        where = step_dir(args.output_dir, state.global_step)
        if merged is not None and self._save_nonce is not None and self.pipeline is not None:
            write_share(
                where,
                merged,
                save_id=f"{self._save_nonce}-step{state.global_step}",
                topology=self.pipeline.topology(),
                with_manifest=args.should_save,
            )
        elif merged is not None and args.should_save:
            write_state(where, merged)

    def _take_provenance(self, args: Any, state: Any) -> None:
        """The provenance of the outputs the step that just ended consumed (the readers
        run ahead: later outputs stay queued for their own step)."""
        feed = self.train_dataset.feed
        if feed is None or not feed.provenance:
            self.provenance = []
            return
        per_step = args.gradient_accumulation_steps * self._outputs_per_micro_step
        end = (state.global_step - self._start_step) * per_step
        queued = feed.provenance
        self.provenance = []
        while queued and queued[0][0] < end:
            n, tensor = queued.popleft()
            if n >= end - per_step:
                self.provenance.append(tensor)

    def _merged_state(self, args: Any, state: Any) -> dict[str, Any] | None:
        layout = self._layout
        if layout is None or self.loader is None:
            return None  # a rank that reads nothing holds no state
        if not (layout.own_lanes or args.should_save):
            return None  # every reader of the global stream holds the same state
        consumed = (
            (state.global_step - self._start_step)
            * args.gradient_accumulation_steps
            * self._outputs_per_micro_step
        )
        feed = self.train_dataset.feed
        if feed is not None and feed.ended:
            # the step where a finite stream ended may have had fewer batches (a partial
            # accumulation); everything handed out was trained
            consumed = min(consumed, self.loader.consumer.served)
        if self._save_nonce is not None:  # per_rank: this rank's lanes, no round
            return self.loader.state_dict(served=consumed)
        # own lanes: an aggregation round on every rank
        return self.loader.checkpoint(served=consumed)

    # -- metrics ------------------------------------------------------------------------
    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any
    ) -> None:
        """Adds the ``zephon/*`` mixture metrics (``data_metrics``) to the Trainer's logs
        and to ``state.log_history`` (trainer_state.json). Reporting integrations the
        Trainer registered before this callback have already run; ``ZephonTrainer``
        adds the metrics before they do."""
        metrics = self.data_metrics()
        if not metrics or logs is None:
            return
        logs.update(metrics)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(metrics)

    def data_metrics(self) -> dict[str, float]:
        """Per dataset, with units (``zephon/token_share/<name>``, its target, document
        shares, tokens, documents, epochs) and the inflight chunks of this reader."""
        if self.loader is None:
            return {}
        return loader_metrics(self.loader)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        restore_cache(self._cache_off)  # generate() after training wants it
        self._cache_off = []
        self.train_dataset.close()
        if self.loader is not None:
            self.loader.close()
        self.pipeline = self.loader = self._layout = self._saved = None
        self._end_restore_line()

    def _end_restore_line(self) -> None:
        if self._restore_line is not None:
            self._restore_line.close()
            self._restore_line = None


def _read_layout(loader: Any, rows: ZephonRows, batch_size: int, batched: bool) -> _Layout:
    from accelerate.data_loader import DataLoaderDispatcher, IterableDatasetShard

    dataset = getattr(loader, "dataset", None)
    if isinstance(loader, DataLoaderDispatcher) and dataset is rows:
        if getattr(loader, "submesh_tp", None) is not None:
            raise ConfigError(
                "accelerate dispatches one batch to all tensor-parallel ranks; "
                "use accelerator_config={'dispatch_batches': False} or "
                "ZephonTrainer with tensor parallelism"
            )
        n, i = loader.state.num_processes, loader.state.process_index
        per_step = batch_size if loader.split_batches else batch_size * n
        return _Layout(
            reads=i == 0,
            own_lanes=False,
            num_processes=n,
            process_index=i,
            rows_per_micro_step=per_step,
        )
    if isinstance(dataset, IterableDatasetShard) and dataset.dataset is rows:
        n, i = dataset.num_processes, dataset.process_index
        # A rank serves its own lanes only when one Zephon output is one per-device batch;
        # otherwise (split batches, unbatched records) every rank reads the global stream
        # and the shard keeps its slice.
        own = n > 1 and batched and not dataset.split_batches
        return _Layout(
            reads=True,
            own_lanes=own,
            num_processes=n,
            process_index=i,
            rows_per_micro_step=batch_size,
        )
    if dataset is rows:
        return _Layout(
            reads=True,
            own_lanes=False,
            num_processes=1,
            process_index=0,
            rows_per_micro_step=batch_size,
        )
    raise ConfigError(
        "the Trainer's train_dataset is not this callback's (or accelerate "
        f"wrapped it as {type(loader).__name__}, which Zephon does not know): "
        "pass Trainer(train_dataset=cb.train_dataset, callbacks=[cb])"
    )


def _batch_op(pipe: Pipeline) -> BatchOp | None:
    """The pipeline's batch operator, as compile decided it (bound: it knows its width)."""
    plan = pipe.compile()
    return plan.ops[plan.batch_index] if plan.batch_index is not None else None


def _rows_per_output(pipe: Pipeline, batch_size: int) -> int:
    last = _batch_op(pipe)
    if last is None:
        return 1  # records; the Trainer's collator batches them
    if last.batch_size != batch_size:
        raise ConfigError(
            f"the pipeline's batch(batch_size={last.batch_size}) must "
            f"equal the Trainer's batch size per process (train_batch_size="
            f"{batch_size}): the Trainer regroups Zephon's rows into its own "
            "batches"
        )
    return batch_size


def _fixed_shape(pipe: Pipeline) -> bool:
    """Whether every output has the same shape (batches padded to a fixed width)."""
    last = _batch_op(pipe)
    return last is not None and last.width is not None
