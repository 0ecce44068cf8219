"""Which lane serves which global output position.

Global output position g belongs to lane ``g mod C`` (that lane's output
number ``g div C``). In one process every lane is consumed round-robin in
lane order; the multi-rank assignment builds on the same mapping.
"""

from __future__ import annotations


def turns_of_lane(lane: int, position: int, num_lanes: int) -> int:
    """How many of the positions 0..position-1 belong to ``lane``."""
    return max(0, (position - lane + num_lanes - 1) // num_lanes)
