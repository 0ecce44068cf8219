"""What differs between a checkpoint's content digests and a pipeline's, in words.
(``checkpoint/restore.py``'s content check, ``zephon diff``)

A dataset is named with its two digests. A function is named with the parts that
differ (``function_parts.py``): "closure 'args'.seq_len differs", "global 'tok'
(tokenizer) model differs", "code differs", so the user sees which captured object
or attribute moved, not two hashes. A state written before parts were kept says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .function_parts import is_code_part
from .manifest import describe_change, differs, digest_of

_MAX_NAMED = 6  # parts named per function in a message

__all__ = ["ContentChange", "content_changes", "content_diff"]


@dataclass(frozen=True)
class ContentChange:
    """One dataset or function whose digest differs."""

    kind: str  # "data" (a dataset) or "functions" (a map/filter function)
    name: str  # the dataset or the operator
    text: str  # the sentence naming it and what differs
    code_only: bool = False  # a function whose byte code alone differs


def content_diff(saved: dict[str, Any], now: dict[str, Any]) -> list[ContentChange]:
    """Datasets and functions whose digests differ between a checkpoint's content and a
    pipeline's. Names present on one side only are configuration changes, which the
    fingerprint reports."""
    out = []
    a, b = saved.get("components", {}), now.get("components", {})
    for name in sorted(set(a) & set(b)):
        # a dataset's fingerprint may carry a manifest of its shards: it explains a
        # change, only the digest decides one (manifest.py)
        if differs(a[name], b[name]):
            why = describe_change(a[name], b[name])
            text = (
                f"dataset {name!r} ({digest_of(a[name])} in checkpoint, "
                f"{digest_of(b[name])} now{'; ' + why if why else ''})"
            )
            out.append(ContentChange("data", name, text))
    a, b = saved.get("ops", {}), now.get("ops", {})
    for name in sorted(set(a) & set(b)):
        if a[name] != b[name]:
            out.append(_function_change(name, a[name], b[name], saved, now))
    return out


def content_changes(saved: dict[str, Any], now: dict[str, Any]) -> dict[str, list[str]]:
    """The sentences of :func:`content_diff` by kind (``data``, ``functions``)."""
    found: dict[str, list[str]] = {"data": [], "functions": []}
    for change in content_diff(saved, now):
        found[change.kind].append(change.text)
    return found


def _function_change(
    name: str, old: str, new: str, saved: dict[str, Any], now: dict[str, Any]
) -> ContentChange:
    head = f"function of operator {name!r}: "
    pa = (saved.get("parts") or {}).get(name)
    pb = (now.get("parts") or {}).get(name)
    if pa is None or pb is None:
        why = (
            "the checkpoint predates per-part digests, so what changed cannot be named"
            if pa is None
            else "no per-part digests now"
        )
        return ContentChange(
            "functions", name, f"{head}its digest differs ({old} in checkpoint, {new} now; {why})"
        )
    if "version" in pa or "version" in pb:
        was = f"version={pa['version']!r}" if "version" in pa else "no version="
        now_ = f"version={pb['version']!r}" if "version" in pb else "no version="
        return ContentChange("functions", name, f"{head}{was} in checkpoint, {now_} now")
    differ = sorted(p for p in set(pa) & set(pb) if pa[p] != pb[p])
    new_parts, gone = sorted(set(pb) - set(pa)), sorted(set(pa) - set(pb))
    changed = differ + new_parts + gone
    words = (
        [f"{p} differs" for p in differ]
        + [f"{p} is new" for p in new_parts]
        + [f"{p} is gone" for p in gone]
    )
    if not words:
        return ContentChange(
            "functions", name, f"{head}its digest differs ({old} in checkpoint, {new} now)"
        )
    text = head + ", ".join(words[:_MAX_NAMED])
    if len(words) > _MAX_NAMED:
        text += f" and {len(words) - _MAX_NAMED} more"
    code_only = all(is_code_part(p) for p in changed)
    if code_only:
        text += " (its byte code: an edit, or another Python version)"
    return ContentChange("functions", name, text, code_only)
