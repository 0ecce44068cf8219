"""A resumed fit/train shows the restore line where the trainer's users look, at the
level the trainer prints by default: Lightning's INFO (``rank_zero_info``), the HF
Trainer's ``transformers`` logger at WARNING. One line, not also Zephon's own."""

from __future__ import annotations

import logging
import re

import pytest
import transformers
from hf_helpers import hf_train
from lightning_helpers import fit

PATTERN = re.compile(
    r"zephon: restored from (?P<origin>.+) at global position (?P<pos>\d+): lanes "
    r"\[[\d, ]+\], \d+ inflight chunks to replay, first output after \d+ ms"
)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if PATTERN.fullmatch(record.getMessage()):
            self.records.append(record)


@pytest.fixture
def restore_lines():
    """Restore lines reaching ``lightning.pytorch``, ``transformers`` or Zephon's own
    ``zephon_core.restore`` (opened to INFO here, to see that it gets none)."""
    seen = _Records()
    loggers = [logging.getLogger(n) for n in ("lightning.pytorch", "transformers")]
    zephon = logging.getLogger("zephon_core.restore")
    level = zephon.level
    zephon.setLevel(logging.INFO)
    for logger in [*loggers, zephon]:
        logger.addHandler(seen)
    try:
        yield seen.records
    finally:
        zephon.setLevel(level)
        for logger in [*loggers, zephon]:
            logger.removeHandler(seen)


def test_a_resumed_lightning_fit_shows_one_restore_line(tmp_path, restore_lines):
    fit(max_steps=5, ckpt_dir=str(tmp_path / "a"))  # saves last.ckpt at step 5
    assert restore_lines == []  # a fresh start restores nothing
    fit(max_steps=8, ckpt_dir=str(tmp_path / "b"), ckpt_path=str(tmp_path / "a" / "last.ckpt"))
    (line,) = restore_lines
    assert line.name.startswith("lightning.pytorch.")
    # Lightning sets its loggers to INFO and prints them (its own "Restoring states" line)
    assert logging.getLogger(line.name).isEnabledFor(line.levelno)
    m = PATTERN.fullmatch(line.getMessage())
    assert m["origin"].endswith("last.ckpt") and int(m["pos"]) == 5


@pytest.mark.parametrize("path", ["callback", "trainer"])
def test_a_resumed_hf_train_shows_one_restore_line(tmp_path, restore_lines, path):
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_warning()  # the default (log_level="passive")
    try:
        hf_train(path, tmp_path, 6, crash_at=3)
        assert restore_lines == []
        hf_train(path, tmp_path, 6, resume=True)
        (line,) = restore_lines
        # at the default verbosity (an earlier test may have left another one behind)
        assert logging.getLogger(line.name).isEnabledFor(line.levelno)
    finally:
        transformers.logging.set_verbosity(verbosity)
    assert line.name == "transformers.trainer" and line.levelno == logging.WARNING
    m = PATTERN.fullmatch(line.getMessage())
    assert m["origin"].endswith("checkpoint-3") and int(m["pos"]) == 3
