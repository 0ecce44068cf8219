"""checkpoint(served=n): the state right after the n-th batch a loader handed out.

Trainers read ahead (Lightning's fetcher holds batch i+1 while step i runs); the
checkpoint must describe what the training step consumed, not what was fetched.
"""

from __future__ import annotations

import pytest
from helpers import reference_pipeline

from zephon_core import ConfigError
from zephon_core.testing import assert_streams_equal, reseed_globals, take

REF = None


def _reference():
    global REF
    if REF is None:
        p = reference_pipeline()
        REF = take(p, 48)
        p.close()
    return REF


@pytest.mark.slow
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("ahead", [0, 1, 3])
def test_state_after_consumed_batch_while_loader_read_ahead(num_workers, ahead):
    ref = _reference()
    consumed = 17
    p = reference_pipeline()
    it = iter(p.dataloader(num_workers=num_workers))
    got = [next(it) for _ in range(consumed + ahead)]
    assert_streams_equal(ref[: consumed + ahead], got, "loader prefix")
    state = p.checkpoint(served=consumed)
    del it
    assert state["position"] == consumed
    reseed_globals(ahead)
    q = reference_pipeline()
    q.load_state_dict(state)
    assert_streams_equal(ref[consumed:48], take(q, 48 - consumed), "resumed after consumed")
    q.close()


@pytest.mark.slow
def test_served_beyond_memory_or_future_is_rejected():
    p = reference_pipeline()
    it = iter(p.dataloader(num_workers=0))
    for _ in range(30):
        next(it)
    with pytest.raises(ConfigError, match="remembers"):
        p.checkpoint(served=5)
    with pytest.raises(ConfigError, match="handed out only 30") as ei:
        p.checkpoint(served=31)
    assert "max_read_ahead" not in str(ei.value)  # a setting that could not help
    del it


def test_served_requires_a_dataloader():
    p = reference_pipeline()
    take(p, 3)
    with pytest.raises(ConfigError, match="dataloader"):
        p.checkpoint(served=2)
    p.close()
