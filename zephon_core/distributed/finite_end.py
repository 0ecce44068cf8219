"""Where a finite stream ends when several data-parallel ranks consume it (``docs/design.md`` §7).

The global stream is the sequence of positions g = 0, 1, 2, ...; position g is lane
``g mod C``'s next output, or nothing once that lane has ended. One process (any
number of DataLoader workers) skips the empty positions. With ``D > 1`` ranks, every
training step consumes the ``D`` positions ``g .. g+D-1`` together, one per rank, so
an empty one is a rank without a batch for that step -- and a rank that stops while
the others call collectives would hang them all. So the stream ends for every rank
at the first step that has an empty position: no rank delivers that step, and the
checkpoint is the state after the last complete step (it restores to the same end).

The multi-rank stream is therefore a prefix of the single-process stream. Ranks agree
on the end with one ``all_reduce(MIN)`` of a flag per step, only for finite streams
and only when torch.distributed is initialized with the ranks this pipeline was bound
to; without a process group each rank ends at its own first empty position and
coordinating the end is up to the caller.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..sources.base import as_source
from .topology import Topology


def step_agreement(topology: Topology, finite: bool) -> Callable[[bool], bool] | None:
    """A function every rank calls once per step with "I have an output": True when all
    have one. None when no agreement is needed or possible."""
    if not finite or topology.dp_size == 1:
        return None
    import torch.distributed as dist

    if (
        not (dist.is_available() and dist.is_initialized())
        or dist.get_world_size() != topology.world_size
    ):
        return None
    import torch

    device = torch.device("cpu")
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())

    def agree(has_output: bool) -> bool:
        flag = torch.tensor([1 if has_output else 0], dtype=torch.int32, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item())

    return agree


def is_finite(source: Any) -> bool:
    """Whether a source's lanes can end (``Source.finite``; True unless it says)."""
    return bool(as_source(source).finite)
