"""The exactness column of ``benchmarks/bench_vs_grain.py`` (cut, restore into a fresh
pipeline, compare) says "yes" only when the resumed batches equal an uninterrupted run's,
and names the first batch that differs otherwise."""

from __future__ import annotations

import numpy as np
from benchmods import load

vs_grain = load("bench_vs_grain")


class _Counter:
    """A Grain-like iterator over batches {"x": [i, i+1]}; ``honest=False`` ignores
    ``set_state`` as a broken restore would."""

    def __init__(self, honest: bool):
        self.i, self.honest = 0, honest

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        self.i += 1
        return {"x": np.array([self.i, self.i + 1])}

    def get_state(self) -> dict:
        return {"i": self.i}

    def set_state(self, state: dict) -> None:
        if self.honest:
            self.i = state["i"]


def test_exact_grain_accepts_a_faithful_restore():
    got = vs_grain.exact_grain(lambda: _Counter(honest=True), (3, 7), 12)
    assert got == "yes (2 cuts in 12 batches)"


def test_exact_grain_names_the_first_batch_a_broken_restore_gets_wrong():
    got = vs_grain.exact_grain(lambda: _Counter(honest=False), (3, 7), 12)
    assert got == "no: batch 3 differs after a cut at 3"


def test_exact_zephon_on_the_bar_pipeline():
    common = load("common")
    got = vs_grain.exact_zephon(lambda: common.bar_pipeline(prefetch=0), (2, 9), 14)
    assert got == "yes (2 cuts in 14 batches)"


def test_exact_turns_an_exception_into_a_row():
    def fails() -> str:
        raise NotImplementedError("no get_state here")

    assert vs_grain.exact(fails) == "no: NotImplementedError: no get_state here"
