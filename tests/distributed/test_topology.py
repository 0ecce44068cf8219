"""Lane assignment (docs/design.md §7): which rank and which DataLoader worker serves which lane.

Global output position g belongs to lane g mod C. With D data-parallel ranks starting at
global position g0, rank r owns the lanes l with (l - g0) mod D == r and visits them in the
order (g0 + r + i*D) mod C; DataLoader worker w of W owns every W-th lane of that list, so
the DataLoader's strict worker round-robin reproduces the rank's lane round-robin.
"""

from __future__ import annotations

import itertools
import re

import pytest
from helpers import reference_pipeline

from zephon_core.distributed import Topology, rank_lanes, validate, worker_lanes
from zephon_core.distributed.merge import expected_lanes
from zephon_core.errors import ConfigError, TopologyError


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def valid_layouts(max_lanes: int = 12):
    """Every (C, D, W) with D | C and W = 0 or W | C/D."""
    for c in range(1, max_lanes + 1):
        for d in divisors(c):
            for w in [0, *divisors(c // d)]:
                yield c, d, w


# -- the formulas, checked by hand -------------------------------------------------------


@pytest.mark.parametrize(
    "C, D, r, g0, lanes",
    [
        (4, 1, 0, 0, [0, 1, 2, 3]),
        (4, 1, 0, 3, [3, 0, 1, 2]),
        (8, 2, 0, 0, [0, 2, 4, 6]),
        (8, 2, 1, 0, [1, 3, 5, 7]),
        (8, 2, 0, 3, [3, 5, 7, 1]),
        (8, 2, 1, 3, [4, 6, 0, 2]),
        (8, 4, 3, 6, [1, 5]),
        (8, 8, 5, 6, [3]),
        (6, 3, 2, 5, [1, 4]),
        (6, 2, 1, 1, [2, 4, 0]),
        (12, 2, 1, 7, [8, 10, 0, 2, 4, 6]),
        (12, 3, 0, 14, [2, 5, 8, 11]),  # g0 beyond C wraps around
    ],
)
def test_rank_lanes_by_hand(C, D, r, g0, lanes):
    assert rank_lanes(C, D, r, g0) == lanes
    # the merge leader's view of the same mapping agrees
    assert expected_lanes(C, D, r, g0) == set(lanes)


@pytest.mark.parametrize(
    "lanes, W, w, mine",
    [
        ([0, 1, 2, 3], 0, 0, [0, 1, 2, 3]),  # no workers: the main process serves all
        ([0, 1, 2, 3], 1, 0, [0, 1, 2, 3]),
        ([0, 1, 2, 3], 2, 0, [0, 2]),
        ([0, 1, 2, 3], 2, 1, [1, 3]),
        ([5, 6, 7, 0, 1, 2, 3, 4], 2, 0, [5, 7, 1, 3]),
        ([5, 6, 7, 0, 1, 2, 3, 4], 2, 1, [6, 0, 2, 4]),
        ([5, 6, 7, 0, 1, 2, 3, 4], 4, 3, [0, 4]),
        ([8, 10, 0, 2, 4, 6], 3, 0, [8, 2]),
        ([8, 10, 0, 2, 4, 6], 3, 1, [10, 4]),
        ([8, 10, 0, 2, 4, 6], 3, 2, [0, 6]),
        ([8, 10, 0, 2, 4, 6], 6, 4, [4]),
    ],
)
def test_worker_lanes_by_hand(lanes, W, w, mine):
    assert worker_lanes(lanes, W, w) == mine


def test_rank_lanes_follow_the_global_position_mapping():
    """Rank r's i-th output from g0 on is global position g0 + i*D + r, i.e. lane
    (g0 + i*D + r) mod C -- for several rounds, not just the first."""
    for C, D, _ in valid_layouts():
        for g0 in range(2 * C + 1):
            for r in range(D):
                lanes = rank_lanes(C, D, r, g0)
                assert len(lanes) == C // D
                for i in range(3 * len(lanes)):
                    assert lanes[i % len(lanes)] == (g0 + i * D + r) % C, (C, D, r, g0, i)


# -- partition and round-robin -----------------------------------------------------------


def test_ranks_and_workers_partition_the_lanes():
    for C, D, W in valid_layouts():
        for g0 in range(2 * C + 1):
            seen = []
            for r in range(D):
                lanes = rank_lanes(C, D, r, g0)
                assert len(set(lanes)) == len(lanes)
                assert {x for x in range(C) if (x - g0) % D == r} == set(lanes)
                shares = [worker_lanes(lanes, W, w) for w in range(max(W, 1))]
                assert sorted(itertools.chain(*shares)) == sorted(lanes), (C, D, W, g0, r)
                if W:
                    assert {len(s) for s in shares} == {len(lanes) // W}
                seen += itertools.chain(*shares)
            assert sorted(seen) == list(range(C)), (C, D, W, g0)


def test_dataloader_round_robin_reproduces_the_rank_order():
    """A torch DataLoader asks worker 0, 1, .., W-1, 0, 1, .. in turn; each worker walks its
    own lanes cyclically. That must give the rank's lane order for any g0 (also after a
    resume at a position that is not a multiple of anything)."""
    for C, D, W in valid_layouts():
        if W == 0:
            continue
        for g0 in range(2 * C + 1):
            for r in range(D):
                lanes = rank_lanes(C, D, r, g0)
                shares = [worker_lanes(lanes, W, w) for w in range(W)]
                cursors = [itertools.cycle(s) for s in shares]
                produced = [next(cursors[t % W]) for t in range(3 * len(lanes))]
                assert produced == [lanes[t % len(lanes)] for t in range(3 * len(lanes))], (
                    C,
                    D,
                    W,
                    g0,
                    r,
                )


# -- invalid combinations ------------------------------------------------------------------


def _listed(message: str) -> list[int]:
    m = re.search(r"\[([0-9, ]*)\]", message)
    assert m, message
    return [int(x) for x in m.group(1).split(",")]


@pytest.mark.parametrize("C, D", [(4, 3), (6, 4), (8, 3), (5, 2), (12, 5)])
def test_dp_size_not_dividing_lanes_is_rejected_with_valid_sizes(C, D):
    with pytest.raises(TopologyError) as ei:
        validate(C, D, 0)
    msg = str(ei.value)
    assert f"dp_size={D}" in msg and str(C) in msg
    assert _listed(msg) == divisors(C)
    with pytest.raises(TopologyError):
        rank_lanes(C, D, 0, 0)


@pytest.mark.parametrize(
    "C, D, W", [(4, 1, 3), (8, 2, 3), (8, 4, 4), (6, 2, 2), (12, 2, 4), (4, 2, 3)]
)
def test_workers_not_dividing_rank_lanes_are_rejected_with_valid_counts(C, D, W):
    with pytest.raises(TopologyError) as ei:
        validate(C, D, W)
    msg = str(ei.value)
    assert f"num_workers={W}" in msg
    assert _listed(msg) == [0, *divisors(C // D)]


def test_valid_combinations_pass_validation():
    for C, D, W in valid_layouts():
        validate(C, D, W)


# -- Topology ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(rank=2, world_size=2), ["rank=2", "world_size=2"]),
        (dict(rank=5, world_size=4, dp_rank=0, dp_size=2), ["rank=5"]),
        (dict(rank=0, world_size=4, dp_rank=2, dp_size=2), ["dp_rank=2", "dp_size=2"]),
        (dict(rank=0, world_size=3, dp_rank=0, dp_size=2), ["world_size=3", "dp_size=2"]),
        (dict(rank=0, world_size=2, dp_rank=0, dp_size=4), ["world_size=2", "dp_size=4"]),
        (dict(rank=-1, world_size=2), ["rank=-1"]),
        (dict(rank=0, world_size=-2), ["world_size=-2"]),
        (dict(dp_rank=-1), ["dp_rank=-1"]),
        (dict(world_size=0), ["world_size=0"]),
        (dict(dp_size=0), ["dp_size=0"]),
        (dict(worker_id=2, num_workers=2), ["worker_id=2", "num_workers=2"]),
        (dict(num_workers=-1), ["num_workers=-1"]),
        (dict(rank=True, world_size=2), ["rank=True"]),
        (dict(rank=0.0), ["rank=0.0"]),
    ],
)
def test_invalid_topologies_raise(kwargs, words):
    with pytest.raises(TopologyError) as ei:
        Topology(**kwargs)
    for w in words:
        assert w in str(ei.value)


def test_valid_topologies():
    t = Topology(rank=3, world_size=4, dp_rank=1, dp_size=2, worker_id=1, num_workers=2)
    assert (t.rank, t.world_size, t.dp_rank, t.dp_size) == (3, 4, 1, 2)
    assert not t.is_leader
    assert Topology().is_leader
    assert not Topology(rank=0, world_size=2, worker_id=1, num_workers=2).is_leader


def test_bind_validates_topology():
    pipe = reference_pipeline(lanes=4)
    with pytest.raises(TopologyError, match="rank=2"):
        pipe = pipe.bind(rank=2, world_size=2)
    with pytest.raises(TopologyError, match="dp_rank=2"):
        pipe = pipe.bind(rank=0, world_size=4, dp_rank=2, dp_size=2)
    # C=4 lanes cannot be split over 3 data-parallel ranks; the error lists valid sizes
    with pytest.raises(TopologyError) as ei:
        pipe = pipe.bind(rank=0, world_size=3)
    assert _listed(str(ei.value)) == [1, 2, 4]
    # bind(rank, world_size) defaults the DP layout to dp_rank=rank, dp_size=world_size
    topo = reference_pipeline(lanes=4).bind(rank=1, world_size=2).topology()
    assert (topo.rank, topo.world_size, topo.dp_rank, topo.dp_size) == (1, 2, 1, 2)
    topo = reference_pipeline(lanes=4).bind(rank=3, world_size=4, dp_rank=1, dp_size=2).topology()
    assert (topo.rank, topo.world_size, topo.dp_rank, topo.dp_size) == (3, 4, 1, 2)


# -- dataloader() argument checks ------------------------------------------------------------


def test_dataloader_rejects_workers_not_dividing_lanes_at_creation():
    pipe = reference_pipeline(lanes=4)
    with pytest.raises(TopologyError) as ei:
        pipe.dataloader(num_workers=3)  # fails before any worker process starts
    msg = str(ei.value)
    assert "num_workers=3" in msg
    assert _listed(msg) == [0, 1, 2, 4]
    pipe.close()

    pipe = reference_pipeline(lanes=8).bind(rank=1, world_size=2)
    with pytest.raises(TopologyError) as ei:
        pipe.dataloader(num_workers=3)
    assert _listed(str(ei.value)) == [0, 1, 2, 4]
    with pytest.raises(TopologyError):
        pipe.dataloader(num_workers=8)
    pipe.close()


@pytest.mark.parametrize(
    "kwargs, word",
    [
        (dict(batch_size=4), "batch_size"),
        (dict(batch_size=1), "batch_size"),
        (dict(shuffle=True), "shuffle"),
        (dict(drop_last=True), "drop_last"),
        (dict(collate_fn=lambda x: x), "collate_fn"),
        (dict(sampler=[0, 1]), "sampler"),
        (dict(batch_sampler=[[0]]), "batch_sampler"),
        (dict(num_workers=2, persistent_workers=True), "persistent_workers"),
    ],
)
def test_dataloader_rejects_batching_and_persistent_workers(kwargs, word):
    pipe = reference_pipeline(lanes=4)
    with pytest.raises(ConfigError, match=word):
        pipe.dataloader(**kwargs)
    pipe.close()


def test_dataloader_accepts_neutral_arguments():
    pipe = reference_pipeline(lanes=4)
    loader = pipe.dataloader(
        num_workers=2, batch_size=None, shuffle=False, persistent_workers=False, prefetch_factor=2
    )
    assert loader.num_workers == 2
    pipe.close()
