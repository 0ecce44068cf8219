"""One rank of ``test_finite_end.py``: iterate a finite stream to its end over gloo.

Usage: ``python finite_worker.py SPEC_JSON``. Writes ``{"outputs": [...], ...}`` to the
spec's ``out`` path; the parent compares the ranks and kills stragglers.
"""

from __future__ import annotations

import faulthandler
import json
import sys
from pathlib import Path

import torch.distributed as dist
from helpers import batch_digest as digest
from helpers import finite_pipeline as build


def main(spec: dict) -> None:
    rank, world = spec["rank"], spec["world"]
    faulthandler.dump_traceback_later(spec["stacks_after_s"])  # a hang shows where
    dist.init_process_group(
        "gloo", init_method=f"file://{spec['init']}", rank=rank, world_size=world
    )
    pipe = build()  # the topology comes from the process group
    handle = pipe.dataloader(num_workers=spec["workers"]) if spec["workers"] else pipe.iterate()
    outputs = [digest(o) for o in handle]
    state = handle.checkpoint()  # an aggregation round over the process group's store
    handle.close()
    again = build().iterate(restore=state)
    after = [digest(o) for o in again]
    again.close()
    Path(spec["out"]).write_text(
        json.dumps({"outputs": outputs, "position": state["position"], "after_restore": after})
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
