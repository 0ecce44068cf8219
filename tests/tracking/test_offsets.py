"""ChunkProgress: per-offset completion of one chunk (bitmap + popcount).

docs/design.md §3, "closes": an offset only closes once all of its
children have been delivered (is_last_child marks the last one, tombstones
count as delivered); a bitmap per chunk records closed offsets with a
popcount alongside so that "is this chunk complete?" stays O(1).
docs/design.md §3: count per child; do not assume children arrive in order.
"""

from __future__ import annotations

import itertools
import random

from zephon_core.tracking.offsets import ChunkProgress


def test_bitmap_and_popcount_track_single_child_offsets():
    p = ChunkProgress(chunk_id=5, size=4)
    assert p.chunk_id == 5 and p.size == 4
    assert p.popcount == 0 and not p.complete
    assert bytes(p.closed) == b"\x00\x00\x00\x00"

    # docs/design.md §6, chunk 5: [x] [x] [ ] [x]
    for off in (0, 1, 3):
        p.close_child(off, 0, True)
    assert list(p.closed) == [1, 1, 0, 1]
    assert p.popcount == 3
    assert not p.complete

    p.close_child(2, 0, True)
    assert list(p.closed) == [1, 1, 1, 1]
    assert p.popcount == 4
    assert p.complete


def test_children_counted_out_of_order_last_child_first():
    p = ChunkProgress(0, 2)
    # offset 1 was split into children 0, 1, 2 (2 is the last); they arrive 2, 0, 1
    p.close_child(1, 2, True)
    assert not p.closed[1] and p.popcount == 0
    p.close_child(1, 0, False)
    assert not p.closed[1] and p.popcount == 0
    p.close_child(1, 1, False)
    assert p.closed[1] == 1 and p.popcount == 1
    assert not p.complete
    p.close_child(0, 0, True)
    assert p.complete


def test_every_arrival_order_of_children_closes_exactly_at_the_last_arrival():
    n_children = 4
    for order in itertools.permutations(range(n_children)):
        p = ChunkProgress(0, 1)
        for child in order:
            assert not p.complete, f"closed early in order {order}"
            p.close_child(0, child, child == n_children - 1)
        assert p.complete, f"never closed in order {order}"
        assert p.popcount == 1


def test_last_child_flag_alone_does_not_close_a_multi_child_offset():
    p = ChunkProgress(0, 1)
    p.close_child(0, 3, True)  # children 0..2 never seen
    assert p.popcount == 0 and not p.complete


def test_duplicate_close_of_a_closed_offset_does_not_double_count():
    p = ChunkProgress(0, 3)
    p.close_child(1, 0, True)
    p.close_child(1, 0, True)
    p.close_child(1, 0, True)
    assert p.popcount == 1
    assert list(p.closed) == [0, 1, 0]
    assert not p.complete


def test_duplicate_close_of_a_multi_child_offset_after_it_closed_does_not_double_count():
    p = ChunkProgress(0, 2)
    p.close_child(0, 0, False)
    p.close_child(0, 1, True)
    assert p.popcount == 1
    # late duplicates of both children
    p.close_child(0, 0, False)
    p.close_child(0, 1, True)
    assert p.popcount == 1
    assert not p.complete


def test_duplicate_child_is_not_counted_as_a_missing_sibling():
    """Children 0, 1, 2 (2 last): child 0 twice plus child 2 must not close the offset.

    Child 1 was never delivered; closing here would let eviction drop a chunk
    whose data is still in flight.
    """
    p = ChunkProgress(0, 1)
    p.close_child(0, 0, False)
    p.close_child(0, 0, False)  # duplicate
    p.close_child(0, 2, True)
    assert p.popcount == 0, "a duplicate child was counted in place of the missing child 1"
    assert not p.complete
    p.close_child(0, 1, False)
    assert p.popcount == 1 and p.complete


def test_complete_is_the_popcount_flag_not_a_bitmap_scan():
    """``complete`` is derived from the popcount (O(1)), kept equal to the bitmap's weight."""
    rng = random.Random(3)
    size = 64
    p = ChunkProgress(0, size)
    children = {off: rng.randint(1, 3) for off in range(size)}
    events = [(off, c, c == n - 1) for off, n in children.items() for c in range(n)]
    rng.shuffle(events)
    for off, c, last in events:
        p.close_child(off, c, last)
        assert p.popcount == sum(p.closed)
        assert p.complete == (p.popcount == size)
    assert p.complete
    # The flag reads the counter: a bitmap mutated behind its back changes nothing.
    q = ChunkProgress(1, 3)
    q.closed[:] = b"\x01\x01\x01"
    assert not q.complete
    q.popcount = 3
    assert q.complete
