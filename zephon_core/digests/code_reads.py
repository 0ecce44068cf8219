"""Which fields of a captured object a function's code reads (``content.py``).

Why: a map closing over ``args`` (an ``argparse.Namespace``, a config dict or
dataclass) reads one or two of its fields. Digesting the whole object refuses a resume
whenever an unrelated field differs (``--resume-from``, an output path), and digesting
nothing misses the field that matters. :func:`read_paths` walks the byte code of a
function, and of the functions nested in it, for every use of one variable and returns
the access paths it reads::

    args.seq_len          -> (("attr", "seq_len"),)
    cfg["vocab"]["size"]  -> (("key", "vocab"), ("key", "size"))
    cfg.get("k", 3)       -> (("get", "k"),)

A use that is anything else (the object passed on, iterated, written, a method called,
a key computed at run time) is the empty path: the whole object counts. Only byte code
is read; nothing runs. Unknown instructions (another Python version) end a path early,
which is the safe direction: more of the object counts, never less.

Byte code differs between the Pythons we support, and each form is read:

* a method loaded for a call -- ``LOAD_METHOD`` up to 3.11; from 3.12 a ``LOAD_ATTR``
  whose argument has its low bit set (``dis`` shows ``NULL|self + get``), which must
  not be read as the field ``.get``;
* the call -- ``CALL_METHOD`` (3.10), ``PRECALL`` + ``CALL`` (3.11), ``CALL`` (3.12 on);
* a closure handed to a nested function -- ``LOAD_CLOSURE`` up to 3.12; from 3.13 a
  ``LOAD_FAST`` of the cell (a cell or free variable is never read by ``LOAD_FAST``
  otherwise: its value is ``LOAD_DEREF``);
* a local loaded by a combined instruction (3.13: ``STORE_FAST_LOAD_FAST``,
  ``LOAD_FAST_LOAD_FAST``): the accesses that follow apply to its last variable.
"""

from __future__ import annotations

import dis
import functools
import sys
import types
from typing import Any

__all__ = ["Path", "read_paths"]

#: one access: ("attr", name), ("key", constant) or ("get", constant)
Step = tuple[str, Any]
Path = tuple[Step, ...]

_SKIP = frozenset({"EXTENDED_ARG", "NOP", "CACHE"})
#: builtins that reach variables without naming them in byte code (``super()`` reads the
#: first argument, ``locals()`` every variable): their presence makes any use whole
_DYNAMIC = frozenset({"super", "locals", "vars", "globals", "eval", "exec"})
_CALL = frozenset({"CALL_METHOD", "PRECALL", "CALL"})
#: from 3.12, ``LOAD_ATTR`` also loads methods: the low bit of its argument says so
_ATTR_LOADS_METHODS = sys.version_info >= (3, 12)
_SIMPLE_LOAD = frozenset({"LOAD_CONST", "LOAD_FAST", "LOAD_DEREF", "LOAD_GLOBAL"})
#: the plain loads of a variable, whose following accesses make a path
_LOADS = {
    "global": frozenset({"LOAD_GLOBAL"}),
    "cell": frozenset({"LOAD_DEREF", "LOAD_CLASSDEREF"}),
    "local": frozenset({"LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_BORROW"}),
}
#: combined instructions of 3.13 whose last step loads a local
_LOADS_LAST = frozenset({"LOAD_FAST_LOAD_FAST", "STORE_FAST_LOAD_FAST"})
#: instructions that name a variable without using its value (a cell being made or
#: handed to a nested function, whose own code is read instead)
_NOT_A_USE = frozenset({"MAKE_CELL", "LOAD_CLOSURE", "COPY_FREE_VARS"})
#: what the opname of an instruction that accesses a variable contains; any such
#: instruction naming the variable that is not a plain load (a store, a delete, a
#: combined load of two locals on a newer Python) makes the whole object count
_VARIABLE_OPS = ("FAST", "DEREF", "GLOBAL", "NAME", "CLOSURE", "CELL")


def read_paths(code: types.CodeType, name: str, kind: str) -> frozenset[Path]:
    """The paths ``code`` reads of the variable ``name``.

    ``kind``: ``"global"`` (a module global), ``"free"`` (a closure cell of the
    function) or ``"local"`` (a parameter, e.g. ``self`` or one with a default).
    The result holds ``()`` when some use needs the whole object.
    """
    if _dynamic(code):
        return frozenset({()})
    if kind == "free":
        return frozenset(_cell_paths(code, name))
    if kind == "local" and name in code.co_cellvars:  # captured by a nested function
        return frozenset(_cell_paths(code, name))
    return frozenset(_paths(code, name, kind, nested=kind == "global"))


def _dynamic(code: types.CodeType) -> bool:
    return not _DYNAMIC.isdisjoint(code.co_names) or any(
        isinstance(c, types.CodeType) and _dynamic(c) for c in code.co_consts
    )


def _cell_paths(code: types.CodeType, name: str) -> list[Path]:
    out = _paths(code, name, "cell", nested=False)
    for c in code.co_consts:  # nested functions that share the cell
        if isinstance(c, types.CodeType) and name in c.co_freevars:
            out += _cell_paths(c, name)
    return out


def _paths(code: types.CodeType, name: str, kind: str, nested: bool) -> list[Path]:
    ins = _instructions(code)
    loads = _LOADS[kind]
    out: list[Path] = []
    cells = frozenset(code.co_cellvars) | frozenset(code.co_freevars)
    for at, i in enumerate(ins):
        if not _names(i, name):
            continue
        if (i.opname in loads and i.argval == name) or _loads_last(i, name, kind):
            out.append(_path_after(ins, at + 1))
        elif i.opname in _NOT_A_USE or (i.opname == "LOAD_FAST" and name in cells):
            continue  # a cell handed to a nested function (3.13 loads it with LOAD_FAST)
        else:
            out.append(())
    if nested:
        for c in code.co_consts:
            if isinstance(c, types.CodeType):
                out += _paths(c, name, kind, nested)
    return out


def _loads_last(i: dis.Instruction, name: str, kind: str) -> bool:
    """A combined instruction (3.13: ``LOAD_FAST_LOAD_FAST``, ``STORE_FAST_LOAD_FAST``)
    whose last step loads the local ``name``, and nothing else of it: ``name`` is then on
    top of the stack, where the accesses that follow apply."""
    v = i.argval
    return (
        kind == "local"
        and i.opname in _LOADS_LAST
        and isinstance(v, tuple)
        and v[-1:] == (name,)
        and name not in v[:-1]
    )


def _names(i: dis.Instruction, name: str) -> bool:
    """Does ``i`` access the variable ``name`` (not an attribute or a constant)?"""
    if not any(k in i.opname for k in _VARIABLE_OPS):
        return False
    v = i.argval
    return v == name if isinstance(v, str) else isinstance(v, tuple) and name in v


@functools.lru_cache(maxsize=256)
def _instructions(code: types.CodeType) -> tuple[dis.Instruction, ...]:
    """A function's instructions, once per compile rather than once per variable."""
    return tuple(i for i in dis.get_instructions(code) if i.opname not in _SKIP)


def _path_after(ins: tuple[dis.Instruction, ...], at: int) -> Path:
    """The attribute/constant-key accesses that follow a load at ``ins[at - 1]``."""
    path: list[Step] = []
    while at < len(ins):
        i = ins[at]
        method = _method(i)
        if method is not None:
            key = _get_key(ins, at + 1) if method == "get" else None
            if key is not None:
                path.append(("get", key[0]))
            break  # any other method: called on the object at ``path``
        if i.opname == "LOAD_ATTR" and isinstance(i.argval, str):
            path.append(("attr", i.argval))
            at += 1
            continue
        nxt = ins[at + 1] if at + 1 < len(ins) else None
        if i.opname == "LOAD_CONST" and nxt is not None and nxt.opname == "BINARY_SUBSCR":
            path.append(("key", i.argval))
            at += 2
            continue
        break
    return tuple(path)


def _method(i: dis.Instruction) -> str | None:
    """The name of the method ``i`` loads for a call, or None (not a method load)."""
    if i.opname == "LOAD_METHOD":
        return str(i.argval)
    if _ATTR_LOADS_METHODS and i.opname == "LOAD_ATTR" and (i.arg or 0) & 1:
        return str(i.argval)
    return None


def _get_key(ins: tuple[dis.Instruction, ...], at: int) -> tuple[Any] | None:
    """``(key,)`` when ``.get`` is called with a constant key (and an optional simple
    default), else None."""
    if at >= len(ins) or ins[at].opname != "LOAD_CONST":
        return None
    key = ins[at].argval
    rest = [i.opname for i in ins[at + 1 : at + 3]]
    if rest[:1] and rest[0] in _CALL and ins[at + 1].arg == 1:
        return (key,)
    if len(rest) == 2 and rest[0] in _SIMPLE_LOAD and rest[1] in _CALL and ins[at + 2].arg == 2:
        return (key,)
    return None
