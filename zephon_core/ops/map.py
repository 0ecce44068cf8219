"""map: a 1:1 transform of payloads."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..digests.content import function_fingerprint, function_parts
from ..digests.legacy_digest import function_fingerprint as legacy_fingerprint
from ..errors import ContractViolation
from ..records import Record
from .base import Operator, OpTraits


class MapOp(Operator):
    """Applies ``fn`` to each payload (or to a list of payloads when ``batched``).

    ``version``: any string naming the function's behaviour; it replaces the automatic
    fingerprint of ``fn`` (its code, closure and state) that a restore compares.
    """

    traits = OpTraits(preserves_cursor_order=True, stateless=True)

    def __init__(
        self,
        fn: Callable[[Any], Any],
        parallelism: int | str = 1,
        name: str | None = None,
        batched: bool = False,
        runner: str = "threads",
        version: str | None = None,
    ):
        self.fn = fn
        self.version = version
        self.parallelism = parallelism
        self.runner = runner
        self.name = name or "map"
        self.batched = batched

    def process(self, record: Record) -> list[Record]:
        if self.batched:
            return self.process_many([record])
        return [record.with_payload(self.fn(record.payload))]

    def process_many(self, records: list[Record]) -> list[Record]:
        fn = self.fn
        if not self.batched:
            return [r.with_payload(fn(r.payload)) for r in records]
        payloads = fn([r.payload for r in records])
        if len(payloads) != len(records):
            raise ContractViolation(
                f"batched map {self.name!r} returned {len(payloads)} payloads for "
                f"{len(records)} inputs; a map is 1:1 (use filter to drop records)"
            )
        return [r.with_payload(p) for r, p in zip(records, payloads)]

    def describe(self) -> dict:
        # the function is identified by its content fingerprint, not by where it lives
        # (a module name differs between `python train.py` and `import train`)
        return {"op": "map", "name": self.name, "batched": self.batched}

    def content_fingerprint(self) -> str:
        return function_fingerprint(self.fn, self.version)

    def content_parts(self) -> dict[str, str]:
        """The fingerprint piece by piece, for refusals that name what changed."""
        return function_parts(self.fn, self.version)

    def legacy_content_fingerprint(self) -> str:
        """The digest states written before per-part digests hold (``legacy_digest.py``)."""
        return legacy_fingerprint(self.fn, self.version)
