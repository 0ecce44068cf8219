"""``exclude={"dataset": [row, ...]}`` at a restore (``checkpoint/data_changes.py``): the
rows are dropped from every chunk read after it (chunks in flight replay as they were
read), the drops travel with the chunks in the state, and later resumes are exact.
"""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest
from helpers import PROSE, reference_pipeline

from zephon_core.checkpoint import codec
from zephon_core.checkpoint.data_changes import excluded_rows
from zephon_core.errors import ConfigError, CorruptCheckpoint, IncompatibleCheckpoint
from zephon_core.testing.resume import assert_streams_equal, first_difference, reseed_globals

CUT = 8
AFTER = 60  # outputs compared after the restore


def _take(it, n: int) -> list:
    return list(itertools.islice(it, n))


def _through_bytes(state: dict) -> dict:
    return codec.decode(codec.encode(state))


def prose_rows(batches: list) -> set[int]:
    """The PROSE rows whose document start appears in ``batches`` (each document's text
    starts with ``p<row>:``, and bytes are the tokens)."""
    seen: set[int] = set()
    for b in batches:
        for row in b["input_ids"].numpy():
            text = bytes((row % 256).astype(np.uint8).tolist())
            seen |= {int(m) for m in re.findall(rb"p(\d+):", text)}
    return seen


def _inflight(state: dict, component: int = 0) -> set[int]:
    return {
        row
        for lane in state["lanes"]
        for chunk in lane["chunks"]
        for comp, row in zip(chunk[2], chunk[3])
        if comp == component
    }


def _marked(state: dict) -> int:
    """Inflight chunks that carry dropped offsets."""
    return sum(len(c) == 5 for lane in state["lanes"] for c in lane["chunks"])


@pytest.fixture(scope="module")
def cut() -> tuple[list, dict]:
    it = reference_pipeline().iterate()
    full = _take(it, CUT + AFTER)
    it.close()
    it = reference_pipeline().iterate()
    _take(it, CUT)
    state = _through_bytes(it.checkpoint())
    it.close()
    return full, state


def test_excluded_rows_never_appear_in_chunks_read_after_the_restore(cut):
    full, state = cut
    inflight = _inflight(state)
    excluded = sorted(set(range(len(PROSE))) - inflight)  # every prose row not in flight
    assert prose_rows(full[CUT:]) & set(excluded)  # they would have appeared
    reseed_globals(1)
    it = reference_pipeline().iterate(
        restore=state, exclude={"prose": excluded}, allow_changes={"exclude"}
    )
    got = _take(it, AFTER)
    it.close()
    assert not prose_rows(got) & set(excluded)
    # the rows in flight at the restore replay as they were read: the first outputs
    # (replayed chunks only) are the uninterrupted run's
    assert first_difference(full[CUT], got[0]) is None
    assert any(first_difference(a, b) for a, b in zip(full[CUT:], got))  # a real change


def test_later_resumes_of_an_excluding_run_are_exact(cut):
    _, state = cut
    excluded = sorted(set(range(len(PROSE))) - _inflight(state))
    kw = {"exclude": {"prose": excluded}, "allow_changes": {"exclude"}}
    reseed_globals(1)
    it = reference_pipeline().iterate(restore=state, **kw)
    whole = _take(it, AFTER)
    it.close()
    # a checkpoint whose inflight chunks carry drops, then two more resumes
    it = reference_pipeline().iterate(restore=state, **kw)
    got = []
    while True:
        got += _take(it, 1)
        s2 = _through_bytes(it.checkpoint())
        if _marked(s2):
            break
    it.close()
    assert excluded_rows(s2) == {"prose": excluded}
    reseed_globals(2)
    it = reference_pipeline().iterate(restore=s2)  # not passed: the record holds
    got += _take(it, 10)
    s3 = _through_bytes(it.checkpoint())
    it.close()
    reseed_globals(3)
    it = reference_pipeline().iterate(restore=s3, exclude={"prose": excluded})  # same: ok
    got += _take(it, AFTER - len(got))
    it.close()
    assert_streams_equal(whole, got, "excluding run resumed twice")


def test_exclude_refusals(cut):
    _, state = cut
    with pytest.raises(IncompatibleCheckpoint, match=r"allow_changes=\{'exclude'\}"):
        reference_pipeline().iterate(restore=state, exclude={"prose": [1]})
    it = reference_pipeline().iterate(
        restore=state, exclude={"prose": [1]}, allow_changes={"exclude"}
    )
    s2 = it.checkpoint()
    it.close()
    with pytest.raises(IncompatibleCheckpoint, match=r"'prose': \[1, 2\].*'prose': \[1\]"):
        reference_pipeline().iterate(restore=s2, exclude={"prose": [1, 2]})
    with pytest.raises(ConfigError, match="no dataset 'web'"):
        reference_pipeline().iterate(restore=s2, exclude={"web": [1]}, allow_changes={"exclude"})
    # a dropped offset edited in the state is caught by the chunk digest
    lane = next(ld for ld in s2["lanes"] if ld["chunks"])
    chunk = lane["chunks"][0]
    lane["chunks"][0] = chunk[:4] + [[0]] if len(chunk) == 4 else chunk[:4]
    with pytest.raises(CorruptCheckpoint, match="does not match its digest"):
        reference_pipeline().iterate(restore=s2)


@pytest.mark.slow
def test_excluding_through_dataloader_workers_equals_in_process(cut):
    _, state = cut
    excluded = sorted(set(range(len(PROSE))) - _inflight(state))
    kw = {"exclude": {"prose": excluded}, "allow_changes": {"exclude"}}
    it = reference_pipeline().iterate(restore=state, **kw)
    want = _take(it, 30)
    it.close()
    loader = reference_pipeline().dataloader(num_workers=2, restore=state, **kw)
    got = _take(iter(loader), 15)
    s2 = _through_bytes(loader.checkpoint())
    loader.close()
    loader = reference_pipeline().dataloader(num_workers=2, restore=s2)
    got += _take(iter(loader), 15)
    loader.close()
    assert_streams_equal(want, got, "2 workers, excluding, resumed")
