"""Resuming through ZephonCallback and ZephonTrainer alike: a checkpoint that cannot
continue the model's run bit for bit says so, and a deliberate change of the pipeline is
refused unless ``allow_changes`` accepts it.
"""

from __future__ import annotations

import functools
import logging

import pytest
from hf_helpers import fingerprint, hf_train, mixture_pipeline, zephon_warnings

from zephon_core import IncompatibleCheckpoint
from zephon_integrations.hf.checkpoint_dir import read_state

# trains models in this process for many seconds per test: `make test-fast` leaves
# them to `make test`
pytestmark = pytest.mark.slow

logging.getLogger("transformers").setLevel(logging.ERROR)

BOTH = ("callback", "trainer")


@pytest.mark.parametrize("path", BOTH)
def test_a_model_only_checkpoint_resumes_the_data_and_warns_once(tmp_path, caplog, path):
    """``save_only_model=True`` writes no RNG, optimizer or scheduler files: the batches
    still continue exactly, the losses cannot, and one WARNING says so."""
    caplog.set_level(logging.WARNING, logger="zephon_integrations")
    full, full_losses, _ = hf_train(path, tmp_path / "a", 6)
    hf_train(path, tmp_path / "b", 6, crash_at=3, save_only_model=True)
    assert zephon_warnings(caplog) == []
    tail, tail_losses, _ = hf_train(path, tmp_path / "b", 6, resume=True, save_only_model=True)
    assert tail == full[3:]
    assert [loss for _, loss in tail_losses] != [loss for _, loss in full_losses[3:]]
    [warning] = zephon_warnings(caplog)
    assert "checkpoint-3, the data continues exactly" in warning
    assert "no rng_state.pth for process 0 (saved with save_only_model=True?)" in warning
    assert "no optimizer/scheduler state" in warning


@pytest.mark.parametrize("path", BOTH)
def test_allow_changes_re_mixes_on_resume(tmp_path, caplog, path):
    """Saved at weights 0.7/0.3, resumed at 0.5/0.5: refused without ``allow_changes``;
    with ``{"weights"}`` the stream continues as the core re-mixes it, and the re-mixed
    run's own checkpoint resumes exactly without it."""
    before = functools.partial(mixture_pipeline, (0.7, 0.3))
    after = functools.partial(mixture_pipeline, (0.5, 0.5))
    hf_train(path, tmp_path / "a", 6, pipeline=before)  # saves at 3 and 6
    ckpt = str(tmp_path / "a" / "checkpoint-6")
    with pytest.raises(IncompatibleCheckpoint, match=r"allow_changes=\{'weights'\}") as refused:
        hf_train(path, tmp_path / "a", 12, pipeline=after, resume=ckpt)
    owner = "ZephonCallback" if path == "callback" else "ZephonTrainer"
    assert f"{owner}(..., allow_changes=...)" in str(refused.value)  # the user's own argument

    remixed, remixed_losses, _ = hf_train(
        path, tmp_path / "a", 12, pipeline=after, resume=ckpt, allow_changes={"weights"}
    )  # saves at 9 and 12
    core = after()
    core.load_state_dict(read_state(ckpt), allow_changes={"weights"})
    with core.iterate() as it:
        assert remixed == [fingerprint(next(it)) for _ in range(6)]

    caplog.clear()
    caplog.set_level(logging.WARNING, logger="zephon_integrations")
    tail, tail_losses, _ = hf_train(
        path, tmp_path / "a", 12, pipeline=after, resume=str(tmp_path / "a" / "checkpoint-9")
    )
    assert tail == remixed[3:] and tail_losses == remixed_losses[3:]
    assert zephon_warnings(caplog) == []  # nothing lacking, nothing to say


def test_allow_changes_is_checked_when_the_integration_is_built():
    """A typo fails when the callback or trainer is built, not at a resume hours later;
    one name may be a string."""
    from zephon_core import ConfigError
    from zephon_integrations.hf import ZephonCallback

    assert ZephonCallback(mixture_pipeline, allow_changes="weights").allow_changes == {"weights"}
    with pytest.raises(ConfigError, match=r"ZephonCallback\(allow_changes=\.\.\.\)"):
        ZephonCallback(mixture_pipeline, allow_changes={"weight"})
