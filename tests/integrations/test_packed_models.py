"""Packed batches give real Transformers models the same per-document losses as the
documents run one by one (GPT-2 and Llama built from configs, eager and SDPA).

This is what ``ops/packed_batch.py`` promises key by key: labels masked at every
document start, ``position_ids`` restarting per document and attention kept inside a
document -- through the restarting positions (``attention="position_ids"``, with
``use_cache=False``) or a 4-D block mask (``attention="mask_4d"``).
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from zephon_core import Pipeline, StaticMixtureWorkSource
from zephon_core.testing import take

# trains models in this process for many seconds per test: `make test-fast` leaves
# them to `make test`
pytestmark = pytest.mark.slow

logging.getLogger("transformers").setLevel(logging.ERROR)

VOCAB, SEQ = 97, 32


def _model(family: str, impl: str):
    torch.manual_seed(3)
    if family == "gpt2":
        cfg = GPT2Config(
            vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2,
            attn_implementation=impl, bos_token_id=0, eos_token_id=0,
        )  # fmt: skip
        return GPT2LMHeadModel(cfg).eval()
    cfg = LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ,
        attn_implementation=impl, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    return LlamaForCausalLM(cfg).eval()


def _docs(n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"ids": rng.integers(1, VOCAB, rng.integers(2, 50))} for _ in range(n)]


def _pipeline(attention: str) -> Pipeline:
    src = StaticMixtureWorkSource({"a": _docs(40, 1), "b": _docs(30, 2)}, chunk_size=8, seed=5)
    return (
        Pipeline(src, canonical_replicas=2, flush_every_k_chunks=2, seed=1)
        .fetch()
        .map(lambda p: {"input_ids": p["ids"].astype(np.int32)}, name="ids")
        .split(max_len=SEQ)  # documents longer than a row become fragments (documents too)
        .pack(seq_len=SEQ, bins=3)
        .batch(batch_size=3, attention=attention)
    )


def _token_losses(model, batch: dict, logits: torch.Tensor | None = None, **kw) -> torch.Tensor:
    """Per-token losses of ``batch`` (from ``logits`` when the caller already ran it)."""
    if logits is None:
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        with torch.no_grad():
            logits = model(**inputs, **kw).logits
    labels = batch["labels"][:, 1:]
    losses = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, VOCAB), labels.reshape(-1), reduction="none", ignore_index=-100
    )
    return losses.reshape(labels.shape)


def _segments(batch: dict) -> list[tuple[int, int, int]]:
    """(row, start, end) of every real document segment of a packed batch."""
    out = []
    for r, (pos, lab) in enumerate(zip(batch["position_ids"], batch["labels"])):
        starts = (pos == 0).nonzero().flatten().tolist() + [len(pos)]
        for a, b in zip(starts, starts[1:]):
            if (lab[a + 1 : b] != -100).any() or (b - a == 1 and lab[a] == -100):
                out.append((r, a, b))
    return out


def _alone(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=ids[None]).logits[0]
    return torch.nn.functional.cross_entropy(logits[:-1], ids[1:], reduction="none")


def _check_equal(model, attention: str, batches: list[dict], logits=None, **kw) -> int:
    checked = 0
    for i, batch in enumerate(batches):
        losses = _token_losses(model, batch, None if logits is None else logits[i], **kw)
        for r, a, b in _segments(batch):
            ids = batch["input_ids"][r, a:b]
            if len(ids) < 2 or batch["labels"][r, a + 1 : b].eq(-100).all():
                continue  # the padding tail
            packed = losses[r, a : b - 1]  # position t predicts token t + 1 of the document
            torch.testing.assert_close(packed, _alone(model, ids), atol=2e-5, rtol=1e-4)
            checked += 1
    return checked


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("attention", ["position_ids", "mask_4d"])
def test_packed_rows_give_the_per_document_losses(family, impl, attention):
    with _pipeline(attention) as pipe:
        batches = take(pipe, 4)
    assert all("attention_mask" not in b for b in batches) == (attention == "position_ids")
    model = _model(family, impl)
    kw = {"use_cache": False} if attention == "position_ids" else {}
    # every document of every row (several per row) matches its separate run
    assert _check_equal(model, attention, batches, **kw) >= 12
    # and the loss a trainer computes (labels -100 at document starts) is their mean
    b = batches[0]
    with torch.no_grad():
        loss = model(**b, **kw).loss
    assert torch.isclose(loss, _token_losses(model, b, **kw)[b["labels"][:, 1:] != -100].mean())


def test_with_a_cache_transformers_attends_across_documents():
    """Why the integrations turn the cache off: with ``use_cache`` on, Transformers does
    not derive the per-document mask from ``position_ids`` (5.x)."""
    with _pipeline("position_ids") as pipe:
        batches = take(pipe, 2)
    model = _model("llama", "sdpa")
    assert model.config.use_cache
    with pytest.raises(AssertionError):
        _check_equal(model, "position_ids", batches)  # default: cache on, crosses documents


def _padded_pipeline() -> Pipeline:
    src = StaticMixtureWorkSource({"a": _docs(40, 1)}, chunk_size=8, seed=5)
    return (
        Pipeline(src, canonical_replicas=2, seed=1)
        .fetch()
        .map(lambda p: {"input_ids": p["ids"][:SEQ].astype(np.int32)}, name="ids")
        .batch(batch_size=3, pad_to="longest")
    )


@pytest.mark.parametrize(
    "packed, built_in", [(True, "__init__"), (True, "configure_model"), (False, "__init__")]
)
def test_lightning_fit_keeps_attention_inside_documents(packed, built_in, caplog):
    """A LightningModule wrapping a Transformers model with ``use_cache=True`` (built in
    ``__init__``, or in ``configure_model`` as large models are) and a training_step that
    calls it plainly: ZephonDataModule turns the cache off for packed rows, so the losses
    the module trains on are the per-document ones; padded rows keep their attention
    mask and the model its cache."""
    import lightning.pytorch as pl

    from zephon_integrations.lightning import ZephonDataModule

    class Wrapper(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = _model("llama", "sdpa") if built_in == "__init__" else None
            self.seen: list[dict] = []

        def configure_model(self):
            if self.model is None:
                self.model = _model("llama", "sdpa")
                assert self.model.config.use_cache

        def training_step(self, batch, batch_idx):
            out = self.model(**batch)  # no use_cache=: the config decides
            self.seen.append((batch, out.logits.detach(), self.model.config.use_cache))
            return out.loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)  # weights stay as built

    module = Wrapper()
    pipeline = (lambda: _pipeline("position_ids")) if packed else _padded_pipeline
    dm = ZephonDataModule(pipeline=pipeline)
    trainer = pl.Trainer(
        max_steps=3, accelerator="cpu", logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="zephon_integrations"):
        trainer.fit(module, datamodule=dm)
    assert {cache for _, _, cache in module.seen} == {not packed}
    assert ("use_cache is set to False" in caplog.text) is packed
    assert module.model.config.use_cache  # back on for generate() once fit ended
    if packed:  # the logits the module trained on: every document's own
        batches = [b for b, _, _ in module.seen]
        logits = [lg for _, lg, _ in module.seen]
        assert _check_equal(module.model.eval(), "position_ids", batches, logits=logits) >= 6
