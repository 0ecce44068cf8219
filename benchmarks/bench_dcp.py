"""Per-rank checkpoints through torch.distributed.checkpoint vs the merged round, C=1024.

Real processes (gloo over loopback), D=2 ranks, C lanes, each rank ``STEPS`` outputs in:

* ``state_dict()`` (this rank's lanes, no collective) and ``dcp.save({"data": it})``:
  time per rank, bytes of each rank's ``.distcp`` file and of ``.metadata``;
* ``zephon_core.distributed.dcp.check`` (the pre-load check), then ``dcp.load`` into a
  fresh iterator on the same D (template, read, admission of this rank's lanes only),
  and that admission alone (``admit_any`` of the loaded state, no run built);
* the merged round: ``it.checkpoint()`` over the process group's TCPStore (every rank gets
  every lane), the merged state's encoded bytes, and admitting it into a fresh iterator
  (``pipe.run_spec(restore=merged)``: every rank decodes and validates every lane).

Run: ``python benchmarks/bench_dcp.py [C] [D]`` (defaults 1024, 2); prints JSON.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch.multiprocessing as mp

STEPS = 8


def _build(lanes: int):
    sys.path.insert(0, str(Path(__file__).parent))
    from common import reference_pipeline

    return reference_pipeline(lanes=lanes, prefetch=0)


def _rank(rank: int, world: int, lanes: int, tmp: str) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from zephon_core.checkpoint import codec
    from zephon_core.distributed import dcp as zdcp

    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=world)
    out: dict = {}
    ckpt = f"{tmp}/ckpt"
    with _build(lanes).iterate() as it:
        for _ in range(STEPS):
            next(it)
        dist.barrier()
        t = time.perf_counter()
        sd = it.state_dict()
        out["state_dict_ms"] = (time.perf_counter() - t) * 1e3
        out["state_dict_bytes"] = sum(map(len, sd["slots"].values())) + len(sd["meta"])
        dist.barrier()
        t = time.perf_counter()
        dcp.save({"data": it}, checkpoint_id=ckpt)
        out["dcp_save_ms"] = (time.perf_counter() - t) * 1e3
        dist.barrier()
        t = time.perf_counter()
        merged = it.checkpoint()
        out["merged_round_ms"] = (time.perf_counter() - t) * 1e3
        out["merged_bytes"] = len(codec.encode(merged))
    out["distcp_bytes"] = Path(ckpt, f"__{rank}_0.distcp").stat().st_size
    out["metadata_bytes"] = Path(ckpt, ".metadata").stat().st_size
    pipe = _build(lanes)
    fresh = pipe.iterate()
    dist.barrier()
    t = time.perf_counter()
    zdcp.check(ckpt, fresh)
    out["dcp_check_ms"] = (time.perf_counter() - t) * 1e3
    dist.barrier()
    t = time.perf_counter()
    dcp.load({"data": fresh}, checkpoint_id=ckpt)
    out["dcp_load_ms"] = (time.perf_counter() - t) * 1e3
    mine = fresh.state_dict()  # what dcp.load filled in: this rank's lanes
    fresh.close()
    spec = pipe.run_spec()
    t = time.perf_counter()
    zdcp.admit_any(mine, spec.plan, spec.topology)
    out["per_rank_admission_ms"] = (time.perf_counter() - t) * 1e3
    t = time.perf_counter()
    pipe.run_spec(restore=merged)
    out["merged_admission_ms"] = (time.perf_counter() - t) * 1e3
    t = time.perf_counter()
    codec.decode(codec.encode(merged))
    out["merged_decode_ms"] = (time.perf_counter() - t) * 1e3
    dist.destroy_process_group()
    Path(tmp, f"out.{rank}.json").write_text(json.dumps(out))


def run(lanes: int = 1024, world: int = 2) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(_rank, args=(world, lanes, tmp), nprocs=world, join=True)
        per_rank = [json.loads(Path(tmp, f"out.{r}.json").read_text()) for r in range(world)]
    return {
        "canonical_replicas": lanes,
        "dp_size": world,
        "per_rank": [{k: round(v, 1) for k, v in r.items()} for r in per_rank],
    }


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:]]
    print(json.dumps(run(*args), indent=1))
