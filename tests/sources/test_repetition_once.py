"""The repetition warning shows once per job: DataLoader workers defer theirs to the
training process (``sources/repetition.py``)."""

from __future__ import annotations

import logging

import pytest
from helpers import PROSE, make_docs

from zephon_core import Pipeline, StaticMixtureWorkSource
from zephon_core.sources import repetition
from zephon_core.testing import take


@pytest.mark.slow
def test_the_repetition_warning_shows_once_with_two_dataloader_workers(tmp_path):
    # a file every process appends to: the forked workers inherit the handler, so the
    # file holds what the user sees from all of them
    seen = tmp_path / "warnings.log"
    handler = logging.FileHandler(seen)
    logger = logging.getLogger("zephon_core.sources")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    repetition._warned.clear()
    small = make_docs(6, 5, 50, 9, "s")
    src = StaticMixtureWorkSource({"big": PROSE, "small": small}, chunk_size=8, seed=1)
    loader = (
        Pipeline(src, canonical_replicas=4, seed=0)
        .fetch()
        .dataloader(num_workers=2, multiprocessing_context="fork")
    )
    try:
        got = take(loader, 200)  # every lane reads 'small' into its 2nd epoch early on
    finally:
        loader.close()
        logger.removeHandler(handler)
        logger.setLevel(level)
        handler.close()
    assert len(got) == 200
    lines = [line for line in seen.read_text().splitlines() if "second epoch" in line]
    assert len(lines) == 1, lines
    assert "'small'" in lines[0]
