"""What ZephonDataModule's per-step bookkeeping costs under Lightning.

Every training micro-step starts from the RNG the previous one left
(``zephon_integrations/lightning/steps.py``: a snapshot of the python, numpy and torch
RNGs at its end, set back at the next start) and every optimizer step records
Lightning's loop counters (``loop_counters.py``). This times ``StepTracker.start`` +
``StepTracker.end`` inside a real fit (the bar pipeline, an embedding + linear model,
accumulation 1 and 4), next to the whole micro-step, and reports medians per
micro-step. The numbers are for a CPU; on a GPU the CUDA generators add their own
(small, host-side) state.
"""

from __future__ import annotations

import logging
import statistics
import time
import warnings

import lightning.pytorch as pl
import torch
from common import bar_pipeline

from zephon_integrations.lightning import ZephonDataModule
from zephon_integrations.lightning.steps import StepTracker


class _Model(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(256, 64)
        self.drop = torch.nn.Dropout(0.1)
        self.head = torch.nn.Linear(64, 256)

    def training_step(self, batch, batch_idx):
        x = self.drop(self.emb(batch["input_ids"].clamp(0, 255)))
        return torch.nn.functional.cross_entropy(
            self.head(x).flatten(0, 1), batch["input_ids"].clamp(0, 255).flatten()
        )

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class _Clock(pl.Callback):
    """Wall time of each micro-step, from its batch start to its batch end."""

    def __init__(self) -> None:
        self.t0 = 0.0
        self.steps: list[float] = []

    def on_train_batch_start(self, *a) -> None:
        self.t0 = time.perf_counter()

    def on_train_batch_end(self, *a) -> None:
        self.steps.append(time.perf_counter() - self.t0)


def measure(steps: int = 300, accumulate: int = 1) -> dict[str, float]:
    spent: list[float] = []
    start, end = StepTracker.start, StepTracker.end

    def timed(fn):
        def wrapper(self, trainer):
            t = time.perf_counter()
            fn(self, trainer)
            spent.append(time.perf_counter() - t)

        return wrapper

    StepTracker.start, StepTracker.end = timed(start), timed(end)
    try:
        clock = _Clock()
        trainer = pl.Trainer(
            max_steps=steps // accumulate,
            accumulate_grad_batches=accumulate,
            accelerator="cpu",
            devices=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[clock],
        )
        dm = ZephonDataModule(pipeline=bar_pipeline, log_every_n_steps=0)
        trainer.fit(_Model(), datamodule=dm)
    finally:
        StepTracker.start, StepTracker.end = start, end
    per_step = [a + b for a, b in zip(spent[0::2], spent[1::2])][10:]
    return {
        "bookkeeping_us": statistics.median(per_step) * 1e6,
        "micro_step_ms": statistics.median(clock.steps[10:]) * 1e3,
    }


def main(quick: bool = False) -> dict:
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    out = {}
    for accumulate in (1, 4):
        r = measure(accumulate=accumulate, **({"steps": 40} if quick else {}))
        r["share_pct"] = r["bookkeeping_us"] / 10 / r["micro_step_ms"]
        out[f"accumulate_{accumulate}"] = r
        print(
            f"accumulate_grad_batches={accumulate}: start+end {r['bookkeeping_us']:.0f} us per "
            f"micro-step; the micro-step itself {r['micro_step_ms']:.2f} ms "
            f"({r['share_pct']:.1f} %)"
        )
    return out


def tables(result: dict) -> list[dict]:
    rows = [
        [
            name.removeprefix("accumulate_"),
            f"{r['bookkeeping_us']:.0f}",
            f"{r['micro_step_ms']:.2f}",
            f"{r['share_pct']:.1f} %",
        ]
        for name, r in result.items()
    ]
    return [
        {
            "title": "Lightning: RNG and loop counters kept per micro-step",
            "columns": [
                "accumulate_grad_batches",
                "StepTracker start+end us",
                "micro-step ms",
                "share",
            ],
            "rows": rows,
            "note": "Medians over the micro-steps of one fit after the first 10 (CPU).",
        }
    ]


if __name__ == "__main__":
    main()
