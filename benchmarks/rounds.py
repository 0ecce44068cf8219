"""One method for every ratio in the benchmarks: interleaved rounds.

Each round measures every variant once (A B C, then B C A, ...: the order rotates so that
no variant always runs first or right after the same neighbour), and a ratio is taken
between two variants *in the same round*, so that a slow spell on this shared machine
hits both sides of a ratio alike. A figure is the median over the rounds with its
min-max; the 1-minute load average before and after each round is kept beside it.

A variant is a callable returning one *sample*: ``{"seconds": wall, ...}`` plus any
counts (``"batches"``, ``"real_tokens"``, ``"cpu_seconds"``...); a rate is a count over
``seconds``. :func:`window` builds such a callable from an iterable's factory.
"""

from __future__ import annotations

import itertools
import os
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

MIN_ROUNDS = 5

Sample = dict[str, float]


def orders(names: list[str], rounds: int) -> list[list[str]]:
    """The order of each round: round ``r`` starts at variant ``r % len(names)``."""
    n = len(names)
    return [names[r % n :] + names[: r % n] for r in range(rounds)]


@dataclass(frozen=True)
class Spread:
    """A median with the min-max of the values it was taken over."""

    median: float
    lo: float
    hi: float
    n: int

    @classmethod
    def of(cls, values: Iterable[float]) -> Spread:
        vals = list(values)
        return cls(statistics.median(vals), min(vals), max(vals), len(vals))

    def fmt(self, digits: int = 2, unit: str = "") -> str:
        """``"1.23x (1.10-1.31)"``: median, then min-max over the rounds (``"to"`` between
        them when the min is negative: ``"(-3.1 to 4.0)"``)."""
        f = f"{{:,.{digits}f}}"
        sep = " to " if self.lo < 0 else "-"
        return f"{f.format(self.median)}{unit} ({f.format(self.lo)}{sep}{f.format(self.hi)})"

    def to_json(self) -> dict[str, float]:
        return {"median": self.median, "min": self.lo, "max": self.hi, "n": self.n}


def cell(x: dict, digits: int = 2, unit: str = "", scale: float = 1.0) -> str:
    """A :class:`Spread` in its JSON form (``to_json``), formatted for a table; ``scale``
    converts the unit (1000: seconds shown as ms)."""
    return Spread(*(scale * x[k] for k in ("median", "min", "max")), x["n"]).fmt(digits, unit)


def load_range(load: list) -> str:
    """``"1.20-3.40"``: the lowest and highest load average of rounds' (before, after)."""
    vals = [v for pair in load for v in pair]
    return f"{min(vals):.2f}-{max(vals):.2f}"


@dataclass
class Rounds:
    """What :func:`run` measured: per variant one sample per round, and each round's load."""

    samples: dict[str, list[Sample]] = field(default_factory=dict)
    order: list[list[str]] = field(default_factory=list)
    load: list[tuple[float, float]] = field(default_factory=list)

    def rates(self, name: str, count: str) -> list[float]:
        return [s[count] / s["seconds"] for s in self.samples[name]]

    def rate(self, name: str, count: str) -> Spread:
        """``count`` per second of ``name``, over the rounds."""
        return Spread.of(self.rates(name, count))

    def ratio(self, name: str, base: str, count: str) -> Spread:
        """How many times ``base``'s rate of ``count`` ``name`` reaches, round by round."""
        return Spread.of(a / b for a, b in zip(self.rates(name, count), self.rates(base, count)))

    def per(self, name: str, value: str, count: str) -> Spread:
        """``value`` per unit of ``count`` (e.g. main-process CPU seconds per batch)."""
        return Spread.of(self.pers(name, value, count))

    def pers(self, name: str, value: str, count: str) -> list[float]:
        """``value`` per unit of ``count`` of ``name``, one value per round."""
        return [s[value] / s[count] for s in self.samples[name]]

    def diff_per(self, name: str, base: str, value: str, count: str) -> Spread:
        """``value`` per ``count`` of ``name`` minus that of ``base``, round by round (e.g.
        the CPU seconds a feature adds per batch)."""
        return Spread.of(
            a - b for a, b in zip(self.pers(name, value, count), self.pers(base, value, count))
        )

    def cost_ratio(self, name: str, base: str, value: str, count: str) -> Spread:
        """``value`` per ``count`` of ``name`` over that of ``base``, round by round (e.g.
        how many times the bare loop's CPU per batch a variant spends)."""
        return Spread.of(
            a / b for a, b in zip(self.pers(name, value, count), self.pers(base, value, count))
        )

    def mean(self, name: str, value: str, count: str) -> float:
        """``value`` over ``count`` summed across rounds (e.g. the padding fraction)."""
        s = self.samples[name]
        return sum(x[value] for x in s) / sum(x[count] for x in s)

    def load_spread(self) -> Spread:
        return Spread.of(v for pair in self.load for v in pair)

    def to_json(self) -> dict[str, Any]:
        return {"samples": self.samples, "order": self.order, "load": self.load}


def run(
    variants: dict[str, Callable[[], Sample]],
    rounds: int = MIN_ROUNDS,
    loadavg: Callable[[], tuple[float, float, float]] = os.getloadavg,
) -> Rounds:
    """Measure every variant once per round, the order rotating round by round."""
    out = Rounds(samples={k: [] for k in variants})
    for order in orders(list(variants), rounds):
        before = loadavg()[0]
        for name in order:
            out.samples[name].append(variants[name]())
        out.order.append(order)
        out.load.append((before, loadavg()[0]))
    return out


def window(
    build: Callable[[], Iterable],
    size: int,
    warmup: int,
    count: Callable[[list], dict[str, float]] | None = None,
    keep: Callable[[Any], Any] = lambda x: x,
) -> Callable[[], Sample]:
    """A variant: build the iterable, skip ``warmup`` items (start-up, worker spawn), time
    ``size`` items (wall and this process's CPU).

    Counts (e.g. real tokens) come from a separate, untimed pass over the same items,
    made once, before the first timed pass: ``keep(item)`` is stored per item there and
    ``count`` turns the list into counts. The pipelines measured here are deterministic,
    so the counted items are the timed ones. Why not count in the timed pass: keeping
    each item until the clock stops (hundreds of MB over a window of packed batches)
    makes every item land in freshly faulted memory, a cost of the measurement that a
    trainer, which drops each batch after its step, does not pay -- and which narrows
    every ratio. The timed pass drops each item as the next arrives."""
    counted: dict[str, float] = {}

    def timed_pass(keep_items: bool) -> tuple[float, float, list]:
        obj = build()
        it = iter(obj)
        for _ in itertools.islice(it, warmup):
            pass
        kept, n = [], 0
        t0, c0 = time.perf_counter(), time.process_time()
        if keep_items:
            for item in itertools.islice(it, size):
                kept.append(keep(item))
            n = len(kept)
        else:
            for n, _ in enumerate(itertools.islice(it, size), 1):
                pass
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        close = getattr(obj, "close", None) or getattr(it, "close", None)
        if close is not None:
            close()
        if n < size:
            raise RuntimeError(f"the iterable ended after {n} of {size} timed items")
        return wall, cpu, kept

    def sample() -> Sample:
        if count is not None and not counted:
            counted.update(count(timed_pass(keep_items=True)[2]))
        wall, cpu, _ = timed_pass(keep_items=False)
        return {"seconds": wall, "cpu_seconds": cpu, "items": float(size)} | counted

    return sample


def method(n: int, load: list, window: str, quick: bool = False) -> str:
    """The method sentence of a table's note: ``n`` rounds, ``window`` (what was timed per
    variant and round, after what warm-up) and the range of the rounds' ``load``."""
    out = (
        f"{n} interleaved rounds (order rotated per round), each ratio taken within a round; "
        f"median (min-max) over the rounds. {window} Load average (1 min) over the rounds: "
        f"{load_range(load)}."
    )
    if quick:  # a smoke run's windows are shorter than the pipelines' bursts
        out += " A quick run: windows too short to be rates, the figures only show it runs."
    return out
