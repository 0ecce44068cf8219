"""Per-rank DCP state across real gloo processes: ``dcp.async_save`` keeps the state at the
call, model-parallel peers write each lane once, and a checkpoint missing slots fails the
same typed way on every rank (the pre-load check and DCP's own error, translated).

Two jobs (2 then 3 processes); the resume-equivalence across D' runs in this process
(``test_dcp_state.py``) and under torchrun (``test_dcp_torchrun.py``).
"""

from __future__ import annotations

import json
import os
import traceback
from pathlib import Path

import pytest
from helpers import reference_pipeline

from zephon_core.testing import assert_streams_equal, take

C = 12
TIMEOUT_S = 600


def _init(rank: int, world: int, store: Path) -> None:
    import torch.distributed as dist

    os.environ["OMP_NUM_THREADS"] = "1"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)


def _save_job(rank: int, world: int, tmp: str) -> None:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    tmp_path = Path(tmp)
    _init(rank, world, tmp_path / "store2")
    out: dict = {}
    try:
        # data parallel: async_save on its own gloo group, the loader moving on meanwhile
        ckpt_pg = dist.new_group(backend="gloo")
        with reference_pipeline(lanes=C).iterate() as it:
            take(it, 3)  # global position 6
            fut = dcp.async_save(
                {"data": it}, checkpoint_id=str(tmp_path / "async"), process_group=ckpt_pg
            )
            take(it, 2)  # after the call: not in the checkpoint
            fut.result()
            # a checkpoint without rank 1's odd slots 1 and 3
            part = it.state_dict()
            if rank == 1:
                del part["slots"]["00001"], part["slots"]["00003"]
            dcp.save({"data": part}, checkpoint_id=str(tmp_path / "part"))
        # model parallel: both ranks are one data-parallel rank
        mp = reference_pipeline(lanes=C).bind(rank=rank, world_size=2, dp_rank=0, dp_size=1)
        with mp.iterate() as it:
            take(it, 5)
            dcp.save({"data": it}, checkpoint_id=str(tmp_path / "mp"))
        out["ok"] = True
    except BaseException as e:  # noqa: BLE001 - reported to the test
        out["error"] = "".join(traceback.format_exception(e))
    finally:
        dist.destroy_process_group()
    (tmp_path / f"save.{rank}.json").write_text(json.dumps(out))


def _load_job(rank: int, world: int, tmp: str) -> None:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from zephon_core.distributed import dcp as zdcp

    tmp_path = Path(tmp)
    _init(rank, world, tmp_path / "store3")
    out: dict = {}
    try:
        with reference_pipeline(lanes=C).iterate() as it:
            try:
                zdcp.check(tmp_path / "part", it)
            except Exception as e:  # noqa: BLE001 - reported to the test
                out["check"] = [type(e).__name__, str(e)]
            try:
                with zdcp.translated(it, checkpoint_id=tmp_path / "part"):
                    dcp.load({"data": it}, checkpoint_id=str(tmp_path / "part"))
            except Exception as e:  # noqa: BLE001 - reported to the test
                out["load"] = [type(e).__name__, str(e)]
    except BaseException as e:  # noqa: BLE001 - reported to the test
        out["error"] = "".join(traceback.format_exception(e))
    finally:
        dist.destroy_process_group()
    (tmp_path / f"load.{rank}.json").write_text(json.dumps(out))


def _run(fn, world: int, tmp_path: Path, tag: str) -> list[dict]:
    import torch.multiprocessing as mp

    ctx = mp.start_processes(fn, args=(world, str(tmp_path)), nprocs=world, join=False)
    ctx_done = False
    for _ in range(TIMEOUT_S):
        if ctx.join(timeout=1):
            ctx_done = True
            break
    if not ctx_done:
        for p in ctx.processes:
            p.kill()
        raise AssertionError(f"the {tag} job did not finish within {TIMEOUT_S} s")
    results = [json.loads((tmp_path / f"{tag}.{r}.json").read_text()) for r in range(world)]
    for r, res in enumerate(results):
        assert "error" not in res, f"rank {r}: {res['error']}"
    return results


@pytest.mark.slow
def test_async_save_model_parallel_peers_and_missing_slots_on_every_rank(tmp_path):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader

    _run(_save_job, 2, tmp_path, "save")
    ref = take(reference_pipeline(lanes=C), 16)

    # async_save kept the state at the call (position 6), not the one it finished at
    with reference_pipeline(lanes=C).iterate() as it:
        dcp.load({"data": it}, checkpoint_id=str(tmp_path / "async"))
        assert_streams_equal(ref[6:16], take(it, 10))

    # model-parallel peers: every key written once, each file exactly its items
    md = FileSystemReader(str(tmp_path / "mp")).read_metadata()
    where: dict[str, list[str]] = {}
    used: dict[str, int] = {}
    for index, info in md.storage_data.items():
        where.setdefault(index.fqn, []).append(info.relative_path)
        used[info.relative_path] = used.get(info.relative_path, 0) + info.length
    slots = sorted(k for k in where if k.startswith("data.slots."))
    assert slots == [f"data.slots.{s:05d}" for s in range(C)]
    assert all(len(files) == 1 for files in where.values())
    for name, n in used.items():
        assert (tmp_path / "mp" / name).stat().st_size == n  # nothing else in the file
    with reference_pipeline(lanes=C).iterate() as it:
        dcp.load({"data": it}, checkpoint_id=str(tmp_path / "mp"))
        assert_streams_equal(ref[5:10], take(it, 5))

    # slots 1 and 3 missing: the same typed error on all three ranks, before and from load
    loads = _run(_load_job, 3, tmp_path, "load")
    for phase in ("check", "load"):
        kinds = {res[phase][0] for res in loads}
        assert kinds == {"MissingLanes"}, (phase, loads)
        for res in loads:
            assert "[1, 3]" in res[phase][1] and "checkpoint()" in res[phase][1]
    assert len({res["check"][1] for res in loads}) == 1  # identical on every rank
