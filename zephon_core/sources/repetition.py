"""Repetition you can see: one warning when a dataset starts repeating early.

A small dataset with a large weight is read again and again while the large ones
are still in their first epoch -- often intended (upsampling a high-quality set),
sometimes not (a weight typed in the wrong unit). Either way the user should know,
once, and be told how to cap it (``num_epochs={name: n}``).

Once per job, not per process: a DataLoader worker calls :func:`defer_warnings`, so
its lanes' warnings wait in :func:`take_deferred` until the engine ships them to the
training process, which logs each once (:func:`warn_repeat` dedupes per process).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence

log = logging.getLogger("zephon_core.sources")

#: a warning as shipped between processes: (dataset names, component, behind)
Deferred = tuple[tuple[str, ...], int, tuple[tuple[str, float], ...]]

_warned: set[tuple[tuple[str, ...], int]] = set()
_deferred: list[Deferred] | None = None  # a list: this process defers its warnings
_lock = threading.Lock()


def defer_warnings() -> None:
    """From now on this process keeps its warnings for :func:`take_deferred` (a
    DataLoader worker: the training process logs them, once for all workers)."""
    global _deferred
    with _lock:
        if _deferred is None:
            _deferred = []


def take_deferred() -> tuple[Deferred, ...]:
    """The warnings kept since the last call (none unless :func:`defer_warnings`)."""
    with _lock:
        if not _deferred:
            return ()
        out = tuple(_deferred)
        _deferred.clear()
        return out


def has_deferred() -> bool:
    """Whether warnings wait to be shipped."""
    return bool(_deferred)


def warn_repeat(names: Sequence[str], component: int, behind: Mapping[str, float]) -> bool:
    """Log the warning for ``component`` unless this process already did (or keep it, in
    a deferring process); returns whether it logged. ``behind`` maps the datasets still
    in their first epoch to the fraction of it this lane has read."""
    key = (tuple(names), component)
    with _lock:
        if key in _warned:
            return False
        _warned.add(key)
        if _deferred is not None:
            _deferred.append((key[0], component, tuple(sorted(behind.items()))))
            return False
    others = ", ".join(f"{n!r} at {100 * f:.0f}%" for n, f in sorted(behind.items()))
    log.warning(
        "dataset %r starts its second epoch (its rows repeat) while %s of the first epoch: "
        "intended upsampling, or cap it with num_epochs={%r: n} (when_exhausted='drop' "
        "lets the others continue) or lower its weight",
        names[component],
        others,
        names[component],
    )
    return True


def log_deferred(warnings: Sequence[Deferred]) -> None:
    """Log warnings a worker shipped (each once in this process)."""
    for names, component, behind in warnings:
        warn_repeat(names, component, dict(behind))


class RepetitionWatch:
    """Which datasets of one lane were already seen repeating (not part of the state:
    restored from the cursors)."""

    def __init__(self, names: Sequence[str], lengths: Sequence[int]) -> None:
        self._names = tuple(names)
        self._seen = [False] * len(lengths)

    def seen(self, d: int) -> bool:
        return self._seen[d]

    def repeats(self, d: int, behind: Mapping[str, float]) -> None:
        """Dataset ``d`` started repeating; ``behind``: the others still in their first
        epoch (warn when there are any)."""
        self._seen[d] = True
        if behind:
            warn_repeat(self._names, d, behind)

    def restored(self, repeating: Sequence[bool]) -> None:
        self._seen = list(repeating)
