"""Run the benchmarks and write ``docs/measurements.md`` (``make bench``).

    python benchmarks/run_all.py                  # every benchmark, the file rewritten
    python benchmarks/run_all.py --quick          # a smoke run: short windows, few rounds
    python benchmarks/run_all.py --only throughput,vs_grain --out /tmp/m.md
    python benchmarks/run_all.py --only padding --update   # one section re-measured

Each module ``benchmarks/bench_<name>.py`` exposes ``main(quick=False) -> dict`` and
``tables(result) -> list[dict]``; a module missing from the checkout, or whose
dependencies are not installed, gets a line saying so. The raw results go to
``--json`` (default: stdout).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import report  # noqa: E402

#: In the file's order: the claims users check first, then the rest; each with the
#: heading it gets (the docs link to these headings' anchors).
MODULES = {
    "throughput": "Throughput with a real tokenizer",
    "vs_grain": "Zephon and Grain",
    "vs_hf_datasets": "Zephon and HF datasets",
    "padding": "Padding",
    "state_cost": "State cost and lanes",
    "parquet": "Parquet in object storage",
    "core": "Core",
    "provenance": "Provenance",
    "mixture": "Token-share accuracy",
    "runners": "Runners for a GIL-bound map",
    "hf": "HF datasets fetch",
    "hf_trainer": "HF Trainer data path",
    "lightning_steps": "Lightning per-step bookkeeping",
    "distributed": "Several processes and ranks",
}


def run_one(name: str, quick: bool) -> tuple[report.Section, object, bool]:
    """The module's section, its raw result and whether it failed."""
    module_name = f"bench_{name}"
    try:
        mod = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        why = (
            f"`benchmarks/{module_name}.py` is not in this checkout"
            if e.name == module_name
            else f"`{e.name}` is not installed (`pip install -e '.[bench]'`)"
        )
        return report.Section(name, "", skipped=why, title=MODULES.get(name, "")), None, False
    summary = (mod.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
    section = report.Section(name, summary, title=MODULES.get(name, ""))
    if not hasattr(mod, "tables"):
        section.skipped = f"`{module_name}` has no `tables()`"
        return section, None, True
    kwargs = {"quick": True} if quick else {}
    if quick and "quick" not in inspect.signature(mod.main).parameters:
        section.skipped = f"`{module_name}.main` has no quick mode"
        return section, None, True
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    try:
        result = mod.main(**kwargs)
        section.tables = mod.tables(result)
    except Exception:  # one benchmark's failure is reported, the others still run
        section.skipped = "it failed:\n\n```\n" + traceback.format_exc(limit=6) + "```"
        return section, None, True
    section.seconds, section.load = time.perf_counter() - t0, (load0, os.getloadavg()[0])
    return section, result, False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short windows, a smoke run")
    ap.add_argument("--only", default="", help=f"comma-separated subset of {', '.join(MODULES)}")
    ap.add_argument("--out", default=str(report.REPO / "docs" / "measurements.md"))
    ap.add_argument("--json", default="-", help="where the raw results go ('-': stdout)")
    ap.add_argument(
        "--update",
        action="store_true",
        help="re-measure only --only's sections and keep the file's others as they are",
    )
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(MODULES)
    unknown = [n for n in names if n not in MODULES]
    if unknown:
        ap.error(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(MODULES)}")
    sections, raw, failed = [], {}, []
    for name in names:
        print(f"== {name}", file=sys.stderr)
        section, result, bad = run_one(name, args.quick)
        sections.append(section)
        raw[name] = result
        if bad:
            failed.append(name)
            print(f"   {section.skipped}", file=sys.stderr)
    command = "python benchmarks/run_all.py" + (" --quick" if args.quick else "")
    if args.only:
        command += f" --only {','.join(names)}" + (" --update" if args.update else "")
    out = Path(args.out)
    kept = report.sections_of(out.read_text()) if args.update and out.exists() else {}
    order = [MODULES[n] for n in MODULES] if args.update else None
    text = report.render(sections, quick=args.quick, command=command, kept=kept, order=order)
    report.write(text, out)
    text = json.dumps(raw, indent=2, default=str)
    if args.json == "-":
        print(text)
    else:
        Path(args.json).write_text(text)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
