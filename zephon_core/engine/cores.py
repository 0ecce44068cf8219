"""Threads per process: the host's cores shared among the processes that read.

Why: a DataLoader worker that sizes native thread pools to the whole host multiplies
them by the number of workers -- e.g. the tokenizers library's Rayon pool starts one
thread per core in every worker, 2 workers x 2 cores = 4 busy threads on 2 cores, each
slowing the others. A worker therefore gets ``cores // num_workers`` (at least 1) for the
pools that read ``RAYON_NUM_THREADS`` when they start (on their first use, after this
runs), unless the user set it. torch's own intra-op threads are already 1 in a worker
(the DataLoader sets them). An operator given ``parallelism="auto"`` gets the same share:
the process's cores, divided among the DataLoader workers when it runs in one.
"""

from __future__ import annotations

import os

from ..validate import int_arg

__all__ = ["core_share", "resolve_parallelism", "size_worker_threads", "usable_cores"]

_worker_share: int | None = None  # set in a DataLoader worker


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity where the OS tells it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not on Linux
        return max(1, os.cpu_count() or 1)


def size_worker_threads(num_workers: int) -> int:
    """Set this worker's share of the cores for native pools (unless set); returns it."""
    global _worker_share
    share = max(1, usable_cores() // max(1, num_workers))
    _worker_share = share
    os.environ.setdefault("RAYON_NUM_THREADS", str(share))
    return share


def core_share() -> int:
    """This process's share of the cores: a DataLoader worker's, else all usable ones."""
    return _worker_share if _worker_share is not None else usable_cores()


def resolve_parallelism(value: int | str, where: str) -> int:
    """An operator's ``parallelism``: an int >= 1 as given, or ``"auto"`` -> ``core_share()``."""
    if value == "auto":
        return core_share()
    return int_arg("parallelism", value, minimum=1, where=where)
