"""Tokenizers count by what determines their encodings (``digests/tokenizer_digest.py``).

A transformers fast tokenizer called once with ``truncation=True`` before the pipeline
was built (transformers leaves the truncation set on its backend) resumes a state
saved with a fresh one; another tokenizer is refused, naming the section that differs.
Tokenizers are trained on the spot: nothing downloads.
"""

from __future__ import annotations

import numpy as np
import pytest
import tokenizers
from helpers import CODE, PROSE
from transformers import PreTrainedTokenizerFast

from zephon_core import IncompatibleCheckpoint, Pipeline, StaticMixtureWorkSource
from zephon_core.digests.content import function_fingerprint
from zephon_core.testing import assert_streams_equal, take

CUT, TAIL = 6, 8


def _train(texts: list[str], vocab_size: int = 320) -> str:
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token=None))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=vocab_size,
        show_progress=False,
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok.to_str()


PROSE_JSON = _train([d["text"] for d in PROSE])


def _hf(text: str = PROSE_JSON) -> PreTrainedTokenizerFast:
    """As ``from_pretrained`` would load it: a new object from the same files."""
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizers.Tokenizer.from_str(text), pad_token="!"
    )


def _pipe(tok) -> Pipeline:
    def encode(p):
        return {"input_ids": np.asarray(tok(p["text"])["input_ids"], dtype=np.int32)}

    src = StaticMixtureWorkSource(
        {"prose": PROSE[:40], "code": CODE[:40]}, {"prose": 0.5, "code": 0.5}, chunk_size=8
    )
    return (
        Pipeline(src, canonical_replicas=2, seed=5, prefetch=0)
        .fetch()
        .map(encode, name="tokenize")
        .split(max_len=48)
        .pack(seq_len=48)
        .batch(batch_size=2)
    )


def test_a_tokenizer_called_with_truncation_before_the_build_resumes_exactly():
    with _pipe(_hf()) as pipe:
        take(pipe, CUT)
        state, tail = pipe.checkpoint(), take(pipe, TAIL)
    tok = _hf()
    # transformers leaves the call's truncation and padding set on the backend
    tok(["warm up", "a"], truncation=True, max_length=64, padding=True)
    assert tok.backend_tokenizer.truncation is not None
    assert tok.backend_tokenizer.padding is not None
    pipe = _pipe(tok)
    pipe.load_state_dict(state)
    assert_streams_equal(tail, take(pipe, TAIL), "resumed with a tokenizer called before")
    pipe.close()


def test_another_tokenizer_is_refused_naming_what_differs():
    with _pipe(_hf()) as pipe:
        take(pipe, CUT)
        state = pipe.checkpoint()
    other = _hf(_train([d["text"] for d in CODE]))
    with pytest.raises(IncompatibleCheckpoint) as ei:
        _pipe(other).load_state_dict(state)
    msg = str(ei.value)
    assert "operator 'tokenize'" in msg and "closure 'tok' (tokenizer) model differs" in msg


def test_a_raw_tokenizer_keeps_its_truncation_in_the_digest():
    # tokenizers.Tokenizer.encode applies its truncation: it is part of what encodes
    def encoder(tok):
        return lambda p: tok.encode(p["text"]).ids

    plain = tokenizers.Tokenizer.from_str(PROSE_JSON)
    truncated = tokenizers.Tokenizer.from_str(PROSE_JSON)
    truncated.enable_truncation(16)
    assert function_fingerprint(encoder(plain)) != function_fingerprint(encoder(truncated))
    assert function_fingerprint(encoder(plain)) == function_fingerprint(
        encoder(tokenizers.Tokenizer.from_str(PROSE_JSON))
    )


def test_the_wrapper_digest_is_the_json_of_a_tokenizer_never_called():
    fresh, called = _hf(), _hf()
    called("x", truncation=True, max_length=8)
    assert function_fingerprint(lambda p: fresh(p)) == function_fingerprint(lambda p: called(p))
    assert called.backend_tokenizer.truncation is not None  # the user's object is untouched
