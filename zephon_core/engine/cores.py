"""Threads per process: the host's cores shared among the processes that read.

Why: a DataLoader worker that sizes native thread pools to the whole host multiplies
them by the number of workers -- e.g. the tokenizers library's Rayon pool starts one
thread per core in every worker, 2 workers x 2 cores = 4 busy threads on 2 cores, each
slowing the others. A worker therefore gets ``cores // num_workers`` (at least 1) for the
pools that read ``RAYON_NUM_THREADS`` when they start (on their first use, after this
runs), unless the user set it. torch's own intra-op threads are already 1 in a worker
(the DataLoader sets them).
"""

from __future__ import annotations

import os

__all__ = ["usable_cores", "size_worker_threads"]


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity where the OS tells it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not on Linux
        return max(1, os.cpu_count() or 1)


def size_worker_threads(num_workers: int) -> int:
    """Set this worker's share of the cores for native pools (unless set); returns it."""
    share = max(1, usable_cores() // max(1, num_workers))
    os.environ.setdefault("RAYON_NUM_THREADS", str(share))
    return share
