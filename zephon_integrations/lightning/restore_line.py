"""The restore line (``zephon_core/engine/restore_log.py``) in Lightning's own log.

Lightning prints INFO messages of its ``lightning.pytorch`` loggers by default (it logs
"Restoring states from the checkpoint path at ..." there), while Zephon's INFO logger
is hidden by a default Python logging setup. So during a fit the line goes through
``rank_zero_info``, right after Lightning's own restore lines: one line, from global
rank 0; the other ranks keep theirs on ``zephon_core.restore``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lightning.pytorch.utilities.rank_zero import rank_zero_info

__all__ = ["shown_by_lightning"]


def shown_by_lightning(trainer: Any) -> Callable[[str], bool]:
    """The ``show`` of ``restore_lines_to`` for a fit of ``trainer``."""

    def show(line: str) -> bool:
        if not trainer.is_global_zero:
            return False
        rank_zero_info(line)
        return True

    return show
