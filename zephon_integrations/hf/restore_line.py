"""The restore line (``zephon_core/engine/restore_log.py``) in the HF Trainer's own log.

The Trainer logs through the ``transformers`` loggers, which print WARNING and above by
default: ``TrainingArguments(log_level="passive")`` keeps the library's level, so even
the Trainer's own INFO lines ("***** Running training *****", "Continuing training
from checkpoint") are hidden. The restore line goes to ``transformers.trainer`` at
WARNING on the process that logs (``args.should_log``): one line a default run shows,
which ``log_level="error"`` or ``TRANSFORMERS_VERBOSITY=error`` silence like the rest.
The other processes keep theirs on ``zephon_core.restore``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from transformers.utils import logging as hf_logging

__all__ = ["shown_by_transformers"]


def shown_by_transformers(args: Any) -> Callable[[str], bool]:
    """The ``show`` of ``restore_lines_to`` for a ``train()`` with ``TrainingArguments``
    ``args``."""
    logger = hf_logging.get_logger("transformers.trainer")

    def show(line: str) -> bool:
        if not args.should_log:
            return False
        logger.log(logging.WARNING, "%s", line)
        return True

    return show
