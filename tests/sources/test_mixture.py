from __future__ import annotations

from collections import Counter

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_core.errors import ConfigError, CorruptCheckpoint
from zephon_core.sources import mixture
from zephon_core.sources.mixture import SmoothWeightedRoundRobin, integer_weights


@pytest.mark.parametrize(
    ("weights", "expected"),
    [
        ([0.7, 0.3], [7, 3]),
        ([1, 1, 1], [1, 1, 1]),
        ([2, 4], [1, 2]),
        ([0.5, 0.25, 0.25], [2, 1, 1]),
        ([1 / 3, 2 / 3], [1, 2]),
        ([0.1, 0.2], [1, 2]),
        ([0, 3.0], [0, 1]),
        ([1e-7, 2e-7], [1, 2]),
        ([np.float32(0.5), np.float64(1.5)], [1, 3]),
        ([10**7, 1], [10**7, 1]),
    ],
)
def test_integer_weights(weights: list, expected: list[int]) -> None:
    assert integer_weights(weights) == expected


@pytest.mark.parametrize(
    "weights",
    [[], [-1, 1], [float("nan"), 1], [float("inf"), 1], [0, 0], ["1", 2], [True, 1], [1, 1e-9]],
)
def test_integer_weights_bad(weights: list) -> None:
    with pytest.raises(ConfigError):
        integer_weights(weights)


def _picks(weights: list[int], count: int) -> list[int]:
    rr = SmoothWeightedRoundRobin(weights)
    return [rr.pick() for _ in range(count)]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=5).filter(lambda w: sum(w) > 0))
def test_exact_counts_in_every_window(weights: list[int]) -> None:
    total = sum(weights)
    seq = _picks(weights, 4 * total)
    for start in range(0, 3 * total + 1):
        counts = Counter(seq[start : start + total])
        assert [counts[i] for i in range(len(weights))] == weights


def test_smooth_and_tie_break() -> None:
    assert _picks([7, 3], 10) == [0, 1, 0, 0, 0, 1, 0, 0, 1, 0]
    assert _picks([1, 1, 1], 6) == [0, 1, 2, 0, 1, 2]
    assert _picks([5], 3) == [0, 0, 0]


def test_inactive_components_are_skipped_without_credit() -> None:
    rr = SmoothWeightedRoundRobin([1, 1, 2])
    before = rr.state_dict()
    assert [rr.pick([True, False, True]) for _ in range(3)] == [2, 0, 2]
    assert rr.state_dict()[1] == before[1]
    assert sum(rr.state_dict()) == 0
    with pytest.raises(ValueError):
        rr.pick([False, False, False])
    with pytest.raises(ValueError):
        rr.pick([True])


def test_zero_weight_never_picked() -> None:
    assert 1 not in _picks([3, 0, 2], 50)
    with pytest.raises(ValueError):
        SmoothWeightedRoundRobin([1, 0]).pick([False, True])


def test_pick_many_equals_repeated_pick(monkeypatch: pytest.MonkeyPatch) -> None:
    weights = [5, 2, 3]
    active_pattern = [None, None, [True, False, True], None, [False, True, True]]
    tabulated = SmoothWeightedRoundRobin(weights)
    monkeypatch.setattr(mixture, "_TABLE_LIMIT", 0)
    looped = SmoothWeightedRoundRobin(weights)
    one_by_one = SmoothWeightedRoundRobin(weights)
    for round_ in range(20):
        active = active_pattern[round_ % len(active_pattern)]
        count = round_ * 3 % 17
        a = tabulated.pick_many(count, active)
        b = looped.pick_many(count, active)
        c = [one_by_one.pick(active) for _ in range(count)]
        assert a == b == c
        assert tabulated.state_dict() == looped.state_dict() == one_by_one.state_dict()


@pytest.mark.parametrize("weights", [[7, 3], [123_457, 876_543], [1, 0, 4]])
def test_state_round_trip_mid_sequence(weights: list[int]) -> None:
    rr = SmoothWeightedRoundRobin(weights)
    rr.pick_many(37)
    state = msgpack.unpackb(msgpack.packb(rr.state_dict()))
    expected = rr.pick_many(200)
    restored = SmoothWeightedRoundRobin(weights)
    restored.load_state_dict(state)
    assert restored.pick_many(200) == expected


@pytest.mark.parametrize("state", [[0], [0, 0, 0], [1, 1], [True, -1], [0.0, 0], "00", None])
def test_bad_state(state: object) -> None:
    rr = SmoothWeightedRoundRobin([1, 2])
    with pytest.raises(CorruptCheckpoint):
        rr.load_state_dict(state)
    assert rr.state_dict() == [0, 0]


@pytest.mark.parametrize("weights", [[], [0, 0], [-1, 2], [1.5, 2], [True, 1]])
def test_bad_weights(weights: list) -> None:
    with pytest.raises(ConfigError):
        SmoothWeightedRoundRobin(weights)
