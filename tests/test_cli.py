"""The ``zephon`` command, run through its installed console script, as a user would."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import reference_pipeline, worker_env

from zephon_core.checkpoint import codec
from zephon_core.testing import take

ZEPHON = Path(sys.executable).parent / "zephon"

FACTORY = """
import os
import numpy as np
from helpers import reference_pipeline, byte_tokenize, source
from zephon_core import Pipeline


def build():
    return reference_pipeline(prefetch=0)


def other():
    return reference_pipeline(prefetch=0, seq_len=64)


def noisy(p):  # not deterministic: a different stream on every run
    out = byte_tokenize(p)
    return {**out, "input_ids": out["input_ids"] ^ int.from_bytes(os.urandom(1), "big")}


def broken():
    return (
        Pipeline(source(8), canonical_replicas=2, seed=1, prefetch=0)
        .fetch()
        .map(noisy, name="noisy")
        .split(max_len=64)
        .pack(seq_len=64)
        .batch(batch_size=2)
    )
"""


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(ZEPHON), *args], cwd=cwd, env=worker_env(), capture_output=True, text=True
    )


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("cli")
    (d / "factory.py").write_text(FACTORY)
    with reference_pipeline(prefetch=0) as pipe:
        take(pipe, 30)
        state = pipe.checkpoint()
        pipe.save(d / "state.zst")
    (d / "checkpoint-30").mkdir()
    (d / "checkpoint-30" / "zephon_state.msgpack.zst").write_bytes(codec.encode(state))
    torch.save({"zephon": {"state": state, "rng": None}, "state_dict": {}}, d / "last.ckpt")
    with reference_pipeline(prefetch=0, seq_len=64) as pipe:
        take(pipe, 5)
        pipe.save(d / "other.zst")
    return d


def test_the_console_script_is_installed():
    assert ZEPHON.exists(), "pip install -e '.[cli]' creates the zephon script"


@pytest.mark.parametrize("name", ["state.zst", "checkpoint-30", "last.ckpt"])
def test_inspect_reads_every_kind_of_checkpoint(work, name):
    r = run("inspect", name, "--json", cwd=work)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["position"] == 30 and len(info["lanes"]) == 4
    assert sum(lane["delivered"] for lane in info["lanes"]) == 30
    assert set(info["components"]) == {"prose", "code"}
    assert info["components"]["code"]["epochs"] > 0
    assert info["inflight_chunks"] == sum(lane["inflight_chunks"] for lane in info["lanes"])
    text = run("inspect", name, cwd=work)
    assert "global position 30" in text.stdout and "lane   0" in text.stdout


def test_inspect_of_something_else_is_a_clear_error(work):
    (work / "junk.bin").write_bytes(b"not a checkpoint")
    r = run("inspect", "junk.bin", cwd=work)
    assert r.returncode != 0 and "not a readable torch checkpoint" in r.stderr


def test_diff_of_two_checkpoints_names_what_differs(work):
    r = run("diff", "state.zst", "other.zst", cwd=work)
    assert r.returncode == 1 and "seq_len" in r.stdout
    same = run("diff", "state.zst", "last.ckpt", cwd=work)
    assert same.returncode == 0 and "same configuration" in same.stdout


def test_diff_names_changed_content_and_refuses_a_bad_second_file(work):
    state = codec.decode(codec.read_bytes(work / "state.zst"))
    state["content"]["components"]["prose"] = "0" * 16  # the same config over other data
    (work / "other_data.zst").write_bytes(codec.encode(state))
    r = run("diff", "state.zst", "other_data.zst", cwd=work)
    assert r.returncode == 1 and "dataset 'prose'" in r.stdout and "code" not in r.stdout
    (work / "junk2.bin").write_bytes(b"not a checkpoint")
    bad = run("diff", "state.zst", "junk2.bin", cwd=work)
    assert bad.returncode == 1 and "not a readable torch checkpoint" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_diff_of_a_checkpoint_and_a_pipeline(work):
    ok = run("diff", "state.zst", "factory.py:build", cwd=work)
    assert ok.returncode == 0 and "restores" in ok.stdout
    bad = run("diff", "state.zst", "factory:other", cwd=work)
    assert bad.returncode == 1 and "IncompatibleCheckpoint" in bad.stdout


def test_explain_prints_the_plan_and_its_legend(work):
    r = run("explain", "factory:build", cwd=work)
    assert r.returncode == 0
    assert "Stage[0]" in r.stdout and "batch_replay_filter" in r.stdout and "Legend" in r.stdout


def test_verify_passes_a_deterministic_pipeline_and_fails_a_noisy_one(work):
    ok = run("verify", "factory:build", "--cuts", "1,7", "--total", "14", cwd=work)
    assert ok.returncode == 0 and ok.stdout.startswith("exact"), ok.stdout + ok.stderr
    bad = run("verify", "factory:broken", "--cuts", "3", "--total", "8", cwd=work)
    assert bad.returncode == 1 and "NOT exact" in bad.stdout


def test_bench_reports_throughput(work):
    r = run("bench", "factory:build", "--batches", "20", cwd=work)
    assert r.returncode == 0 and "batches/s" in r.stdout and "tokens/s" in r.stdout


def test_a_bad_factory_is_a_usage_error(work):
    r = run("explain", "factory:nope", cwd=work)
    assert r.returncode == 2 and "no function 'nope'" in r.stderr
