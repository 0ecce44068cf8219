"""A content check of a state written before per-part digests (``restore.py``).

Why: such a state (main at 03a95f2, state schema 2) holds function and dataset digests
computed by that release's walk (``digests/legacy_digest.py``), which differ from this one's
for a function capturing a config object, a user-class instance or a partial of one,
and for rows that are user-class objects. Upgrading Zephon is a harmless change, so a
digest that differs is recomputed by the old rules, and the state is accepted when
that one matches: the function or dataset is unchanged.

When it still differs, the refusal cannot name parts (the state has none) and must not
suggest ``version=``: a pin cannot match a digest computed without one. The way
through for an unchanged function (another Python, say) is ``allow_changes=
{'functions'}``; :func:`function_fix` says so.

A state is of that kind when its content has no ``"parts"`` table: every state this
release writes has one.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..digests.content_diff import ContentChange
from ..digests.manifest import differs
from .provenance import writer

__all__ = ["function_fix", "is_legacy", "still_differ"]

_SUFFIX = "; it differs by the digest rules of the release that wrote the state too"


def is_legacy(content: dict[str, Any]) -> bool:
    """Whether a state's content was written before per-part digests existed."""
    return "parts" not in content


def still_differ(
    changes: list[ContentChange], saved: dict[str, Any], plan: Any
) -> list[ContentChange]:
    """The ``changes`` whose digest differs by the old rules too (named so). Computes an old
    digest only for a function or dataset in ``changes``, and only where the pipeline can
    (a map/filter operator, a source that defines ``legacy_content_fingerprint``)."""
    out = []
    for change in changes:
        old = _old_digest(change, plan)
        if change.kind == "functions":
            same = old is not None and old == saved.get("ops", {}).get(change.name)
        else:
            same = old is not None and not differs(saved.get("components", {})[change.name], old)
        if not same:
            text = change.text + (_SUFFIX if old is not None else "")
            out.append(dataclasses.replace(change, text=text))
    return out


def _old_digest(change: ContentChange, plan: Any) -> str | None:
    if change.kind == "functions":
        op = next((op for op in plan.ops if op.name == change.name), None)
        compute = getattr(op, "legacy_content_fingerprint", None)
        return compute() if callable(compute) else None
    compute = getattr(plan.source, "legacy_content_fingerprint", None)
    return compute(change.name) if callable(compute) else None


def function_fix(written_by: str | None) -> str:
    """The fix a refusal names for a function of a state written before per-part digests."""
    return (
        f"restore the function as it was (the state was written by {writer(written_by)}, "
        "whose function digests this release recomputes but cannot take apart, and which a "
        "pin with version= cannot match: for a function that behaves the same -- a refactor, "
        "the same code under another Python -- accepting the change is the way through)"
    )
