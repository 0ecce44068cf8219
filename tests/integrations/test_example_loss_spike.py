"""The loss-spike walkthrough (``examples/loss_spike.py``), run as a user runs it: the
traced spike holds the scrape's binary page, the resumed run never receives the skipped
batches, and every later position holds the batch the original run trained on there."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import hang_guard_s

from zephon_core.checkpoint.data_changes import skipped_ranges

# every test here starts processes (see tests/conftest.py)
pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
STEPS, EVERY = 60, 10


def read_log(path: Path) -> dict[int, tuple[float, str]]:
    with path.open() as fh:
        return {int(r["step"]): (float(r["loss"]), r["batch"]) for r in csv.DictReader(fh)}


def junk_page() -> int:
    sys.path.insert(0, str(EXAMPLES))
    try:
        from loss_spike import JUNK_PAGE
    finally:
        sys.path.remove(str(EXAMPLES))
    return JUNK_PAGE


def test_the_loss_spike_walkthrough_traces_and_skips_the_spike(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "loss_spike.py", "--steps", str(STEPS), "--every", str(EVERY),
         "--out", str(out), "--log-every", "20"],
        cwd=EXAMPLES,
        capture_output=True,
        text=True,
        timeout=hang_guard_s(1800),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    original, resumed = read_log(out / "original.csv"), read_log(out / "resumed.csv")
    trace = json.loads((out / "trace.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    assert sorted(original) == list(range(STEPS))

    # the spike step the example found is traced, and holds rows of the binary page
    peak = summary["peak"]
    steps = {s["step"]: s for s in trace["steps"]}
    assert peak in steps
    junk = [
        seg
        for out_ in steps[peak]["outputs"]
        for row in out_["rows"]
        for seg in row["segments"]
        if seg["dataset_name"] == "scraped" and seg["dataset_row"] == junk_page()
    ]
    assert junk, steps[peak]
    # ... and its loss is above every loss of the run's second half without the spike
    lo, hi = summary["skip"]
    calm = [original[s][0] for s in range(STEPS // 2, STEPS) if not lo <= s < hi]
    assert original[peak][0] > max(calm)

    # the resume: from the traced checkpoint (at or before the spike), skipping exactly
    # the traced steps' positions (one output per Lightning step here)
    start = trace["checkpoint"]["step"]
    assert start % EVERY == 0 and start <= lo == min(steps) and hi == max(steps) + 1
    assert sorted(resumed) == list(range(start, STEPS))
    skipped = {original[s][1] for s in range(lo, hi)}
    assert not skipped & {fp for _, fp in resumed.values()}
    # a skip keeps positions: resumed step s trains on position s, or s + (hi - lo)
    # from the skipped range on, which is what the original run trained on there
    for s, (_, fp) in resumed.items():
        position = s if s < lo else s + (hi - lo)
        if position < STEPS:
            assert fp == original[position][1], (s, position)
    assert STEPS - hi >= 3  # several positions after the range were compared
    # the resumed run's checkpoints record the skip (later resumes repeat it)
    last = torch.load(out / "resumed_ckpts" / "last.ckpt", weights_only=False)
    assert skipped_ranges(last["zephon"]["state"]) == [(lo, hi)]

    png = out / "loss_spike.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    assert matplotlib.image.imread(png).shape[:2] == (440, 990)  # 9 x 4 in at 110 dpi
