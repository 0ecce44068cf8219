"""ZephonTrainer: exact resume under transformers.Trainer (single process).

The batches training_step sees after ``resume_from_checkpoint`` equal those of an
uninterrupted run; nothing is skipped, re-read or thrown away.
"""

from __future__ import annotations

import logging
import os

import pytest
import torch
from hf_helpers import CacheSeen, CrashAt, fingerprint, make_pipeline, reference
from transformers import GPT2Config, GPT2LMHeadModel, TrainerCallback, TrainingArguments

from zephon_core import ConfigError, MissingCheckpointState
from zephon_core.checkpoint import codec
from zephon_integrations.hf.trainer import STATE_FILE, ZephonTrainer

# trains models in this process for many seconds per test: `make test-fast` leaves
# them to `make test`
pytestmark = pytest.mark.slow

logging.getLogger("transformers").setLevel(logging.ERROR)


class Recording(ZephonTrainer):
    def training_step(self, model, inputs, *args, **kwargs):
        self.seen.append(fingerprint(inputs))
        loss = super().training_step(model, inputs, *args, **kwargs)
        self.losses.append(float(loss))
        return loss


def run(out, max_steps, resume=None, gas=1, workers=0, limit=2, crash_at=None, losses=None):
    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(vocab_size=256, n_positions=128, n_embd=16, n_layer=1, n_head=2)
    )  # dropout 0.1: the RNG must resume too
    args = TrainingArguments(
        output_dir=str(out),
        max_steps=max_steps,
        per_device_train_batch_size=4,
        save_strategy="steps",
        save_steps=3,
        save_total_limit=limit,
        logging_steps=1000,
        report_to=[],
        gradient_accumulation_steps=gas,
        dataloader_num_workers=workers,
        use_cpu=True,
        disable_tqdm=True,
    )
    t = Recording(
        model=model,
        args=args,
        pipeline=make_pipeline,
        callbacks=[CrashAt(crash_at)] if crash_at else None,
    )
    t.seen = []
    t.losses = losses if losses is not None else []
    t.train(resume_from_checkpoint=resume)
    return t.seen


@pytest.mark.parametrize(
    "gas, workers", [(1, 0), (2, 0), pytest.param(1, 2, marks=pytest.mark.slow)]
)
def test_resume_from_last_checkpoint_continues_the_stream(tmp_path, gas, workers):
    full = run(tmp_path / "a", 8, gas=gas, workers=workers)
    assert full == reference(8 * gas)  # every rank-0 batch is the global stream, none skipped
    first = run(tmp_path / "b", 6, gas=gas, workers=workers)  # saves at steps 3 and 6
    assert first == full[: 6 * gas]
    tail = run(tmp_path / "b", 8, resume=True, gas=gas, workers=workers)
    assert tail == full[6 * gas :]


def test_resume_from_an_explicit_path_and_rotation_keeps_states(tmp_path):
    full = run(tmp_path / "a", 9)
    run(tmp_path / "b", 9)  # saves 3, 6, 9; save_total_limit=2 keeps 6 and 9
    kept = sorted(os.listdir(tmp_path / "b"))
    assert kept == ["checkpoint-6", "checkpoint-9"]
    for ck in kept:
        state = codec.decode((tmp_path / "b" / ck / STATE_FILE).read_bytes())
        assert state["position"] == int(ck.split("-")[1]) and len(state["lanes"]) == 4
    tail = run(tmp_path / "c", 9, resume=str(tmp_path / "b" / "checkpoint-6"))
    assert tail == full[6:]


def test_missing_state_and_missing_max_steps_are_clear_errors(tmp_path):
    run(tmp_path / "b", 3)
    os.remove(tmp_path / "b" / "checkpoint-3" / STATE_FILE)
    with pytest.raises(MissingCheckpointState, match=STATE_FILE):
        run(tmp_path / "b", 6, resume=True)
    with pytest.raises(ConfigError, match="no checkpoint"):
        run(tmp_path / "empty", 6, resume=True)
    model = GPT2LMHeadModel(
        GPT2Config(vocab_size=256, n_positions=128, n_embd=16, n_layer=1, n_head=2)
    )
    with pytest.raises(ConfigError, match="collate inside the pipeline"):
        ZephonTrainer(
            model=GPT2LMHeadModel(GPT2Config(vocab_size=256, n_embd=16, n_layer=1, n_head=2)),
            args=TrainingArguments(
                output_dir=str(tmp_path / "x"), max_steps=3, use_cpu=True, report_to=[]
            ),
            pipeline=make_pipeline,
            data_collator=lambda rows: rows,
        )
    with pytest.raises(ConfigError, match="max_steps"):
        ZephonTrainer(
            model=model,
            args=TrainingArguments(output_dir=str(tmp_path / "x"), use_cpu=True, report_to=[]),
            pipeline=make_pipeline,
        )


def test_resume_reproduces_losses_with_dropout(tmp_path):
    """Same schedule, a crash at step 6, resume: data, RNG and optimizer continue exactly."""
    full_losses, tail_losses = [], []
    full = run(tmp_path / "a", 9, losses=full_losses)
    run(tmp_path / "b", 9, crash_at=6)
    tail = run(tmp_path / "b", 9, resume=True, losses=tail_losses)
    assert tail == full[6:]
    assert tail_losses == full_losses[6:]


def _short_run(out, callbacks, **args) -> ZephonTrainer:
    """A tiny GPT-2 trained by ZephonTrainer on the reference pipeline, nothing saved."""
    model = GPT2LMHeadModel(
        GPT2Config(vocab_size=256, n_positions=128, n_embd=16, n_layer=1, n_head=2)
    )
    args = TrainingArguments(
        output_dir=str(out), per_device_train_batch_size=4, save_strategy="no",
        report_to=[], use_cpu=True, disable_tqdm=True, **args,
    )  # fmt: skip
    t = ZephonTrainer(model=model, args=args, pipeline=make_pipeline, callbacks=callbacks)
    t.train()
    return t


def test_zephon_metrics_are_logged_before_the_reporting_callbacks(tmp_path):
    class Keys(TrainerCallback):
        def __init__(self):
            self.keys = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                self.keys.append(set(logs))

    seen = Keys()
    t = _short_run(tmp_path / "m", [seen], max_steps=4, logging_steps=2)
    logged = [h for h in t.state.log_history if "loss" in h]
    assert len(logged) == 2 and len(seen.keys) == 2
    for h, keys in zip(logged, seen.keys):
        assert 0 < h["zephon/token_share/prose"] < 1 and "zephon/token_share/prose" in keys
        assert h["zephon/documents/code"] > 0


def test_packed_rows_train_without_the_cache_and_get_it_back(tmp_path):
    seen = CacheSeen()
    # use_cache=True: the Trainer's default is False; a user may turn it on
    t = _short_run(tmp_path / "c", [seen], max_steps=3, use_cache=True)
    # packed rows are told apart by position_ids, honoured only without a KV cache
    assert seen.during == [False] * 3
    assert t.model.config.use_cache  # back on for generate() once training ended
