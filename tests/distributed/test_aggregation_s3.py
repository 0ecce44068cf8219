"""Aggregation rounds through object storage: ``aggregate_dir="s3://..."`` against a real
S3-compatible server (moto's, on 127.0.0.1) reached through s3fs, with several real rank
processes -- a plain round, a leader killed mid-round followed by restarted ranks, and a
PUT storm (503 SlowDown from a proxy) that must not keep any rank past its budget."""

from __future__ import annotations

import pytest
from helpers import hang_guard_s, s3_server
from test_aggregation import (
    AMPLE_S,
    K1,
    assert_failed,
    assert_files_complete,
    assert_gave_up_within_budget,
    assert_same,
    err,
    fault_ranks,
    reference,
)

from zephon_core.testing.s3 import FaultProxy

# every test here starts processes (see tests/conftest.py)
pytestmark = pytest.mark.slow

BUCKET = "coordination"


@pytest.fixture(scope="module")
def s3():
    import s3fs

    with s3_server(BUCKET) as (endpoint, options):
        env = {
            "AWS_ENDPOINT_URL": endpoint,  # how a user points s3fs at an endpoint
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
        yield s3fs.S3FileSystem(**options), env, endpoint


def _files(fs, prefix: str) -> dict[str, bytes]:
    fs.invalidate_cache()
    return {p.rsplit("/", 1)[-1]: fs.cat(p) for p in fs.find(f"{BUCKET}/{prefix}")}


def _all_ranks_merged(logs: dict, world: int, what: str) -> None:
    for r in range(world):
        entry = logs[f"r{r}"]["rounds"][0]
        assert entry.get("ok"), err(entry)
        assert_same(reference()["states"][world * K1], entry["state"], f"{what} rank {r}")


def test_a_round_through_s3_merges_every_rank(tmp_path, s3):
    fs, env, _ = s3
    world = 2
    ranks = fault_ranks(tmp_path, world, AMPLE_S, agg_dir=f"s3://{BUCKET}/plain")
    ranks.env = env
    _all_ranks_merged(ranks.logs(ranks.run()), world, "via s3:")
    assert_files_complete(_files(fs, "plain"), "after a round through s3")


def test_leader_killed_mid_round_on_s3_then_restarted_ranks_complete(tmp_path, s3):
    fs, env, _ = s3
    timeout, world = 4.0, 2
    agg = f"s3://{BUCKET}/killed"
    # the follower joins once the round is announced, with a short budget that it waits
    # out; the leader (an ample budget: it must get as far as writing its own state,
    # however loaded the machine) dies right after writing its own state
    ranks = fault_ranks(
        tmp_path,
        world,
        AMPLE_S,
        agg_dir=agg,
        name="crash",
        per_rank={
            0: dict(
                faults=["kill_after_state_write"],
                signal_puts={"announce": "announced"},
                round=dict(barrier=None),
            ),
            1: dict(round=dict(barrier=None, wait_files=["announced.1"], budget=timeout)),
        },
    )
    ranks.env = env
    logs = ranks.logs(ranks.run(), killed=("r0",))
    fol = logs["r1"]["rounds"][0]
    assert_failed(fol, "AggregationError", "follower of the killed leader (s3)")
    assert "still open" in fol["error"], fol["error"]
    assert_gave_up_within_budget(fol, "follower of the killed leader (s3)", waited=True)
    assert_files_complete(_files(fs, "killed"), "after the leader was killed (s3)")
    ranks = fault_ranks(tmp_path, world, AMPLE_S, agg_dir=agg, name="restart")
    ranks.env = env
    _all_ranks_merged(ranks.logs(ranks.run()), world, "restarted:")
    left = _files(fs, "killed")
    assert not left, f"the restarted job must remove the killed round's files: {sorted(left)}"


# what each storm throttles, and what the follower then knows about the leader
STORMS = {
    "announce": ("announce", "did not announce"),
    "publish": (".merged", "closed it (every rank had reported) but published no merged"),
}


@pytest.mark.parametrize("storm", list(STORMS))
def test_a_put_storm_keeps_every_rank_within_its_budget(tmp_path, s3, storm):
    """s3fs and botocore retry 503 SlowDown for far longer than a round may last: the
    leader's storage calls are cut at the round's deadline, and the follower's error says
    what it saw (no announcement / a round closed but never published), pointing at the
    storage instead of at rank 0 not calling checkpoint()."""
    fs, env, endpoint = s3
    suffix, follower_knows = STORMS[storm]
    timeout, world = 4.0, 2
    # a publish storm needs the follower's report to reach the leader before the leader's
    # deadline: the leader's budget leaves a loaded machine time for that
    leader = dict(round=dict(budget=timeout if storm == "announce" else hang_guard_s(15.0)))
    proxy = FaultProxy(
        endpoint,
        fail=10**9,
        throttle=lambda method, path: method == "PUT" and path.split("?")[0].endswith(suffix),
    )
    try:
        ranks = fault_ranks(
            tmp_path, world, timeout, agg_dir=f"s3://{BUCKET}/storm-{storm}", per_rank={0: leader}
        )
        ranks.env = dict(env, AWS_ENDPOINT_URL=proxy.url)
        logs = ranks.logs(ranks.run())
    finally:
        proxy.close()
    assert proxy.failed > 0, "the storm never hit"
    lead, fol = logs["r0"]["rounds"][0], logs["r1"]["rounds"][0]
    assert_failed(lead, "AggregationError", "leader in a PUT storm")
    assert "slow or throttling" in lead["error"], lead["error"]
    assert_failed(fol, "AggregationError", "follower in a PUT storm")
    assert follower_knows in fol["error"] and "throttled" in fol["error"], fol["error"]
    for tag, entry in (("leader", lead), ("follower", fol)):
        assert_gave_up_within_budget(entry, f"the {tag} in a PUT storm")
