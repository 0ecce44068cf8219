"""Tokenizers, digested by what determines their encodings (``content.py``).

* a ``tokenizers.Tokenizer``: its JSON (``to_str()``), truncation and padding included,
  since its ``encode`` applies them;
* a ``transformers`` fast tokenizer: its backend's JSON *without* truncation and
  padding. transformers sets both on the backend at every call from that call's
  arguments (``tok(x, truncation=True, max_length=64)`` leaves them set), so they are
  call-time state: a tokenizer called once before the pipeline was built encodes as
  one never called;
* another ``transformers`` tokenizer (a slow one): its class name and vocabulary.

:func:`sections` splits the JSON into its top-level parts (``model``, ``normalizer``,
``pre_tokenizer``, ``post_processor``, ``decoder``, ``added_tokens``, ...) so a refusal
can say which one differs.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["sections", "tokenizer_json"]

_DECODER = json.JSONDecoder()


def tokenizer_json(obj: Any, mod: str) -> str | None:
    """The text a tokenizer is digested by, or None when ``obj`` is not a tokenizer."""
    try:
        if mod.startswith("tokenizers") and hasattr(obj, "to_str"):
            return obj.to_str()
        if mod.startswith("transformers"):
            backend = getattr(obj, "backend_tokenizer", None)
            if backend is not None:
                return _without_call_state(backend)
            vocab = getattr(obj, "get_vocab", None)
            if callable(vocab):
                return type(obj).__qualname__ + repr(sorted(vocab().items()))
    except Exception:  # noqa: BLE001 - fall back to the generic object rule
        return None
    return None


def _without_call_state(backend: Any) -> str:
    if backend.truncation is None and backend.padding is None:
        return backend.to_str()
    # the JSON of the same tokenizer never called with truncation/padding, exactly as
    # its own serializer writes it (a copy: the user's tokenizer is not touched)
    clean = type(backend).from_str(backend.to_str())
    clean.no_truncation()
    clean.no_padding()
    return clean.to_str()


def sections(text: str) -> dict[str, str]:
    """``{top-level key: its JSON text}`` of a tokenizer's JSON; ``{"vocabulary": text}``
    for anything that is not a JSON object."""
    try:
        return _top_level(text)
    except ValueError:
        return {"vocabulary": text}


def _top_level(text: str) -> dict[str, str]:
    """Slices of the top-level values, found by the C parser (no re-serialisation: the
    digest of a slice is the digest of exactly what the tokenizer wrote)."""
    out: dict[str, str] = {}
    at = _skip(text, 0)
    if text[at : at + 1] != "{":
        raise ValueError("not an object")
    at = _skip(text, at + 1)
    while text[at : at + 1] != "}":
        key, at = _DECODER.raw_decode(text, at)
        at = _skip(text, at)
        if text[at : at + 1] != ":":
            raise ValueError("no colon")
        start = _skip(text, at + 1)
        _, end = _DECODER.raw_decode(text, start)
        out[str(key)] = text[start:end]
        at = _skip(text, end)
        if text[at : at + 1] == ",":
            at = _skip(text, at + 1)
        elif text[at : at + 1] != "}":
            raise ValueError("no comma")
    return out


def _skip(text: str, at: int) -> int:
    while at < len(text) and text[at] in " \t\r\n":
        at += 1
    return at
