"""Shared pieces of the HF Trainer tests: a recording tiny GPT-2 and the reference stream."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

import torch
from helpers import CODE, PROSE, batch_digest, byte_tokenize, reference_pipeline, source
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from zephon_core import Pipeline, StaticMixtureWorkSource

# what the model sees of a Zephon batch (packed rows: no attention_mask, position_ids)
KEYS = ("input_ids", "attention_mask", "labels", "position_ids")


def fingerprint(batch: dict) -> str:
    return batch_digest(batch, KEYS)


def make_pipeline() -> Pipeline:
    return reference_pipeline(lanes=4)


def ragged_pipeline() -> Pipeline:
    """Batches padded to their longest row: shapes vary from batch to batch."""
    return (
        Pipeline(source(8), canonical_replicas=4, flush_every_k_chunks=2, seed=11)
        .fetch()
        .map(byte_tokenize, name="tokenize")
        .split(max_len=128)
        .shuffle(buffer_size=16)
        .batch(batch_size=4, pad_to="longest")
    )


def mixture_pipeline(weights: tuple[float, float] = (0.7, 0.3)) -> Pipeline:
    """Packed batches of the test mixture at ``weights`` (prose, code)."""
    return _packed(Pipeline(source(8, weights=weights), canonical_replicas=4, seed=11))


ENDING_STEPS = 12  # batches of ending_pipeline()


def ending_pipeline() -> Pipeline:
    """A finite stream: one epoch of a few documents, ``ENDING_STEPS`` packed batches."""
    src = StaticMixtureWorkSource(
        {"prose": PROSE[:12], "code": CODE[:4]},
        {"prose": 0.7, "code": 0.3},
        chunk_size=4,
        seed=7,
        num_epochs=1,
    )
    return _packed(Pipeline(src, canonical_replicas=4, seed=11))


def _packed(pipe: Pipeline) -> Pipeline:
    return (
        pipe.fetch()
        .map(byte_tokenize, name="tokenize")
        .split(max_len=128)
        .pack(seq_len=128, bins=4)
        .batch(batch_size=4)
    )


def reference(n: int) -> list[str]:
    """The first ``n`` batches of the global stream, read without any Trainer."""
    p = make_pipeline()
    it = iter(p)
    out = [fingerprint(next(it)) for _ in range(n)]
    p.close()
    return out


class RecordingGPT2(GPT2LMHeadModel):
    """Records the fingerprint of every batch its forward sees (in training mode)."""

    def forward(self, input_ids=None, attention_mask=None, labels=None, position_ids=None, **kw):
        if self.training:
            seen = dict(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
            self.seen.append(fingerprint(dict(seen, position_ids=position_ids)))
        return super().forward(
            input_ids=input_ids,
            attention_mask=attention_mask,
            labels=labels,
            position_ids=position_ids,
            **kw,
        )


def tiny_model() -> RecordingGPT2:
    torch.manual_seed(0)
    model = RecordingGPT2(
        GPT2Config(vocab_size=256, n_positions=128, n_embd=16, n_layer=1, n_head=2)
    )  # dropout 0.1: the RNG must resume too
    model.seen = []
    return model


class CrashAt(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        control.should_training_stop = state.global_step >= self.step
        return control


class LossLog(TrainerCallback):
    """Collects the training loss of every optimizer step (logging_steps=1)."""

    def __init__(self):
        self.losses = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.losses.append((state.global_step, float(logs["loss"])))


def reference_rows(n: int, rows: slice) -> list[str]:
    """Fingerprints of a slice of rows of each of the first ``n`` global batches."""
    p = make_pipeline()
    it = iter(p)
    out = []
    for _ in range(n):
        batch = next(it)
        out.append(fingerprint({k: batch[k][rows] for k in KEYS if k in batch}))
    p.close()
    return out


class CacheSeen(TrainerCallback):
    """Records ``model.config.use_cache`` at every optimizer step."""

    def __init__(self):
        self.during: list[bool] = []

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.during.append(model.config.use_cache)


PATHS = ("callback", "callback-shard", "trainer")  # accelerate dispatching, sharding, per-rank


def hf_train(
    path: str,
    out,
    max_steps: int,
    *,
    pipeline: Callable[[], Pipeline] = make_pipeline,
    resume: str | bool | None = None,
    crash_at: int | None = None,
    allow_changes: Iterable[str] = (),
    zephon_kwargs: dict | None = None,
    **args,
) -> tuple[list[str], list[tuple[int, float]], Trainer]:
    """One ``train()`` of the recording tiny GPT-2 on one process through ``path`` (one of
    ``PATHS``); returns the batch fingerprints it trained on, the loss of every step and
    the Trainer. ``args`` go to ``TrainingArguments`` (default: save every 3 steps);
    ``zephon_kwargs`` to ZephonCallback / ZephonTrainer (``skip_batches=``, ...)."""
    from zephon_integrations.hf import ZephonCallback, ZephonTrainer

    model = tiny_model()
    losses = LossLog()
    callbacks = [losses] + ([CrashAt(crash_at)] if crash_at else [])
    args = TrainingArguments(
        **{
            "output_dir": str(out),
            "max_steps": max_steps,
            "per_device_train_batch_size": 4,
            "save_steps": 3,
            "logging_steps": 1,
            "report_to": [],
            "use_cpu": True,
            "disable_tqdm": True,
            "accelerator_config": {"dispatch_batches": path != "callback-shard"},
            **args,
        }
    )
    changes = {"allow_changes": allow_changes} if allow_changes else {}
    changes.update(zephon_kwargs or {})
    if path == "trainer":
        trainer = ZephonTrainer(
            model=model, args=args, pipeline=pipeline, callbacks=callbacks, **changes
        )
    else:
        zephon = ZephonCallback(pipeline, **changes)
        trainer = Trainer(
            model=model, args=args, train_dataset=zephon.train_dataset,
            callbacks=[zephon, *callbacks],
        )  # fmt: skip
    trainer.train(resume_from_checkpoint=resume)
    return model.seen, losses.losses, trainer


def zephon_warnings(caplog) -> list[str]:
    """The WARNING messages Zephon's integrations logged (pytest's ``caplog``)."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and r.name.startswith("zephon_integrations")
    ]
