from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_core.errors import ConfigError, CorruptCheckpoint
from zephon_core.sources import SourceSpec, StaticMixtureWorkSource, WorkChunk, WorkSource

pytestmark = pytest.mark.filterwarnings("error")


class Virtual:
    """A random-access dataset of ``n`` rows that never stores them."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


class Batched(Virtual):
    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.calls: list[list[int]] = []

    def __getitem__(self, i: int) -> int:
        raise AssertionError("__getitems__ must be preferred")

    def __getitems__(self, rows: list[int]) -> list[int]:
        self.calls.append(rows)
        return [r * 10 for r in rows]


def _drain(lane: WorkSource, max_chunks: int = 10**6) -> list[WorkChunk]:
    chunks = []
    for _ in range(max_chunks):
        chunk = lane.next_chunk()
        if chunk is None:
            break
        chunks.append(chunk)
    return chunks


def _take(lane: WorkSource, count: int) -> list[WorkChunk]:
    return [lane.next_chunk() for _ in range(count)]


def _pointers(chunks: list[WorkChunk]) -> list[tuple[int, int]]:
    return [p for c in chunks for p in c.pointers]


def test_protocols_and_attributes() -> None:
    src = StaticMixtureWorkSource({"b": Virtual(5), "a": Virtual(7)}, weights={"a": 1, "b": 3})
    assert isinstance(src, SourceSpec)
    assert isinstance(src.open_lane(0, 1, seed=0), WorkSource)
    assert src.component_names == ("b", "a")  # the user's mapping order
    assert src.weights == (0.75, 0.25)
    assert StaticMixtureWorkSource([Virtual(3), Virtual(4)]).component_names == ("0", "1")


def test_describe_is_json_and_complete() -> None:
    src = StaticMixtureWorkSource(
        {"x": Virtual(9), "y": Virtual(4)},
        weights=[0.7, 0.3],
        chunk_size=8,
        seed=5,
        shuffle=False,
        num_epochs=2,
    )
    desc = src.describe()
    assert json.loads(json.dumps(desc)) == desc
    assert desc["class"] == "StaticMixtureWorkSource"
    assert desc["names"] == ["x", "y"] and desc["lengths"] == [9, 4]
    assert desc["weights"] == [7, 3]
    assert (desc["chunk_size"], desc["seed"], desc["shuffle"], desc["num_epochs"]) == (
        8,
        5,
        False,
        2,
    )


def test_read_prefers_getitems_then_getitem() -> None:
    batched = Batched(10)
    src = StaticMixtureWorkSource({"b": batched, "l": ["r0", "r1", "r2"]})
    assert src.read(0, (3, 1)) == [30, 10]
    assert batched.calls == [[3, 1]]
    assert src.read(1, [2, 0]) == ["r2", "r0"]
    with pytest.raises(IndexError):
        src.read(2, [0])


@pytest.mark.parametrize("num_lanes", [1, 3, 8])
@pytest.mark.parametrize("shuffle", [True, False])
def test_lanes_partition_every_epoch(num_lanes: int, shuffle: bool) -> None:
    lengths = [3, 10, 37]  # 3 < num_lanes for 8 lanes
    src = StaticMixtureWorkSource(
        [Virtual(n) for n in lengths], weights=[1, 2, 3], chunk_size=5, seed=11, shuffle=shuffle
    )
    per_lane = []
    for lane in range(num_lanes):
        rows: dict[int, list[int]] = {d: [] for d in range(3)}
        for comp, row in _pointers(_take(src.open_lane(lane, num_lanes, seed=1), 80)):
            rows[comp].append(row)
        per_lane.append(rows)
    for d, n in enumerate(lengths):
        epochs = []
        for e in range(3):
            seen = []
            for lane in range(num_lanes):
                lo = max(0, -(-(e * n - lane) // num_lanes))
                hi = max(0, -(-((e + 1) * n - lane) // num_lanes))
                assert len(per_lane[lane][d]) >= hi, "test did not draw enough chunks"
                seen += per_lane[lane][d][lo:hi]
            assert sorted(seen) == list(range(n)), (d, e)
            epochs.append(seen)
        if not shuffle and num_lanes == 1:
            assert epochs[0] == list(range(n))
        if shuffle and n > 5:
            assert epochs[0] != epochs[1]  # each epoch has its own permutation


def test_unshuffled_lane_strides() -> None:
    src = StaticMixtureWorkSource({"a": Virtual(10)}, chunk_size=4, shuffle=False)
    chunks = _take(src.open_lane(1, 3, seed=0), 3)
    assert [r for c in chunks for r in c.rows] == [1, 4, 7, 0, 3, 6, 9, 2, 5, 8, 1, 4]


def test_shares_are_exact_over_every_window() -> None:
    src = StaticMixtureWorkSource(
        {"a": Virtual(10**6), "b": Virtual(13), "c": Virtual(50)},
        weights={"a": 0.5, "b": 0.2, "c": 0.3},
        chunk_size=7,
        seed=3,
    )
    assert src.integer_weights == (5, 2, 3)
    for lane in range(2):
        comps = [c for ch in _take(src.open_lane(lane, 2, seed=9), 30) for c in ch.components]
        for start in range(0, len(comps) - 10):
            counts = Counter(comps[start : start + 10])
            assert (counts[0], counts[1], counts[2]) == (5, 2, 3)


def test_chunk_ids_and_seeds() -> None:
    src = StaticMixtureWorkSource([Virtual(100)], chunk_size=3, seed=4)
    chunks = _take(src.open_lane(2, 4, seed=77), 50)
    assert [c.chunk_id for c in chunks] == list(range(50))
    assert all(c.lane == 2 and len(c) == 3 for c in chunks)
    assert len({c.seed for c in chunks}) == 50
    other_lane = _take(src.open_lane(1, 4, seed=77), 50)
    assert not {c.seed for c in chunks} & {c.seed for c in other_lane}
    reseeded = _take(src.open_lane(2, 4, seed=78), 50)
    assert [c.rows for c in reseeded] == [c.rows for c in chunks]  # rows keyed by source seed
    assert [c.seed for c in reseeded] != [c.seed for c in chunks]
    other_source = _take(
        StaticMixtureWorkSource([Virtual(100)], chunk_size=3, seed=5).open_lane(2, 4, seed=77), 50
    )
    assert [c.rows for c in other_source] != [c.rows for c in chunks]
    assert [c.seed for c in other_source] == [c.seed for c in chunks]


def _build(
    lengths: list[int], weights: list[int], chunk_size: int, num_epochs: int | None, shuffle: bool
) -> StaticMixtureWorkSource:
    return StaticMixtureWorkSource(
        {f"d{i}": Virtual(n) for i, n in enumerate(lengths)},
        weights=weights,
        chunk_size=chunk_size,
        seed=21,
        shuffle=shuffle,
        num_epochs=num_epochs,
    )


@settings(max_examples=80, deadline=None)
@given(
    num_lanes=st.integers(1, 5),
    chunk_size=st.integers(1, 9),
    lengths=st.lists(st.integers(1, 25), min_size=1, max_size=3),
    weight_seed=st.lists(st.integers(0, 4), min_size=3, max_size=3),
    num_epochs=st.one_of(st.none(), st.integers(1, 3)),
    shuffle=st.booleans(),
    cuts=st.lists(st.integers(0, 40), min_size=1, max_size=4),
    data=st.data(),
)
def test_state_round_trip_gives_identical_continuation(
    num_lanes: int,
    chunk_size: int,
    lengths: list[int],
    weight_seed: list[int],
    num_epochs: int | None,
    shuffle: bool,
    cuts: list[int],
    data: Any,
) -> None:
    weights = weight_seed[: len(lengths)]
    if sum(weights) == 0:
        weights[0] = 1
    lane_id = data.draw(st.integers(0, num_lanes - 1))
    config = (lengths, weights, chunk_size, num_epochs, shuffle)
    reference = _drain(_build(*config).open_lane(lane_id, num_lanes, seed=3), 40)
    for cut in sorted(set(cuts)):
        lane = _build(*config).open_lane(lane_id, num_lanes, seed=3)
        head = _drain(lane, cut)
        state = msgpack.unpackb(msgpack.packb(lane.state_dict()))
        restored = _build(*config).open_lane(lane_id, num_lanes, seed=3)
        restored.load_state_dict(state)
        tail = _drain(restored, 40 - len(head))
        assert head + tail == reference
        if len(reference) < 40:  # a finite lane stays ended after a restore too
            assert restored.next_chunk() is None


def test_state_is_constant_size() -> None:
    src = StaticMixtureWorkSource(
        {"big": Virtual(10**9), "small": Virtual(1000)}, weights=[0.9, 0.1], chunk_size=8, seed=1
    )
    lane = src.open_lane(5, 16, seed=2)
    _take(lane, 10)
    early = len(msgpack.packb(lane.state_dict()))
    _take(lane, 10_000 - 10)
    late_state = lane.state_dict()
    late = len(msgpack.packb(late_state))
    assert late < 200 and early < 200
    assert late <= early + 8  # only a few integers grew by a few bytes
    assert late_state["cursors"][1] > 1000 // 16 * 5  # the small dataset is many epochs in
    fresh = src.open_lane(5, 16, seed=2)
    fresh.load_state_dict(late_state)
    assert _take(fresh, 5) == _take(lane, 5)


@pytest.mark.parametrize("num_lanes", [1, 2, 5, 16])
@pytest.mark.parametrize("chunk_size", [1, 4, 64])
def test_finite_epochs_deliver_every_row_exactly_num_epochs_times(
    num_lanes: int, chunk_size: int
) -> None:
    lengths, epochs = [7, 3, 20], 2
    src = StaticMixtureWorkSource(
        [Virtual(n) for n in lengths],
        weights=[0.5, 0.2, 0.3],
        chunk_size=chunk_size,
        seed=8,
        num_epochs=epochs,
    )
    counts: Counter[tuple[int, int]] = Counter()
    for lane_id in range(num_lanes):
        lane = src.open_lane(lane_id, num_lanes, seed=0)
        chunks = _drain(lane)
        assert all(c is None for c in (lane.next_chunk(), lane.next_chunk()))
        assert lane.state_dict()["exhausted"] is True
        assert [c.chunk_id for c in chunks] == list(range(len(chunks)))
        assert all(len(c) == chunk_size for c in chunks[:-1])
        assert all(len(c) >= 1 for c in chunks)
        counts.update(_pointers(chunks))
    expected = {(d, r): epochs for d, n in enumerate(lengths) for r in range(n)}
    assert dict(counts) == expected


def test_lane_beyond_the_end_is_empty_and_zero_weight_is_left_out() -> None:
    src = StaticMixtureWorkSource(
        {"a": Virtual(2), "z": Virtual(5)}, weights={"a": 1, "z": 0}, chunk_size=3, num_epochs=1
    )
    assert src.open_lane(3, 4, seed=0).next_chunk() is None
    lane = src.open_lane(1, 4, seed=0)
    chunk = lane.next_chunk()
    assert chunk is not None and chunk.components == (0,) and len(chunk) == 1
    assert lane.next_chunk() is None


def test_exhausted_component_drops_out_of_the_mix() -> None:
    src = StaticMixtureWorkSource(
        {"a": Virtual(100), "b": Virtual(4)}, chunk_size=10, shuffle=False, num_epochs=1
    )
    chunks = _drain(src.open_lane(0, 1, seed=0))
    comps = [c for ch in chunks for c in ch.components]
    assert comps[:8] == [0, 1] * 4
    assert comps[8:] == [0] * 96
    assert len(chunks[-1]) == 4


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"datasets": {"a": Virtual(0)}}, "'a' is empty"),
        ({"datasets": {"a": iter([1, 2])}}, "'a'"),
        ({"datasets": {"a": 5}}, "'a'"),
        ({"datasets": {"a": "text"}}, "'a'"),
        ({"datasets": {}}, "empty"),
        ({"datasets": Virtual(3)}, "mapping"),
        ({"datasets": {1: Virtual(3)}}, "strings"),
        ({"weights": {"a": -1, "b": 1}}, "'a'"),
        ({"weights": {"a": float("nan"), "b": 1}}, "'a'"),
        ({"weights": {"a": float("inf"), "b": 1}}, "'a'"),
        ({"weights": {"a": 0, "b": 0.0}}, "zero"),
        ({"weights": {"a": 1, "b": 1, "c": 1}}, "'c'"),
        ({"weights": {"a": 1}}, "'b'"),
        ({"weights": [1, 2, 3]}, "one weight per dataset"),
        ({"weights": [1, "x"]}, "'b'"),
        ({"chunk_size": 0}, "chunk_size"),
        ({"chunk_size": 2.5}, "chunk_size"),
        ({"num_epochs": 0}, "num_epochs"),
        ({"seed": "1"}, "seed"),
        ({"shuffle": "yes"}, "shuffle"),
    ],
)
def test_bad_config(kwargs: dict, match: str) -> None:
    args: dict[str, Any] = {"datasets": {"a": Virtual(3), "b": Virtual(4)}, **kwargs}
    with pytest.raises(ConfigError, match=match):
        StaticMixtureWorkSource(**args)


@pytest.mark.parametrize(("lane", "num_lanes"), [(0, 0), (-1, 2), (2, 2), (0.5, 2), (0, "2")])
def test_bad_lanes(lane: Any, num_lanes: Any) -> None:
    src = StaticMixtureWorkSource([Virtual(3)])
    with pytest.raises(ConfigError):
        src.open_lane(lane, num_lanes, seed=0)


def _corruptions() -> list[tuple[str, Any]]:
    return [
        ("not a dict", lambda s: [1, 2]),
        ("missing key", lambda s: {k: v for k, v in s.items() if k != "swrr"}),
        ("extra key", lambda s: {**s, "epoch": 0}),
        ("version", lambda s: {**s, "version": 2}),
        ("negative id", lambda s: {**s, "next_chunk_id": -1}),
        ("float id", lambda s: {**s, "next_chunk_id": 3.0}),
        ("short cursors", lambda s: {**s, "cursors": s["cursors"][:1]}),
        ("str cursor", lambda s: {**s, "cursors": ["1", s["cursors"][1]]}),
        ("negative cursor", lambda s: {**s, "cursors": [-1, s["cursors"][1]]}),
        ("cursor past end", lambda s: {**s, "cursors": [10**6, s["cursors"][1]]}),
        ("inconsistent ids", lambda s: {**s, "next_chunk_id": s["next_chunk_id"] + 1}),
        ("swrr length", lambda s: {**s, "swrr": [0]}),
        ("swrr sum", lambda s: {**s, "swrr": [1, 1]}),
        ("exhausted type", lambda s: {**s, "exhausted": 0}),
        ("exhausted lie", lambda s: {**s, "exhausted": True}),
    ]


@pytest.mark.parametrize(("name", "corrupt"), _corruptions())
def test_bad_state_raises_corrupt_checkpoint(name: str, corrupt: Any) -> None:
    src = StaticMixtureWorkSource({"a": Virtual(30), "b": Virtual(12)}, chunk_size=4, num_epochs=3)
    lane = src.open_lane(0, 2, seed=0)
    _take(lane, 3)
    good = lane.state_dict()
    expected = _take(lane, 2)
    target = src.open_lane(0, 2, seed=0)
    _take(target, 3)
    with pytest.raises(CorruptCheckpoint):
        target.load_state_dict(corrupt(good))
    assert _take(target, 2) == expected  # a rejected state changes nothing


@pytest.mark.slow
def test_determinism_across_processes() -> None:
    code = (
        "from zephon_core.sources import StaticMixtureWorkSource as S\n"
        "s = S({'p': list(range(1000)), 'c': list(range(77))}, {'p': .7, 'c': .3}, 16, 9)\n"
        "l = s.open_lane(1, 3, 4)\n"
        "print([l.next_chunk().to_state() for _ in range(20)])\n"
    )
    root = str(Path(__file__).resolve().parents[2])
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed, "PYTHONPATH": root},
        ).stdout
        for seed in ("1", "2")
    }
    assert len(outs) == 1
    src = StaticMixtureWorkSource(
        {"p": list(range(1000)), "c": list(range(77))}, {"p": 0.7, "c": 0.3}, 16, 9
    )
    lane = src.open_lane(1, 3, 4)
    assert outs.pop().strip() == str([lane.next_chunk().to_state() for _ in range(20)])


def test_same_lane_can_rewind_and_jump() -> None:
    src = StaticMixtureWorkSource(
        {"a": Virtual(50), "b": Virtual(9)}, weights=[3, 1], chunk_size=6, seed=2
    )
    lane = src.open_lane(1, 3, seed=4)
    initial = lane.state_dict()
    first = _take(lane, 40)
    mid = lane.state_dict()
    after_mid = _take(lane, 40)
    lane.load_state_dict(initial)
    assert _take(lane, 40) == first
    lane.load_state_dict(mid)
    assert _take(lane, 40) == after_mid


def test_weights_show_as_given_not_as_reduced_integers():
    src = StaticMixtureWorkSource(
        {"prose": list(range(10)), "code": list(range(5))}, {"prose": 0.7, "code": 0.3}
    )
    assert src.describe()["weights"] == [7, 3]  # the fingerprint's form
    assert src.given_weights() == (0.7, 0.3)
    assert (
        repr(src) == "StaticMixtureWorkSource({'prose': 0.7, 'code': 0.3}, chunk_size=64, seed=0)"
    )
