"""The typed lane state of a StaticMixtureWorkSource (``sources/mixture_state.py``):
the same plain dicts as before it existed, both versions, read back exactly."""

from __future__ import annotations

from pathlib import Path

import pytest

from zephon_core import Pipeline, StaticMixtureWorkSource
from zephon_core.chunk import WorkChunk
from zephon_core.errors import CorruptCheckpoint
from zephon_core.sources.mixture_state import MixtureLaneState, lane_scheduled

DATA = Path(__file__).resolve().parents[1] / "checkpoint" / "data"


def _source(tokens: bool) -> StaticMixtureWorkSource:
    extra = (
        {
            "weights_unit": "tokens",
            "lengths": {"a": [1 + i % 5 for i in range(50)], "b": [2 + i % 3 for i in range(30)]},
            "num_epochs": 2,
        }
        if tokens
        else {}
    )
    return StaticMixtureWorkSource(
        {"a": list(range(50)), "b": list(range(30))},
        {"a": 0.7, "b": 0.3},
        chunk_size=4,
        seed=3,
        **extra,
    )


# written by main 4bdfa67 (before the typed state) for lane 1 of 3 after 7 chunks
BEFORE = {
    False: {"version": 1, "next_chunk_id": 7, "cursors": [20, 8], "swrr": [-4, 4],
            "exhausted": False},
    True: {"version": 2, "next_chunk_id": 7, "cursors": [20, 8],
           "deficits": [209700, -209700], "tokens": 76, "retired": 0, "exhausted": False},
}  # fmt: skip
LAST = WorkChunk(1, 6, (0, 1, 0, 0), (28, 18, 30, 10), 14396238059294517512)


@pytest.mark.parametrize("tokens", [False, True])
def test_the_lane_state_is_the_dict_of_the_previous_release(tokens):
    lane = _source(tokens).open_lane(1, 3, seed=9)
    chunks = [lane.next_chunk() for _ in range(7)]
    assert chunks[-1] == LAST
    assert lane.state_dict() == BEFORE[tokens]
    later = [lane.next_chunk() for _ in range(5)]
    again = _source(tokens).open_lane(1, 3, seed=9)
    again.load_state_dict(dict(BEFORE[tokens]))
    assert [again.next_chunk() for _ in range(5)] == later
    assert again.state_dict() == lane.state_dict()


@pytest.mark.parametrize("tokens", [False, True])
def test_from_dict_then_to_dict_is_the_identity(tokens):
    version = 2 if tokens else 1
    typed = MixtureLaneState.from_dict(BEFORE[tokens], version, [None, None], ["a", "b"], "t")
    assert typed.version == version and typed.cursors == [20, 8]
    assert typed.to_dict() == BEFORE[tokens]


def test_every_lane_state_of_the_previous_release_fixtures_reads_back():
    for path in sorted(DATA.glob("*.state")):
        for ls in Pipeline.load(path)["lanes"]:
            st = ls["source"]
            n = len(st["cursors"])
            typed = MixtureLaneState.from_dict(st, st["version"], [None] * n, ["x"] * n, "t")
            assert typed.to_dict() == st, path.name


def test_a_state_of_the_other_version_is_refused():
    with pytest.raises(CorruptCheckpoint, match="schedules by token-deficit"):
        _source(True).open_lane(1, 3, seed=9).load_state_dict(dict(BEFORE[False]))
    with pytest.raises(CorruptCheckpoint, match="state keys"):
        MixtureLaneState.from_dict({**BEFORE[False], "x": 1}, 1, [None] * 2, ["a", "b"], "t")


def test_lane_scheduled_reads_documents_and_tokens():
    assert lane_scheduled(BEFORE[True]) == ((20, 8), 76)
    assert lane_scheduled(BEFORE[False]) == ((20, 8), 0)
    assert lane_scheduled("junk") == (None, 0)
