"""A user function's digest, piece by piece, so a refusal can name what changed.

:func:`function_fingerprint` (``content.py``) is one digest; a state also keeps these
parts (``content["parts"]``), and a restore whose function digest differs compares
them: "closure 'args'.seq_len differs", "global 'tok' (tokenizer) model differs",
"code differs". Parts whose name ends in ``code`` are byte code (of the function or of
a function it calls, which a refactor or another Python changes: ``version=`` vouches
for it); the others are values it captured (a change of parameters).
"""

from __future__ import annotations

import functools
import inspect
import types
from typing import Any

from .code_reads import read_paths
from .digest_walk import (
    Budgeted,
    digestible_global,
    feed_code,
    global_names,
    hf_fingerprint,
    object_state,
    param_paths,
    select,
    type_name,
)
from .tokenizer_digest import sections, tokenizer_json

_MAX_PARTS = 64  # parts kept per function (the digest itself covers everything)
_DEPTH = 2  # functions inside functions named part by part, this deep
_DIGEST_CHARS = 16

__all__ = ["function_parts", "is_code_part"]


def function_parts(fn: Any, version: Any = None) -> dict[str, str]:
    """``{part: digest}`` of a user function (see the module docstring)."""
    if version is not None:
        return {"version": str(version() if callable(version) else version)}
    out: dict[str, str] = {}
    _callable(fn, "", out, 0)
    return dict(sorted(out.items())[:_MAX_PARTS])


def is_code_part(name: str) -> bool:
    """A part that is byte code, not a value the function captured."""
    return name == "code" or name.endswith(" code")


def _digest(value: Any, paths: Any = None) -> str:
    h = Budgeted()
    h.walk(value, paths)
    return h.hexdigest()[:_DIGEST_CHARS]


def _code_digest(code: types.CodeType) -> str:
    h = Budgeted()
    feed_code(h, code, 0, set())
    return h.hexdigest()[:_DIGEST_CHARS]


def _callable(fn: Any, at: str, out: dict[str, str], depth: int) -> None:
    own = getattr(fn, "zephon_fingerprint", None)
    if callable(own) and not isinstance(fn, type):
        out[at + "zephon_fingerprint()"] = _digest(fn)
    elif isinstance(fn, types.FunctionType):
        _function(fn, at, out, depth)
    elif isinstance(fn, functools.partial):
        _callable(fn.func, at, out, depth)
        out[at + "bound arguments"] = _digest((fn.args, fn.keywords))
    elif isinstance(fn, types.MethodType):
        _callable(fn.__func__, at, out, depth)
        _fields(fn.__self__, at + "self", _self_paths(fn.__func__), out)
    else:
        call = inspect.getattr_static(type(fn), "__call__", None)
        if isinstance(call, types.FunctionType):
            _function(call, at + f"{type_name(fn)}.__call__ ", out, depth)
            state = object_state(fn)
            if isinstance(state, dict):
                public = frozenset(p for p in _self_paths(call) if not _private(p))
                _fields(fn, at + "self", public, out, whole=state)
            else:
                out[at + "state"] = _digest(state)
        else:
            out[at + "value"] = _digest(fn)


def _private(path: tuple) -> bool:
    return bool(path) and str(path[0][1]).startswith("_")


def _self_paths(fn: Any) -> frozenset:
    return param_paths(fn.__code__, 0) if isinstance(fn, types.FunctionType) else frozenset({()})


def _function(fn: types.FunctionType, at: str, out: dict[str, str], depth: int) -> None:
    code = fn.__code__
    out[at + "code"] = _code_digest(code)
    defaults = fn.__defaults__ or ()
    positional = code.co_varnames[: code.co_argcount]
    names = positional[len(positional) - len(defaults) :]
    for name, value in [*zip(names, defaults), *(fn.__kwdefaults__ or {}).items()]:
        _value(value, at + f"default {name!r}", read_paths(code, name, "local"), out, depth)
    for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
        try:
            value = cell.cell_contents
        except ValueError:
            value = None
        _value(value, at + f"closure {name!r}", read_paths(code, name, "free"), out, depth)
    g = fn.__globals__
    for name in global_names(code):
        if name not in g:
            continue
        value, where = g[name], at + f"global {name!r}"
        if digestible_global(value):
            _value(value, where, None, out, depth)
        elif select(value, read_paths(code, name, "global")) is None:
            out[where] = _digest("type:" + type_name(value))
        else:
            _value(value, where, read_paths(code, name, "global"), out, depth)


def _value(value: Any, at: str, paths: Any, out: dict[str, str], depth: int) -> None:
    """One captured value: a function part by part (not too deep), a tokenizer section by
    section, a config object field by field, anything else whole."""
    if isinstance(value, types.FunctionType) and depth < _DEPTH:
        _function(value, at + " ", out, depth + 1)
        return
    text = None if hf_fingerprint(value) else tokenizer_json(value, type(value).__module__ or "")
    if text is not None:
        for name, section in sections(text).items():
            out[f"{at} (tokenizer) {name}"] = _digest(section)
        return
    _fields(value, at, paths if paths is not None else frozenset({()}), out)


def _fields(value: Any, at: str, paths: frozenset, out: dict[str, str], whole: Any = None) -> None:
    picked = select(value, paths)
    if picked is None:
        out[at] = _digest(value if whole is None else whole)
        return
    for text, sub in picked.items():
        out[at + text] = _digest(sub)
