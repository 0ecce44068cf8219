"""Every restore logs one INFO line: origin, global position, lanes, chunks to replay and
the time to the first output; a fresh start logs nothing."""

from __future__ import annotations

import logging
import re

import pytest
from helpers import reference_pipeline

from zephon_core.testing import take

PATTERN = re.compile(
    r"zephon: restored from (?P<origin>.+) at global position (?P<pos>\d+): lanes "
    r"\[(?P<lanes>[\d, ]+)\], (?P<chunks>\d+) inflight chunks to replay, first output "
    r"after \d+ ms"
)


def _lines(caplog) -> list[re.Match]:
    return [
        m
        for r in caplog.records
        if r.name == "zephon_core.restore" and (m := PATTERN.fullmatch(r.getMessage()))
    ]


def _state(n: int = 20) -> dict:
    with reference_pipeline(prefetch=0) as pipe:
        take(pipe, n)
        return pipe.checkpoint()


def test_iterator_restore_logs_origin_position_lanes_and_replay(caplog):
    state = _state()
    chunks = sum(len(ls["chunks"]) for ls in state["lanes"])
    with caplog.at_level(logging.INFO, logger="zephon_core.restore"):
        with reference_pipeline().iterate(restore=state, origin="ckpt/step-20.zst") as it:
            take(it, 3)
    (m,) = _lines(caplog)
    assert m["origin"] == "ckpt/step-20.zst" and int(m["pos"]) == 20
    assert m["lanes"] == "0, 1, 2, 3" and int(m["chunks"]) == chunks


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_loader_restore_logs_once(caplog, workers):
    state = _state()
    pipe = reference_pipeline()
    pipe.load_state_dict(state, origin="last.ckpt")
    with caplog.at_level(logging.INFO, logger="zephon_core.restore"):
        loader = pipe.dataloader(num_workers=workers)
        it = iter(loader)
        for _ in range(3):
            next(it)
        iter(loader)  # a new pass continues the loader's own stream: no new line
        loader.close()
    (m,) = _lines(caplog)
    assert m["origin"] == "last.ckpt" and int(m["pos"]) == 20


def test_a_fresh_start_logs_nothing(caplog):
    with caplog.at_level(logging.INFO, logger="zephon_core.restore"):
        with reference_pipeline().iterate() as it:
            take(it, 2)
    assert not _lines(caplog) and not [r for r in caplog.records if "restored" in r.getMessage()]


def test_a_state_without_origin_says_so(caplog):
    state = _state(8)
    with caplog.at_level(logging.INFO, logger="zephon_core.restore"):
        with reference_pipeline().iterate(restore=state) as it:
            take(it, 1)
    (m,) = _lines(caplog)
    assert m["origin"] == "a state dict"
