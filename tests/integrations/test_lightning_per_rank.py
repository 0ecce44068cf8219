"""``ZephonDataModule(state_layout="per_rank")`` on 2 DDP ranks (ddp_spawn, gloo, CPU).

Every rank writes its own lanes and RNG beside the ``.ckpt``; rank 0's ``.ckpt`` holds a
small manifest and no lane state, no RNG list. A resume on 2 ranks continues every
rank's batches and dropout-affected losses exactly; a resume on 1 process continues the
global batch stream exactly (reading both files) and says that the RNG cannot follow.
"""

from __future__ import annotations

import logging
import os
import pickle
import shutil

import pytest
import torch
from lightning_helpers import LANES, fit, global_stream, read_rank_records, step_checkpoint

from zephon_core import ConfigError, MissingLanes
from zephon_core.cli.checkpoints import read_state
from zephon_core.distributed import rank_files
from zephon_integrations.lightning import ZephonDataModule

# starts ddp_spawn children (see tests/conftest.py)
pytestmark = pytest.mark.slow

STEPS, K, ACC = 6, 2, 2  # ModelCheckpoint(every_n_train_steps=K) is the resume point
CFG = dict(accumulate=ACC, dropout=0.5, every_n_train_steps=K)
PER_RANK = dict(dm_kwargs={"state_layout": "per_rank"})


def _ddp(tmp, name, **kw):
    record_dir = tmp / name
    record_dir.mkdir()
    ckpt_dir = tmp / f"{name}_ckpt"
    fit(
        max_steps=STEPS,
        ckpt_dir=str(ckpt_dir),
        devices=2,
        strategy="ddp_spawn",
        record_dir=str(record_dir),
        **CFG,
        **kw,
    )
    return record_dir, str(ckpt_dir)


@pytest.fixture(scope="module")
def per_rank_run(tmp_path_factory):
    """One uninterrupted 2-rank per_rank run: (record dir, checkpoint dir, base tmp dir)."""
    tmp = tmp_path_factory.mktemp("per_rank")
    record_dir, ckpt_dir = _ddp(tmp, "full", **PER_RANK)
    return record_dir, ckpt_dir, tmp


def test_rank0_checkpoint_holds_a_manifest_and_every_rank_its_own_file(per_rank_run):
    _, ckpt_dir, _ = per_rank_run
    path = step_checkpoint(ckpt_dir, K)
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    entry = ckpt["zephon"]
    assert set(entry) == {"per_rank"}, "no lane states and no RNG list in rank 0's .ckpt"
    manifest = entry["per_rank"]
    assert manifest["format"] == "zephon.per_rank_manifest"
    assert manifest["canonical_replicas"] == LANES
    assert manifest["position"] == 2 * K * ACC  # global batches both ranks consumed
    assert (manifest["dp_size"], manifest["world_size"]) == (2, 2)
    assert manifest["files"] == os.path.basename(path) + ".zephon"
    assert len(pickle.dumps(entry)) < 1000  # whatever C and the number of ranks
    files = sorted(os.listdir(path + ".zephon"))
    assert files == [rank_files.file_name(0, 0), rank_files.file_name(1, 1)]
    # `zephon inspect` reads the rank files and shows the merged state
    state, _, kind = read_state(path)
    assert kind == "Lightning checkpoint (per rank)"
    assert state["position"] == 2 * K * ACC and len(state["lanes"]) == LANES


def test_resume_on_two_ranks_repeats_batches_and_dropout(per_rank_run):
    record_dir, ckpt_dir, tmp = per_rank_run
    full = [read_rank_records(str(record_dir), r) for r in (0, 1)]
    resumed_dir, _ = _ddp(tmp, "resumed", ckpt_path=step_checkpoint(ckpt_dir, K), **PER_RANK)
    for r in (0, 1):
        got = read_rank_records(str(resumed_dir), r)
        assert [(s, fp) for s, _, fp, _ in got] == [(s, fp) for s, _, fp, _ in full[r] if s >= K]
        # each rank's own RNG came back from its own file: the same dropout draws
        assert [x for _, _, _, x in got] == [x for s, _, _, x in full[r] if s >= K], r


def test_resume_on_one_process_continues_the_global_stream(per_rank_run, tmp_path, caplog):
    _, ckpt_dir, _ = per_rank_run
    caplog.set_level(logging.WARNING, logger="zephon_integrations")
    model, _, _ = fit(
        max_steps=STEPS,
        ckpt_dir=str(tmp_path / "one"),
        ckpt_path=step_checkpoint(ckpt_dir, K),
        **CFG,
        **PER_RANK,
    )
    start, n = 2 * K * ACC, (STEPS - K) * ACC
    assert [fp for _, fp in model.seen] == global_stream(start + n)[start:]
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "RNG states of 2 ranks and this run has 1" in warning
    assert "the data stream continues exactly" in warning
    # one process: "per_rank" writes the merged state (one portable file)
    ckpt = torch.load(step_checkpoint(str(tmp_path / "one"), 2 * K), weights_only=False)
    assert set(ckpt["zephon"]) == {"state", "rng"}


def test_a_missing_rank_file_is_refused_with_the_fix(per_rank_run, tmp_path):
    _, ckpt_dir, _ = per_rank_run
    path = step_checkpoint(ckpt_dir, K)
    copied = tmp_path / os.path.basename(path)
    shutil.copy(path, copied)
    shutil.copytree(path + ".zephon", str(copied) + ".zephon")
    os.remove(os.path.join(str(copied) + ".zephon", rank_files.file_name(1, 1)))
    with pytest.raises(MissingLanes, match="rank.s. .1. of the 2.*filesystem every node sees"):
        fit(max_steps=STEPS, ckpt_dir=str(tmp_path / "one"), ckpt_path=str(copied), **CFG)


def test_state_layout_is_checked_at_construction():
    with pytest.raises(ConfigError, match=r"\['merged', 'per_rank'\]"):
        ZephonDataModule(pipeline=lambda: None, state_layout="sharded")
