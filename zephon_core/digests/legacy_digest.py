"""The content digests of states written before per-part digests (main at 03a95f2).

Why: that release digested a captured object whole, by its type's ``module.qualname``
and its state; this one digests only the fields the code reads and names a user's
class without its module (``digest_walk.py``). A function that captures a config
object (``argparse.Namespace``, a dict, a dataclass), a user-class instance or a
``functools.partial`` of one therefore has another digest now, unchanged, and so has a
dataset whose rows are objects of a user class. A restore of such a state recomputes
the digest by that release's rules (``checkpoint/legacy_content.py``): only then, only for the
functions and datasets whose digest differs, so current states cost nothing.

This is 03a95f2's walk, copied whole (nothing shared with ``digest_walk.py``, which
moves on): do not "fix" it, or the digests those states hold stop matching. Example::

    >>> function_fingerprint(len).startswith("code:")
    True
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import types
from collections.abc import Mapping
from typing import Any

import numpy as np

_MAX_DEPTH = 6
_MAX_ITEMS = 4096
_MAX_ARRAY_BYTES = 1 << 24
_MAX_UPDATES = 200_000

__all__ = ["Budgeted", "function_fingerprint"]


def function_fingerprint(fn: Any, version: Any = None) -> str:
    """A function's digest as 03a95f2 computed it."""
    if version is not None:
        return "version:" + str(version() if callable(version) else version)
    h = Budgeted()
    h.walk(fn)
    return "code:" + h.hexdigest()


class _Exhausted(Exception):
    pass


class Budgeted:
    """03a95f2's budgeted hash (``content.component_fingerprint(hasher=)`` takes it for
    a dataset's rows)."""

    def __init__(self) -> None:
        self._h = hashlib.blake2b(digest_size=16)
        self._left = _MAX_UPDATES

    def update(self, data: bytes) -> None:
        self._left -= 1
        if self._left < 0:
            raise _Exhausted
        self._h.update(data)

    def walk(self, value: Any) -> None:
        if self._left < 0:
            return
        try:
            _feed(self, value, 0, set())
        except _Exhausted:
            self._h.update(b"\x00truncated")

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def _tag(h: Any, tag: str) -> None:
    h.update(b"\x00" + tag.encode() + b"\x01")


def _feed(h: Any, obj: Any, depth: int, seen: set[int]) -> None:  # noqa: C901 - one dispatch
    if obj is None or isinstance(obj, (bool, int, float, complex)):
        _tag(h, type(obj).__name__)
        h.update(repr(obj).encode())
        return
    if isinstance(obj, str):
        _tag(h, "str")
        h.update(obj.encode("utf-8", "surrogatepass"))
        return
    if isinstance(obj, (bytes, bytearray, memoryview)):
        _tag(h, "bytes")
        h.update(bytes(obj))
        return
    if isinstance(obj, np.generic):
        _tag(h, "np:" + obj.dtype.str)
        h.update(obj.tobytes())
        return
    if isinstance(obj, np.ndarray):
        _feed_array(h, obj)
        return
    mod = type(obj).__module__ or ""
    if mod.startswith("torch") and hasattr(obj, "detach") and hasattr(obj, "numpy"):
        _feed_array(h, obj.detach().cpu().numpy())
        return
    if depth >= _MAX_DEPTH or id(obj) in seen:
        _tag(h, "ref:" + _qualname(obj))
        return
    seen = seen | {id(obj)}
    own = getattr(obj, "zephon_fingerprint", None)
    if callable(own) and not isinstance(obj, type):
        _tag(h, "user")
        h.update(str(own()).encode())
        return
    text = _tokenizer_json(obj, mod)
    if text is not None:
        _tag(h, "tokenizer")
        h.update(text.encode())
        return
    hf = _hf_fingerprint(obj)
    if hf is not None:
        _tag(h, "hf")
        h.update(hf.encode())
        return
    if isinstance(obj, Mapping):
        _tag(h, f"map:{len(obj)}")
        for k, v in sorted(obj.items(), key=lambda kv: repr(kv[0]))[:_MAX_ITEMS]:
            _feed(h, k, depth + 1, seen)
            _feed(h, v, depth + 1, seen)
        return
    if isinstance(obj, (list, tuple, set, frozenset)):
        items = sorted(obj, key=repr) if isinstance(obj, (set, frozenset)) else list(obj)
        _tag(h, f"{type(obj).__name__}:{len(items)}")
        if len(items) > _MAX_ITEMS:
            items = items[: _MAX_ITEMS // 2] + items[-_MAX_ITEMS // 2 :]
        for v in items:
            _feed(h, v, depth + 1, seen)
        return
    if isinstance(obj, functools.partial):
        _tag(h, "partial")
        for part in (obj.func, obj.args, obj.keywords):
            _feed(h, part, depth + 1, seen)
        return
    if isinstance(obj, types.MethodType):
        _tag(h, "method")
        _feed(h, obj.__func__, depth + 1, seen)
        _feed(h, obj.__self__, depth + 1, seen)
        return
    if isinstance(obj, types.FunctionType):
        _feed_function(h, obj, depth, seen)
        return
    if isinstance(obj, types.CodeType):
        _feed_code(h, obj, depth, seen)
        return
    if isinstance(obj, (types.ModuleType, type, types.BuiltinFunctionType, np.ufunc)):
        _tag(h, "name:" + _qualname(obj))
        return
    _tag(h, "obj:" + _qualname(obj))
    call = inspect.getattr_static(type(obj), "__call__", None) if callable(obj) else None
    if isinstance(call, types.FunctionType):
        _feed_function(h, call, depth + 1, seen)
    _feed(h, _object_state(obj), depth + 1, seen)


def _feed_array(h: Any, a: np.ndarray) -> None:
    _tag(h, f"array:{a.dtype.str}:{a.shape}")
    if a.dtype.kind == "O":
        for v in a.ravel()[:_MAX_ITEMS]:
            _feed(h, v, _MAX_DEPTH - 1, set())
        return
    flat = a.reshape(-1)
    if flat.nbytes > _MAX_ARRAY_BYTES:
        flat = flat[:: max(1, flat.nbytes // _MAX_ARRAY_BYTES + 1)]
    h.update(np.ascontiguousarray(flat).tobytes())


def _feed_function(h: Any, fn: types.FunctionType, depth: int, seen: set[int]) -> None:
    _tag(h, "function")
    _feed_code(h, fn.__code__, depth, seen)
    _feed(h, fn.__defaults__, depth + 1, seen)
    _feed(h, fn.__kwdefaults__, depth + 1, seen)
    for cell in fn.__closure__ or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            value = None
        _feed(h, value, depth + 1, seen)
    g = fn.__globals__
    for name in _global_names(fn.__code__):
        if name in g:
            value = g[name]
            _tag(h, "global:" + name)
            if (
                _is_constant(value)
                or isinstance(value, (types.FunctionType, np.ndarray))
                or callable(getattr(value, "zephon_fingerprint", None))
                or _tokenizer_json(value, type(value).__module__ or "") is not None
            ):
                _feed(h, value, depth + 1, seen)
            else:
                _tag(h, "type:" + _qualname(value))


def _is_constant(value: Any) -> bool:
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        return True
    if isinstance(value, (tuple, frozenset)):
        return all(_is_constant(v) for v in value)
    return False


def _feed_code(h: Any, code: types.CodeType, depth: int, seen: set[int]) -> None:
    _tag(h, f"code:{code.co_argcount}:{code.co_kwonlyargcount}:{code.co_flags}")
    h.update(code.co_code)
    _feed(h, code.co_names, depth + 1, seen)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            _feed_code(h, c, depth + 1, seen)
        else:
            _feed(h, c, depth + 1, seen)


def _global_names(code: types.CodeType) -> list[str]:
    names = list(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names += _global_names(c)
    return sorted(set(names))


def _object_state(obj: Any) -> Any:
    getstate = getattr(type(obj), "__getstate__", None)
    if getstate is not None and getstate is not getattr(object, "__getstate__", None):
        try:
            return obj.__getstate__()
        except Exception:  # noqa: BLE001 - an object that refuses: its public attributes
            pass
    state = getattr(obj, "__dict__", None)
    if isinstance(state, dict):
        return {k: v for k, v in state.items() if not k.startswith("_")}
    return None


def _hf_fingerprint(obj: Any) -> str | None:
    fp = getattr(obj, "_fingerprint", None)
    mod = type(obj).__module__ or ""
    if isinstance(fp, str) and mod.startswith("datasets"):
        return fp
    return None


def _tokenizer_json(obj: Any, mod: str) -> str | None:
    """03a95f2's: a transformers tokenizer's backend JSON with its truncation/padding."""
    try:
        if mod.startswith("tokenizers") and hasattr(obj, "to_str"):
            return obj.to_str()
        if mod.startswith("transformers"):
            backend = getattr(obj, "backend_tokenizer", None)
            if backend is not None:
                return backend.to_str()
            vocab = getattr(obj, "get_vocab", None)
            if callable(vocab):
                return type(obj).__qualname__ + repr(sorted(vocab().items()))
    except Exception:  # noqa: BLE001 - fall back to the generic object rule
        return None
    return None


def _qualname(obj: Any) -> str:
    """``module.qualname``, the user's classes and functions too (the module is what
    this release no longer digests)."""
    target = (
        obj
        if isinstance(obj, (type, types.ModuleType, types.BuiltinFunctionType))
        or callable(obj)
        and hasattr(obj, "__qualname__")
        else type(obj)
    )
    mod = getattr(target, "__module__", None) or getattr(target, "__name__", "")
    return f"{mod}.{getattr(target, '__qualname__', getattr(target, '__name__', '?'))}"
