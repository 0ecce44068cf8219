"""The embedded default job shared by the examples: data, tokenizer, pipeline.

Data is real text that ships with Python (``zephon_core.testing.corpora``): the
``pydoc_data.topics`` documentation as prose (70 % of the tokens) and the standard
library's source as code (30 %). The tokenizer is a small byte-level BPE trained
on the spot with ``tokenizers`` -- nothing downloads.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from zephon_core import Pipeline, StaticMixtureWorkSource
from zephon_core.testing import corpora


def train_tokenizer(path: Path, vocab_size: int = 2048) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    texts = [d["text"] for d in corpora.prose()] + [d["text"] for d in corpora.code()]
    tok.train_from_iterator(texts, trainer=trainer)
    tok.save(str(path))


class BatchTokenizer:
    """A picklable batched tokenize function (DataLoader workers may need to pickle it)."""

    def __init__(self, path: Path):
        self.path = str(path)
        self._tok = None

    def __call__(self, payloads: list[dict]) -> list[dict]:
        if self._tok is None:
            from tokenizers import Tokenizer

            self._tok = Tokenizer.from_file(self.path)
        encs = self._tok.encode_batch([p["text"] for p in payloads])
        return [{"input_ids": np.asarray(e.ids, dtype=np.int32)} for e in encs]

    def __getstate__(self) -> dict:
        return {"path": self.path, "_tok": None}

    def zephon_fingerprint(self) -> str:
        """The tokenizer file's content: a checkpoint restores only under the same
        tokenizer, also when another file was written to the same path."""
        import hashlib

        return hashlib.sha256(Path(self.path).read_bytes()).hexdigest()[:32]


def build_pipeline(
    tokenizer_path: Path,
    seq_len: int = 512,
    batch_size: int = 8,
    lanes: int = 4,
    datasets: dict | None = None,
    weights: dict | None = None,
) -> Pipeline:
    """fetch -> tokenize -> split -> pack -> shuffle -> ensure_mixture -> batch, over
    ``datasets`` mixed by token shares ``weights`` (default: prose 70 %, code 30 %)."""
    # token shares, as LLM mixtures are stated; the pipeline measures each document's
    # length with its own tokenizer when it compiles (both corpora are small enough to
    # be measured whole)
    source = StaticMixtureWorkSource(
        datasets or {"prose": corpora.prose(), "code": corpora.code()},
        weights or {"prose": 0.7, "code": 0.3},
        chunk_size=16,
        seed=2026,
        weights_unit="tokens",
    )
    return (
        Pipeline(source, canonical_replicas=lanes, flush_every_k_chunks=2, seed=2026)
        .fetch(parallelism=2)
        .map(BatchTokenizer(tokenizer_path), parallelism=2, name="tokenize", batched=True)
        .split(max_len=seq_len)
        .pack(seq_len=seq_len, bins=8)
        .shuffle(buffer_size=64)
        .ensure_mixture(window=16)
        .batch(batch_size=batch_size)
    )
