"""One rank of a multi-process HF Trainer run, launched by torchrun from the tests.

Writes ``<record>.rank<r>.json`` with the batch fingerprints this rank's model saw, the
logged losses and the WARNINGs Zephon's integrations logged. ``--probe-no-checkpoint``
instead records the error each path raises for ``resume_from_checkpoint=True`` in an
output directory of this rank's own that holds no checkpoint.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import logging
import os
import sys
import time

import torch.distributed as dist
from helpers import hang_guard_s
from hf_helpers import (
    CrashAt,
    LossLog,
    ending_pipeline,
    make_pipeline,
    ragged_pipeline,
    tiny_model,
)
from transformers import Trainer, TrainingArguments

from zephon_integrations.hf import ZephonCallback, ZephonTrainer

logging.getLogger("transformers").setLevel(logging.ERROR)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--record", required=True)
    ap.add_argument("--max-steps", type=int, required=True)
    ap.add_argument("--resume", default="")
    ap.add_argument("--gas", type=int, default=1)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--dispatch", type=int, default=1)
    ap.add_argument("--split", type=int, default=0)
    ap.add_argument("--crash-at", type=int, default=0)
    ap.add_argument("--path", choices=["callback", "trainer"], default="callback")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--ragged", type=int, default=0)
    ap.add_argument("--ending", type=int, default=0, help="the finite ending_pipeline()")
    ap.add_argument(
        "--slow-save",
        type=int,
        default=0,
        help="rank 0 writes the model until rank 1's aggregation round of that save ended",
    )
    ap.add_argument("--agg-timeout", type=float, default=300.0)
    ap.add_argument("--probe-no-checkpoint", type=int, default=0)
    ap.add_argument("--teardown", type=int, default=0, help="exit through interpreter teardown")
    ap.add_argument("--layout", default="merged", help="state_layout of the Zephon path")
    a = ap.parse_args()
    rank_env = os.environ.get("RANK", "0")
    stacks = open(f"{a.record}.rank{rank_env}.stacks", "w")  # noqa: SIM115 - lives until exit
    # a hang shows every stack, before the test's own guard (test_hf_multiprocess.py) fires
    faulthandler.dump_traceback_later(hang_guard_s(540), exit=True, file=stacks)
    warned = WarningLog()
    logging.getLogger("zephon_integrations").addHandler(warned)
    if a.probe_no_checkpoint:
        errors = probe_no_checkpoint(a.out, rank_env)
        _finish(a, int(rank_env), {"world": int(os.environ["WORLD_SIZE"]), "errors": errors})

    model = tiny_model()
    losses = LossLog()
    callbacks = [losses] + ([CrashAt(a.crash_at)] if a.crash_at else [])
    args = TrainingArguments(
        output_dir=a.out,
        max_steps=a.max_steps,
        per_device_train_batch_size=a.batch_size,
        gradient_accumulation_steps=a.gas,
        save_steps=3,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=a.workers,
        accelerator_config={"dispatch_batches": bool(a.dispatch), "split_batches": bool(a.split)},
    )

    def build():
        pipe = (ragged_pipeline if a.ragged else ending_pipeline if a.ending else make_pipeline)()
        return pipe.with_options(aggregate_timeout_s=a.agg_timeout)

    if a.slow_save:
        slow_save(a.record, int(rank_env))
    if a.path == "callback":
        zephon = ZephonCallback(build, state_layout=a.layout)
        trainer = Trainer(
            model=model,
            args=args,
            train_dataset=zephon.train_dataset,
            callbacks=[zephon] + callbacks,
        )
    else:
        trainer = ZephonTrainer(
            model=model, args=args, pipeline=build, callbacks=callbacks, state_layout=a.layout
        )
    resume = {"": None, "true": True}.get(a.resume, a.resume)
    trainer.train(resume_from_checkpoint=resume)
    if a.teardown:  # benchmarks/stress_exit.py: a user's script ends here, through teardown
        return
    record = {"world": args.world_size, "seen": model.seen, "losses": losses.losses}
    _finish(a, args.process_index, dict(record, warnings=warned.messages))


def slow_save(record: str, rank: int) -> None:
    """Rank 0 writes the model (as of a large model's files) until rank 1's aggregation
    round of that save has ended: if the ranks merged only after rank 0's save, rank 1
    would wait in that round until its budget ran out, and fail."""
    from zephon_core.distributed.aggregate import Aggregator

    if rank == 1:
        ended = 0
        original_round = Aggregator.round

        def round_then_tell(self, local, _orig=original_round):
            nonlocal ended
            try:
                return _orig(self, local)
            finally:
                ended += 1
                with open(f"{record}.round{ended}.rank1", "w"):
                    pass

        Aggregator.round = round_then_tell
    if rank == 0:
        saves = 0
        save_model = Trainer.save_model

        def slow_save_model(self, *args, **kwargs):
            nonlocal saves
            saves += 1
            done, give_up = f"{record}.round{saves}.rank1", time.monotonic() + hang_guard_s(300)
            while not os.path.exists(done) and time.monotonic() < give_up:
                time.sleep(0.01)
            return save_model(self, *args, **kwargs)

        Trainer.save_model = slow_save_model


def probe_no_checkpoint(out: str, rank: str) -> dict[str, str]:
    """``train(resume_from_checkpoint=True)`` on each path, in a directory of this rank
    only (as on a node-local disk): the error each raises, as ``Type: message``."""
    errors = {}
    for path in ("callback", "trainer"):
        args = TrainingArguments(
            output_dir=os.path.join(out, f"{path}-rank{rank}"),
            max_steps=3,
            per_device_train_batch_size=4,
            report_to=[],
            use_cpu=True,
        )
        if path == "callback":
            zephon = ZephonCallback(make_pipeline)
            trainer = Trainer(
                model=tiny_model(), args=args, train_dataset=zephon.train_dataset,
                callbacks=[zephon],
            )  # fmt: skip
        else:
            trainer = ZephonTrainer(model=tiny_model(), args=args, pipeline=make_pipeline)
        try:
            trainer.train(resume_from_checkpoint=True)
            errors[path] = "none"
        except Exception as e:  # noqa: BLE001 - the probe records whatever it was
            errors[path] = f"{type(e).__name__}: {e}"
    return errors


class WarningLog(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _finish(a: argparse.Namespace, rank: int, record: dict) -> None:
    """Write this rank's record, wait for the others, and leave."""
    with open(f"{a.record}.rank{rank}.json", "w") as f:
        json.dump(dict(record, rank=rank), f)
    if dist.is_initialized():
        dist.barrier()  # every rank has written its record
    # Leave without interpreter teardown: destroying the DDP model and the gloo group at
    # exit hung in C++ once in ~50 launches (no Python frame on the stack), and teardown
    # is not what these runs check.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
