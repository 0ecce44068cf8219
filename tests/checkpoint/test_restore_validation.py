"""A crafted but correctly encoded state fails at ``load_state_dict``, naming the field.

Every lane field is checked against the pipeline before any work starts: never a hang,
a ``MemoryError`` or an ``IndexError`` mid-stream (``checkpoint/restore.py``).
"""

from __future__ import annotations

import copy
import threading

import pytest
from helpers import byte_tokenize, source

from zephon_core import CorruptCheckpoint, IncompatibleCheckpoint, Pipeline
from zephon_core.checkpoint import codec
from zephon_core.testing import take


def build(num_epochs: int | None = 1) -> Pipeline:
    return (
        Pipeline(
            source(8, num_epochs=num_epochs),
            canonical_replicas=2,
            flush_every_k_chunks=2,
            seed=3,
            prefetch=0,
        )
        .fetch()
        .map(byte_tokenize, name="tokenize")
        .split(max_len=64)
        .pack(seq_len=64, bins=2)
        .batch(batch_size=2)
    )


@pytest.fixture(scope="module")
def state() -> dict:
    with build() as pipe:
        take(pipe, 9)
        return pipe.checkpoint()


def _lane(st: dict) -> dict:
    return next(ls for ls in st["lanes"] if ls["chunks"] and ls["cursor"])


CASES = {
    # name: (mutation of one lane, words the error must contain)
    "next_chunk_2**40": (lambda ls: ls.update(next_chunk=2**40), ["consecutive"]),
    "negative_floor": (lambda ls: ls.update(floor=-1), ["consecutive"]),
    "cursor_past_the_data": (
        lambda ls: ls.update(cursor=[ls["lane"], ls["next_chunk"] + 10**6, 0, 0]),
        ["outside the inflight"],
    ),
    "cursor_offset_past_chunk": (
        lambda ls: ls.update(cursor=[ls["lane"], ls["floor"], 10**6, 0]),
        ["past the"],
    ),
    "cursor_of_another_lane": (
        lambda ls: ls.update(cursor=[ls["lane"] + 1, ls["floor"], 0, 0]),
        ["not a cursor of this lane"],
    ),
    "cursor_missing": (lambda ls: ls.update(cursor=None), ["delivered"]),
    "boundary_off_k": (
        lambda ls: ls.update(boundaries=[ls["floor"] + 1]),
        ["flush_every_k_chunks"],
    ),
    "boundary_beyond": (lambda ls: ls.update(boundaries=[ls["next_chunk"] + 2]), ["boundary"]),
    "row_beyond_dataset": (
        lambda ls: ls["chunks"][0][3].__setitem__(0, 10**9),
        ["row 1000000000", "does not exist"],
    ),
    "component_beyond": (lambda ls: ls["chunks"][0][2].__setitem__(0, 7), ["dataset 7"]),
    "chunk_too_long": (
        lambda ls: (ls["chunks"][0][2].extend([0] * 20), ls["chunks"][0][3].extend([0] * 20)),
        ["chunk_size=8"],
    ),
    "tokens_shape": (lambda ls: ls.update(tokens=[1]), ["tokens"]),
    "source_cursor_10**6_past": (
        lambda ls: ls["source"]["cursors"].__setitem__(0, 10**6),
        ["cursor of dataset 'prose' is 1000000"],
    ),
    "ended_lane_with_chunks": (lambda ls: ls.update(exhausted=True), ["ended lane"]),
    "digest_not_int": (lambda ls: ls.update(digest="x"), ["digest"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_crafted_field_is_corrupt_before_any_work(state, case):
    mutation, words = CASES[case]
    st = copy.deepcopy(state)
    mutation(_lane(st))
    st = codec.decode(codec.encode(st))  # correctly encoded
    before = set(threading.enumerate())
    pipe = build()
    with pytest.raises(CorruptCheckpoint) as ei:
        pipe.load_state_dict(st)
    for w in words:
        assert w in str(ei.value), (case, str(ei.value))
    assert set(threading.enumerate()) <= before, "no work may start before validation"
    # the refused state left the pipeline usable
    assert len(take(pipe, 3)) == 3
    pipe.close()


def test_position_inconsistent_with_lanes_is_incompatible(state):
    st = copy.deepcopy(state)
    st["position"] = 10**12
    with pytest.raises(IncompatibleCheckpoint, match="position"):
        build().load_state_dict(st)


def test_the_same_checks_guard_handles(state):
    st = copy.deepcopy(state)
    CASES["cursor_past_the_data"][0](_lane(st))
    with pytest.raises(CorruptCheckpoint, match="outside the inflight"):
        build().iterate(restore=st)
    with pytest.raises(CorruptCheckpoint, match="outside the inflight"):
        build().dataloader(restore=st)
