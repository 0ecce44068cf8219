"""``examples/dcp_torchrun.py`` under torchrun: two nodes, one killed, resumed elsewhere.

Two rendezvous agents on localhost (``--nnodes=2 --nproc-per-node=2``, c10d rendezvous,
gloo) train with ``dcp.save`` every 3 steps. Once a checkpoint exists, every process of
one node is SIGKILLed (the run may be anywhere, even inside a save: only checkpoints
with ``.metadata`` count). The latest complete checkpoint then resumes on 2 and on 3
ranks (C=12), and the global stream -- every rank's batches by global position -- equals
an uninterrupted single-process run, batch for batch.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import worker_env
from test_aggregation import free_port

from zephon_core.testing import take

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "dcp_torchrun.py"
sys.path.insert(0, str(EXAMPLE.parent))
from dcp_torchrun import batch_digest, build_pipeline, latest_checkpoint  # noqa: E402

LAUNCH_TIMEOUT_S = 600
EVERY = 3


def torchrun(*args: str, record: Path, ckpt: Path, steps: int | None = None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torch.distributed.run", *args, str(EXAMPLE)]
    cmd += ["--ckpt", str(ckpt), "--every", str(EVERY), "--record", str(record)]
    if steps is not None:
        cmd += ["--steps", str(steps)]
    return subprocess.Popen(
        cmd,
        env=worker_env(OMP_NUM_THREADS="1"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and its descendants (torchrun starts its ranks in sessions of their
    own, so a process group does not reach them)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            children = [int(c) for c in f.read().split()]
    except OSError:
        children = []
    try:
        os.kill(pid, signal.SIGKILL)  # the agent first: it must not restart its ranks
    except ProcessLookupError:
        pass
    for child in children:
        kill_tree(child)


def finish(proc: subprocess.Popen, what: str) -> None:
    try:
        _, err = proc.communicate(timeout=LAUNCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        proc.communicate()
        raise AssertionError(f"{what} did not finish within {LAUNCH_TIMEOUT_S} s") from None
    assert proc.returncode == 0, f"{what} failed (exit {proc.returncode}): {err[-3000:]}"


def records(*paths: Path) -> dict[int, str]:
    out: dict[int, str] = {}
    for p in paths:
        for line in p.read_text().splitlines() if p.exists() else []:
            d = json.loads(line)
            out[d["position"]] = d["batch"]
    return out


@pytest.mark.slow
def test_a_killed_node_resumes_on_two_and_three_ranks_exactly(tmp_path):
    root = tmp_path / "ckpt"
    port = free_port()
    rdzv = ["--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d"]
    rdzv += [f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=dcp-test"]
    nodes = [
        torchrun(*rdzv, f"--node-rank={i}", record=tmp_path / f"node{i}.jsonl", ckpt=root)
        for i in range(2)
    ]
    try:
        deadline = time.monotonic() + LAUNCH_TIMEOUT_S
        while (latest_checkpoint(root) is None or len(list(root.glob("step-*"))) < 2) and all(
            n.poll() is None for n in nodes
        ):
            assert time.monotonic() < deadline, "no checkpoint was written in time"
            time.sleep(0.2)  # polling for progress, not synchronising
        assert all(n.poll() is None for n in nodes), [n.communicate()[1][-2000:] for n in nodes]
        kill_tree(nodes[1].pid)  # every process of node 1, mid-run
        try:
            nodes[0].communicate(timeout=LAUNCH_TIMEOUT_S)  # its peers fail; it gives up
        except subprocess.TimeoutExpired:
            pass
    finally:
        for n in nodes:
            kill_tree(n.pid)
            n.communicate()
    last = latest_checkpoint(root)
    saved_step = int(last.name.split("-")[1])
    position = saved_step * 4  # 4 ranks took one global batch each per step
    before = records(tmp_path / "node0.jsonl", tmp_path / "node1.jsonl")
    assert len(before) >= position and sorted(before)[:position] == list(range(position))

    resumed = {}
    for world, steps in ((2, 6), (3, 4)):
        copy = tmp_path / f"ckpt{world}"
        shutil.copytree(root, copy)
        rec = tmp_path / f"resumed{world}.jsonl"
        proc = torchrun(
            "--standalone", f"--nproc-per-node={world}", record=rec, ckpt=copy,
            steps=saved_step + steps,
        )  # fmt: skip
        finish(proc, f"the resume on {world} ranks")
        resumed[world] = records(rec)
        assert sorted(resumed[world]) == list(range(position, position + world * steps))

    ref = [batch_digest(b) for b in take(build_pipeline(), position + 12)]
    assert [before[p] for p in range(position)] == ref[:position]
    for world, got in resumed.items():
        tail = [got[p] for p in sorted(got)]
        assert tail == ref[position : position + len(tail)], f"the resume on {world} ranks"
