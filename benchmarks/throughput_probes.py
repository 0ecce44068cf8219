"""Probes of the real-tokenizer workload (``bpe_workload.py``) beside its rates: bytes a
DataLoader worker sends per batch, the first batch after a restore, threads per process.
"""

from __future__ import annotations

import itertools
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np
import torch
from bpe_workload import BATCH, CHUNK, LANES, SEQ, zephon_pipeline
from torch.utils.data import DataLoader, IterableDataset

RESTORE_AT = (20, 100, 300)


def _zephon_shape(stats: dict, mean_len: dict[str, float]) -> dict[str, float]:
    """Padding and documents per batch from ``stats()``: delivered tokens per dataset over
    that dataset's mean document length (delivered, not scheduled: the pump runs ahead)."""
    docs = sum(row["tokens"] / mean_len[name] for name, row in stats["mixture"].items())
    return {
        "padding_ratio": stats["padding_ratio"],
        "documents_per_batch": docs / stats["outputs"],
        "real_tokens_per_batch": BATCH * SEQ * (1 - stats["padding_ratio"]),
    }


def _threads() -> dict[str, Any]:
    return {
        "python_threads": threading.active_count(),
        "os_threads": len(os.listdir("/proc/self/task")),
        "names": sorted(t.name for t in threading.enumerate()),
    }


def _arrays(obj: Any, name: str = "") -> dict[str, tuple[str, int]]:
    """``{field: (dtype, nbytes)}`` of the arrays in what a worker sends, whatever its form
    (a dict of arrays, or an object holding arrays and lists of them)."""
    if isinstance(obj, (np.ndarray, torch.Tensor)):
        return {name: (str(obj.dtype), int(obj.nbytes))}
    if isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, (list, tuple)):
        found = [_arrays(v) for v in obj]
        if not found or not all(found):
            return {}
        return {f"{name}[{len(obj)}]": (found[0][""][0], sum(f[""][1] for f in found))}
    elif hasattr(obj, "__dict__"):
        items = vars(obj).items()
    else:
        return {}
    out: dict[str, tuple[str, int]] = {}
    for k, v in items:
        for kk, vv in _arrays(v, "").items():
            out[f"{k}{kk}"] = vv
    return out


class _WireProbe(IterableDataset):
    """Runs Zephon's worker-side dataset inside a real DataLoader worker and yields, for
    each ``(batch, delta)`` it would send, what pickling it for the worker queue costs."""

    def __init__(self, inner: IterableDataset, n: int):
        self.inner, self.n = inner, n

    def __iter__(self) -> Iterator[dict]:
        gen = iter(self.inner)
        try:
            for i, (wire, delta) in enumerate(itertools.islice(gen, self.n)):
                arrays = _arrays(wire)
                out = {
                    "item_bytes": len(ForkingPickler.dumps((wire, delta))),
                    "delta_bytes": len(ForkingPickler.dumps(delta)),
                    "array_bytes": sum(b for _, b in arrays.values()),
                    "arrays": arrays,
                    "wire_type": type(wire).__name__,
                }
                if i == self.n // 2:  # mid-run: the pipeline's threads are all up
                    out["threads"] = _threads()
                yield out
        finally:
            gen.close()


def bench_wire(fn: Callable, n: int = 40, provenance: bool = False) -> dict[str, Any]:
    """Bytes per batch through a worker's pipe, next to the tensors the consumer gets."""
    pipe = zephon_pipeline(fn, provenance=provenance)
    loader = DataLoader(
        _WireProbe(pipe.torch_dataset(), n), batch_size=None, num_workers=1, collate_fn=None
    )
    items = list(loader)
    with zephon_pipeline(fn, provenance=provenance).iterate() as it:
        tensors = _arrays(next(it))
    total = [x["item_bytes"] for x in items]
    delta = [x["delta_bytes"] for x in items]
    arrays = int(statistics.median(x["array_bytes"] for x in items))
    return {
        "wire_type": items[0]["wire_type"],
        "wire_arrays": {k: {"dtype": d, "bytes": b} for k, (d, b) in items[0]["arrays"].items()},
        "wire_array_bytes_median": arrays,
        "pickled_bytes_per_batch_median": int(statistics.median(total)),
        "non_array_bytes_median": int(statistics.median(total)) - arrays,
        "delta_bytes_median": int(statistics.median(delta)),
        "delta_bytes_max": max(delta),  # every 16th delta carries the worker's counters
        "consumer_tensors": {k: {"dtype": d, "bytes": b} for k, (d, b) in tensors.items()},
        "consumer_tensor_bytes": sum(b for _, b in tensors.values()),
        "worker_threads": next(x["threads"] for x in items if "threads" in x),
    }


def bench_restore(
    fn: Callable,
    steady_ms: float,
    mean_len: dict[str, float],
    repeats: int = 3,
    restore_at: tuple[int, ...] = RESTORE_AT,
) -> dict[str, Any]:
    """Checkpoints at restore_at, each restored into a freshly built pipeline (compile and
    admission included, the tokenizer already loaded) and timed to its first batch. The
    same run gives Zephon's padding and documents per batch, and its threads.

    Replay depth, in batches' worth of work at steady state: the replayed chunks'
    documents over documents per batch (all lanes' chunks, as the state holds them), and
    the documents actually tokenized before the first batch (a run without the pump thread,
    which stops at that batch), over documents per batch. The second also counts the new
    chunks a lane must read to reach its next flush, which releases the shuffle buffer.
    """
    states, threads = {}, None
    with zephon_pipeline(fn).iterate() as it:
        for i, _ in enumerate(itertools.islice(it, max(restore_at)), 1):
            if i in restore_at:
                states[i] = it.checkpoint()
            if i == restore_at[0]:
                threads = _threads()
        shape = _zephon_shape(it.stats(), mean_len)
    per_batch = shape["documents_per_batch"]
    out: dict[str, Any] = {"threads": threads, "shape": shape}
    for at, state in ((0, None), *states.items()):
        runs = [_first_batch(fn, state) for _ in range(repeats)]
        ms, replayed = min(r[0] for r in runs), runs[0][1]
        bare_ms, _, docs = _first_batch(fn, state, prefetch=0)
        row = {
            "first_batch_ms": round(ms, 1),
            "first_batch_ms_repeats": [round(r[0], 1) for r in runs],
            "first_batch_ms_no_pump": round(bare_ms, 1),
            "documents_tokenized_to_first_batch": docs,
            "work_depth_batches": round(docs / per_batch, 1),
            "ratio_vs_steady_x_work_depth": round(ms / (steady_ms * docs / per_batch), 2),
        }
        if state is not None:
            depth = replayed * CHUNK / per_batch
            row = {
                "chunks_replayed_all_lanes": replayed,
                # the first batch comes from lane position % C
                "chunks_inflight_first_lane": len(
                    state["lanes"][state["position"] % LANES]["chunks"]
                ),
                "replay_depth_batches_all_lanes": round(depth, 1),
                "ratio_vs_steady_x_replay_depth": round(ms / (steady_ms * depth), 2),
                **row,
            }
        out["cold_start" if state is None else f"at_{at}"] = row
    return out


def _first_batch(fn: Callable, state: dict | None, prefetch: int = 3) -> tuple[float, int, int]:
    t0 = time.perf_counter()
    it = zephon_pipeline(fn, prefetch).iterate(restore=state)
    next(it)
    ms = 1000 * (time.perf_counter() - t0)
    replayed = it.chunks_replayed
    docs = it.stats()["operators"]["tokenize"]["records_in"]  # exact without the pump
    it.close()
    return ms, replayed, docs
