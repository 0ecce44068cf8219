"""``zephon trace`` against what a real HF ``Trainer.train()`` and a real Lightning
``trainer.fit`` fed the model: record every micro-batch the model received, then trace a
step after a saved checkpoint with ``--accum`` and compare the traced rows' tokens."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from helpers import CODE, PROSE, byte_tokenize
from hf_helpers import RecordingGPT2, tiny_model
from lightning_helpers import Tiny, fit
from transformers import TrainingArguments

from zephon_core.testing import take
from zephon_integrations.hf import ZephonTrainer

# trains models in this process for several seconds per test
pytestmark = pytest.mark.slow

logging.getLogger("transformers").setLevel(logging.ERROR)

GAS = 2
DATASETS = {"prose": PROSE, "code": CODE}
FACTORIES = """
from hf_helpers import make_pipeline as hf_pipeline
from lightning_helpers import make_pipeline as lightning_pipeline
"""


def trace(cwd: Path, *args: str) -> dict:
    """``zephon trace ARGS --json`` in this process; the document."""
    from click.testing import CliRunner

    from zephon_core.cli.commands import cli

    (cwd / "trained.py").write_text(FACTORIES)
    r = CliRunner().invoke(cli, ["trace", *args, "--json"])
    assert r.exit_code == 0, (r.output, r.exception)
    return json.loads(r.stdout)


def traced_rows(out: dict) -> list[list[int]]:
    """Each row of a traced output rebuilt from its segments: the documents' tokens."""
    rows = []
    for row in out["rows"]:
        ids: list[int] = []
        for seg in row["segments"]:
            assert seg["offset"] == len(ids)  # packed: pieces follow one another
            doc = DATASETS[seg["dataset_name"]][seg["dataset_row"]]
            ids += byte_tokenize(doc)["input_ids"][seg["token_start"] : seg["token_end"]].tolist()
        rows.append(ids)
    return rows


def assert_same_rows(out: dict, input_ids: torch.Tensor, labels: torch.Tensor) -> None:
    """The traced rows are the received batch's tokens; the rest of each row is padding."""
    rows = traced_rows(out)
    assert len(rows) == input_ids.shape[0]
    for r, ids in enumerate(rows):
        assert input_ids[r, : len(ids)].tolist() == ids, r
        assert bool((labels[r, len(ids) :] == -100).all()), r


class InputsSeen(RecordingGPT2):
    """Also records the tensors of every training forward."""

    def forward(self, input_ids=None, attention_mask=None, labels=None, position_ids=None, **kw):
        if self.training:
            self.inputs.append((input_ids.clone(), labels.clone()))
        return super().forward(input_ids, attention_mask, labels, position_ids, **kw)


def test_trace_matches_what_an_hf_trainer_trained_on(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = tiny_model()
    model.__class__ = InputsSeen
    model.inputs = []
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=6,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=GAS,
        save_steps=2,
        logging_steps=1000,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    from hf_helpers import make_pipeline

    ZephonTrainer(model=model, args=args, pipeline=make_pipeline).train()
    assert len(model.inputs) == 6 * GAS  # forward k is micro-step k % GAS of step k // GAS
    # the output_dir: the nearest checkpoint at or before the step is used
    doc = trace(tmp_path, "out", "trained:hf_pipeline", "--step", "3", "--to", "5",
                "--accum", str(GAS), "--dp", "1")  # fmt: skip
    assert doc["checkpoint"]["path"].endswith("checkpoint-2")
    assert (doc["checkpoint"]["step"], doc["checkpoint"]["position"]) == (2, 2 * GAS)
    assert [s["step"] for s in doc["steps"]] == [3, 4, 5]
    for s in doc["steps"]:
        assert [o["micro_step"] for o in s["outputs"]] == list(range(GAS))
        for out in s["outputs"]:
            assert_same_rows(out, *model.inputs[s["step"] * GAS + out["micro_step"]])
    # one checkpoint-N/ directly; the global batch names the same layout
    doc = trace(tmp_path, "out/checkpoint-4", "trained:hf_pipeline", "--step", "5",
                "--global-batch", str(4 * GAS), "--accum", str(GAS))  # fmt: skip
    for out in doc["steps"][0]["outputs"]:
        assert_same_rows(out, *model.inputs[5 * GAS + out["micro_step"]])


class TinyInputs(Tiny):
    """Also records (global_step, input_ids, labels) of every training batch."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.inputs: list[tuple[int, torch.Tensor, torch.Tensor]] = []

    def training_step(self, batch, batch_idx):
        self.inputs.append((self.global_step, batch["input_ids"].clone(), batch["labels"].clone()))
        return super().training_step(batch, batch_idx)


def test_trace_matches_what_a_lightning_fit_trained_on(tmp_path, monkeypatch):
    from lightning_helpers import make_pipeline, step_checkpoint

    monkeypatch.chdir(tmp_path)
    model, _, _ = fit(
        max_steps=5,
        ckpt_dir=str(tmp_path / "ckpts"),
        accumulate=GAS,
        every_n_train_steps=2,
        pipeline=make_pipeline,
        model_class=TinyInputs,
    )
    by_step: dict[int, list] = {}
    for step, ids, labels in model.inputs:
        by_step.setdefault(step, []).append((ids, labels))
    assert sorted(by_step) == list(range(5)) and all(len(v) == GAS for v in by_step.values())
    ckpt = step_checkpoint(str(tmp_path / "ckpts"), 2)
    doc = trace(tmp_path, ckpt, "trained:lightning_pipeline", "--step", "3", "--to", "4",
                "--accum", str(GAS), "--dp", "1")  # fmt: skip
    assert (doc["checkpoint"]["step"], doc["checkpoint"]["position"]) == (2, 2 * GAS)
    for s in doc["steps"]:
        for out in s["outputs"]:
            assert_same_rows(out, *by_step[s["step"]][out["micro_step"]])
    # the directory (with last.ckpt at step 5): the nearest at or before step 3 is step 2's
    doc = trace(tmp_path, "ckpts", "trained:lightning_pipeline", "--step", "3", "--accum", "2")
    assert Path(doc["checkpoint"]["path"]).name == Path(ckpt).name
    # and the stream itself agrees: the traced positions are the global stream's
    with make_pipeline().with_provenance() as pipe:
        batches = take(pipe, 8)
    assert [o["position"] for o in doc["steps"][0]["outputs"]] == [6, 7]
    assert torch.equal(batches[6]["input_ids"], by_step[3][0][0])
