"""The ``zephon`` command, run through its installed console script, as a user would."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_helpers import cli
from helpers import CODE, PROSE, byte_tokenize, make_docs, reference_pipeline, worker_env

import zephon_core
from zephon_core import Pipeline, StaticMixtureWorkSource
from zephon_core.checkpoint import codec
from zephon_core.testing import take

ZEPHON = Path(sys.executable).parent / "zephon"

FACTORY = """
import os
import numpy as np
from helpers import reference_pipeline, byte_tokenize, source
from zephon_core import Pipeline


def build():
    return reference_pipeline(prefetch=0)


def other():
    return reference_pipeline(prefetch=0, seq_len=64)


def noisy(p):  # not deterministic: a different stream on every run
    out = byte_tokenize(p)
    return {**out, "input_ids": out["input_ids"] ^ int.from_bytes(os.urandom(1), "big")}


def remixed():  # build() with the mixture 50/50 instead of 70/30
    return (
        Pipeline(source(8, weights=(0.5, 0.5)), canonical_replicas=4, flush_every_k_chunks=2,
                 seed=11, prefetch=0)
        .fetch(parallelism=2)
        .map(byte_tokenize, parallelism=2, name="tokenize")
        .split(max_len=128)
        .pack(seq_len=128, bins=4)
        .shuffle(buffer_size=16)
        .ensure_mixture(window=8)
        .batch(batch_size=4)
    )


def broken():
    return (
        Pipeline(source(8), canonical_replicas=2, seed=1, prefetch=0)
        .fetch()
        .map(noisy, name="noisy")
        .split(max_len=64)
        .pack(seq_len=64)
        .batch(batch_size=2)
    )
"""


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(ZEPHON), *args], cwd=cwd, env=worker_env(), capture_output=True, text=True
    )


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("cli")
    (d / "factory.py").write_text(FACTORY)
    with reference_pipeline(prefetch=0) as pipe:
        take(pipe, 30)
        state = pipe.checkpoint()
        pipe.save(d / "state.zst")
    (d / "checkpoint-30").mkdir()
    (d / "checkpoint-30" / "zephon_state.msgpack.zst").write_bytes(codec.encode(state))
    torch.save({"zephon": {"state": state, "rng": None}, "state_dict": {}}, d / "last.ckpt")
    with reference_pipeline(prefetch=0, seq_len=64) as pipe:
        take(pipe, 5)
        pipe.save(d / "other.zst")
    other_data = copy.deepcopy(state)
    other_data["content"]["components"]["prose"] = "0" * 16  # the same config, other data
    (d / "other_data.zst").write_bytes(codec.encode(other_data))
    sys.path.insert(0, str(d))
    try:
        from factory import remixed
    finally:
        sys.path.remove(str(d))
    with remixed() as pipe:
        take(pipe, 30)
        pipe.save(d / "remixed.zst")
    return d


def test_the_console_script_is_installed():
    assert ZEPHON.exists(), "pip install -e '.[cli]' creates the zephon script"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["state.zst", "checkpoint-30", "last.ckpt"])
def test_inspect_reads_every_kind_of_checkpoint(work, name):
    r = run("inspect", name, "--json", cwd=work)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["position"] == 30 and len(info["lanes"]) == 4
    assert sum(lane["delivered"] for lane in info["lanes"]) == 30
    assert set(info["components"]) == {"prose", "code"}
    assert info["components"]["code"]["epochs"] > 0
    assert info["inflight_chunks"] == sum(lane["inflight_chunks"] for lane in info["lanes"])
    text = run("inspect", name, cwd=work)
    assert "global position 30" in text.stdout and "lane   0" in text.stdout
    # the weights as given (0.7/0.3), not as the integers the fingerprint holds (7, 3)
    assert "datasets (weights 0.7, 0.3 in documents)" in text.stdout, text.stdout


@pytest.mark.slow
def test_inspect_of_something_else_is_a_clear_error(work):
    (work / "junk.bin").write_bytes(b"not a checkpoint")
    r = run("inspect", "junk.bin", cwd=work)
    assert r.returncode != 0 and "not a readable torch checkpoint" in r.stderr


@pytest.mark.slow
def test_diff_of_two_checkpoints_names_what_differs(work):
    r = run("diff", "state.zst", "other.zst", cwd=work)
    assert r.returncode == 1 and "seq_len" in r.stdout
    same = run("diff", "state.zst", "last.ckpt", cwd=work)
    assert same.returncode == 0 and "same configuration" in same.stdout


@pytest.mark.slow
def test_diff_names_changed_content_and_refuses_a_bad_second_file(work):
    r = run("diff", "state.zst", "other_data.zst", cwd=work)
    assert r.returncode == 1 and "dataset 'prose'" in r.stdout and "code" not in r.stdout
    (work / "junk2.bin").write_bytes(b"not a checkpoint")
    bad = run("diff", "state.zst", "junk2.bin", cwd=work)
    assert bad.returncode == 1 and "not a readable torch checkpoint" in bad.stderr
    assert "Traceback" not in bad.stderr


@pytest.mark.slow
def test_diff_of_a_checkpoint_and_a_pipeline(work):
    ok = run("diff", "state.zst", "factory.py:build", cwd=work)
    assert ok.returncode == 0 and "restores" in ok.stdout
    bad = run("diff", "state.zst", "factory:other", cwd=work)
    assert bad.returncode == 1 and "IncompatibleCheckpoint" in bad.stdout


@pytest.mark.slow
def test_explain_prints_the_plan_and_its_legend(work):
    r = run("explain", "factory:build", cwd=work)
    assert r.returncode == 0
    assert "Stage[0]" in r.stdout and "batch_replay_filter" in r.stdout and "Legend" in r.stdout


@pytest.mark.slow
def test_verify_passes_a_deterministic_pipeline_and_fails_a_noisy_one(work):
    ok = run("verify", "factory:build", "--cuts", "1,7", "--total", "14", cwd=work)
    assert ok.returncode == 0 and ok.stdout.startswith("exact"), ok.stdout + ok.stderr
    bad = run("verify", "factory:broken", "--cuts", "3", "--total", "8", cwd=work)
    assert bad.returncode == 1 and "NOT exact" in bad.stdout


@pytest.mark.slow
def test_bench_reports_throughput(work):
    r = run("bench", "factory:build", "--batches", "20", cwd=work)
    assert r.returncode == 0 and "batches/s" in r.stdout and "tokens/s" in r.stdout


@pytest.mark.slow
def test_a_bad_factory_is_a_usage_error(work):
    r = run("explain", "factory:nope", cwd=work)
    assert r.returncode == 2 and "no function 'nope'" in r.stderr


# In process below (click's runner calls the same command functions; a fresh process
# per call would cost ~2 s of imports each).


# -- torch files are read without running code from them ----------------------------------


class _Marker:
    """Pickles as a call that creates ``path``: what a hostile checkpoint can do."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (exec, (f"open({self.path!r}, 'w').close()",))


@pytest.mark.parametrize("zipped", [True, False], ids=["zip", "legacy"])
def test_a_checkpoint_whose_pickle_runs_code_is_refused_unread(work, tmp_path, zipped):
    marker = tmp_path / "ran"
    state = codec.decode(codec.read_bytes(work / "state.zst"))
    torch.save(
        {"zephon": {"state": state, "rng": None}, "state_dict": {}, "x": _Marker(marker)},
        work / "evil.ckpt",
        _use_new_zipfile_serialization=zipped,
    )
    for args in (["inspect", "evil.ckpt"], ["diff", "evil.ckpt", "state.zst"]):
        r = cli(*args, cwd=work)
        assert r.returncode == 1 and "UntrustedCheckpoint" in r.stderr, r.stderr
        assert "exec" in r.stderr and "--trust-pickle" in r.stderr
        assert "Traceback" not in r.stderr
        assert not marker.exists(), "the file's pickled code ran"
    trusted = cli("inspect", "evil.ckpt", "--trust-pickle", cwd=work)
    assert trusted.returncode == 0 and "global position 30" in trusted.stdout
    assert marker.exists()  # the flag is the one way to run it


@pytest.fixture(scope="module")
def lightning_ckpt(tmp_path_factory) -> Path:
    """A real Lightning checkpoint written by ZephonDataModule, after 4 steps, whose
    datamodule saved hyper-parameters of common plain types."""
    import argparse

    import numpy as np
    from lightning_helpers import fit

    from zephon_integrations.lightning import ZephonDataModule

    class WithHparams(ZephonDataModule):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.save_hyperparameters(
                {"lr": np.float64(0.1), "out": Path("/tmp/x"), "args": argparse.Namespace(a=1)}
            )

    d = tmp_path_factory.mktemp("lightning")
    fit(max_steps=4, ckpt_dir=str(d), every_n_train_steps=4, dm_class=WithHparams)
    ckpt = d / "last.ckpt"
    assert "datamodule_hyper_parameters" in torch.load(ckpt, weights_only=False)
    return ckpt


@pytest.mark.slow  # many seconds in this process
def test_inspect_reads_a_real_lightning_checkpoint_without_full_pickle(work, lightning_ckpt):
    r = cli("inspect", str(lightning_ckpt), "--json", cwd=work)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["position"] == 4 and info["file"]["kind"] == "Lightning checkpoint"
    assert info["zephon_version"] == zephon_core.__version__


# -- the CLI applies the restore's own checks ---------------------------------------------


def test_a_state_the_restore_refuses_is_refused_by_inspect_and_diff(work):
    state = codec.decode(codec.read_bytes(work / "state.zst"))
    lane = next(ls for ls in state["lanes"] if ls["cursor"])
    del lane["cursor"]
    (work / "no_cursor.zst").write_bytes(codec.encode(state))
    for args in (["diff", "state.zst", "no_cursor.zst"], ["inspect", "no_cursor.zst"]):
        r = cli(*args, cwd=work)
        assert r.returncode == 1, (args, r.stdout)
        assert "CorruptCheckpoint" in r.stderr and "missing keys ['cursor']" in r.stderr
        assert "Traceback" not in r.stderr and "restores" not in r.stdout
    # a row pointer changed in range: only the chunk digest can tell
    state = codec.decode(codec.read_bytes(work / "state.zst"))
    lane = next(ls for ls in state["lanes"] if ls["chunks"])
    lane["chunks"][0][3][0] ^= 1
    (work / "moved_row.zst").write_bytes(codec.encode(state))
    r = cli("diff", "state.zst", "moved_row.zst", cwd=work)
    assert r.returncode == 1 and f"lane {lane['lane']}: inflight chunk" in r.stderr


def test_diff_with_allowed_changes_says_whether_the_restore_accepts_and_what_it_does(work):
    refused = cli("diff", "state.zst", "factory:remixed", cwd=work)
    assert refused.returncode == 1 and "allow_changes={'weights'}" in refused.stdout
    ok = cli("diff", "state.zst", "factory:remixed", "--allow-changes", "weights", cwd=work)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "accepts state.zst with allow_changes=['weights']" in ok.stdout
    assert "dataset 'prose': 70.0 % -> 50.0 % of documents" in ok.stdout
    assert "inflight chunks replay as written" in ok.stdout
    # between two checkpoints: the configurations and content digests decide
    two = cli("diff", "state.zst", "remixed.zst", cwd=work)
    assert two.returncode == 1 and "--allow-changes weights re-mixes" in two.stdout
    two = cli("diff", "state.zst", "remixed.zst", "--allow-changes", "weights", cwd=work)
    assert two.returncode == 0 and "accepts A with allow_changes=['weights']" in two.stdout
    data = cli("diff", "state.zst", "other_data.zst", "--allow-changes", "data", cwd=work)
    assert data.returncode == 0 and "accepted (data): dataset 'prose'" in data.stdout
    bad = cli("diff", "state.zst", "remixed.zst", "--allow-changes", "everything", cwd=work)
    assert bad.returncode == 2 and "--allow-changes" in bad.stderr


# -- zephon diff of two states decides as a real restore does -----------------------------


def _restore_accepts(build, state: dict, allowed: set[str]) -> bool:
    from zephon_core import IncompatibleCheckpoint

    try:
        build().load_state_dict(copy.deepcopy(state), allow_changes=allowed)
    except IncompatibleCheckpoint:
        return False
    return True


def _saved(pipe, path: Path, steps: int = 6) -> dict:
    with pipe:
        take(pipe, steps)
        pipe.save(path)
        return pipe.checkpoint()


def _agree(tmp_path: Path, a: str, b: str, build_b, state_a: dict, allowed: set[str]) -> bool:
    """``zephon diff a b --allow-changes ...`` decides as ``build_b().load_state_dict``."""
    args = ["diff", a, b] + (["--allow-changes", ",".join(sorted(allowed))] if allowed else [])
    r = cli(*args, cwd=tmp_path)
    accepts = _restore_accepts(build_b, state_a, allowed)
    assert r.returncode == (0 if accepts else 1), (allowed, accepts, r.stdout, r.stderr)
    return accepts


def test_diff_reads_a_state_the_previous_release_wrote_as_a_restore_does(tmp_path):
    """main at 03a95f2 named map functions in the configuration (ops[1].fn)."""
    import golden

    old = golden.DATA / "main-03a95f2.state"
    _saved(golden.build(), tmp_path / "new.state", golden.CUT)
    state = Pipeline.load(old)
    assert "fn" in state["config"]["ops"][1]
    assert _agree(tmp_path, str(old), "new.state", golden.build, state, set())
    r = cli("diff", str(old), "new.state", cwd=tmp_path)
    assert "same configuration and content" in r.stdout and "absent now" not in r.stdout
    assert cli("diff", "new.state", str(old), cwd=tmp_path).returncode == 0
    info = json.loads(cli("inspect", str(old), "--json", cwd=tmp_path).stdout)
    assert all("fn" not in op for op in info["config"]["ops"] if isinstance(op, dict))


EXTRA = make_docs(40, 5, 300, 3, "e")


def _mixed(datasets: dict, mixture) -> Pipeline:
    src = StaticMixtureWorkSource(
        {k: v for k, (v, _) in datasets.items()},
        {k: w for k, (_, w) in datasets.items()},
        chunk_size=8,
        seed=7,
    )
    return (
        Pipeline(src, canonical_replicas=2, flush_every_k_chunks=2, seed=11, prefetch=0)
        .fetch()
        .map(byte_tokenize, name="tokenize")
        .split(max_len=64)
        .pack(seq_len=64)
        .ensure_mixture(weights=mixture, window=4)
        .batch(batch_size=2)
    )


def _two():
    return _mixed({"prose": (PROSE, 0.7), "code": (CODE, 0.3)}, {"prose": 0.7, "code": 0.3})


def _three():
    return _mixed(
        {"prose": (PROSE, 0.5), "code": (CODE, 0.3), "extra": (EXTRA, 0.2)},
        {"prose": 0.5, "code": 0.3, "extra": 0.2},
    )


def test_diff_of_states_with_ensure_mixture_weights_and_an_added_dataset(tmp_path):
    state = _saved(_two(), tmp_path / "two.state")
    _saved(_three(), tmp_path / "three.state")
    decided = {
        frozenset(allowed): _agree(tmp_path, "two.state", "three.state", _three, state, allowed)
        for allowed in ({"weights", "components"}, {"weights"}, set())
    }
    assert decided == {
        frozenset({"weights", "components"}): True,
        frozenset({"weights"}): False,
        frozenset(): False,
    }
    r = cli("diff", "two.state", "three.state", cwd=tmp_path)
    assert "--allow-changes weights,components re-mixes" in r.stdout


def _resized(rows: list[dict]):
    return _mixed({"prose": (rows, 0.7), "code": (CODE, 0.3)}, None)


def test_diff_of_states_over_a_resized_dataset_with_allow_changes_data(tmp_path):
    state = _saved(_resized(PROSE), tmp_path / "before.state")
    longer = PROSE + make_docs(10, 5, 300, 4, "q")
    _saved(_resized(longer), tmp_path / "after.state")
    build = lambda: _resized(longer)  # noqa: E731
    assert _agree(tmp_path, "before.state", "after.state", build, state, {"data"})
    assert not _agree(tmp_path, "before.state", "after.state", build, state, set())
    ok = cli("diff", "before.state", "after.state", "--allow-changes", "data", cwd=tmp_path)
    assert "accepted (data): dataset 'prose' 160 -> 170 rows" in ok.stdout
    refused = cli("diff", "before.state", "after.state", cwd=tmp_path)
    assert "--allow-changes data" in refused.stdout


def test_diff_of_a_state_digested_by_the_previous_release_points_at_the_pipeline(tmp_path):
    """Its function digests are 03a95f2's (golden_captures.py): two states cannot tell
    whether the function changed, the pipeline can."""
    import golden_captures as gc

    old = gc.DATA / f"{gc.name('dict')}.state"
    _saved(gc.build("dict"), tmp_path / "new.state", 9)
    two = cli("diff", str(old), "new.state", cwd=tmp_path)
    assert two.returncode == 1 and "function of operator 'tokenize'" in two.stdout
    assert "zephon diff A module:function decides" in two.stdout
    (tmp_path / "captures.py").write_text(
        "import golden_captures\n\ndef build():\n    return golden_captures.build('dict')\n"
    )
    same_python = gc.recorded("dict")["python"] == f"{sys.version_info[0]}.{sys.version_info[1]}"
    with_pipeline = cli("diff", str(old), "captures.py:build", cwd=tmp_path)
    assert with_pipeline.returncode == (0 if same_python else 1), with_pipeline.stdout
