"""``parallelism="auto"``: an operator sized to this process's share of the cores (all of
them in-process, ``cores // num_workers`` in a DataLoader worker), with the same stream."""

from __future__ import annotations

import pytest
from helpers import byte_tokenize, source

from zephon_core import Pipeline
from zephon_core.engine.cores import usable_cores
from zephon_core.errors import ConfigError
from zephon_core.testing import assert_resume_equivalent, assert_streams_equal, take


def _resolved(payload: dict) -> dict:
    """The parallelism of the "auto" fetch in the plan this process runs: a DataLoader
    worker's own (it inherits its parent's compiled plan when forked)."""
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    plan = info.dataset.spec.plan_here()
    return {"resolved": plan.ops[0].parallelism}


def _auto_pipe(p: int | str) -> Pipeline:
    return (
        Pipeline(source(8), canonical_replicas=2, flush_every_k_chunks=2, seed=1)
        .fetch(parallelism=p)
        .map(byte_tokenize, parallelism=p, name="tok")
        .split(max_len=96)
        .pack(seq_len=96, bins=2)
        .batch(batch_size=3)
    )


def test_auto_takes_the_cores_in_process_and_keeps_the_stream():
    plan = _auto_pipe("auto").compile()
    assert [op.parallelism for op in plan.ops[:2]] == [usable_cores()] * 2
    assert f"tok@p{usable_cores()}" in _auto_pipe("auto").explain()
    assert_streams_equal(take(_auto_pipe("auto"), 12), take(_auto_pipe(1), 12))


@pytest.mark.slow
def test_auto_in_a_worker_is_its_share_of_the_cores():
    pipe = Pipeline(source(4), canonical_replicas=2, seed=1).fetch("auto").map(_resolved)
    assert pipe.compile().ops[0].parallelism == usable_cores()  # the parent's plan first
    with pipe.dataloader(num_workers=2) as loader:
        seen = {out["resolved"] for out in take(loader, 4)}
    assert seen == {max(1, usable_cores() // 2)}
    with _auto_pipe("auto").dataloader(num_workers=2) as loader:
        got = take(loader, 12)
    assert_streams_equal(got, take(_auto_pipe(1), 12))


@pytest.mark.slow
@pytest.mark.parametrize("workers, resume_workers", [(0, 0), (2, 0), (0, 2)])
def test_auto_resumes_exactly_across_processes_with_other_shares(workers, resume_workers):
    """Cut in one process layout, resumed in another (where "auto" resolves to another
    number of threads): the stream continues exactly."""
    assert_resume_equivalent(
        lambda: _auto_pipe("auto"), [0, 3, 11], total=20,
        num_workers=workers, resume_num_workers=resume_workers,
    )  # fmt: skip


@pytest.mark.parametrize("bad", [0, "many", 1.5])
def test_bad_parallelism_is_a_config_error(bad):
    with pytest.raises(ConfigError, match="parallelism"):
        Pipeline(source(4), canonical_replicas=2, seed=1).fetch().map(
            byte_tokenize, parallelism=bad
        ).compile()


def test_auto_on_a_stateful_operator_is_refused_on_every_host():
    from zephon_core.ops.shuffle import ShuffleOp

    op = ShuffleOp(4)
    op.parallelism = "auto"
    pipe = Pipeline(source(4), canonical_replicas=2, seed=1).fetch().then(op)
    with pytest.raises(ConfigError, match="keeps state"):
        pipe.compile()
