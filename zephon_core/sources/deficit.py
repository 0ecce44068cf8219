"""Token-deficit scheduling: which component a lane reads next, by tokens owed.

Why: LLM mixtures are stated in tokens, and documents of different components have
very different lengths, so picking components by document counts misses the token
shares (0.7/0.3 prose/code by documents gave prose ~25 % of the tokens). The length
of every document is known before it is fetched (a length column, ``lengths=`` or
an estimate), so the source can schedule by tokens directly.

The rule (smooth weighted round-robin generalized to lengths): each component has a
deficit, the tokens it is owed relative to its share. The next document comes from
the eligible component with the largest deficit (ties: lowest index); a document of
``L`` tokens then credits every eligible component ``share * L`` and debits the
picked one ``L``. Shares are fixed-point ints summing to ``SHARE_SCALE``, so the
arithmetic is exact and the state is one int per component.

Guarantee: the deficits stay within one document length of zero, so over any span
of ``T`` scheduled tokens a lane's share of component ``c`` is within
``~2 * max_len / T`` of its target (``max_len`` the longest document), and the
global stream, which interleaves the lanes, within ``num_lanes`` times that. With
all documents of length 1 this is exactly document-weighted smooth round-robin.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import CorruptCheckpoint
from ..validate import is_int

__all__ = ["TokenDeficit"]


class TokenDeficit:
    """The deficits of one lane (state: one int per component, in ``SHARE_SCALE`` units)."""

    def __init__(self, n: int) -> None:
        self.deficits: list[int] = [0] * n

    def pick(self, eligible: Sequence[int]) -> int:
        """The eligible component with the largest deficit (ties: lowest index)."""
        d = self.deficits
        best = eligible[0]
        for c in eligible[1:]:
            if d[c] > d[best]:
                best = c
        return best

    def charge(self, picked: int, length: int, shares: Sequence[int], eligible: Sequence[int]):
        """Account one document of ``length`` tokens read from ``picked``."""
        d = self.deficits
        total = 0
        for c in eligible:
            d[c] += shares[c] * length
            total += shares[c]
        d[picked] -= total * length

    def state_dict(self) -> list[int]:
        return list(self.deficits)

    def load_state_dict(self, state: Any) -> None:
        if (
            not isinstance(state, (list, tuple))
            or len(state) != len(self.deficits)
            or not all(is_int(v) for v in state)
        ):
            raise CorruptCheckpoint(
                f"token deficits must be a list of {len(self.deficits)} ints, got {state!r}"
            )
        self.deficits = [int(v) for v in state]
