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
can say which one differs. Cost: one ``to_str()`` per tokenizer and compile
(:func:`shared_texts`), and only the small leading values are parsed: ``model``, the
bulk of the text, is last in the serializer's layout and is sliced, not parsed.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["sections", "shared_texts", "tokenizer_json"]

_DECODER = json.JSONDecoder()
#: the top-level keys of a tokenizers JSON, in the order its serializer writes them
_LAYOUT = (
    "version",
    "truncation",
    "padding",
    "added_tokens",
    "normalizer",
    "pre_tokenizer",
    "post_processor",
    "decoder",
    "model",
)
_MEMO: contextvars.ContextVar[dict[int, tuple[Any, str | None]] | None] = contextvars.ContextVar(
    "zephon_tokenizer_texts", default=None
)


@contextlib.contextmanager
def shared_texts() -> Iterator[None]:
    """Serialize each tokenizer once inside this block (a compile digests a tokenizer for
    the fingerprint and again for the parts; a large one costs tens of ms each time)."""
    token = _MEMO.set({})
    try:
        yield
    finally:
        _MEMO.reset(token)


def tokenizer_json(obj: Any, mod: str) -> str | None:
    """The text a tokenizer is digested by, or None when ``obj`` is not a tokenizer."""
    if not mod.startswith(("tokenizers", "transformers")):
        return None
    memo = _MEMO.get()
    if memo is None:
        return _text(obj, mod)
    hit = memo.get(id(obj))
    if hit is None or hit[0] is not obj:
        hit = memo[id(obj)] = (obj, _text(obj, mod))  # the object is kept: ids stay unique
    return hit[1]


def _text(obj: Any, mod: str) -> str | None:
    try:
        if mod.startswith("tokenizers") and hasattr(obj, "to_str"):
            return obj.to_str()
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
    text = backend.to_str()
    if backend.truncation is None and backend.padding is None:
        return text
    # the JSON of the same tokenizer never called with truncation/padding, as its own
    # serializer writes it: both values null (they come first and are small)
    try:
        return _nulled(text, {"truncation", "padding"})
    except ValueError:  # another layout: a cleared copy (slower; the user's is untouched)
        clean = type(backend).from_str(text)
        clean.no_truncation()
        clean.no_padding()
        return clean.to_str()


def _nulled(text: str, keys: set[str]) -> str:
    out, last, left = [], 0, set(keys)
    for key, start, end in _entries(text, until=lambda: not left):
        if key in left:
            out += [text[last:start], "null"]
            last = end
            left.discard(key)
    if left:
        raise ValueError(f"no {sorted(left)}")
    return "".join(out) + text[last:]


def sections(text: str) -> dict[str, str]:
    """``{top-level key: its JSON text}`` of a tokenizer's JSON; ``{"vocabulary": text}``
    for anything that is not a JSON object."""
    try:
        return {key: text[start:end] for key, start, end in _entries(text)}
    except ValueError:
        return {"vocabulary": text}


def _entries(text: str, until: Callable[[], bool] | None = None) -> Iterator[tuple[str, int, int]]:
    """``(key, value start, value end)`` of a JSON object's top-level entries, found by the
    C parser (slices, not re-serialised values: a digest of a slice is a digest of what
    the tokenizer wrote). When the keys so far are the serializer's layout, the last one
    (``model``) runs to the closing brace and is not parsed. ``until()``: stop early."""
    at = _skip(text, 0)
    if text[at : at + 1] != "{":
        raise ValueError("not an object")
    at, seen = _skip(text, at + 1), []
    while text[at : at + 1] != "}":
        if until is not None and until():
            return
        key, at = _DECODER.raw_decode(text, at)
        at = _skip(text, at)
        if text[at : at + 1] != ":":
            raise ValueError("no colon")
        start = _skip(text, at + 1)
        seen.append(key)
        if tuple(seen) == _LAYOUT:
            close = len(text.rstrip()) - 1
            if text[close] != "}":
                raise ValueError("no closing brace")
            yield str(key), start, start + len(text[start:close].rstrip())
            return
        _, end = _DECODER.raw_decode(text, start)
        yield str(key), start, end
        at = _skip(text, end)
        if text[at : at + 1] == ",":
            at = _skip(text, at + 1)
        elif text[at : at + 1] != "}":
            raise ValueError("no comma")


def _skip(text: str, at: int) -> int:
    while at < len(text) and text[at] in " \t\r\n":
        at += 1
    return at
