"""Per-rank DCP state (``distributed/dcp.py``), in this process.

Ranks are simulated (``SimulatedRanks``); DCP's part -- each rank's keys written once,
a rank's load template filled from the union -- is done as DCP does it (a flat union of
the ranks' keys; each rank's template filled in place, then ``load_state_dict``), and one
test goes through real ``dcp.save``/``dcp.load`` files on one process. Real processes:
``test_dcp_processes.py`` and the torchrun example test.
"""

from __future__ import annotations

import pytest
from helpers import reference_pipeline

from zephon_core.distributed import dcp as zdcp
from zephon_core.errors import (
    CorruptCheckpoint,
    IncompatibleCheckpoint,
    LifecycleError,
    MissingLanes,
)
from zephon_core.testing import SimulatedRanks, assert_streams_equal, take

C = 12
N = 40


def build(lanes: int = C, **kw):
    return reference_pipeline(lanes=lanes, **kw)


_REF: list = []


def reference() -> list:
    if not _REF:
        pipe = build()
        try:
            _REF.extend(take(pipe, N))
        finally:
            pipe.close()
    return _REF


def bound(D: int, r: int, **kw):
    pipe = build(**kw)
    return pipe.bind(rank=r, world_size=D) if D > 1 else pipe


def union(states: list[dict]) -> dict:
    """What DCP stores for these ranks' state_dict()s: every key once (meta is identical)."""
    out: dict = {"meta": states[0]["meta"], "slots": {}}
    for s in states:
        assert s["meta"] == out["meta"]
        out["slots"].update(s["slots"])
    return out


def dcp_fill(handle, stored: dict) -> None:
    """dcp.load's steps: the template from state_dict(), filled in place, then loaded."""
    template = handle.state_dict()
    template["meta"] = stored["meta"]
    for key in template["slots"]:
        template["slots"][key] = stored["slots"][key]  # KeyError: DCP's missing key
    handle.load_state_dict(template)


def global_stream(handles: list, n: int) -> list:
    out: list = []
    while len(out) < n:
        out += [next(h) for h in handles]
    return out[:n]


@pytest.mark.parametrize("cut", [0, 6, 14])
def test_per_rank_states_resume_on_every_dp_size(cut):
    ref = reference()
    with SimulatedRanks(build, dp_size=2) as ranks:
        assert_streams_equal(ref[:cut], ranks.take(cut))
        stored = union([h.state_dict() for h in ranks.handles])
    assert sorted(stored["slots"]) == [zdcp.slot_key(s) for s in range(C)]
    for D in (1, 2, 3, 4, 6):
        handles = [bound(D, r).iterate() for r in range(D)]
        try:
            for h in handles:
                dcp_fill(h, stored)
            assert_streams_equal(ref[cut:], global_stream(handles, N - cut))
        finally:
            for h in handles:
                h.close()


@pytest.mark.slow  # DataLoader workers
def test_loader_state_dict_is_local_cheap_and_after_the_batches_handed_out():
    ref = reference()
    pipe = bound(3, 1)
    loader = pipe.dataloader(num_workers=2)
    try:
        fresh = loader.state_dict()
        # the load template of a fresh loader: this rank's slots, no worker started
        assert sorted(fresh["slots"]) == [zdcp.slot_key(s) for s in (1, 4, 7, 10)]
        assert not loader._live
        assert all(isinstance(v, bytes) for v in fresh["slots"].values())
        it = iter(loader)
        got = [next(it) for _ in range(3)]
        assert_streams_equal(ref[1:9:3], got)
        a, b = loader.state_dict(), loader.state_dict()
        assert a == b and a is not b and a["slots"] is not b["slots"]  # built afresh
        a["slots"].clear()  # editing a handed-out state changes nothing else
        assert loader.state_dict() == b
    finally:
        loader.close()
    # rank 1 of 3 at global position 9 continues with its lanes, in an iterator and in a
    # loader with workers (loaded before its first pass)
    again = bound(3, 1).iterate()
    try:
        again.load_state_dict(b)
        assert_streams_equal(ref[10:20:3], [next(again) for _ in range(4)])
    finally:
        again.close()
    loader = bound(3, 1).dataloader(num_workers=2)
    try:
        loader.load_state_dict(b)
        it = iter(loader)
        assert_streams_equal(ref[10:20:3], [next(it) for _ in range(4)])
        with pytest.raises(LifecycleError, match="before the first output"):
            loader.load_state_dict(b)
    finally:
        loader.close()


def test_restore_and_pipeline_load_state_dict_take_the_per_rank_shape():
    ref = reference()
    with SimulatedRanks(build, dp_size=1) as ranks:
        ranks.take(5)
        state = ranks.handles[0].state_dict()
    with build().iterate(restore=state) as it:
        assert_streams_equal(ref[5:10], [next(it) for _ in range(5)])
    pipe = build()
    pipe.load_state_dict(state)
    assert_streams_equal(ref[5:8], take(pipe, 3))
    pipe.close()


def test_a_merged_state_loads_into_a_handle():
    ref = reference()
    with SimulatedRanks(build, dp_size=2) as ranks:
        ranks.take(6)
        merged = ranks.checkpoint()
    handles = [bound(3, r).iterate() for r in range(3)]
    try:
        for h in handles:
            h.load_state_dict(merged)
        assert_streams_equal(ref[6:18], global_stream(handles, 12))
    finally:
        for h in handles:
            h.close()


def test_a_state_missing_an_owned_lane_names_what_it_holds_and_the_fix():
    with SimulatedRanks(build, dp_size=2) as ranks:
        ranks.take(4)
        only_rank0 = ranks.handles[0].state_dict()  # slots 0, 2, 4, ...
    with bound(3, 1).iterate() as it:  # owns slots 1, 4, 7, 10
        with pytest.raises(MissingLanes) as e:
            it.load_state_dict(only_rank0)
    msg = str(e.value)
    assert "[1, 7]" in msg and "slots [0, 2, 4, 6, 8, 10]" in msg
    assert "checkpoint()" in msg and "dcp.save" in msg
    # rank 0 of 2 has everything it owns: a partial state is enough for it
    with bound(2, 0).iterate() as it:
        it.load_state_dict(only_rank0)


def test_wrong_canonical_replicas_and_another_pipeline_are_refused():
    with SimulatedRanks(build, dp_size=1) as ranks:
        ranks.take(3)
        state = ranks.handles[0].state_dict()
    with build(lanes=6).iterate() as it:
        with pytest.raises(IncompatibleCheckpoint, match="canonical_replicas=12"):
            it.load_state_dict(state)
    other = reference_pipeline(lanes=C, seq_len=64)
    with other.iterate() as it:
        with pytest.raises(IncompatibleCheckpoint, match="differently configured"):
            it.load_state_dict(state)


def test_a_slot_holding_another_lane_is_refused():
    with SimulatedRanks(build, dp_size=1) as ranks:
        ranks.take(3)
        state = ranks.handles[0].state_dict()
    slots = state["slots"]
    slots["00000"], slots["00001"] = slots["00001"], slots["00000"]
    with build().iterate() as it:
        with pytest.raises(CorruptCheckpoint, match="slot 00000 holds lane 4"):
            it.load_state_dict(state)


def test_load_state_dict_after_the_first_output_is_refused():
    with build().iterate() as it:
        state = it.state_dict()
        next(it)
        with pytest.raises(LifecycleError, match="before the first output"):
            it.load_state_dict(state)


def test_dcp_files_on_one_process_and_the_pre_load_check(tmp_path):
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    ref = reference()
    with build().iterate() as it:
        [next(it) for _ in range(5)]
        dcp.save({"data": it}, checkpoint_id=str(tmp_path / "ok"))
    fresh = build().iterate()
    zdcp.check(tmp_path / "ok", fresh)
    dcp.load({"data": fresh}, checkpoint_id=str(tmp_path / "ok"))
    assert_streams_equal(ref[5:10], [next(fresh) for _ in range(5)])
    fresh.close()

    # other C / another pipeline / missing slots: typed errors from .metadata alone
    with build(lanes=6).iterate() as h:
        with pytest.raises(IncompatibleCheckpoint, match="canonical_replicas"):
            zdcp.check(tmp_path / "ok", h)
    with reference_pipeline(lanes=C, seq_len=64).iterate() as h:
        with pytest.raises(IncompatibleCheckpoint, match="differently configured"):
            zdcp.check(tmp_path / "ok", h)
    with build().iterate() as h:
        with pytest.raises(IncompatibleCheckpoint, match="no Zephon per-rank state under 'x'"):
            zdcp.check(tmp_path / "ok", h, key="x")
        part = h.state_dict()
        del part["slots"]["00003"]
        dcp.save({"data": part}, checkpoint_id=str(tmp_path / "part"))
        with pytest.raises(MissingLanes, match=r"slot\(s\) \[3\] = lanes \[3\]"):
            zdcp.check(tmp_path / "part", h)
        # dcp.load itself raises CheckpointException (a BaseException); translated:
        with pytest.raises(MissingLanes, match=r"slot\(s\) \[3\]"):
            with zdcp.translated(h, checkpoint_id=tmp_path / "part"):
                dcp.load({"data": h}, checkpoint_id=str(tmp_path / "part"))


def test_a_pipeline_holding_one_ranks_share_does_not_pass_it_off_as_every_lane():
    from zephon_core.errors import ConfigError

    with SimulatedRanks(build, dp_size=2) as ranks:
        ranks.take(4)
        share = ranks.handles[1].state_dict()
    pipe = bound(2, 1)
    pipe.load_state_dict(share)  # what this rank resumes from: fine
    with pytest.raises(ConfigError, match="one rank's share"):
        pipe.checkpoint()  # but not a merged state of every lane
