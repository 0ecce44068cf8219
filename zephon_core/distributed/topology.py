"""Topology: which process serves which lanes, so the global stream never depends on it.
(``docs/design.md`` §7)

``canonical_replicas = C`` lanes define the data order; global output position
``g`` belongs to lane ``g mod C``. With ``D`` data-parallel ranks, the ranks
consume positions ``g .. g+D-1`` at each step: rank ``r`` starting at global
position ``g0`` owns the lanes ``l`` with ``(l - g0) mod D == r`` and visits
them in the order ``(g0 + r + i*D) mod C``. DataLoader worker ``w`` of ``W``
owns every ``W``-th lane of that rotated list, so the DataLoader's strict
worker round-robin reproduces the rank's lane round-robin -- also right after
a resume at any ``g0``. Model-parallel peers share a ``dp_rank`` and so get
identical data.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import TopologyError
from ..validate import int_arg


@dataclass(frozen=True)
class Topology:
    """Where this process sits. ``num_workers == 0`` means no DataLoader workers."""

    rank: int = 0
    world_size: int = 1
    dp_rank: int = 0
    dp_size: int = 1
    worker_id: int = 0
    num_workers: int = 0

    def __post_init__(self) -> None:
        for name in ("rank", "world_size", "dp_rank", "dp_size", "worker_id", "num_workers"):
            int_arg(name, getattr(self, name), minimum=0, where="topology", error=TopologyError)
        if self.world_size < 1 or self.dp_size < 1:
            raise TopologyError(
                f"world_size={self.world_size} and dp_size={self.dp_size} must be >= 1"
            )
        if not self.rank < self.world_size:
            raise TopologyError(f"rank={self.rank} must be < world_size={self.world_size}")
        if not self.dp_rank < self.dp_size:
            raise TopologyError(f"dp_rank={self.dp_rank} must be < dp_size={self.dp_size}")
        if self.world_size % self.dp_size:
            raise TopologyError(
                f"world_size={self.world_size} is not a multiple of dp_size={self.dp_size}"
            )
        if self.num_workers and not self.worker_id < self.num_workers:
            raise TopologyError(
                f"worker_id={self.worker_id} must be < num_workers={self.num_workers}"
            )

    @property
    def is_leader(self) -> bool:
        """Global rank 0, DataLoader worker 0 (or the main process)."""
        return self.rank == 0 and self.worker_id == 0


def detect(**overrides: int) -> Topology:
    """The topology from torch.distributed and the DataLoader worker info, then overrides."""
    import torch.distributed as dist
    from torch.utils.data import get_worker_info

    values: dict[str, int] = {}
    if dist.is_available() and dist.is_initialized():
        values.update(rank=dist.get_rank(), world_size=dist.get_world_size())
        values.update(dp_rank=values["rank"], dp_size=values["world_size"])
    info = get_worker_info()
    if info is not None:
        values.update(worker_id=info.id, num_workers=info.num_workers)
    values.update({k: v for k, v in overrides.items() if v is not None})
    return Topology(**values)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def validate(num_lanes: int, dp_size: int, num_workers: int) -> None:
    if num_lanes % dp_size:
        raise TopologyError(
            f"canonical_replicas={num_lanes} is not divisible by dp_size={dp_size}; valid "
            f"dp sizes for {num_lanes} lanes are {_divisors(num_lanes)} (or choose "
            f"canonical_replicas as a multiple of {dp_size} when starting a run)"
        )
    per_rank = num_lanes // dp_size
    if num_workers and per_rank % num_workers:
        raise TopologyError(
            f"each of the {dp_size} data-parallel ranks owns {per_rank} lanes, which "
            f"num_workers={num_workers} does not divide; valid num_workers are "
            f"{[0] + _divisors(per_rank)}"
        )


def rank_lanes(num_lanes: int, dp_size: int, dp_rank: int, start: int) -> list[int]:
    """The lanes of ``dp_rank`` in visiting order, for a run starting at position ``start``."""
    validate(num_lanes, dp_size, 0)
    return [(start + dp_rank + i * dp_size) % num_lanes for i in range(num_lanes // dp_size)]


def worker_lanes(lanes: list[int], num_workers: int, worker_id: int) -> list[int]:
    """Worker ``worker_id``'s share of a rank's lane list (all of it without workers)."""
    if not num_workers:
        return list(lanes)
    return lanes[worker_id::num_workers]
