"""``code_reads.read_paths``: the fields a function's byte code reads of one variable.

Every use that is not a constant field read must come back as the empty path (the whole
object counts): a field read wrongly left out would let a real change through.
"""

from __future__ import annotations

from zephon_core.checkpoint.code_reads import read_paths


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
