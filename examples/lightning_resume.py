"""Lightning demo: train a tiny causal LM, "crash", resume from the checkpoint, compare.

The model is a 2-layer transformer with dropout 0.1 (random init, nothing downloads) trained with
Lightning on the embedded mixture (Python's own docs as prose, its standard library
as code), tokenized by a BPE trained on the spot, packed to 256 tokens, shuffled and
mixture-corrected by Zephon, served by ``ZephonDataModule`` with 2 DataLoader workers.

Run A trains 2N steps uninterrupted. Run B trains N steps and stops (a graceful stop,
``max_steps=N``); with ``--kill`` run B instead runs in a child process that is killed
with SIGKILL right after step N, mid-run (it kills itself: no cleanup, no final save),
with checkpoints every 20 steps. Run C is a new
Trainer and a new DataModule that resume B's ``last.ckpt`` with ``ckpt_path`` and
continue to 2N. The demo compares, step by step, the fingerprints of the batches
``training_step`` saw in A and in C, the loss curves, and writes a PNG of both loss
curves and of the realized vs target token share of each dataset.

While it runs it prints a line every ``--log-every`` steps; SIGTERM or Ctrl-C stops it
at once with one line naming where (``demo_console.py``).
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import lightning.pytorch as pl
import torch
from demo_console import at, interruptible, step, stoppable
from embedded import build_pipeline, train_tokenizer
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn

from zephon_core.checkpoint import codec
from zephon_integrations.lightning import ZephonDataModule

SEQ_LEN, BATCH, VOCAB = 256, 8, 2048


def fingerprint(batch: dict) -> str:
    h = hashlib.sha256()
    for k in sorted(batch):
        h.update(batch[k].cpu().numpy().tobytes())
    return h.hexdigest()[:12]


class TinyCausalLM(pl.LightningModule):
    """Embeddings + 2 causal transformer layers; packed rows use position_ids."""

    def __init__(
        self,
        vocab: int = VOCAB,
        dim: int = 64,
        layers: int = 2,
        heads: int = 4,
        dropout: float = 0.1,
    ):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(SEQ_LEN, dim)
        # dropout draws from the global RNG: ZephonDataModule restores it on resume
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=dropout, batch_first=True)
        self.body = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, vocab)
        self.record: list[tuple[int, str, float]] = []  # (step, batch fingerprint, loss)

    def forward(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos(pos)
        # attention stays inside each packed document: a document starts where its
        # position_ids restart at 0 (Zephon's packed batches, ops/packed_batch.py)
        doc = (pos == 0).cumsum(dim=1)
        causal = torch.ones(ids.shape[1], ids.shape[1], dtype=torch.bool).tril()
        allowed = (doc[:, :, None] == doc[:, None, :]) & causal
        mask = (~allowed).repeat_interleave(self.body.layers[0].self_attn.num_heads, dim=0)
        return self.head(self.body(x, mask=mask))

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        logits = self(batch["input_ids"], batch["position_ids"])
        labels = batch["labels"][:, 1:]  # -100 on padding and at every document start
        loss = nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100
        )
        self.record.append((self.global_step, fingerprint(batch), float(loss)))
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=3e-3)


class KillAt(pl.Callback):
    """SIGKILLs its own process right after training step ``step``: no cleanup, no final
    save, exactly what an OOM kill or a lost node does to a training process."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if pl_module.record[-1][0] >= self.step:
            os.kill(os.getpid(), signal.SIGKILL)


class StepLines(pl.Callback):
    """A progress line every ``every`` steps of run ``run`` (``demo_console.step``)."""

    def __init__(self, run: str, every: int):
        self.run, self.every = run, every
        self.t0, self.start = 0.0, 0

    def on_train_start(self, trainer, pl_module) -> None:
        self.t0, self.start = time.perf_counter(), trainer.global_step
        at(f"run {self.run}, before step {self.start + 1} of {trainer.max_steps}")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        done = trainer.global_step
        rate = (done - self.start) / max(time.perf_counter() - self.t0, 1e-9)
        loss = pl_module.record[-1][2]
        first = done == self.start + 1
        step(self.run, done, trainer.max_steps, loss, rate, first, self.every)


def fit(
    tok: Path,
    max_steps: int,
    ckpt_dir: Path,
    resume: str | None = None,
    every: int | None = None,
    workers: int = 2,
    extra: list | None = None,
    pipeline=None,
    progress: StepLines | None = None,
    data_kwargs: dict | None = None,
    keep_all: bool = False,
) -> tuple[TinyCausalLM, ZephonDataModule]:
    """Train to ``max_steps`` (resuming ``resume`` if given) on ``pipeline()`` (default:
    the embedded mixture tokenized with ``tok``), printing ``progress`` lines.
    ``data_kwargs`` go to ``ZephonDataModule`` (e.g. ``skip_batches``); ``keep_all``
    keeps every checkpoint, not only the latest."""
    pl.seed_everything(1234, verbose=False)
    model = TinyCausalLM()
    dm = ZephonDataModule(
        pipeline=pipeline or (lambda: build_pipeline(tok, SEQ_LEN, BATCH)),
        num_workers=workers,
        log_every_n_steps=0,
        **(data_kwargs or {}),
    )
    save = ModelCheckpoint(
        dirpath=ckpt_dir,
        every_n_train_steps=every or max_steps,
        save_last=True,
        save_top_k=-1 if keep_all else 1,
    )
    callbacks = [save] + list(extra or [])
    if progress is not None:
        callbacks.insert(0, progress)  # before KillAt: the line of the last step shows
    trainer = pl.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        callbacks=callbacks,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
    )
    trainer.fit(model, datamodule=dm, ckpt_path=resume)
    dm.final_metrics = dm.data_metrics()
    return model, dm


def plot(path: Path, full: list, resumed: list, n: int, metrics: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    ax1.plot([r[0] for r in full], [r[2] for r in full], label="uninterrupted", lw=3, alpha=0.5)
    ax1.plot([r[0] for r in resumed], [r[2] for r in resumed], "--", label="interrupted + resumed")
    ax1.axvline(n, color="grey", ls=":", label=f"crash / resume at step {n}")
    ax1.set_xlabel("step")
    ax1.set_ylabel("loss")
    ax1.set_title("Loss: resumed run retraces the uninterrupted one")
    ax1.legend()
    names = sorted(k.split("/")[-1] for k in metrics if k.startswith("zephon/token_share/"))
    real = [metrics[f"zephon/token_share/{n_}"] for n_ in names]
    target = [metrics[f"zephon/token_share_target/{n_}"] for n_ in names]
    xs = range(len(names))
    ax2.bar([x - 0.2 for x in xs], target, 0.4, label="target (token share)")
    ax2.bar([x + 0.2 for x in xs], real, 0.4, label="realized (token share delivered)")
    ax2.set_xticks(list(xs), names)
    ax2.set_title("Token share per dataset: realized vs target")
    ax2.set_ylim(0, 1)
    ax2.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


KILL_EVERY = 20  # checkpoint interval of the run that gets killed


def killed_run(tok: Path, n: int, ckpt_dir: Path, every: int) -> int:
    """Run B in a child process that is SIGKILLed right after step ``n``; returns the step
    of its last checkpoint."""
    cmd = [sys.executable, __file__, "--child", str(ckpt_dir), "--tok", str(tok)]
    code = subprocess.run(cmd + ["--steps", str(n), "--log-every", str(every)]).returncode
    if code != -signal.SIGKILL:
        raise SystemExit(f"run B should have been killed by SIGKILL, but exited with {code}")
    return int(torch.load(ckpt_dir / "last.ckpt", weights_only=False)["global_step"])


def child(args: argparse.Namespace) -> None:
    """The run that gets killed: checkpoints every KILL_EVERY steps, dies after step N."""
    fit(
        Path(args.tok),
        2 * args.steps,
        Path(args.child),
        every=KILL_EVERY,
        extra=[KillAt(args.steps)],
        progress=StepLines("B", args.log_every),
    )


def main() -> None:
    with stoppable():
        run(parse())


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=150, help="N: crash at N, resume to 2N")
    ap.add_argument("--out", default="out", help="where the PNG goes")
    ap.add_argument("--kill", action="store_true", help="SIGKILL run B mid-run at step N")
    ap.add_argument("--log-every", type=int, default=10, help="a progress line every K steps")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--tok", help=argparse.SUPPRESS)
    return ap.parse_args()


def run(args: argparse.Namespace) -> None:
    if args.child:
        warnings.filterwarnings("ignore")
        logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
        return child(args)
    n, every = args.steps, args.log_every
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    print(__doc__.strip().splitlines()[0], "\n")
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        tok = d / "tokenizer.json"
        at("training the tokenizer")
        interruptible(train_tokenizer, tok)
        at("compiling the pipeline (it measures each document's tokens)")
        print(build_pipeline(tok, SEQ_LEN, BATCH).explain(), "\n")
        t0 = time.perf_counter()
        full_model, full_dm = fit(tok, 2 * n, d / "A", progress=StepLines("A", every))
        print(f"run A: {2 * n} steps uninterrupted in {time.perf_counter() - t0:.0f}s")
        if args.kill:
            start = killed_run(tok, n, d / "B", args.log_every)
            how = f"killed with SIGKILL after step {n}, last checkpoint at step {start}"
        else:
            fit(tok, n, d / "B", progress=StepLines("B", every))
            start, how = n, f"stopped at step {n} (max_steps)"
        ckpt = d / "B" / "last.ckpt"
        state = torch.load(ckpt, weights_only=False)["zephon"]["state"]
        size = len(codec.encode(state))
        inflight = sum(len(lane["chunks"]) for lane in state["lanes"])
        print(
            f"run B: {how}; its checkpoint holds a {size}-byte Zephon state "
            f"({len(state['lanes'])} lanes, {inflight} inflight chunks to replay)"
        )
        # Lightning's own lines are silenced above; run C shows its restore lines
        # ("Restoring states ..." and Zephon's "zephon: restored from ...")
        logging.getLogger("lightning.pytorch").setLevel(logging.INFO)
        resumed_model, _ = fit(
            tok, 2 * n, d / "C", resume=str(ckpt), progress=StepLines("C", every)
        )
        logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
        print(
            f"run C: new Trainer + new ZephonDataModule, ckpt_path=last.ckpt, steps "
            f"{start}..{2 * n - 1}\n"
        )
    full, resumed = full_model.record, resumed_model.record
    n = start
    tail = full[n:]
    # the same batches and, with dropout on, the same losses bit for bit
    same = [a[1] == b[1] and a[2] == b[2] for a, b in zip(tail, resumed)]
    for (s, fa, la), (_, fb, lb) in list(zip(tail, resumed))[:3] + list(zip(tail, resumed))[-2:]:
        print(
            f"  step {s:3d}: batch {fa} {'==' if fa == fb else '!='} {fb}   "
            f"loss {la:.4f} vs {lb:.4f}"
        )
    Path(args.out).mkdir(parents=True, exist_ok=True)
    png = Path(args.out) / "lightning_resume.png"
    plot(png, full, resumed, n, full_dm.final_metrics)
    fm = full_dm.final_metrics
    names = [k.split("/")[-1] for k in fm if k.startswith("zephon/token_share/")]
    mix = ", ".join(
        f"{n_} {fm['zephon/token_share/' + n_]:.1%} "
        f"(target {fm['zephon/token_share_target/' + n_]:.0%})"
        for n_ in names
    )
    print(f"\nrealized token share: {mix}; plot: {png}")
    if len(resumed) != len(tail) or not all(same):
        first = same.index(False) if False in same else min(len(same), len(tail))
        print(f"\nSTREAMS DIFFER at step {n + first}")
        sys.exit(1)
    print(
        f"\nidentical: the {len(tail)} batches and losses after the resume match the "
        "uninterrupted run step for step, bit for bit (dropout 0.1: the RNG was restored "
        "too)."
    )


if __name__ == "__main__":
    main()
