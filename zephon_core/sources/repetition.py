"""Repetition you can see: one warning when a dataset starts repeating early.

A small dataset with a large weight is read again and again while the large ones
are still in their first epoch -- often intended (upsampling a high-quality set),
sometimes not (a weight typed in the wrong unit). Either way the user should know,
once, and be told how to cap it (``num_epochs={name: n}``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence

log = logging.getLogger("zephon_core.sources")

_warned: set[tuple[tuple[str, ...], int]] = set()
_lock = threading.Lock()


def warn_repeat(names: Sequence[str], component: int, behind: Mapping[str, float]) -> bool:
    """Log the warning for ``component`` unless this process already did; returns whether
    it logged. ``behind`` maps the datasets still in their first epoch to the fraction
    of it this lane has read."""
    key = (tuple(names), component)
    with _lock:
        if key in _warned:
            return False
        _warned.add(key)
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
