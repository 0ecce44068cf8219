"""The Trainer data path: batches/s a ``transformers.Trainer`` receives, no model work.

* ``zephon_loader``: ``pipe.dataloader()``, what ``ZephonTrainer`` hands the model.
* ``callback``: an unmodified Trainer with ``ZephonCallback``: Zephon's batches cut into
  rows, regrouped by the Trainer's DataLoader and collator, then accelerate's
  ``DataLoaderDispatcher`` (one process, its default for iterable datasets).
* ``callback_no_dispatch``: the same with ``dispatch_batches=False``.

The three run in interleaved rounds (``rounds.py``: order rotated, each ratio taken
within a round) so that drift on a shared machine hits all alike.
"""

from __future__ import annotations

import logging

import rounds
from common import bar_pipeline

# window: batches timed per variant and round; warmup: batches skipped first (the
# Trainer's loader and the pipeline's first chunks)
FULL = dict(window=1500, warmup=20, rounds=5)
QUICK = dict(window=100, warmup=20, rounds=3)
BASE = "zephon_loader"


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


def main(quick: bool = False) -> dict:
    cfg = QUICK if quick else FULL
    import tempfile

    logging.getLogger("transformers").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp:
        builds = {
            BASE: lambda: bar_pipeline().dataloader(),
            "callback": lambda: _callback_loader(tmp, True),
            "callback_no_dispatch": lambda: _callback_loader(tmp, False),
        }
        r = rounds.run(
            {k: rounds.window(b, cfg["window"], cfg["warmup"]) for k, b in builds.items()},
            cfg["rounds"],
        )
    rows = [
        {
            "variant": name,
            "batches_per_s": r.rate(name, "items").to_json(),
            "cpu_s_per_batch": r.per(name, "cpu_seconds", "items").to_json(),
            f"vs_{BASE}": r.ratio(name, BASE, "items").to_json(),
        }
        for name in builds
    ]
    return {"config": cfg, "quick": quick, "rows": rows, "load": r.load}


def tables(result: dict) -> list[dict]:
    """The result as tables for ``docs/measurements.md``."""
    cfg, s = result["config"], rounds.cell
    window = (
        f"Window {cfg['window']} batches after {cfg['warmup']} of warm-up per variant and round."
    )
    return [
        {
            "title": "Batches a Trainer receives: ZephonTrainer's loader vs ZephonCallback",
            "columns": ["variant", "batches/s", "CPU us/batch", f"vs {BASE} (within round)"],
            "rows": [
                [
                    r["variant"],
                    s(r["batches_per_s"], 0),
                    s(r["cpu_s_per_batch"], 0, scale=1e6),
                    s(r[f"vs_{BASE}"], 2, "x"),
                ]
                for r in result["rows"]
            ],
            "note": "The bar pipeline; one process, no model work (CPU: this process's, all "
            "its threads). "
            + rounds.method(cfg["rounds"], result["load"], window, result["quick"]),
        }
    ]


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(main(quick="--quick" in sys.argv), indent=2))
