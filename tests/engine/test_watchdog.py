"""The stall watchdog: a stream that stops making progress raises ``PipelineStalled``
naming the stage, lane and cursor, and logs every thread's stack -- never a silent hang.

The timeouts here are the feature under test (1 s), not synchronisation.
"""

from __future__ import annotations

import logging
import threading

import pytest
from helpers import byte_tokenize, source

from zephon_core import ConfigError, Pipeline, PipelineStalled
from zephon_core.testing import take

TIMEOUT = 1.0


def drop_everything(payload: dict) -> bool:
    return False


def _dropping(prefetch: int) -> Pipeline:
    return (
        Pipeline(
            source(8), canonical_replicas=2, seed=3, prefetch=prefetch, stall_timeout_s=TIMEOUT
        )
        .fetch()
        .map(byte_tokenize, name="tokenize")
        .filter(drop_everything, name="drop_all")
    )


@pytest.mark.parametrize("prefetch", [0, 3])
def test_a_filter_that_drops_everything_is_a_stall(prefetch, caplog):
    pipe = _dropping(prefetch)
    with caplog.at_level(logging.ERROR, logger="zephon_core.engine.watchdog"):
        with pytest.raises(PipelineStalled) as ei:
            take(pipe, 1)
    pipe.close()
    msg = str(ei.value)
    assert "lane" in msg and "drop_all" in msg and "without producing an output" in msg, msg
    assert "stall_timeout_s=1" in msg
    assert "--- thread" in caplog.text, "every thread's stack is logged"


@pytest.mark.slow
def test_a_stall_inside_dataloader_workers_reaches_the_training_loop():
    pipe = _dropping(prefetch=2)
    loader = pipe.dataloader(num_workers=2)
    with pytest.raises(PipelineStalled, match="drop_all"):
        take(loader, 1)
    loader.close()


class Blocker:
    """A map that blocks (as on a hung network read) until released."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def __call__(self, payload: dict) -> dict:
        self.release.wait(60)
        return byte_tokenize(payload)


@pytest.mark.parametrize(
    "prefetch,parallelism",
    [(0, 2), (3, 2), (3, 1)],
    ids=["no-pump-threads", "pump-threads", "pump-inline"],
)
def test_a_blocked_map_is_a_stall_naming_stage_lane_and_cursor(prefetch, parallelism):
    blocker = Blocker()
    pipe = (
        Pipeline(
            source(8), canonical_replicas=2, seed=3, prefetch=prefetch, stall_timeout_s=TIMEOUT
        )
        .fetch()
        .map(blocker, parallelism=parallelism, name="fetch_remote")
    )
    try:
        with pytest.raises(PipelineStalled) as ei:
            take(pipe, 1)
    finally:
        blocker.release.set()
        pipe.close()
    msg = str(ei.value)
    assert "fetch_remote" in msg and "stage[" in msg, msg
    assert "lane 0" in msg and "cursor (0, 0, 0, 0)" in msg, msg


def test_the_watchdog_argument_is_validated():
    for bad in (0, -1, "600", True):
        with pytest.raises(ConfigError, match="stall_timeout_s"):
            Pipeline(source(8), stall_timeout_s=bad)
    assert Pipeline(source(8), stall_timeout_s=None).stall_timeout_s is None
    assert Pipeline(source(8)).stall_timeout_s == 600.0
