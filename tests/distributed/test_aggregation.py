"""Multi-rank checkpoint aggregation with real processes (docs/design.md §8,
"Aggregation").

Every rank is its own Python process (``agg_worker.py``), talking over loopback only:
gloo process groups / TCPStores on free ports, FileStores and coordination
directories under ``tmp_path``. Ranks synchronise only through files (barriers
before ``checkpoint()`` so that the round's time budget can be measured); the
parent guards every test with an overall timeout and kills what it started.

Time: the only limits asserted are the budgets of the code under test, measured from
where that budget starts (``Aggregator.round``, see ``agg_worker.py``), never from a
process launch: a rank that waits out a short budget must give up, and not much later
(``SLACK_S``). Rounds that must succeed, or fail at once on a notice, get a budget
(``AMPLE_S``) no loaded machine exhausts: what decides is the error they end with. The
guard is a hang guard only (``helpers.hang_guard_s``), and its failure shows each rank's
progress and stacks.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import hang_guard_s, reference_pipeline, timeout_scale, worker_env

from zephon_core.checkpoint import codec
from zephon_core.checkpoint.state import PipelineState
from zephon_core.distributed.aggregate import is_notice, report_from_dict
from zephon_core.testing import first_difference, take

# every test here starts processes (see tests/conftest.py)
pytestmark = pytest.mark.slow

WORKER = Path(__file__).resolve().with_name("agg_worker.py")
K1, K2 = 3, 2  # outputs per rank before the first / second round
CONTINUE = 6  # outputs compared after restoring a merged state
# how much later than its budget a rank that waited it out may give up (its last storage
# calls, the failure notice); measured from the start of the round, not of the process
SLACK_S = 10.0 * timeout_scale()
AMPLE_S = hang_guard_s(120.0)  # the budget of a round that must not time out
GUARD_S = hang_guard_s(300.0)  # hang guard for one group of processes


# -- running ranks ----------------------------------------------------------------------
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Ranks:
    """A group of rank processes started together, each described by a JSON spec."""

    def __init__(self, root: Path, name: str):
        self.root = root
        self.dir = root / name
        self.dir.mkdir()
        self.sync = root / "sync"
        self.sync.mkdir(exist_ok=True)
        self.specs: dict[str, dict] = {}
        self.env: dict[str, str] = {}  # extra environment of the rank processes
        self.prefix: list[str] = []  # a command that runs each rank (e.g. nsenter ...)

    def add(self, tag: str, rank: int, world: int, *, rounds: list[dict], **spec) -> None:
        self.specs[tag] = dict(
            tag=tag,
            rank=rank,
            world=world,
            rounds=rounds,
            sync=str(self.sync),
            out=str(self.dir / f"{tag}.pkl"),
            deadline_s=GUARD_S - 30,  # the rank's own barriers give up, its stacks print
            **spec,
        )

    def run(self, guard_s: float = GUARD_S) -> dict[str, dict]:
        procs = {}
        env = worker_env(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **self.env)
        try:
            for tag, spec in self.specs.items():
                path = self.dir / f"{tag}.json"
                path.write_text(json.dumps(spec))
                procs[tag] = subprocess.Popen(
                    [*self.prefix, sys.executable, str(WORKER), str(path)],
                    env=env,
                    stdout=open(self.dir / f"{tag}.stdout", "wb"),
                    stderr=open(self.dir / f"{tag}.stderr", "wb"),
                )
            deadline = time.monotonic() + guard_s
            for proc in procs.values():
                try:
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pytest.fail(
                        f"rank processes still running after {guard_s:.0f} s (hang guard): "
                        f"{[t for t, p in procs.items() if p.poll() is None]}\n"
                        + self._tails("stdout", 1000)
                        + "\n"
                        + self._tails("stderr", 6000)
                    )
        finally:
            for proc in procs.values():  # only the processes this helper started
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        results = {}
        for tag, proc in procs.items():
            out = Path(self.specs[tag]["out"])
            log = pickle.loads(out.read_bytes()) if out.exists() else None
            results[tag] = {"returncode": proc.returncode, "log": log}
        return results

    def _tails(self, stream: str = "stderr", chars: int = 2000) -> str:
        """The end of every rank's stdout (its progress) or stderr (errors, stacks)."""
        parts = []
        for tag in self.specs:
            p = self.dir / f"{tag}.{stream}"
            if p.exists():
                parts.append(f"--- {tag} {stream} ---\n" + p.read_text(errors="replace")[-chars:])
        return "\n".join(parts)

    def logs(self, results: dict, *, killed: tuple[str, ...] = ()) -> dict[str, dict]:
        """The logs of every rank; all must have exited cleanly except the ``killed`` ones."""
        logs = {}
        for tag, res in results.items():
            if tag in killed:
                assert res["returncode"] == -signal.SIGKILL, (
                    f"{tag} should have been killed by SIGKILL, exit code {res['returncode']}"
                )
                continue
            assert res["returncode"] == 0 and res["log"] is not None, (
                f"{tag} exited with {res['returncode']}\n{self._tails()}"
            )
            assert "crash" not in res["log"], f"{tag} crashed:\n{res['log']['crash']}"
            logs[tag] = res["log"]
        return logs


# -- the single-process reference -------------------------------------------------------
_REF: dict = {}


def reference():
    """Outputs and checkpoints of one plain process (no bind, no aggregation)."""
    if not _REF:
        positions = {6, 10, 12, 20}
        p = reference_pipeline()
        it = iter(p)
        outs, states = [], {0: p.checkpoint()}
        for g in range(1, 20 + CONTINUE + 1):
            outs.append(next(it))
            if g in positions:
                states[g] = p.checkpoint()
        p.close()
        _REF.update(outputs=outs, states=states)
    return _REF


def assert_same(expected, got, what: str) -> None:
    d = first_difference(expected, got)
    assert d is None, f"{what}: differs at {d}"


def assert_restores_to_global_stream(state: dict, position: int) -> None:
    """A merged state, restored into one plain process, continues the global stream."""
    ref = reference()["outputs"]
    p = reference_pipeline()
    p.load_state_dict(state)
    got = take(p, CONTINUE)
    p.close()
    assert_same(
        ref[position : position + CONTINUE],
        got,
        f"single process resumed from the merged state at position {position}",
    )


# -- coordination directory checks --------------------------------------------------------
def assert_files_complete(files: dict[str, bytes], where: str) -> None:
    """Every file is a complete, decodable protocol file; no temporary files."""
    for name, data in files.items():
        assert ".tmp" not in name and not name.startswith("."), (
            f"{where}: temporary file {name!r} left in the coordination directory"
        )
        if name == "announce":  # a round id, or empty: a leader that could not write one
            assert not data or re.fullmatch(r"\d+-[0-9a-f]{12}", data.decode()), data
        elif name.endswith(".merged"):
            if not is_notice(data):
                PipelineState.from_dict(codec.decode(data))
        elif ".state." in name:
            report_from_dict(codec.decode(data))
        elif ".ack." in name:
            assert data, f"{where}: empty ack {name!r}"
        else:
            pytest.fail(f"{where}: unexpected file {name!r} in the coordination directory")


def dir_files(d: Path) -> dict[str, bytes]:
    return {n: (d / n).read_bytes() for n in sorted(os.listdir(d))}


def err(entry: dict) -> str:
    return f"{entry.get('error_type')}: {entry.get('error')}"


def assert_failed(entry: dict, error_type: str, what: str) -> None:
    assert entry["called"] and not entry.get("ok"), (
        f"{what}: checkpoint() should have raised {error_type}, it returned a state"
    )
    assert error_type in entry["error_mro"], (
        f"{what}: expected {error_type}, got {err(entry)}\n{entry.get('tb', '')}"
    )


def assert_ok(entry: dict, what: str) -> None:
    assert entry.get("ok"), f"{what}: checkpoint() failed: {err(entry)}\n{entry.get('tb', '')}"


def round_s(entry: dict, what: str) -> float:
    """Seconds from the start of the round's budget to checkpoint()'s return or raise."""
    assert entry.get("round_s") is not None, f"{what}: no aggregation round began: {err(entry)}"
    return entry["round_s"]


def assert_gave_up_within_budget(entry: dict, what: str, *, waited: bool = False) -> None:
    """The rank gave up not much later than its budget (and, ``waited``, not before it)."""
    took, budget = round_s(entry, what), entry["budget"]
    assert took <= budget + SLACK_S, (
        f"{what}: gave up {took:.2f} s into a round whose budget is {budget} s "
        f"(allowed: {SLACK_S} s more)"
    )
    if waited:
        assert took >= budget - 0.25, f"{what}: gave up after {took:.2f} s, budget {budget} s"


def assert_failed_at_once(entry: dict, what: str) -> None:
    """The rank failed on a check or a notice, without waiting out its (ample) budget."""
    took, budget = round_s(entry, what), entry["budget"]
    assert took < budget / 2, (
        f"{what}: failed only after {took:.2f} s of its {budget} s budget: {err(entry)}"
    )


def reported_at(log: dict, rank: int) -> float:
    """When the rank's report (``<round id>.state.<rank>``) was written (inf: never)."""
    times = [t for key, t in log.get("put_times", []) if key.endswith(f".state.{rank}")]
    return min(times, default=float("inf"))


# -- 1 + 4: successful rounds over a directory and over torch.distributed's TCPStore -------
# (backend, world size, dp size): dp == world uses torch.distributed's topology as is;
# dp < world binds model-parallel peers (ranks r and r+1 share dp rank r // 2).
SCENARIOS = [
    ("dir", 2, 2),
    ("dir", 4, 4),
    ("torch", 2, 2),
    ("torch", 4, 4),
    ("default", 2, 2),
    ("dir", 4, 2),
]
_RUNS: dict = {}


def scenario(tmp_path_factory, backend: str, world: int, dp: int):
    key = (backend, world, dp)
    if key not in _RUNS:
        root = tmp_path_factory.mktemp(f"agg-{backend}-{world}-{dp}")
        agg_dir = root / "agg"
        ranks = Ranks(root, "procs")
        port = free_port()
        tags = [f"r{r}" for r in range(world)]
        for r in range(world):
            spec = dict(
                backend=backend,
                timeout=AMPLE_S,
                init_pg=True,
                port=port,
                exit_tags=tags if backend != "dir" else [],
            )
            if backend == "dir":
                spec["agg_dir"] = str(agg_dir)
            if dp != world:
                spec["bind"] = dict(rank=r, world_size=world, dp_rank=r * dp // world, dp_size=dp)
            ranks.add(
                f"r{r}",
                r,
                world,
                rounds=[
                    dict(take=K1, barrier="b1", barrier_tags=tags),
                    dict(take=K2, barrier="b2", barrier_tags=tags),
                ],
                **spec,
            )
        results = ranks.run()
        _RUNS[key] = (ranks.logs(results), agg_dir)
    return _RUNS[key]


def _id(s) -> str:
    return f"{s[0]}-world{s[1]}-dp{s[2]}"


@pytest.mark.parametrize("backend,world,dp", SCENARIOS, ids=map(_id, SCENARIOS))
def test_every_rank_gets_the_single_process_state(tmp_path_factory, backend, world, dp):
    logs, _ = scenario(tmp_path_factory, backend, world, dp)
    ref = reference()
    for i, pos in enumerate((dp * K1, dp * (K1 + K2))):
        states = []
        for tag, log in logs.items():
            entry = log["rounds"][i]
            assert_ok(entry, f"{tag} round {i + 1}")
            states.append(entry["state"])
        for tag, st in zip(logs, states):
            assert_same(states[0], st, f"round {i + 1}: merged state of {tag} vs r0")
        assert states[0]["position"] == pos
        assert_same(
            ref["states"][pos],
            states[0],
            f"round {i + 1}: merged state vs single process after {pos} outputs",
        )
        assert_restores_to_global_stream(states[0], pos)

    # the ranks' outputs interleave into the single-process stream (dp rank d takes
    # global positions d, d+D, ...; model-parallel peers see identical data)
    per_dp: dict[int, list] = {}
    for r in range(world):
        outs = [o for rnd in logs[f"r{r}"]["outputs"] for o in rnd]
        d = r * dp // world
        if d in per_dp:
            assert_same(per_dp[d], outs, f"model-parallel peer r{r} vs its dp group")
        per_dp[d] = outs
    stream = [per_dp[d][i] for i in range(K1 + K2) for d in range(dp)]
    assert_same(ref["outputs"][: dp * (K1 + K2)], stream, "interleaved rank outputs")


@pytest.mark.parametrize("backend,world,dp", SCENARIOS, ids=map(_id, SCENARIOS))
def test_round_leaves_only_the_merged_marker(tmp_path_factory, backend, world, dp):
    logs, agg_dir = scenario(tmp_path_factory, backend, world, dp)
    leader = logs["r0"]
    merged_names = []
    for i, entry in enumerate(leader["rounds"]):
        assert_ok(entry, f"leader round {i + 1}")
        if backend == "dir":
            files = entry["dir_after"]
            assert len(files) == 1 and next(iter(files)).endswith(".merged"), (
                f"after round {i + 1} the directory should hold only '<rid>.merged', "
                f"found {sorted(files)}"
            )
            name, data = next(iter(files.items()))
            assert_same(
                entry["state"],
                codec.decode(data),
                f"round {i + 1}: marker {name} vs the returned merged state",
            )
            merged_names.append(name)
        else:
            live = entry["store_live"]
            assert len(live) == 1 and live[0].endswith(".merged"), (
                f"after round {i + 1} the store should hold only '<rid>.merged' of this "
                f"round, found {live}"
            )
            merged_names.append(live[0])
    assert merged_names[0] != merged_names[1], "each round needs its own round id"
    if backend == "dir":
        assert os.listdir(agg_dir) == [], (
            f"after every rank's close() the directory must be empty: {os.listdir(agg_dir)}"
        )
    else:
        assert leader["store_live_after_close"] == [], (
            f"after close() protocol keys remain in the store: {leader['store_live_after_close']}"
        )


# -- 2: an explicit Store object, ranks given by bind(), no process group ----------------
@pytest.mark.parametrize("kind", ["tcpstore", "filestore"])
def test_explicit_store_object_with_bind(tmp_path, kind):
    ranks = Ranks(tmp_path, "procs")
    port, world = free_port(), 2
    tags = ["r0", "r1"]
    for r in range(world):
        ranks.add(
            f"r{r}",
            r,
            world,
            backend=kind,
            timeout=AMPLE_S,
            port=port,
            filestore=str(tmp_path / "filestore"),
            exit_tags=tags,
            bind=dict(rank=r, world_size=world),
            rounds=[
                dict(take=K1, barrier="b1", barrier_tags=tags),
                dict(take=K2, barrier="b2", barrier_tags=tags),
            ],
        )
    logs = ranks.logs(ranks.run())
    ref = reference()
    for i, pos in enumerate((world * K1, world * (K1 + K2))):
        for tag in tags:
            assert_ok(logs[tag]["rounds"][i], f"{tag} round {i + 1}")
            assert_same(
                ref["states"][pos],
                logs[tag]["rounds"][i]["state"],
                f"{tag} round {i + 1}: merged state vs single process",
            )
        live = logs["r0"]["rounds"][i]["store_live"]
        assert len(live) == 1 and live[0].endswith(".merged"), live
    assert logs["r0"]["store_live_after_close"] == []
    assert_restores_to_global_stream(logs["r1"]["rounds"][1]["state"], world * (K1 + K2))


# -- 3: faults ---------------------------------------------------------------------------
def fault_ranks(
    tmp_path: Path,
    world: int,
    timeout: float,
    *,
    per_rank=None,
    name="procs",
    agg_dir: Path | None = None,
    take: int = K1,
) -> Ranks:
    """``world`` ranks over a directory, bound with bind(rank, world_size), one round after
    a barrier; ``per_rank[r]`` overrides the spec of rank r (and of its round via 'round')."""
    ranks = Ranks(tmp_path, name)
    tags = [f"r{r}" for r in range(world)]
    for r in range(world):
        over = dict((per_rank or {}).get(r, {}))
        rnd = dict(take=take, barrier="b1", barrier_tags=tags)
        rnd.update(over.pop("round", {}))
        spec = dict(
            backend="dir",
            agg_dir=str(agg_dir or tmp_path / "agg"),
            timeout=timeout,
            bind=dict(rank=r, world_size=world),
        )
        spec.update(over)
        ranks.add(f"r{r}", r, world, rounds=[rnd], **spec)
    return ranks


def test_rank_that_never_checkpoints_is_named_within_the_budget(tmp_path):
    timeout, world = 4.0, 4
    # start at global position 6 (restored), so rank 3 owns lane 1 and ranks != lanes
    start = tmp_path / "start.ckpt"
    codec.write_atomic(start, codec.encode(reference()["states"][6]))
    ranks = fault_ranks(
        tmp_path,
        world,
        timeout,
        per_rank={
            r: dict(restore=str(start), **({"round": {"skip": True}} if r == 3 else {}))
            for r in range(world)
        },
    )
    logs = ranks.logs(ranks.run())

    lead = logs["r0"]["rounds"][0]
    assert_failed(lead, "AggregationError", "leader")
    assert_gave_up_within_budget(lead, "leader", waited=True)
    msg = lead["error"]
    found = re.search(r"\branks \[([\d, ]+)\] never reported", msg)
    assert found, f"the error must name the missing ranks: {msg}"
    named = {int(r) for r in found.group(1).split(",")}
    assert "rank 3 owns lanes [1]" in msg, f"the error must name rank 3's lane 1: {msg}"
    # ranks 1 and 2 report at once; only a report that a loaded machine delayed past the
    # leader's deadline may be named with rank 3's
    deadline = lead["round_start"] + lead["budget"]
    on_time = {r for r in (1, 2) if reported_at(logs[f"r{r}"], r) < deadline}
    assert 3 in named and not named & on_time, (
        f"named {sorted(named)}; ranks {sorted(on_time)} had reported in time: {msg}"
    )
    for tag in ("r1", "r2"):
        entry = logs[tag]["rounds"][0]
        assert_failed(entry, "AggregationError", tag)
        assert_gave_up_within_budget(entry, tag)
    assert_files_complete(dir_files(tmp_path / "agg"), "after the failed round")


def test_leader_failure_notice_makes_followers_fail_fast(tmp_path):
    world = 2
    ranks = fault_ranks(tmp_path, world, AMPLE_S, per_rank={0: dict(faults=["merge_raises"])})
    logs = ranks.logs(ranks.run())
    lead = logs["r0"]["rounds"][0]
    assert_failed(lead, "RuntimeError", "leader")
    assert "injected merge failure" in lead["error"]
    fol = logs["r1"]["rounds"][0]
    assert_failed(fol, "AggregationError", "follower")
    assert "injected merge failure" in fol["error"], (
        f"the follower's error must carry the leader's failure notice: {fol['error']}"
    )
    assert_failed_at_once(fol, "the follower, despite the failure notice")
    files = dir_files(tmp_path / "agg")
    assert_files_complete(files, "after the failed round")
    assert not [n for n in files if ".state." in n or n == "announce"], (
        f"a failed round must not leave states or an open announcement: {sorted(files)}"
    )


# rank 1 serves the lanes of dp rank 2 but reports as dp rank 1
LIAR = dict(
    bind=dict(rank=1, world_size=4, dp_rank=2, dp_size=4),
    round=dict(declare=dict(rank=1, world_size=4, dp_rank=1, dp_size=4)),
)
OTHER_LAYOUT = dict(bind=dict(rank=3, world_size=4, dp_rank=1, dp_size=2))
MISMATCHES = {
    # rank 3 runs with dp_size 2 while the leader (and everyone else) uses dp_size 4 ...
    "other_dp_layout": (4, {3: OTHER_LAYOUT}),
    # ... and took twice the outputs, so that its global position agrees with the others
    "other_dp_layout_same_position": (4, {3: dict(OTHER_LAYOUT, round=dict(take=2 * K1))}),
    # rank 1 reports lanes of another rank; it only writes its state once ranks 2 and 3
    # have joined the round (the late-joiner case is test_follower_joining_after_...)
    "lanes_of_another_rank": (
        4,
        {
            1: dict(
                LIAR, round=dict(LIAR["round"], wait_files=["announce_read.r2", "announce_read.r3"])
            ),
            2: dict(faults=["signal_announce_read"]),
            3: dict(faults=["signal_announce_read"]),
        },
    ),
    # rank 1 reports only one of the two lanes its dp rank owns
    "incomplete_lanes": (2, {1: dict(faults=["drop_last_lane"])}),
}


@pytest.mark.parametrize("case", list(MISMATCHES))
def test_lane_mapping_mismatch_raises_topology_error_at_once(tmp_path, case):
    world, per_rank = MISMATCHES[case]
    ranks = fault_ranks(tmp_path, world, AMPLE_S, per_rank=per_rank)
    logs = ranks.logs(ranks.run())
    lead = logs["r0"]["rounds"][0]
    assert_failed(lead, "TopologyError", "leader")
    assert_failed_at_once(lead, "the leader (a mismatch must raise at once, not wait)")
    for r in range(1, world):
        entry = logs[f"r{r}"]["rounds"][0]
        assert_failed(entry, "AggregationError", f"r{r}")
        assert "TopologyError" in entry["error"], (
            f"r{r} should fail with the leader's failure notice: {entry['error']}"
        )
        assert_failed_at_once(entry, f"r{r}")


def test_follower_joining_after_the_leader_failed_gets_the_notice(tmp_path):
    """The leader fails the round on rank 1's report before ranks 2 and 3 called
    checkpoint(); they must still fail at once with the failure notice, not wait out
    their budget (in practice this is a race of milliseconds between the ranks)."""
    world = 4
    late = dict(round=dict(barrier=None, wait_files=["leader_done"]))
    ranks = fault_ranks(
        tmp_path,
        world,
        AMPLE_S,
        per_rank={
            0: dict(
                round=dict(barrier="b01", barrier_tags=["r0", "r1"], signal_after="leader_done")
            ),
            1: dict(LIAR, round=dict(LIAR["round"], barrier="b01", barrier_tags=["r0", "r1"])),
            2: late,
            3: late,
        },
    )
    logs = ranks.logs(ranks.run())
    assert_failed(logs["r0"]["rounds"][0], "TopologyError", "leader")
    for r in (1, 2, 3):
        entry = logs[f"r{r}"]["rounds"][0]
        assert_failed(entry, "AggregationError", f"r{r}")
        assert "TopologyError" in entry["error"], (
            f"r{r} should fail with the leader's failure notice, it got: {entry['error']}"
        )
        assert_failed_at_once(entry, f"r{r}")


def test_model_parallel_peers_that_disagree_are_rejected(tmp_path):
    world, dp = 4, 2
    per_rank = {
        r: dict(bind=dict(rank=r, world_size=world, dp_rank=r // 2, dp_size=dp))
        for r in range(world)
    }
    per_rank[3]["faults"] = ["diverge_cursor"]
    ranks = fault_ranks(tmp_path, world, AMPLE_S, per_rank=per_rank)
    logs = ranks.logs(ranks.run())
    lane = logs["r3"]["diverged_lane"]
    lead = logs["r0"]["rounds"][0]
    assert_failed(lead, "IncompatibleCheckpoint", "leader")
    assert re.search(rf"\blane {lane}\b", lead["error"]), (
        f"the error must name lane {lane}: {lead['error']}"
    )
    assert_failed_at_once(lead, "leader")
    for r in (1, 2, 3):
        entry = logs[f"r{r}"]["rounds"][0]
        assert_failed(entry, "AggregationError", f"r{r}")
        assert "IncompatibleCheckpoint" in entry["error"] and f"lane {lane}" in entry["error"]
        assert_failed_at_once(entry, f"r{r}")


def test_ranks_at_different_steps_are_rejected(tmp_path):
    world = 2
    ranks = fault_ranks(tmp_path, world, AMPLE_S, per_rank={1: dict(round=dict(take=K1 + 1))})
    logs = ranks.logs(ranks.run())
    lead = logs["r0"]["rounds"][0]
    assert_failed(lead, "IncompatibleCheckpoint", "leader")
    assert "different steps" in lead["error"], lead["error"]
    assert_failed_at_once(lead, "leader")
    fol = logs["r1"]["rounds"][0]
    assert_failed(fol, "AggregationError", "follower")
    assert "different steps" in fol["error"], fol["error"]
    assert_failed_at_once(fol, "follower")


def test_follower_killed_mid_round_then_a_replacement_completes_the_next_round(tmp_path):
    timeout, world = 4.0, 2
    agg = tmp_path / "agg"
    ranks = Ranks(tmp_path, "procs")
    common = dict(backend="dir", agg_dir=str(agg), timeout=AMPLE_S)
    # the leader: round 1 with the doomed follower (it waits out its budget for the ack),
    # round 2 (same position) with the replacement, which only joins once round 1 is over
    ranks.add(
        "r0",
        0,
        world,
        bind=dict(rank=0, world_size=world),
        rounds=[
            dict(take=K1, barrier="b1", barrier_tags=["r0", "r1"], budget=timeout),
            dict(take=0, barrier="b2", barrier_tags=["r0", "r1new"]),
        ],
        **common,
    )
    ranks.add(
        "r1",
        1,
        world,
        bind=dict(rank=1, world_size=world),
        faults=["kill_after_state_write"],
        rounds=[dict(take=K1, barrier="b1", barrier_tags=["r0", "r1"])],
        **common,
    )
    ranks.add(
        "r1new",
        1,
        world,
        bind=dict(rank=1, world_size=world),
        rounds=[dict(take=K1, barrier="b2", barrier_tags=["r0", "r1new"])],
        **common,
    )
    logs = ranks.logs(ranks.run(), killed=("r1",))

    first, second = logs["r0"]["rounds"]
    assert_failed(first, "AggregationError", "leader, round with the killed follower")
    assert re.search(r"\b1\b", first["error"]), f"the error must name rank 1: {first['error']}"
    assert_gave_up_within_budget(first, "leader, round with the killed follower", waited=True)
    assert_files_complete(first["dir_after"], "right after the failed round")
    failed_markers = [n for n in first["dir_after"] if n.endswith(".merged")]

    assert_ok(second, "leader, next round")
    assert_ok(logs["r1new"]["rounds"][0], "replacement follower, next round")
    pos = world * K1
    assert_same(reference()["states"][pos], second["state"], "next round vs single process")
    assert_same(second["state"], logs["r1new"]["rounds"][0]["state"], "replacement vs leader")
    assert_files_complete(second["dir_after"], "after the next round")
    stale = [n for n in failed_markers if n in second["dir_after"]]
    assert not stale, (
        f"the failed round's merged marker {stale} must be deleted once the next round has "
        f"been fully acknowledged; directory: {sorted(second['dir_after'])}"
    )
    left = dir_files(agg)
    assert_files_complete(left, "after shutdown")
    assert not [n for n in left if n.endswith(".merged") or n == "announce"], (
        f"merged markers / announcements left after every rank shut down: {sorted(left)}"
    )


def test_leader_killed_mid_round_then_restarted_ranks_complete_a_round(tmp_path):
    timeout, world = 4.0, 2
    agg = tmp_path / "agg"
    # the leader completes a round, then dies in the next one right after writing its own
    # state: the follower, which joins that round once it is announced, must give up with
    # a clear AggregationError within its budget
    ranks = Ranks(tmp_path, "crash")
    tags = ["r0", "r1"]
    common = dict(backend="dir", agg_dir=str(agg), timeout=AMPLE_S)
    ranks.add(
        "r0",
        0,
        world,
        bind=dict(rank=0, world_size=world),
        faults=["kill_after_state_write"],
        kill_round=2,
        signal_puts={"announce": "announced"},
        rounds=[dict(take=K1, barrier="b1", barrier_tags=tags), dict(take=K2)],
        **common,
    )
    ranks.add(
        "r1",
        1,
        world,
        bind=dict(rank=1, world_size=world),
        rounds=[
            dict(take=K1, barrier="b1", barrier_tags=tags),
            dict(take=K2, wait_files=["announced.2"], budget=timeout),
        ],
        **common,
    )
    logs = ranks.logs(ranks.run(), killed=("r0",))
    assert_ok(logs["r1"]["rounds"][0], "follower, the round before the leader died")
    fol = logs["r1"]["rounds"][1]
    assert_failed(fol, "AggregationError", "follower of the killed leader")
    assert_gave_up_within_budget(fol, "follower of the killed leader", waited=True)
    assert "still open" in fol["error"] and "rank 0 died" in fol["error"], fol["error"]
    left = dir_files(agg)
    assert_files_complete(left, "after the leader was killed")
    assert [n for n in left if n.endswith(".merged")] and [n for n in left if ".state.0" in n], (
        f"the killed leader should have left its last merged marker and its state: {left}"
    )

    # restart both ranks on the same directory; the follower looks for a round before
    # the new leader announces one (what a restart usually looks like)
    ranks = Ranks(tmp_path, "restart")
    ranks.add(
        "n0",
        0,
        world,
        bind=dict(rank=0, world_size=world),
        **common,
        rounds=[dict(take=K1, wait_files=["announce_polled.n1"])],
    )
    ranks.add(
        "n1",
        1,
        world,
        bind=dict(rank=1, world_size=world),
        **common,
        faults=["signal_first_announce_poll"],
        rounds=[dict(take=K1)],
    )
    logs = ranks.logs(ranks.run())
    entries = {tag: logs[tag]["rounds"][0] for tag in ("n0", "n1")}
    assert all(e.get("ok") for e in entries.values()), (
        "the restarted ranks could not complete a round after the leader was killed: "
        + "; ".join(f"{t}: {err(e)}" for t, e in entries.items() if not e.get("ok"))
    )
    for tag in ("n0", "n1"):
        assert_same(
            reference()["states"][world * K1],
            logs[tag]["rounds"][0]["state"],
            f"restarted {tag}: merged state vs single process",
        )
    left = dir_files(agg)
    assert_files_complete(left, "after the restarted ranks shut down")
    assert not left, (
        "a later successful job must remove what the killed leader left (its round's "
        f"states, its merged marker): {sorted(left)}"
    )
