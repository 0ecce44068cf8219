"""Row addressing of a mixture lane (``sources/mixture_rows.py``)."""

from __future__ import annotations

import pytest

from zephon_core import StaticMixtureWorkSource
from zephon_core.sources.mixture_rows import LaneRows


@pytest.mark.parametrize("lanes", [1, 3, 7, 20])
def test_the_lanes_partition_every_epoch_exactly(lanes):
    n = 11  # fewer rows than lanes too
    src = StaticMixtureWorkSource({"a": list(range(n))}, seed=4)
    epochs = 3
    per_lane = [LaneRows(src, lane, lanes) for lane in range(lanes)]
    positions = {}  # global position -> row
    for lane, rows in enumerate(per_lane):
        count = -(-(epochs * n - lane) // lanes)
        for k, row in enumerate(rows.rows(0, 0, count)):
            positions[lane + k * lanes] = row
    assert sorted(positions) == list(range(epochs * n))
    for e in range(epochs):  # each epoch is a permutation of the rows
        assert sorted(positions[e * n + i] for i in range(n)) == list(range(n))


def test_a_cap_limits_each_lanes_cursor():
    src = StaticMixtureWorkSource({"a": list(range(10))}, num_epochs=2)
    limits = [LaneRows(src, lane, 3).limits[0] for lane in range(3)]
    assert sum(limits) == 20  # every row twice over all lanes
    rows = LaneRows(src, 0, 3)
    assert rows.remaining([limits[0]]) == [0] and rows.drained([limits[0]])
    assert not rows.drained([0])
