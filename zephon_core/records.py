"""Records, sample cursors, contributor metadata and tombstones (``docs/design.md`` §3).

A :class:`Record` is a payload plus the metadata the tracker needs:

* ``cursor`` -- a :class:`SampleCursor` ``(lane, chunk_id, offset, child)``, the
  record's unique, deterministic identity. A 1:1 derived record keeps its
  input's cursor, a split child gets its child index, a packed record takes
  the cursor of its first contributor and a batch takes the cursor of its last
  member (which is what the replay filter matches).
* ``digest`` -- set by ``batch``: the value digest of its last member, which the
  replay filter checks on resume (``digests/value_digest.py``).
* ``contributors`` -- every input fragment that went into the record, as
  :class:`Contributor` tuples. An offset of a chunk closes when all of its
  children were delivered or tombstoned.

A tombstone is a record without payload: it tells the tracker that the listed
children will never be delivered. The runner forwards tombstones straight to
the end of the pipeline; operators never buffer them.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class SampleCursor(NamedTuple):
    lane: int
    chunk_id: int
    offset: int
    child: int


class Contributor(NamedTuple):
    chunk_id: int
    offset: int
    child: int
    is_last_child: bool
    component: int
    n_tokens: int


class _TombstonePayload:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<tombstone>"

    def __reduce__(self) -> str:
        return "TOMBSTONE"  # stays the singleton across processes (runner=processes)


TOMBSTONE: Any = _TombstonePayload()


class Record:
    """A payload travelling through the pipeline, with its identity and provenance."""

    __slots__ = ("payload", "cursor", "contributors", "digest")

    def __init__(
        self,
        payload: Any,
        cursor: SampleCursor,
        contributors: list[Contributor],
        digest: int | None = None,
    ):
        self.payload = payload
        self.cursor = cursor
        self.contributors = contributors
        self.digest = digest

    @property
    def is_tombstone(self) -> bool:
        return self.payload is TOMBSTONE

    def with_payload(self, payload: Any) -> Record:
        """A 1:1 derived record: same identity and provenance, new payload."""
        return Record(payload, self.cursor, self.contributors, self.digest)

    def to_tombstone(self) -> Record:
        """A tombstone closing every child this record carries."""
        return Record(TOMBSTONE, self.cursor, self.contributors)

    def __repr__(self) -> str:
        kind = "Tombstone" if self.is_tombstone else "Record"
        return f"{kind}(cursor={tuple(self.cursor)}, contributors={len(self.contributors)})"


def tombstone(cursor: SampleCursor, contributors: list[Contributor]) -> Record:
    return Record(TOMBSTONE, cursor, contributors)


def token_count(payload: Any, key: str = "input_ids") -> int:
    """Number of tokens in a payload (1 for payloads without a token array)."""
    if isinstance(payload, dict):
        arr = payload.get(key)
        if arr is not None:
            return len(arr)
    return 1


def component_tokens(record: Record, key: str = "input_ids") -> dict[int, int]:
    """Tokens per mixture component carried by a record (used by ensure_mixture and stats)."""
    contributors = record.contributors
    if len(contributors) == 1:
        c = contributors[0]
        n = c.n_tokens or token_count(record.payload, key)
        return {c.component: n}
    shares: dict[int, int] = {}
    for c in contributors:
        shares[c.component] = shares.get(c.component, 0) + c.n_tokens
    return shares
