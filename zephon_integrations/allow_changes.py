"""``allow_changes`` as the integrations take it: checked when they are built, named in
refusals.

A refusal from the core says ``load_state_dict(state, allow_changes=...)``, which a
Lightning or HF user never calls; the integrations pass their own argument through, so
the refusal names that argument too. A typo is a ``ConfigError`` when the datamodule,
callback or trainer is built, not at a resume hours into a job.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from zephon_core import ConfigError, IncompatibleCheckpoint
from zephon_core.checkpoint.data_changes import normalize_exclude, normalize_skips
from zephon_core.checkpoint.restore import allowed_changes

__all__ = ["checked", "checked_data_changes", "named_in_refusals"]


def checked(allow_changes: Iterable[str], owner: str) -> frozenset[str]:
    """The names, validated (``owner``: e.g. ``"ZephonCallback"``, for the message)."""
    return allowed_changes(allow_changes, f"{owner}(allow_changes=...)")


def checked_data_changes(
    skip_batches: Any, exclude: Any, owner: str
) -> tuple[list[tuple[int, int]] | None, dict[str, list[int]] | None]:
    """``skip_batches`` / ``exclude`` validated when the integration is built (None stays
    None: the checkpoint's recorded decisions hold)."""
    try:
        skip = None if skip_batches is None else list(normalize_skips(skip_batches))
        rows = None if exclude is None else _rows(exclude)
    except ConfigError as e:
        raise ConfigError(f"{owner}(...): {e}") from e
    return skip, rows


def _rows(exclude: Mapping[str, Iterable[int]]) -> dict[str, list[int]]:
    return {name: list(rows) for name, rows in normalize_exclude(exclude)}


@contextmanager
def named_in_refusals(owner: str) -> Iterator[None]:
    """A refusal that offers ``allow_changes`` also names ``owner``'s argument."""
    try:
        yield
    except IncompatibleCheckpoint as e:
        if "allow_changes" not in str(e):
            raise
        raise IncompatibleCheckpoint(f"{e} (here: {owner}(..., allow_changes=...))") from e
