"""``TrainingArguments`` (and Trainer overrides) that have no effect on a Zephon stream.

The Trainer reads them only to build a sampler or a map-style DataLoader; for Zephon's
stream the pipeline decides order, grouping and batching, and Zephon's own loader owns
the worker processes. transformers ignores most of them for an IterableDataset with at
most an INFO line, so a job that relies on one would train on another order without a
word: :func:`warn_ignored_options` says so once, at WARNING level. The list follows
``Trainer._get_dataloader`` / ``_get_train_sampler`` of transformers 5.x.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

log = logging.getLogger(__name__)


def ignored_options(args: Any, trainer: Any | None) -> list[str]:
    """The options in ``args`` (and ``trainer``'s class) that Zephon's stream ignores, each
    with what decides instead."""
    from transformers import Trainer

    out = []
    strategy = getattr(args, "train_sampling_strategy", "random")
    if strategy != "random":
        out.append(
            f"train_sampling_strategy={strategy!r} (the pipeline orders and groups the "
            "data: shuffle(), pack(), batch())"
        )
    cls = type(trainer) if trainer is not None else None
    if cls is not None and getattr(cls, "_get_train_sampler", None) is not getattr(
        Trainer, "_get_train_sampler", None
    ):
        out.append(f"{cls.__qualname__}._get_train_sampler (a stream has no sampler)")
    if getattr(args, "data_seed", None) is not None:
        out.append("data_seed (the data order follows Pipeline(seed=...))")
    if getattr(args, "dataloader_drop_last", False):
        out.append("dataloader_drop_last=True (the pipeline's batch(drop_last=...) decides)")
    if getattr(args, "dataloader_persistent_workers", False):
        out.append(
            "dataloader_persistent_workers=True (Zephon's loader starts its workers "
            "from the consumed state)"
        )
    if getattr(args, "dataloader_multiprocessing_context", None):
        out.append(
            f"dataloader_multiprocessing_context={args.dataloader_multiprocessing_context!r} "
            "(Zephon's workers start with torch's default)"
        )
    if not getattr(args, "dataloader_in_order", True):
        out.append(
            "dataloader_in_order=False (Zephon's loader delivers in lane order, which "
            "the exact resume needs)"
        )
    return out


def warn_ignored_options(args: Any, trainer: Any | None, who: str) -> list[str]:
    """One WARNING naming every ignored option (none: nothing logged); returns them."""
    found = ignored_options(args, trainer)
    if found:
        log.warning(
            "%s: these Trainer options have no effect on the Zephon stream: %s",
            who,
            "; ".join(found),
        )
    return found


def constructing_trainer() -> Any | None:
    """The ``transformers.Trainer`` whose ``__init__`` (or method) is on the call stack:
    a callback's ``on_init_end`` is not given it."""
    from transformers import Trainer

    frame = sys._getframe(1)
    while frame is not None:
        obj = frame.f_locals.get("self")
        if isinstance(obj, Trainer):
            return obj
        frame = frame.f_back
    return None
