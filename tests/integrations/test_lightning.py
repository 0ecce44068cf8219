"""ZephonDataModule under Lightning: exact resume through ``ckpt_path`` (docs/design.md §9).

Every run records, in ``training_step``, a fingerprint of each batch it trains on. A
run resumed from a checkpoint (fresh Trainer, fresh model, fresh ZephonDataModule)
must see exactly the batches the uninterrupted run saw after that checkpoint, and the
uninterrupted run must see the single-process global stream of the pipeline.
"""

from __future__ import annotations

import csv
import glob
import os

import pytest
import torch
from lightning.pytorch.loggers import CSVLogger
from lightning_helpers import (
    LANES,
    fit,
    global_stream,
    make_pipeline,
    make_remixed_pipeline,
    read_rank_records,
    step_checkpoint,
)

from zephon_core import ConfigError, IncompatibleCheckpoint, MissingCheckpointState
from zephon_integrations.lightning import ZephonDataModule

# trains models in this process for many seconds per test: `make test-fast` leaves
# them to `make test`
pytestmark = pytest.mark.slow

DM_KEY = "ZephonDataModule"
MAX_STEPS = 12
K = 5  # ModelCheckpoint(every_n_train_steps=5): the resume point


def _fps(model) -> list[str]:
    return [fp for _, fp in model.seen]


def _zephon_state(ckpt_path: str) -> tuple[dict, dict]:
    """(the whole Lightning checkpoint, the Zephon pipeline state in it)."""
    ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=False)
    assert "zephon" in ckpt, f"no zephon entry in the checkpoint: {sorted(ckpt)}"
    assert DM_KEY not in ckpt, "the state is kept once, under the fixed key"
    entry = ckpt["zephon"]
    assert isinstance(entry, dict) and {"state", "rng"} <= set(entry), entry
    return ckpt, entry["state"]


def _lane_ids(state: dict) -> list[int]:
    return sorted(lane["lane"] for lane in state["lanes"])


# -- single process ---------------------------------------------------------------------


@pytest.mark.parametrize("val_every", [None, 3], ids=["noval", "val3"])
@pytest.mark.parametrize("accumulate", [1, 2], ids=["acc1", "acc2"])
@pytest.mark.parametrize(
    "num_workers", [0, pytest.param(2, marks=pytest.mark.slow)], ids=["w0", "w2"]
)
def test_resume_from_step_checkpoint_continues_exactly(
    tmp_path, num_workers, accumulate, val_every
):
    """fit -> checkpoint at step K -> new Trainer + DataModule + ckpt_path: same batches.

    K=5 optimizer steps is an accumulation boundary (K*accumulate batches); with
    val_check_interval=3 batches it falls between two validation runs (batch 5 or 10).
    """
    per_step = accumulate
    full, _, _ = fit(
        max_steps=MAX_STEPS,
        ckpt_dir=str(tmp_path / "a"),
        num_workers=num_workers,
        accumulate=accumulate,
        val_check_interval=val_every,
    )
    full_fps = _fps(full)
    assert len(full_fps) == MAX_STEPS * per_step
    # the uninterrupted run trains on the pipeline's global stream, nothing skipped
    assert full_fps == global_stream(len(full_fps))
    assert [s for s, _ in full.seen] == [i // per_step for i in range(len(full_fps))]

    ckpt = step_checkpoint(str(tmp_path / "a"), K)
    raw, state = _zephon_state(ckpt)
    assert raw["global_step"] == K
    consumed = K * per_step
    assert state["position"] == consumed
    assert _lane_ids(state) == list(range(LANES))
    if val_every is not None:
        assert consumed % val_every != 0  # really in the middle of a validation interval
        assert full.val_batches > 0

    tail, _, _ = fit(
        max_steps=MAX_STEPS,
        ckpt_dir=str(tmp_path / "b"),
        ckpt_path=ckpt,
        num_workers=num_workers,
        accumulate=accumulate,
        val_check_interval=val_every,
    )
    assert [s for s, _ in tail.seen][0] == K
    assert _fps(tail) == full_fps[consumed:]
    if val_every is not None:
        assert tail.val_batches > 0


@pytest.mark.parametrize(
    "num_workers,accumulate",
    [(0, 1), pytest.param(2, 2, marks=pytest.mark.slow)],
    ids=["w0-acc1", "w2-acc2"],
)
def test_resume_from_last_continues_exactly(tmp_path, num_workers, accumulate):
    """A run that stopped at max_steps=7 (a "crash" after step 7) resumed with
    ckpt_path="last": it continues from last.ckpt's step (K=5) with the batches the
    uninterrupted run trained on from there."""
    full, _, _ = fit(
        max_steps=MAX_STEPS,
        ckpt_dir=str(tmp_path / "full"),
        num_workers=num_workers,
        accumulate=accumulate,
    )
    full_fps = _fps(full)

    stop = 7
    d = str(tmp_path / "run")
    first, _, _ = fit(max_steps=stop, ckpt_dir=d, num_workers=num_workers, accumulate=accumulate)
    assert _fps(first) == full_fps[: stop * accumulate]
    raw, state = _zephon_state(os.path.join(d, "last.ckpt"))
    assert raw["global_step"] == K
    assert state["position"] == K * accumulate

    second, _, _ = fit(
        max_steps=MAX_STEPS,
        ckpt_dir=d,
        ckpt_path="last",
        num_workers=num_workers,
        accumulate=accumulate,
    )
    assert [s for s, _ in second.seen][0] == K
    assert _fps(second) == full_fps[K * accumulate :]


@pytest.mark.slow
def test_resume_of_a_resumed_run_continues_exactly(tmp_path):
    """Checkpoints written by a resumed run resume exactly too (W=2, accumulation 2,
    validation every 3 batches)."""
    kw = dict(num_workers=2, accumulate=2, val_check_interval=3)
    full, _, _ = fit(max_steps=16, ckpt_dir=str(tmp_path / "a"), every_n_train_steps=4, **kw)
    full_fps = _fps(full)
    assert full_fps == global_stream(32)
    second, _, _ = fit(
        max_steps=16,
        ckpt_dir=str(tmp_path / "b"),
        every_n_train_steps=3,
        ckpt_path=step_checkpoint(str(tmp_path / "a"), 4),
        **kw,
    )
    assert _fps(second) == full_fps[8:]
    _, state = _zephon_state(step_checkpoint(str(tmp_path / "b"), 9))
    assert state["position"] == 18
    third, _, _ = fit(
        max_steps=16,
        ckpt_dir=str(tmp_path / "c"),
        every_n_train_steps=4,
        ckpt_path=step_checkpoint(str(tmp_path / "b"), 9),
        **kw,
    )
    assert _fps(third) == full_fps[18:]


@pytest.mark.parametrize(
    "num_workers,accumulate",
    [(0, 1), pytest.param(2, 2, marks=pytest.mark.slow)],
    ids=["w0-acc1", "w2-acc2"],
)
def test_resume_from_checkpoints_written_at_validation_end(tmp_path, num_workers, accumulate):
    """A default ModelCheckpoint saves when the mid-epoch validation (every 3 batches)
    ends; with accumulation 2 the first such save (global_step 1 after 3 batches) is
    inside an accumulation window. It records the window's start (batch 2) and Lightning's
    counters there, so the resume redoes batch 3: batches, steps and dropout losses as in
    the uninterrupted run."""
    kw = dict(
        num_workers=num_workers,
        accumulate=accumulate,
        val_check_interval=3,
        every_n_train_steps=None,
        dropout=0.5,
    )
    full, _, _ = fit(max_steps=8, ckpt_dir=str(tmp_path / "a"), seed=1, **kw)
    assert _fps(full) == global_stream(8 * accumulate)
    ckpts = sorted(
        glob.glob(str(tmp_path / "a" / "*step=*.ckpt")),
        key=lambda p: int(p.rsplit("step=", 1)[1].split(".")[0]),
    )
    assert len(ckpts) >= 2, ckpts
    inside = 0
    for ckpt in ckpts[:2]:
        raw, state = _zephon_state(ckpt)
        start = raw["global_step"] * accumulate  # the last optimizer step's boundary
        assert state["position"] == start > 0
        inside += start % 3 != 0  # validation ran after a later batch of the window
        tail, _, _ = fit(
            max_steps=8, ckpt_dir=str(tmp_path / f"r{start}"), ckpt_path=ckpt, seed=2, **kw
        )
        assert tail.seen == full.seen[start:], os.path.basename(ckpt)
        assert tail.losses == full.losses[start:], os.path.basename(ckpt)
    assert inside == (accumulate == 2)


def test_resume_when_configure_optimizers_reads_estimated_stepping_batches(tmp_path):
    """``trainer.estimated_stepping_batches`` read in configure_optimizers with a finite
    max_epochs makes Lightning build the train loader during strategy setup, before it
    restores its loops (docs/design.md §9 names this case; Lightning's own loader-state restore is
    then not what resumes the stream): the resumed stream must still be exact."""
    kw = dict(read_stepping_batches=True, trainer_kwargs={"max_epochs": 1})
    full, _, _ = fit(max_steps=MAX_STEPS, ckpt_dir=str(tmp_path / "a"), **kw)
    full_fps = _fps(full)
    assert full_fps == global_stream(MAX_STEPS)
    ckpt = step_checkpoint(str(tmp_path / "a"), K)
    tail, _, _ = fit(max_steps=MAX_STEPS, ckpt_dir=str(tmp_path / "b"), ckpt_path=ckpt, **kw)
    assert [s for s, _ in tail.seen][0] == K
    assert _fps(tail) == full_fps[K:]


def test_state_dict_is_never_empty(tmp_path):
    # before anything was built: still a full state (position 0, every lane)
    dm = ZephonDataModule(pipeline=make_pipeline)
    sd = dm.state_dict()
    assert sd and "zephon" in sd
    assert sd["zephon"]["position"] == 0
    assert _lane_ids(sd["zephon"]) == list(range(LANES))

    # after a fit (pipeline closed by teardown): the state after the consumed batches
    _, _, used = fit(max_steps=3, ckpt_dir=str(tmp_path / "a"), every_n_train_steps=3)
    after = used.state_dict()
    assert after and after["zephon"]["position"] == 3
    _, state = _zephon_state(step_checkpoint(str(tmp_path / "a"), 3))
    assert state["position"] == 3

    # a loaded-but-not-yet-built state is returned as is
    fresh = ZephonDataModule(pipeline=make_pipeline)
    fresh.load_state_dict({"zephon": state})
    again = fresh.state_dict()
    assert again and again["zephon"]["position"] == 3

    # a Pipeline instance (not a factory) works too, and its state is not empty
    dm2 = ZephonDataModule(pipeline=make_pipeline())
    assert dm2.state_dict()["zephon"]["position"] == 0


def test_loading_a_state_without_the_zephon_entry_raises(tmp_path):
    dm = ZephonDataModule(pipeline=make_pipeline)
    with pytest.raises(ConfigError):
        dm.load_state_dict({})
    with pytest.raises(ConfigError):
        dm.load_state_dict({"something_else": {"position": 3}})

    # through Lightning: a checkpoint whose datamodule entry (the earlier layout, keyed by
    # the class name) lacks "zephon"
    fit(max_steps=3, ckpt_dir=str(tmp_path / "a"), every_n_train_steps=3)
    ckpt_file = step_checkpoint(str(tmp_path / "a"), 3)
    ckpt = torch.load(ckpt_file, map_location="cpu", weights_only=False)
    del ckpt["zephon"]
    ckpt[DM_KEY] = {"not_zephon": 1}
    bad = str(tmp_path / "bad.ckpt")
    torch.save(ckpt, bad)
    with pytest.raises(ConfigError):
        fit(max_steps=6, ckpt_dir=str(tmp_path / "b"), ckpt_path=bad)


def test_data_metrics_reach_the_logger(tmp_path):
    logger = CSVLogger(save_dir=str(tmp_path), name="m", version=0)
    fit(
        max_steps=8,
        ckpt_dir=str(tmp_path / "ck"),
        logger=logger,
        dm_kwargs={"log_every_n_steps": 2},
        trainer_kwargs={"log_every_n_steps": 2},
    )
    path = os.path.join(logger.log_dir, "metrics.csv")
    assert os.path.exists(path), os.listdir(logger.log_dir)
    with open(path) as fh:
        rows = list(csv.DictReader(fh))
    wanted = [
        "zephon/records_per_s",
        "zephon/tokens_per_s",
        "zephon/padding_ratio",
        "zephon/token_share/prose",
        "zephon/document_share/prose",
        "zephon/document_share_target/prose",
        "zephon/epochs/code",
        "zephon/inflight_chunks",
    ]
    values = {k: [float(r[k]) for r in rows if r.get(k) not in (None, "")] for k in wanted}
    missing = [k for k, v in values.items() if not v]
    assert not missing, f"not logged: {missing}; columns: {list(rows[0]) if rows else []}"
    assert len(values["zephon/records_per_s"]) >= 2  # logged every 2 batches over 8
    assert all(v > 0 for v in values["zephon/records_per_s"])
    assert all(v > 0 for v in values["zephon/tokens_per_s"])
    assert all(0 <= v < 1 for v in values["zephon/padding_ratio"])
    assert all(0 < v < 1 for v in values["zephon/token_share/prose"])
    assert all(0 < v < 1 for v in values["zephon/document_share/prose"])
    # document weights: the target is a document share, and no token target is claimed
    assert all(v == pytest.approx(0.7) for v in values["zephon/document_share_target/prose"])
    assert "zephon/token_share_target/prose" not in rows[0]
    assert all(v > 0 for v in values["zephon/epochs/code"])
    assert all(v >= 0 for v in values["zephon/inflight_chunks"])


# -- DDP (ddp_spawn, 2 CPU processes, gloo) -----------------------------------------------

DDP_STEPS = 8
DDP_K = 3  # ModelCheckpoint(every_n_train_steps=3)
# 2 lanes per rank served by 2 workers each, accumulation, validation every 3 batches
DDP_CFG = dict(num_workers=2, accumulate=2, val_check_interval=3, dropout=0.5)
ACC = DDP_CFG["accumulate"]
PER_RANK = DDP_STEPS * ACC  # batches each rank trains on


def _ddp_fit(tmp, name, **kw):
    record_dir = tmp / name
    record_dir.mkdir()
    fit(
        max_steps=DDP_STEPS,
        ckpt_dir=str(tmp / f"{name}_ckpt"),
        devices=2,
        strategy="ddp_spawn",
        every_n_train_steps=DDP_K,
        record_dir=str(record_dir),
        **DDP_CFG,
        **kw,
    )
    return record_dir, str(tmp / f"{name}_ckpt")


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    """One uninterrupted 2-rank run: (record dir, checkpoint dir, base tmp dir)."""
    tmp = tmp_path_factory.mktemp("ddp")
    record_dir, ckpt_dir = _ddp_fit(tmp, "full")
    return record_dir, ckpt_dir, tmp


@pytest.mark.slow
def test_ddp_ranks_read_their_own_lanes_of_the_global_stream(ddp_run):
    record_dir, _, _ = ddp_run
    ranks = [read_rank_records(str(record_dir), r) for r in (0, 1)]
    stream = global_stream(2 * PER_RANK)
    for r, recs in enumerate(ranks):
        assert [s for s, _, _, _ in recs] == [i // ACC for i in range(PER_RANK)], f"rank {r} steps"
        # rank r's i-th batch is global output 2*i + r
        assert [fp for _, _, fp, _ in recs] == [stream[2 * i + r] for i in range(PER_RANK)], r
        assert os.path.getsize(record_dir / f"val_rank{r}.txt") > 0  # validation ran
    seen = [fp for recs in ranks for _, _, fp, _ in recs]
    assert len(set(seen)) == len(seen), "a batch was seen twice across ranks"
    assert set(seen) == set(stream)


@pytest.mark.slow
def test_ddp_checkpoint_from_rank0_holds_every_lane(ddp_run):
    _, ckpt_dir, _ = ddp_run
    raw, state = _zephon_state(step_checkpoint(ckpt_dir, DDP_K))
    assert raw["global_step"] == DDP_K
    assert _lane_ids(state) == list(range(LANES))
    assert state["position"] == 2 * DDP_K * ACC  # global batches consumed by both ranks
    raw, state = _zephon_state(os.path.join(ckpt_dir, "last.ckpt"))
    assert _lane_ids(state) == list(range(LANES))
    assert state["position"] == 2 * raw["global_step"] * ACC


@pytest.mark.slow
def test_ddp_resume_on_two_devices_is_exact(ddp_run):
    record_dir, ckpt_dir, tmp = ddp_run
    full = [read_rank_records(str(record_dir), r) for r in (0, 1)]
    # this run merges lane states through a shared directory instead of the process
    # group's store (the uninterrupted run used the default, "torch://")
    agg = tmp / "agg"
    resumed_dir, resumed_ckpts = _ddp_fit(
        tmp,
        "resumed",
        ckpt_path=step_checkpoint(ckpt_dir, DDP_K),
        dm_kwargs={"aggregate_dir": str(agg)},
    )
    assert agg.is_dir()
    for r in (0, 1):
        got = read_rank_records(str(resumed_dir), r)
        assert [s for s, _, _, _ in got] == [s for s, _, _, _ in full[r] if s >= DDP_K], r
        assert [fp for _, _, fp, _ in got] == [fp for s, _, fp, _ in full[r] if s >= DDP_K], r
        # every rank's RNG was restored: dropout draws and so losses are bit-identical
        assert [x for _, _, _, x in got] == [x for s, _, _, x in full[r] if s >= DDP_K], r
    # a checkpoint taken after the resume again holds every lane at the global position
    raw, state = _zephon_state(step_checkpoint(resumed_ckpts, 2 * DDP_K))
    assert _lane_ids(state) == list(range(LANES))
    assert state["position"] == 2 * (2 * DDP_K) * ACC


@pytest.mark.slow
def test_ddp_checkpoint_resumes_on_one_device_continuing_the_global_stream(ddp_run, tmp_path):
    _, ckpt_dir, _ = ddp_run
    model, _, _ = fit(
        max_steps=DDP_STEPS,
        ckpt_dir=str(tmp_path / "one"),
        ckpt_path=step_checkpoint(ckpt_dir, DDP_K),
        every_n_train_steps=DDP_K,
        **DDP_CFG,
    )
    start = 2 * DDP_K * ACC  # global batches consumed before the checkpoint
    n = (DDP_STEPS - DDP_K) * ACC
    assert [s for s, _ in model.seen] == [DDP_K + i // ACC for i in range(n)]
    # the 1-device run's i-th batch is global output start + i
    assert _fps(model) == global_stream(start + n)[start:]


# -- exact or loud: no silent fresh start, renamed subclasses, RNG -----------------------------


class RenamedBefore(ZephonDataModule):
    pass


class RenamedAfter(ZephonDataModule):
    pass


def test_resume_from_a_checkpoint_without_zephon_state_is_refused(tmp_path):
    full, _, _ = fit(max_steps=8, ckpt_dir=str(tmp_path / "a"), every_n_train_steps=3)
    ckpt = torch.load(
        step_checkpoint(str(tmp_path / "a"), 3), map_location="cpu", weights_only=False
    )
    del ckpt["zephon"]  # as a plain Lightning checkpoint has none
    plain = str(tmp_path / "plain.ckpt")
    torch.save(ckpt, plain)
    with pytest.raises(MissingCheckpointState, match="allow_fresh_start=True"):
        fit(max_steps=8, ckpt_dir=str(tmp_path / "b"), ckpt_path=plain)
    # the explicit opt-out starts the data stream from its beginning
    fresh, _, _ = fit(
        max_steps=8,
        ckpt_dir=str(tmp_path / "c"),
        ckpt_path=plain,
        dm_kwargs={"allow_fresh_start": True},
    )
    assert _fps(fresh) == _fps(full)[:5]


def test_a_renamed_datamodule_subclass_still_finds_its_state(tmp_path):
    full, _, _ = fit(max_steps=MAX_STEPS, ckpt_dir=str(tmp_path / "a"), dm_class=RenamedBefore)
    ckpt = step_checkpoint(str(tmp_path / "a"), K)
    tail, _, _ = fit(
        max_steps=MAX_STEPS, ckpt_dir=str(tmp_path / "b"), ckpt_path=ckpt, dm_class=RenamedAfter
    )
    assert _fps(tail) == _fps(full)[K:]
    # a checkpoint of the earlier layout (the state under the old class name) too
    raw = torch.load(ckpt, map_location="cpu", weights_only=False)
    raw["RenamedBefore"] = {"zephon": raw.pop("zephon")["state"]}
    legacy = str(tmp_path / "legacy.ckpt")
    torch.save(raw, legacy)
    again, _, _ = fit(
        max_steps=MAX_STEPS, ckpt_dir=str(tmp_path / "c"), ckpt_path=legacy, dm_class=RenamedAfter
    )
    assert _fps(again) == _fps(full)[K:]


@pytest.mark.parametrize(
    "num_workers", [0, pytest.param(2, marks=pytest.mark.slow)], ids=["w0", "w2"]
)
def test_resume_with_dropout_is_bit_identical(tmp_path, num_workers):
    kw = dict(num_workers=num_workers, dropout=0.5)
    full, _, _ = fit(max_steps=MAX_STEPS, ckpt_dir=str(tmp_path / "a"), **kw)
    tail, _, _ = fit(
        max_steps=MAX_STEPS,
        ckpt_dir=str(tmp_path / "b"),
        ckpt_path=step_checkpoint(str(tmp_path / "a"), K),
        **kw,
    )
    assert _fps(tail) == _fps(full)[K:]
    assert tail.losses == full.losses[K:], "dropout drew other numbers after the resume"
    # the RNG is restored on purpose: without it the losses differ
    off, _, _ = fit(
        max_steps=MAX_STEPS,
        ckpt_dir=str(tmp_path / "c"),
        ckpt_path=step_checkpoint(str(tmp_path / "a"), K),
        dm_kwargs={"restore_rng": False},
        **kw,
    )
    assert _fps(off) == _fps(full)[K:] and off.losses != full.losses[K:]


def test_no_validation_data_means_no_validation_warning():
    # Lightning warns "you passed a val_dataloader but have no validation_step" when the
    # datamodule overrides val_dataloader; without validation data it no longer does
    from lightning.pytorch.utilities.model_helpers import is_overridden

    assert not is_overridden("val_dataloader", ZephonDataModule(pipeline=make_pipeline))
    with_val = ZephonDataModule(pipeline=make_pipeline, val_dataloader_fn=lambda: ["v"])
    assert is_overridden("val_dataloader", with_val) and with_val.val_dataloader() == ["v"]


# -- deliberate changes at resume ----------------------------------------------------------


def test_allow_changes_re_mixes_a_resumed_fit(tmp_path):
    """Saved with weights 0.7/0.3, resumed with 0.5/0.5: refused (the message names the
    datamodule's argument), accepted with ``allow_changes={"weights"}``; the re-mixed
    run's own checkpoint then resumes exactly under the new weights, without it."""
    fit(max_steps=3, ckpt_dir=str(tmp_path / "a"), every_n_train_steps=3)
    saved = step_checkpoint(str(tmp_path / "a"), 3)
    with pytest.raises(IncompatibleCheckpoint, match=r"ZephonDataModule\(\.\.\., allow_changes"):
        fit(
            max_steps=6,
            ckpt_dir=str(tmp_path / "b"),
            ckpt_path=saved,
            pipeline=make_remixed_pipeline,
        )
    kw = dict(max_steps=9, every_n_train_steps=3, pipeline=make_remixed_pipeline, dropout=0.5)
    remixed, _, dm = fit(
        ckpt_dir=str(tmp_path / "c"),
        ckpt_path=saved,
        dm_kwargs={"allow_changes": {"weights"}},
        seed=1,
        **kw,
    )
    assert dm.allow_changes == {"weights"}
    assert [s for s, _ in remixed.seen] == list(range(3, 9))
    again, _, _ = fit(
        ckpt_dir=str(tmp_path / "d"),
        ckpt_path=step_checkpoint(str(tmp_path / "c"), 6),
        seed=2,
        **kw,
    )
    assert again.seen == remixed.seen[3:]
    assert again.losses == remixed.losses[3:]
    # a typo fails when the module is built, not at the resume; one name may be a string
    with pytest.raises(ConfigError, match="unknown"):
        ZephonDataModule(pipeline=make_pipeline, allow_changes={"weight"})
    assert ZephonDataModule(pipeline=make_pipeline, allow_changes="weights").allow_changes == {
        "weights"
    }
