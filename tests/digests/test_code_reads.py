"""``code_reads.read_paths``: the fields a function's byte code reads of one variable.

Every use that is not a constant field read must come back as the empty path (the whole
object counts): a field read wrongly left out would let a real change through.
"""

from __future__ import annotations

from typing import NamedTuple

import pytest

from zephon_core.digests import code_reads
from zephon_core.digests.code_reads import read_paths


def _closure_paths(fn, name: str) -> set:
    return set(read_paths(fn.__code__, name, "free"))


def test_attribute_key_and_get_reads():
    def build(args, cfg):
        def fn(p):
            return args.seq_len, args.model.dim, cfg["k"], cfg.get("j"), cfg.get("m", 3)

        return fn

    fn = build(None, None)
    assert _closure_paths(fn, "args") == {
        (("attr", "seq_len"),),
        (("attr", "model"), ("attr", "dim")),
    }
    assert _closure_paths(fn, "cfg") == {(("key", "k"),), (("get", "j"),), (("get", "m"),)}


def test_nested_functions_sharing_the_cell_count_and_shadowing_ones_do_not():
    def build(args):
        def fn(p):
            inner = lambda q: args.depth  # noqa: E731
            shadow = lambda args: args.anything  # noqa: E731 - another variable
            return inner(p), shadow(p)

        return fn

    assert _closure_paths(build(None), "args") == {(("attr", "depth"),)}


def test_every_other_use_needs_the_whole_object():
    def passes(args):
        return lambda p: print(args)

    def calls_a_method(args):
        return lambda p: args.method()

    def computed_key(cfg):
        return lambda p: cfg["a" + p]

    def computed_get(cfg):
        return lambda p: cfg.get(p)

    def writes(args):
        def fn(p):
            args.count += 1

        return fn

    def introspects(args):
        return lambda p: vars()

    def iterates(cfg):
        return lambda p: [k for k in cfg]

    for make, name in [
        (passes, "args"),
        (calls_a_method, "args"),
        (computed_key, "cfg"),
        (computed_get, "cfg"),
        (writes, "args"),
        (introspects, "args"),
        (iterates, "cfg"),
    ]:
        assert () in _closure_paths(make(None), name), make.__name__


def test_globals_and_parameters():
    def fn(p, limit=None):
        return CONFIG["size"], limit.value

    assert set(read_paths(fn.__code__, "CONFIG", "global")) == {(("key", "size"),)}
    assert set(read_paths(fn.__code__, "limit", "local")) == {(("attr", "value"),)}

    def reassigns(p, limit=None):
        limit = p
        return limit.value

    assert () in read_paths(reassigns.__code__, "limit", "local")


CONFIG = {"size": 3}


# -- each supported Python's byte code --------------------------------------------------
# The instructions below are what ``dis`` shows for ``cfg.get("k")`` and friends under
# each Python (copied from 3.10.13, 3.11.7, 3.12.1 and 3.13.0): this venv runs one of
# them, and the others must be read the same.


class _Ins(NamedTuple):
    opname: str
    arg: int | None
    argval: object


def _ins(*rows: tuple) -> tuple[_Ins, ...]:
    return tuple(_Ins(*row) for row in rows)


_GET = {  # cfg.get("k"), then cfg.get("j", 3)
    "3.10": _ins(
        ("LOAD_DEREF", 1, "cfg"),
        ("LOAD_METHOD", 0, "get"),
        ("LOAD_CONST", 1, "k"),
        ("CALL_METHOD", 1, 1),
        ("LOAD_DEREF", 1, "cfg"),
        ("LOAD_METHOD", 0, "get"),
        ("LOAD_CONST", 2, "j"),
        ("LOAD_CONST", 3, 3),
        ("CALL_METHOD", 2, 2),
    ),
    "3.11": _ins(
        ("LOAD_DEREF", 2, "cfg"),
        ("LOAD_METHOD", 0, "get"),
        ("LOAD_CONST", 1, "k"),
        ("PRECALL", 1, 1),
        ("CALL", 1, 1),
        ("LOAD_DEREF", 2, "cfg"),
        ("LOAD_METHOD", 0, "get"),
        ("LOAD_CONST", 2, "j"),
        ("LOAD_CONST", 3, 3),
        ("PRECALL", 2, 2),
        ("CALL", 2, 2),
    ),
    # from 3.12 a method load is a LOAD_ATTR with the low bit of its argument set
    "3.12": _ins(
        ("LOAD_DEREF", 2, "cfg"),
        ("LOAD_ATTR", 1, "get"),
        ("LOAD_CONST", 1, "k"),
        ("CALL", 1, 1),
        ("LOAD_DEREF", 2, "cfg"),
        ("LOAD_ATTR", 1, "get"),
        ("LOAD_CONST", 2, "j"),
        ("LOAD_CONST", 3, 3),
        ("CALL", 2, 2),
    ),
}
_GET["3.13"] = _GET["3.12"]  # the same instructions (dis spells the flag the other way)


@pytest.mark.parametrize("version", sorted(_GET))
def test_a_get_with_a_constant_key_is_read_as_that_key_under_every_python(version, monkeypatch):
    monkeypatch.setattr(code_reads, "_ATTR_LOADS_METHODS", version >= "3.12", raising=False)
    ins = _GET[version]
    second = next(i for i in range(1, len(ins)) if ins[i].argval == "cfg")
    assert code_reads._path_after(ins, 1) == (("get", "k"),)
    assert code_reads._path_after(ins, second + 1) == (("get", "j"),)


def test_from_3_12_a_method_call_is_not_a_field_read(monkeypatch):
    monkeypatch.setattr(code_reads, "_ATTR_LOADS_METHODS", True, raising=False)
    # args.seq_len (a field: low bit clear), then args.method() (low bit set)
    field = _ins(
        ("LOAD_DEREF", 1, "args"), ("LOAD_ATTR", 2, "seq_len"), ("RETURN_VALUE", None, None)
    )
    method = _ins(("LOAD_DEREF", 1, "args"), ("LOAD_ATTR", 3, "method"), ("CALL", 0, 0))
    assert code_reads._path_after(field, 1) == (("attr", "seq_len"),)
    assert code_reads._path_after(method, 1) == ()


def test_from_3_13_a_closure_is_handed_on_with_load_fast(monkeypatch):
    """3.13 builds the closure of ``lambda q: args.depth`` with LOAD_FAST of the cell
    (LOAD_CLOSURE before): handing the cell on is not a use of the whole object."""

    def build(args):
        def fn(p):
            inner = lambda q: args.depth  # noqa: E731
            return inner(p)

        return fn

    outer = build(None).__code__
    as_313 = _ins(
        ("COPY_FREE_VARS", 1, 1),
        ("RESUME", 0, 0),
        ("LOAD_FAST", 3, "args"),
        ("BUILD_TUPLE", 1, 1),
        ("LOAD_CONST", 1, outer.co_consts[1]),
        ("MAKE_FUNCTION", None, None),
        ("SET_FUNCTION_ATTRIBUTE", 8, 8),
        ("STORE_FAST", 1, "inner"),
        ("LOAD_FAST", 1, "inner"),
        ("PUSH_NULL", None, None),
        ("LOAD_FAST", 0, "p"),
        ("CALL", 1, 1),
        ("RETURN_VALUE", None, None),
    )
    real = code_reads._instructions
    monkeypatch.setattr(
        code_reads, "_instructions", lambda code: as_313 if code is outer else real(code)
    )
    assert set(read_paths(outer, "args", "free")) == {(("attr", "depth"),)}


def test_from_3_13_a_local_loaded_by_a_combined_instruction_is_read(monkeypatch):
    """3.13 inlines ``[self.m for _ in p]`` as STORE_FAST_LOAD_FAST (_, self) + LOAD_ATTR m."""

    def call(self, p):  # a plain local here (this Python may make ``self`` a cell instead)
        return self.m

    code = call.__code__

    def as_313(stored: str) -> tuple[_Ins, ...]:
        return _ins(
            ("RESUME", 0, 0),
            ("LOAD_FAST", 1, "p"),
            ("GET_ITER", None, None),
            ("LOAD_FAST_AND_CLEAR", 2, "_"),
            ("SWAP", 2, 2),
            ("BUILD_LIST", 0, 0),
            ("SWAP", 2, 2),
            ("FOR_ITER", 14, 14),
            ("STORE_FAST_LOAD_FAST", 32, (stored, "self")),
            ("LOAD_ATTR", 0, "m"),
            ("LIST_APPEND", 2, 2),
            ("JUMP_BACKWARD", 16, 16),
            ("END_FOR", None, None),
            ("POP_TOP", None, None),
            ("SWAP", 2, 2),
            ("STORE_FAST", 2, "_"),
            ("RETURN_VALUE", None, None),
        )

    monkeypatch.setattr(code_reads, "_instructions", lambda c: as_313("_"))
    assert set(read_paths(code, "self", "local")) == {(("attr", "m"),)}
    monkeypatch.setattr(code_reads, "_instructions", lambda c: as_313("self"))  # self written
    assert () in read_paths(code, "self", "local")
