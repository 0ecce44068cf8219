"""What a trainer checkpoint costs at C=1024 lanes: ``state_layout="merged"`` vs ``"per_rank"``.

The state is the one ``bench_distributed.py`` measures (every lane delivered, simulated
ranks; ``ZEPHON_SCALE_STATE=<file>`` reuses a saved one). For D = 8 / 64 / 256 / 1024
data-parallel ranks it reports:

* merged (today's default): the merged state's bytes (rank 0's ``.ckpt`` entry, HF's
  ``zephon_state.msgpack.zst``) and, for Lightning, the gathered RNG list (every rank's
  RNG, pickled into rank 0's ``.ckpt``);
* per_rank: rank 0's manifest (pickled as Lightning stores it; msgpack+zstd as HF's file),
  each rank's own file (its lanes plus, for Lightning, its RNG: median bytes), the time
  to write it, and a resume: reading and admitting one rank's share on the same D and on
  D/2 (a rank then reads two files).

Run: ``python benchmarks/bench_per_rank_layout.py``; prints JSON.
"""

from __future__ import annotations

import copy
import io
import json
import os
import pickle
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))


def _split(full: dict, D: int) -> list[dict]:
    from zephon_core.checkpoint.state import PipelineState
    from zephon_core.distributed import dcp

    st = PipelineState.from_dict(full)
    n = len(st.lanes)
    out = []
    for d in range(D):
        lanes = {lane: ls for lane, ls in st.lanes.items() if (lane - st.position) % D == d}
        out.append(dcp.encode(PipelineState(st.fingerprint, st.config, st.position, lanes,
                                            st.content), n))  # fmt: skip
    return out


def measure(full: dict, D: int, pipeline) -> dict:
    import torch

    from zephon_core.checkpoint import codec
    from zephon_core.distributed import rank_files
    from zephon_core.distributed.topology import Topology
    from zephon_integrations import rng

    snap = rng.snapshot()
    # distinct objects, as all_gather_object returns them (pickle would share one)
    lightning_rng = [copy.deepcopy(rng.to_checkpoint(snap)) for _ in range(D)]
    buf = io.BytesIO()
    torch.save(lightning_rng, buf)
    shares = _split(full, D)
    extra = {"rng": rng.to_msgpack(snap)}
    with tempfile.TemporaryDirectory() as tmp:
        directory = os.path.join(tmp, "step.ckpt.zephon")
        took, sizes, bare = [], [], []
        for d, share in enumerate(shares):
            t = time.perf_counter()
            path = rank_files.write_rank_file(directory, save_id="s", topology=Topology(d, D, d, D),
                                              state=share, extra=extra)  # fmt: skip
            took.append(time.perf_counter() - t)
            sizes.append(os.path.getsize(path))
            if d < 8:  # HF's files hold no RNG (the Trainer's rng_state_<r>.pth does)
                other = os.path.join(tmp, "hf")
                p = rank_files.write_rank_file(other, save_id="s", topology=Topology(d, D, d, D),
                                               state=share)  # fmt: skip
                bare.append(os.path.getsize(p))
        m = rank_files.manifest(save_id="s", state=shares[0], topology=Topology(0, D, 0, D),
                                files="step.ckpt.zephon", files_abs=directory)  # fmt: skip
        buf_m = io.BytesIO()
        torch.save({"per_rank": m}, buf_m)
        resume = {}
        for d_new in sorted({D, max(1, D // 2)}):
            topo = Topology(0, d_new, 0, d_new) if d_new > 1 else Topology()
            pipe = pipeline.bind(rank=0, world_size=d_new) if d_new > 1 else pipeline
            t = time.perf_counter()
            share = rank_files.read_share(m, directory, topo).state
            pipe._admit(share, ())
            resume[f"read_and_admit_s_on_D{d_new}"] = round(time.perf_counter() - t, 4)
    return {
        "D": D,
        "merged_state_bytes": len(codec.encode(full)),
        "merged_lightning_rng_list_bytes": len(buf.getvalue()),
        "merged_lightning_rng_list_pickled": len(pickle.dumps(lightning_rng)),
        "per_rank_manifest_bytes_lightning_pickled": len(pickle.dumps({"per_rank": m})),
        "per_rank_manifest_bytes_lightning_torch_save_alone": len(buf_m.getvalue()),
        "per_rank_manifest_bytes_hf_file": len(codec.encode(m)),
        "per_rank_file_bytes_median": int(statistics.median(sizes)),
        "per_rank_file_bytes_without_rng_median": int(statistics.median(bare)),
        "per_rank_meta_bytes": len(shares[0]["meta"]),
        "per_rank_file_write_s_median": round(statistics.median(took), 4),
        **resume,
    }


def run() -> list[dict]:
    from bench_distributed import _scale_pipeline, _scale_state

    full = _scale_state()
    pipeline = _scale_pipeline()
    return [measure(full, D, pipeline) for D in (8, 64, 256, 1024)]


if __name__ == "__main__":
    print(json.dumps(run(), indent=1))
