"""What a round and a restore cost as ranks grow (issue 21): a rank decodes and validates
only the lanes it owns, the leader waits for every report with one listing per poll, and
a follower waiting on S3 backs off instead of polling several times a second."""

from __future__ import annotations

import threading
import time

import pytest
from helpers import reference_pipeline

from zephon_core.checkpoint import owned_lanes, restore, state
from zephon_core.checkpoint.restore import admit_owned
from zephon_core.checkpoint.state import PipelineState
from zephon_core.distributed import merge_local_checkpoints
from zephon_core.distributed.aggregate import AggregationError, Aggregator
from zephon_core.distributed.storage import DirStorage
from zephon_core.distributed.topology import Topology
from zephon_core.errors import CorruptCheckpoint
from zephon_core.testing import SimulatedRanks

C = 8
BUCKET = "rounds"


@pytest.fixture(scope="module")
def ranks_state():
    """Four ranks' reports and their merged state, a few steps in."""
    with SimulatedRanks(lambda: reference_pipeline(lanes=C), 4) as ranks:
        ranks.steps(5)
        return ranks.reports(), ranks.checkpoint()


class _Count:
    def __init__(self, monkeypatch, module, name):
        self.n = 0
        real = getattr(module, name)

        def counted(*a, **k):
            self.n += 1
            return real(*a, **k)

        monkeypatch.setattr(module, name, counted)


def test_a_rank_decodes_and_validates_only_its_own_lanes(ranks_state, monkeypatch):
    _, merged = ranks_state
    plan = reference_pipeline(lanes=C).compile()
    decoded = _Count(monkeypatch, state.LaneState, "from_dict")
    checked = _Count(monkeypatch, restore, "_check_lane")
    got = admit_owned(merged, plan, dp_rank=1, dp_size=4)
    mine = {lane for lane in range(C) if (lane - merged["position"]) % 4 == 1}
    assert set(got.lanes) == mine
    assert decoded.n == len(mine) == C // 4
    assert checked.n == len(mine)
    assert got.to_dict() == merged  # the other lanes pass through as read


def test_a_corrupt_lane_is_refused_by_its_owner_and_by_a_whole_admission(ranks_state):
    _, merged = ranks_state
    plan = reference_pipeline(lanes=C).compile()
    owner = (3 - merged["position"]) % 4
    bad = {**merged, "lanes": [dict(d) for d in merged["lanes"]]}
    bad["lanes"][3]["chunks"] = [
        [c[0], c[1], c[2], [10**9] * len(c[3])] for c in bad["lanes"][3]["chunks"]
    ]
    with pytest.raises(CorruptCheckpoint, match="lane 3"):
        admit_owned(bad, plan, dp_rank=owner, dp_size=4)
    with pytest.raises(CorruptCheckpoint, match="lane 3"):
        admit_owned(bad, plan, dp_rank=0, dp_size=1)
    admit_owned(bad, plan, dp_rank=(owner + 1) % 4, dp_size=4)  # not its lane


def test_progress_of_lanes_a_rank_does_not_own_is_still_checked(ranks_state):
    _, merged = ranks_state
    plan = reference_pipeline(lanes=C).compile()
    owner = (3 - merged["position"]) % 4
    bad = {**merged, "lanes": [dict(d) for d in merged["lanes"]]}
    bad["lanes"][3]["delivered"] += 1
    from zephon_core.errors import IncompatibleCheckpoint

    with pytest.raises(IncompatibleCheckpoint, match="lane 3"):
        admit_owned(bad, plan, dp_rank=(owner + 1) % 4, dp_size=4)


def test_a_state_admitted_for_one_rank_restores_exactly_on_another(ranks_state):
    """A state admitted for one place that starts a run on another (torch.distributed
    started or the pipeline bound since): it is admitted whole again, and the stream is the
    one a whole admission gives."""
    from zephon_core.engine.handle import PipelineIterator
    from zephon_core.testing import assert_streams_equal

    _, merged = ranks_state
    pipe = reference_pipeline(lanes=C).bind(rank=1, world_size=4, dp_rank=1, dp_size=4)
    pipe.load_state_dict(merged)
    owned = pipe._current_run.pending
    assert isinstance(owned, owned_lanes.OwnedLanesState)
    assert pipe.checkpoint() == merged  # before the first step: the state restored
    other = reference_pipeline(lanes=C).bind(rank=2, world_size=4, dp_rank=2, dp_size=4)
    with other.iterate(restore=merged) as it:
        want = [next(it) for _ in range(3)]
    with PipelineIterator(other._spec(owned)) as it:
        got = [next(it) for _ in range(3)]
    assert_streams_equal(want, got)


def _threads_round(aggs, locals_):
    out, errors = [None] * len(aggs), []

    def run(r):
        try:
            out[r] = aggs[r].round(locals_[r])
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(len(aggs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    return out


class CountingStorage:
    """A storage whose protocol calls are counted (each one round trip, or one batch of
    concurrent reads)."""

    def __init__(self, inner):
        self.inner, self.url, self.calls = inner, inner.url, 0

    def __getattr__(self, name):
        value = getattr(self.inner, name)
        if name == "backoff" or not callable(value):
            return value

        def counted(*args, **kwargs):
            self.calls += 1
            return value(*args, **kwargs)

        return counted


def test_the_leader_makes_a_few_storage_calls_whatever_the_number_of_ranks(tmp_path):
    """D=16 ranks in threads over one directory: the leader's calls do not grow with D
    (it made ~3.3*D calls one at a time before: a wait and a delete per rank)."""
    D = 16
    with SimulatedRanks(lambda: reference_pipeline(lanes=16), D) as ranks:
        ranks.steps(2)
        reports, want = ranks.reports(), ranks.checkpoint()
    stores = [CountingStorage(DirStorage(str(tmp_path))) for _ in range(D)]
    aggs = [Aggregator(Topology(r, D, r, D), stores[r], 60.0, 16) for r in range(D)]
    locals_ = [PipelineState.from_dict(rep["state"]) for rep in reports]
    got = _threads_round(aggs, locals_)
    assert stores[0].calls <= 12, stores[0].calls  # 51 before (D=16)
    assert all(g == want for g in got)
    assert merge_local_checkpoints(reports, 16) == want


def test_a_waiting_follower_on_s3_backs_off(s3_fs):
    """A follower whose leader announced a round and never publishes it: over 6 s it polls
    the bucket a dozen times or so, not ~9 times a second (it restarted its 5 ms backoff
    every second before)."""
    from zephon_core.testing.s3 import FaultProxy

    fs, endpoint = s3_fs
    proxy = FaultProxy(endpoint)
    try:
        st = DirStorage.__new__(DirStorage)
        st.url, st.objects = f"s3://{BUCKET}/wait", True
        st.fs, st.root = _s3fs(proxy.url), f"{BUCKET}/wait"
        st.put("announce", b"0-0123456789ab")
        local = PipelineState("fp", {}, 0, {})
        agg = Aggregator(Topology(1, 2, 1, 2), st, 6.0, 2)
        proxy.reset_counts()
        t0 = time.monotonic()
        with pytest.raises(AggregationError, match="still open"):
            agg.round(local)
        assert time.monotonic() - t0 >= 6.0
        gets = proxy.counts()["gets"]
    finally:
        proxy.close()
    assert 3 <= gets <= 25, gets  # s3fs: a HEAD and a GET per read


def _s3fs(endpoint: str):
    import s3fs

    return s3fs.S3FileSystem(
        key="testing",
        secret="testing",
        client_kwargs={"endpoint_url": endpoint, "region_name": "us-east-1"},
        skip_instance_cache=True,
    )


@pytest.fixture(scope="module")
def s3_fs():
    from helpers import s3_server

    with s3_server(BUCKET) as (endpoint, _):
        yield _s3fs(endpoint), endpoint


def test_expected_lanes_are_every_dth_lane_from_the_ranks_first():
    from zephon_core.distributed.merge import expected_lanes

    for c, d, r, p in [(8, 4, 1, 5), (12, 3, 2, 0), (7, 3, 0, 11), (1024, 256, 255, 1040)]:
        assert expected_lanes(c, d, r, p) == {lane for lane in range(c) if (lane - p) % d == r}
