"""A finite stream shorter than ``max_steps`` under the HF Trainer, on every path.

Training stops at the step where the stream ended, with one WARNING saying so -- the
uninterrupted run, a run resumed before the end (identical tail), and a run resumed
from a checkpoint taken at that very step (it trains nothing). Before, accelerate's
dispatcher raised an untyped ``ValueError: Batch does not contain any data`` in the
first two and at the first batch of the last.
"""

from __future__ import annotations

import logging

import pytest
from hf_helpers import ENDING_STEPS, PATHS, ending_pipeline, hf_train, zephon_warnings

# trains models in this process for many seconds per test: `make test-fast` leaves
# them to `make test`
pytestmark = pytest.mark.slow

logging.getLogger("transformers").setLevel(logging.ERROR)

MAX_STEPS = 40  # more than the stream holds


def ended_at(step: int) -> str:
    return f"stream ended at step {step}, before max_steps={MAX_STEPS}"


@pytest.mark.parametrize("path, gas", [(p, 1) for p in PATHS] + [("callback", 2)])
def test_training_stops_where_the_stream_ended(tmp_path, caplog, path, gas):
    caplog.set_level(logging.WARNING, logger="zephon_integrations")
    end = ENDING_STEPS // gas
    kw = dict(pipeline=ending_pipeline, gradient_accumulation_steps=gas, save_steps=3)

    full, full_losses, trainer = hf_train(path, tmp_path / "a", MAX_STEPS, **kw)
    assert trainer.state.global_step == end and len(full) == ENDING_STEPS
    who = "ZephonTrainer" if path == "trainer" else "ZephonCallback"
    assert zephon_warnings(caplog) == [
        f"{who}: the Zephon {ended_at(end)}: training stops here (the pipeline's datasets "
        "are finite: raise their num_epochs, or lower max_steps to silence this)"
    ]

    caplog.clear()
    tail, tail_losses, trainer = hf_train(
        path, tmp_path / "a", MAX_STEPS, resume=str(tmp_path / "a" / "checkpoint-3"), **kw
    )
    assert tail == full[3 * gas :] and tail_losses == full_losses[3:]
    assert trainer.state.global_step == end
    assert sum(ended_at(end) in w for w in zephon_warnings(caplog)) == 1

    caplog.clear()  # the checkpoint at the very step where the stream ended
    rest, _, trainer = hf_train(path, tmp_path / "a", MAX_STEPS, resume=True, **kw)
    assert rest == [] and trainer.state.global_step == end
    assert sum(ended_at(end) in w for w in zephon_warnings(caplog)) == 1
