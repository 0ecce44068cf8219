"""Multi-process benchmarks: aggregation rounds, worker state carrying, W=2 vs W=0.

* aggregation round latency for 2 and 4 ranks over a directory and over a
  TCPStore (real processes, loopback);
* the per-batch cost of carrying lane state from DataLoader workers (deltas
  produced and applied, pickled size), measured against iterating the same
  pipeline directly;
* throughput with 2 DataLoader workers vs none.
"""

from __future__ import annotations

import itertools
import pickle
import socket
import statistics
import tempfile
import time

import torch.multiprocessing as mp
from common import reference_pipeline, throughput


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, world: int, backend: str, where: str, rounds: int, out: str) -> None:
    import sys

    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    import torch.distributed as dist

    kw = {}
    if backend == "dir":
        kw["aggregate_dir"] = where
    else:
        kw["aggregate_store"] = dist.TCPStore("127.0.0.1", int(where), world, rank == 0)
    pipe = reference_pipeline(lanes=8, **kw).bind(rank=rank, world_size=world)
    it = iter(pipe)
    lat = []
    for _ in range(rounds):
        for _ in itertools.islice(it, 5):
            pass
        t0 = time.perf_counter()
        pipe.checkpoint()
        lat.append(time.perf_counter() - t0)
    pipe.close()
    if rank == 0:
        with open(out, "wb") as f:
            pickle.dump(lat, f)


def bench_aggregation(rounds: int = 20) -> dict:
    res = {}
    for world in (2, 4):
        for backend in ("dir", "tcpstore"):
            with tempfile.TemporaryDirectory() as d:
                where = d if backend == "dir" else str(_free_port())
                out = f"{d}/lat.pkl"
                mp.spawn(_rank, args=(world, backend, where, rounds, out), nprocs=world)
                with open(out, "rb") as f:
                    lat = pickle.load(f)[2:]  # the first rounds include process warm-up
            res[f"{world}_ranks_{backend}"] = {
                "round_ms_median": round(1000 * statistics.median(lat), 2),
                "round_ms_max": round(1000 * max(lat), 2),
            }
    return res


def bench_state_carrying(n: int = 3000, rounds: int = 6) -> dict:
    """Producer-side deltas plus consumer-side mirroring per batch vs iterating alone."""
    from zephon_core.engine.torch_data import RankConsumer

    def run_once(carry: bool) -> float:
        p = reference_pipeline(prefetch=0, parallelism=1)
        run = iter(p).run
        consumer = RankConsumer(p.compile(), p.topology(), None) if carry else None
        for _ in range(50):
            next(run)
            if carry:
                consumer.apply(run.delta(run.last_lane))
        t0 = time.process_time()
        for _ in range(n):
            next(run)
            if carry:
                consumer.apply(run.delta(run.last_lane))
        dt = time.process_time() - t0
        p.close()
        return dt

    plain, carried = [], []
    for r in range(rounds):
        for carry in (False, True) if r % 2 == 0 else (True, False):
            (carried if carry else plain).append(run_once(carry))
    p = reference_pipeline(prefetch=0, parallelism=1)
    run = iter(p).run
    sizes = []
    for _ in range(300):
        next(run)
        sizes.append(len(pickle.dumps(run.delta(run.last_lane))))
    p.close()
    per_batch_us = 1e6 * (statistics.median(carried) - statistics.median(plain)) / n
    return {
        "cost_per_batch_us": round(per_batch_us, 1),
        "cost_pct_of_cpu_time": round(
            100 * (statistics.median(carried) / statistics.median(plain) - 1), 1
        ),
        "delta_bytes_pickled_median": int(statistics.median(sizes)),
        "delta_bytes_pickled_max": max(sizes),
    }


def bench_workers(n: int = 2000) -> dict:
    def build(w):
        p = reference_pipeline(prefetch=3, parallelism=1)
        return _LoaderWorkers(p, w)

    w0 = throughput(lambda: build(0), n, repeats=2)
    w2 = throughput(lambda: build(2), n, repeats=2)
    return {
        "W0_batches_per_s": round(w0),
        "W2_batches_per_s": round(w2),
        "speedup_W2_vs_W0": round(w2 / w0, 2),
    }


class _LoaderWorkers:
    """Adapts pipe.dataloader(num_workers=w) to the throughput() helper."""

    def __init__(self, pipe, w):
        self.pipe = pipe
        self.loader = pipe.dataloader(num_workers=w)

    def __iter__(self):
        return iter(self.loader)

    def close(self) -> None:
        self.pipe.close()


def main() -> dict:
    return {
        "aggregation": bench_aggregation(),
        "state_carrying": bench_state_carrying(),
        "workers": bench_workers(),
    }


if __name__ == "__main__":
    import json

    print(json.dumps(main(), indent=2))
