"""Property tests: random valid operator chains resume bit-identically, and their output
does not depend on the runtime knobs (parallelism, prefetch, queue_size).

Sources weigh by documents or by tokens (lengths estimated by the pipeline) and shuffle
rows over the epoch or by blocks. Chains
are random subsets and orders of map/filter/split/pack/shuffle/ensure_mixture
(after fetch and a tokenizer) with an optional batch, followed by up to two of the
stateless operators allowed after it (a map, a filter; parallel when the drawn
parallelism is). Validity: pack needs token fragments no longer than its seq_len, so a
split always precedes a pack.
"""

from __future__ import annotations

import pytest
from helpers import source
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_resume_combinations import MONOTONE_STEPS, POST_BATCH, STEPS

from zephon_core import Pipeline
from zephon_core.testing import assert_resume_equivalent, assert_streams_equal, take

MIDDLE = ["filter", "map2", "split", "pack", "shuffle", "mix"]
BATCHES = [None, "batch_drop", "batch_keep", "batch_longest"]

PROPERTY = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@st.composite
def chains(draw):
    ops = draw(st.lists(st.sampled_from(MIDDLE), unique=True, max_size=len(MIDDLE)))
    ops = list(draw(st.permutations(ops)))
    if "pack" in ops:
        if "split" not in ops:
            ops.insert(ops.index("pack"), "split")
        elif ops.index("split") > ops.index("pack"):
            i, j = ops.index("pack"), ops.index("split")
            ops[i], ops[j] = ops[j], ops[i]
    batch = draw(st.sampled_from(BATCHES))
    if batch is None:
        return ["tok", *ops]
    after = draw(st.lists(st.sampled_from(POST_BATCH), unique=True, max_size=2))
    return ["tok", *ops, batch, *draw(st.permutations(after))]


@st.composite
def configs(draw):
    return dict(
        steps=draw(chains()),
        k=draw(st.integers(1, 5)),
        chunk_size=draw(st.integers(1, 16)),
        lanes=draw(st.integers(1, 6)),
        unit=draw(st.sampled_from(["documents", "tokens"])),
        block=draw(st.sampled_from([None, None, 3, 16])),
    )


runtime = st.fixed_dictionaries(
    dict(
        parallelism=st.integers(1, 3),
        prefetch=st.integers(0, 4),
        queue_size=st.integers(1, 4),
    )
)


def builder(cfg, rt):
    steps = cfg["steps"]
    monotone = all(s in MONOTONE_STEPS for s in steps)

    def build():
        pipe = Pipeline(
            source(cfg["chunk_size"], unit=cfg["unit"], shuffle_block=cfg["block"]),
            canonical_replicas=cfg["lanes"],
            flush_every_k_chunks=None if monotone else cfg["k"],
            seed=29,
            prefetch=rt["prefetch"],
            queue_size=rt["queue_size"],
        )
        pipe = pipe.fetch(parallelism=rt["parallelism"])
        for s in steps:
            pipe = STEPS[s](pipe, rt["parallelism"])
        return pipe

    return build


@pytest.mark.slow  # many seconds in this process
@PROPERTY
@given(cfg=configs(), rt=runtime, total=st.integers(20, 80), data=st.data())
def test_resumed_equals_uninterrupted(cfg, rt, total, data):
    cuts = data.draw(
        st.lists(st.integers(0, total), min_size=1, max_size=3, unique=True), label="cuts"
    )
    report = assert_resume_equivalent(builder(cfg, rt), sorted(cuts), total)
    assert report.total == total


@pytest.mark.slow  # many seconds in this process
@settings(PROPERTY, max_examples=100)
@given(cfg=configs(), rt1=runtime, rt2=runtime, total=st.integers(20, 80))
def test_output_independent_of_runtime_knobs(cfg, rt1, rt2, total):
    outs = []
    for rt in (rt1, rt2):
        pipe = builder(cfg, rt)()
        try:
            outs.append(take(pipe, total))
        finally:
            pipe.close()
    assert len(outs[0]) == total
    assert_streams_equal(outs[0], outs[1], f"{cfg['steps']}: {rt1} vs {rt2}")


@pytest.mark.slow  # many seconds in this process
@settings(PROPERTY, max_examples=60)
@given(
    cfg=configs(),
    rts=st.lists(runtime, min_size=2, max_size=3),
    total=st.integers(20, 80),
    data=st.data(),
)
def test_resume_under_other_runtime_knobs(cfg, rts, total, data):
    """A checkpoint taken with one parallelism/prefetch/queue_size resumes exactly under
    another (each pipeline assert_resume_equivalent builds uses the next setting)."""
    cuts = data.draw(
        st.lists(st.integers(0, total), min_size=1, max_size=3, unique=True), label="cuts"
    )
    builders = [builder(cfg, rt) for rt in rts]
    calls = [0]

    def build():
        calls[0] += 1
        return builders[calls[0] % len(builders)]()

    assert_resume_equivalent(build, sorted(cuts), total)
