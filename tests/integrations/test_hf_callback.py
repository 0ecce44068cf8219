"""ZephonCallback in an unmodified transformers.Trainer, on one process.

The batches the model sees after ``resume_from_checkpoint`` equal those of an
uninterrupted run, whatever accelerate wrapper the Trainer uses; nothing is skipped,
read twice or thrown away. Multi-process runs are in test_hf_multiprocess.py.
"""

from __future__ import annotations

import logging
import os
import shutil

import pytest
from helpers import byte_tokenize, source
from hf_helpers import (
    CacheSeen,
    CrashAt,
    LossLog,
    make_pipeline,
    ragged_pipeline,
    reference,
    tiny_model,
)
from transformers import Trainer, TrainerCallback, TrainingArguments

from zephon_core import ConfigError, MissingCheckpointState, Pipeline
from zephon_core.checkpoint import codec
from zephon_integrations.hf import ZephonCallback
from zephon_integrations.hf import callback as callback_module
from zephon_integrations.hf.checkpoint_dir import STATE_FILE

# trains models in this process for many seconds per test: `make test-fast` leaves
# them to `make test`
pytestmark = pytest.mark.slow

logging.getLogger("transformers").setLevel(logging.ERROR)


def make_args(out, max_steps, gas=1, workers=0, dispatch=True, limit=None, batch_size=4):
    return TrainingArguments(
        output_dir=str(out),
        max_steps=max_steps,
        per_device_train_batch_size=batch_size,
        gradient_accumulation_steps=gas,
        save_steps=3,
        save_total_limit=limit,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=workers,
        accelerator_config={"dispatch_batches": dispatch},
    )


def run(out, max_steps, resume=None, crash_at=None, resume_from=None, pipeline=make_pipeline, **kw):
    model = tiny_model()
    losses = LossLog()
    zephon = ZephonCallback(pipeline, resume_from=resume_from)
    callbacks = [zephon, losses] + ([CrashAt(crash_at)] if crash_at else [])
    trainer = Trainer(
        model=model,
        args=make_args(out, max_steps, **kw),
        train_dataset=zephon.train_dataset,
        callbacks=callbacks,
    )
    trainer.train(resume_from_checkpoint=resume)
    return model.seen, losses.losses


@pytest.mark.parametrize(
    "gas, workers, dispatch",
    [
        (1, 0, True),
        (2, 0, True),
        pytest.param(1, 2, True, marks=pytest.mark.slow),
        pytest.param(2, 2, False, marks=pytest.mark.slow),
    ],
)
def test_resume_continues_the_stream_exactly(tmp_path, gas, workers, dispatch):
    kw = dict(gas=gas, workers=workers, dispatch=dispatch)
    full, full_losses = run(tmp_path / "a", 8, **kw)
    assert full == reference(8 * gas)  # the global stream, nothing skipped or repeated
    first, _ = run(tmp_path / "b", 8, crash_at=6, **kw)  # saves at 3 and 6, then "crashes"
    assert first == full[: 6 * gas]
    tail, tail_losses = run(tmp_path / "b", 8, resume=True, **kw)
    assert tail == full[6 * gas :]
    # data, optimizer and RNG (dropout is on) all continue: the losses are identical
    assert tail_losses == full_losses[6:]


def test_without_the_rng_restore_the_losses_differ(tmp_path, monkeypatch):
    """The Trainer's own RNG restore comes before the resumed loader draws its seeds;
    the callback's second restore is what makes the losses equal above."""
    _, full_losses = run(tmp_path / "a", 8)
    run(tmp_path / "b", 8, crash_at=6)
    monkeypatch.setattr(callback_module, "restore_rng", lambda *a: False)
    tail, tail_losses = run(tmp_path / "b", 8, resume=True)
    assert tail == reference(8)[6:]
    assert tail_losses != full_losses[6:]


def test_rotation_keeps_states_and_explicit_paths_resolve(tmp_path):
    full, _ = run(tmp_path / "a", 9)
    run(tmp_path / "b", 9, limit=2)  # saves 3, 6, 9; save_total_limit=2 keeps 6 and 9
    kept = sorted(os.listdir(tmp_path / "b"))
    assert kept == ["checkpoint-6", "checkpoint-9"]
    for ck in kept:
        state = codec.decode((tmp_path / "b" / ck / STATE_FILE).read_bytes())
        assert state["position"] == int(ck.split("-")[1]) and len(state["lanes"]) == 4
    # a path outside output_dir, as given to train(): found without help
    tail, _ = run(tmp_path / "c", 9, resume=str(tmp_path / "b" / "checkpoint-6"))
    assert tail == full[6:]
    # the explicit override wins over output_dir/checkpoint-<step>
    shutil.copytree(tmp_path / "b" / "checkpoint-6", tmp_path / "moved")
    tail, _ = run(
        tmp_path / "d", 9, resume=str(tmp_path / "moved"), resume_from=str(tmp_path / "moved")
    )
    assert tail == full[6:]


def test_checkpoint_of_another_step_is_refused(tmp_path):
    run(tmp_path / "b", 6)
    with pytest.raises(ConfigError, match="saved at step 3"):
        run(
            tmp_path / "b",
            9,
            resume=str(tmp_path / "b" / "checkpoint-6"),
            resume_from=str(tmp_path / "b" / "checkpoint-3"),
        )


def test_missing_state_is_a_clear_error(tmp_path):
    run(tmp_path / "b", 3)
    os.remove(tmp_path / "b" / "checkpoint-3" / STATE_FILE)
    with pytest.raises(MissingCheckpointState, match=STATE_FILE):
        run(tmp_path / "b", 6, resume=True)


def test_batch_size_mismatch_and_missing_max_steps_are_clear_errors(tmp_path):
    with pytest.raises(ConfigError, match="batch_size=4.*train_batch_size=8"):
        run(tmp_path / "a", 3, batch_size=8)
    with pytest.raises(ConfigError, match="max_steps"):
        Trainer(
            model=tiny_model(),
            callbacks=[ZephonCallback(make_pipeline)],
            args=TrainingArguments(output_dir=str(tmp_path / "x"), use_cpu=True, report_to=[]),
        )


def test_misuse_is_named(tmp_path):
    # the callback added after construction cannot switch the data skip off in time
    zephon = ZephonCallback(make_pipeline)
    trainer = Trainer(
        model=tiny_model(), args=make_args(tmp_path / "a", 3), train_dataset=zephon.train_dataset
    )
    trainer.add_callback(zephon)
    with pytest.raises(ConfigError, match="at construction"):
        trainer.train()
    # the callback's dataset given to a Trainer without the callback
    trainer = Trainer(
        model=tiny_model(),
        args=make_args(tmp_path / "b", 3),
        train_dataset=ZephonCallback(make_pipeline).train_dataset,
    )
    with pytest.raises(ConfigError, match="callbacks=\\[cb\\]"):
        trainer.train()
    # another dataset given with the callback
    other = ZephonCallback(make_pipeline)
    trainer = Trainer(
        model=tiny_model(),
        args=make_args(tmp_path / "c", 3),
        train_dataset=other.train_dataset,
        callbacks=[ZephonCallback(make_pipeline)],
    )
    with pytest.raises(ConfigError, match="not this callback's"):
        trainer.train()


@pytest.mark.slow
def test_trainer_workers_move_into_zephon(tmp_path):
    zephon = ZephonCallback(make_pipeline)
    trainer = Trainer(
        model=tiny_model(),
        args=make_args(tmp_path / "a", 3, workers=2),
        train_dataset=zephon.train_dataset,
        callbacks=[zephon],
    )
    assert trainer.args.dataloader_num_workers == 0 and zephon.num_workers == 2
    assert trainer.args.ignore_data_skip


def test_batch_shapes_are_known_before_training():
    # batches padded to their longest row: dispatching them is refused with 2 ranks
    assert not callback_module._fixed_shape(ragged_pipeline())
    assert callback_module._fixed_shape(make_pipeline())
    assert callback_module._rows_per_output(make_pipeline(), 4) == 4
    with pytest.raises(ConfigError, match="train_batch_size=8"):
        callback_module._rows_per_output(make_pipeline(), 8)


def test_checkpointing_off_is_refused_before_training(tmp_path):
    def untracked():
        return (
            Pipeline(source(8), canonical_replicas=4, seed=11, checkpointing=False)
            .fetch()
            .map(byte_tokenize, name="tokenize")
            .split(max_len=128)
            .batch(batch_size=4, seq_len=128)
        )

    with pytest.raises(ConfigError, match="checkpointing=False"):
        run(tmp_path / "a", 3, pipeline=untracked)


def test_sharded_ranks_read_own_lanes_only_when_an_output_is_a_batch():
    from types import SimpleNamespace

    from accelerate.data_loader import IterableDatasetShard

    rows = ZephonCallback(make_pipeline).train_dataset
    for split in (False, True):
        shard = IterableDatasetShard(
            rows, batch_size=4, num_processes=2, process_index=1, split_batches=split
        )
        loader = SimpleNamespace(dataset=shard)
        batched = callback_module._read_layout(loader, rows, 4, batched=True)
        records = callback_module._read_layout(loader, rows, 4, batched=False)
        assert batched.own_lanes is not split and batched.process_index == 1
        # records: every rank reads the global stream and the shard keeps its slice
        assert not records.own_lanes and records.reads


def test_an_interrupted_save_names_the_latest_complete_checkpoint(tmp_path):
    from zephon_core import MissingCheckpointState
    from zephon_integrations.hf.checkpoint_dir import read_state, write_state

    state = make_pipeline().checkpoint()
    for step in (3, 6, 9):
        (tmp_path / f"checkpoint-{step}").mkdir()
    write_state(str(tmp_path / "checkpoint-3"), state)
    write_state(str(tmp_path / "checkpoint-6"), state)
    # checkpoint-9: the Trainer's files are there, Zephon's never came (a crash)
    with pytest.raises(MissingCheckpointState, match="interrupted.*checkpoint-6"):
        read_state(str(tmp_path / "checkpoint-9"))
    assert read_state(str(tmp_path / "checkpoint-6")) == state
    lone = tmp_path / "elsewhere" / "checkpoint-5"
    lone.mkdir(parents=True)
    with pytest.raises(MissingCheckpointState, match="not written with"):
        read_state(str(lone))


def test_zephon_metrics_reach_the_trainer_logs(tmp_path):
    model = tiny_model()
    zephon = ZephonCallback(make_pipeline)
    seen = LogKeys()
    trainer = Trainer(
        model=model,
        args=make_args(tmp_path / "m", 4),
        train_dataset=zephon.train_dataset,
        callbacks=[zephon, seen],  # after the callback: it sees the metrics in the logs
    )
    trainer.train()
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logged) == 4
    for h in logged:
        assert 0 < h["zephon/token_share/prose"] < 1
        # document weights: the target is stated as a document share
        assert h["zephon/document_share_target/prose"] == pytest.approx(0.7)
        assert "zephon/token_share_target/prose" not in h
        assert h["zephon/epochs/code"] > 0
    tokens = [h["zephon/tokens/prose"] + h["zephon/tokens/code"] for h in logged]
    assert tokens == sorted(tokens) and tokens[0] > 0  # cumulative, growing
    assert seen.keys and all("zephon/token_share/prose" in keys for keys in seen.keys)


class LogKeys(TrainerCallback):
    def __init__(self):
        self.keys = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.keys.append(set(logs))


@pytest.mark.parametrize("pipeline, cache_after", [(make_pipeline, False), (ragged_pipeline, True)])
def test_packed_rows_turn_the_model_cache_off(tmp_path, pipeline, cache_after):
    model = tiny_model()
    args = make_args(tmp_path / "c", 1)
    args.use_cache = True  # the Trainer's default is False; a user may turn it on
    zephon = ZephonCallback(pipeline)
    seen = CacheSeen()
    trainer = Trainer(
        model=model, args=args, train_dataset=zephon.train_dataset, callbacks=[zephon, seen]
    )
    assert model.config.use_cache
    trainer.train()
    # packed rows tell documents apart by position_ids, which Transformers honours only
    # without a KV cache (test_packed_models.py); padded rows keep their attention_mask
    assert seen.during and set(seen.during) == {cache_after}
    assert model.config.use_cache  # back on for generate() once training ended
