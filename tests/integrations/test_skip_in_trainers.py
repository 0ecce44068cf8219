"""``skip_batches`` through the integrations: a real ``trainer.fit`` (Lightning) and a real
``Trainer.train()`` (HF) resume skipping a range of global positions, then resume again
without passing it: the batches the model received are the uninterrupted stream minus
the skipped positions, and the checkpoints record the decision.
"""

from __future__ import annotations

import logging

import pytest
import torch
from hf_helpers import hf_train, reference
from lightning_helpers import fit, global_stream, step_checkpoint

from zephon_core.checkpoint.data_changes import skipped_ranges
from zephon_integrations.hf.checkpoint_dir import read_state

# trains models in this process for seconds per test
pytestmark = pytest.mark.slow

logging.getLogger("transformers").setLevel(logging.ERROR)


def _without(stream: list, start: int, end: int) -> list:
    return [b for g, b in enumerate(stream) if not start <= g < end]


def test_lightning_fit_resumes_skipping_then_resumes_again(tmp_path):
    ck = str(tmp_path / "ck")
    first, _, _ = fit(max_steps=5, ckpt_dir=ck, seed=1)
    # one rank, no accumulation: optimizer step s consumed global position s
    skip = {"skip_batches": [(7, 10)], "allow_changes": {"skip"}}
    second, _, _ = fit(
        max_steps=10, ckpt_dir=ck, ckpt_path=step_checkpoint(ck, 5), dm_kwargs=skip, seed=2
    )
    at10 = torch.load(step_checkpoint(ck, 10), weights_only=False)
    state = at10["zephon"]["state"]
    assert skipped_ranges(state) == [(7, 10)] and state["position"] == 13
    third, _, _ = fit(max_steps=14, ckpt_dir=ck, ckpt_path=step_checkpoint(ck, 10), seed=3)
    seen = [fp for _, fp in first.seen + second.seen + third.seen]
    assert seen == _without(global_stream(17), 7, 10)


@pytest.mark.parametrize("path", ("callback", "trainer"))
def test_hf_train_resumes_skipping_then_resumes_again(tmp_path, path):
    out = tmp_path / "out"
    first, _, _ = hf_train(path, out, 6, crash_at=3)
    skip = {"skip_batches": [(4, 6)]}
    second, _, _ = hf_train(path, out, 6, resume=True, allow_changes={"skip"}, zephon_kwargs=skip)
    assert skipped_ranges(read_state(str(out / "checkpoint-6"))) == [(4, 6)]
    third, _, _ = hf_train(path, out, 9, resume=True)
    assert first + second + third == _without(reference(11), 4, 6)
