"""The locality-aware block shuffle (``sources/block_shuffle.py``): a bijection of every
epoch, lanes reading contiguous runs of blocks within bounded windows, and, through the
source and the pipeline, exact partition, exact resume and one stream for every
topology."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import CODE, PROSE, small_packed
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_core import ConfigError, IncompatibleCheckpoint, Pipeline, StaticMixtureWorkSource
from zephon_core.sources.block_shuffle import BlockShuffle
from zephon_core.sources.parquet import parquet_component
from zephon_core.testing import assert_resume_equivalent, take

PROP = settings(max_examples=120, deadline=None, derandomize=True, database=None)


@st.composite
def layouts(draw):
    """Block sizes (a row group per block, some short), a window and a lane count."""
    sizes = draw(st.lists(st.integers(1, 40), min_size=1, max_size=30))
    bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    return bounds, draw(st.integers(1, 5)), draw(st.integers(1, 7)), draw(st.integers(0, 9))


@PROP
@given(layout=layouts())
def test_every_epoch_is_a_permutation_of_the_rows(layout):
    bounds, window, lanes, epoch = layout
    n = int(bounds[-1])
    rows = BlockShuffle(bounds, window, lanes, key=11).map_array(np.arange(n), epoch)
    assert sorted(rows.tolist()) == list(range(n))


def _blocks_of(bounds: np.ndarray, rows: np.ndarray) -> np.ndarray:
    return np.searchsorted(bounds, rows, side="right") - 1


@PROP
@given(layout=layouts())
def test_each_lane_reads_a_contiguous_run_of_blocks(layout):
    """Lanes share at most the block on each edge of their runs: all lanes together
    touch at most ``blocks + lanes - 1`` (lane, block) pairs per epoch."""
    bounds, window, lanes, epoch = layout
    n = int(bounds[-1])
    rows = BlockShuffle(bounds, window, lanes, key=3).map_array(np.arange(n), epoch)
    touched = sum(
        len(set(_blocks_of(bounds, rows[r::lanes]).tolist())) for r in range(min(lanes, n))
    )
    assert touched <= (len(bounds) - 1) + lanes - 1


@pytest.mark.slow  # many seconds in this process
@PROP
@given(
    n=st.integers(1, 3000),
    block=st.integers(1, 64),
    window=st.integers(1, 6),
    lanes=st.integers(1, 6),
    epoch=st.integers(0, 5),
)
def test_a_window_holds_at_most_window_plus_two_blocks(n, block, window, lanes, epoch):
    bounds = np.append(np.arange(0, n, block), n).astype(np.int64)
    shuf = BlockShuffle(bounds, window, lanes, key=5)
    rows = shuf.map_array(np.arange(n), epoch)
    for r in range(min(lanes, n)):
        mine = rows[r::lanes]
        W = shuf.window_rows
        for g in range(0, len(mine), W):
            assert len(set(_blocks_of(bounds, mine[g : g + W]).tolist())) <= window + 2


def test_epochs_and_keys_differ_and_the_map_is_pure():
    bounds = np.arange(0, 1001, 50)
    a = BlockShuffle(bounds, 2, 4, key=1)
    e0, e1 = a.map_array(np.arange(1000), 0), a.map_array(np.arange(1000), 1)
    assert not np.array_equal(e0, e1)
    assert not np.array_equal(e0, BlockShuffle(bounds, 2, 4, key=2).map_array(np.arange(1000), 0))
    # any order of calls, any slicing: the same rows (the caches hold pure values)
    b = BlockShuffle(bounds, 2, 4, key=1)
    starts = list(range(0, 1000, 37))
    pieces = {s: b.map_array(np.arange(s, min(s + 37, 1000)), s % 2) for s in starts[::-1]}
    for s in starts:
        want = (e0 if s % 2 == 0 else e1)[s : s + 37]
        assert np.array_equal(pieces[s], want)
    assert np.array_equal(b.map_array(np.arange(1000), 0), e0)


# -- through the source ------------------------------------------------------------------


class Blocks:
    """A random-access dataset with its own blocks (like Parquet row groups)."""

    def __init__(self, sizes):
        self.bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)

    def __len__(self):
        return int(self.bounds[-1])

    def __getitem__(self, i):
        return i

    def block_bounds(self):
        return self.bounds


@pytest.mark.slow  # many seconds in this process
@PROP
@given(
    sizes=st.lists(st.integers(1, 30), min_size=1, max_size=12),
    other=st.integers(1, 200),
    lanes=st.integers(1, 5),
    chunk=st.integers(1, 9),
    window=st.integers(1, 4),
    block=st.sampled_from(["row_group", 7]),
    epochs=st.integers(1, 3),
)
def test_lanes_partition_every_epoch_of_every_dataset(
    sizes, other, lanes, chunk, window, block, epochs
):
    a = Blocks(sizes)
    b = Blocks([other])
    src = StaticMixtureWorkSource(
        {"a": a, "b": b},
        chunk_size=chunk,
        seed=4,
        num_epochs=epochs,
        shuffle_block=block,
        shuffle_window=window,
    )
    seen: dict[int, Counter] = {0: Counter(), 1: Counter()}
    for lane in range(lanes):
        ln = src.open_lane(lane, lanes, seed=1)
        while (c := ln.next_chunk()) is not None:
            for d, r in zip(c.components, c.rows):
                seen[d][r] += 1
    assert seen[0] == Counter({r: epochs for r in range(len(a))})
    assert seen[1] == Counter({r: epochs for r in range(len(b))})


@pytest.mark.slow  # many seconds in this process
@PROP
@given(
    lanes=st.integers(1, 4),
    cut=st.integers(0, 40),
    block=st.sampled_from([1, 5, 64, "row_group"]),
)
def test_a_lane_restores_from_its_state_in_o1(lanes, cut, block):
    def src():
        return StaticMixtureWorkSource(
            {"a": Blocks([13, 40, 7, 22]), "b": Blocks([5] * 9)},
            {"a": 0.6, "b": 0.4},
            chunk_size=6,
            seed=9,
            shuffle_block=block,
        )

    for lane in range(lanes):
        whole = src().open_lane(lane, lanes, seed=2)
        expect = [whole.next_chunk() for _ in range(cut + 12)]
        first = src().open_lane(lane, lanes, seed=2)
        for _ in range(cut):
            first.next_chunk()
        again = src().open_lane(lane, lanes, seed=2)
        again.load_state_dict(first.state_dict())
        assert [again.next_chunk() for _ in range(12)] == expect[cut:]


def test_config_errors_name_the_fix():
    with pytest.raises(ConfigError, match="no dataset has row groups"):
        StaticMixtureWorkSource({"a": list(range(9))}, shuffle_block="row_group")
    with pytest.raises(ConfigError, match="needs shuffle=True"):
        StaticMixtureWorkSource({"a": list(range(9))}, shuffle=False, shuffle_block=3)
    with pytest.raises(ConfigError, match="shuffle_block"):
        StaticMixtureWorkSource({"a": list(range(9))}, shuffle_block=0)
    with pytest.raises(ConfigError, match="shuffle_window"):
        StaticMixtureWorkSource({"a": list(range(9))}, shuffle_block=3, shuffle_window=0)


def test_empty_blocks_hold_nothing_and_falling_bounds_are_named():
    """Empty row groups or shards (equal bounds) are skipped; bounds that fall are bad."""
    src = StaticMixtureWorkSource(
        {"a": Blocks([4, 0, 6, 0, 0, 5])}, chunk_size=3, seed=1, num_epochs=1,
        shuffle_block="row_group",
    )  # fmt: skip
    lane = src.open_lane(0, 1, seed=2)
    rows = [r for ch in iter(lane.next_chunk, None) for r in ch.rows]
    assert sorted(rows) == list(range(15))
    bad = Blocks([4, 6])
    bad.bounds = np.array([0, 7, 4, 10])
    with pytest.raises(ConfigError, match=r"block_bounds\(\) must rise from 0 to len \(10\)"):
        StaticMixtureWorkSource({"a": bad}, shuffle_block="row_group")


def test_describe_names_the_blocks_only_when_set():
    plain = StaticMixtureWorkSource({"a": list(range(9))}).describe()
    assert "shuffle_block" not in plain and "shuffle_window" not in plain
    d = StaticMixtureWorkSource({"a": list(range(9))}, shuffle_block=4).describe()
    assert (d["shuffle_block"], d["shuffle_window"]) == (4, 4)


# -- through the pipeline ------------------------------------------------------------------


def _pipe(block=16, window=3, lanes=4, data=None, **kw) -> Pipeline:
    src = StaticMixtureWorkSource(
        data or {"prose": PROSE, "code": CODE},
        chunk_size=8,
        seed=5,
        shuffle_block=block,
        shuffle_window=window,
    )
    return small_packed(
        Pipeline(src, canonical_replicas=lanes, flush_every_k_chunks=2, seed=1, **kw), shuffle=8
    )


def test_a_block_shuffled_pipeline_resumes_exactly_at_many_cuts():
    assert_resume_equivalent(_pipe, cut_points=[0, 1, 7, 23, 60], total=90)


@pytest.mark.slow
def test_one_stream_for_every_topology_and_resume_across_topologies():
    """Workers and ranks change nothing: a cut under 2 ranks x 2 workers resumes under
    1 rank x 0 workers and vice versa, equal to the uninterrupted in-process stream."""
    assert_resume_equivalent(
        _pipe, [0, 12, 30], total=44, dp_size=2, num_workers=2, resume_dp_size=1,
        resume_num_workers=0,
    )  # fmt: skip
    assert_resume_equivalent(
        _pipe, [0, 10, 26], total=40, dp_size=1, num_workers=0, resume_dp_size=2,
        resume_num_workers=2,
    )  # fmt: skip


def test_a_changed_block_size_is_refused_at_restore():
    with _pipe(block=16) as pipe:
        take(pipe, 3)
        state = pipe.checkpoint()
    with pytest.raises(IncompatibleCheckpoint, match="shuffle_block"):
        _pipe(block=32).load_state_dict(state)


def test_parquet_row_groups_are_read_about_once_per_epoch(tmp_path):
    """One epoch over 4 lanes in one process, a cache that holds every lane's window:
    each row group is read once, plus at most one per lane edge."""
    rng = np.random.default_rng(0)
    n_groups = 0
    for s in range(5):
        rows = [{"text": f"s{s}r{i} " + "y" * int(rng.integers(5, 90))} for i in range(57)]
        pq.write_table(pa.Table.from_pylist(rows), tmp_path / f"p{s}.parquet", row_group_size=8)
        n_groups += -(-57 // 8)
    comp = parquet_component(str(tmp_path), columns=["text"], cache_bytes=64 << 20)
    src = StaticMixtureWorkSource(
        {"docs": comp}, chunk_size=8, seed=2, num_epochs=1, shuffle_block="row_group"
    )
    pipe = Pipeline(src, canonical_replicas=4, flush_every_k_chunks=None, seed=1).fetch()
    got = take(pipe, 10**6)
    assert sorted(r["text"] for r in got) == sorted(
        r["text"] for r in comp.__getitems__(list(range(len(comp))))
    )
    assert len(got) == len(comp)
    reads = pipe.stats()["io"]["docs"]["row_group_reads"]
    assert n_groups <= reads <= n_groups + 3
    pipe.close()

    # the same epoch with the row-level shuffle: a read per row group per lane at least
    comp2 = parquet_component(str(tmp_path), columns=["text"], cache_bytes=1)
    src2 = StaticMixtureWorkSource({"docs": comp2}, chunk_size=8, seed=2, num_epochs=1)
    with Pipeline(src2, canonical_replicas=4, flush_every_k_chunks=None, seed=1).fetch() as p2:
        take(p2, 10**6)
        assert p2.stats()["io"]["docs"]["row_group_reads"] > 3 * n_groups
