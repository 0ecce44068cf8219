"""The checkpoint schema (read strictly) and Pipeline save / load / restore.

Errors: CorruptCheckpoint for malformed states and anything that is not a
Zephon state; IncompatibleCheckpoint for a schema version this Zephon does
not read, a differently configured pipeline (the message names what
differs), and lane progress inconsistent with the global position.
"""

from __future__ import annotations

import copy
import os

import pytest
from helpers import byte_tokenize, source

from zephon_core import (
    CheckpointError,
    CorruptCheckpoint,
    IncompatibleCheckpoint,
    Pipeline,
    SampleCursor,
)
from zephon_core.checkpoint import codec
from zephon_core.checkpoint.state import FORMAT, READS, VERSION, LaneState, PipelineState
from zephon_core.testing import assert_streams_equal, take

CUT = 37


def build(
    *, seed: int = 11, batch_size: int = 4, lanes: int = 4, k: int = 2, prefetch: int = 0
) -> Pipeline:
    return (
        Pipeline(
            source(), canonical_replicas=lanes, flush_every_k_chunks=k, seed=seed, prefetch=prefetch
        )
        .fetch()
        .map(byte_tokenize, name="tokenize")
        .split(max_len=128)
        .pack(seq_len=128, bins=4)
        .shuffle(buffer_size=16)
        .batch(batch_size=batch_size)
    )


@pytest.fixture(scope="module")
def reference():
    pipe = build()
    out = take(pipe, CUT + 40)
    pipe.close()
    return out


@pytest.fixture(scope="module")
def state():
    pipe = build()
    take(pipe, CUT)
    st = pipe.checkpoint()
    pipe.close()
    return st


@pytest.fixture
def st(state):
    return copy.deepcopy(state)


# -- schema round trip --------------------------------------------------------------------


def test_state_shape(state):
    assert state["format"] == FORMAT and state["version"] == VERSION
    assert state["position"] == CUT
    assert [ls["lane"] for ls in state["lanes"]] == [0, 1, 2, 3]
    assert sum(ls["delivered"] for ls in state["lanes"]) == CUT
    for ls in state["lanes"]:
        ids = [c[0] for c in ls["chunks"]]
        assert ids == list(range(ls["floor"], ls["next_chunk"]))
        assert all(ls["floor"] < b <= ls["next_chunk"] for b in ls["boundaries"])
        assert ls["cursor"] is None or ls["floor"] <= ls["cursor"][1] < ls["next_chunk"]


def test_from_dict_to_dict_round_trip(state):
    parsed = PipelineState.from_dict(state)
    assert parsed.position == CUT
    assert set(parsed.lanes) == {0, 1, 2, 3}
    ls = parsed.lanes[1]
    assert isinstance(ls, LaneState)
    assert ls.cursor is None or isinstance(ls.cursor, SampleCursor)
    assert parsed.to_dict() == state
    again = PipelineState.from_dict(codec.decode(codec.encode(state)))
    assert again.to_dict() == state


# -- strictness ---------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["fingerprint", "config", "position", "lanes"])
def test_missing_top_key_is_corrupt(st, key):
    del st[key]
    with pytest.raises(CorruptCheckpoint, match=key):
        PipelineState.from_dict(st)


def test_missing_format_is_corrupt(st):
    del st["format"]
    with pytest.raises(CorruptCheckpoint):
        PipelineState.from_dict(st)


def test_missing_version_is_a_checkpoint_error(st):
    del st["version"]
    with pytest.raises(CheckpointError):
        PipelineState.from_dict(st)


def test_extra_top_key_is_corrupt(st):
    st["surprise"] = 1
    with pytest.raises(CorruptCheckpoint, match="surprise"):
        PipelineState.from_dict(st)


@pytest.mark.parametrize(
    "key",
    [
        "lane",
        "floor",
        "next_chunk",
        "chunks",
        "boundaries",
        "source",
        "cursor",
        "delivered",
        "exhausted",
        "tokens",
        "chunk_digests",
    ],
)
def test_missing_lane_key_is_corrupt(st, key):
    del st["lanes"][2][key]
    with pytest.raises(CorruptCheckpoint, match=key):
        PipelineState.from_dict(st)


def test_extra_lane_key_is_corrupt(st):
    st["lanes"][0]["bitmaps"] = []
    with pytest.raises(CorruptCheckpoint, match="bitmaps"):
        PipelineState.from_dict(st)


WRONG_TYPES = [
    (("position",), "37"),
    (("position",), 37.0),
    (("position",), True),
    (("fingerprint",), 5),
    (("config",), []),
    (("lanes",), {"0": {}}),
    (("lanes", 0), [1, 2]),
    (("lanes", 0, "lane"), "0"),
    (("lanes", 0, "floor"), 0.0),
    (("lanes", 0, "next_chunk"), None),
    (("lanes", 0, "delivered"), False),
    (("lanes", 0, "chunks"), {}),
    (("lanes", 0, "boundaries"), "2"),
    (("lanes", 0, "boundaries"), [2.0]),
    (("lanes", 0, "source"), []),
    (("lanes", 0, "cursor"), [0, 1, 2]),
    (("lanes", 0, "cursor"), [0, 1, "2", 0]),
    (("lanes", 0, "cursor"), 5),
    (("lanes", 0, "tokens"), [1.5, 2]),
    (("lanes", 0, "tokens"), 7),
    (("lanes", 0, "exhausted"), "no"),
    (("lanes", 0, "exhausted"), 0),
    (("lanes", 0, "exhausted"), None),
    (("lanes", 0, "chunk_digests"), None),
    (("lanes", 0, "chunk_digests"), [1]),
    (("lanes", 0, "chunk_digests"), ["x", "y", "z"]),
    (("zephon_version",), 1),
]


@pytest.mark.parametrize(
    "path,value", WRONG_TYPES, ids=[".".join(map(str, p)) + "=" + repr(v) for p, v in WRONG_TYPES]
)
def test_wrong_types_are_corrupt(st, path, value):
    target = st
    for p in path[:-1]:
        target = target[p]
    target[path[-1]] = value
    with pytest.raises(CorruptCheckpoint):
        PipelineState.from_dict(st)


@pytest.mark.parametrize(
    "index,value",
    [
        pytest.param(0, "0", id="chunk_id-str"),
        pytest.param(0, 0.5, id="chunk_id-float"),
        pytest.param(1, "7", id="seed-str"),
        pytest.param(1, 2.5, id="seed-float"),
        pytest.param(2, [True], id="components-bool"),
        pytest.param(3, [1.5], id="rows-float"),
        pytest.param(3, [], id="rows-empty"),
        pytest.param(2, "0", id="components-str"),
    ],
)
def test_malformed_chunk_entries_are_corrupt(st, index, value):
    ls = st["lanes"][0]
    assert ls["chunks"], "fixture must have inflight chunks"
    entry = ls["chunks"][0]
    if index in (2, 3) and isinstance(value, list) and value:
        value = value * len(entry[index])
    entry[index] = value
    with pytest.raises(CorruptCheckpoint):
        PipelineState.from_dict(st)


def test_chunk_entry_of_wrong_arity_is_corrupt(st):
    st["lanes"][0]["chunks"][0] = st["lanes"][0]["chunks"][0][:3]
    with pytest.raises(CorruptCheckpoint):
        PipelineState.from_dict(st)


@pytest.mark.parametrize("how", ["gap", "duplicate", "reversed"])
def test_non_consecutive_chunk_ids_are_corrupt(st, how):
    ls = next(ls for ls in st["lanes"] if len(ls["chunks"]) >= 2)
    chunks = ls["chunks"]
    if how == "gap":
        chunks[-1][0] += 1
        ls["next_chunk"] += 1
    elif how == "duplicate":
        chunks[1] = copy.deepcopy(chunks[0])
    else:
        chunks.reverse()
    with pytest.raises(CorruptCheckpoint, match="consecutive"):
        PipelineState.from_dict(st)


def test_chunk_ids_not_starting_at_floor_are_corrupt(st):
    ls = next(ls for ls in st["lanes"] if ls["chunks"])
    ls["floor"] -= 1 if ls["floor"] > 0 else -1
    with pytest.raises(CorruptCheckpoint, match="consecutive"):
        PipelineState.from_dict(st)


def test_next_chunk_not_matching_chunks_is_corrupt(st):
    st["lanes"][0]["next_chunk"] += 1
    with pytest.raises(CorruptCheckpoint):
        PipelineState.from_dict(st)


def test_duplicate_lane_is_corrupt(st):
    st["lanes"].append(copy.deepcopy(st["lanes"][0]))
    with pytest.raises(CorruptCheckpoint, match="lane 0"):
        PipelineState.from_dict(st)


@pytest.mark.parametrize("fmt", ["zephon.something_else", None, 1])
def test_wrong_format_is_rejected(st, fmt):
    st["format"] = fmt
    with pytest.raises(CorruptCheckpoint, match="format"):
        PipelineState.from_dict(st)


@pytest.mark.parametrize("version", [READS[-1] + 1, 0, "1", None])
def test_wrong_version_is_incompatible(st, version):
    st["version"] = version
    with pytest.raises(IncompatibleCheckpoint, match="version"):
        PipelineState.from_dict(st)


@pytest.mark.parametrize("bad", [None, [], "state", b"ZEPHON", {"lanes": []}])
def test_load_state_dict_rejects_non_states(bad):
    pipe = build()
    with pytest.raises(CorruptCheckpoint):
        pipe.load_state_dict(bad)
    pipe.close()


# -- save / load / restore ----------------------------------------------------------------


def test_save_load_restore_round_trip(tmp_path, reference):
    path = tmp_path / "ckpt" / "zephon_state.msgpack.zst"
    pipe = build()
    head = take(pipe, CUT)
    size = pipe.save(path)
    expected_state = pipe.checkpoint()
    pipe.close()
    assert_streams_equal(reference[:CUT], head, "prefix")
    assert size == os.path.getsize(path)
    assert sorted(os.listdir(path.parent)) == ["zephon_state.msgpack.zst"]
    loaded = Pipeline.load(path)
    assert loaded == expected_state

    via_load = build()
    via_load.load_state_dict(loaded)
    assert_streams_equal(reference[CUT:], take(via_load, 40), "load_state_dict(load(path))")
    via_load.close()

    via_restore = build(prefetch=3)  # prefetch is not part of the stream's definition
    via_restore.restore(path)
    assert_streams_equal(reference[CUT:], take(via_restore, 40), "restore(path)")
    via_restore.close()


def test_save_overwrites_atomically(tmp_path):
    path = tmp_path / "s.zst"
    pipe = build()
    take(pipe, 5)
    pipe.save(path)
    take(pipe, 5)
    pipe.save(path)
    assert Pipeline.load(path)["position"] == 10
    assert os.listdir(tmp_path) == ["s.zst"]
    pipe.close()


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        ({"seed": 12}, "seed: 11 in checkpoint, 12 now"),
        ({"batch_size": 8}, "batch_size: 4 in checkpoint, 8 now"),
        ({"lanes": 2}, "canonical_replicas: 4 in checkpoint, 2 now"),
        ({"k": 3}, "flush_every_k_chunks: 2 in checkpoint, 3 now"),
    ],
)
def test_differently_configured_pipeline_is_incompatible(state, kwargs, needle):
    other = build(**kwargs)
    with pytest.raises(IncompatibleCheckpoint) as e:
        other.load_state_dict(state)
    other.close()
    assert needle in str(e.value)
    # Only the differing key is reported.
    key = needle.split(":")[0]
    assert str(e.value).count("in checkpoint") == 1, f"{key}: {e.value}"


def test_differing_batch_size_names_the_operator_path(state):
    other = build(batch_size=8)
    with pytest.raises(IncompatibleCheckpoint, match=r"ops\[\d+\]\.batch_size"):
        other.load_state_dict(state)
    other.close()


def test_failed_load_leaves_the_pipeline_usable(state, reference):
    other = build(seed=12)
    with pytest.raises(IncompatibleCheckpoint):
        other.load_state_dict(state)
    other.close()
    same = build()
    bad = copy.deepcopy(state)
    bad["version"] = 99
    with pytest.raises(IncompatibleCheckpoint):
        same.load_state_dict(bad)
    assert_streams_equal(reference[:10], take(same, 10), "after a rejected state")
    same.close()


@pytest.mark.parametrize("mutate", ["delivered", "position"])
def test_inconsistent_lane_progress_is_incompatible(st, mutate):
    if mutate == "delivered":
        st["lanes"][1]["delivered"] += 1
    else:
        st["position"] += 1
    pipe = build()
    with pytest.raises(IncompatibleCheckpoint, match="inconsistent") as e:
        pipe.load_state_dict(st)
        next(iter(pipe))
    pipe.close()
    assert "lane 1" in str(e.value)


# -- inflight chunks are checked against their digests ------------------------------------


def _pointer_changes(state: dict):
    """Every single change of one inflight chunk that keeps it in range: a row +1 (or -1),
    the other dataset at an offset, the chunk seed +1. Yields (lane, chunk id, state)."""
    for i, ls in enumerate(state["lanes"]):
        for j, (chunk_id, _, components, rows) in enumerate(ls["chunks"]):
            for k in range(len(rows)):
                for field, value in (
                    (3, rows[k] + 1 if rows[k] < 80 else rows[k] - 1),  # code has 90 rows
                    (2, 1 - components[k]),
                ):
                    bad = copy.deepcopy(state)
                    bad["lanes"][i]["chunks"][j][field][k] = value
                    yield ls["lane"], chunk_id, bad
            bad = copy.deepcopy(state)
            bad["lanes"][i]["chunks"][j][1] += 1
            yield ls["lane"], chunk_id, bad


def test_every_changed_pointer_of_an_inflight_chunk_is_refused(state):
    """A row pointer +1 inside the dataset used to restore and deliver another document."""
    changes = list(_pointer_changes(state))
    lane, chunk_id, bad = changes[0]  # a row in range: only the digest can tell
    pipe = build()
    with pytest.raises(CorruptCheckpoint, match=f"lane {lane}: inflight chunk {chunk_id} does"):
        pipe.load_state_dict(bad)
    pipe.close()
    from zephon_core.checkpoint.restore import check_alone  # what zephon inspect/diff run

    assert len(changes) > 100
    for lane, chunk_id, bad in changes:
        with pytest.raises(CorruptCheckpoint) as e:
            check_alone(bad)
        assert f"lane {lane}: inflight chunk {chunk_id} does not match its digest" in str(e.value)


def test_a_state_without_chunk_digests_still_restores(st, reference):
    """Version-2 states (main 03a95f2) carry none: they restore exactly as before."""
    st["version"] = 2
    del st["zephon_version"]
    for ls in st["lanes"]:
        del ls["chunk_digests"]
    pipe = build()
    pipe.load_state_dict(st)
    assert_streams_equal(reference[CUT:], take(pipe, 40), "a version-2 state")
    pipe.close()


def test_a_re_mix_checks_the_digests_of_the_chunks_it_renumbers(state):
    lane, chunk_id, bad = next(_pointer_changes(state))
    ok = copy.deepcopy(state)
    remixed = (
        Pipeline(source(weights=(0.5, 0.5)), canonical_replicas=4, flush_every_k_chunks=2, seed=11)
        .fetch()
        .map(byte_tokenize, name="tokenize")
        .split(max_len=128)
        .pack(seq_len=128, bins=4)
        .shuffle(buffer_size=16)
        .batch(batch_size=4)
    )
    with pytest.raises(CorruptCheckpoint, match=f"inflight chunk {chunk_id} does not match"):
        remixed.description().load_state_dict(bad, allow_changes={"weights"})
    remixed.load_state_dict(ok, allow_changes={"weights"})  # the intact state re-mixes
    assert len(take(remixed, 3)) == 3
    remixed.close()
