"""Admitting a checkpoint into a pipeline: every check happens before any work.
(``docs/design.md`` §8)

:func:`admit` is the one gate every restore passes (``load_state_dict``,
``iterate(restore=)``, ``dataloader(restore=)``, the integrations):

1. schema -- ``PipelineState.from_dict`` reads keys and types strictly;
2. configuration -- the fingerprint, with a diff naming what differs;
   (``allow_changes={"weights"}`` / ``{"weights", "components"}`` re-mix instead:
   ``remix.py``);
3. content -- a digest per component and per map/filter function
   (``content.py``); ``allow_changes={"data"}`` / ``{"functions"}`` accept a
   deliberate change (positions continue, values may differ);
4. progress -- lane progress consistent with one global position;
5. ranges -- every lane field against this pipeline: the source state (validated by
   the lane's own WorkSource), each inflight chunk's rows inside their datasets,
   boundaries, the replay cursor inside an inflight chunk, token counters.

A crafted or corrupted state therefore fails here with a typed error naming the
field, never later as a hang, a ``MemoryError`` or an ``IndexError`` mid-stream.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from ..errors import ConfigError, CorruptCheckpoint, IncompatibleCheckpoint, ZephonError
from .manifest import describe_change, differs, digest_of
from .remix import REMIX_CHANGES, classify_diff, mixture_only_diff, remix
from .resize import accept_resized, resized, resized_refusal
from .state import LaneState, PipelineState, check_progress

#: what ``allow_changes=`` may name
ALLOWED_CHANGES = frozenset({"data", "functions"}) | REMIX_CHANGES


def admit(
    state: Any, plan: Any, allow_changes: Iterable[str] = (), origin: str | None = None
) -> PipelineState:
    """Parse and validate ``state`` against ``plan``; returns the state to restore.

    Raises:
        CorruptCheckpoint: malformed, or a field out of range for this pipeline.
        IncompatibleCheckpoint: another configuration, other data or functions (unless
            allowed), or lane progress inconsistent with one global position.
        ConfigError: ``allow_changes`` names something unknown.
    """
    allowed = _allowed(allow_changes)
    parsed = state if isinstance(state, PipelineState) else PipelineState.from_dict(state)
    if origin is not None:
        parsed = dataclasses.replace(parsed, origin=origin)
    if parsed.fingerprint != plan.fingerprint and allowed & REMIX_CHANGES:
        parsed = remix(parsed, plan, allowed)  # a deliberate change of the mixture
    changed = resized(parsed.config, plan.config)  # datasets of another length (resize.py)
    if changed and parsed.fingerprint != plan.fingerprint:
        other, mix, comp, _ = classify_diff(parsed.config, plan.config, plan.source)
        if "data" not in allowed:  # the root cause first: the data changed, not the mixture
            raise resized_refusal(changed, parsed.content, plan.content, other + mix + comp)
        if not (other or mix or comp):
            parsed = accept_resized(parsed, plan)
    if parsed.fingerprint != plan.fingerprint:
        other, mix, comp = mixture_only_diff(parsed.config, plan.config, plan.source)
        diff = other + comp + mix
        hint = (
            " Only the mixture differs: to re-mix from here, pass "
            f"allow_changes={{{'weights'!r}{', ' + repr('components') if comp else ''}}}."
            if diff and not other
            else " Rebuild the pipeline exactly as it was when the checkpoint was taken."
        )
        raise IncompatibleCheckpoint(
            "the checkpoint was written by a differently configured pipeline: "
            + ("; ".join(diff[:10]) if diff else "fingerprints differ")
            + "."
            + hint
        )
    _check_content(parsed, plan, allowed)
    if parsed.position < 0:
        raise CorruptCheckpoint(f"position {parsed.position} is negative")
    check_progress(parsed, plan.num_lanes)
    for ls in parsed.lanes.values():
        _check_lane(ls, plan)
    if allowed & {"data", "functions"}:  # values may differ by choice: do not compare them
        parsed = dataclasses.replace(
            parsed,
            lanes={lane: dataclasses.replace(ls, digest=None) for lane, ls in parsed.lanes.items()},
        )
    return parsed


def _allowed(allow_changes: Iterable[str]) -> frozenset[str]:
    if isinstance(allow_changes, str):
        allow_changes = (allow_changes,)
    allowed = frozenset(allow_changes)
    unknown = sorted(allowed - ALLOWED_CHANGES)
    if unknown:
        raise ConfigError(
            f"allow_changes={sorted(allowed)}: unknown {unknown}; use any of "
            f"{sorted(ALLOWED_CHANGES)}"
        )
    return allowed


def content_changes(saved: dict, now: dict) -> dict[str, list[str]]:
    """Content digests that differ between a checkpoint's and a pipeline's (``data``:
    datasets, ``functions``: map/filter functions), as sentences. Names present on one
    side only are configuration changes, which the fingerprint reports."""
    found: dict[str, list[str]] = {"data": [], "functions": []}
    for part, kind, what in (
        ("components", "data", "dataset"),
        ("ops", "functions", "function of operator"),
    ):
        a, b = saved.get(part, {}), now.get(part, {})
        for name in sorted(set(a) & set(b)):
            # a dataset's fingerprint may carry a manifest of its shards: it explains a
            # change, only the digest decides one (manifest.py)
            if differs(a[name], b[name]) if kind == "data" else a[name] != b[name]:
                why = describe_change(a[name], b[name]) if kind == "data" else None
                found[kind].append(
                    f"{what} {name!r} ({digest_of(a[name])} in checkpoint, "
                    f"{digest_of(b[name])} now{'; ' + why if why else ''})"
                )
    return found


def _check_content(state: PipelineState, plan: Any, allowed: frozenset[str]) -> None:
    """Compare digests; raise on a change that is not allowed."""
    if state.content is None:  # a version-1 state: nothing to compare
        return
    found = content_changes(state.content, plan.content)
    refused = [(kind, items) for kind, items in found.items() if items and kind not in allowed]
    if refused:
        fixes = {
            "data": "restore the data as it was",
            "functions": "restore the function (or pin an unchanged one with "
            "map(..., version=...); byte code also changes with the Python version)",
        }
        raise IncompatibleCheckpoint(
            "the checkpoint was taken over other content: "
            + "; ".join(f"{k}: " + ", ".join(items) for k, items in refused)
            + ". The stream would differ from the uninterrupted run. "
            + " / ".join(fixes[k] for k, _ in refused)
            + f", or accept the change with load_state_dict(state, allow_changes="
            f"{sorted({k for k, _ in refused} | allowed)!r}) (positions continue, "
            "values come from the new content)"
        )


def _check_lane(ls: LaneState, plan: Any) -> None:
    where = f"lane {ls.lane}"
    for name in ("floor", "next_chunk", "delivered"):
        if getattr(ls, name) < 0:
            raise CorruptCheckpoint(f"{where}: {name}={getattr(ls, name)} is negative")
    n_comp = len(plan.source.component_names)
    if len(ls.tokens) != n_comp or any(t < 0 for t in ls.tokens):
        raise CorruptCheckpoint(f"{where}: tokens {ls.tokens[:8]} must be {n_comp} counts >= 0")
    if ls.prior is not None and len(ls.prior[1]) != n_comp:
        raise CorruptCheckpoint(f"{where}: prior targets {ls.prior[1]} must be {n_comp} weights")
    if ls.exhausted and (ls.chunks or ls.boundaries):
        raise CorruptCheckpoint(f"{where}: an ended lane holds inflight chunks or boundaries")
    _check_boundaries(ls, plan.k, where)
    _check_cursor(ls, where)
    check = getattr(plan.source, "check_chunk", None)
    if check is not None:
        for chunk in ls.chunks:
            check(chunk)
    try:
        src = plan.source.open_lane(ls.lane, plan.num_lanes, plan.seed)
        src.load_state_dict(ls.source)
    except CorruptCheckpoint:
        raise
    except ZephonError as e:
        raise CorruptCheckpoint(f"{where}: the source state does not fit this source: {e}") from e
    except Exception as e:  # noqa: BLE001 - a custom source's own validation
        raise CorruptCheckpoint(
            f"{where}: the source rejected its saved state ({type(e).__name__}: {e})"
        ) from e
    next_id = getattr(src, "next_chunk_id", None)
    if next_id is not None and next_id != ls.next_chunk:
        raise CorruptCheckpoint(
            f"{where}: next_chunk={ls.next_chunk} but the source state continues at chunk {next_id}"
        )


def _check_boundaries(ls: LaneState, k: int, where: str) -> None:
    prev = ls.floor
    for b in ls.boundaries:
        if not prev < b <= ls.next_chunk:
            raise CorruptCheckpoint(
                f"{where}: boundary {b} is not increasing inside ({ls.floor}, {ls.next_chunk}] "
                f"(boundaries {ls.boundaries[:10]})"
            )
        if k == 0 or b % k:
            raise CorruptCheckpoint(
                f"{where}: boundary {b} does not fall every flush_every_k_chunks={k} chunks"
            )
        prev = b


def _check_cursor(ls: LaneState, where: str) -> None:
    cur = ls.cursor
    if (cur is None) != (ls.delivered == 0):
        raise CorruptCheckpoint(
            f"{where}: replay cursor {cur} does not fit delivered={ls.delivered}"
        )
    if cur is None:
        return
    if cur.lane != ls.lane or min(cur) < 0:
        raise CorruptCheckpoint(f"{where}: replay cursor {tuple(cur)} is not a cursor of this lane")
    if ls.exhausted:
        return  # the lane ended: nothing is replayed
    if not ls.floor <= cur.chunk_id < ls.next_chunk:
        raise CorruptCheckpoint(
            f"{where}: replay cursor {tuple(cur)} points outside the inflight chunks "
            f"[{ls.floor}, {ls.next_chunk}): replay could never find it"
        )
    chunk = ls.chunks[cur.chunk_id - ls.floor]
    if cur.offset >= len(chunk):
        raise CorruptCheckpoint(
            f"{where}: replay cursor {tuple(cur)} points past the "
            f"{len(chunk)} samples of chunk {cur.chunk_id}"
        )
