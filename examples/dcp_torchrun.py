"""A torchtitan-style loop checkpointed with torch.distributed.checkpoint (DCP).

Model, optimizer and the Zephon loader go into one ``dcp.save`` every ``--every`` steps;
each rank writes its own lanes (one key per lane, no gather to rank 0). A restart loads
the latest complete checkpoint on any number of ranks that divides
``canonical_replicas`` (12 here: 1, 2, 3, 4, 6 or 12), and the data continues exactly.

Two "nodes" of two ranks on one machine (run each line in its own shell)::

    torchrun --nnodes=2 --nproc-per-node=2 --node-rank=0 --rdzv-backend=c10d \\
        --rdzv-endpoint=localhost:29400 --rdzv-id=demo examples/dcp_torchrun.py --ckpt /tmp/run
    torchrun --nnodes=2 --nproc-per-node=2 --node-rank=1 --rdzv-backend=c10d \\
        --rdzv-endpoint=localhost:29400 --rdzv-id=demo examples/dcp_torchrun.py --ckpt /tmp/run

Kill one of them, then resume on three ranks::

    torchrun --standalone --nproc-per-node=3 examples/dcp_torchrun.py --ckpt /tmp/run --steps 40

``--record FILE`` appends one JSON line per rank and step (global position and a digest
of the batch): what the test compares with an uninterrupted single-process run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from zephon_core import Pipeline, StaticMixtureWorkSource
from zephon_core.distributed import dcp as zephon_dcp

CANONICAL_REPLICAS = 12
SEQ_LEN, BATCH = 64, 2


def _docs(n: int, seed: int, letter: str) -> list[dict]:
    rng = random.Random(seed)
    return [
        {"text": f"{letter}{i}:" + "".join(rng.choices("abcdefgh ", k=rng.randrange(5, 300)))}
        for i in range(n)
    ]


def tokenize(doc: dict) -> dict:
    return {"input_ids": np.frombuffer(doc["text"].encode(), dtype=np.uint8).astype(np.int64)}


def build_pipeline() -> Pipeline:
    """The data: two small corpora mixed 0.7/0.3, tokenized, packed and batched."""
    source = StaticMixtureWorkSource(
        {"prose": _docs(200, 1, "p"), "code": _docs(100, 2, "c")},
        {"prose": 0.7, "code": 0.3},
        chunk_size=8,
        seed=7,
    )
    return (
        Pipeline(source, canonical_replicas=CANONICAL_REPLICAS, seed=11)
        .fetch()
        .map(tokenize, name="tokenize")
        .split(max_len=SEQ_LEN)
        .pack(seq_len=SEQ_LEN, bins=4)
        .shuffle(buffer_size=8)
        .batch(batch_size=BATCH)
    )


def batch_digest(batch: dict) -> str:
    return hashlib.sha256(batch["input_ids"].numpy().tobytes()).hexdigest()[:16]


def latest_checkpoint(root: Path) -> Path | None:
    """The newest complete checkpoint (DCP writes ``.metadata`` last)."""
    done = [p for p in root.glob("step-*") if (p / ".metadata").exists()]
    return max(done, key=lambda p: int(p.name.split("-")[1]), default=None)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", required=True, help="checkpoint root (step-N folders)")
    ap.add_argument("--steps", type=int, default=10_000, help="stop after this step")
    ap.add_argument("--every", type=int, default=4, help="checkpoint every N steps")
    ap.add_argument("--record", help="append one JSON line per rank and step here")
    args = ap.parse_args()

    dist.init_process_group("gloo")
    try:
        train(args)
    finally:
        # after train() returned: DDP's reducer, which holds the process group, is gone
        # first (freeing it after destroy_process_group() can deadlock gloo at exit)
        dist.destroy_process_group()


def train(args: argparse.Namespace) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(256, 16), torch.nn.Linear(16, 256))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = build_pipeline().dataloader()  # this rank's lanes (rank/world from torch)
    progress = {"step": 0, "position": 0}  # position: the global batch index next due

    root = Path(args.ckpt)
    last = latest_checkpoint(root)
    if last is not None:
        zephon_dcp.check(last, loader)  # typed errors, the same on every rank
        model_sd, optim_sd = get_state_dict(model, optim)
        state = {"model": model_sd, "optim": optim_sd, "data": loader, "progress": progress}
        with zephon_dcp.translated(loader, checkpoint_id=last):
            dcp.load(state, checkpoint_id=str(last))
        set_state_dict(model, optim, model_state_dict=model_sd, optim_state_dict=optim_sd)
        progress = state["progress"]
        if rank == 0:
            print(f"resumed from {last} at step {progress['step']} on {world} ranks")

    record = open(args.record, "a") if args.record else None  # noqa: SIM115
    step, position = progress["step"], progress["position"]
    for batch in loader:
        if step >= args.steps:
            break
        ids = batch["input_ids"]
        logits = ddp(ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), ids[:, 1:].reshape(-1))
        optim.zero_grad()
        loss.backward()
        optim.step()
        if record is not None:
            line = {"rank": rank, "world": world, "position": position + rank}
            record.write(json.dumps(line | {"batch": batch_digest(batch)}) + "\n")
            record.flush()
        step, position = step + 1, position + world
        if step % args.every == 0:
            model_sd, optim_sd = get_state_dict(model, optim)
            progress = {"step": step, "position": position}
            state = {"model": model_sd, "optim": optim_sd, "data": loader, "progress": progress}
            dcp.save(state, checkpoint_id=str(root / f"step-{step}"))
    loader.close()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
