"""What the content digests cost a compile, with a realistic tokenizer.

A byte-level BPE with 32,000 tokens is trained on the spot (nothing downloads; about
30 s on 2 cores) and wrapped in ``PreTrainedTokenizerFast``; a map closes over it.
Printed, as medians of 9: one ``to_str()`` of the backend (the unit), the content
digests of that map (``content_fingerprints``: the digest and its parts), the same
after the tokenizer was called with ``truncation=True`` (transformers leaves it set on
the backend), and a whole ``compile()`` of a small pipeline using it.

    PYTHONPATH=. python benchmarks/bench_content.py
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import tokenizers
from transformers import PreTrainedTokenizerFast

from zephon_core import Pipeline, StaticMixtureWorkSource
from zephon_core.digests.content import content_fingerprints
from zephon_core.ops.map import MapOp


def _tokenizer() -> PreTrainedTokenizerFast:
    rng = np.random.default_rng(0)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words = ["".join(rng.choice(letters, rng.integers(2, 12))) for _ in range(60_000)]
    texts = [" ".join(rng.choice(words, 200)) for _ in range(6_000)]
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token=None))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=32_000,
        show_progress=False,
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def _median_ms(f, n: int = 9) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> None:
    hf = _tokenizer()

    def encode(p):
        return {"input_ids": np.asarray(hf(p["text"])["input_ids"], dtype=np.int32)}

    docs = [{"text": f"document {i} " * 20} for i in range(200)]

    def build() -> Pipeline:
        src = StaticMixtureWorkSource({"docs": docs}, chunk_size=8)
        return Pipeline(src, canonical_replicas=2).fetch().map(encode).split(64).batch(4)

    op = MapOp(encode, name="tokenize")
    unit = _median_ms(lambda: hf.backend_tokenizer.to_str())
    print(f"json: {len(hf.backend_tokenizer.to_str()) / 1e6:.2f} MB")
    print(f"one to_str(): {unit:.1f} ms")
    print(
        f"content digests of the map: {_median_ms(lambda: content_fingerprints(None, [op])):.1f} ms"
    )
    print(f"compile(): {_median_ms(lambda: build().compile()):.1f} ms")
    hf("warm up", truncation=True, max_length=64)
    print(
        "after a truncating call: content digests "
        f"{_median_ms(lambda: content_fingerprints(None, [op])):.1f} ms, "
        f"compile() {_median_ms(lambda: build().compile()):.1f} ms"
    )


if __name__ == "__main__":
    main()
