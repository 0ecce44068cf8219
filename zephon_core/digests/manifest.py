"""A dataset's list of parts (shards) inside its content fingerprint, to say what changed.

Why: a component's content fingerprint is one digest, so a restore over a deleted,
appended or rewritten shard could only say "dataset 'web' changed". A sharded dataset
may therefore follow its digest with a compact manifest -- each part's name, rows and a
short id of its version -- and a refusal names the parts: "deleted part-003.parquet
(40 rows)". Only the digest decides whether the content is the same (so a state written
before manifests existed is compared as before); the manifest only explains.

Format: ``"<digest> #parts=<base64 of zlib-compressed JSON>"``, the JSON being
``{"prefix": str, "rows": int, "n": int, "parts": [[name, rows, id], ...]}``; ``parts``
is left out above :data:`MAX_BYTES` (a very large corpus is then named by its counts).

Example:
    >>> a = with_manifest("d1", [("s3://b/x-0.parquet", 10, "aa"), ("s3://b/x-1.parquet", 5, "bb")])
    >>> b = with_manifest("d2", [("s3://b/x-0.parquet", 10, "aa")])
    >>> differs(a, b), describe_change(a, b)
    (True, 'shards deleted: x-1.parquet (5 rows); 15 rows -> 10')
"""

from __future__ import annotations

import base64
import json
import os
import zlib
from collections.abc import Sequence
from typing import Any

__all__ = ["describe_change", "differs", "digest_of", "with_manifest"]

SEP = " #parts="
MAX_BYTES = 8 << 10  # the encoded manifest, per dataset, in every checkpoint and rank report
MAX_JSON = 1 << 20  # what a manifest read from a checkpoint may inflate to
_SHOW = 5  # parts named per kind of change


def with_manifest(digest: str, parts: Sequence[tuple[str, int, str]]) -> str:
    """``digest`` followed by the manifest of ``parts`` (``(path, rows, version id)``)."""
    paths = [p for p, _, _ in parts]
    prefix = os.path.commonprefix(paths)
    prefix = prefix[: prefix.rfind("/") + 1]
    body: dict[str, Any] = {
        "prefix": prefix,
        "rows": int(sum(r for _, r, _ in parts)),
        "n": len(parts),
        "parts": [[p[len(prefix) :], int(r), v] for p, r, v in parts],
    }
    encoded = _encode(body)
    if len(encoded) > MAX_BYTES:
        del body["parts"]
        encoded = _encode(body)
    return f"{digest}{SEP}{encoded}"


def _encode(body: dict[str, Any]) -> str:
    raw = json.dumps(body, separators=(",", ":")).encode()
    return base64.b64encode(zlib.compress(raw, 9)).decode()


def _decode(fingerprint: str) -> tuple[str, dict[str, Any] | None]:
    """(digest, manifest or None); a string that is not ``digest + SEP + manifest`` is
    all digest. The manifest comes from a checkpoint, which may be crafted: it is
    inflated only up to :data:`MAX_JSON` bytes (a larger one is taken for none)."""
    head, sep, tail = fingerprint.partition(SEP)
    if not sep:
        return fingerprint, None
    try:
        inflate = zlib.decompressobj()
        raw = inflate.decompress(base64.b64decode(tail, validate=True), MAX_JSON)
        if inflate.unconsumed_tail or not inflate.eof:
            return head, None
        body = json.loads(raw)
        if not isinstance(body, dict) or not isinstance(body.get("rows"), int):
            return head, None
    except (ValueError, zlib.error):
        return head, None
    return head, body


def digest_of(fingerprint: str) -> str:
    """The part of a content fingerprint that is compared."""
    return fingerprint.partition(SEP)[0]


def differs(saved: str, now: str) -> bool:
    """Whether two content fingerprints name different content (digests only)."""
    return digest_of(saved) != digest_of(now)


def describe_change(saved: str, now: str) -> str | None:
    """What changed between two manifests, in words; ``None`` without both manifests."""
    a, b = _decode(saved)[1], _decode(now)[1]
    if a is None or b is None:
        return None
    rows = f"{a['rows']} rows -> {b['rows']}"
    if "parts" not in a or "parts" not in b:
        return f"{a['n']} shards -> {b['n']}; {rows}"
    old = {a["prefix"] + p: (r, v) for p, r, v in a["parts"]}
    new = {b["prefix"] + p: (r, v) for p, r, v in b["parts"]}
    short = os.path.commonprefix(list(old) + list(new))
    short = short[: short.rfind("/") + 1]

    def name(p: str) -> str:
        return p[len(short) :]

    deleted = [f"{name(p)} ({old[p][0]} rows)" for p in old if p not in new]
    appended = [f"{name(p)} ({new[p][0]} rows)" for p in new if p not in old]
    rewritten = [
        f"{name(p)} ({old[p][0]} -> {new[p][0]} rows)" for p in old if p in new and old[p] != new[p]
    ]
    said = [
        f"shards {kind}: " + ", ".join(items[:_SHOW])
        + (f" and {len(items) - _SHOW} more" if len(items) > _SHOW else "")
        for kind, items in (("deleted", deleted), ("appended", appended), ("rewritten", rewritten))
        if items
    ]  # fmt: skip
    return "; ".join([*said, rows]) if said else None
