"""Per-rank state files beside a trainer checkpoint (``distributed/rank_files.py``), in
this process: ranks simulated (``SimulatedRanks``), each writing its own file as the
integrations' ``state_layout="per_rank"`` does. Real trainers on real processes:
``tests/integrations/test_lightning_per_rank.py`` and ``test_hf_multiprocess.py``.
"""

from __future__ import annotations

import os
import shutil

import pytest
from helpers import reference_pipeline

from zephon_core.checkpoint.state import PipelineState
from zephon_core.distributed import rank_files
from zephon_core.distributed.topology import Topology
from zephon_core.errors import (
    ConfigError,
    CorruptCheckpoint,
    IncompatibleCheckpoint,
    MissingLanes,
)
from zephon_core.testing import SimulatedRanks, assert_streams_equal, take

C, D, DONE, MORE = 8, 2, 10, 12


def build():
    return reference_pipeline(lanes=C)


def topo(r: int, d: int) -> Topology:
    return Topology(r, d, r, d) if d > 1 else Topology()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """2 ranks after DONE global outputs, each rank's file written: (dir, manifest, the
    ranks' per-rank states, the MORE outputs that follow, the merged state)."""
    directory = str(tmp_path_factory.mktemp("ranks") / "step.ckpt.zephon")
    with SimulatedRanks(build, dp_size=D) as ranks:
        ranks.take(DONE)
        states = [h.state_dict() for h in ranks.handles]
        for r, state in enumerate(states):
            rank_files.write_rank_file(
                directory, save_id="s1", topology=topo(r, D), state=state, extra={"r": r}
            )
        manifest = rank_files.manifest(
            save_id="s1", state=states[0], topology=topo(0, D), files="step.ckpt.zephon"
        )
        merged = ranks.checkpoint()
        after = ranks.take(MORE)
    return directory, manifest, states, after, merged


def copy(saved, tmp_path) -> str:
    directory = str(tmp_path / "step.ckpt.zephon")
    shutil.copytree(saved[0], directory)
    return directory


def test_the_manifest_is_small_and_holds_no_lanes(saved):
    _, manifest, _, _, _ = saved
    assert manifest["canonical_replicas"] == C and manifest["position"] == DONE
    assert (manifest["dp_size"], manifest["world_size"]) == (D, D)
    assert "slots" not in manifest and "lanes" not in manifest


def test_same_ranks_read_their_own_file_and_extras(saved):
    directory, manifest, states, _, _ = saved
    for r in range(D):
        share = rank_files.read_share(manifest, directory, topo(r, D))
        assert share.state == states[r] and share.extra == {"r": r} and share.same_ranks


def test_one_rank_reads_every_file_and_continues_the_global_stream(saved):
    directory, manifest, _, after, _ = saved
    share = rank_files.read_share(manifest, directory, topo(0, 1))
    assert sorted(share.state["slots"]) == [f"{s:05d}" for s in range(C)]
    assert share.extra is None  # another number of ranks: no per-rank extras (RNG)
    pipe = build()
    with pipe.iterate(restore=share.state) as it:
        assert_streams_equal(take(it, MORE), after)


def test_four_ranks_read_only_the_slots_they_own(saved):
    directory, manifest, _, after, _ = saved
    shares = [rank_files.read_share(manifest, directory, topo(r, 4)) for r in range(4)]
    for r, share in enumerate(shares):
        assert sorted(share.state["slots"]) == [f"{s:05d}" for s in range(r, C, 4)]
    handles = [build().bind(rank=r, world_size=4).iterate(restore=s.state) for r, s in
               enumerate(shares)]  # fmt: skip
    try:
        got = [next(handles[i % 4]) for i in range(MORE)]  # step by step, rank order
    finally:
        for h in handles:
            h.close()
    assert_streams_equal(got, after)


def test_a_missing_file_is_missing_lanes_on_every_rank(saved, tmp_path):
    directory = copy(saved, tmp_path)
    os.remove(os.path.join(directory, rank_files.file_name(1, 1)))
    for t in (topo(0, D), topo(1, D), topo(0, 1)):  # also a rank that needs no slot of it
        with pytest.raises(MissingLanes) as e:
            rank_files.read_share(saved[1], directory, t)
        text = str(e.value)
        assert rank_files.file_name(1, 1) in text and "rank(s) [1]" in text
        assert "earlier checkpoint" in text and "filesystem every node sees" in text


def test_a_file_of_another_save_is_refused(saved, tmp_path):
    directory = copy(saved, tmp_path)
    other = rank_files.read_share(saved[1], saved[0], topo(1, D)).state
    rank_files.write_rank_file(directory, save_id="s2", topology=topo(1, D), state=other)
    for t in (topo(1, D), topo(0, 1)):
        with pytest.raises(IncompatibleCheckpoint, match="belongs to another save.*'s2'"):
            rank_files.read_share(saved[1], directory, t)
    # the rank whose file is intact reads it
    assert rank_files.read_share(saved[1], directory, topo(0, D)).state == saved[2][0]


def test_a_corrupted_file_is_corrupt_checkpoint(saved, tmp_path):
    directory = copy(saved, tmp_path)
    path = os.path.join(directory, rank_files.file_name(0, 0))
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    with pytest.raises(CorruptCheckpoint, match="zephon_rank00000_dp00000"):
        rank_files.read_share(saved[1], directory, topo(0, D))


def test_files_are_found_next_to_a_moved_checkpoint_else_where_they_were(saved, tmp_path):
    directory, manifest, _, _, _ = saved
    moved = copy(saved, tmp_path)
    assert rank_files.locate(manifest, str(tmp_path)) == moved
    assert rank_files.locate(dict(manifest, files_abs=directory), "/nowhere") == directory
    with pytest.raises(MissingLanes, match="filesystem every node sees"):
        rank_files.locate(manifest, "/nowhere")


def test_the_files_merge_into_the_portable_state(saved):
    directory, manifest, _, _, merged = saved
    got = rank_files.merged_state(manifest, os.path.dirname(directory))
    assert PipelineState.from_dict(got).to_dict() == PipelineState.from_dict(merged).to_dict()


def test_a_layout_name_is_checked():
    assert rank_files.check_layout("per_rank", "X") == "per_rank"
    with pytest.raises(ConfigError, match=r"X\(state_layout='rank'\).*\['merged', 'per_rank'\]"):
        rank_files.check_layout("rank", "X")


def test_without_torch_distributed_agree_raises_this_ranks_error():
    rank_files.agree(None)
    with pytest.raises(MissingLanes):
        rank_files.agree(MissingLanes("x"))


def test_files_of_deleted_checkpoints_are_pruned_and_nothing_else(saved, tmp_path):
    for name in ("kept.ckpt", "deleted.ckpt", "current.ckpt"):
        shutil.copytree(saved[0], tmp_path / f"{name}.zephon")
    (tmp_path / "kept.ckpt").write_bytes(b"")
    (tmp_path / "user.zephon").mkdir()  # not a checkpoint's files: left alone
    (tmp_path / "user.zephon" / "notes.txt").write_text("mine")
    gone = rank_files.prune_orphans(str(tmp_path), str(tmp_path / "current.ckpt.zephon"))
    assert gone == [str(tmp_path / "deleted.ckpt.zephon")]
    assert sorted(os.listdir(tmp_path)) == [
        "current.ckpt.zephon", "kept.ckpt", "kept.ckpt.zephon", "user.zephon"
    ]  # fmt: skip
