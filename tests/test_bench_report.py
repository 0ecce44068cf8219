"""``benchmarks/report.py`` and ``run_all.py`` on a fake benchmark module: the file they
write holds the header (date, commit, machine, load) and every table, and says which
modules were not measured and why."""

from __future__ import annotations

import datetime
import sys
import types

import pytest
from benchmods import load

report = load("report")
run_all = load("run_all")

HOST = {
    "cpu": "Fake CPU 9000",
    "cores": "2",
    "ram": "24.0 GiB",
    "os": "Linux 6",
    "python": "3.11.9",
    "torch": "2.13.0",
}
TABLE = {
    "title": "rates",
    "columns": ["variant", "batches/s", "vs bare"],
    "rows": [["bare | loop", "100", "1.00x"], ["zephon", "95", "0.95x (0.90-0.99)"]],
    "note": "5 rounds, load 1.2-1.5",
}


def _render(sections, quick=False) -> str:
    return report.render(
        sections,
        quick=quick,
        command="python benchmarks/run_all.py",
        when=datetime.datetime(2026, 12, 2, 14, 0, tzinfo=datetime.timezone.utc),
        host=HOST,
        rev="abc123",
        load=(1.5, 1.25, 1.0),
    )


def test_render_writes_header_and_every_table():
    text = _render(
        [
            report.Section("fake", "What it measures.", [TABLE], seconds=12.0, load=(1.0, 2.0)),
            report.Section("absent", "", skipped="`benchmarks/bench_absent.py` is not here"),
        ]
    )
    assert "- written: 2026-12-02 14:00 UTC, commit `abc123`" in text
    assert "Fake CPU 9000, 2 cores, 24.0 GiB RAM" in text
    assert "python 3.11.9, torch 2.13.0" in text
    assert "1.50 / 1.25 / 1.00" in text
    assert "| variant | batches/s | vs bare |" in text
    assert "| bare \\| loop | 100 | 1.00x |" in text  # a pipe in a cell is escaped
    assert "| zephon | 95 | 0.95x (0.90-0.99) |" in text
    assert "5 rounds, load 1.2-1.5" in text
    assert (
        "--only fake`: measured 2026-12-02 14:00 UTC at commit `abc123`, 12 s, load average "
        "1.00 at its start, 2.00 at its end"
    ) in text
    assert "## absent\n\nNot measured: `benchmarks/bench_absent.py` is not here" in text
    assert "quick run" not in text
    assert "quick run" in _render([], quick=True)


def test_update_replaces_the_measured_sections_and_keeps_the_others():
    old = report.sections_of(
        _render(
            [
                report.Section("a", "First.", [TABLE], seconds=1.0, title="A"),
                report.Section("b", "Second, old.", [TABLE], seconds=2.0, title="B"),
            ]
        )
    )
    assert list(old) == ["A", "B"]
    fresh = dict(TABLE, rows=[["zephon", "99", "0.99x"]])
    text = report.render(
        [report.Section("b", "Second, new.", [fresh], seconds=3.0, title="B")],
        quick=True,
        command="python benchmarks/run_all.py --only b --update",
        when=datetime.datetime(2026, 12, 3, 9, 0, tzinfo=datetime.timezone.utc),
        host=HOST,
        rev="def456",
        load=(1.0, 1.0, 1.0),
        kept=old,
        order=["A", "B", "C"],
    )
    assert text.index("## A") < text.index("## B") and "## C" not in text
    assert old["A"].rstrip() in text  # kept whole, with its own date and commit
    assert "First." in text and "Second, old." not in text and "Second, new." in text
    assert "| zephon | 99 | 0.99x |" in text
    assert "measured 2026-12-03 09:00 UTC at commit `def456` (**quick run**" in text
    assert "- **quick run**" not in text  # the header speaks for the whole file only


def test_render_refuses_a_row_of_the_wrong_width():
    bad = dict(TABLE, rows=[["only one"]])
    with pytest.raises(ValueError, match="1 cells for 3 columns"):
        _render([report.Section("fake", "", [bad])])


def test_flat_tables_lists_every_number_of_a_nested_result():
    tables = report.flat_tables(
        {"ratio": 1.23456, "n": 1500, "rates": {"a": 2000.0, "b": [1, 2]}, "rows": [{"x": 1}]}
    )
    assert [t["title"] for t in tables] == ["summary", "rates", "rows"]
    assert tables[0]["rows"] == [["ratio", "1.235"], ["n", "1,500"]]
    assert tables[1]["rows"] == [["a", "2,000"], ["b", "1, 2"]]
    assert tables[2]["rows"] == [["[0].x", "1"]]


@pytest.fixture
def fake_modules(monkeypatch):
    calls = []
    mod = types.ModuleType("bench_fakebench")
    mod.__doc__ = "A fake benchmark.\n\nMore text."

    def main(quick: bool = False) -> dict:
        calls.append(quick)
        return {"rate": 10.0}

    mod.main = main
    mod.tables = lambda result: [dict(TABLE, rows=[["x", str(result["rate"]), "1x"]])]
    broken = types.ModuleType("bench_broken")
    broken.main = lambda quick=False: 1 / 0
    broken.tables = lambda result: []
    monkeypatch.setitem(sys.modules, "bench_fakebench", mod)
    monkeypatch.setitem(sys.modules, "bench_broken", broken)
    return calls


def test_run_one_passes_quick_and_collects_tables(fake_modules):
    section, result, failed = run_all.run_one("fakebench", quick=True)
    assert fake_modules == [True] and result == {"rate": 10.0} and not failed
    assert section.summary == "A fake benchmark."
    assert section.tables[0]["rows"] == [["x", "10.0", "1x"]]


def test_run_one_says_why_a_module_is_missing_or_failed(fake_modules):
    section, result, failed = run_all.run_one("not_in_this_checkout", quick=False)
    assert "bench_not_in_this_checkout.py` is not in this checkout" in section.skipped
    assert result is None and not failed
    section, _, failed = run_all.run_one("broken", quick=False)
    assert failed and "ZeroDivisionError" in section.skipped
