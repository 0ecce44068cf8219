"""``zephon trace``: restore a checkpoint, replay to a step, describe what the model saw
-- compared with the batches an uninterrupted run produced (and their provenance)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import cli, terminal_output
from helpers import CODE, PROSE, byte_tokenize, reference_pipeline

from zephon_core.cli.trace import SNIPPET_CHARS
from zephon_core.cli.trace_steps import handed_positions, layout, step_outputs
from zephon_core.errors import ConfigError

DATASETS = {"prose": PROSE, "code": CODE}

FACTORY = """
from helpers import reference_pipeline


def build():  # what the run trained with: no provenance
    return reference_pipeline(prefetch=0)


def other():  # another configuration: the checkpoint's restore refuses it
    return reference_pipeline(prefetch=0, seq_len=64)


def finite():  # one epoch: about 200 batches
    return reference_pipeline(prefetch=0, num_epochs=1)
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, list[dict]]:
    """A run's state at output 20 (saved without provenance) and its outputs 0..39 read
    with provenance on (the same stream: provenance is no part of it)."""
    d = tmp_path_factory.mktemp("trace")
    (d / "tracefactory.py").write_text(FACTORY)
    with reference_pipeline(prefetch=0) as pipe, pipe.iterate() as it:
        for _ in range(20):
            next(it)
        (d / "state.zst").write_bytes(_encoded(it.checkpoint()))
    with reference_pipeline(prefetch=0, provenance=True).iterate() as it:
        batches = [next(it) for _ in range(40)]
    return d, batches


def _encoded(state: dict) -> bytes:
    from zephon_core.checkpoint import codec

    return codec.encode(state)


def check_output(out: dict, batch: dict) -> None:
    """``out`` (one traced output of the JSON document) lists exactly ``batch``'s
    provenance segments, and each names the tokens the batch holds and the document's
    text."""
    flat = [
        [row["row"], *(seg[c] for c in ("offset", "dataset", "dataset_row", "epoch"))]
        + [seg["token_start"], seg["token_end"]]
        for row in out["rows"]
        for seg in row["segments"]
    ]
    assert flat == batch["provenance"].tolist()
    names = ["prose", "code"]
    tokens = dict.fromkeys(names, 0)
    for row in out["rows"]:
        for seg in row["segments"]:
            doc = DATASETS[seg["dataset_name"]][seg["dataset_row"]]
            assert seg["dataset_name"] == names[seg["dataset"]]
            ids = byte_tokenize(doc)["input_ids"][seg["token_start"] : seg["token_end"]]
            got = batch["input_ids"][row["row"], seg["offset"] : seg["offset"] + len(ids)]
            assert got.tolist() == ids.tolist()
            assert seg["tokens"] == len(ids)
            assert doc["text"].startswith(seg["snippet"].removesuffix("..."))
            assert len(seg["snippet"]) <= SNIPPET_CHARS
            tokens[seg["dataset_name"]] += len(ids)
    assert out["tokens"] == tokens


def test_trace_reports_the_rows_of_a_step_after_the_checkpoint(run):
    work, batches = run
    r = cli("trace", "state.zst", "tracefactory:build", "--step", "33", "--json", cwd=work)
    assert r.returncode == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["checkpoint"]["position"] == 20 and doc["checkpoint"]["step"] is None
    assert doc["replayed"] == 14 and doc["datasets"] == ["prose", "code"]
    [step] = doc["steps"]
    assert step["step"] == 33 and step["positions"] == [33, 34] and step["skipped"] == []
    [out] = step["outputs"]
    assert (out["position"], out["micro_step"], out["rank"]) == (33, 0, 0)
    check_output(out, batches[33])
    assert doc["tokens"] == out["tokens"] == step["tokens"]


def test_trace_a_range_of_trainer_steps(run):
    """--accum 2 --dp 2: step N is outputs 4N..4N+3, micro-step a of rank r at 4N+2a+r."""
    work, batches = run
    args = ["--step", "6", "--to", "8", "--accum", "2", "--dp", "2", "--json"]
    r = cli("trace", "state.zst", "tracefactory:build", *args, cwd=work)
    assert r.returncode == 0, r.output
    doc = json.loads(r.stdout)
    assert [s["step"] for s in doc["steps"]] == [6, 7, 8]
    for s in doc["steps"]:
        n = s["step"]
        assert s["positions"] == [4 * n, 4 * n + 4]
        places = [(o["position"], o["micro_step"], o["rank"]) for o in s["outputs"]]
        assert places == [(4 * n + 2 * a + r, a, r) for a in range(2) for r in range(2)]
        for out in s["outputs"]:
            check_output(out, batches[out["position"]])
    text = cli("trace", "state.zst", "tracefactory:build", *args[:-1], cwd=work)
    assert text.returncode == 0
    assert "step 7 (positions 28..31)" in text.stdout
    assert "micro-step 1 rank 1 position 31" in text.stdout


@pytest.mark.slow  # DataLoader worker processes
def test_trace_behind_dataloader_workers_reports_the_same(run):
    work, batches = run
    args = ["trace", "state.zst", "tracefactory:build", "--step", "10", "--to", "11"]
    args += ["--accum", "2", "--json"]
    runs = [cli(*args, "--workers", w, cwd=work) for w in ("0", "2")]
    assert [r.returncode for r in runs] == [0, 0], runs[1].stderr
    docs = [json.loads(r.stdout) for r in runs]
    for d in docs:
        d.pop("seconds")
    assert docs[0] == docs[1]
    for s in docs[1]["steps"]:
        for out in s["outputs"]:
            check_output(out, batches[out["position"]])


def test_trace_refuses_a_checkpoint_after_the_step(run):
    work, _ = run
    r = cli("trace", "state.zst", "tracefactory:build", "--step", "19", cwd=work)
    assert r.returncode == 1
    assert "ConfigError" in r.stderr and "pass an earlier checkpoint" in r.stderr
    # with --accum 2, step 9 starts at position 18, before the state's 20
    r = cli("trace", "state.zst", "tracefactory:build", "--step", "9", "--accum", "2", cwd=work)
    assert r.returncode == 1 and "after step 9" in r.stderr


def test_trace_refuses_an_unknown_factory_and_one_the_checkpoint_does_not_fit(run):
    work, _ = run
    r = cli("trace", "state.zst", "tracefactory:nope", "--step", "25", cwd=work)
    assert r.returncode == 2 and "no function 'nope'" in r.stderr
    r = cli("trace", "state.zst", "tracefactory:other", "--step", "25", cwd=work)
    assert r.returncode == 1 and "IncompatibleCheckpoint" in r.stderr, r.stderr


def test_trace_past_the_end_of_a_finite_stream_says_so(run):
    work, _ = run
    start = reference_pipeline(prefetch=0, num_epochs=1).checkpoint()  # position 0
    (work / "start.zst").write_bytes(_encoded(start))
    r = cli("trace", "start.zst", "tracefactory:finite", "--step", "100000", cwd=work)
    assert r.returncode == 1 and "the stream ended at position" in r.stderr, r.stderr


# -- the step mapping -----------------------------------------------------------------


def test_handed_positions_walk_around_skipped_ranges():
    assert handed_positions(10, 4, []) == [10, 11, 12, 13]
    assert handed_positions(10, 5, [(3, 8), (11, 13), (20, 30)]) == [10, 13, 14, 15, 16]
    assert handed_positions(12, 3, [(11, 13)]) == [13, 14, 15]
    assert handed_positions(0, 3, [(1, 2), (2, 4)]) == [0, 4, 5]


def test_step_outputs_with_several_outputs_per_micro_batch():
    lay = layout(batch_size=4, global_batch=32, accum=2, dp=2)  # 2 outputs per micro-batch
    assert (lay.per_micro, lay.per_step) == (2, 8)
    got = [(m.step, m.position, m.micro_step, m.rank) for m in step_outputs(lay, (3, 30), 4, 4, [])]
    assert got == [(4, 38 + i, i // 4, (i % 4) // 2) for i in range(8)]
    with pytest.raises(ConfigError, match="not a multiple"):
        layout(batch_size=4, global_batch=30, accum=2, dp=2)
    assert not layout(4, None, None, None).trainer and layout(4, None, 1, None).trainer


# -- progress: a bar on a terminal, nothing in a pipe -------------------------------------


def test_the_replay_shows_a_bar_on_a_terminal_and_nothing_in_a_pipe(run):
    from zephon_core.cli import trace as tracing

    work, _ = run
    piped = cli("trace", "state.zst", "tracefactory:build", "--step", "30", cwd=work)
    assert piped.returncode == 0 and piped.stderr == ""
    positions = layout(4, None, None, None)
    loc = tracing.choose(str(work / "state.zst"), positions, 30, False)
    build = lambda: reference_pipeline(prefetch=0)  # noqa: E731
    text = terminal_output(lambda: tracing.trace(loc, build, positions, 30, 30))
    assert "\r" in text and "replaying to the step" in text and "11/11" in text


def _write_skipping_state(work: Path) -> None:
    """``skipping.zst``: the state at output 20 restored with positions 30..32 skipped
    (``skip_batches``, recorded in it)."""
    from zephon_core import Pipeline

    state = Pipeline.load(str(work / "state.zst"))
    with reference_pipeline(prefetch=0).iterate(
        restore=state, skip_batches=[(30, 33)], allow_changes={"skip"}
    ) as it:
        (work / "skipping.zst").write_bytes(_encoded(it.checkpoint()))


def test_trace_reports_a_recorded_skip_as_skipped_and_the_rest_exactly(run):
    """A state whose run skips positions 30..32: the trace labels them skipped, and the
    outputs around them are the uninterrupted ones."""
    work, batches = run
    _write_skipping_state(work)
    r = cli("trace", "skipping.zst", "tracefactory:build", "--step", "28", "--to", "36",
            "--json", cwd=work)  # fmt: skip
    assert r.returncode == 0, r.output
    doc = json.loads(r.stdout)
    steps = {s["step"]: s["positions"] for s in doc["steps"]}
    # steps count what the trainer was handed: step 30 is position 33
    assert steps[29] == [29, 30] and steps[30] == [33, 34], steps
    assert doc["skipped"] == [[30, 33]]  # between two steps: no step's own list holds it
    assert all(s["skipped"] == [] for s in doc["steps"])
    outs = [o for s in doc["steps"] for o in s["outputs"]]
    assert outs and {o["position"] for o in outs} & {28, 29, 33, 34}
    for out in outs:
        check_output(out, batches[out["position"]])


def test_trace_text_says_which_positions_were_skipped_between_two_steps(run):
    work, _ = run
    _write_skipping_state(work)
    r = cli("trace", "skipping.zst", "tracefactory:build", "--step", "28", "--to", "31",
            cwd=work)  # fmt: skip
    assert r.returncode == 0, r.output
    heads = [ln for ln in r.stdout.splitlines() if not ln.startswith(" ")]
    at29 = heads.index(next(h for h in heads if h.startswith("step 29 ")))
    assert heads[at29 + 1].startswith("positions 30..32: skipped (handed to no trainer")
    assert heads[at29 + 2].startswith("step 30 (positions 33..33)")
    # consecutive steps with nothing skipped between them: no such line
    assert sum("skipped" in h for h in heads) == 1
