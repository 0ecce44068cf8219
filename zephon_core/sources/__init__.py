"""Work sources: where a pipeline's sample pointers come from.

A :class:`Source` (e.g. :class:`StaticMixtureWorkSource`; the :class:`SourceSpec`
protocol is its required part) opens one :class:`WorkSource` per lane; each produces
:class:`WorkChunk` s whose position is restored in O(1) from a small state dict.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from ..chunk import WorkChunk
    from .base import Source, SourceSpec, WorkSource
    from .parquet import ParquetComponent, parquet_component
    from .permutation import KeyedPermutation
    from .schedule import WeightSchedule
    from .static_mixture import StaticMixtureWorkSource

__all__ = [
    "KeyedPermutation",
    "ParquetComponent",
    "Source",
    "SourceSpec",
    "StaticMixtureWorkSource",
    "WeightSchedule",
    "WorkChunk",
    "WorkSource",
    "parquet_component",
]

_WHERE = {
    "WorkChunk": "..chunk",
    "Source": ".base",
    "SourceSpec": ".base",
    "WorkSource": ".base",
    "ParquetComponent": ".parquet",
    "parquet_component": ".parquet",
    "KeyedPermutation": ".permutation",
    "WeightSchedule": ".schedule",
    "StaticMixtureWorkSource": ".static_mixture",
}
__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
