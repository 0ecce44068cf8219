"""Zephon: a deterministic, checkpointable streaming data pipeline for LLM training."""

from ._version import __version__ as __version__
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
    "UntrustedCheckpoint",
    "ReplayDivergence",
    "SourceChanged",
    "CorruptData",
    "StorageThrottled",
]
