"""A dataset whose length changed under a checkpoint: a data change, named, and accepted
only on request. (``docs/design.md`` §8)

Why: a shard deleted or appended, or a list grown, changes a dataset's row count, which
is part of the configuration; a restore used to call that a mixture change and point at
``allow_changes={'weights', 'components'}``, which only led to the next refusal. The
mixture did not change, the data did: the refusal names the dataset, its rows before and
after and, for a sharded dataset, the shards deleted, appended or rewritten
(``digests/manifest.py``).

Resuming over the new data cannot be exact: each epoch's order is a permutation of the
dataset's rows keyed by its length, so a new length draws the epoch in progress anew --
appending rows included. ``allow_changes={"data"}`` continues anyway: every dataset
keeps its position (the rows it has read count), the epoch in progress is drawn again
over the new rows (rows already delivered in it may come again, others wait for the next
epoch), and inflight pointers past a dataset's new end wrap around to its start (they
are read again at the same places, so replay stays aligned; their values are new).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from ..chunk import WorkChunk
from ..digests.manifest import describe_change
from ..errors import CorruptCheckpoint, IncompatibleCheckpoint
from .state import PipelineState

log = logging.getLogger(__name__)

__all__ = ["accept_resized", "resized", "resized_refusal"]


def resized(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[tuple[str, int, int]]:
    """``(name, rows in checkpoint, rows now)`` of every dataset in both configurations
    whose row count differs."""
    a, b = saved.get("source"), current.get("source")
    try:
        old = dict(zip(a["names"], a["lengths"], strict=True))
        new = dict(zip(b["names"], b["lengths"], strict=True))
    except (KeyError, TypeError, ValueError):
        return []
    return [(n, int(old[n]), int(new[n])) for n in new if n in old and old[n] != new[n]]


def resize_lines(saved: Mapping[str, Any], current: Mapping[str, Any]) -> set[str]:
    """The config-diff paths a resized dataset explains: its length and, when its
    documents' token lengths are known, their digest (it changes with the rows)."""
    names = set(n for n, _, _ in resized(saved, current))
    a, b = saved.get("source") or {}, current.get("source") or {}
    old, new = list(a.get("names") or []), list(b.get("names") or [])
    same = [i for i, n in enumerate(new) if n in names and i < len(old) and old[i] == n]
    return {f"source.{key}[{i}]" for i in same for key in ("lengths", "token_lengths")}


def resized_refusal(
    changes: Iterable[tuple[str, int, int]],
    saved_content: Mapping[str, Any] | None,
    now_content: Mapping[str, Any] | None,
    also: list[str],
) -> IncompatibleCheckpoint:
    """The refusal of a restore over datasets whose length changed."""
    a = (saved_content or {}).get("components", {})
    b = (now_content or {}).get("components", {})
    said = []
    for name, before, after in changes:
        why = describe_change(a[name], b[name]) if name in a and name in b else None
        said.append(f"dataset {name!r}: " + (why or f"{before} rows -> {after}"))
    return IncompatibleCheckpoint(
        "the data changed since the checkpoint (its length, not the mixture): "
        + "; ".join(said)
        + ". To resume exactly, restore the data as it was (the shards back as they "
        "were). To continue over the new data, pass allow_changes={'data'}: each dataset "
        "keeps its position, but the epoch in progress is drawn again over the new rows "
        "(rows already delivered in it may come again, others wait for the next epoch; "
        "appending rows does not avoid this: an epoch's order depends on the length)"
        + (
            ". Also differs (rebuild the pipeline as it was for these): " + "; ".join(also[:10])
            if also
            else ""
        )
    )


def accept_resized(state: PipelineState, plan: Any) -> PipelineState:
    """``state`` for ``plan``'s datasets of other lengths (``allow_changes={"data"}``):
    the plan's configuration, inflight pointers past a new end wrapped around.

    Raises:
        IncompatibleCheckpoint: a lane's position no longer fits (a dataset capped by
            ``num_epochs`` has read past its new end).
    """
    changes = resized(state.config, plan.config)
    if not changes:
        return state
    lengths = list(plan.source.lengths or ())  # None: the source does not say
    wrapped = 0
    lanes = {}
    for lane, ls in state.lanes.items():
        chunks = []
        for ch in ls.chunks:
            rows = tuple(
                r % lengths[c] if c < len(lengths) else r
                for c, r in zip(ch.components, ch.rows, strict=True)
            )
            wrapped += sum(a != b for a, b in zip(rows, ch.rows, strict=True))
            chunks.append(WorkChunk(ch.lane, ch.chunk_id, ch.components, rows, ch.seed, ch.dropped))
        new = ls.copy()
        new.chunks = chunks
        lanes[lane] = new
        try:
            plan.source.open_lane(lane, plan.num_lanes, plan.seed).load_state_dict(ls.source)
        except CorruptCheckpoint as e:
            raise IncompatibleCheckpoint(
                f"lane {lane}'s position does not fit the resized datasets "
                f"{[n for n, _, _ in changes]} ({e}): a dataset capped by num_epochs has read "
                "past its new end; start a new run over the new data"
            ) from e
    log.warning(
        "continuing over changed data (allow_changes={'data'}): %s; the epoch in progress "
        "of each is drawn again over its new rows%s",
        ", ".join(f"{n!r} {a} -> {b} rows" for n, a, b in changes),
        f"; {wrapped} inflight pointers past a new end wrapped around" if wrapped else "",
    )
    return dataclasses.replace(state, fingerprint=plan.fingerprint, config=plan.config, lanes=lanes)
