"""The README's S3 Parquet example, run as a user runs it: a Lightning job over Parquet
shards in a real S3-compatible server, stopped and resumed, identical after the resume."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import hang_guard_s

# every test here starts processes (see tests/conftest.py)
pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_the_s3_parquet_lightning_example_resumes_exactly():
    done = subprocess.run(
        [sys.executable, "parquet_s3_lightning.py", "--steps", "8"],
        cwd=EXAMPLES,
        capture_output=True,
        text=True,
        timeout=hang_guard_s(900),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "identical: the 8 batches and losses after the resume match" in done.stdout
    assert "zephon/io/prose/row_group_reads" in done.stdout  # counted in the workers
