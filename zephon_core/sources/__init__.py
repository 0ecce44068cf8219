"""Work sources: where a pipeline's sample pointers come from.

A :class:`SourceSpec` (e.g. :class:`StaticMixtureWorkSource`) opens one
:class:`WorkSource` per lane; each produces :class:`WorkChunk` s whose position
is restored in O(1) from a small state dict.
"""

from __future__ import annotations

from ..chunk import WorkChunk
from .base import SourceSpec, WorkSource
from .parquet import ParquetComponent, parquet_component
from .permutation import KeyedPermutation
from .schedule import WeightSchedule
from .static_mixture import StaticMixtureWorkSource

__all__ = [
    "KeyedPermutation",
    "ParquetComponent",
    "SourceSpec",
    "StaticMixtureWorkSource",
    "WeightSchedule",
    "WorkChunk",
    "WorkSource",
    "parquet_component",
]
