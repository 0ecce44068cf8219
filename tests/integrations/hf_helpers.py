"""Shared pieces of the HF Trainer tests: a recording tiny GPT-2 and the reference stream."""

from __future__ import annotations

import torch
from helpers import batch_digest, byte_tokenize, reference_pipeline, source
from transformers import GPT2Config, GPT2LMHeadModel, TrainerCallback

from zephon_core import Pipeline

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
