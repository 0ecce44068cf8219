"""ensure_mixture: holds records in a bounded window and releases the one that most
reduces the token-share deficit (documented rule in zephon_core/ops/ensure_mixture.py):

whenever the window is full, the oldest held record whose main component (most tokens;
ties lowest index) is the most under-represented one (largest target*total - emitted;
ties lowest index) among those present leaves; flush drains in that order and resets.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opkit import bind, feed, pending, rec, run, token_source

from zephon_core import Pipeline
from zephon_core.errors import ConfigError
from zephon_core.ops import EnsureMixtureOp
from zephon_core.records import Contributor, Record, SampleCursor


def named(records, names):
    by = {r.cursor: n for r, n in zip(records, names)}
    return lambda out: [by[r.cursor] for r in out]


def mix(window=3, weights=None, targets=(0.5, 0.5)):
    return bind(EnsureMixtureOp(weights, window), weights=targets)


def test_hand_example_deficit_rule_and_flush_order():
    # a: c0 30 tok, b: c0 10, c: c1 10, d: c1 10, e: c0 10, f: c1 20, g: c0 10, h: c1 10
    spec = [
        ("a", 0, 30),
        ("b", 0, 10),
        ("c", 1, 10),
        ("d", 1, 10),
        ("e", 0, 10),
        ("f", 1, 20),
        ("g", 0, 10),
        ("h", 1, 10),
    ]
    recs = [rec(0, i, n, comp=c) for i, (_, c, n) in enumerate(spec)]
    name = named(recs, [s[0] for s in spec])
    op = mix(window=3)
    steps = [name(op.process(r)) for r in recs]
    # a, b wait; c fills the window: deficits tie at 0 -> component 0, its oldest: a.
    # then: c (c1 behind by 15), d (c1 behind by 10), f (c1 behind by 5),
    # b (only c0 present), e (tie at 0 -> c0)
    assert steps == [[], [], ["a"], ["c"], ["d"], ["f"], ["b"], ["e"]]
    # flush: emitted c0=50, c1=40 of 90 -> c1 is behind by 5: h first, then g
    assert name(op.flush()) == ["h", "g"]
    assert not pending(op)


def test_hand_example_uneven_targets():
    # user weights 3:1 -> targets 0.75/0.25; window 2; all records 10 tokens;
    # input: three c1 records then c0 records
    comps = [1, 1, 1] + [0] * 8
    recs = [rec(0, i, 10, comp=c) for i, c in enumerate(comps)]
    name = named(recs, [f"r{i}" for i in range(len(recs))])
    op = mix(window=2, weights={"prose": 3, "code": 1})
    assert op.targets == (0.75, 0.25)
    out = name(feed(op, recs))
    # emitted tokens (c0, c1) before each pick -> released record:
    # (0,0) only c1 held -> r0; (0,10) -> r1; (0,20) c0 behind by 15 -> r3;
    # (10,20) -> r4; ... (50,20) c0 behind by 2.5 -> r8; (60,20) tie at 0 -> c0: r9;
    # (70,20) c1 behind by 2.5 -> r2 (held since the third step)
    assert out == ["r0", "r1", "r3", "r4", "r5", "r6", "r7", "r8", "r9", "r2"]
    assert name(op.flush()) == ["r10"]


def test_main_component_and_token_shares_of_merged_records():
    def packed(offset, shares):
        contribs = [Contributor(0, offset, j, True, c, n) for j, (c, n) in enumerate(shares)]
        n = sum(n for _, n in shares)
        return Record({"input_ids": np.zeros(n, np.int32)}, SampleCursor(0, 0, offset, 0), contribs)

    x, z = rec(0, 0, 10, comp=0), rec(0, 1, 10, comp=0)
    y = packed(2, [(0, 4), (1, 6)])  # main component: 1 (6 tokens of 10)
    w, v = rec(0, 3, 10, comp=0), rec(0, 4, 10, comp=1)
    name = named([x, z, y, w, v], ["x", "z", "y", "w", "v"])
    op = mix(window=3)
    assert name(feed(op, [x, z, y])) == ["x"]  # tie at 0: c0's oldest
    assert name(op.process(w)) == ["y"]  # c1 behind: y is the only c1-main record
    # y counted 4 tokens to c0 and 6 to c1 (not 10 to c1): c0 14, c1 6 -> c1 behind
    assert name(op.process(v)) == ["v"]
    # a tie in tokens makes the lowest component the main one
    tie = packed(5, [(1, 5), (0, 5)])
    op2 = mix(window=2)
    op2.process(rec(0, 9, 10, comp=1))
    op2.process(tie)  # window full at total 0 -> c0 wins the tie -> the tie record
    assert [r.cursor.offset for r in op2.flush()] == [9]


def test_window_is_bounded_and_flush_resets():
    recs = [rec(i // 4, i % 4, 5 + i % 7, comp=i % 3 == 0) for i in range(40)]
    op = mix(window=5)
    held = 0
    for i, r in enumerate(recs):
        out = op.process(r)
        held += 1 - len(out)
        assert len(out) == (0 if i < 4 else 1)
        assert held == min(i + 1, 4)
    rest = list(op.flush())
    assert len(rest) == 4 and not pending(op)
    # the lane's instance after a flush: identical to a fresh operator (counts included)
    op = op.for_lane(0)
    again = recs[:17]
    a = feed(op, again) + list(op.flush())
    fresh = mix(window=5)
    b = feed(fresh, again) + list(fresh.flush())
    assert [r.cursor for r in a] == [r.cursor for r in b]
    assert sorted(r.cursor for r in a) == sorted(r.cursor for r in again)


def _mean_share_error(records, target0):
    t0 = tot = 0
    errs = []
    for r in records:
        n = len(r.payload["input_ids"])
        t0 += n if r.contributors[0].component == 0 else 0
        tot += n
        errs.append(abs(t0 / tot - target0))
    return float(np.mean(errs)), errs


def test_skewed_input_gets_closer_to_target():
    # blocks of 12 records of component 0, then 12 of component 1, ... (10 tokens each)
    recs = [rec(i // 4, i % 4, 10, comp=(i // 12) % 2) for i in range(240)]
    op = mix(window=8)
    out = feed(op, recs) + list(op.flush())
    assert sorted(r.cursor for r in out) == sorted(r.cursor for r in recs)
    before, _ = _mean_share_error(recs, 0.5)
    after, errs = _mean_share_error(out, 0.5)
    assert after < before / 2
    assert max(errs[20:]) < 0.1


def test_generic_payloads_count_one_token_each():
    recs = [
        Record({"x": i}, SampleCursor(0, 0, i, 0), [Contributor(0, i, 0, True, c, 0)])
        for i, c in enumerate([0, 0, 0, 1, 1, 1])
    ]
    op = mix(window=3)
    out = feed(op, recs) + list(op.flush())
    assert [r.payload["x"] for r in out] == [0, 3, 1, 4, 2, 5]


def test_default_targets_are_the_source_weights():
    op = bind(EnsureMixtureOp(), weights=(0.7, 0.3))
    assert op.targets == pytest.approx((0.7, 0.3))
    op = bind(EnsureMixtureOp([1, 3]), weights=(0.7, 0.3))
    assert op.targets == pytest.approx((0.25, 0.75))


@pytest.mark.parametrize(
    "weights",
    [
        {"prose": 1, "poetry": 1},
        {"nope": 1.0},
        [1.0],
        [1, 2, 3],
        {"prose": -1, "code": 1},
        [0, 0],
        [float("nan"), 1],
        [float("inf"), 1],
    ],
)
def test_bad_weights_are_config_errors(weights):
    with pytest.raises(ConfigError):
        bind(EnsureMixtureOp(weights))


def test_unknown_component_names_it():
    with pytest.raises(ConfigError, match="poetry"):
        bind(EnsureMixtureOp({"prose": 1, "poetry": 1}))


def test_unknown_component_through_pipeline():
    pipe = (
        Pipeline(token_source(), seed=1, flush_every_k_chunks=2)
        .fetch()
        .ensure_mixture(weights={"a": 1, "zzz": 2})
    )
    with pytest.raises(ConfigError, match="zzz"):
        run(pipe, 1)


@pytest.mark.parametrize("window", [0, -1, 2.0])
def test_bad_window(window):
    with pytest.raises(ConfigError):
        EnsureMixtureOp(window=window)


def test_traits():
    assert not EnsureMixtureOp.traits.preserves_cursor_order
    assert not EnsureMixtureOp.traits.stateless


def test_pipeline_reorders_only_within_epochs_and_balances_tokens():
    # component b has ~3x the tokens per record of a: by tokens the input is skewed
    k, cs = 8, 4
    base = run(Pipeline(token_source(chunk_size=cs), seed=3).fetch(), 320)
    got = run(
        Pipeline(token_source(chunk_size=cs), seed=3, flush_every_k_chunks=k)
        .fetch()
        .ensure_mixture(window=8),
        320,
    )
    ids = [p["id"] for p in got]
    assert ids != [p["id"] for p in base]
    for e in range(0, 320, k * cs):
        assert Counter(ids[e : e + k * cs]) == Counter(p["id"] for p in base[e : e + k * cs])

    def err(stream):
        t0 = tot = 0
        out = []
        for i, p in enumerate(stream):
            n = len(p["input_ids"])
            t0 += n if p["id"].startswith("a") else 0
            tot += n
            if i % (k * cs) not in (0, k * cs - 1):  # inside epochs
                out.append(abs(t0 / tot - 0.5))
        return np.mean(out)

    assert err(got) < err(base)


def _model_release_order(items, targets, window, flush_after):
    """Independent implementation of the documented rule over (component, tokens) items."""
    held, emitted, total, out = [], [0.0] * len(targets), 0, []

    def release():
        nonlocal total
        present = sorted({c for _, c, _ in held})
        best = max(present, key=lambda c: (targets[c] * total - emitted[c], -c))
        j = next(j for j, h in enumerate(held) if h[1] == best)
        idx, c, n = held.pop(j)
        emitted[c] += n
        total += n
        out.append(idx)

    for i, (c, n) in enumerate(items):
        held.append((i, c, n))
        if len(held) >= window:
            release()
        if i in flush_after:
            while held:
                release()
            emitted, total = [0.0] * len(targets), 0
    return out


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(window=st.integers(1, 8), w0=st.integers(1, 5), w1=st.integers(0, 5), data=st.data())
def test_matches_the_documented_rule(window, w0, w1, data):
    items = data.draw(
        st.lists(st.tuples(st.integers(0, 1), st.integers(1, 30)), max_size=50), label="items"
    )
    flush_after = set(data.draw(st.lists(st.integers(0, 50), max_size=3), label="flushes"))
    targets = (w0 / (w0 + w1), w1 / (w0 + w1))
    op = mix(window=window, weights=[w0, w1])
    got = []
    for i, (c, n) in enumerate(items):
        got += [r.cursor.offset for r in op.process(rec(0, i, n, comp=c))]
        if i in flush_after:
            got += [r.cursor.offset for r in op.flush()]
            assert not pending(op)
            op = op.for_lane(0)  # what the runner does after a flush
    assert got == _model_release_order(items, targets, window, flush_after)
