"""batch(provenance=True) under a real HF ``Trainer.train()`` and a real Lightning
``trainer.fit``: the model never receives ``provenance``, trains on the same batches as
without it, and each step's provenance is readable where the integration keeps it."""

from __future__ import annotations

import logging

import lightning.pytorch as pl
import pytest
import torch
from helpers import batch_digest, reference_pipeline
from hf_helpers import KEYS, RecordingGPT2, fingerprint, tiny_model
from lightning_helpers import fit
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from zephon_core import Pipeline
from zephon_integrations.hf import ZephonCallback, ZephonTrainer

# trains models in this process for several seconds per test
pytestmark = pytest.mark.slow

logging.getLogger("transformers").setLevel(logging.ERROR)

GAS = 2


def with_provenance() -> Pipeline:
    return reference_pipeline(lanes=4, provenance=True)


def reference(n: int) -> tuple[list[str], list[torch.Tensor]]:
    """The first ``n`` global batches read without a trainer: the fingerprints of what
    the model sees, and their provenance."""
    pipe = with_provenance()
    with pipe.iterate() as it:
        batches = [next(it) for _ in range(n)]
    return [fingerprint(b) for b in batches], [b["provenance"] for b in batches]


class KwargsSeen(RecordingGPT2):
    """Also records the names of the other arguments ``model(**inputs)`` passed."""

    def forward(self, input_ids=None, attention_mask=None, labels=None, position_ids=None, **kw):
        self.kwargs_seen.append(set(kw))
        return super().forward(input_ids, attention_mask, labels, position_ids, **kw)


class StepProvenance(TrainerCallback):
    """Reads the step's provenance where the integration keeps it, at each step's end."""

    def __init__(self, read):
        self.read = read
        self.steps: list[list[torch.Tensor]] = []

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append([t.clone() for t in self.read()])


@pytest.mark.parametrize("path", ["trainer", "callback"])
def test_hf_trainer_keeps_provenance_away_from_the_model(path, tmp_path):
    steps = 4
    model = tiny_model()
    model.__class__ = KwargsSeen
    model.kwargs_seen = []
    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=steps,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=GAS,
        save_steps=3,
        logging_steps=1000,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    if path == "trainer":
        holder: list = []
        step_prov = StepProvenance(lambda: holder[0].zephon_provenance)
        trainer = ZephonTrainer(
            model=model, args=args, pipeline=with_provenance, callbacks=[step_prov]
        )
        holder.append(trainer)
    else:
        zephon = ZephonCallback(with_provenance)
        step_prov = StepProvenance(lambda: zephon.provenance)
        trainer = Trainer(
            model=model,
            args=args,
            train_dataset=zephon.train_dataset,
            callbacks=[zephon, step_prov],
        )
    trainer.train()
    fps, provs = reference(steps * GAS)
    assert model.kwargs_seen and all("provenance" not in kw for kw in model.kwargs_seen)
    assert model.seen == fps  # the same batches as without provenance
    assert len(step_prov.steps) == steps
    for s, got in enumerate(step_prov.steps):
        expected = provs[s * GAS : (s + 1) * GAS]
        assert len(got) == GAS and all(torch.equal(a, b) for a, b in zip(got, expected)), s


# -- Lightning ------------------------------------------------------------------------


class HFModule(pl.LightningModule):
    """A config-built tiny GPT-2 trained the usual way, ``self.model(**batch)``; records
    the batch fingerprints and the datamodule's provenance of every training step."""

    def __init__(self, **_: object):
        super().__init__()
        torch.manual_seed(0)
        self.model = GPT2LMHeadModel(
            GPT2Config(vocab_size=256, n_positions=128, n_embd=16, n_layer=1, n_head=2)
        )
        self.model.config.use_cache = False
        self.seen: list[str] = []
        self.provenance: list[torch.Tensor] = []

    def training_step(self, batch, batch_idx):
        assert "provenance" not in batch
        self.seen.append(batch_digest(batch, KEYS))
        self.provenance.append(self.trainer.datamodule.provenance.clone())
        return self.model(**batch).loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_lightning_fit_keeps_provenance_in_the_datamodule(tmp_path):
    steps = 3
    model, _, dm = fit(
        max_steps=steps,
        ckpt_dir=str(tmp_path),
        accumulate=GAS,
        pipeline=with_provenance,
        model_class=HFModule,
    )
    fps, provs = reference(steps * GAS)
    assert model.seen == fps
    assert len(model.provenance) == steps * GAS
    assert all(torch.equal(a, b) for a, b in zip(model.provenance, provs))
    assert torch.equal(dm.provenance, provs[-1])
