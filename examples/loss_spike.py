"""Loss-spike walkthrough: train, find the spike in the log, trace it, resume skipping it.

The job is the embedded mixture (``embedded.py``: Python's docs as prose, its standard
library as code) plus a small third component, ``scraped``: pages of a docs mirror
scraped from the web, one of which is what the mirror served for a binary file --
random bytes saved as text. Nothing is planted in the loss: that page's tokens are
ones the tokenizer and the model almost never see, so the batches holding its rows
have a higher loss.

1. Train a tiny causal LM with Lightning for ``--steps`` steps, a checkpoint every
   ``--every`` steps, each step's loss and batch fingerprint written to
   ``OUT/original.csv``.
2. Read the log and find the spike: the step whose loss is highest relative to the
   median of the ``WINDOW`` steps before it, after ``--warmup`` steps.
3. ``zephon trace`` the spike's steps (the real command, on the checkpoint directory):
   which datasets, rows and token ranges the model saw there.
4. Resume from the checkpoint at or before the spike with
   ``skip_batches=[the traced positions]`` and ``allow_changes={"skip"}``, train to
   the end (``OUT/resumed.csv``).
5. Plot both loss curves (``OUT/loss_spike.png``) and compare, position for position,
   the batches of both runs after the skipped range.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import statistics
import subprocess
import sys
import warnings
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
from demo_console import at, interruptible, stoppable
from embedded import build_pipeline, train_tokenizer
from lightning_resume import BATCH, SEQ_LEN, StepLines, fit

from zephon_core.testing import corpora

#: the scrape's pages (every other docs topic) and the one that is a binary file
PAGES, JUNK_PAGE, JUNK_BYTES = 24, 13, 4000
#: steps of trailing loss the spike is measured against
WINDOW = 10
#: a step whose loss is this much above its trailing median belongs to the spike
SPIKE_RATIO = 1.04


def scraped_pages() -> list[dict]:
    """The scrape: docs pages with the mirror's header and footer, and one binary file
    (random bytes, read as Latin-1 text) in place of page ``JUNK_PAGE``."""
    pages = []
    for topic in corpora.prose()[::2][:PAGES]:
        name = topic["id"].split(":", 1)[1]
        text = f"{name} | Python docs mirror\nHome > Reference > {name}\n\n{topic['text']}"
        pages.append({"text": text + "\n\nPrivacy | Terms | Contact", "id": f"mirror:{name}"})
    rng = np.random.default_rng(22)
    blob = rng.integers(32, 256, JUNK_BYTES, dtype=np.uint8).tobytes().decode("latin-1")
    pages[JUNK_PAGE] = {"text": blob, "id": pages[JUNK_PAGE]["id"]}
    return pages


def spike_pipeline(tok: str | Path):
    """The embedded pipeline over prose 67 %, code 30 %, scraped 3 % of the tokens."""
    datasets = {"prose": corpora.prose(), "code": corpora.code(), "scraped": scraped_pages()}
    weights = {"prose": 0.67, "code": 0.3, "scraped": 0.03}
    return build_pipeline(Path(tok), SEQ_LEN, BATCH, datasets=datasets, weights=weights)


class LossLog(pl.Callback):
    """Appends ``step,loss,batch`` (the batch's fingerprint) to a CSV after every step:
    the training log a user reads after the fact."""

    def __init__(self, path: Path):
        self.path = path

    def on_train_start(self, trainer, pl_module) -> None:
        if not self.path.exists():
            self.path.write_text("step,loss,batch\n")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step, fp, loss = pl_module.record[-1]
        with self.path.open("a") as fh:
            fh.write(f"{step},{loss!r},{fp}\n")


def read_log(path: Path) -> list[dict]:
    with path.open() as fh:
        return [
            {"step": int(r["step"]), "loss": float(r["loss"]), "batch": r["batch"]}
            for r in csv.DictReader(fh)
        ]


def find_spike(log: list[dict], warmup: int) -> tuple[int, int, int, float]:
    """(peak step, first, last step of the spike, peak ratio).

    The loss falls while the model learns, so the highest raw loss is nearly always an
    early step; a spike is a loss far above the recent ones. Each step after ``warmup``
    is divided by the median of the ``WINDOW`` steps before it; the peak is the highest
    ratio, and the spike spans the neighbouring steps (gaps of up to 4: the pipeline's
    4 lanes take turns) whose ratio is above ``SPIKE_RATIO``.
    """
    loss = [r["loss"] for r in log]
    ratio = {
        s: loss[s] / statistics.median(loss[s - WINDOW : s])
        for s in range(max(warmup, WINDOW), len(loss))
    }
    peak = max(ratio, key=ratio.get)
    first = last = peak
    while any(ratio.get(s, 0) > SPIKE_RATIO for s in range(first - 4, first)):
        first = max(s for s in range(first - 4, first) if ratio.get(s, 0) > SPIKE_RATIO)
    while any(ratio.get(s, 0) > SPIKE_RATIO for s in range(last + 1, last + 5)):
        last = min(s for s in range(last + 1, last + 5) if ratio.get(s, 0) > SPIKE_RATIO)
    return peak, first, last, ratio[peak]


FACTORY = '''"""The factory `zephon trace` builds: the loss-spike example's pipeline."""
import sys

sys.path.insert(0, {examples!r})
from loss_spike import spike_pipeline  # noqa: E402


def pipeline():
    return spike_pipeline({tok!r})
'''


def zephon_trace(ckpts: Path, factory: str, first: int, last: int) -> dict:
    """``zephon trace CKPTS FACTORY --step FIRST --to LAST --accum 1 --json``: Lightning
    steps (``--accum`` makes ``--step`` a trainer step), the nearest checkpoint at or
    before FIRST in the directory."""
    cmd = [sys.executable, "-m", "zephon_core.cli", "trace", str(ckpts), factory]
    cmd += ["--step", str(first), "--to", str(last), "--accum", "1", "--json"]
    print("$ zephon " + " ".join(cmd[3:]))
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"zephon trace failed:\n{done.stdout}{done.stderr}")
    return json.loads(done.stdout)


def show_trace(doc: dict, peak: int) -> None:
    """The command's own text for the peak step (``trace_lines``), and the scraped
    documents in every traced step."""
    from zephon_core.cli.commands import trace_lines

    one = dict(doc, steps=[s for s in doc["steps"] if s["step"] == peak])
    for line in trace_lines(one)[:-1]:
        print("  " + line)
    print()
    for s in doc["steps"]:
        segs = [
            (out["position"], row["row"], seg)
            for out in s["outputs"]
            for row in out["rows"]
            for seg in row["segments"]
            if seg["dataset_name"] == "scraped"
        ]
        docs = sorted({f"scraped[{seg['dataset_row']}]" for _, _, seg in segs})
        print(
            f"  step {s['step']}: {s['tokens'].get('scraped', 0):4d} scraped tokens "
            f"in {len({(p, r) for p, r, _ in segs})} of {BATCH} rows",
            *docs,
        )


def plot(path: Path, original: list, resumed: dict, skip: tuple, peak: int, start: int):
    """Loss by stream position: the batch each step trained on (the original run's step
    is its position), so both curves line up batch for batch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    ax.plot([r["step"] for r in original], [r["loss"] for r in original], label="original")
    ax.plot(
        sorted(resumed),
        [resumed[p]["loss"] for p in sorted(resumed)],
        "--",
        label=f"resumed at step {start}, skipping positions {skip[0]}..{skip[1] - 1}",
    )
    ax.axvspan(skip[0] - 0.5, skip[1] - 0.5, color="red", alpha=0.12, label="skipped batches")
    ax.axvline(peak, color="red", ls=":", lw=1)
    ax.set_xlabel("stream position of the batch (= step of the original run)")
    ax.set_ylabel("loss")
    ax.set_title("A data-caused loss spike, traced and skipped")
    ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=70, help="steps of each run")
    ap.add_argument("--every", type=int, default=10, help="a checkpoint every K steps")
    ap.add_argument("--warmup", type=int, default=15, help="steps the spike search ignores")
    ap.add_argument("--out", default="out/loss_spike", help="logs, checkpoints, the PNG")
    ap.add_argument("--log-every", type=int, default=10, help="a progress line every K steps")
    return ap.parse_args()


def main() -> None:
    with stoppable():
        run(parse())


def run(args: argparse.Namespace) -> None:
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    for old in ("original.csv", "resumed.csv"):
        (out / old).unlink(missing_ok=True)
    print(__doc__.strip().splitlines()[0], "\n")
    tok = out / "tokenizer.json"
    at("training the tokenizer")
    interruptible(train_tokenizer, tok)
    (out / "trace_factory.py").write_text(
        FACTORY.format(examples=str(Path(__file__).resolve().parent), tok=str(tok))
    )

    # 1. train, logging every step's loss
    fit(tok, args.steps, out / "ckpts", every=args.every, keep_all=True,
        pipeline=lambda: spike_pipeline(tok), extra=[LossLog(out / "original.csv")],
        progress=StepLines("original", args.log_every))  # fmt: skip
    original = read_log(out / "original.csv")

    # 2. the spike, from the log alone
    peak, first, last, ratio = find_spike(original, args.warmup)
    print(
        f"\nspike: step {peak}, loss {original[peak]['loss']:.3f} = {ratio:.2f} x the median "
        f"of the {WINDOW} steps before it; steps {first}..{last} are above "
        f"{SPIKE_RATIO:.2f} x theirs\n"
    )

    # 3. what the model saw there
    doc = zephon_trace(out / "ckpts", f"{out / 'trace_factory.py'}:pipeline", first, last)
    (out / "trace.json").write_text(json.dumps(doc, indent=1))
    show_trace(doc, peak)
    ckpt, start = doc["checkpoint"]["path"], doc["checkpoint"]["step"]
    skip = (doc["steps"][0]["positions"][0], doc["steps"][-1]["positions"][1])

    # 4. resume from the checkpoint the trace restored, handing none of those batches out
    print(f"\nresuming {Path(ckpt).name} (step {start}) with skip_batches=[{skip}]")
    fit(tok, args.steps, out / "resumed_ckpts", resume=ckpt, every=args.every,
        pipeline=lambda: spike_pipeline(tok), extra=[LossLog(out / "resumed.csv")],
        data_kwargs={"skip_batches": [skip], "allow_changes": {"skip"}},
        progress=StepLines("resumed", args.log_every))  # fmt: skip
    resumed = read_log(out / "resumed.csv")
    summarize(out, original, resumed, skip, peak, start)


def summarize(out: Path, original: list, resumed: list, skip: tuple, peak: int, start: int):
    # a skip keeps positions: resumed step s >= skip[0] trains on position s + skipped
    n = skip[1] - skip[0]
    by_position = {r["step"] + (n if r["step"] >= skip[0] else 0): r for r in resumed}
    png = out / "loss_spike.png"
    plot(png, original, by_position, skip, peak, start)
    after = [(o, by_position[o["step"]]) for o in original[skip[1] :]]
    same = sum(o["batch"] == r["batch"] for o, r in after)
    spiked = {r["batch"] for r in original[skip[0] : skip[1]]}
    json.dump(
        {"peak": peak, "skip": list(skip), "checkpoint_step": start,
         "after_skip_compared": len(after), "after_skip_same": same},
        (out / "summary.json").open("w"), indent=1,
    )  # fmt: skip
    tail = slice(-10, None)
    print(
        f"\nthe resumed run never received the {n} skipped batches: "
        f"{'true' if not spiked & {r['batch'] for r in resumed} else 'FALSE'}; positions "
        f"{skip[1]}..{len(original) - 1}: {same} of {len(after)} batches identical to the "
        f"original run's\nmean loss of the last 10 steps: original "
        f"{statistics.mean(r['loss'] for r in original[tail]):.3f}, resumed "
        f"{statistics.mean(r['loss'] for r in resumed[tail]):.3f}\nplot: {png}"
    )
    if same != len(after):
        sys.exit(1)


if __name__ == "__main__":
    main()
