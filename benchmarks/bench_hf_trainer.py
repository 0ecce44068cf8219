"""The Trainer data path: batches/s a ``transformers.Trainer`` receives, no model work.

* ``zephon_loader``: ``pipe.dataloader()``, what ``ZephonTrainer`` hands the model.
* ``callback``: an unmodified Trainer with ``ZephonCallback``: Zephon's batches cut into
  rows, regrouped by the Trainer's DataLoader and collator, then accelerate's
  ``DataLoaderDispatcher`` (one process, its default for iterable datasets).
* ``callback_no_dispatch``: the same with ``dispatch_batches=False``.

Rounds alternate so drift on a shared machine hits all alike; the median is reported.
"""

from __future__ import annotations

import logging
import statistics

from common import bar_pipeline, rate


def _callback_loader(tmp: str, dispatch: bool):
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        Trainer,
        TrainerControl,
        TrainerState,
        TrainingArguments,
    )

    from zephon_integrations.hf import ZephonCallback

    model = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=256,
            n_positions=512,
            n_embd=16,
            n_layer=1,
            n_head=2,
            bos_token_id=0,
            eos_token_id=0,
        )
    )
    args = TrainingArguments(
        output_dir=tmp,
        max_steps=10**6,
        per_device_train_batch_size=8,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        accelerator_config={"dispatch_batches": dispatch},
    )
    zephon = ZephonCallback(bar_pipeline)
    trainer = Trainer(
        model=model, args=args, train_dataset=zephon.train_dataset, callbacks=[zephon]
    )
    loader = trainer.get_train_dataloader()
    zephon.on_train_begin(args, TrainerState(), TrainerControl(), train_dataloader=loader)
    return loader


def main(quick: bool = False, n: int = 1500, rounds: int = 5) -> dict:
    n, rounds = (100, 2) if quick else (n, rounds)
    import tempfile

    logging.getLogger("transformers").setLevel(logging.ERROR)
    rates: dict[str, list[float]] = {
        "zephon_loader": [],
        "callback": [],
        "callback_no_dispatch": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        builds = {
            "zephon_loader": lambda: bar_pipeline().dataloader(),
            "callback": lambda: _callback_loader(tmp, True),
            "callback_no_dispatch": lambda: _callback_loader(tmp, False),
        }
        for _ in range(rounds):
            for name, build in builds.items():
                rates[name].append(rate(build, n, warmup=20))
    med = {k: statistics.median(v) for k, v in rates.items()}
    return {
        "batches_per_s": {k: round(v) for k, v in med.items()},
        "callback_vs_zephon_loader": round(med["callback"] / med["zephon_loader"], 2),
        "no_dispatch_vs_zephon_loader": round(
            med["callback_no_dispatch"] / med["zephon_loader"], 2
        ),
    }


_NOTE = (
    "Batches/s, median over rounds run in a fixed order (not rotated); one process, no "
    "model work."
)


def tables(result: dict) -> list[dict]:
    """The result as tables for ``docs/measurements.md``."""
    from report import flat_tables

    return flat_tables(result, _NOTE)


if __name__ == "__main__":
    import json

    print(json.dumps(main(), indent=2))
