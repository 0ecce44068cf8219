"""Token-deficit scheduling: which component a lane reads next, by tokens owed.

Why: LLM mixtures are stated in tokens, and documents of different components have
very different lengths, so picking components by document counts misses the token
shares (0.7/0.3 prose/code by documents gave prose ~25 % of the tokens). The length
of every document is known before it is fetched (a length column, ``lengths=`` or
an estimate), so the source can schedule by tokens directly.

The rule (smooth weighted round-robin generalized to lengths): each component has a
deficit ``D_c``, the tokens it is owed relative to its share. Reading a document of
``L`` tokens from ``c`` credits every eligible component ``share * L`` and debits ``c``
by ``L``. The next document is the one whose reading leaves the deficits smallest: the
eligible ``c`` minimizing the sum of squared deficits after it, with ``L`` the length of
``c``'s next document (known before it is read). A long document therefore waits until
its component is owed about half of it, and then swings the deficit to about minus
half, instead of from 0 to minus all of it. Ties go to the lowest index. Shares are
fixed-point ints summing to ``SHARE_SCALE``, so the arithmetic is exact, and the state
is one int per component.

Guarantee: every deficit stays within about half the longest document of zero, so
over any span of ``T`` scheduled tokens a lane's share of a component is within about
``max_len / T`` of its target, and the global stream, which interleaves the lanes,
within ``num_lanes`` times that. With all documents of length 1 the rule is exactly
smooth weighted round-robin (``mixture.py``).
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

    def pick(self, eligible: Sequence[int], lengths: Sequence[int], shares: Sequence[int]) -> int:
        """The eligible component whose next document (``lengths[c]`` tokens) leaves the
        smallest sum of squared deficits (ties: lowest index)."""
        d = self.deficits
        total = 0
        a = 0  # sum of W_j * D_j
        b = 0  # sum of W_j ** 2
        for c in eligible:
            w = shares[c]
            total += w
            a += w * d[c]
            b += w * w
        best, best_cost = eligible[0], None
        for c in eligible:
            L = lengths[c]
            # sum_j (D_j + W_j L - [j = c] S L)^2, without the constant sum_j D_j^2
            cost = 2 * L * a + L * L * b - 2 * total * L * (d[c] + shares[c] * L)
            cost += total * total * L * L
            if best_cost is None or cost < best_cost:
                best, best_cost = c, cost
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
