"""HF Trainer demo: a tiny causal LM on HF datasets, interrupted and resumed exactly.

The embedded mixture (Python's own docs as prose, its standard library as code) is
saved as local HF datasets (``save_to_disk``), read back as Zephon components with one
Arrow read per chunk, tokenized by a BPE trained on the spot, packed and shuffled.
A config-constructed GPT-2 (random init, nothing downloads) trains with an unmodified
``transformers.Trainer`` and ``ZephonCallback`` (``--path trainer``: the per-rank
``ZephonTrainer``): run A goes 2N steps; run B (same schedule) "crashes" at N; run C
resumes B's last checkpoint with ``resume_from_checkpoint=True``. The demo compares
the batches the model saw and the losses.
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
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import datasets  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from embedded import BatchTokenizer, train_tokenizer  # noqa: E402
from transformers import (  # noqa: E402
    GPT2Config,
    GPT2LMHeadModel,
    PrinterCallback,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from zephon_core import Pipeline, StaticMixtureWorkSource  # noqa: E402
from zephon_core.testing import corpora  # noqa: E402
from zephon_integrations.hf import ZephonCallback, ZephonTrainer, hf_components  # noqa: E402

SEQ_LEN, BATCH = 128, 8


def save_datasets(root: Path, tokenizer: Path) -> dict[str, str]:
    """The corpora as HF datasets with a ``num_tokens`` column (the usual preparation
    step; the source reads it through Arrow to weigh the mixture in tokens)."""
    paths = {}
    encode = BatchTokenizer(tokenizer)
    for name, docs in (("prose", corpora.prose()), ("code", corpora.code())):
        ds = datasets.Dataset.from_dict(
            {"text": [d["text"] for d in docs], "id": [d["id"] for d in docs]}
        )
        ds = ds.map(
            lambda b: {
                "num_tokens": [
                    len(e["input_ids"]) for e in encode([{"text": t} for t in b["text"]])
                ]
            },
            batched=True,
        )
        datasets.DatasetDict({"train": ds}).save_to_disk(str(root / name))
        paths[name] = str(root / name)
    return paths


class PipelineFactory:
    """Builds the pipeline; picklable so DataLoader workers could rebuild it."""

    def __init__(self, paths: dict[str, str], tokenizer: Path):
        self.paths, self.tokenizer = paths, tokenizer

    def __call__(self) -> Pipeline:
        source = StaticMixtureWorkSource(
            hf_components(self.paths, split="train", columns=["text"]),
            {"prose": 0.7, "code": 0.3},
            chunk_size=16,
            seed=7,
            weights_unit="tokens",  # 70 % of the tokens
            lengths="num_tokens",  # a column, not among those read for training
        )
        return (
            Pipeline(source, canonical_replicas=4, flush_every_k_chunks=2, seed=7)
            .fetch()
            .map(BatchTokenizer(self.tokenizer), parallelism=2, name="tokenize", batched=True)
            .split(max_len=SEQ_LEN)
            .pack(seq_len=SEQ_LEN, bins=8)
            .shuffle(buffer_size=64)
            .batch(batch_size=BATCH)
        )


class Recording(TrainerCallback):
    """Keeps (step, batch fingerprint, loss) of every training step."""

    def __init__(self, model: torch.nn.Module):
        self.record: list[tuple[int, str, float]] = []
        self.batches: list[str] = []
        model.register_forward_pre_hook(self._see, with_kwargs=True)

    def _see(self, module, args, kwargs):
        if module.training:
            ids = kwargs["input_ids"].cpu().numpy().tobytes()
            self.batches.append(hashlib.sha256(ids).hexdigest()[:12])

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.record.append((state.global_step, self.batches[-1], float(logs["loss"])))


class KillAt(TrainerCallback):
    """SIGKILLs its own process right after step ``step`` was logged: no cleanup, no
    final save, exactly what an OOM kill or a lost node does to a training process."""

    def __init__(self, step: int):
        self.step = step

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs and state.global_step >= self.step:
            os.kill(os.getpid(), signal.SIGKILL)


class CrashAt(TrainerCallback):
    """Stops training after ``step`` (the "crash"), with the schedule of the full run."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.step:
            control.should_training_stop = True
        return control


def train(
    factory: PipelineFactory,
    out: Path,
    steps: int,
    path: str,
    resume: bool = False,
    crash_at: int | None = None,
    save_steps: int | None = None,
    extra: list | None = None,
) -> list:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(vocab_size=2048, n_positions=SEQ_LEN, n_embd=64, n_layer=2, n_head=4)
    )  # dropout on: RNG resumes too
    args = TrainingArguments(
        output_dir=str(out),
        max_steps=steps,
        save_strategy="steps",
        save_steps=save_steps or max(1, steps // 4),
        save_total_limit=2,
        learning_rate=3e-3,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        per_device_train_batch_size=BATCH,
    )
    recording = Recording(model)
    callbacks = [recording] + ([CrashAt(crash_at)] if crash_at else []) + list(extra or [])
    if path == "callback":  # an unmodified Trainer
        zephon = ZephonCallback(factory)
        trainer = Trainer(
            model=model,
            args=args,
            train_dataset=zephon.train_dataset,
            callbacks=[zephon, *callbacks],
        )
    else:  # the per-rank path
        trainer = ZephonTrainer(model=model, args=args, pipeline=factory, callbacks=callbacks)
    trainer.remove_callback(PrinterCallback)  # the losses are compared below instead
    trainer.train(resume_from_checkpoint=True if resume else None)
    return recording.record


KILL_SAVE_STEPS = 15  # checkpoint interval of the run that gets killed


def killed_run(d: Path, n: int, path: str) -> int:
    """Run B in a child process that is SIGKILLed right after step ``n``; returns the step
    of its last complete checkpoint."""
    (d / "B").mkdir()
    cmd = [sys.executable, __file__, "--child", str(d), "--steps", str(n), "--path", path]
    code = subprocess.run(cmd).returncode
    if code != -signal.SIGKILL:
        raise SystemExit(f"run B should have been killed by SIGKILL, but exited with {code}")
    return max(int(p.name.split("-")[1]) for p in (d / "B").glob("checkpoint-*"))


def child(opts: argparse.Namespace) -> None:
    d = Path(opts.child)
    paths = {name: str(d / "data" / name) for name in ("prose", "code")}
    factory = PipelineFactory(paths, d / "tokenizer.json")
    out = d / "B"
    train(
        factory, out, 2 * opts.steps, opts.path, save_steps=KILL_SAVE_STEPS,
        extra=[KillAt(opts.steps)],
    )  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40, help="N: stop at N, resume to 2N")
    ap.add_argument(
        "--path",
        choices=["callback", "trainer"],
        default="callback",
        help="Trainer + ZephonCallback, or the per-rank ZephonTrainer",
    )
    ap.add_argument("--kill", action="store_true", help="SIGKILL run B mid-run at step N")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    opts = ap.parse_args()
    n, path = opts.steps, opts.path
    logging.disable(logging.WARNING)
    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    if opts.child:
        return child(opts)
    print(__doc__.strip().splitlines()[0], f"({path}{', SIGKILL' if opts.kill else ''})\n")
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        tok = d / "tokenizer.json"
        train_tokenizer(tok)
        factory = PipelineFactory(save_datasets(d / "data", tok), tok)
        full = train(factory, d / "A", 2 * n, path)
        if opts.kill:
            start = killed_run(d, n, path)
            print(
                f"run B: killed with SIGKILL after step {n}; its last complete "
                f"checkpoint is checkpoint-{start}"
            )
        else:
            train(factory, d / "B", 2 * n, path, crash_at=n)
            start = n
        resumed = train(factory, d / "B", 2 * n, path, resume=True)
        kept = sorted(p.name for p in (d / "B").iterdir() if p.name.startswith("checkpoint"))
    tail = [r for r in full if r[0] > start]
    for (s, a, la), (_, b, lb) in list(zip(tail, resumed))[:3]:
        print(
            f"  step {s:3d}: batch {a} {'==' if a == b else '!='} {b}   loss {la:.4f} vs {lb:.4f}"
        )
    print(f"\ncheckpoints kept after rotation: {kept}")
    if [r[1] for r in tail] != [r[1] for r in resumed]:
        print("\nSTREAMS DIFFER")
        sys.exit(1)
    diff = max(abs(a[2] - b[2]) for a, b in zip(tail, resumed))
    print(
        f"identical: the {len(tail)} batches after resume_from_checkpoint match the "
        f"uninterrupted run (max loss difference {diff:.2e})."
    )


if __name__ == "__main__":
    main()
