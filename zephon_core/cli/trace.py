"""``zephon trace``: what the model saw at a step, rebuilt from a checkpoint by replay.

The stream is a pure function of (configuration, data, position), so the batches of
any step after a checkpoint are the ones the pipeline produces when restored there and
run forward -- no model, no trainer. :func:`trace` restores the checkpoint into the
factory's pipeline with provenance on (``pipe.with_provenance()``: no part of the
fingerprint, so any checkpoint of the run admits it), replays to the requested steps
and describes every row of their outputs: the document pieces (dataset, dataset row,
epoch, token range, offset in the row), a text snippet of each document when its
dataset row has text, and the tokens per dataset. Steps map to positions as
``trace_steps.py`` says; :func:`choose` picks the nearest checkpoint at or before the
step in a directory of them.

The document :func:`trace` returns is what ``--json`` prints (:data:`SCHEMA`).
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..checkpoint.trainer_files import HF_STATE_FILE
from ..errors import ConfigError
from ..ops.batch import BatchOp
from ..ops.batch_provenance import COLUMNS
from ..progress import progress_bar
from ..sources.base import as_source
from .checkpoints import hf_step, read_with_step
from .trace_steps import MicroBatch, StepLayout, skipped_ranges, step_outputs

__all__ = ["SCHEMA", "Located", "choose", "trace"]

#: the version of the ``--json`` document
SCHEMA = 1
#: characters of a document's text shown
SNIPPET_CHARS = 72


@dataclass
class Located:
    """A checkpoint read for tracing: its state, kind, trainer step (None: a state file)
    and global position."""

    path: str
    state: dict[str, Any]
    kind: str
    step: int | None

    @property
    def position(self) -> int:
        return int(self.state.get("position", 0))

    def anchor(self) -> tuple[int, int]:
        """(step, position) the step numbers count from: the checkpoint's own step and
        position, or step 0 at position 0 for a state file."""
        return (self.step, self.position) if self.step is not None else (0, 0)


def _first_position(
    loc: Located, lay: StepLayout, step: int, skipped: Sequence[tuple[int, int]]
) -> int | None:
    """The first position of ``step`` counted from ``loc``, None if ``loc`` is after it."""
    s0, _ = loc.anchor()
    if step < s0:
        return None
    first = next(step_outputs(lay, loc.anchor(), step, step, skipped)).position
    return first if first >= loc.position else None


def _candidates(directory: Path) -> list[Path]:
    """The checkpoints in a directory: HF ``checkpoint-N/`` holding a Zephon state, and
    Lightning ``.ckpt`` files."""
    found = [p for p in directory.iterdir() if p.is_dir() and (p / HF_STATE_FILE).exists()]
    found += [p for p in directory.iterdir() if p.is_file() and p.suffix == ".ckpt"]
    return sorted(found)


def _step_hint(path: Path) -> int | None:
    """The step a checkpoint's name tells: ``checkpoint-N/`` (its trainer_state.json),
    a Lightning ``...step=N....ckpt``; None otherwise (``last.ckpt``)."""
    if path.is_dir():
        return hf_step(path)
    found = re.search(r"(?:^|[-_])step=(\d+)", path.stem)
    return int(found.group(1)) if found else None


def choose(path: str, lay: StepLayout, step: int, trust_pickle: bool) -> Located:
    """The checkpoint at ``path`` -- or, for a directory of checkpoints (an HF
    ``output_dir``, a Lightning checkpoint directory), the nearest one at or before
    ``step``.

    Raises:
        ConfigError: the checkpoint is after ``step`` (pass an earlier one), or the
            directory holds none at or before it.
        CorruptCheckpoint / UntrustedCheckpoint: as ``zephon inspect``.
    """
    p = Path(path)
    if not p.is_dir() or (p / HF_STATE_FILE).exists():
        loc = Located(str(p), *read_with_step(p, trust_pickle))
        if _first_position(loc, lay, step, skipped_ranges(loc.state)) is None:
            where = f"step {loc.step}, " if loc.step is not None else ""
            raise ConfigError(
                f"{path} was saved at {where}position {loc.position}, after step {step}: "
                "a trace replays forward from a checkpoint, so pass an earlier checkpoint "
                "(or the directory holding them: the nearest at or before the step is used)"
            )
        return loc
    paths = _candidates(p)
    # Read as few as possible (a .ckpt holds the model; a per-rank state many files):
    # the step a name tells (checkpoint-N/, Lightning's "step=N"), latest first, and
    # every checkpoint whose name tells none.
    hinted = sorted(
        ((h, c) for c in paths if (h := _step_hint(c)) is not None and h <= step), reverse=True
    )
    best: Located | None = None
    for _, c in hinted:
        loc = Located(str(c), *read_with_step(c, trust_pickle))
        if _first_position(loc, lay, step, skipped_ranges(loc.state)) is not None:
            best = loc
            break
    for c in (c for c in paths if _step_hint(c) is None):
        loc = Located(str(c), *read_with_step(c, trust_pickle))
        if _first_position(loc, lay, step, skipped_ranges(loc.state)) is not None:
            if best is None or loc.position > best.position:
                best = loc
    if best is None:
        raise ConfigError(
            f"{path} holds no checkpoint at or before step {step} ({len(paths)} found: "
            "HF checkpoint-N/ directories and .ckpt files): pass an earlier checkpoint"
        )
    return best


def batch_size(pipe: Any) -> int:
    """Rows per output of the pipeline (its ``batch``)."""
    ops = [op for op in pipe.operators if isinstance(op, BatchOp)]
    if not ops:
        raise ConfigError("the pipeline has no batch(): a trace describes the rows of batches")
    return int(ops[0].batch_size)


def _text(row: Any) -> str | None:
    """The text of a dataset row: a string, or a mapping's ``text`` (else its first
    string value); None when it has none."""
    if isinstance(row, str):
        return row
    if isinstance(row, dict):
        if isinstance(row.get("text"), str):
            return row["text"]
        return next((v for v in row.values() if isinstance(v, str)), None)
    return None


def _snippet(text: str | None) -> str | None:
    if text is None:
        return None
    flat = " ".join(text.split())
    return flat if len(flat) <= SNIPPET_CHARS else flat[: SNIPPET_CHARS - 3] + "..."


def describe_output(out: Any, names: Sequence[str], source: Any) -> dict[str, Any]:
    """Rows, segments (with snippets) and tokens per dataset of one output."""
    table = out["provenance"].tolist()
    wanted: dict[int, list[int]] = {}
    for seg in table:
        wanted.setdefault(seg[2], []).append(seg[3])
    texts: dict[tuple[int, int], str | None] = {}
    for ds, rows in wanted.items():  # one batched read per dataset
        unique = sorted(set(rows))
        for r, value in zip(unique, source.read(ds, unique)):
            texts[(ds, r)] = _snippet(_text(value))
    rows: dict[int, list[dict[str, Any]]] = {}
    tokens = dict.fromkeys(names, 0)
    for seg in table:
        s = dict(zip(COLUMNS, seg))
        n = s["token_end"] - s["token_start"]
        tokens[names[s["dataset"]]] += n
        rows.setdefault(s.pop("row"), []).append(
            {
                **s,
                "dataset_name": names[s["dataset"]],
                "tokens": n,
                "snippet": texts[seg[2], seg[3]],
            }
        )
    return {
        "rows": [{"row": r, "segments": segs} for r, segs in sorted(rows.items())],
        "tokens": tokens,
    }


def trace(
    loc: Located,
    build: Callable[[], Any],
    lay: StepLayout,
    first: int,
    last: int,
    progress: bool | None = None,
    workers: int = 0,
) -> dict[str, Any]:
    """Restore ``loc`` into ``build()``'s pipeline with provenance on, replay, and
    describe the outputs of steps ``first .. last`` (:data:`SCHEMA`). ``workers``:
    replay behind that many DataLoader worker processes (the same outputs; faster when
    the pipeline's own work, e.g. tokenizing, dominates).

    Raises:
        ConfigError: ``last < first``, the stream ends before the steps, or the pipeline
            has no ``batch``.
        IncompatibleCheckpoint / CorruptCheckpoint: the pipeline does not admit the
            checkpoint (the restore's own error).
    """
    if last < first:
        raise ConfigError(f"--to {last} is before --step {first}: give --to >= --step")
    pipe = build().with_provenance()
    names = list(pipe.component_names)
    source = as_source(pipe.source)
    skipped = skipped_ranges(loc.state)
    wanted: list[MicroBatch] = list(step_outputs(lay, loc.anchor(), first, last, skipped))
    by_position = {mb.position: mb for mb in wanted}
    end = max(by_position) + 1
    described: dict[int, dict[str, Any]] = {}
    t0 = time.perf_counter()
    position = loc.position
    # a bar on a terminal; nothing in a pipe (the document is the output)
    show = sys.stderr.isatty() if progress is None else progress
    bar = progress_bar(end - position, "replaying to the step", "batch", show)
    try:
        start: dict[str, Any] = dict(restore=loc.state, origin=loc.path)
        if skipped:  # produce the skipped outputs too: the trace labels them as skipped
            start.update(skip_batches=[], allow_changes={"skip"})
        handle = pipe.dataloader(workers, **start) if workers else pipe.iterate(**start)
        with handle as it:
            for out in it:
                if position in by_position:
                    described[position] = describe_output(out, names, source)
                position += 1
                bar.update(1)
                if position == end:
                    break
    finally:
        bar.close()
    seconds = time.perf_counter() - t0
    if position < end:
        raise ConfigError(
            f"the stream ended at position {position}, before step {last} (position "
            f"{end - 1}): trace a step the run reached"
        )
    return _document(loc, lay, names, first, last, wanted, described, skipped, seconds)


def _document(
    loc: Located,
    lay: StepLayout,
    names: list[str],
    first: int,
    last: int,
    wanted: list[MicroBatch],
    described: dict[int, dict[str, Any]],
    skipped: Sequence[tuple[int, int]],
    seconds: float,
) -> dict[str, Any]:
    steps: list[dict[str, Any]] = []
    total = dict.fromkeys(names, 0)
    for mb in wanted:
        if not steps or steps[-1]["step"] != mb.step:
            steps.append({"step": mb.step, "tokens": dict.fromkeys(names, 0), "outputs": []})
        d = described[mb.position]
        steps[-1]["outputs"].append(
            {"position": mb.position, "micro_step": mb.micro_step, "rank": mb.rank, **d}
        )
        for name, n in d["tokens"].items():
            steps[-1]["tokens"][name] += n
            total[name] += n
    span = (min(mb.position for mb in wanted), max(mb.position for mb in wanted) + 1)
    for s in steps:
        lo, hi = s["outputs"][0]["position"], s["outputs"][-1]["position"] + 1
        s["positions"] = [lo, hi]
        s["skipped"] = [[max(a, lo), min(b, hi)] for a, b in skipped if a < hi and b > lo]
    return {
        "schema": SCHEMA,
        "checkpoint": {
            "path": loc.path,
            "kind": loc.kind,
            "step": loc.step,
            "position": loc.position,
        },
        "datasets": names,
        "mapping": {
            "trainer_steps": lay.trainer,
            "accum": lay.accum,
            "dp": lay.dp,
            "outputs_per_micro_batch": lay.per_micro,
            "outputs_per_step": lay.per_step,
            "anchor": {"step": loc.anchor()[0], "position": loc.anchor()[1]},
        },
        "steps_traced": [first, last],
        "replayed": max(mb.position for mb in wanted) + 1 - loc.position,
        "seconds": round(seconds, 3),
        "steps": steps,
        # every recorded skip that meets the traced positions, also between two steps
        "skipped": [[a, b] for a, b in skipped if a < span[1] and b > span[0]],
        "tokens": total,
    }
