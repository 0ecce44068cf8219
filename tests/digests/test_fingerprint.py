"""Configuration fingerprints and config_diff: what differs, named by its path."""

from __future__ import annotations

from helpers import byte_tokenize, source

from zephon_core import Pipeline
from zephon_core.digests.fingerprint import config_diff, fingerprint


def test_identical_configs_have_no_diff():
    cfg = {"a": 1, "b": [1, {"c": "x"}], "d": {"e": None}}
    assert config_diff(cfg, {"d": {"e": None}, "b": [1, {"c": "x"}], "a": 1}) == []


def test_top_level_scalar_path():
    assert config_diff({"seed": 11}, {"seed": 12}) == ["seed: 11 in checkpoint, 12 now"]


def test_nested_dict_path_uses_dots():
    saved = {"source": {"chunk_size": 8, "seed": 7}}
    current = {"source": {"chunk_size": 16, "seed": 7}}
    assert config_diff(saved, current) == ["source.chunk_size: 8 in checkpoint, 16 now"]


def test_list_index_path_uses_brackets():
    saved = {"ops": [{"op": "fetch"}, {"op": "batch", "batch_size": 4}]}
    current = {"ops": [{"op": "fetch"}, {"op": "batch", "batch_size": 8}]}
    assert config_diff(saved, current) == ["ops[1].batch_size: 4 in checkpoint, 8 now"]


def test_list_length_difference_is_reported_at_the_list():
    d = config_diff({"ops": [1, 2]}, {"ops": [1, 2, 3]})
    assert len(d) == 1
    assert d[0].startswith("ops: 2 entries in checkpoint, 3 now")


def test_absent_keys_both_ways():
    d = config_diff({"a": {"x": 1}}, {"a": {"y": 2}})
    assert d == ["a.x: 1 in checkpoint, absent now", "a.y: absent in checkpoint, 2 now"]


def test_type_change_and_multiple_differences_in_sorted_order():
    d = config_diff({"b": "1", "a": [1, 2], "c": 3}, {"b": 1, "a": [1, 5], "c": 3})
    assert d == ["a[1]: 2 in checkpoint, 5 now", "b: '1' in checkpoint, 1 now"]


def test_fingerprint_is_stable_and_sensitive():
    cfg = {"a": 1, "b": {"c": [1, 2]}}
    fp = fingerprint(cfg)
    assert isinstance(fp, str) and len(fp) == 32
    assert fingerprint({"b": {"c": [1, 2]}, "a": 1}) == fp  # key order is irrelevant
    assert fingerprint({"a": 1, "b": {"c": [2, 1]}}) != fp
    assert fingerprint({"a": 2, "b": {"c": [1, 2]}}) != fp


def _pipe(**kw):
    args = {"seed": 3, "k": 2, "batch_size": 4, "chunk_size": 8, "bins": 4}
    args.update(kw)
    return (
        Pipeline(
            source(chunk_size=args["chunk_size"]),
            canonical_replicas=2,
            flush_every_k_chunks=args["k"],
            seed=args["seed"],
            prefetch=0,
        )
        .fetch()
        .map(byte_tokenize, name="tokenize")
        .split(max_len=64)
        .pack(seq_len=64, bins=args["bins"])
        .batch(batch_size=args["batch_size"])
    )


def test_pipeline_config_diffs_name_the_setting():
    base = _pipe().compile()
    cases = {
        "seed": ("seed", 3, 4),
        "k": ("flush_every_k_chunks", 2, 5),
        "chunk_size": ("source.chunk_size", 8, 16),
    }
    for kw, (path, old, new) in cases.items():
        plan = _pipe(**{kw: new}).compile()
        assert plan.fingerprint != base.fingerprint
        assert config_diff(base.config, plan.config) == [f"{path}: {old} in checkpoint, {new} now"]
    plan = _pipe(bins=2).compile()
    diff = config_diff(base.config, plan.config)
    assert len(diff) == 1
    assert diff[0].startswith("ops[") and ".bins: 4 in checkpoint, 2 now" in diff[0]


def test_runtime_knobs_do_not_change_the_fingerprint():
    a = _pipe().compile()
    b = (
        Pipeline(
            source(), canonical_replicas=2, flush_every_k_chunks=2, seed=3, prefetch=5, queue_size=7
        )
        .fetch(parallelism=3)
        .map(byte_tokenize, name="tokenize", parallelism=2)
        .split(max_len=64)
        .pack(seq_len=64, bins=4)
        .batch(batch_size=4)
    ).compile()
    assert a.fingerprint == b.fingerprint
    assert config_diff(a.config, b.config) == []


def test_replay_filter_is_not_part_of_the_config():
    plan = _pipe().compile()
    assert all("replay_filter" not in str(op) for op in plan.config["ops"])
    no_ckpt = (
        Pipeline(
            source(),
            canonical_replicas=2,
            flush_every_k_chunks=2,
            seed=3,
            prefetch=0,
            checkpointing=False,
        )
        .fetch()
        .map(byte_tokenize, name="tokenize")
        .split(max_len=64)
        .pack(seq_len=64, bins=4)
        .batch(batch_size=4)
    ).compile()
    assert no_ckpt.config["ops"] == plan.config["ops"]


def _in_module(module: str):
    """``byte_tokenize`` as if defined in ``module`` (``__main__`` or an imported file)."""

    def tokenize(p):
        return byte_tokenize(p)

    tokenize.__module__ = module
    tokenize.__qualname__ = "tokenize"
    return tokenize


def test_the_configuration_names_no_function_location():
    plans = [
        Pipeline(source(), canonical_replicas=2, seed=3)
        .fetch()
        .map(_in_module(module), name="tokenize", version=version)
        .filter(_in_module(module), name="keep")
        .batch(batch_size=4)
        .compile()
        for module in ("__main__", "train")
        for version in (None, "v1")
    ]
    assert plans[0].fingerprint == plans[2].fingerprint  # __main__ vs train
    assert plans[1].fingerprint == plans[3].fingerprint  # with version= too
    assert plans[0].content == plans[2].content
