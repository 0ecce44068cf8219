"""Two ranks over gloo under torchrun: ZephonCallback (accelerate dispatching or
sharding) and ZephonTrainer (per-rank lanes).

Every rank sees exactly the global Zephon positions it is owed (rank ``r`` of ``P``
takes global batch ``P*i + r``, or its slice of batch ``i`` with ``split_batches``), no
batch is seen twice across ranks, a resume at step 6 continues every rank's stream
and loss exactly, and the 2-process checkpoint resumes on one process at the same
global position (the data exactly; a WARNING says the per-rank RNG cannot follow).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import hang_guard_s, worker_env
from hf_helpers import (
    ENDING_STEPS,
    ending_pipeline,
    hf_train,
    make_pipeline,
    reference,
    reference_rows,
    tiny_model,
    zephon_warnings,
)
from transformers import Trainer, TrainingArguments

from zephon_core import Pipeline
from zephon_core.checkpoint import codec
from zephon_core.distributed.rank_files import file_name
from zephon_integrations.hf import ZephonCallback, ZephonTrainer
from zephon_integrations.hf.checkpoint_dir import STATE_FILE

# every test here starts processes (see tests/conftest.py)
pytestmark = pytest.mark.slow

logging.getLogger("transformers").setLevel(logging.ERROR)

WORKER = Path(__file__).with_name("hf_dist_worker.py")
RANKS = 2
STEPS, CRASH = 8, 6
LAUNCH_TIMEOUT_S = hang_guard_s(600)  # a hang guard; the ranks print their stacks before


def torchrun(
    tmp: Path, name: str, out: str, steps: int, opts: dict
) -> subprocess.CompletedProcess | None:
    """Run the worker on ``RANKS`` processes (None: it hung and was killed)."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={RANKS}",
        str(WORKER),
        "--out",
        str(tmp / out),
        "--record",
        str(tmp / name),
        "--max-steps",
        str(steps),
    ]
    for k, v in opts.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    env = worker_env(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    with subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        try:
            out, err = proc.communicate(timeout=LAUNCH_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            _kill_tree(proc.pid)  # the ranks too: they hold the pipes open
            proc.communicate()
            return None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and its descendants (torchrun starts ranks in sessions of their own,
    so killing its process group would leave them running)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            children = [int(c) for c in f.read().split()]
    except OSError:
        children = []
    for child in children:
        _kill_tree(child)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def launch(tmp: Path, name: str, out: str, *, steps: int = STEPS, **opts) -> list[dict]:
    """Run the worker on ``RANKS`` processes; returns each rank's record."""
    proc = torchrun(tmp, name, out, steps, opts)
    if proc is None or proc.returncode != 0:
        failure = "timed out" if proc is None else f"exit {proc.returncode}: {proc.stderr[-3000:]}"
        stacks = "\n".join(p.read_text() for p in sorted(tmp.glob(f"{name}.rank*.stacks")))
        raise AssertionError(f"torchrun {name} failed, {failure}\n{stacks}")
    records = [json.loads((tmp / f"{name}.rank{r}.json").read_text()) for r in range(RANKS)]
    assert [r["world"] for r in records] == [RANKS] * RANKS
    return records


CASES = {
    # default accelerate: rank 0 reads the global stream and dispatches
    "callback-dispatch": dict(path="callback", dispatch=1, gas=1),
    # dispatch_batches=False: IterableDatasetShard; each rank reads its own lanes
    "callback-shard": dict(path="callback", dispatch=0, gas=2, workers=2),
    # split_batches: one global batch per micro-step, each rank takes half of its rows
    "callback-dispatch-split": dict(path="callback", dispatch=1, split=1, gas=1),
    "callback-shard-split": dict(path="callback", dispatch=0, split=1, gas=1),
    # the per-rank Trainer subclass
    "trainer": dict(path="trainer", gas=2),
}


def expected(case: dict, micro_steps: int) -> list[list[str]]:
    """What each rank owes to see in its first ``micro_steps`` micro-steps."""
    if case.get("split"):
        half = 4 // RANKS
        return [reference_rows(micro_steps, slice(r * half, (r + 1) * half)) for r in range(RANKS)]
    ref = reference(micro_steps * RANKS)
    return [ref[r::RANKS] for r in range(RANKS)]


@pytest.mark.parametrize("name", list(CASES))
def test_two_ranks_resume_exactly(tmp_path, name):
    case = CASES[name]
    gas = case["gas"]
    full = launch(tmp_path, "full", "a", **case)
    owed = expected(case, STEPS * gas)
    for rank, rec in enumerate(full):
        assert rec["seen"] == owed[rank], f"rank {rank} did not get its global positions"
    if not case.get("split"):
        seen = [fp for rec in full for fp in rec["seen"]]
        assert len(set(seen)) == len(seen)  # no batch reaches two ranks

    first = launch(tmp_path, "first", "b", crash_at=CRASH, **case)
    tail = launch(tmp_path, "tail", "b", resume="true", **case)
    for rank in range(RANKS):
        assert first[rank]["seen"] == full[rank]["seen"][: CRASH * gas]
        assert tail[rank]["seen"] == full[rank]["seen"][CRASH * gas :]
        assert tail[rank]["losses"] == full[rank]["losses"][CRASH:]
        assert tail[rank]["warnings"] == []  # the same layout: nothing is missing


@pytest.mark.parametrize("name", ["callback-dispatch", "trainer"])
def test_two_rank_checkpoint_resumes_on_one_process(tmp_path, caplog, name):
    caplog.set_level(logging.WARNING, logger="zephon_integrations")
    case = CASES[name]
    gas = case["gas"]
    launch(tmp_path, "first", "b", crash_at=CRASH, **case)
    ckpt = tmp_path / "b" / f"checkpoint-{CRASH}"
    moved = tmp_path / "single" / ckpt.name
    shutil.copytree(ckpt, moved)
    model = tiny_model()
    args = TrainingArguments(
        output_dir=str(tmp_path / "single"),
        max_steps=STEPS,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=gas,
        save_steps=3,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    if case["path"] == "callback":
        zephon = ZephonCallback(make_pipeline)
        trainer = Trainer(
            model=model, args=args, train_dataset=zephon.train_dataset, callbacks=[zephon]
        )
    else:
        trainer = ZephonTrainer(model=model, args=args, pipeline=make_pipeline)
    trainer.train(resume_from_checkpoint=str(moved))
    consumed = CRASH * gas * RANKS  # global batches both ranks took before the save
    remaining = (STEPS - CRASH) * gas
    assert model.seen == reference(consumed + remaining)[consumed:]
    # the Trainer only logs this at INFO level: the RNG files are per rank
    [warning] = zephon_warnings(caplog)
    assert "no rng_state.pth for process 0" in warning
    assert "it holds rng_state_0.pth, rng_state_1.pth" in warning
    assert "the data continues exactly" in warning and "dropout" in warning


def test_one_process_checkpoint_resumes_on_two_ranks_with_own_lanes(tmp_path):
    """The other direction: each of 2 ranks restores its own lanes from a 1-process state."""
    case = CASES["callback-shard"]
    gas = case["gas"]
    model = tiny_model()
    args = TrainingArguments(
        output_dir=str(tmp_path / "b"),
        max_steps=CRASH,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=gas,
        save_steps=CRASH,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    zephon = ZephonCallback(make_pipeline)
    Trainer(model=model, args=args, train_dataset=zephon.train_dataset, callbacks=[zephon]).train()
    saved = Pipeline.load(tmp_path / "b" / f"checkpoint-{CRASH}" / STATE_FILE)
    assert saved["position"] == CRASH * gas  # the global batches the single process took
    tail = launch(tmp_path, "tail", "c", resume=str(tmp_path / "b" / f"checkpoint-{CRASH}"), **case)
    consumed = CRASH * gas  # global batches the single process took
    ref = reference(consumed + (STEPS - CRASH) * gas * RANKS)[consumed:]
    for rank in range(RANKS):
        assert tail[rank]["seen"] == ref[rank::RANKS]
        [warning] = tail[rank]["warnings"]
        assert f"no rng_state_{rank}.pth for process {rank} (it holds rng_state.pth" in warning


def test_a_resume_where_the_stream_ended_ends_cleanly_on_two_ranks(tmp_path):
    """accelerate's dispatcher fails a pass without a single batch on every rank (with
    several processes as a TypeError of its broadcast); a 2-rank resume from a checkpoint
    taken where a finite stream ended trains nothing, stops and says why -- and that the
    1-process checkpoint holds no per-rank RNG."""
    _, _, trainer = hf_train("callback", tmp_path / "b", 40, pipeline=ending_pipeline)
    assert trainer.state.global_step == ENDING_STEPS  # saved every 3 steps, also there
    ckpt = tmp_path / "b" / f"checkpoint-{ENDING_STEPS}"
    records = launch(tmp_path, "end", "c", steps=40, resume=ckpt, ending=1, dispatch=1)
    for rank, rec in enumerate(records):
        assert rec["seen"] == [] and rec["losses"] == []
        rng, ended = rec["warnings"]  # at train begin; when the pass ended
        assert f"stream ended at step {ENDING_STEPS}, before max_steps=40" in ended
        assert f"no rng_state_{rank}.pth for process {rank}" in rng


def test_resume_without_a_checkpoint_fails_alike_on_every_rank(tmp_path):
    """Only rank 0 creates ``output_dir``: another rank (or another node) used to fail
    with FileNotFoundError while rank 0 said there was no checkpoint."""
    records = launch(tmp_path, "probe", "p", probe_no_checkpoint=1)  # both paths
    for path in ("callback", "trainer"):
        errors = [r["errors"][path].replace(f"{path}-rank{r['rank']}", "<d>") for r in records]
        assert errors[0] == errors[1], errors
        if path == "trainer":
            assert errors[0].startswith("ConfigError: resume_from_checkpoint=True but")
        else:  # raised in Trainer.train before any callback runs: the Trainer's own error
            assert errors[0].startswith("ValueError: No valid checkpoint found")


def test_dispatching_ragged_batches_fails_on_every_rank_before_training(tmp_path):
    """accelerate would concatenate batches of different widths on rank 0 only; the
    callback refuses on every rank at train begin, so no rank waits in a collective."""
    proc = torchrun(tmp_path, "ragged", "a", STEPS, dict(ragged=1, dispatch=1))
    assert proc is not None, "a rank hung"
    assert proc.returncode != 0
    assert proc.stderr.count("batch shapes must not vary") >= RANKS


@pytest.mark.parametrize("path", ["callback", "trainer"])
def test_rank_zero_writing_a_checkpoint_slowly_does_not_time_out_the_merge(tmp_path, path):
    """Ranks merge their lane states before the Trainer saves: rank 0 writing the model
    for longer than the aggregation budget does not leave the others waiting in a round.
    Rank 0's save lasts until rank 1's round has ended (``hf_dist_worker.slow_save``): as
    long as the budget, had the merge come after the save."""
    opts = dict(path=path, dispatch=0, gas=1, slow_save=1, agg_timeout=hang_guard_s(60))
    records = launch(tmp_path, "slow", "a", steps=3, **opts)
    ref = reference(3 * RANKS)
    assert [r["seen"] for r in records] == [ref[r::RANKS] for r in range(RANKS)]
    assert (tmp_path / "a" / "checkpoint-3" / "zephon_state.msgpack.zst").exists()


# -- state_layout="per_rank": every rank writes its own lanes, rank 0 a manifest --------------

PER_RANK_CASES = {
    "trainer": dict(path="trainer", gas=2, layout="per_rank"),
    "callback-shard": dict(path="callback", dispatch=0, gas=1, layout="per_rank"),
}


@pytest.fixture(scope="module")
def per_rank_full(tmp_path_factory):
    """``per_rank_full(name)``: (dir, records) of one uninterrupted 2-rank run of a case,
    launched once per module."""
    runs: dict[str, tuple[Path, list[dict]]] = {}

    def run(name: str) -> tuple[Path, list[dict]]:
        if name not in runs:
            tmp = tmp_path_factory.mktemp(f"per_rank_{name}")
            runs[name] = (tmp, launch(tmp, "full", "a", **PER_RANK_CASES[name]))
        return runs[name]

    return run


@pytest.mark.parametrize("name", list(PER_RANK_CASES))
def test_per_rank_layout_resumes_on_two_ranks_and_on_one(tmp_path, caplog, per_rank_full, name):
    """No round, no gather: ``checkpoint-N/`` holds each rank's own file next to its
    ``rng_state_<r>.pth`` and a small manifest; a 2-rank resume repeats every rank's
    batches and losses, a 1-process resume reads both files and continues the global
    stream (a WARNING says the per-rank RNG cannot follow)."""
    caplog.set_level(logging.WARNING, logger="zephon_integrations")
    case = PER_RANK_CASES[name]
    gas = case["gas"]
    full_dir, full = per_rank_full(name)
    ckpt = full_dir / "a" / f"checkpoint-{CRASH}"
    manifest = codec.decode((ckpt / STATE_FILE).read_bytes())
    assert manifest["format"] == "zephon.per_rank_manifest" and "lanes" not in manifest
    assert (manifest["dp_size"], manifest["world_size"]) == (RANKS, RANKS)
    assert manifest["position"] == CRASH * gas * RANKS
    assert (ckpt / STATE_FILE).stat().st_size < 1000
    names = sorted(p.name for p in ckpt.glob("zephon_rank*"))
    assert names == [file_name(r, r) for r in range(RANKS)]

    tail = launch(tmp_path, "tail", "b", resume=str(ckpt), **case)
    for rank in range(RANKS):
        assert tail[rank]["seen"] == full[rank]["seen"][CRASH * gas :]
        assert tail[rank]["losses"] == full[rank]["losses"][CRASH:]
        assert tail[rank]["warnings"] == []

    model = tiny_model()
    args = TrainingArguments(
        output_dir=str(tmp_path / "single"),
        max_steps=STEPS,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=gas,
        save_steps=STEPS,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    if case["path"] == "callback":
        zephon = ZephonCallback(make_pipeline, state_layout="per_rank")
        trainer = Trainer(
            model=model, args=args, train_dataset=zephon.train_dataset, callbacks=[zephon]
        )
    else:
        trainer = ZephonTrainer(
            model=model, args=args, pipeline=make_pipeline, state_layout="per_rank"
        )
    trainer.train(resume_from_checkpoint=str(ckpt))
    consumed, remaining = CRASH * gas * RANKS, (STEPS - CRASH) * gas
    assert model.seen == reference(consumed + remaining)[consumed:]
    [warning] = zephon_warnings(caplog)
    assert "no rng_state.pth for process 0" in warning and "the data continues exactly" in warning
    # one process: "per_rank" writes the merged state (one portable file)
    assert "lanes" in Pipeline.load(tmp_path / "single" / f"checkpoint-{STEPS}" / STATE_FILE)


def test_a_damaged_rank_file_fails_every_rank_with_the_typed_error(tmp_path, per_rank_full):
    """Rank 1's file is damaged: rank 1 raises CorruptCheckpoint reading it, and rank 0,
    which read its own file, raises too instead of waiting in training's first collective."""
    case = PER_RANK_CASES["trainer"]
    ckpt = tmp_path / "checkpoint-3"
    shutil.copytree(per_rank_full("trainer")[0] / "a" / ckpt.name, ckpt)
    damaged = ckpt / file_name(1, 1)
    damaged.write_bytes(damaged.read_bytes()[:-40])
    proc = torchrun(tmp_path, "tail", "b", STEPS, dict(case, resume=str(ckpt)))
    assert proc is not None, "a rank hung"
    assert proc.returncode != 0
    for rank in range(RANKS):
        assert f"[rank{rank}]: zephon_core.errors.CorruptCheckpoint" in proc.stderr, rank
    assert "rank 1 could not read its share of the checkpoint" in proc.stderr
    assert "zephon_rank00001_dp00001.msgpack.zst" in proc.stderr
