"""Resume equivalence for every operator alone and in combinations.

Every case runs zephon_core.testing.assert_resume_equivalent with many cut points:
0, 1, 2, around the first flush (epoch) boundary of a lane, the middle, and late
cuts up to ``total`` -- and, for finite streams, at and after the end.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from helpers import byte_tokenize, reference_pipeline, source

from zephon_core import Pipeline, StaticMixtureWorkSource
from zephon_core.checkpoint.state import PipelineState
from zephon_core.distributed.merge import peer_difference
from zephon_core.testing import assert_resume_equivalent, assert_streams_equal, take

SEQ = 128


def keep70(p):
    """Drops ~30% of documents, deterministically from their tokens."""
    return int(p["input_ids"][-1]) % 10 >= 3


def add_one(p):
    return {**p, "input_ids": (p["input_ids"] + 1).astype(p["input_ids"].dtype)}


def bump_batch(b):
    """A map after batch: adds 1 to the batch's token ids."""
    return {**b, "input_ids": b["input_ids"] + 1}


def keep_most_batches(b):
    """A filter after batch: drops ~1/4 of the batches, from their tokens."""
    return int(b["input_ids"].sum()) % 4 != 0


STEPS = {
    "tok": lambda pipe, par: pipe.map(byte_tokenize, parallelism=par, name="tokenize"),
    "filter": lambda pipe, par: pipe.filter(keep70, parallelism=par),
    "map2": lambda pipe, par: pipe.map(add_one, parallelism=par, name="add_one"),
    "split": lambda pipe, par: pipe.split(max_len=SEQ),
    "pack": lambda pipe, par: pipe.pack(seq_len=SEQ, bins=3),
    "shuffle": lambda pipe, par: pipe.shuffle(buffer_size=8),
    "mix": lambda pipe, par: pipe.ensure_mixture(window=6),
    "batch_drop": lambda pipe, par: pipe.batch(3, drop_last=True),
    "batch_keep": lambda pipe, par: pipe.batch(3, drop_last=False),
    "batch_longest": lambda pipe, par: pipe.batch(2, drop_last=False, pad_to="longest"),
    # stateless operators after batch (with par > 1 a parallel stage follows it)
    "post_map": lambda pipe, par: pipe.map(bump_batch, parallelism=par, name="post_map"),
    "post_filter": lambda pipe, par: pipe.filter(
        keep_most_batches, parallelism=par, name="post_filter"
    ),
}
MONOTONE_STEPS = {
    "tok",
    "filter",
    "map2",
    "split",
    "batch_drop",
    "batch_keep",
    "batch_longest",
    "post_map",
    "post_filter",
}
POST_BATCH = ["post_map", "post_filter"]
PARALLEL_STEPS = {"tok", "filter", "map2", "post_map", "post_filter"}

CHAINS = {
    # each operator alone (after fetch, and a tokenizer where it needs tokens)
    "fetch": [],
    "map": ["tok"],
    "filter": ["tok", "filter"],
    "split": ["tok", "split"],
    "pack": ["tok", "split", "pack"],
    "shuffle": ["tok", "shuffle"],
    "mixture": ["tok", "mix"],
    "batch": ["tok", "split", "batch_keep"],
    "batch_drop_flushing": ["tok", "split", "shuffle", "batch_drop"],
    # growing chains
    "map_filter": ["tok", "filter"],
    "map_filter_split": ["tok", "filter", "split"],
    "to_pack": ["tok", "filter", "split", "pack"],
    "to_shuffle": ["tok", "filter", "split", "pack", "shuffle"],
    "to_mixture": ["tok", "filter", "split", "pack", "shuffle", "mix"],
    "full_drop_last": ["tok", "filter", "split", "pack", "shuffle", "mix", "batch_drop"],
    "full_keep_last": ["tok", "filter", "split", "pack", "shuffle", "mix", "batch_keep"],
    "reference": ["tok", "split", "pack", "shuffle", "mix", "batch_drop"],
    # other orders
    "shuffle_then_pack": ["tok", "split", "shuffle", "pack", "batch_drop"],
    "shuffle_before_split": ["tok", "shuffle", "split", "pack"],
    "mix_before_pack": ["tok", "split", "mix", "pack", "shuffle", "batch_keep"],
    "filter_after_pack": ["tok", "split", "pack", "filter", "map2", "mix"],
    "unpacked_batches": ["tok", "filter", "shuffle", "mix", "batch_longest"],
    # after batch: its partial batch held over a flush while a parallel stage runs ahead
    "parallel_after_batch": ["tok", "split", "shuffle", "batch_drop", "post_map"],
    "mix_batch_filter_map": ["tok", "split", "mix", "batch_drop", "post_filter", "post_map"],
}


def build_fn(
    chain, *, lanes=1, k=2, prefetch=0, parallelism=1, queue_size=2, chunk_size=2, src=None
):
    steps = CHAINS[chain] if isinstance(chain, str) else chain
    monotone = all(s in MONOTONE_STEPS for s in steps)

    def build():
        pipe = Pipeline(
            src() if src else source(chunk_size),
            canonical_replicas=lanes,
            flush_every_k_chunks=None if monotone else k,
            seed=17,
            prefetch=prefetch,
            queue_size=queue_size,
        )
        pipe = pipe.fetch(parallelism=parallelism)
        for s in steps:
            pipe = STEPS[s](pipe, parallelism)
        return pipe

    return build, monotone


def _lane_chunks(build, total):
    """For each output, (lane, chunk id of the delivered cursor) -- from checkpoints."""
    pipe = build()
    out = []
    try:
        it = iter(pipe)
        for _ in range(total):
            try:
                next(it)
            except StopIteration:
                break
            state = pipe.checkpoint()
            lane = (state["position"] - 1) % len(state["lanes"])
            cur = state["lanes"][lane]["cursor"]
            out.append((lane, cur[1] if cur is not None else -1))
    finally:
        pipe.close()
    return out


def boundary_cut(build, total, period):
    """The first output position whose prefix ends exactly at a boundary (a flush, or a
    chunk for order-keeping pipelines) of the delivering lane."""
    seen: dict[int, int] = {}
    for g, (lane, chunk) in enumerate(_lane_chunks(build, total)):
        epoch = chunk // period
        if lane in seen and epoch > seen[lane]:
            return g
        seen[lane] = epoch
    return None


def cut_points(total, boundary):
    cuts = {0, 1, 2, total // 3, total // 2, total - 3, total - 1, total}
    if boundary is not None:
        cuts |= {boundary - 1, boundary, boundary + 1}
    return sorted(c for c in cuts if 0 <= c <= total)


CONFIGS = [  # lanes (canonical_replicas), k, prefetch, parallelism, queue_size
    (1, 1, 0, 1, 1),
    (1, 2, 3, 3, 2),
    (3, 2, 0, 3, 4),
    (3, 5, 2, 1, 1),
    (8, 1, 4, 3, 2),
    (8, 5, 0, 1, 3),
]
# every chain on one lane inline and on three lanes with threads in `make test-fast`; the
# whole matrix (minutes of CPU, in this process) in `make test`
FAST_CONFIGS = {(1, 1, 0, 1, 1), (3, 2, 0, 3, 4)}


def _cases():
    for chain, steps in CHAINS.items():
        monotone = all(s in MONOTONE_STEPS for s in steps)
        seen = set()
        for lanes, k, prefetch, par, qs in CONFIGS:
            key = (lanes, None if monotone else k, prefetch, par, qs)
            if key in seen:
                continue
            seen.add(key)
            yield pytest.param(
                chain,
                lanes,
                k,
                prefetch,
                par,
                qs,
                id=f"{chain}-C{lanes}-k{k}-pf{prefetch}-p{par}-q{qs}",
                marks=() if (lanes, k, prefetch, par, qs) in FAST_CONFIGS else pytest.mark.slow,
            )


def _total(chain, lanes, k):
    steps = CHAINS[chain]
    batched = any(s.startswith("batch") for s in steps)
    per_lane = 4 * k + 6 if not batched else 2 * k + 4
    return lanes * per_lane


@pytest.mark.parametrize(
    ("chain", "lanes", "k", "prefetch", "parallelism", "queue_size"), list(_cases())
)
def test_resume_equivalent(chain, lanes, k, prefetch, parallelism, queue_size):
    build, monotone = build_fn(
        chain, lanes=lanes, k=k, prefetch=prefetch, parallelism=parallelism, queue_size=queue_size
    )
    boundary = boundary_cut(build, 600, 1 if monotone else k)
    assert boundary is not None, "no flush/chunk boundary within 600 outputs"
    # long enough for most lanes to cross a flush and the first ones to cross two
    total = max(_total(chain, lanes, k), 2 * boundary + 2 * lanes)
    report = assert_resume_equivalent(build, cut_points(total, boundary), total)
    assert report.total == total
    # bounded recovery: a cut never replays more than a few epochs per lane, plus what
    # the producer had pulled ahead of the consumer (the ledger keeps those chunks, see
    # tracking/ledger.py): ``prefetch`` outputs and ``queue_size`` per parallel stage.
    # How far it got depends on thread timing, so only this bound is deterministic.
    parallel_stages = (
        (1 + sum(s in PARALLEL_STEPS for s in CHAINS[chain])) if parallelism > 1 else 0
    )
    ahead = prefetch + queue_size * parallel_stages
    assert max(report.chunks_replayed) <= lanes * (2 * max(k, 1) + 3 + ahead)


@pytest.mark.parametrize("chain", ["reference", "full_keep_last", "to_mixture"])
def test_resume_with_k_and_lanes_sweep(chain):
    for lanes, k in [(1, 5), (3, 1), (8, 2)]:
        build, _ = build_fn(chain, lanes=lanes, k=k, prefetch=2, parallelism=2)
        total = _total(chain, lanes, k)
        assert_resume_equivalent(build, [0, 1, total // 4, total // 2, total - 1], total)


@pytest.mark.slow
def test_parallel_stage_after_batch_in_dataloader_workers():
    """The same chain through DataLoader workers (the batch's tensors are built in the
    worker, not by the training process, when an operator follows batch)."""
    build, _ = build_fn("parallel_after_batch", lanes=4, k=2, parallelism=2)
    assert_resume_equivalent(build, [0, 3, 13, 30], 40, num_workers=2)


# -- finite streams: cuts at and after the end -------------------------------------


def _small_source(num_epochs=1, chunk_size=3):
    rng = np.random.default_rng(3)
    a = [
        {"text": "a" * int(n) + f"{i}", "id": f"a{i}"}
        for i, n in enumerate(rng.integers(3, 150, 17))
    ]
    b = [
        {"text": "b" * int(n) + f"{i}", "id": f"b{i}"}
        for i, n in enumerate(rng.integers(3, 200, 9))
    ]
    return StaticMixtureWorkSource(
        {"a": a, "b": b}, {"a": 2, "b": 1}, chunk_size=chunk_size, seed=4, num_epochs=num_epochs
    )


@pytest.mark.parametrize(
    "chain",
    [
        "map_filter_split",
        "to_pack",
        "full_drop_last",
        "full_keep_last",
        "shuffle_then_pack",
        "mix_batch_filter_map",
    ],
)
@pytest.mark.parametrize(("lanes", "k", "prefetch"), [(1, 2, 0), (3, 1, 2)])
def test_resume_finite_stream(chain, lanes, k, prefetch):
    build, _ = build_fn(
        chain, lanes=lanes, k=k, prefetch=prefetch, parallelism=2, src=_small_source
    )
    pipe = build()
    try:
        full = take(pipe, 10_000)
    finally:
        pipe.close()
    n = len(full)
    assert 0 < n < 10_000
    cuts = sorted({0, 1, n // 2, n - 2, n - 1, n} - {-1, -2})
    report = assert_resume_equivalent(build, cuts, n + 5)
    assert report.total == n  # nothing after the end, on any resume
    # a checkpoint taken after the end restores to an exhausted iterator
    pipe = build()
    try:
        assert len(take(pipe, n + 5)) == n
        state = pipe.checkpoint()
    finally:
        pipe.close()
    again = build()
    again.load_state_dict(state)
    try:
        assert take(again, 3) == []
    finally:
        again.close()


def test_monotone_chains_ignore_k():
    """A positive k on an order-keeping chain warns and is forced to 0 -- resume holds."""

    def build():
        return (
            Pipeline(source(4), canonical_replicas=3, flush_every_k_chunks=2, seed=17)
            .fetch()
            .map(byte_tokenize)
            .split(max_len=SEQ)
        )

    with pytest.warns(UserWarning, match="forced to 0"):
        assert build().compile().k == 0
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="flush_every_k_chunks=2")
        assert_resume_equivalent(build, [0, 1, 5, 17, 30], 40)


# -- the shared reference pipeline (tests/helpers.py) --------------------------------


@pytest.mark.parametrize(
    ("lanes", "k", "prefetch", "parallelism"),
    [(1, 1, 0, 1), (3, 2, 3, 3), (8, 5, 2, 2), (3, 5, 0, 1), (8, 1, 0, 3)],
)
def test_reference_pipeline(lanes, k, prefetch, parallelism):
    def build():
        return reference_pipeline(
            lanes=lanes, k=k, chunk_size=4, seq_len=64, prefetch=prefetch, parallelism=parallelism
        )

    boundary = boundary_cut(build, 400, k)
    assert boundary is not None
    total = 2 * boundary + 2 * lanes
    assert_resume_equivalent(build, cut_points(total, boundary), total)


# -- resuming a resumed pipeline, and switching runtime knobs on resume ---------------


def _resume(build, state, n):
    pipe = build()
    pipe.load_state_dict(state)
    try:
        return take(pipe, n), pipe.checkpoint()
    finally:
        pipe.close()


@pytest.mark.parametrize(
    "chain",
    [
        "map_filter_split",
        "full_drop_last",
        "full_keep_last",
        "shuffle_then_pack",
        "mix_before_pack",
    ],
)
@pytest.mark.parametrize("lanes", [1, 3])
def test_resume_twice_and_checkpoint_is_idempotent(chain, lanes):
    build, _ = build_fn(chain, lanes=lanes, k=2, prefetch=2, parallelism=2)
    total = 24 * lanes
    ref_pipe = build()
    try:
        reference = take(ref_pipe, total)
    finally:
        ref_pipe.close()
    a, b = 5 * lanes + 1, 13 * lanes + 2
    first = build()
    try:
        head = take(first, a)
        s1 = first.checkpoint()
        # taking a checkpoint changes nothing: the same delivered state (the pump may have
        # fetched more chunks in between, which both states restore identically)
        again, once = PipelineState.from_dict(first.checkpoint()), PipelineState.from_dict(s1)
        assert again.position == once.position
        for lane, st in once.lanes.items():
            assert peer_difference(st, again.lanes[lane]) is None
    finally:
        first.close()
    mid, s2 = _resume(build, s1, b - a)
    tail, _ = _resume(build, s2, total - b)
    for what, want, got in (
        ("head", reference[:a], head),
        ("mid", reference[a:b], mid),
        ("tail", reference[b:], tail),
    ):
        assert_streams_equal(want, got, what)


@pytest.mark.parametrize("chain", ["filter", "to_mixture", "full_drop_last", "unpacked_batches"])
def test_resume_with_different_runtime_knobs(chain):
    """parallelism / prefetch / queue_size do not change the stream, so a checkpoint
    taken with one setting resumes exactly under another."""
    knobs = [
        dict(prefetch=0, parallelism=1, queue_size=1),
        dict(prefetch=4, parallelism=3, queue_size=4),
        dict(prefetch=1, parallelism=2, queue_size=2),
    ]
    calls = []

    def build():
        kw = knobs[len(calls) % len(knobs)]
        calls.append(kw)
        return build_fn(chain, lanes=3, k=2, **kw)[0]()

    assert_resume_equivalent(build, [0, 1, 7, 20, 33, 47], 60)
    assert len({tuple(sorted(c.items())) for c in calls}) == 3
