"""The canonical walk behind every content digest (``content.py`` says what it covers).

One dispatch, :func:`feed`, turns any value into bytes for a hash: scalars and
strings by value, arrays by their bytes, containers item by item, functions by their
byte code, defaults, closure and the globals they read, tokenizers by their JSON,
other objects by their type and state. A walk is budgeted (:class:`Budgeted`), so a
huge nested value cannot make compiling slow, and it never names where a user's
function or class lives (module, file, line): moving unchanged code keeps the digest.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import site
import sys
import sysconfig
import types
from collections.abc import Mapping
from typing import Any

import numpy as np

from .code_reads import Path, read_paths
from .tokenizer_digest import tokenizer_json

MAX_DEPTH = 6
_MAX_ITEMS = 4096  # longer containers: length, head and tail
_MAX_ARRAY_BYTES = 1 << 24  # larger arrays: shape, dtype and a strided sample
_MAX_UPDATES = 200_000  # pieces fed per digest before the walk is cut
_MISSING = object()  # a key the code reads that the dict does not hold

__all__ = [
    "Budgeted",
    "MAX_DEPTH",
    "digestible_global",
    "feed",
    "feed_code",
    "global_names",
    "hf_fingerprint",
    "object_state",
    "param_paths",
    "select",
    "type_name",
]


class _Exhausted(Exception):
    pass


class Budgeted:
    """A hash that stops a walk after :data:`_MAX_UPDATES` pieces (deterministically: the
    same value is always cut at the same place), so a huge nested value cannot make
    compiling slow."""

    def __init__(self) -> None:
        self._h = hashlib.blake2b(digest_size=16)
        self._left = _MAX_UPDATES

    def update(self, data: bytes) -> None:
        self._left -= 1
        if self._left < 0:
            raise _Exhausted
        self._h.update(data)

    def walk(self, value: Any, paths: frozenset[Path] | None = None) -> None:
        """Feed ``value`` (only the ``paths`` the code reads of it, when given)."""
        if self._left < 0:
            return
        try:
            if paths is None:
                feed(self, value, 0, set())
            else:
                _feed_selected(self, value, paths, 0, set())
        except _Exhausted:
            self._h.update(b"\x00truncated")

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def hf_fingerprint(obj: Any) -> str | None:
    fp = getattr(obj, "_fingerprint", None)
    mod = type(obj).__module__ or ""
    if isinstance(fp, str) and mod.startswith("datasets"):
        return fp
    return None


def _tag(h: Any, tag: str) -> None:
    h.update(b"\x00" + tag.encode() + b"\x01")


def feed(h: Any, obj: Any, depth: int, seen: set[int]) -> None:  # noqa: C901 - one dispatch
    """Feed a canonical encoding of ``obj`` into the hash ``h``."""
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
    if depth >= MAX_DEPTH or id(obj) in seen:
        _tag(h, "ref:" + type_name(obj))
        return
    seen = seen | {id(obj)}
    own = getattr(obj, "zephon_fingerprint", None)
    if callable(own) and not isinstance(obj, type):
        _tag(h, "user")
        h.update(str(own()).encode())
        return
    text = tokenizer_json(obj, mod)
    if text is not None:
        _tag(h, "tokenizer")
        h.update(text.encode())
        return
    hf = hf_fingerprint(obj)
    if hf is not None:
        _tag(h, "hf")
        h.update(hf.encode())
        return
    if isinstance(obj, Mapping):
        _tag(h, f"map:{len(obj)}")
        for k, v in sorted(obj.items(), key=lambda kv: repr(kv[0]))[:_MAX_ITEMS]:
            feed(h, k, depth + 1, seen)
            feed(h, v, depth + 1, seen)
        return
    if isinstance(obj, (list, tuple, set, frozenset)):
        items = sorted(obj, key=repr) if isinstance(obj, (set, frozenset)) else list(obj)
        _tag(h, f"{type(obj).__name__}:{len(items)}")
        if len(items) > _MAX_ITEMS:
            items = items[: _MAX_ITEMS // 2] + items[-_MAX_ITEMS // 2 :]
        for v in items:
            feed(h, v, depth + 1, seen)
        return
    if isinstance(obj, functools.partial):
        _tag(h, "partial")
        for part in (obj.func, obj.args, obj.keywords):
            feed(h, part, depth + 1, seen)
        return
    if isinstance(obj, types.MethodType):
        _tag(h, "method")
        feed(h, obj.__func__, depth + 1, seen)
        _feed_selected(h, obj.__self__, _self_paths(obj.__func__), depth + 1, seen)
        return
    if isinstance(obj, types.FunctionType):
        _feed_function(h, obj, depth, seen)
        return
    if isinstance(obj, types.CodeType):
        feed_code(h, obj, depth, seen)
        return
    if isinstance(obj, (types.ModuleType, type, types.BuiltinFunctionType, np.ufunc)):
        _tag(h, "name:" + type_name(obj))
        return
    # any other object: its type, its __call__ (callable objects) and its state
    _tag(h, "obj:" + type_name(obj))
    call = inspect.getattr_static(type(obj), "__call__", None) if callable(obj) else None
    if isinstance(call, types.FunctionType):
        _feed_function(h, call, depth + 1, seen)
        _feed_state(h, obj, _self_paths(call), depth + 1, seen)
        return
    feed(h, object_state(obj), depth + 1, seen)


def _feed_array(h: Any, a: np.ndarray) -> None:
    _tag(h, f"array:{a.dtype.str}:{a.shape}")
    if a.dtype.kind == "O":
        for v in a.ravel()[:_MAX_ITEMS]:
            feed(h, v, MAX_DEPTH - 1, set())
        return
    flat = a.reshape(-1)
    if flat.nbytes > _MAX_ARRAY_BYTES:
        flat = flat[:: max(1, flat.nbytes // _MAX_ARRAY_BYTES + 1)]
    h.update(np.ascontiguousarray(flat).tobytes())


def _feed_function(h: Any, fn: types.FunctionType, depth: int, seen: set[int]) -> None:
    _tag(h, "function")
    code = fn.__code__
    feed_code(h, code, depth, seen)
    defaults = fn.__defaults__
    if defaults is not None:  # each default by what the code reads of it
        names = code.co_varnames[: code.co_argcount][-len(defaults) :]
        _tag(h, f"tuple:{len(defaults)}")
        for name, value in zip(names, defaults):
            _feed_selected(h, value, read_paths(code, name, "local"), depth + 2, seen)
    else:
        feed(h, None, depth + 1, seen)
    kw = fn.__kwdefaults__
    if kw is not None:
        _tag(h, f"map:{len(kw)}")
        for name in sorted(kw, key=repr):
            feed(h, name, depth + 2, seen)
            _feed_selected(h, kw[name], read_paths(code, name, "local"), depth + 2, seen)
    else:
        feed(h, None, depth + 1, seen)
    for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            value = None
        _feed_selected(h, value, read_paths(code, name, "free"), depth + 1, seen)
    # Module globals the function reads, where they are constants, functions or
    # tokenizers, or the fields read of a config object. Other globals (loggers,
    # caches, mutable containers) change while a program runs, so only their type counts.
    g = fn.__globals__
    for name in global_names(code):
        if name in g:
            value = g[name]
            _tag(h, "global:" + name)
            if digestible_global(value):
                feed(h, value, depth + 1, seen)
                continue
            picked = select(value, read_paths(code, name, "global"))
            if picked is None:
                _tag(h, "type:" + type_name(value))
            else:
                _feed_picked(h, value, picked, depth + 1, seen)


def digestible_global(value: Any) -> bool:
    """A module global that counts whole (else: its type, or the fields read of it)."""
    return (
        _is_constant(value)
        or isinstance(value, (types.FunctionType, np.ndarray))
        or callable(getattr(value, "zephon_fingerprint", None))
        or tokenizer_json(value, type(value).__module__ or "") is not None
    )


def _is_constant(value: Any) -> bool:
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        return True
    if isinstance(value, (tuple, frozenset)):
        return all(_is_constant(v) for v in value)
    return False


def feed_code(h: Any, code: types.CodeType, depth: int, seen: set[int]) -> None:
    # Byte code, constants and names, not line numbers, file or function names: editing
    # a comment or moving the function keeps its fingerprint.
    _tag(h, f"code:{code.co_argcount}:{code.co_kwonlyargcount}:{code.co_flags}")
    h.update(code.co_code)
    feed(h, code.co_names, depth + 1, seen)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            feed_code(h, c, depth + 1, seen)
        else:
            feed(h, c, depth + 1, seen)


def global_names(code: types.CodeType) -> list[str]:
    names = list(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names += global_names(c)
    return sorted(set(names))


def object_state(obj: Any) -> Any:
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


# -- what the code reads of a captured object ---------------------------------------


def param_paths(code: types.CodeType, index: int) -> frozenset[Path]:
    """What ``code`` reads of its ``index``-th parameter (``self``: 0)."""
    if code.co_argcount <= index:
        return frozenset({()})
    return read_paths(code, code.co_varnames[index], "local")


def _self_paths(fn: Any) -> frozenset[Path]:
    if not isinstance(fn, types.FunctionType):
        return frozenset({()})
    return param_paths(fn.__code__, 0)


def _feed_selected(h: Any, value: Any, paths: frozenset[Path], depth: int, seen: set[int]) -> None:
    picked = select(value, paths)
    if picked is None:
        feed(h, value, depth, seen)
    else:
        _feed_picked(h, value, picked, depth, seen)


def _feed_picked(h: Any, value: Any, picked: dict[str, Any], depth: int, seen: set[int]) -> None:
    _tag(h, f"reads:{type_name(value)}:{len(picked)}")
    for text, sub in picked.items():
        _tag(h, "path:" + text)
        if sub is _MISSING:
            _tag(h, "missing")
        else:
            feed(h, sub, depth + 1, seen)


def _feed_state(h: Any, obj: Any, paths: frozenset[Path], depth: int, seen: set[int]) -> None:
    """A callable object's state: the attributes its ``__call__`` reads of ``self`` when
    that is all it does with it (private ones excepted: caches), else all of it."""
    if _custom_getstate(obj):
        feed(h, object_state(obj), depth, seen)
        return
    public = frozenset(p for p in paths if not (p and str(p[0][1]).startswith("_")))
    picked = select(obj, public)
    if picked is None:
        feed(h, object_state(obj), depth, seen)
    else:
        _feed_picked(h, obj, picked, depth, seen)


def _custom_getstate(obj: Any) -> bool:
    getstate = getattr(type(obj), "__getstate__", None)
    return getstate is not None and getstate is not getattr(object, "__getstate__", None)


def select(value: Any, paths: frozenset[Path]) -> dict[str, Any] | None:
    """``{path text: value there}`` for the paths read of ``value``, or None when the
    whole value counts (some use needs it, or ``value`` is not a plain record of fields:
    a tokenizer, a list, an object with its own digest). A path is cut where a step
    is not a plain field (a property, a method, an index): the value there counts."""
    if () in paths or not _plain(value):
        return None
    picked: dict[Path, Any] = {}
    for path in sorted(paths, key=repr):
        at, cur = (), value
        for step in path:
            nxt = _step(cur, step)
            if nxt is None:
                break
            at, cur = at + (step,), nxt[0]
        if not at:
            return None  # the value itself is used
        picked[at] = cur
    # a shorter path read whole covers the longer ones under it
    keep = {p: v for p, v in picked.items() if not any(q != p and p[: len(q)] == q for q in picked)}
    return {_path_text(p): v for p, v in sorted(keep.items(), key=lambda kv: repr(kv[0]))}


def _plain(value: Any) -> bool:
    """A record of fields: a dict, or an object whose attributes live in its __dict__."""
    if type(value) is dict:
        return True
    if isinstance(
        value, (type, types.ModuleType, types.FunctionType, types.MethodType, Mapping, list)
    ):
        return False
    mod = type(value).__module__ or ""
    if mod.startswith(("torch", "numpy", "transformers", "tokenizers", "datasets")):
        return False
    return (
        isinstance(getattr(value, "__dict__", None), dict)
        and type(value).__getattribute__ is object.__getattribute__
        and not callable(getattr(value, "zephon_fingerprint", None))
    )


def _step(cur: Any, step: tuple[str, Any]) -> tuple[Any] | None:
    kind, key = step
    if kind == "attr":
        if not _plain(cur) or type(cur) is dict:
            return None
        d = cur.__dict__
        on_type = inspect.getattr_static(type(cur), key, None)
        if (
            key not in d
            or hasattr(type(on_type), "__set__")
            or hasattr(type(on_type), "__delete__")
        ):
            return None  # a property or another computed attribute
        return (d[key],)
    if type(cur) is not dict:
        return None
    try:
        return (cur[key],) if key in cur else (_MISSING,)
    except TypeError:  # an unhashable constant
        return None


def _path_text(path: Path) -> str:
    out = ""
    for kind, key in path:
        out += f".{key}" if kind == "attr" else f"[{key!r}]"
    return out


# -- names without locations -----------------------------------------------------------


def type_name(obj: Any) -> str:
    """The name a type, module or builtin is digested by. A class of the user's own code
    counts by its qualified name alone (moving it keeps the digest); a library's by
    ``module.qualname``."""
    target = (
        obj
        if isinstance(obj, (type, types.ModuleType, types.BuiltinFunctionType))
        or callable(obj)
        and hasattr(obj, "__qualname__")
        else type(obj)
    )
    if isinstance(target, types.ModuleType):
        return f"{target.__name__}.{target.__name__}"
    mod = getattr(target, "__module__", None) or getattr(target, "__name__", "")
    qual = getattr(target, "__qualname__", getattr(target, "__name__", "?"))
    return f"{mod}.{qual}" if _library(str(mod)) else str(qual)


@functools.lru_cache(maxsize=1024)
def _library(module: str) -> bool:
    """Is ``module`` part of Python or an installed library (not the user's own code,
    which may be run as ``__main__`` one day and imported the next)?"""
    if module == "__main__":
        return False
    loaded = sys.modules.get(module)
    if loaded is None:
        return False  # loaded from a file without an import (``zephon diff STATE x.py:f``)
    file = getattr(loaded, "__file__", None)
    if not file:
        return True  # builtins, extension-only and frozen modules
    return str(file).startswith(_LIBRARY_ROOTS)


_LIBRARY_ROOTS = tuple(
    sorted(
        {
            p
            for p in [
                *(sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib")),
                *(sysconfig.get_paths().get(k) for k in ("purelib", "platlib")),
                *getattr(site, "getsitepackages", list)(),
                getattr(site, "getusersitepackages", lambda: None)(),
            ]
            if p
        }
    )
)
