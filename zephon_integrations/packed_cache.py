"""Packed batches and the model's KV cache.

Transformers (5.x) derives a per-document causal mask from restarting ``position_ids``
only when no attention mask is given *and no cache is built*; with
``config.use_cache=True`` (the default of most causal LMs' configs, also in training)
attention silently crosses the documents of a packed row. The Trainer sets
``config.use_cache = args.use_cache`` (False by default); when a user turns it on and a
Zephon pipeline emits packed rows with ``attention="position_ids"`` (the default), the
integrations turn the model's cache off for training (and back on when it ends) and
warn: the HF Trainer's model, and every Transformers model inside a Lightning module
(``tests/integrations/test_packed_models.py`` shows both behaviours on GPT-2 and
Llama). Shared by both integrations; imports neither.
"""

from __future__ import annotations

import logging
from typing import Any

from zephon_core import Pipeline

log = logging.getLogger(__name__)


def needs_cache_off(pipe: Pipeline) -> bool:
    """The pipeline's batches tell documents apart by ``position_ids`` alone."""
    plan = pipe.compile()
    if plan.batch_index is None:
        return False
    op = plan.ops[plan.batch_index]
    return bool(getattr(op, "packed", False)) and getattr(op, "attention", "") == "position_ids"


def _configs_with_cache(model: Any) -> list[Any]:
    """The configs of ``model`` (or, for a torch module, of it and every submodule: a
    LightningModule wraps the Transformers model) that build a KV cache."""
    model = getattr(model, "module", model)  # DDP / accelerate wrappers
    found = [model]
    if callable(getattr(model, "modules", None)):
        found += list(model.modules())
    configs: dict[int, Any] = {}
    for m in found:
        config = getattr(m, "config", None)
        if config is not None and getattr(config, "use_cache", False) is True:
            configs[id(config)] = config
    return list(configs.values())


def turn_cache_off(model: Any, pipe: Pipeline) -> list[Any]:
    """Set ``config.use_cache = False`` on the model's Transformers configs when packed
    rows need it; returns the configs it changed, for ``restore_cache`` when training
    ends (``generate()`` afterwards wants its cache back)."""
    configs = _configs_with_cache(model) if model is not None else []
    if not configs or not needs_cache_off(pipe):
        return []
    for config in configs:
        config.use_cache = False
    log.warning(
        "Zephon: the pipeline packs documents into rows and marks them by position_ids; "
        "model.config.use_cache is set to False so Transformers keeps attention inside "
        "each document (with a cache it would not); it is turned back on when training ends"
    )
    return configs


def restore_cache(configs: list[Any]) -> None:
    """Turn the cache back on where ``turn_cache_off`` turned it off."""
    for config in configs:
        config.use_cache = True
