"""filter: drops records, emitting tombstones so their offsets still close."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..digests.content import function_fingerprint, function_parts
from ..digests.legacy_digest import function_fingerprint as legacy_fingerprint
from ..records import Record
from .base import Operator, OpTraits


class FilterOp(Operator):
    """Keeps records whose payload satisfies ``predicate``; the others become tombstones.

    ``version``: replaces the automatic fingerprint of ``predicate`` (see ``MapOp``).
    """

    traits = OpTraits(preserves_cursor_order=True, stateless=True)

    def __init__(
        self,
        predicate: Callable[[Any], bool],
        parallelism: int | str = 1,
        name: str | None = None,
        runner: str = "threads",
        version: str | None = None,
    ):
        self.predicate = predicate
        self.version = version
        self.parallelism = parallelism
        self.runner = runner
        self.name = name or "filter"

    def process(self, record: Record) -> list[Record]:
        return [record if self.predicate(record.payload) else record.to_tombstone()]

    def process_many(self, records: list[Record]) -> list[Record]:
        pred = self.predicate
        return [r if pred(r.payload) else r.to_tombstone() for r in records]

    def describe(self) -> dict:
        # the predicate is identified by its content fingerprint, not by where it lives
        return {"op": "filter", "name": self.name}

    def content_fingerprint(self) -> str:
        return function_fingerprint(self.predicate, self.version)

    def content_parts(self) -> dict[str, str]:
        """The fingerprint piece by piece, for refusals that name what changed."""
        return function_parts(self.predicate, self.version)

    def legacy_content_fingerprint(self) -> str:
        """The digest states written before per-part digests hold (``legacy_digest.py``)."""
        return legacy_fingerprint(self.predicate, self.version)
