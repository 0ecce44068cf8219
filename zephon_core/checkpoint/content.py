"""Content fingerprints: cheap digests of the data and of the user's functions.
(``docs/design.md`` §8)

The configuration fingerprint (``fingerprint.py``) sees names, lengths, weights and
operator parameters. It cannot see rows edited in place, a reordered dataset of the
same length, or another function under the same name, and each of those gives a
different stream. So a checkpoint also stores a digest per component and per
map/filter function, and a restore compares them (``restore.py``):

* a component: ``zephon_fingerprint()`` when the dataset defines one (the HF adapter
  uses ``Dataset._fingerprint``); an HF ``datasets.Dataset`` by its ``_fingerprint``;
  otherwise the rows themselves, all of them up to :data:`FULL_ROWS` rows, else the
  first, the last and :data:`SAMPLED_ROWS` rows picked by the source seed;
* a function: ``version=`` given to ``map``/``filter``; ``zephon_fingerprint()`` when
  the function (or callable object) defines one; otherwise its byte code and
  constants, defaults, closure values, the plain module globals it reads, and for
  callable objects their state (``__getstate__`` if defined, else the public
  attributes: leading-underscore attributes are taken for caches). ``tokenizers``
  and ``transformers`` tokenizers are digested by their JSON.

Sampling is cheap and misses an edit of an unsampled row; the replay value digest
(``value_digest.py``) catches such an edit when it touches a replayed record. Byte
code changes with the Python version: pin a function with ``version=`` to resume a
run under another Python.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import types
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..rng import derive_seed

FULL_ROWS = 64  # datasets up to this many rows are digested whole
SAMPLED_ROWS = 32  # otherwise: first, last and this many seed-picked rows
_MAX_DEPTH = 6
_MAX_ITEMS = 4096  # longer containers: length, head and tail
_MAX_ARRAY_BYTES = 1 << 24  # larger arrays: shape, dtype and a strided sample
_MAX_UPDATES = 200_000  # pieces fed per digest before the walk is cut

__all__ = ["component_fingerprint", "content_fingerprints", "function_fingerprint", "digest_value"]


def content_fingerprints(source: Any, ops: Sequence[Any]) -> dict[str, dict[str, str]]:
    """``{"components": {name: digest}, "ops": {operator name: digest}}`` of a plan."""
    components = getattr(source, "content_fingerprints", None)
    out_ops = {}
    for op in ops:
        fp = op.content_fingerprint()
        if fp is not None:
            out_ops[op.name] = fp
    return {"components": dict(components()) if components is not None else {}, "ops": out_ops}


def component_fingerprint(dataset: Any, read: Any, length: int, key: int) -> str:
    """Digest of one component; ``read(rows)`` reads rows with one batched read."""
    own = getattr(dataset, "zephon_fingerprint", None)
    if callable(own):
        return "user:" + str(own())
    hf = _hf_fingerprint(dataset)
    if hf is not None:
        return "hf:" + hf
    if length <= FULL_ROWS:
        rows = list(range(length))
    else:
        picks = {0, length - 1}
        picks.update(derive_seed(key, "content", i) % length for i in range(SAMPLED_ROWS))
        rows = sorted(picks)
    h = _Budgeted()
    h.walk(length)
    for r, value in zip(rows, read(rows)):
        h.walk(r)
        h.walk(value)
    return "rows:" + h.hexdigest()


def function_fingerprint(fn: Any, version: Any = None) -> str:
    """Digest of a user function (see the module docstring for what it covers)."""
    if version is not None:
        return "version:" + str(version() if callable(version) else version)
    h = _Budgeted()
    h.walk(fn)
    return "code:" + h.hexdigest()


def digest_value(value: Any) -> str:
    """Digest of any value by the rules above (for tests and custom fingerprints)."""
    h = _Budgeted()
    h.walk(value)
    return h.hexdigest()


class _Exhausted(Exception):
    pass


class _Budgeted:
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

    def walk(self, value: Any) -> None:
        if self._left < 0:
            return
        try:
            _feed(self, value, 0, set())
        except _Exhausted:
            self._h.update(b"\x00truncated")

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def _hf_fingerprint(obj: Any) -> str | None:
    fp = getattr(obj, "_fingerprint", None)
    mod = type(obj).__module__ or ""
    if isinstance(fp, str) and mod.startswith("datasets"):
        return fp
    return None


def _tag(h: Any, tag: str) -> None:
    h.update(b"\x00" + tag.encode() + b"\x01")


def _feed(h: Any, obj: Any, depth: int, seen: set[int]) -> None:  # noqa: C901 - one dispatch
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
    # any other object: its type, its __call__ (callable objects) and its state
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
    # Module globals the function reads, where they are constants, functions or
    # tokenizers. Other globals (loggers, caches, mutable containers) change while a
    # program runs, so only their type counts.
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
    # Byte code, constants and names, not line numbers or file names: editing a comment
    # or moving the function keeps its fingerprint.
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


def _tokenizer_json(obj: Any, mod: str) -> str | None:
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
    target = (
        obj
        if isinstance(obj, (type, types.ModuleType, types.BuiltinFunctionType))
        or callable(obj)
        and hasattr(obj, "__qualname__")
        else type(obj)
    )
    mod = getattr(target, "__module__", None) or getattr(target, "__name__", "")
    return f"{mod}.{getattr(target, '__qualname__', getattr(target, '__name__', '?'))}"
