"""The ``zephon`` subcommands, built on click; ``HELP`` is what ``zephon --help`` prints
above the list of commands (click lists them, each with its ``short_help``)."""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any

import click

from ..checkpoint.restore import allowed_changes
from ..errors import ConfigError, ZephonError
from .checkpoints import read_state, summary
from .compare import compare_states, remix_lines

LEGEND = """\
Legend:
  Stage[i]          operators that run together; records flow from stage to stage
  place=local       runs in this process (DataLoader workers each run a copy)
  runner=threads    stateless order-keeping operators with parallelism > 1, on a
                    thread pool, a chunk's records (a microbatch) at a time
  runner=processes  the same on worker processes (map(..., runner="processes"))
  runner=inline     everything else, record by record, in the lane's own thread
  cap=N             how many microbatches the stage works on at once
  mode=             microbatches (parallel stages) or stream_items (inline)
  op@pN             operator name and its parallelism
  -[in_q=N]->       microbatches queued ahead into a parallel stage
  --[stage_out=N]-->  outputs buffered between two stages
  *_replay_filter   inserted before batch: after a restore it drops what was
                    already delivered (docs/design.md section 6)
  final_prefetch=N  outputs the background pump keeps ready (0: no pump thread)"""


HELP = """\
Zephon's command line: look into checkpoints, and check your own pipeline.

\b
CHECKPOINT: a Zephon state file, a Lightning .ckpt or an HF checkpoint-N/
directory, read with the checks a restore makes.
FACTORY: MODULE:FUNCTION, a module (importable, or a path to a .py file) and
a zero-argument function in it that returns a Pipeline, e.g.
my_train:build_pipeline.

Run "zephon COMMAND --help" for a command's arguments and options."""


def _load_factory(spec: str):
    """``module:function`` or ``path/to/file.py:function``."""
    if ":" not in spec:
        raise click.BadParameter(f"{spec!r}: use module:function (e.g. my_train:build_pipeline)")
    mod_name, _, fn_name = spec.rpartition(":")
    try:
        if mod_name.endswith(".py") or "/" in mod_name:
            path = Path(mod_name).resolve()
            sys.path.insert(0, str(path.parent))
            loaded = importlib.util.spec_from_file_location(path.stem, path)
            module = importlib.util.module_from_spec(loaded)
            loaded.loader.exec_module(module)
        else:
            sys.path.insert(0, str(Path.cwd()))
            module = importlib.import_module(mod_name)
    except Exception as e:  # noqa: BLE001 - reported as a usage error
        raise click.BadParameter(f"cannot import {mod_name!r}: {type(e).__name__}: {e}") from e
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise click.BadParameter(f"{mod_name!r} has no function {fn_name!r}")
    return fn


def _build(spec: str):
    from ..engine.pipeline import Pipeline

    try:
        pipe = _load_factory(spec)()
    except ZephonError as e:  # the factory built an invalid pipeline: say so, typed
        raise click.ClickException(f"{spec}(): {type(e).__name__}: {e}") from None
    if not isinstance(pipe, Pipeline):
        raise click.BadParameter(f"{spec}() returned {type(pipe).__name__}, not a Pipeline")
    return pipe


@click.group(help=HELP)
def cli() -> None:
    pass


TRUST_PICKLE = click.option(
    "--trust-pickle",
    is_flag=True,
    help="Load a torch file with full pickle (runs code it names): only for files you trust. "
    "Without it, .ckpt files are read with torch.load(weights_only=True) and plain data types.",
)


def _read(path: str, trust_pickle: bool):
    try:
        return read_state(path, trust_pickle)
    except ZephonError as e:
        raise click.ClickException(f"{path}: {type(e).__name__}: {e}") from None


@cli.command(short_help="Show a checkpoint: position, lanes, datasets, configuration.")
@click.argument("path", type=click.Path(exists=True))
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@TRUST_PICKLE
def inspect(path: str, as_json: bool, trust_pickle: bool) -> None:
    """A state file, a Lightning .ckpt or an HF checkpoint-N/ directory: position, lanes,
    per-dataset documents/epochs/tokens, inflight chunks, configuration. A state a restore
    would refuse for itself (malformed, out of range) is an error (exit code 1)."""
    state, parsed, kind = _read(path, trust_pickle)
    info = summary(state, parsed)
    info["file"] = {"path": str(path), "kind": kind}
    if as_json:
        click.echo(json.dumps(info, indent=2, default=str))
        return
    src = info["config"]["source"]
    click.echo(f"{kind}: {path}")
    click.echo(f"  format {info['format']} v{info['version']}, fingerprint {info['fingerprint']}")
    click.echo(f"  written by {info['written_by']}")
    click.echo(
        f"  global position {info['position']}; {len(info['lanes'])} lanes, "
        f"{info['inflight_chunks']} inflight chunks to replay"
    )
    for start, end in info["skipped"]:
        click.echo(f"  skipped positions {start}..{end - 1} ({end - start} outputs, skip_batches)")
    for name, rows in info["excluded"].items():
        shown = ", ".join(map(str, rows[:10])) + (", ..." if len(rows) > 10 else "")
        click.echo(f"  excluded from {name}: {len(rows)} rows ({shown}) in chunks read since")
    unit = src.get("weights_unit", "documents")
    click.echo(f"  datasets (weights {_shares(src.get('weights'))} in {unit}):")
    for name, c in info["components"].items():
        epochs = "?" if c["epochs"] is None else f"{c['epochs']:.3f}"
        click.echo(
            f"    {name:<16} documents {c['documents']:>10}  epochs {epochs:>8}  "
            f"tokens delivered {c['tokens']:>12}  ({100 * c['token_share']:.1f} %)"
        )
    click.echo("  lanes:")
    for lane in info["lanes"]:
        click.echo(
            f"    lane {lane['lane']:>3}: delivered {lane['delivered']:>8}, cursor "
            f"{lane['cursor']}, inflight chunks {lane['chunk_range'][0]}.."
            f"{lane['chunk_range'][1] - 1} ({lane['inflight_chunks']})"
            + (", ended" if lane["exhausted"] else "")
        )
    cfg = info["config"]
    click.echo(
        f"  pipeline: canonical_replicas={cfg['canonical_replicas']} "
        f"flush_every_k_chunks={cfg['flush_every_k_chunks']} seed={cfg['seed']}; "
        f"operators {', '.join(cfg['ops'])}"
    )


def _allowed(value: str) -> list[str]:
    try:
        names = allowed_changes({n.strip() for n in value.split(",") if n.strip()}, "--allow")
    except ConfigError as e:
        raise click.BadParameter(f"{e}, comma-separated", param_hint="--allow-changes") from e
    return sorted(names)


@cli.command(short_help="Whether B (a checkpoint or a FACTORY) accepts checkpoint A.")
@click.argument("a")
@click.argument("b")
@click.option(
    "--allow-changes",
    default="",
    help="Comma-separated changes the restore may accept, as load_state_dict(allow_changes=): "
    "weights, components (re-mix), data, functions.",
)
@TRUST_PICKLE
def diff(a: str, b: str, allow_changes: str, trust_pickle: bool) -> None:
    """Whether B accepts checkpoint A, and why not: B is another checkpoint, or a pipeline
    factory (module:function), which runs the restore's own admission. Exit code 1 when
    B would refuse A."""
    allowed = _allowed(allow_changes)
    raw_a, sa, _ = _read(a, trust_pickle)
    if Path(b).exists():
        _, sb, _ = _read(b, trust_pickle)
        ok, lines = compare_states(sa, sb, allowed)
        click.echo("\n".join(lines))
        if not ok:
            raise SystemExit(1)
        return
    pipe = _build(b).description()
    try:
        pipe.load_state_dict(raw_a, allow_changes=allowed, origin=a)
        plan = pipe.compile()
    except ZephonError as e:
        click.echo(f"{type(e).__name__}: {e}")
        raise SystemExit(1) from None
    if not allowed:
        click.echo(f"{b}() restores {a} exactly")
        return
    click.echo(f"{b}() accepts {a} with allow_changes={allowed}")
    for line in remix_lines(sa, plan.config, plan.source, plan.content, allowed):
        click.echo(f"  {line}")


TRACE_HELP = """What the model saw at a step: restore CHECKPOINT into FACTORY's pipeline
with provenance on, replay to the step without a model, and print every row of its
batches -- datasets, dataset rows, epochs, token ranges, a text snippet of each
document (when its dataset row has text) and the tokens per dataset.

\b
CHECKPOINT: a state file, a Lightning .ckpt or an HF checkpoint-N/ at or
before the step; or a directory of them (an HF output_dir, a Lightning
checkpoint directory): the nearest at or before the step is used.

\b
Steps. Without --accum/--dp/--global-batch, --step is a global output position
(one output = one batch of the pipeline = one micro-batch of one rank).
With them, --step N is optimizer step N, counted as the trainer counts
global_step: the step it runs while global_step == N (Lightning's
self.global_step in training_step, and the step its loggers record; HF's
logs record that step's loss as step N+1), so checkpoint-N (HF) or a .ckpt
with global_step N restores to its start.
Step N is the K = accum x dp x m outputs starting at position
P + (N - S) x K, where S and P are the checkpoint's step and position
(a state file: S = P = 0) and m = global-batch / (batch_size x accum x dp)
(1 without --global-batch). In a step, micro-step a of rank r is the m
outputs from P + (N - S) x K + (a x dp + r) x m.

--to M traces steps N..M (inclusive). A progress bar shows the replay on a
terminal. --json prints a document (schema 1): checkpoint {path, kind, step,
position}, datasets, mapping {trainer_steps, accum, dp,
outputs_per_micro_batch, outputs_per_step, anchor {step, position}},
steps_traced [N, M], replayed, seconds, steps [{step, positions [lo, hi),
skipped [[lo, hi)...], tokens {dataset: n}, outputs [{position, micro_step,
rank, tokens, rows [{row, segments [{offset, dataset, dataset_name,
dataset_row, epoch, token_start, token_end, tokens, snippet}]}]}]}], skipped
[[lo, hi)...] (every recorded skip meeting the traced positions, between
steps too), tokens.
Exit code 1 when the checkpoint is after the step or the pipeline refuses it."""


@cli.command(
    short_help="What the model saw at a step: rows, documents, token ranges.", help=TRACE_HELP
)
@click.argument("checkpoint", type=click.Path(exists=True))
@click.argument("factory")
@click.option("--step", "step", type=click.IntRange(min=0), required=True, help="The step.")
@click.option("--to", "to", type=click.IntRange(min=0), default=None, help="The last step.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON document.")
@click.option(
    "--global-batch", type=click.IntRange(min=1), default=None, help="Rows per optimizer step."
)
@click.option(
    "--accum", type=click.IntRange(min=1), default=None, help="Gradient accumulation steps."
)
@click.option("--dp", type=click.IntRange(min=1), default=None, help="Data-parallel ranks.")
@click.option(
    "--workers",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Replay behind DataLoader workers (the same outputs, faster when tokenizing dominates).",
)
@TRUST_PICKLE
def trace(
    checkpoint: str,
    factory: str,
    step: int,
    to: int | None,
    as_json: bool,
    global_batch: int | None,
    accum: int | None,
    dp: int | None,
    workers: int,
    trust_pickle: bool,
) -> None:
    from . import trace as tracing
    from .trace_steps import layout

    pipe = _build(factory)
    try:
        lay = layout(tracing.batch_size(pipe), global_batch, accum, dp)
        loc = tracing.choose(checkpoint, lay, step, trust_pickle)
        last = step if to is None else to
        doc = tracing.trace(loc, pipe.description, lay, step, last, workers=workers)
    except ZephonError as e:
        raise click.ClickException(f"{type(e).__name__}: {e}") from None
    doc["factory"] = factory
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    for line in trace_lines(doc):
        click.echo(line)


def trace_lines(doc: dict[str, Any]) -> list[str]:
    """The text ``zephon trace`` prints of a trace document."""
    ck, m = doc["checkpoint"], doc["mapping"]
    at = f"step {ck['step']}, " if ck["step"] is not None else ""
    lines = [
        f"{ck['kind']} {ck['path']} ({at}position {ck['position']}), factory {doc['factory']}",
        (
            f"steps are optimizer steps: {m['outputs_per_step']} outputs each (accum "
            f"{m['accum']} x dp {m['dp']} x {m['outputs_per_micro_batch']} per micro-batch), "
            f"step {m['anchor']['step']} at position {m['anchor']['position']}"
            + (" (a state file records no step: the run's start)" if ck["step"] is None else "")
            if m["trainer_steps"]
            else "steps are global output positions"
        ),
        f"replayed {doc['replayed']} outputs in {doc['seconds']:.2f} s",
    ]
    end = None  # the position after the previous step's
    for s in doc["steps"]:
        lo, hi = s["positions"]
        if end is not None and lo > end:  # steps are consecutive: the gap was skipped
            lines.append(
                f"positions {end}..{lo - 1}: skipped (handed to no trainer; step "
                f"{s['step']} is the next handed out)"
            )
        end = hi
        lines.append(f"step {s['step']} (positions {lo}..{hi - 1}): {_token_line(s['tokens'])}")
        for lo, hi in s["skipped"]:
            lines.append(f"  positions {lo}..{hi - 1}: skipped (handed to no trainer)")
        for out in s["outputs"]:
            lines.append(
                f"  micro-step {out['micro_step']} rank {out['rank']} position "
                f"{out['position']}: {_token_line(out['tokens'])}"
            )
            for row in out["rows"]:
                for i, seg in enumerate(row["segments"]):
                    head = f"    row {row['row']:>3}" if i == 0 else " " * 11
                    snippet = f"  {seg['snippet']!r}" if seg["snippet"] is not None else ""
                    lines.append(
                        f"{head} @{seg['offset']:<5} {seg['dataset_name']}[{seg['dataset_row']}] "
                        f"epoch {seg['epoch']} tokens {seg['token_start']}..{seg['token_end']}"
                        f"{snippet}"
                    )
    lines.append(f"total: {_token_line(doc['tokens'])}")
    return lines


def _token_line(tokens: dict[str, int]) -> str:
    return "tokens " + ", ".join(f"{name} {n}" for name, n in tokens.items())


@cli.command(short_help="Show the plan of a FACTORY's pipeline: stages, runners, queues.")
@click.argument("factory")
def explain(factory: str) -> None:
    """The plan of FACTORY's pipeline: stages, runners, queues; with a legend."""
    click.echo(_build(factory).explain())
    click.echo("\n" + LEGEND)


@cli.command(short_help="Cut, restore and compare a FACTORY's stream: is resume exact?")
@click.argument("factory")
@click.option("--cuts", default="1,17,100", show_default=True, help="Outputs before each cut.")
@click.option("--total", type=int, default=None, help="Outputs compared per run.")
@click.option("--workers", type=int, default=0, show_default=True, help="DataLoader workers.")
def verify(factory: str, cuts: str, total: int | None, workers: int) -> None:
    """Cut FACTORY's stream at each cut, restore a freshly built pipeline and compare every
    output with an uninterrupted run. Exit code 1 on the first difference."""
    from ..testing import ResumeMismatch, assert_resume_equivalent

    points = [int(c) for c in cuts.split(",") if c.strip()]
    build = _load_factory(factory)
    t0 = time.perf_counter()
    try:
        report = assert_resume_equivalent(build, points, total, num_workers=workers)
    except (ResumeMismatch, ZephonError) as e:
        click.echo(f"NOT exact: {type(e).__name__}: {e}")
        raise SystemExit(1) from None
    click.echo(
        f"exact: {report.total} outputs compared at cuts {report.cuts} "
        f"(chunks replayed {report.chunks_replayed}, checkpoint bytes "
        f"{report.checkpoint_bytes}) in {time.perf_counter() - t0:.1f}s"
    )


@cli.command(short_help="Measure a FACTORY's batches/s and tokens/s.")
@click.argument("factory")
@click.option("--batches", type=int, default=200, show_default=True)
@click.option("--workers", type=int, default=0, show_default=True, help="DataLoader workers.")
def bench(factory: str, batches: int, workers: int) -> None:
    """Batches/s and tokens/s of FACTORY's pipeline (in process, or through a DataLoader)."""
    from tqdm import tqdm

    pipe = _build(factory)
    handle: Any = pipe.dataloader(num_workers=workers) if workers else pipe.iterate()
    it = iter(handle)
    tokens = served = 0
    t0 = time.perf_counter()
    first = None
    try:
        for _ in tqdm(range(batches), desc="batches", unit="batch", file=sys.stderr):
            out = next(it)
            if first is None:
                first = time.perf_counter() - t0
            tokens += _tokens(out)
            served += 1  # a finite stream may end before `batches`
    except StopIteration:
        pass
    finally:
        handle.close()
    dt = time.perf_counter() - t0
    click.echo(
        f"{served / dt:.1f} batches/s, {tokens / dt:,.0f} tokens/s "
        f"(first batch after {1000 * (first or 0):.0f} ms, {workers} workers)"
    )


def _tokens(out: Any) -> int:
    if isinstance(out, dict):
        labels = out.get("labels")
        if labels is not None and hasattr(labels, "ne"):
            return int(labels.ne(-100).sum())
        ids = out.get("input_ids")
        if ids is not None and hasattr(ids, "numel"):
            return int(ids.numel())
    return 0


@cli.command(short_help="Convert JSONL(.zst/.gz) shards to Parquet shards.")
@click.argument("inputs", nargs=-1, required=True)
@click.option("--out", "output", required=True, help="Output directory or URL prefix.")
@click.option("--row-group-rows", type=int, default=1024, show_default=True)
@click.option(
    "--storage-options", default="{}", help="fsspec storage options as JSON (s3 endpoint, ...)."
)
def convert(
    inputs: tuple[str, ...], output: str, row_group_rows: int, storage_options: str
) -> None:
    """Convert JSONL shards (INPUTS: files or globs, local or URLs; .zst/.gz by suffix)
    into one Parquet shard each under OUT, a row group at a time. Progress goes to
    stderr: a bar on a terminal (with the rows of the current shard), one line per
    converted shard otherwise."""
    from ..sources.convert import jsonl_to_parquet

    try:
        options = json.loads(storage_options)
    except json.JSONDecodeError as e:
        raise click.BadParameter(f"--storage-options is not JSON: {e}") from e
    try:
        written = jsonl_to_parquet(list(inputs), output, row_group_rows, options, progress=True)
    except ZephonError as e:
        raise click.ClickException(str(e)) from e
    click.echo(f"wrote {len(written)} Parquet shard(s) under {output}")


def _shares(weights: Any) -> str:
    """The configuration's weights (reduced to integers for the fingerprint, e.g.
    ``[7, 3]``) as the shares they stand for: ``0.7, 0.3``."""
    if not isinstance(weights, list) or not weights or not sum(weights):
        return repr(weights)
    total = sum(weights)
    return ", ".join(f"{w / total:.6g}" for w in weights)
