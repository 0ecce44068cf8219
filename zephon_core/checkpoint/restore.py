"""Admitting a checkpoint into a pipeline: every check happens before any work.
(``docs/design.md`` §8)

:func:`admit` is the one gate every restore passes (``load_state_dict``,
``iterate(restore=)``, ``dataloader(restore=)``, the integrations):

1. schema -- ``PipelineState.from_dict`` reads keys and types strictly;
2. content -- a digest per component and per map/filter function (``digests/content.py``),
   named part by part when it differs (``digests/content_diff.py``); for a state written
   before per-part digests, recomputed by its release's rules first
   (``legacy_content.py``); ``allow_changes={"data"}`` / ``{"functions"}`` accept a
   deliberate change (positions continue, values may differ). First, because a
   changed function or dataset also moves the token lengths the pipeline estimated:
   the cause is reported, not the mixture;
3. configuration -- the fingerprint, with a diff naming what differs
   (``allow_changes={"weights"}`` / ``{"weights", "components"}`` re-mix instead:
   ``remix.py``); a state whose configuration still names map/filter functions by
   module (earlier versions) was read without those names by ``from_dict``;
4. progress -- lane progress consistent with one global position;
5. ranges -- every lane field against this pipeline: the source state (validated by
   the lane's own WorkSource), each inflight chunk's rows inside their datasets,
   boundaries, the replay cursor inside an inflight chunk, token counters; then each
   inflight chunk against the digest saved with it (a pointer changed in range).

A crafted or corrupted state therefore fails here with a typed error naming the
field, never later as a hang, a ``MemoryError`` or an ``IndexError`` mid-stream.

:func:`check_alone` runs the checks that need no pipeline (1, 4 and the lane fields
of 5 against the state's own configuration): what ``zephon inspect`` and ``zephon diff``
of two checkpoints apply, so they never call a state restorable that ``admit`` refuses.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable
from typing import Any

from ..digests.content_diff import content_changes, content_diff
from ..digests.fingerprint import config_diff
from ..errors import ConfigError, CorruptCheckpoint, IncompatibleCheckpoint, ZephonError
from ..validate import is_int
from .data_changes import DATA_CHANGES
from .legacy_content import function_fix, is_legacy, still_differ
from .owned_lanes import OwnedLanesState, lane_heads
from .provenance import version_note
from .remix import REMIX_CHANGES, classify_diff, mixture_only_diff, remix
from .resize import accept_resized, resized, resized_refusal
from .state import LaneState, PipelineState, check_chunk_digests, check_progress

__all__ = ["ALLOWED_CHANGES", "admit", "admit_owned", "allowed_changes", "content_changes"]

#: what ``allow_changes=`` may name
ALLOWED_CHANGES = frozenset({"data", "functions"}) | REMIX_CHANGES | DATA_CHANGES


def admit(
    state: Any,
    plan: Any,
    allow_changes: Iterable[str] = (),
    origin: str | None = None,
    lanes: Collection[int] | None = None,
) -> PipelineState:
    """Parse and validate ``state`` against ``plan``; returns the state to restore.

    Content is compared before the configuration: a changed tokenizer also moves the
    estimated token lengths (a configuration difference), and the function is the
    cause to report, not the mixture.

    Raises:
        CorruptCheckpoint: malformed, or a field out of range for this pipeline.
        IncompatibleCheckpoint: another configuration, other data or functions (unless
            allowed), or lane progress inconsistent with one global position.
        ConfigError: ``allow_changes`` names something unknown.

    ``lanes``: the lanes ``state`` holds when it is one rank's share of a per-rank state
    (``distributed/dcp.py``); only those are checked. Default: every lane.
    """
    allowed = allowed_changes(allow_changes)
    parsed = state if isinstance(state, PipelineState) else PipelineState.from_dict(state)
    if origin is not None:
        parsed = dataclasses.replace(parsed, origin=origin)
    same_config = parsed.fingerprint == plan.fingerprint
    other: list[str] = []
    mix: list[str] = []
    comp: list[str] = []
    if not same_config:
        other, mix, comp, _ = classify_diff(parsed.config, plan.config, plan.source, plan.ops)
    changed = resized(parsed.config, plan.config)  # datasets of another length (resize.py)
    if changed and "data" not in allowed:  # the root cause first: the data's length
        raise resized_refusal(changed, parsed.content, plan.content, other + mix + comp)
    changed_fns = _check_content(
        parsed, plan, allowed, [] if same_config else config_diff(parsed.config, plan.config)
    )
    # translate only what changed: a re-mix (which also takes resized datasets along) when
    # the mixture did and may, else a resize alone; allowing more changes nothing else
    remixing = bool(mix or comp) and bool(allowed & REMIX_CHANGES)
    if remixing or (changed and not (other or mix or comp)):
        for ls in parsed.lanes.values():
            check_chunk_digests(ls)  # the chunks as saved, before they are translated
        parsed = remix(parsed, plan, allowed) if remixing else accept_resized(parsed, plan)
    if parsed.fingerprint != plan.fingerprint:
        other, mix, comp = mixture_only_diff(parsed.config, plan.config, plan.source, plan.ops)
        diff = other + comp + mix
        hint = (
            " Only the mixture differs: to re-mix from here, pass "
            f"allow_changes={{{'weights'!r}{', ' + repr('components') if comp else ''}}}."
            if diff and not other
            else " Rebuild the pipeline exactly as it was when the checkpoint was taken."
        )
        note = version_note(parsed.written_by, diff)
        if any(_old_default_pack(line) for line in other):
            note = ""  # not the release's doing: the option below resumes it
            hint = (
                " pack() packs best fit by default now and this state was written by first "
                "fit: build the pipeline with pack(..., strategy='first_fit') to resume it."
            )
        if changed_fns and diff and all(_lengths_line(line) for line in diff):
            hint = (
                f" The estimated token lengths moved with the changed {changed_fns}: to "
                "re-mix with the new lengths, pass allow_changes={'functions', 'weights'}."
            )
        raise IncompatibleCheckpoint(
            "the checkpoint was written by a differently configured pipeline: "
            + ("; ".join(diff[:10]) if diff else "fingerprints differ")
            + "."
            + hint
            + note
        )
    if parsed.position < 0:
        raise CorruptCheckpoint(f"position {parsed.position} is negative")
    check_progress(parsed, plan.num_lanes, lanes)
    for ls in parsed.lanes.values():
        _check_lane(ls, plan)
    if allowed & {"data", "functions"}:  # values may differ by choice: do not compare them
        parsed = dataclasses.replace(
            parsed,
            lanes={lane: dataclasses.replace(ls, digest=None) for lane, ls in parsed.lanes.items()},
        )
    return parsed


def allowed_changes(allow_changes: Iterable[str], where: str = "allow_changes") -> frozenset[str]:
    """``allow_changes`` as a set of known names (a single string is one name); ``where``
    names the argument in the error (integrations check theirs when they are built, so a
    typo fails then, not at a resume hours later).

    Raises:
        ConfigError: an unknown name.
    """
    if isinstance(allow_changes, str):
        allow_changes = (allow_changes,)
    allowed = frozenset(allow_changes)
    unknown = sorted(allowed - ALLOWED_CHANGES)
    if unknown:
        raise ConfigError(
            f"{where}={sorted(allowed)}: unknown {unknown}; use any of {sorted(ALLOWED_CHANGES)}"
        )
    return allowed


def _old_default_pack(line: str) -> bool:
    """A diff line of a pack operator that packed first fit, the default before best fit."""
    return line.endswith(".strategy: 'first_fit' in checkpoint, 'best_fit' now")


def _lengths_line(line: str) -> bool:
    """A configuration difference in the token lengths the pipeline estimated."""
    return line.startswith("source.token_lengths")


def _moved(saved: dict[str, Any], now: dict[str, Any]) -> set[str]:
    """Datasets at another position than in the checkpoint: their sampled rows are picked
    by position, so their digests do not compare (the configuration check names the
    move)."""
    a = (saved.get("source") or {}).get("names")
    b = (now.get("source") or {}).get("names")
    if not isinstance(a, list) or not isinstance(b, list):
        return set()
    return {n for i, n in enumerate(a) if n in b and b.index(n) != i}


def _check_content(
    state: PipelineState, plan: Any, allowed: frozenset[str], config_lines: list[str]
) -> str:
    """Compare digests; raise on a change that is not allowed. Returns the allowed
    function changes, named (for the configuration check's message), or ""."""
    if state.content is None:  # a version-1 state: nothing to compare
        return ""
    changes = [
        c
        for c in content_diff(state.content, plan.content)
        if c.kind != "data" or c.name not in _moved(state.config, plan.config)
    ]
    legacy = is_legacy(state.content)
    if changes and legacy:  # digested by an earlier release's rules (legacy_content.py)
        changes = still_differ(changes, state.content, plan)
    refused = [c for c in changes if c.kind not in allowed]
    fns = [c.name for c in changes if c.kind == "functions"]
    if not refused:
        if not fns:
            return ""
        return ("function of operator " if len(fns) == 1 else "functions of operators ") + (
            ", ".join(repr(n) for n in fns)
        )
    kinds = sorted({c.kind for c in refused})
    fixes = {
        "data": "restore the data as it was",
        "functions": "restore the function, or, if it behaves the same (a refactor, another "
        "Python version), pin it with map(..., version=...)",
    }
    if legacy:
        fixes["functions"] = function_fix(state.written_by)
    also = ""
    if config_lines:
        moved = [line for line in config_lines if _lengths_line(line)]
        also = (
            " The estimated token lengths moved with it (" + "; ".join(moved[:3]) + ")."
            if moved and "functions" in kinds
            else ""
        )
        rest = [line for line in config_lines if not _lengths_line(line)]
        if rest:
            also += " The configuration differs too: " + "; ".join(rest[:5]) + "."
    raise IncompatibleCheckpoint(
        "the checkpoint was taken over other content: "
        + "; ".join(f"{k}: " + "; ".join(c.text for c in refused if c.kind == k) for k in kinds)
        + ". The stream would differ from the uninterrupted run."
        + also
        + " Fix: "
        + " / ".join(fixes[k] for k in kinds)
        + f"; or accept the change with load_state_dict(state, allow_changes="
        f"{sorted(set(kinds) | allowed)!r}) (positions continue, values come from the new "
        "content)"
    )


def check_alone(state: Any) -> PipelineState:
    """Parse ``state`` and check everything that needs no pipeline, against the state's own
    configuration: schema, position, lane progress, each lane's counters, boundaries and
    replay cursor. Returns the parsed state.

    Raises:
        CorruptCheckpoint / IncompatibleCheckpoint: as :func:`admit` would for them.
    """
    parsed = state if isinstance(state, PipelineState) else PipelineState.from_dict(state)
    if parsed.position < 0:
        raise CorruptCheckpoint(f"position {parsed.position} is negative")
    config = parsed.config
    lanes, k = config.get("canonical_replicas"), config.get("flush_every_k_chunks")
    if not is_int(lanes) or not is_int(k) or lanes < 1 or k < 0:
        raise CorruptCheckpoint(
            f"config has canonical_replicas={lanes!r}, flush_every_k_chunks={k!r}: not the "
            "configuration of a Zephon pipeline"
        )
    source = config.get("source")
    names = source.get("names") if isinstance(source, dict) else None
    n_comp = len(names) if isinstance(names, list) else None  # a custom source may not say
    check_progress(parsed, lanes)
    for ls in parsed.lanes.values():
        _check_lane_fields(ls, n_comp, k)
        check_chunk_digests(ls)
    return parsed


def _check_lane(ls: LaneState, plan: Any) -> None:
    where = f"lane {ls.lane}"
    _check_lane_fields(ls, len(plan.source.component_names), plan.k)
    if ls.prior is not None:  # every operator named in the prior keeps mixture targets here
        mixing = {op.name for op in plan.ops if op.mixture_keys}
        for name, _targets in ls.prior.ops:
            if name not in mixing:
                raise CorruptCheckpoint(
                    f"{where}: prior targets of {name!r}: no operator of this pipeline with "
                    f"mixture targets has that name ({sorted(mixing)})"
                )
    for chunk in ls.chunks:
        plan.source.check_chunk(chunk)
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
    next_id = plan.source.resumes_at(src)
    if next_id is not None and next_id != ls.next_chunk:
        raise CorruptCheckpoint(
            f"{where}: next_chunk={ls.next_chunk} but the source state continues at chunk {next_id}"
        )
    check_chunk_digests(ls)  # after the range checks, which say more about what is wrong


def _check_lane_fields(ls: LaneState, n_comp: int | None, k: int) -> None:
    """The lane's own fields, against the number of datasets (None: unknown) and ``k``."""
    where = f"lane {ls.lane}"
    for name in ("floor", "next_chunk", "delivered"):
        if getattr(ls, name) < 0:
            raise CorruptCheckpoint(f"{where}: {name}={getattr(ls, name)} is negative")
    n = len(ls.tokens) if n_comp is None else n_comp
    if len(ls.tokens) != n or any(t < 0 for t in ls.tokens):
        raise CorruptCheckpoint(f"{where}: tokens {ls.tokens[:8]} must be {n} counts >= 0")
    if ls.prior is not None:
        for name, targets in ((None, ls.prior.targets), *ls.prior.ops):
            if len(targets) != n:
                raise CorruptCheckpoint(
                    f"{where}: prior targets {targets} of {name or 'the source'!r} must be "
                    f"{n} weights"
                )
    if ls.exhausted and (ls.chunks or ls.boundaries):
        raise CorruptCheckpoint(f"{where}: an ended lane holds inflight chunks or boundaries")
    _check_boundaries(ls, k, where)
    _check_cursor(ls, where)


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


def admit_owned(
    state: Any,
    plan: Any,
    dp_rank: int,
    dp_size: int,
    allow_changes: Iterable[str] = (),
    origin: str | None = None,
) -> PipelineState:
    """:func:`admit` for data-parallel rank ``dp_rank`` of ``dp_size``: decodes and
    validates only the lanes it owns at the state's position (``owned_lanes.py``); the
    other lanes' progress is checked, their dicts kept as read.

    Anything else than a plain, well-formed state of this configuration -- a parsed
    state, one rank, another configuration (re-mix, resize or refusal), a malformed lane
    list -- goes through :func:`admit` whole, so every refusal says what it said before.
    """
    heads = lane_heads(state.get("lanes")) if isinstance(state, dict) else None
    position = state.get("position") if isinstance(state, dict) else None
    if dp_size == 1 or heads is None or not is_int(position) or position < 0:
        return admit(state, plan, allow_changes, origin)
    allowed = allowed_changes(allow_changes)
    mine = {lane for lane in heads if (lane - position) % dp_size == dp_rank}
    raw = state["lanes"]
    partial = PipelineState.from_dict({**state, "lanes": [d for d in raw if d["lane"] in mine]})
    if partial.fingerprint != plan.fingerprint or resized(partial.config, plan.config):
        return admit(state, plan, allow_changes, origin)
    # the one admission of a rank's share (a per-rank DCP state takes it too: dcp.py)
    admitted = admit(partial, plan, allowed, origin, lanes=mine)
    check_progress(dataclasses.replace(partial, lanes=heads), plan.num_lanes)  # every lane
    others = [d for d in raw if d["lane"] not in mine]
    if allowed & {"data", "functions"}:  # values may differ by choice (as admit does)
        others = [{**d, "digest": None} for d in others]
    return OwnedLanesState.of(admitted, dp_rank, dp_size, others, allowed)
