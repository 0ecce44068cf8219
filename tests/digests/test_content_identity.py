"""What counts of a function's captured objects, and what a refusal names.

A map closing over a configuration (an ``argparse.Namespace``, a dict, a dataclass)
counts by the fields its code reads: an unrelated field may differ, a read one may not,
and the refusal names it. Classes of the user's code count without their module.
States written before functions were identified by content alone (an ``fn`` name in
the configuration) still restore.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses

import numpy as np
import pytest
from helpers import CODE, PROSE, byte_tokenize

from zephon_core import IncompatibleCheckpoint, Pipeline, StaticMixtureWorkSource
from zephon_core.digests.content import function_fingerprint, function_parts
from zephon_core.digests.fingerprint import fingerprint
from zephon_core.testing import assert_streams_equal, take

CUT, TAIL = 6, 8


def _pipe(shorten) -> Pipeline:
    src = StaticMixtureWorkSource(
        {"prose": PROSE[:40], "code": CODE[:40]}, {"prose": 0.5, "code": 0.5}, chunk_size=8
    )
    return (
        Pipeline(src, canonical_replicas=2, seed=5, prefetch=0)
        .fetch()
        .map(byte_tokenize, name="tokenize")
        .map(shorten, name="shorten")
        .split(max_len=48)
        .pack(seq_len=48)
        .batch(batch_size=2)
    )


def _cut(shorten) -> tuple[dict, list]:
    with _pipe(shorten) as pipe:
        take(pipe, CUT)
        return pipe.checkpoint(), take(pipe, TAIL)


def _namespace_map(argv: list[str]):
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-tokens", type=int, default=60)
    ap.add_argument("--out", default="run1")
    ap.add_argument("--resume-from", default=None)
    args = ap.parse_args(argv)

    def shorten(p):
        return {**p, "input_ids": p["input_ids"][: args.max_tokens]}

    return shorten


def test_an_unrelated_namespace_argument_may_differ_and_the_stream_is_exact():
    state, tail = _cut(_namespace_map(["--out", "run1"]))
    pipe = _pipe(_namespace_map(["--out", "run2", "--resume-from", "ckpt/last"]))
    pipe.load_state_dict(state)
    assert_streams_equal(tail, take(pipe, TAIL), "resumed with other unrelated arguments")
    pipe.close()


def test_an_argument_the_code_reads_is_refused_by_name():
    state, _ = _cut(_namespace_map([]))
    with pytest.raises(IncompatibleCheckpoint) as ei:
        _pipe(_namespace_map(["--max-tokens", "30"])).load_state_dict(state)
    msg = str(ei.value)
    assert "operator 'shorten'" in msg and "closure 'args'.max_tokens differs" in msg
    assert "version=" in msg and "allow_changes=['functions']" in msg


def _dict_map(cfg: dict):
    def shorten(p):
        return {**p, "input_ids": p["input_ids"][: cfg["max_tokens"]][cfg.get("skip", 0) :]}

    return shorten


def test_a_config_dict_counts_by_the_keys_read():
    base = {"max_tokens": 60, "out_dir": "/runs/a"}
    a = function_fingerprint(_dict_map(base))
    assert a == function_fingerprint(_dict_map({**base, "out_dir": "/runs/b", "extra": [1]}))
    assert a != function_fingerprint(_dict_map({**base, "max_tokens": 61}))
    assert a != function_fingerprint(_dict_map({**base, "skip": 1}))  # a .get() default
    parts = function_parts(_dict_map(base))
    assert set(parts) == {"code", "closure 'cfg'['max_tokens']", "closure 'cfg'['skip']"}


@dataclasses.dataclass(frozen=True)
class _Config:
    max_tokens: int
    log_dir: str

    @property
    def half(self) -> int:
        return self.max_tokens // 2


def test_a_dataclass_counts_by_the_fields_read_and_a_property_by_the_object():
    def reads_field(cfg):
        return lambda p: p[: cfg.max_tokens]

    def reads_property(cfg):
        return lambda p: p[: cfg.half]

    a, b = _Config(60, "/logs/a"), _Config(60, "/logs/b")
    assert function_fingerprint(reads_field(a)) == function_fingerprint(reads_field(b))
    assert function_fingerprint(reads_field(a)) != function_fingerprint(
        reads_field(_Config(61, "/logs/a"))
    )
    # a property may read anything: the whole object counts
    assert function_fingerprint(reads_property(a)) != function_fingerprint(reads_property(b))


def test_an_object_passed_on_counts_whole():
    def helper(args, p):
        return p[: args.max_tokens]

    def passes_it_on(args):
        return lambda p: helper(args, p)

    a = argparse.Namespace(max_tokens=60, out="a")
    b = argparse.Namespace(max_tokens=60, out="b")
    assert function_fingerprint(passes_it_on(a)) != function_fingerprint(passes_it_on(b))


_GLOBAL_ARGS = argparse.Namespace(max_tokens=60, out="a")


def _reads_a_global(p):
    return p[: _GLOBAL_ARGS.max_tokens]


def test_a_global_namespace_counts_by_the_fields_read(monkeypatch):
    before = function_fingerprint(_reads_a_global)
    monkeypatch.setattr(_GLOBAL_ARGS, "out", "b")
    assert function_fingerprint(_reads_a_global) == before
    monkeypatch.setattr(_GLOBAL_ARGS, "max_tokens", 61)  # used to be seen only by type
    assert function_fingerprint(_reads_a_global) != before


def test_a_callable_object_counts_by_the_attributes_its_call_reads():
    class Shorten:
        def __init__(self, limit, out):
            self.limit, self.out = limit, out

        def __call__(self, p):
            return p[: self.limit]

    assert function_fingerprint(Shorten(5, "a")) == function_fingerprint(Shorten(5, "b"))
    assert function_fingerprint(Shorten(5, "a")) != function_fingerprint(Shorten(6, "a"))


def test_a_user_class_counts_without_its_module():
    def make(module: str):
        cls = type("Shift", (), {"__call__": lambda self, p: p + self.k, "__module__": module})
        obj = cls()
        obj.k = 1
        return obj

    assert function_fingerprint(make("__main__")) == function_fingerprint(make("train"))


def test_a_changed_code_and_a_changed_helper_are_named():
    def helper(x):
        return x[:10]

    state, _ = _cut(lambda p: {**p, "input_ids": helper(p["input_ids"])})

    def helper(x):  # noqa: F811 - the helper changed, the map did not
        return x[:11]

    with pytest.raises(IncompatibleCheckpoint, match=r"closure 'helper' code differs \(its byte"):
        _pipe(lambda p: {**p, "input_ids": helper(p["input_ids"])}).load_state_dict(state)


def test_a_state_with_function_names_in_its_configuration_still_restores():
    shorten = _namespace_map([])
    state, tail = _cut(shorten)
    old = copy.deepcopy(state)  # as the previous version wrote it
    for op in old["config"]["ops"]:
        if op["op"] == "map":
            op["fn"] = f"__main__.{op['name']}"
    old["fingerprint"] = fingerprint(old["config"])
    pipe = _pipe(shorten)
    pipe.load_state_dict(old)
    assert_streams_equal(tail, take(pipe, TAIL), "a state with fn names")
    pipe.close()


def test_a_state_without_part_digests_says_so_when_a_function_differs():
    state, _ = _cut(_namespace_map([]))
    del state["content"]["parts"]  # as the previous version wrote it
    with pytest.raises(IncompatibleCheckpoint, match="predates per-part digests"):
        _pipe(_namespace_map(["--max-tokens", "30"])).load_state_dict(state)


def test_parts_of_a_function_name_its_pieces():
    limit = np.int64(3)
    parts = function_parts(lambda p, scale=2: p[:limit] * scale)
    assert set(parts) == {"code", "closure 'limit'", "default 'scale'"}
    assert function_parts(byte_tokenize, version="v1") == {"version": "v1"}
