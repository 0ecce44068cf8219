"""LaneTracker: the eviction rule (docs/design.md §6), with its scenarios.

Every scenario is built from a real tracker, real WorkChunks and deliveries
(``LaneTracker.deliver`` with contributor metadata, as the lane stream calls
it); the inflight set is what a checkpoint would store: the lane ledger's
snapshot at the tracker's floor.
"""

from __future__ import annotations

import itertools

from helpers import byte_tokenize, source

from zephon_core import Pipeline
from zephon_core.checkpoint.state import Delivery, LaneState
from zephon_core.chunk import WorkChunk
from zephon_core.records import Contributor, SampleCursor
from zephon_core.tracking.eviction import LaneTracker
from zephon_core.tracking.ledger import LaneLedger

LANE = 0


def chunk(cid: int, size: int = 4, lane: int = LANE) -> WorkChunk:
    return WorkChunk(
        lane=lane,
        chunk_id=cid,
        components=(0,) * size,
        rows=tuple(range(cid * size, cid * size + size)),
        seed=1000 + cid,
    )


def contrib(cid: int, off: int, child: int = 0, last: bool = True, n: int = 5) -> Contributor:
    return Contributor(cid, off, child, last, 0, n)


def cursor(cid: int, off: int, child: int = 0, lane: int = LANE) -> SampleCursor:
    return SampleCursor(lane, cid, off, child)


def tracker(
    epoch_based: bool,
    floor: int = 0,
    boundaries=(),
    cursor=None,
    delivered: int = 0,
    n_components: int = 1,
) -> LaneTracker:
    return LaneTracker(
        epoch_based,
        LaneState(
            LANE,
            floor=floor,
            boundaries=list(boundaries),
            cursor=cursor,
            delivered=delivered,
            tokens=[0] * n_components,
        ),
    )


def deliver(tr: LaneTracker, cid: int, off: int, child: int = 0, last: bool = True) -> Delivery:
    """Deliver one single-fragment record."""
    return tr.deliver([contrib(cid, off, child, last)], cursor(cid, off, child))


def deliver_whole_chunk(tr: LaneTracker, cid: int, size: int = 4) -> Delivery:
    d = None
    for off in range(size):
        d = deliver(tr, cid, off)
    return d


class Lane:
    """A tracker plus a ledger, wired the way the lane stream wires them."""

    def __init__(self, epoch_based: bool, k: int, size: int = 4):
        self.k = k
        self.size = size
        self.tracker = tracker(
            epoch_based, floor=0, boundaries=[], cursor=None, delivered=0, n_components=1
        )
        self.ledger = LaneLedger(LaneState(LANE, source={"pos": 0}))
        self.next_id = 0

    def fetch(self, n: int = 1) -> None:
        for _ in range(n):
            c = chunk(self.next_id, self.size)
            self.next_id += 1
            boundary = self.k > 0 and (c.chunk_id + 1) % self.k == 0
            self.ledger.register(c, {"pos": self.next_id}, boundary)
            self.tracker.register(c)
            if boundary:
                self.tracker.add_boundary(c.chunk_id + 1)

    def deliver(self, cid: int, off: int) -> Delivery:
        d = deliver(self.tracker, cid, off)
        self.ledger.trim(d.floor)  # what the consumer does after each output
        return d

    def inflight(self) -> list[int]:
        chunks = self.ledger.snapshot(Delivery(self.tracker.floor, None, 0, False, ())).chunks
        return [c.chunk_id for c in chunks]


# -- (a) the step 100 / 200 / 300 timeline ---------------------------------------------


def _timeline(lane: Lane) -> None:
    lane.fetch(6)  # chunks 0..5 pulled from the source
    for cid in range(3):
        for off in range(4):
            lane.deliver(cid, off)
    lane.deliver(3, 0)
    assert lane.inflight() == [3, 4, 5], "step 100"

    lane.fetch()  # chunk 6
    for off in (1, 2, 3):
        lane.deliver(3, off)
    lane.deliver(4, 0)
    assert lane.inflight() == [4, 5, 6], "step 200: chunk 3 evicted"

    lane.fetch()  # chunk 7
    for off in (1, 2, 3):
        lane.deliver(4, off)
    lane.deliver(5, 0)
    assert lane.inflight() == [5, 6, 7], "step 300: chunk 4 evicted"


def test_timeline_epoch_based_one_chunk_epochs():
    lane = Lane(epoch_based=True, k=1)
    _timeline(lane)
    assert sorted(lane.tracker.progress) == [5, 6, 7]


def test_timeline_monotone_watermark():
    _timeline(Lane(epoch_based=False, k=0))


def test_timeline_chunk_stays_while_partially_delivered():
    lane = Lane(epoch_based=True, k=1)
    lane.fetch(6)
    for cid in range(3):
        for off in range(4):
            lane.deliver(cid, off)
    lane.deliver(3, 0)
    lane.fetch()
    lane.deliver(3, 1)
    lane.deliver(3, 2)
    assert lane.inflight() == [3, 4, 5, 6]  # offset 3 of chunk 3 still in flight
    lane.deliver(3, 3)
    assert lane.inflight() == [3, 4, 5, 6]  # complete, but the cursor points into it
    lane.deliver(4, 0)
    assert lane.inflight() == [4, 5, 6]


# -- (b) chunks 5 / 6 / 7, 4 offsets each ---------------------------------------------


def _chunks_5_6_7(boundaries: list[int]) -> LaneTracker:
    tr = tracker(True, floor=5, boundaries=boundaries, cursor=None, delivered=0, n_components=1)
    for cid in (5, 6, 7):
        tr.register(chunk(cid))
    for off in (0, 1, 3):  # chunk 5: [x] [x] [ ] [x]
        deliver(tr, 5, off)
    for off in range(4):  # chunk 6: [x] [x] [x] [x]
        deliver(tr, 6, off)
    return tr  # chunk 7: [ ] [ ] [ ] [ ]


def test_chunks_5_6_7_same_epoch_nothing_evicted():
    tr = _chunks_5_6_7(boundaries=[8])  # epoch [5, 8): chunks 5, 6, 7
    assert list(tr.progress[5].closed) == [1, 1, 0, 1] and tr.progress[5].popcount == 3
    assert tr.progress[6].complete
    assert tr.progress[7].popcount == 0
    assert tr.floor == 5
    assert sorted(tr.progress) == [5, 6, 7]


def test_chunk_6_complete_is_not_evicted_while_5_below_it_is_incomplete():
    # Even with a boundary after every chunk, eviction is contiguous from the bottom.
    tr = _chunks_5_6_7(boundaries=[6, 7, 8])
    assert tr.floor == 5
    assert sorted(tr.progress) == [5, 6, 7]
    deliver(tr, 5, 2)  # chunk 5 completes; cursor now in chunk 5 (pinned)
    assert tr.floor == 5
    deliver(tr, 7, 0)  # cursor moves to chunk 7: epochs [5,6) and [6,7) evict
    assert tr.floor == 7
    assert sorted(tr.progress) == [7]


def test_chunks_5_6_completing_in_shared_epoch_evict_together():
    tr = _chunks_5_6_7(boundaries=[7])  # epoch [5, 7), then chunk 7 in the next one
    deliver(tr, 5, 2)
    assert tr.floor == 5  # cursor pinned in chunk 5
    d = deliver(tr, 7, 0)
    assert d.floor == 7 and sorted(tr.progress) == [7]


# -- (c) epochs 0 / 1 / 2 ---------------------------------------------------------------


def test_epochs_evict_atomically_and_contiguously():
    lane = Lane(epoch_based=True, k=2)
    lane.fetch(6)  # epochs [0,1], [2,3], [4,5]
    assert lane.tracker.boundaries == [2, 4, 6]
    for off in range(4):
        lane.deliver(0, off)
    for off in range(3):
        lane.deliver(1, off)
    assert lane.tracker.floor == 0  # chunk 0 complete, chunk 1 not: epoch 0 stays whole
    assert lane.inflight() == [0, 1, 2, 3, 4, 5]
    lane.deliver(1, 3)
    lane.deliver(2, 0)  # epoch 0 complete, cursor in epoch 1
    assert lane.tracker.floor == 2
    assert lane.inflight() == [2, 3, 4, 5]  # epoch 0 evicted alone
    assert sorted(lane.tracker.progress) == [2, 3, 4, 5]
    # Epoch 2 completing does not jump over the incomplete epoch 1.
    for off in range(4):
        lane.deliver(4, off)
    for off in range(4):
        lane.deliver(5, off)
    assert lane.tracker.floor == 2
    assert lane.inflight() == [2, 3, 4, 5]
    bounds = lane.ledger.snapshot(Delivery(lane.tracker.floor, None, 0, False, ())).boundaries
    assert bounds == [4, 6]


def test_epoch_with_one_incomplete_chunk_is_kept_whole():
    lane = Lane(epoch_based=True, k=2)
    lane.fetch(4)
    for off in range(4):
        lane.deliver(1, off)  # chunk 1 complete first (reordered output)
    for off in range(3):
        lane.deliver(0, off)  # chunk 0 misses offset 3
    lane.deliver(2, 0)
    assert lane.tracker.floor == 0
    assert lane.inflight() == [0, 1, 2, 3]


# -- (d) nothing before the lane's first own boundary -----------------------------------


def test_no_eviction_before_first_own_boundary_even_if_everything_closed():
    tr = tracker(True, 0, [], None, 0, 1)
    for cid in range(3):
        tr.register(chunk(cid))
    for cid in range(3):
        deliver_whole_chunk(tr, cid)
    tr.register(chunk(3))
    deliver(tr, 3, 0)
    assert tr.floor == 0
    assert all(tr.progress[c].complete for c in range(3))
    assert sorted(tr.progress) == [0, 1, 2, 3]

    # Another lane's boundary says nothing about this lane.
    other = tracker(True, 0, [], None, 0, 1)
    other.add_boundary(3)
    deliver(tr, 3, 1)
    assert tr.floor == 0

    # The lane's own first boundary authorizes eviction of its open epoch.
    tr.add_boundary(3)
    d = deliver(tr, 3, 2)
    assert d.floor == 3
    assert sorted(tr.progress) == [3]


# -- (e) cursor pinning -----------------------------------------------------------------


def test_cursor_pins_an_otherwise_complete_epoch_until_a_post_sentinel_delivery():
    lane = Lane(epoch_based=True, k=2)
    lane.fetch(4)
    for cid in (0, 1):
        for off in range(4):
            d = lane.deliver(cid, off)
    assert lane.tracker.progress[0].complete and lane.tracker.progress[1].complete
    assert d.cursor == cursor(1, 3)
    assert d.floor == 0, "the epoch holding the replay cursor must stay inflight"
    assert lane.inflight() == [0, 1, 2, 3]
    # A tombstone of a post-sentinel record does not move the cursor: still pinned.
    lane.tracker.close([contrib(2, 1)])
    assert lane.tracker.floor == 0
    d = lane.deliver(2, 0)  # first post-sentinel record delivered
    assert d.floor == 2
    assert lane.inflight() == [2, 3]


def test_cursor_chunk_is_always_inflight():
    """Property over many delivery orders: the cursor's chunk is never evicted."""
    for perm in itertools.islice(itertools.permutations(range(8)), 0, 40320, 997):
        lane = Lane(epoch_based=True, k=2, size=2)
        lane.fetch(4)
        order = [(cid, off) for cid in range(4) for off in range(2)]
        for i in perm:
            cid, off = order[i]
            d = lane.deliver(cid, off)
            assert d.cursor.chunk_id in lane.inflight()
            assert d.floor <= d.cursor.chunk_id


# -- (f) the trailing boundary ----------------------------------------------------------


def test_trailing_boundary_is_in_the_ledger_snapshot():
    ledger = LaneLedger(LaneState(LANE, source={"pos": 0}))
    for cid in range(4):
        ledger.register(chunk(cid), {"pos": cid + 1}, boundary_after=(cid + 1) % 2 == 0)
    ledger.trim(2)
    st = ledger.snapshot(Delivery(2, None, 0, False, ()))
    chunks, bounds, state, next_id = st.chunks, st.boundaries, st.source, st.next_chunk
    assert [c.chunk_id for c in chunks] == [2, 3]
    assert next_id == 4
    assert bounds == [4], "the boundary just past the last inflight chunk must be kept"
    assert state == {"pos": 4}


def _trailing_state():
    """A real checkpoint in which some lane's last boundary equals its next chunk id."""
    pipe = (
        Pipeline(
            source(chunk_size=4), canonical_replicas=2, flush_every_k_chunks=2, seed=5, prefetch=0
        )
        .fetch()
        .map(_tok, name="tokenize")
        .split(max_len=64)
        .pack(seq_len=64, bins=2)
        .batch(batch_size=2)
    )
    it = iter(pipe)
    for n in range(1, 400):
        next(it)
        st = pipe.checkpoint()
        for ls in st["lanes"]:
            if ls["chunks"] and ls["boundaries"] and ls["boundaries"][-1] == ls["next_chunk"]:
                pipe.close()
                return n, st, ls["lane"]
    raise AssertionError("no checkpoint with a trailing boundary in 400 outputs")


_tok = byte_tokenize


def _build_trailing():
    return (
        Pipeline(
            source(chunk_size=4), canonical_replicas=2, flush_every_k_chunks=2, seed=5, prefetch=0
        )
        .fetch()
        .map(_tok, name="tokenize")
        .split(max_len=64)
        .pack(seq_len=64, bins=2)
        .batch(batch_size=2)
    )


def test_trailing_boundary_is_reinjected_on_restore():
    from zephon_core.engine.lane_stream import FLUSH, RECS

    n, st, lane = _trailing_state()
    ls = st["lanes"][lane]
    trailing = ls["next_chunk"]
    assert trailing % 2 == 0

    pipe = _build_trailing().iterate(restore=st)
    stream = pipe.run.streams[lane]
    assert stream.tracker.has_boundary(trailing)
    n_replay = len(ls["chunks"])
    n_flush = sum(1 for b in ls["boundaries"] if b <= trailing)
    events = list(itertools.islice(stream._chunks(), n_replay + n_flush))
    kinds = [(k, x if k == FLUSH else x[0].cursor.chunk_id) for k, x in events]
    expected = []
    for c in ls["chunks"]:
        expected.append((RECS, c[0]))
        if c[0] + 1 in ls["boundaries"]:
            expected.append((FLUSH, c[0] + 1))
    assert kinds == expected
    assert kinds[-1] == (FLUSH, trailing)
    pipe.close()

    # ...and the resumed stream is exactly the uninterrupted one.
    from zephon_core.testing import assert_streams_equal, take

    ref = _build_trailing()
    expected_out = take(ref, n + 60)[n:]
    ref.close()
    resumed = _build_trailing()
    resumed.load_state_dict(st)
    assert_streams_equal(expected_out, take(resumed, 60), "resume at a trailing boundary")
    resumed.close()


# -- (g) monotone watermark -------------------------------------------------------------


def test_monotone_watermark_evicts_everything_below_the_delivered_chunk():
    lane = Lane(epoch_based=False, k=0)
    lane.fetch(10)
    assert lane.tracker.progress == {}  # no per-offset tracking in monotone mode
    d = lane.deliver(0, 0)
    assert d.floor == 0
    d = lane.deliver(6, 2)  # chunks 1..5 produced nothing deliverable (e.g. all filtered)
    assert d.floor == 6
    assert lane.inflight() == [6, 7, 8, 9]
    # the watermark never moves back
    d = deliver(lane.tracker, 4, 0)
    assert d.floor == 6


def test_monotone_ignores_boundaries_and_completion():
    tr = tracker(False, 0, [2, 4], None, 0, 1)
    d = deliver(tr, 3, 0)
    assert d.floor == 3


# -- (h) tombstones close offsets -------------------------------------------------------


def test_tombstones_close_offsets_and_allow_eviction():
    tr = tracker(True, 0, [1], None, 0, 1)
    tr.register(chunk(0, size=3))
    tr.register(chunk(1, size=3))
    deliver(tr, 0, 0)
    deliver(tr, 0, 2)
    deliver(tr, 1, 0)
    assert tr.floor == 0 and not tr.progress[0].complete
    # offset 1 was filtered out: its tombstone closes it
    tr.close([contrib(0, 1)])
    assert tr.progress[0].complete
    d = deliver(tr, 1, 1)
    assert d.floor == 1 and sorted(tr.progress) == [1]


def test_tombstone_of_the_last_child_standing_closes_a_split_offset():
    tr = tracker(True, 0, [1], None, 0, 1)
    tr.register(chunk(0, size=1))
    tr.register(chunk(1, size=1))
    tr.deliver([contrib(0, 0, 0, False)], cursor(0, 0, 0))
    tr.deliver([contrib(0, 0, 1, False)], cursor(0, 0, 1))
    assert not tr.progress[0].complete
    tr.close([contrib(0, 0, 2, True)])  # last child dropped by a filter
    assert tr.progress[0].complete
    d = deliver(tr, 1, 0)
    assert d.floor == 1


def test_delivery_state_fields():
    tr = tracker(True, 0, [], None, 7, 2)
    tr.register(chunk(0))
    d = tr.deliver(
        [Contributor(0, 0, 0, True, 1, 10), Contributor(0, 1, 0, True, 0, 3)], cursor(0, 0)
    )
    assert d == Delivery(0, cursor(0, 0), 8, False, (3, 10))
    end = tr.finish(next_chunk_id=5)
    assert end.exhausted and end.floor == 5 and end.delivered == 8
    assert tr.progress == {} and tr.boundaries == []


def test_tombstones_from_a_filter_keep_a_real_pipeline_bounded():
    """A filter that drops most records still lets chunks evict (via its tombstones)."""
    pipe = (
        Pipeline(source(), canonical_replicas=2, flush_every_k_chunks=2, seed=3, prefetch=0)
        .fetch()
        .map(_tok, name="tokenize")
        .filter(_short, name="short_only")
        .split(max_len=64)
        .shuffle(buffer_size=4)
    )
    it = iter(pipe)
    run = it.run
    worst = 0
    for _ in range(600):
        next(it)
        worst = max(worst, *(len(run.streams[lane].ledger) for lane in (0, 1)))
    st = pipe.checkpoint()
    pipe.close()
    assert worst <= 6, f"ledger grew to {worst} chunks"
    assert min(ls["floor"] for ls in st["lanes"]) > 20


def _short(payload) -> bool:
    return len(payload["input_ids"]) < 200
