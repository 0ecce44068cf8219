"""The two schedulers of a mixture lane (``sources/scheduling.py``)."""

from __future__ import annotations

from collections import Counter

from zephon_core import StaticMixtureWorkSource
from zephon_core.sources.mixture_rows import LaneRows
from zephon_core.sources.scheduling import DeficitScheduler, RoundRobinScheduler


def test_round_robin_is_exact_over_every_window_of_the_weights():
    src = StaticMixtureWorkSource(
        {"a": list(range(100)), "b": list(range(100))}, {"a": 0.7, "b": 0.3}, chunk_size=10
    )
    sched, cursors = RoundRobinScheduler(src), [0, 0]
    for _ in range(5):
        picks, rows = sched.fill(cursors, 0, LaneRows(src, 0, 1))
        assert Counter(picks) == {0: 7, 1: 3} and len(rows) == 10
    assert cursors == [35, 15]


def test_token_deficits_follow_token_shares():
    lengths = {"a": [10] * 200, "b": [1] * 200}
    src = StaticMixtureWorkSource(
        {"a": list(range(200)), "b": list(range(200))},
        {"a": 0.5, "b": 0.5},
        chunk_size=8,
        weights_unit="tokens",
        lengths=lengths,
    )
    sched, cursors, rows = DeficitScheduler(src, 1), [0, 0], LaneRows(src, 0, 1)
    for _ in range(10):
        sched.fill(cursors, 0, rows)
    tokens_a, tokens_b = 10 * cursors[0], cursors[1]
    assert sched.tokens == tokens_a + tokens_b
    assert abs(tokens_a - tokens_b) <= 10  # equal token shares, within one document
