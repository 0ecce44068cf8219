"""``skip_batches`` at a restore (``checkpoint/data_changes.py``): the skipped outputs are
produced but handed to no one, every later output is the uninterrupted run's, and the
decision is recorded so that later resumes repeat it -- in process, through DataLoader
workers and with several data-parallel ranks in lockstep.
"""

from __future__ import annotations

import itertools

import pytest
from helpers import reference_pipeline

from zephon_core.checkpoint import codec
from zephon_core.checkpoint.data_changes import skipped_ranges, step_positions
from zephon_core.errors import ConfigError, CorruptCheckpoint, IncompatibleCheckpoint
from zephon_core.testing import SimulatedRanks
from zephon_core.testing.resume import assert_streams_equal, reseed_globals

TOTAL = 30
SKIP = [(9, 12)]  # three outputs, after the first resume (position 5)
ALLOW = {"allow_changes": {"skip"}}


def _take(it, n: int) -> list:
    return list(itertools.islice(it, n))


def _through_bytes(state: dict) -> dict:
    return codec.decode(codec.encode(state))


@pytest.fixture(scope="module")
def full() -> list:
    it = reference_pipeline().iterate()
    out = _take(it, TOTAL)
    it.close()
    return out


def _without(stream: list, ranges) -> list:
    """The uninterrupted stream minus the skipped positions."""
    return [b for g, b in enumerate(stream) if not any(s <= g < e for s, e in ranges)]


def _iterate_segment(state, n, **kw):
    it = reference_pipeline().iterate(restore=state, **kw)
    out = _take(it, n)
    state = _through_bytes(it.checkpoint())
    it.close()
    return out, state


def _loader_segment(state, n, **kw):
    loader = reference_pipeline().dataloader(num_workers=2, restore=state, **kw)
    out = _take(iter(loader), n)
    state = _through_bytes(loader.checkpoint())
    loader.close()
    return out, state


def _three_resumes(segment) -> tuple[list, list[dict]]:
    """5 outputs; resume skipping SKIP, 4 outputs (the state then sits right before the
    skipped range); resume without passing it, 5 outputs; resume again to the end. Each
    resume in a fresh pipeline after re-seeding the global RNGs."""
    got, s1 = segment(None, 5)
    reseed_globals(1)
    out, s2 = segment(s1, 4, skip_batches=SKIP, **ALLOW)
    got += out
    reseed_globals(2)
    out, s3 = segment(s2, 5)  # not passed: the recorded decision holds
    got += out
    reseed_globals(3)
    out, _ = segment(s3, TOTAL - 3 - len(got))
    return got + out, [s1, s2, s3]


def test_skipping_at_a_resume_then_resuming_twice_equals_the_stream_minus_the_skips(full):
    got, (s1, s2, s3) = _three_resumes(_iterate_segment)
    assert_streams_equal(_without(full, SKIP), got, "skipped, resumed twice")
    assert skipped_ranges(s1) == [] and "skip" not in s1
    assert s2["position"] == 9 and skipped_ranges(s2) == [(9, 12)]  # ahead of the state
    assert s3["position"] == 17 and skipped_ranges(s3) == [(9, 12)]  # behind it: history


@pytest.mark.slow
def test_skipping_through_dataloader_workers(full):
    got, (_, s2, s3) = _three_resumes(_loader_segment)
    assert_streams_equal(_without(full, SKIP), got, "2 workers, skipped, resumed twice")
    assert skipped_ranges(s3) == [(9, 12)]


def test_skipping_with_two_ranks_in_lockstep(full):
    skip = [(10, 16)]  # three steps of two ranks, from a resume at position 6
    with SimulatedRanks(reference_pipeline, dp_size=2) as ranks:
        got = ranks.take(6)
        s = ranks.checkpoint(through_bytes=True)
    reseed_globals(1)
    kw = {"skip_batches": skip, **ALLOW}
    with SimulatedRanks(reference_pipeline, dp_size=2, state=s, restore_kwargs=kw) as ranks:
        got += ranks.take(4)
        s = ranks.checkpoint(through_bytes=True)
    assert skipped_ranges(s) == [(10, 16)] and s["position"] == 10
    for seed in (2, 3):
        reseed_globals(seed)
        with SimulatedRanks(reference_pipeline, dp_size=2, state=s) as ranks:
            got += ranks.take(4)
            s = ranks.checkpoint(through_bytes=True)
    assert_streams_equal(_without(full, skip)[: len(got)], got, "D=2, skipped, resumed twice")
    assert len(got) == 18


def test_skipping_needs_allow_changes_and_a_later_list_must_match(full):
    _, s1 = _iterate_segment(None, 5)
    with pytest.raises(IncompatibleCheckpoint, match=r"allow_changes=\{'skip'\}"):
        reference_pipeline().iterate(restore=s1, skip_batches=SKIP)
    _, s2 = _iterate_segment(s1, 2, skip_batches=SKIP, **ALLOW)  # position 7: SKIP ahead
    with pytest.raises(IncompatibleCheckpoint) as e:
        reference_pipeline().iterate(restore=s2, skip_batches=[(9, 13)])
    assert "(9, 13)" in str(e.value) and "(9, 12)" in str(e.value)
    with pytest.raises(IncompatibleCheckpoint, match="skip_batches"):
        reference_pipeline().iterate(restore=s2, skip_batches=[])  # un-skipping
    # the recorded list again, or nothing: accepted without allow_changes
    reference_pipeline().iterate(restore=s2, skip_batches=SKIP).close()
    # a range before the state's position was delivered already
    with pytest.raises(ConfigError, match="already delivered"):
        reference_pipeline().iterate(restore=s2, skip_batches=[(2, 4)], **ALLOW)
    # a changed list with allow_changes replaces the part ahead of the position
    out, s3 = _iterate_segment(s2, 3, skip_batches=[(8, 10)], **ALLOW)
    assert skipped_ranges(s3) == [(8, 10)]
    assert_streams_equal([full[7], full[10], full[11]], out, "re-decided skips")


def test_misaligned_ranges_with_two_ranks_name_the_aligned_bounds():
    with SimulatedRanks(reference_pipeline, dp_size=2) as ranks:
        ranks.take(6)
        s = ranks.checkpoint(through_bytes=True)
    kw = {"skip_batches": [(9, 16)], **ALLOW}
    with pytest.raises(ConfigError, match=r"whole steps.*use \(8, 16\) or \(10, 16\)"):
        SimulatedRanks(reference_pipeline, dp_size=2, state=s, restore_kwargs=kw)
    # a recorded range that no longer fits the ranks is refused at the restore too
    one = reference_pipeline().iterate(restore=s, skip_batches=[(9, 12)], **ALLOW)
    later = _through_bytes(one.checkpoint())
    one.close()
    with pytest.raises(ConfigError, match="whole steps"):
        SimulatedRanks(reference_pipeline, dp_size=2, state=later)


def test_per_rank_state_dict_carries_the_skips(full):
    """A handle's DCP-shaped state records the decision as the merged one does."""
    it = reference_pipeline().iterate(skip_batches=[(2, 4)])  # from the beginning: no allow
    got = _take(it, 3)
    per_rank = it.state_dict()
    it.close()
    fresh = reference_pipeline().iterate()
    fresh.load_state_dict(per_rank)
    got += _take(fresh, 2)
    assert fresh.skipped_ranges == [(2, 4)]
    fresh.close()
    assert_streams_equal(_without(full, [(2, 4)])[:5], got, "per-rank state")


def test_malformed_skip_values_are_refused():
    with pytest.raises(ConfigError, match="start < end"):
        reference_pipeline().iterate(skip_batches=[(5, 5)])
    with pytest.raises(ConfigError, match="pairs"):
        reference_pipeline().iterate(skip_batches="0-3")
    it = reference_pipeline().iterate(skip_batches=[(1, 2)])
    state = it.checkpoint()
    it.close()
    state["skip"] = [[3, 2]]
    with pytest.raises(CorruptCheckpoint, match="recorded data changes"):
        reference_pipeline().iterate(restore=state)


def test_step_positions_maps_trainer_steps_past_earlier_skips():
    assert step_positions(10, 12, per_step=4) == (40, 48)
    # 8 positions skipped at 20..27: step 10 now starts 8 positions later
    assert step_positions(10, 12, per_step=4, skipped=[(20, 28)]) == (48, 56)
    # a range ending where an earlier one starts stops there; one starting there goes past it
    assert step_positions(4, 5, per_step=4, skipped=[(20, 28)]) == (16, 20)
    assert step_positions(5, 6, per_step=4, skipped=[(20, 28)]) == (28, 32)


def test_inspect_shows_the_recorded_skips_and_exclusions(tmp_path):
    from click.testing import CliRunner

    from zephon_core.cli.commands import cli

    it = reference_pipeline().iterate(skip_batches=[(2, 5)], exclude={"code": [3, 1]})
    _take(it, 4)
    it.save(tmp_path / "state.zst")
    it.close()
    text = CliRunner().invoke(cli, ["inspect", str(tmp_path / "state.zst")])
    assert text.exit_code == 0, text.output
    assert "skipped positions 2..4 (3 outputs, skip_batches)" in text.output
    assert "excluded from code: 2 rows (1, 3)" in text.output
    js = CliRunner().invoke(cli, ["inspect", "--json", str(tmp_path / "state.zst")])
    assert '"skipped": [\n    [\n      2,\n      5\n    ]\n  ]' in js.output


def test_ranks_following_different_skips_do_not_merge():
    from zephon_core.distributed import merge_local_checkpoints

    def rank(r: int, **kw):
        pipe = reference_pipeline().bind(rank=r, world_size=2, dp_rank=r, dp_size=2)
        return pipe.iterate(**kw)

    handles = [rank(0, skip_batches=[(4, 6)]), rank(1)]
    reports = [h.local_checkpoint() for h in handles]
    for h in handles:
        h.close()
    with pytest.raises(IncompatibleCheckpoint, match="same skip_batches and exclude"):
        merge_local_checkpoints(reports, 4)


def test_integrations_check_the_values_when_built():
    from zephon_integrations.allow_changes import checked_data_changes

    with pytest.raises(ConfigError, match=r"ZephonCallback\(...\): skip_batches"):
        checked_data_changes([(3, 1)], None, "ZephonCallback")
    assert checked_data_changes([(5, 7), (1, 2)], {"web": [3, 1, 3]}, "X") == (
        [(1, 2), (5, 7)],
        {"web": [1, 3]},
    )
    assert checked_data_changes(None, None, "X") == (None, None)


def test_only_states_that_record_changes_are_written_as_schema_4():
    """Earlier releases read schema 3 and refuse 4 by its version, naming the writer."""
    it = reference_pipeline().iterate()
    _take(it, 2)
    plain = it.checkpoint()
    it.close()
    assert plain["version"] == 3 and "skip" not in plain and "exclude" not in plain
    it = reference_pipeline().iterate(restore=plain, skip_batches=[(4, 6)], **ALLOW)
    recorded = it.checkpoint()
    it.close()
    assert recorded["version"] == 4 and recorded["skip"] == [[4, 6]]
    recorded["version"] = 3  # the keys of schema 4 under 3: refused as malformed
    with pytest.raises(CorruptCheckpoint, match="unexpected keys"):
        reference_pipeline().iterate(restore=recorded)
