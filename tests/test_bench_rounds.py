"""The arithmetic of ``benchmarks/rounds.py``, on fake timings: rotation of the order,
ratios taken within a round, medians with min-max, the load kept per round."""

from __future__ import annotations

import itertools

import pytest
from benchmods import load

rounds = load("rounds")


def test_order_rotates_so_each_variant_leads_in_turn():
    got = rounds.orders(["a", "b", "c"], 5)
    assert got == [
        ["a", "b", "c"],
        ["b", "c", "a"],
        ["c", "a", "b"],
        ["a", "b", "c"],
        ["b", "c", "a"],
    ]


def test_spread_is_median_with_min_max():
    s = rounds.Spread.of([3.0, 1.0, 10.0, 2.0, 4.0])
    assert (s.median, s.lo, s.hi, s.n) == (3.0, 1.0, 10.0, 5)
    assert s.fmt(1, "x") == "3.0x (1.0-10.0)"
    assert rounds.Spread.of([1500.0, 1200.0]).fmt(0) == "1,350 (1,200-1,500)"
    assert rounds.Spread.of([-3.0, 1.0, 4.0]).fmt(1, " %") == "1.0 % (-3.0 to 4.0)"


def test_cell_scales_a_spread_for_its_unit():
    x = rounds.Spread(0.002, 0.001, 0.003, 3).to_json()
    assert rounds.cell(x, 1, " ms", scale=1000) == "2.0 ms (1.0-3.0)"


def test_method_names_rounds_window_load_and_a_quick_run():
    load = [(1.0, 2.5), (0.5, 1.2)]
    full = rounds.method(2, load, "Window 10 batches.")
    assert full.startswith("2 interleaved rounds")
    assert "Window 10 batches." in full and "0.50-2.50" in full
    assert "quick run" not in full
    assert "quick run" in rounds.method(2, load, "", quick=True)


def _fake(samples: dict[str, list[dict]]) -> rounds.Rounds:
    return rounds.Rounds(samples=samples, order=[], load=[])


def test_ratio_pairs_values_of_the_same_round():
    # b is twice as fast as a in every round, while both swing 4x across rounds: the
    # per-round ratio is exactly 2, a ratio of medians of each would not see the pairing
    a = [{"seconds": s, "batches": 10.0} for s in (1.0, 4.0, 2.0, 1.0, 3.0)]
    b = [{"seconds": s / 2, "batches": 10.0} for s in (1.0, 4.0, 2.0, 1.0, 3.0)]
    r = _fake({"a": a, "b": b})
    assert r.ratio("b", "a", "batches") == rounds.Spread(2.0, 2.0, 2.0, 5)
    assert r.rate("a", "batches") == rounds.Spread(5.0, 2.5, 10.0, 5)


def test_ratio_per_count_differs_from_per_batch_when_padding_differs():
    # same batches/s; a carries 900 real tokens per batch, b 1000
    a = [{"seconds": 1.0, "batches": 10.0, "real_tokens": 9000.0}] * 5
    b = [{"seconds": 1.0, "batches": 10.0, "real_tokens": 10000.0}] * 5
    r = _fake({"a": a, "b": b})
    assert r.ratio("a", "b", "batches").median == 1.0
    assert r.ratio("a", "b", "real_tokens").median == pytest.approx(0.9)
    assert r.mean("a", "real_tokens", "batches") == 900.0


def test_per_gives_cost_per_unit():
    a = [{"seconds": 1.0, "cpu_seconds": c, "batches": 100.0} for c in (0.1, 0.3, 0.2)]
    assert _fake({"a": a}).per("a", "cpu_seconds", "batches") == rounds.Spread(
        0.002, 0.001, 0.003, 3
    )


def test_cost_ratio_pairs_costs_of_the_same_round():
    # round 2 is slow for both: its ratio is still 2, while a ratio of medians would mix
    # round 1's variant with round 3's base
    a = [{"cpu_seconds": c, "batches": 10.0} for c in (2.0, 20.0, 4.0)]
    b = [{"cpu_seconds": c, "batches": 10.0} for c in (1.0, 10.0, 2.0)]
    r = _fake({"a": a, "b": b}).cost_ratio("a", "b", "cpu_seconds", "batches")
    assert (r.median, r.lo, r.hi) == (2.0, 2.0, 2.0)


def test_run_calls_in_rotated_order_and_records_load_per_round():
    calls: list[str] = []
    loads = itertools.count(1.0)

    def variant(name: str, seconds: float):
        def sample() -> dict:
            calls.append(name)
            return {"seconds": seconds, "batches": 6.0}

        return sample

    got = rounds.run(
        {"a": variant("a", 2.0), "b": variant("b", 3.0)},
        rounds=3,
        loadavg=lambda: (next(loads), 0.0, 0.0),
    )
    assert calls == ["a", "b", "b", "a", "a", "b"]
    assert got.load == [(1.0, 2.0), (3.0, 4.0), (5.0, 6.0)]
    assert got.load_spread() == rounds.Spread(3.5, 1.0, 6.0, 6)
    assert got.rate("b", "batches").median == 2.0
    assert got.ratio("a", "b", "batches").median == 1.5


class _Counted:
    def __init__(self, n: int):
        self.n, self.closed = n, False

    def __iter__(self):
        return iter(range(self.n))

    def close(self) -> None:
        self.closed = True


def test_window_times_only_the_window_and_counts_in_one_untimed_pass():
    built: list[_Counted] = []

    def build() -> _Counted:
        built.append(_Counted(100))
        return built[-1]

    counts: list[list] = []

    def count(kept: list) -> dict[str, float]:
        counts.append(kept)
        return {"sum": float(sum(kept))}

    sample = rounds.window(build, size=10, warmup=5, count=count)
    first, second = sample(), sample()
    assert first["items"] == second["items"] == 10.0
    # items 5..14: after the warm-up, counted once (the untimed pass), reused after
    assert first["sum"] == second["sum"] == float(sum(range(5, 15)))
    assert counts == [list(range(5, 15))]
    assert len(built) == 3  # the counting pass, then one timed pass per sample
    assert all(b.closed for b in built)
    assert first["seconds"] >= 0.0


def test_window_refuses_an_iterable_shorter_than_the_window():
    with pytest.raises(RuntimeError, match="ended after 3 of 10"):
        rounds.window(lambda: _Counted(5), size=10, warmup=2)()


def test_diff_per_pairs_values_of_the_same_round():
    # on costs 10 % more CPU per batch than off in every round, while both swing 3x
    off = [{"seconds": 1.0, "cpu_seconds": c, "batches": 100.0} for c in (1.0, 3.0, 2.0)]
    on = [{"seconds": 1.0, "cpu_seconds": 1.1 * c, "batches": 100.0} for c in (1.0, 3.0, 2.0)]
    added = _fake({"off": off, "on": on}).diff_per("on", "off", "cpu_seconds", "batches")
    assert (added.median, added.lo, added.hi) == pytest.approx((0.002, 0.001, 0.003))
