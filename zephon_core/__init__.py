"""Zephon: a deterministic, checkpointable streaming data pipeline for LLM training."""

from typing import TYPE_CHECKING

from ._lazy import lazy_exports
from ._version import __version__ as __version__

# lazy (``_lazy.py``): ``zephon --help`` and reading a state file must not load torch
if TYPE_CHECKING:
    from .engine.handle import PipelineIterator
    from .engine.pipeline import Pipeline
    from .engine.torch_data import ZephonDataLoader
    from .errors import (
        CheckpointError,
        ConfigError,
        ContractViolation,
        CorruptCheckpoint,
        CorruptData,
        IncompatibleCheckpoint,
        LifecycleError,
        MissingCheckpointState,
        MissingLanes,
        PipelineError,
        PipelineStalled,
        ReplayDivergence,
        SourceChanged,
        StorageThrottled,
        TopologyError,
        UntrustedCheckpoint,
        ZephonError,
    )
    from .ops import Operator, OpTraits
    from .records import Contributor, Record, SampleCursor, tombstone
    from .sources import StaticMixtureWorkSource, WeightSchedule, WorkChunk, WorkSource

__all__ = [
    "Pipeline",
    "PipelineIterator",
    "ZephonDataLoader",
    "StaticMixtureWorkSource",
    "WeightSchedule",
    "WorkChunk",
    "WorkSource",
    "Operator",
    "OpTraits",
    "Record",
    "SampleCursor",
    "Contributor",
    "tombstone",
    "ZephonError",
    "ConfigError",
    "ContractViolation",
    "LifecycleError",
    "PipelineError",
    "PipelineStalled",
    "TopologyError",
    "CheckpointError",
    "CorruptCheckpoint",
    "IncompatibleCheckpoint",
    "MissingCheckpointState",
    "MissingLanes",
    "UntrustedCheckpoint",
    "ReplayDivergence",
    "SourceChanged",
    "CorruptData",
    "StorageThrottled",
]

_WHERE = {
    "Pipeline": ".engine.pipeline",
    "PipelineIterator": ".engine.handle",
    "ZephonDataLoader": ".engine.torch_data",
    "Operator": ".ops",
    "OpTraits": ".ops",
    "Record": ".records",
    "SampleCursor": ".records",
    "Contributor": ".records",
    "tombstone": ".records",
    "StaticMixtureWorkSource": ".sources",
    "WeightSchedule": ".sources",
    "WorkChunk": ".sources",
    "WorkSource": ".sources",
    "ZephonError": ".errors",
    "ConfigError": ".errors",
    "ContractViolation": ".errors",
    "LifecycleError": ".errors",
    "PipelineError": ".errors",
    "PipelineStalled": ".errors",
    "TopologyError": ".errors",
    "CheckpointError": ".errors",
    "CorruptCheckpoint": ".errors",
    "IncompatibleCheckpoint": ".errors",
    "MissingCheckpointState": ".errors",
    "MissingLanes": ".errors",
    "UntrustedCheckpoint": ".errors",
    "ReplayDivergence": ".errors",
    "SourceChanged": ".errors",
    "CorruptData": ".errors",
    "StorageThrottled": ".errors",
}

__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
