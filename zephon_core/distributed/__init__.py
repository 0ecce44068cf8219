"""Topology, lane assignment and multi-rank checkpoint aggregation."""

from __future__ import annotations

from typing import Any

from .aggregate import AggregationError, Aggregator, report_from_dict
from .merge import RankReport, merge_reports
from .topology import Topology, detect, rank_lanes, validate, worker_lanes


def merge_local_checkpoints(reports: list[dict[str, Any]], num_lanes: int) -> dict[str, Any]:
    """Merge ``Pipeline.local_checkpoint()`` results of every rank into one checkpoint."""
    return merge_reports([report_from_dict(r) for r in reports], num_lanes).to_dict()


__all__ = [
    "AggregationError",
    "Aggregator",
    "RankReport",
    "Topology",
    "detect",
    "merge_local_checkpoints",
    "merge_reports",
    "rank_lanes",
    "validate",
    "worker_lanes",
]
