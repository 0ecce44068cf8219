"""Description and run apart: a Pipeline keeps no run state, and a handle is built from a
RunSpec (plan, topology, start state, aggregator factory) alone -- no Pipeline behind it --
and still runs and resumes exactly, in this process and through DataLoader workers."""

from __future__ import annotations

import gc
import io
import pickle

import pytest
from helpers import reference_pipeline

from zephon_core import ConfigError, LifecycleError, Pipeline, PipelineIterator, ZephonDataLoader
from zephon_core.checkpoint.restore import admit
from zephon_core.checkpoint.state import PipelineState
from zephon_core.distributed.topology import Topology
from zephon_core.engine.consumer import ConsumerSteps
from zephon_core.engine.run_spec import RunSpec
from zephon_core.testing import assert_streams_equal, take

N = 6


@pytest.fixture(scope="module")
def reference() -> list:
    with reference_pipeline().iterate() as it:
        return take(it, 3 * N)


def _pipelines_inside(obj: object) -> list[Pipeline]:
    """Every Pipeline reachable from ``obj`` through what pickling it would write."""
    found: list[Pipeline] = []

    class Probe(pickle.Pickler):
        def persistent_id(self, o: object) -> None:
            if isinstance(o, Pipeline):
                found.append(o)

    Probe(io.BytesIO()).dump(obj)
    return found


def test_a_pipeline_keeps_no_run_state(reference):
    pipe = reference_pipeline()
    before = dict(vars(pipe))
    with pipe.iterate() as it:
        take(it, N)
        state = it.checkpoint()
    with ZephonDataLoader(pipe.run_spec(restore=state), num_workers=0) as loader:
        take(loader, 2)
        loader.checkpoint()
    pipe.run_spec(restore=state)
    pipe.torch_dataset()
    # the same attributes, holding the same objects: nothing was set on the description
    assert vars(pipe).keys() == before.keys()
    assert all(vars(pipe)[k] is v for k, v in before.items())
    with pytest.raises(AttributeError, match="frozen description"):
        pipe.seed = 3
    # handles built that way did not touch the conveniences: iter(pipe) starts at 0
    assert pipe.checkpoint()["position"] == 0
    assert_streams_equal(reference[:N], take(pipe, N), "iter(pipe) after other handles")
    pipe.close()


@pytest.mark.slow  # DataLoader workers
def test_a_handle_from_a_spec_alone_runs_and_resumes_exactly(reference):
    spec = reference_pipeline().run_spec()  # the pipeline is a temporary
    gc.collect()
    assert isinstance(spec, RunSpec) and _pipelines_inside(spec) == []
    with PipelineIterator(spec) as it:
        assert_streams_equal(reference[:N], take(it, N), "first part")
        state = it.checkpoint()
        assert _pipelines_inside(it.spec) == []
    resumed = spec.restarted(admit(state, spec.plan))
    with PipelineIterator(resumed) as it:
        assert_streams_equal(reference[N : 2 * N], take(it, N), "resumed in process")
    with ZephonDataLoader(resumed, num_workers=2) as loader:
        assert _pipelines_inside(loader.dataset) == []  # what workers receive
        assert_streams_equal(reference[N : 2 * N], take(loader, N), "resumed in workers")
        state = loader.checkpoint()
    with PipelineIterator(spec.restarted(admit(state, spec.plan))) as it:
        assert_streams_equal(reference[2 * N :], take(it, N), "resumed from the loader")


def test_both_handles_take_turns_through_one_consumer_core():
    spec = reference_pipeline().run_spec()
    with PipelineIterator(spec) as it, ZephonDataLoader(spec) as loader:
        passes = iter(loader)
        assert type(it).__next__ is ConsumerSteps.__next__
        assert type(passes).__next__ is ConsumerSteps.__next__
        next(it), next(passes)
        assert it.position == loader.consumer.position() == 1


def test_a_spec_without_an_aggregator_refuses_a_merged_checkpoint_by_name():
    plan = reference_pipeline().compile()
    two_ranks = Topology(rank=0, world_size=2, dp_rank=0, dp_size=2)
    with PipelineIterator(RunSpec(plan, two_ranks)) as it:
        take(it, 2)
        with pytest.raises(ConfigError, match="merge_local_checkpoints"):
            it.checkpoint()
        report = it.local_checkpoint()  # this rank's lanes need no aggregator
    assert report["dp_size"] == 2
    assert sorted(PipelineState.from_dict(report["state"]).lanes) == [0, 2]


def test_a_closed_handle_from_a_spec_says_how_to_continue():
    it = PipelineIterator(reference_pipeline().run_spec())
    take(it, 1)
    it.close()
    with pytest.raises(LifecycleError, match=r"restore=it.checkpoint\(\)"):
        next(it)
