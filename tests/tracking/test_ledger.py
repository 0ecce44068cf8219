"""LaneLedger: the chunks a checkpoint stores, with the boundaries and source state.

register/trim/snapshot must stay mutually consistent: replaying the
snapshot's chunks and then continuing the source from the snapshot's state
reproduces the original chunk sequence; boundaries strictly above the floor
are kept (including the trailing one), those at or below it are dropped.
"""

from __future__ import annotations

import threading

from zephon_core.checkpoint.state import Delivery, LaneState
from zephon_core.chunk import WorkChunk
from zephon_core.tracking.ledger import LaneLedger


def ledger(lane, chunks, boundaries, source, next_chunk) -> LaneLedger:
    return LaneLedger(
        LaneState(
            lane,
            chunks=list(chunks),
            boundaries=list(boundaries),
            source=source,
            next_chunk=next_chunk,
            floor=chunks[0].chunk_id if chunks else next_chunk,
        )
    )


def snap(led: LaneLedger, floor: int) -> tuple:
    """(chunks, boundaries, source state, next chunk id) of the state at ``floor``."""
    st = led.snapshot(Delivery(floor, None, 0, False, ()))
    return st.chunks, st.boundaries, st.source, st.next_chunk


def chunk(cid: int, lane: int = 3) -> WorkChunk:
    return WorkChunk(lane, cid, (0, 1), (cid, cid + 100), seed=cid * 7)


def filled(n: int, k: int = 2) -> LaneLedger:
    led = ledger(3, [], [], {"next": 0}, 0)
    for cid in range(n):
        led.register(chunk(cid), {"next": cid + 1}, boundary_after=(cid + 1) % k == 0)
    return led


def test_register_appends_chunks_source_state_and_boundaries():
    led = filled(5)
    assert len(led) == 5
    assert led.next_chunk_id == 5
    chunks, bounds, state, next_id = snap(led, 0)
    assert [c.chunk_id for c in chunks] == [0, 1, 2, 3, 4]
    assert chunks[2] == chunk(2)
    assert bounds == [2, 4]
    assert state == {"next": 5}, "source state must be the one right after the last chunk"
    assert next_id == 5


def test_trim_drops_chunks_below_floor_and_boundaries_at_or_below_it():
    led = filled(7)
    led.trim(4)
    assert len(led) == 3
    chunks, bounds, state, next_id = snap(led, 4)
    assert [c.chunk_id for c in chunks] == [4, 5, 6]
    assert bounds == [6], "boundary 4 == floor must not be kept, boundary 6 must"
    assert state == {"next": 7} and next_id == 7
    assert led._boundaries == [6]


def test_trim_is_idempotent_and_never_goes_back():
    led = filled(6)
    led.trim(4)
    led.trim(4)
    led.trim(2)  # an older floor does not resurrect anything
    chunks, bounds, _, _ = snap(led, 2)
    assert [c.chunk_id for c in chunks] == [4, 5]
    assert bounds == [6]


def test_snapshot_filters_by_its_own_floor_without_trimming():
    led = filled(6)
    chunks, bounds, _, _ = snap(led, 3)
    assert [c.chunk_id for c in chunks] == [3, 4, 5]
    assert bounds == [4, 6]
    assert all(b > 3 for b in bounds)
    assert len(led) == 6  # snapshot does not mutate
    chunks, bounds, _, _ = snap(led, 4)
    assert [c.chunk_id for c in chunks] == [4, 5] and bounds == [6]


def test_snapshot_chunk_ids_are_consecutive_from_floor_to_next_id():
    led = filled(9, k=3)
    for floor in range(10):
        led.trim(floor)
        chunks, bounds, _, next_id = snap(led, floor)
        assert [c.chunk_id for c in chunks] == list(range(floor, next_id))
        assert all(floor < b <= next_id for b in bounds)
        assert bounds == [b for b in (3, 6, 9) if b > floor]


def test_snapshot_returns_copies():
    led = filled(3)
    chunks, bounds, _, _ = snap(led, 0)
    chunks.clear()
    bounds.append(99)
    chunks2, bounds2, _, _ = snap(led, 0)
    assert len(chunks2) == 3 and 99 not in bounds2


def test_restored_ledger_keeps_given_boundaries_and_continues():
    led = ledger(3, [chunk(4), chunk(5)], [6], {"next": 6}, 6)
    chunks, bounds, state, next_id = snap(led, 4)
    assert [c.chunk_id for c in chunks] == [4, 5] and bounds == [6] and next_id == 6
    led.register(chunk(6), {"next": 7}, boundary_after=False)
    led.register(chunk(7), {"next": 8}, boundary_after=True)
    led.trim(6)
    chunks, bounds, state, next_id = snap(led, 6)
    assert [c.chunk_id for c in chunks] == [6, 7]
    assert bounds == [8] and state == {"next": 8} and next_id == 8


def test_mark_exhausted_updates_source_state_only():
    led = filled(2)
    led.mark_exhausted({"next": 2, "exhausted": True})
    chunks, _, state, next_id = snap(led, 0)
    assert len(chunks) == 2 and next_id == 2
    assert state == {"next": 2, "exhausted": True}


def test_snapshots_under_concurrent_register_and_trim_are_consistent():
    """The producer registers while the consumer trims and snapshots: every
    snapshot is a consecutive run ending at next_id whose source state matches."""
    led = ledger(3, [], [], {"next": 0}, 0)
    n = 3000
    done = threading.Event()

    def producer():
        for cid in range(n):
            led.register(chunk(cid), {"next": cid + 1}, boundary_after=(cid + 1) % 4 == 0)
        done.set()

    t = threading.Thread(target=producer)
    t.start()
    floor = 0
    bad = []
    while True:
        finished = done.is_set()
        chunks, bounds, state, next_id = snap(led, floor)
        ids = [c.chunk_id for c in chunks]
        if (
            ids != list(range(floor, max(floor, next_id)))
            or state["next"] != next_id
            or any(b <= floor or b > next_id or b % 4 for b in bounds)
        ):
            bad.append((floor, ids[:3], next_id, state, bounds))
        floor = max(floor, next_id - 2)
        led.trim(floor)
        if finished:
            break
    t.join()
    assert not bad, bad[:3]
    assert led.next_chunk_id == n
