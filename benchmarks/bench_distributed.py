"""Multi-process benchmarks: aggregation rounds, worker state carrying, W=2 vs W=0.

* an aggregation round at canonical_replicas=1024 with D = 8 / 64 / 256 ranks simulated
  in threads over one directory: checkpoint() time per rank, report bytes per rank, the
  leader's storage calls, restore admission per rank, round time vs D, and the DCP path
  per rank beside it (state_dict() encoding, bytes, admission of a per-rank state)
  (``bench_distributed.py scale`` runs only this);
* DCP save/load vs the merged round in real processes, C=1024, D=2 (``bench_dcp.py``);
* the trainers' checkpoint layouts, merged vs per rank, D = 8 ... 1024
  (``bench_per_rank_layout.py``);
* aggregation round latency for 2 and 4 ranks over a directory and over a
  TCPStore (real processes, loopback);
* the per-batch cost of carrying lane state from DataLoader workers (deltas
  produced and applied, pickled size), measured against iterating the same
  pipeline directly, in interleaved rounds;
* throughput with 2 DataLoader workers vs none, in interleaved rounds (``rounds.py``).
"""

from __future__ import annotations

import itertools
import pickle
import socket
import statistics
import tempfile
import time

import bench_dcp
import rounds
import torch.multiprocessing as mp
from common import reference_pipeline


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


def bench_state_carrying(n: int = 3000, n_rounds: int = 6) -> dict:
    """Producer-side deltas plus consumer-side mirroring per batch vs iterating alone."""
    from zephon_core.engine.torch_data import RankConsumer

    def run_once(carry: bool) -> rounds.Sample:
        p = reference_pipeline(prefetch=0, parallelism=1)
        run = iter(p).run
        consumer = RankConsumer(p.compile(), p.topology(), None) if carry else None
        for _ in range(50):
            next(run)
            if carry:
                consumer.apply(run.delta(run.last_lane))
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(n):
            next(run)
            if carry:
                consumer.apply(run.delta(run.last_lane))
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        p.close()
        return {"seconds": wall, "cpu_seconds": cpu, "batches": float(n)}

    r = rounds.run({"plain": lambda: run_once(False), "carried": lambda: run_once(True)}, n_rounds)
    p = reference_pipeline(prefetch=0, parallelism=1)
    run = iter(p).run
    sizes = []
    for _ in range(300):
        next(run)
        sizes.append(len(pickle.dumps(run.delta(run.last_lane))))
    p.close()
    return {
        "batches": n,
        "load": r.load,
        # both within a round: CPU seconds per batch carried minus (over) plain
        "cost_cpu_s_per_batch": r.diff_per("carried", "plain", "cpu_seconds", "batches").to_json(),
        "carried_vs_plain_cpu": r.cost_ratio(
            "carried", "plain", "cpu_seconds", "batches"
        ).to_json(),
        "delta_bytes_pickled_median": int(statistics.median(sizes)),
        "delta_bytes_pickled_max": max(sizes),
    }


def bench_workers(n: int = 2000, warmup: int = 50, n_rounds: int = 5) -> dict:
    def build(w):
        return _LoaderWorkers(reference_pipeline(prefetch=3, parallelism=1), w)

    # + 4 for W=2: the batches its workers prefetched while the first was awaited
    r = rounds.run(
        {
            "W0": rounds.window(lambda: build(0), n, warmup),
            "W2": rounds.window(lambda: build(2), n, warmup + 4),
        },
        n_rounds,
    )
    return {
        "batches": n,
        "load": r.load,
        "W0_batches_per_s": r.rate("W0", "items").to_json(),
        "W2_batches_per_s": r.rate("W2", "items").to_json(),
        "speedup_W2_vs_W0": r.ratio("W2", "W0", "items").to_json(),
    }


class _LoaderWorkers:
    """pipe.dataloader(num_workers=w) as rounds.window takes it: iterable, with close()."""

    def __init__(self, pipe, w):
        self.pipe = pipe
        self.loader = pipe.dataloader(num_workers=w)

    def __iter__(self):
        return iter(self.loader)

    def close(self) -> None:
        self.pipe.close()


# -- aggregation at scale (issue 21): C=1024 lanes, D ranks simulated in threads ---------------
SCALE_LANES = 1024


def _scale_pipeline():
    """A light pipeline, so that stepping every one of 1024 lanes takes a minute, not ten."""
    from common import mixture_source

    from zephon_core import Pipeline
    from zephon_core.testing import corpora

    return (
        Pipeline(
            mixture_source(chunk_size=16),
            canonical_replicas=SCALE_LANES,
            flush_every_k_chunks=4,
            seed=1234,
            prefetch=0,
        )
        .fetch()
        .map(corpora.byte_tokens, name="tokenize")
        .shuffle(buffer_size=8)
        .batch(batch_size=2)
    )


def _scale_state(steps: int = 130, dp: int = 8) -> dict:
    """The merged state once every lane delivered (D=8 lockstep ranks, simulated; about two
    minutes). ``ZEPHON_SCALE_STATE=<file>`` keeps it there, so two runs (before and after a
    change) measure the same state."""
    import os

    from zephon_core.checkpoint import codec
    from zephon_core.testing import SimulatedRanks

    cached = os.environ.get("ZEPHON_SCALE_STATE")
    if cached and os.path.exists(cached):
        return codec.decode(codec.read_bytes(cached))
    with SimulatedRanks(_scale_pipeline, dp) as ranks:
        ranks.steps(steps)
        state = ranks.checkpoint()
    if cached:
        codec.write_atomic(cached, codec.encode(state))
    return state


def _simulated_round(full: dict, D: int, where: str) -> dict:
    """One aggregation round of D ranks (threads, one directory): each rank's checkpoint()
    time and report bytes, the leader's storage calls, the round's wall time. All D ranks
    share this machine's cores (and one GIL): the wall time is the sum of every rank's
    work, an upper bound of what D machines would take."""
    import threading

    from zephon_core.checkpoint import codec
    from zephon_core.checkpoint.state import PipelineState
    from zephon_core.distributed.aggregate import Aggregator
    from zephon_core.distributed.storage import DirStorage
    from zephon_core.distributed.topology import Topology

    st = PipelineState.from_dict(full)
    local = []
    for d in range(D):
        lanes = {lane: ls for lane, ls in st.lanes.items() if (lane - st.position) % D == d}
        local.append(PipelineState(st.fingerprint, st.config, st.position, lanes, st.content))
    calls = [0] * D

    class Counted:
        def __init__(self, inner, d):
            self.inner, self.url, self.d = inner, inner.url, d

        def __getattr__(self, name):
            f = getattr(self.inner, name)
            if not callable(f) or name == "backoff":
                return f

            def call(*a, **k):
                calls[self.d] += 1
                return f(*a, **k)

            return call

    aggs = [
        Aggregator(Topology(d, D, d, D), Counted(DirStorage(where), d), 600.0, SCALE_LANES)
        for d in range(D)
    ]
    took, cpu = [0.0] * D, [0.0] * D

    def run(d: int) -> None:
        t, c = time.perf_counter(), time.thread_time()
        aggs[d].round(local[d])
        took[d], cpu[d] = time.perf_counter() - t, time.thread_time() - c

    threads = [threading.Thread(target=run, args=(d,)) for d in range(D)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    report = [len(codec.encode({"state": s.to_dict()})) for s in local]
    return {
        "round_s": round(wall, 3),
        "checkpoint_s_per_rank_median": round(statistics.median(took), 3),
        "cpu_s_leader": round(cpu[0], 3),
        "cpu_s_per_follower_median": round(statistics.median(cpu[1:]), 4),
        # with a machine per rank, the round's CPU is the leader's plus one follower's
        "cpu_s_critical_path": round(cpu[0] + statistics.median(cpu[1:]), 3),
        "leader_storage_calls": calls[0],
        "follower_storage_calls_median": int(statistics.median(calls[1:])),
        "report_bytes_per_rank": int(statistics.median(report)),
        "merged_bytes": len(codec.encode(full)),
    }


def _admission(full: dict, D: int) -> dict:
    """Restore admission per rank: what pipe.iterate(restore=state) checks before work."""
    import copy

    plan = _scale_pipeline().compile()
    try:
        from zephon_core.checkpoint.restore import admit_owned
    except ImportError:  # a release before issue 21: every rank admits every lane
        from zephon_core.checkpoint.restore import admit

        def admit_owned(state, plan, dp_rank, dp_size):
            return admit(state, plan)

    wall, cpu = [], []
    for d in (0, D // 2, D - 1):
        state = copy.deepcopy(full)  # as read from a file: nothing parsed yet
        t, c = time.perf_counter(), time.process_time()
        admit_owned(state, plan, d, D)
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return {
        "admission_ms_per_rank": round(1000 * statistics.median(wall), 1),
        "admission_cpu_ms_per_rank": round(1000 * statistics.median(cpu), 1),
    }


def _s3_round(full: dict, D: int) -> dict:
    """One simulated round over S3 (moto's server on 127.0.0.1 through s3fs), with the
    requests a bucket would see counted by a proxy in front of it."""
    import os

    from zephon_core.testing.s3 import FaultProxy, s3_server

    keys = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")
    saved = {k: os.environ.get(k) for k in keys}
    with s3_server("rounds") as (endpoint, _):
        proxy = FaultProxy(endpoint)
        os.environ.update(
            AWS_ENDPOINT_URL=proxy.url,
            AWS_ACCESS_KEY_ID="testing",
            AWS_SECRET_ACCESS_KEY="testing",
            AWS_DEFAULT_REGION="us-east-1",
        )
        try:
            _simulated_round(full, 2, "s3://rounds/warm-up")
            proxy.reset_counts()
            row = _simulated_round(full, D, "s3://rounds/round")
            counts = proxy.counts()
        finally:
            proxy.close()
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    row["s3_requests"] = counts["requests"]
    row["s3_gets"] = counts["gets"]
    row["s3_requests_per_s"] = round(counts["requests"] / row["round_s"])
    return row


def _per_rank(full: dict, D: int) -> dict:
    """The DCP path per rank (``distributed/dcp.py``): encoding this rank's lanes as a
    handle's ``state_dict()`` does (no round), the bytes it hands to ``dcp.save``, and
    admitting a per-rank state holding only its slots (what ``dcp.load`` fills in)."""
    import copy

    from zephon_core.checkpoint.state import PipelineState
    from zephon_core.distributed import dcp
    from zephon_core.distributed.topology import Topology

    plan = _scale_pipeline().compile()
    position = full["position"]
    enc, adm, size = [], [], []
    for d in (0, D // 2, D - 1):
        mine = [x for x in full["lanes"] if (x["lane"] - position) % D == d]
        local = PipelineState.from_dict({**copy.deepcopy(full), "lanes": mine})
        t = time.perf_counter()
        shard = dcp.encode(local, plan.num_lanes)
        enc.append(time.perf_counter() - t)
        size.append(len(shard["meta"]) + sum(len(v) for v in shard["slots"].values()))
        t = time.perf_counter()
        dcp.admit_any(shard, plan, Topology(d, D, d, D))
        adm.append(time.perf_counter() - t)
    return {
        "dcp_state_dict_ms_per_rank": round(1000 * statistics.median(enc), 2),
        "dcp_bytes_per_rank": int(statistics.median(size)),
        "dcp_admission_ms_per_rank": round(1000 * statistics.median(adm), 1),
    }


def bench_round_scale(dps: tuple[int, ...] = (8, 64, 256), s3_dp: int = 64) -> dict:
    t = time.perf_counter()
    full = _scale_state()
    out: dict = {"lanes": SCALE_LANES, "state_built_s": round(time.perf_counter() - t, 1)}
    with tempfile.TemporaryDirectory() as where:
        _simulated_round(full, 4, where)  # warm-up: imports, first calls
    for D in dps:
        with tempfile.TemporaryDirectory() as where:
            row = _simulated_round(full, D, where)
        row.update(_admission(full, D))
        row.update(_per_rank(full, D))
        out[f"D{D}"] = row
    if s3_dp:
        out[f"s3_D{s3_dp}"] = _s3_round(full, s3_dp)
    first, last = out[f"D{dps[0]}"], out[f"D{dps[-1]}"]
    for what in ("round_s", "cpu_s_critical_path"):
        out[f"{what}_ratio_D{dps[-1]}_vs_D{dps[0]}"] = round(last[what] / first[what], 2)
    return out


def _trainer_layouts() -> list[dict]:
    import bench_per_rank_layout  # it reads this module's state: imported late

    return bench_per_rank_layout.run()


def main(quick: bool = False) -> dict:
    if quick:  # the round at the smallest scale; the side-by-side pairs on short windows
        return {
            "quick": True,
            "aggregation_scale": bench_round_scale(dps=(8,), s3_dp=0),
            "state_carrying": bench_state_carrying(n=300, n_rounds=3),
            "workers": bench_workers(n=100, warmup=10, n_rounds=3),
        }
    return {
        "aggregation_scale": bench_round_scale(),
        "dcp_vs_round_processes": bench_dcp.run(1024, 2),
        "trainer_layouts": _trainer_layouts(),
        "aggregation": bench_aggregation(),
        "state_carrying": bench_state_carrying(),
        "workers": bench_workers(),
    }


#: per result key: the table's title (the docs link to the first) and its note
_FLAT = {
    "aggregation_scale": (
        "Checkpoints at 1024 lanes",
        "Simulated ranks in threads of one process (an upper bound of what D machines take). "
        "Each D is a separate configuration measured once, one after the other (no rounds): "
        "the ratios D-largest vs D-smallest are of two single measurements.",
    ),
    "dcp_vs_round_processes": (
        "dcp_vs_round_processes",
        "Real processes (bench_dcp.py), each figure measured once; no ratio is taken.",
    ),
    "trainer_layouts": ("trainer_layouts", "Sizes, and times measured once (no ratio)."),
    "aggregation": (
        "aggregation",
        "Round latency in real processes (loopback), median and max over the rounds of one "
        "run per configuration; no ratio is taken.",
    ),
}


def tables(result: dict) -> list[dict]:
    """The result as tables for ``docs/measurements.md``."""
    from report import flat_table

    quick = result.get("quick", False)
    out = [
        flat_table(title, result[key], note)
        for key, (title, note) in _FLAT.items()
        if key in result
    ]
    if "state_carrying" in result:
        sc = result["state_carrying"]
        out.append(
            {
                "title": "Carrying lane state from DataLoader workers, per batch",
                "columns": ["what", "value"],
                "rows": [
                    [
                        "CPU added per batch, us",
                        rounds.cell(sc["cost_cpu_s_per_batch"], 1, scale=1e6),
                    ],
                    ["CPU carried / plain", rounds.cell(sc["carried_vs_plain_cpu"], 3, "x")],
                    [
                        "delta pickled, bytes (median / max)",
                        f"{sc['delta_bytes_pickled_median']:,} / {sc['delta_bytes_pickled_max']:,}",
                    ],
                ],
                "note": "The reference pipeline iterated in process (no pump), with and "
                "without producing each batch's delta and applying it to a consumer's "
                "mirror; this process's CPU; the difference is taken within a round too. "
                + rounds.method(
                    len(sc["load"]),
                    sc["load"],
                    f"{sc['batches']:,} batches per variant and round after 50 of warm-up.",
                    quick,
                ),
            }
        )
    if "workers" in result:
        w = result["workers"]
        out.append(
            {
                "title": "dataloader(num_workers=2) vs num_workers=0",
                "columns": ["W=0 batches/s", "W=2 batches/s", "W=2 / W=0"],
                "rows": [
                    [
                        rounds.cell(w["W0_batches_per_s"], 0),
                        rounds.cell(w["W2_batches_per_s"], 0),
                        rounds.cell(w["speedup_W2_vs_W0"], 2, "x"),
                    ]
                ],
                "note": "The reference pipeline (byte tokens). "
                + rounds.method(
                    len(w["load"]),
                    w["load"],
                    f"{w['batches']:,} batches per variant and round after a warm-up.",
                    quick,
                ),
            }
        )
    return out


if __name__ == "__main__":
    import json
    import sys

    only_scale = sys.argv[1:] == ["scale"]
    print(json.dumps(bench_round_scale() if only_scale else main(), indent=2))
