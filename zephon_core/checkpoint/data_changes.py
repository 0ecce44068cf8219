"""Skipped positions and excluded documents: deliberate data changes a state records.
(``docs/design.md`` §6, §8)

Two decisions a user takes at a restore, typically after a loss spike, and that every
later resume must repeat:

* ``skip_batches=[(start, end), ...]`` -- global output positions (half-open) the
  pipeline still produces (so every later position and batch is what a run that
  trained on them would get) but hands to no consumer;
* ``exclude={"dataset": [row, ...]}`` -- dataset rows removed from every chunk read
  after the restore: a read chunk marks them (``WorkChunk.dropped``) and they become
  tombstones, as a filter's drops do. Chunks already inflight in the state were read
  before and replay as they were read, so the replay stays exact; the marks travel with
  every chunk that was read with them, so a later resume replays the same drops.

Both are recorded in the state (``"skip"``, ``"exclude"``, written only when not empty:
a state without them reads as "none") and compared at every restore that passes them,
beside the configuration fingerprint (not hashed into it: the fingerprint identifies the
pipeline description, and a refusal here names the skip list or the rows, not a
configuration diff). The rule (:func:`resolve`):

* not passed (``None``): the recorded decision holds -- a later resume neither re-skips
  nor un-skips;
* passed and equal to the record from the state's position on: accepted as is;
* passed and different: ``IncompatibleCheckpoint`` naming both and the fix, unless
  ``allow_changes={"skip"}`` / ``{"exclude"}``;
* skip ranges before the state's position are history: kept as recorded; a range there
  the record lacks is a ``ConfigError`` (those outputs were already delivered);
* with ``D`` data-parallel ranks every skip range from the restore position on must cover
  whole steps (start and end at ``g0 + k*D``): ranks skip together or none would stay in
  lockstep (:func:`check_aligned`, ``ConfigError`` naming the aligned bounds).

:func:`skipped_ranges` / :func:`excluded_rows` read the decisions from a state dict (for
``zephon inspect`` and ``zephon trace``); :func:`step_positions` maps trainer steps to
global positions.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, CorruptCheckpoint, IncompatibleCheckpoint
from ..validate import is_int

__all__ = [
    "DATA_CHANGES",
    "NO_CHANGES",
    "DataChanges",
    "check_aligned",
    "excluded_rows",
    "fresh_changes",
    "resolve",
    "skipped_ranges",
    "step_positions",
    "with_data_changes",
]

#: the ``allow_changes`` names of these decisions
DATA_CHANGES = frozenset({"skip", "exclude"})

Ranges = tuple[tuple[int, int], ...]
Excluded = tuple[tuple[str, tuple[int, ...]], ...]


@dataclass(frozen=True)
class DataChanges:
    """The recorded decisions: ``skip`` (sorted, disjoint, non-adjacent half-open global
    position ranges) and ``exclude`` ((dataset name, sorted rows), by name)."""

    skip: Ranges = ()
    exclude: Excluded = ()

    def __bool__(self) -> bool:
        return bool(self.skip or self.exclude)

    def skipped(self, position: int) -> bool:
        """Global output ``position`` is handed to no consumer."""
        skip = self.skip
        if not skip:
            return False
        i = bisect.bisect_right(skip, (position, float("inf"))) - 1
        return i >= 0 and skip[i][0] <= position < skip[i][1]

    def excluded_by_component(self, names: Sequence[str]) -> dict[int, frozenset[int]]:
        """The excluded rows per component index of a source with ``names``.

        Raises:
            ConfigError: a dataset name the source does not have.
        """
        out: dict[int, frozenset[int]] = {}
        for name, rows in self.exclude:
            if name not in names:
                raise ConfigError(
                    f"exclude={{{name!r}: ...}}: the pipeline has no dataset {name!r}; "
                    f"its datasets are {list(names)}"
                )
            out[list(names).index(name)] = frozenset(rows)
        return out

    def to_state(self) -> dict[str, Any]:
        """The state keys (none when there is nothing to record)."""
        out: dict[str, Any] = {}
        if self.skip:
            out["skip"] = [[s, e] for s, e in self.skip]
        if self.exclude:
            out["exclude"] = {name: list(rows) for name, rows in self.exclude}
        return out

    @classmethod
    def from_state(cls, d: Mapping[str, Any]) -> DataChanges:
        """Read ``"skip"`` / ``"exclude"`` of a state dict (absent: none).

        Raises:
            CorruptCheckpoint: malformed.
        """
        try:
            skip = normalize_skips(d.get("skip") or ())
            exclude = normalize_exclude(d.get("exclude") or {})
        except ConfigError as e:
            raise CorruptCheckpoint(f"the state's recorded data changes: {e}") from e
        if d.get("skip") is not None and list(map(list, skip)) != d["skip"]:
            raise CorruptCheckpoint(
                f"the state's skip ranges {d['skip']!r} are not sorted, disjoint ranges"
            )
        return cls(skip, exclude)


NO_CHANGES = DataChanges()


def normalize_skips(value: Any) -> Ranges:
    """``[(start, end), ...]`` as sorted, merged half-open ranges.

    Raises:
        ConfigError: not pairs of ints with ``0 <= start < end``.
    """
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise ConfigError(f"skip_batches={value!r}: pass a list of (start, end) position pairs")
    pairs = []
    for r in value:
        if (
            not isinstance(r, (list, tuple))
            or len(r) != 2
            or not (is_int(r[0]) and is_int(r[1]))
            or not 0 <= r[0] < r[1]
        ):
            raise ConfigError(
                f"skip_batches: {r!r} is not a (start, end) pair of global positions with "
                "0 <= start < end (half-open: end is the first position served again)"
            )
        pairs.append((int(r[0]), int(r[1])))
    merged: list[tuple[int, int]] = []
    for s, e in sorted(pairs):
        if merged and s <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], e))
        else:
            merged.append((s, e))
    return tuple(merged)


def normalize_exclude(value: Any) -> Excluded:
    """``{"dataset": [row, ...]}`` as ((name, sorted unique rows), ...) by name; datasets
    with no rows are left out.

    Raises:
        ConfigError: not a mapping of names to row indices >= 0.
    """
    if not isinstance(value, Mapping):
        raise ConfigError(f"exclude={value!r}: pass a dict {{dataset name: [row, ...]}}")
    out = []
    for name in sorted(value, key=str):
        rows = value[name]
        if not isinstance(name, str):
            raise ConfigError(f"exclude: key {name!r} is not a dataset name")
        if isinstance(rows, (str, bytes, Mapping)) or not isinstance(rows, Iterable):
            raise ConfigError(f"exclude[{name!r}]={rows!r}: pass a list of row indices")
        rows = list(rows)
        if not all(is_int(r) and r >= 0 for r in rows):
            raise ConfigError(f"exclude[{name!r}]: row indices must be ints >= 0")
        if rows:
            out.append((name, tuple(sorted({int(r) for r in rows}))))
    return tuple(out)


def _split(ranges: Ranges, position: int) -> tuple[Ranges, Ranges]:
    """``ranges`` before ``position`` and from it on (a range across it is cut)."""
    before, after = [], []
    for s, e in ranges:
        if s < position:
            before.append((s, min(e, position)))
        if e > position:
            after.append((max(s, position), e))
    return tuple(before), tuple(after)


def _covers(outer: Ranges, inner: Ranges) -> bool:
    return all(any(s <= a and b <= e for s, e in outer) for a, b in inner)


def _shown(ranges: Ranges) -> str:
    return "[" + ", ".join(f"({s}, {e})" for s, e in ranges) + "]"


def resolve(
    recorded: DataChanges,
    position: int,
    skip_batches: Any = None,
    exclude: Any = None,
    allowed: Iterable[str] = (),
    restoring: bool = True,
) -> DataChanges:
    """The decisions a run starting at ``position`` follows (see the module docstring).

    Args:
        recorded: what the state holds (``NO_CHANGES`` for a fresh start).
        position: the state's global position (0 for a fresh start).
        skip_batches, exclude: what the restore passes; None: not passed (the record holds).
        allowed: the restore's ``allow_changes``.
        restoring: False for a run from the beginning (nothing recorded to change).

    Raises:
        ConfigError: malformed values, or a skip range before ``position`` the state does
            not record (those outputs were already delivered).
        IncompatibleCheckpoint: different from the record without ``allow_changes``.
    """
    allowed = frozenset(allowed)
    skip, rows = recorded.skip, recorded.exclude
    if skip_batches is not None:
        asked = normalize_skips(skip_batches)
        past_asked, future_asked = _split(asked, position)
        past_rec, future_rec = _split(recorded.skip, position)
        if not _covers(past_rec, past_asked):
            raise ConfigError(
                f"skip_batches {_shown(past_asked)} lies before the checkpoint's position "
                f"{position}: those outputs were already delivered (skipped ones recorded "
                f"there: {_shown(past_rec)}); skip only positions >= {position}, or restore "
                "an earlier checkpoint"
            )
        if future_asked != future_rec and restoring and "skip" not in allowed:
            raise IncompatibleCheckpoint(
                f"skip_batches {_shown(future_asked)} differs from what the checkpoint records "
                f"from its position {position} on ({_shown(future_rec)}). Skipping is a "
                "deliberate data change: pass allow_changes={'skip'} to accept it, or omit "
                "skip_batches (or pass the recorded ranges) to keep the checkpoint's decision"
            )
        skip = _merge(past_rec + future_asked)
    if exclude is not None:
        asked_rows = normalize_exclude(exclude)
        if asked_rows != recorded.exclude and restoring and "exclude" not in allowed:
            raise IncompatibleCheckpoint(
                f"exclude={_rows_shown(asked_rows)} differs from what the checkpoint records "
                f"({_rows_shown(recorded.exclude)}). Excluding documents is a deliberate data "
                "change: pass allow_changes={'exclude'} to accept it (chunks read from here "
                "on drop the rows; chunks already in flight replay as they were read), or "
                "omit exclude (or pass the recorded rows) to keep the checkpoint's decision"
            )
        rows = asked_rows
    return DataChanges(skip, rows)


def with_data_changes(
    state: Any, skip_batches: Any, exclude: Any, allow_changes: Iterable[str]
) -> Any:
    """An admitted ``PipelineState`` following the decisions :func:`resolve` takes for
    what the restore passes (unchanged when it passes neither)."""
    if skip_batches is None and exclude is None:
        return state
    if isinstance(allow_changes, str):
        allow_changes = (allow_changes,)
    changes = resolve(state.changes, state.position, skip_batches, exclude, allow_changes)
    return dataclasses.replace(state, changes=changes)


def fresh_changes(skip_batches: Any, exclude: Any) -> DataChanges:
    """The decisions of a run from the beginning (nothing recorded: nothing to allow)."""
    return resolve(NO_CHANGES, 0, skip_batches, exclude, restoring=False)


def _merge(ranges: Ranges) -> Ranges:
    return normalize_skips(ranges) if ranges else ()


def _rows_shown(rows: Excluded) -> str:
    def few(r: tuple[int, ...]) -> str:
        return str(list(r[:8]))[:-1] + (f", ... ({len(r)} rows)]" if len(r) > 8 else "]")

    return "{" + ", ".join(f"{n!r}: {few(r)}" for n, r in rows) + "}"


def check_aligned(changes: DataChanges, position: int, dp_size: int) -> None:
    """Every skip range from ``position`` on covers whole steps of ``dp_size`` ranks.

    Raises:
        ConfigError: naming the range and the aligned bounds around it.
    """
    if dp_size == 1:
        return
    _, future = _split(changes.skip, position)
    for s, e in future:
        if (s - position) % dp_size or (e - position) % dp_size:
            lo = s - (s - position) % dp_size
            hi = e + (-(e - position)) % dp_size
            inner_s, inner_e = lo + dp_size if lo < s else lo, hi - dp_size if hi > e else hi
            inner = f" or ({inner_s}, {inner_e})" if inner_s < inner_e else ""
            raise ConfigError(
                f"skip_batches range ({s}, {e}) does not cover whole steps: with "
                f"{dp_size} data-parallel ranks resuming at position {position} a step is "
                f"the {dp_size} positions from {position} + k*{dp_size}, and every rank must "
                f"skip the same steps to stay in lockstep; use ({lo}, {hi}){inner}"
            )


def skipped_ranges(state: Mapping[str, Any]) -> list[tuple[int, int]]:
    """The global position ranges ``state`` (a state dict) records as skipped."""
    return list(DataChanges.from_state(state).skip)


def excluded_rows(state: Mapping[str, Any]) -> dict[str, list[int]]:
    """The dataset rows ``state`` (a state dict) excludes from chunks read after it."""
    return {name: list(rows) for name, rows in DataChanges.from_state(state).exclude}


def step_positions(
    first_step: int,
    end_step: int,
    per_step: int,
    skipped: Iterable[tuple[int, int]] = (),
    start_step: int = 0,
    start_position: int = 0,
) -> tuple[int, int]:
    """The global positions ``[start, end)`` that optimizer steps ``[first_step,
    end_step)`` consume, for ``skip_batches``.

    Args:
        per_step: outputs one optimizer step consumes: ``dp_size * accumulation`` (one
            pipeline output per rank per micro-batch).
        skipped: ranges already skipped (``skipped_ranges(state)``): they took no step.
        start_step, start_position: a known pair (default: the run's beginning).

    Example: D=4 ranks, accumulation 2, steps 41_337..41_339 skipped::

        skip_batches=[step_positions(41_337, 41_340, per_step=8)]
    """
    if end_step <= first_step or first_step < start_step or per_step < 1:
        raise ConfigError(
            f"step_positions({first_step}, {end_step}, per_step={per_step}): need "
            f"start_step <= first_step < end_step and per_step >= 1"
        )
    ranges = normalize_skips(list(skipped)) if skipped else ()

    def position_of(n_outputs: int, first: bool) -> int:
        # where the n-th served output after start_position is (first: the position of
        # that output, past a skipped range starting there; else: the end of the one before)
        p, left = start_position, n_outputs
        for s, e in ranges:
            if e <= p:
                continue
            s = max(s, p)
            if s - p > left or (s - p == left and not first):
                break
            left -= s - p
            p = e
        return p + left

    return (
        position_of((first_step - start_step) * per_step, True),
        position_of((end_step - start_step) * per_step, False),
    )
