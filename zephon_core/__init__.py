"""Zephon: a deterministic, checkpointable streaming data pipeline for LLM training."""

from .engine.pipeline import Pipeline
from .errors import (
                     CheckpointError,
                     ConfigError,
                     ContractViolation,
                     CorruptCheckpoint,
                     IncompatibleCheckpoint,
                     PipelineError,
                     ReplayDivergence,
                     TopologyError,
                     ZephonError,
)
from .ops import Operator, OpTraits
from .records import Contributor, Record, SampleCursor, tombstone
from .sources import StaticMixtureWorkSource, WorkChunk, WorkSource

__all__ = ["Pipeline", "StaticMixtureWorkSource", "WorkChunk", "WorkSource", "Operator",
           "OpTraits", "Record", "SampleCursor", "Contributor", "tombstone", "ZephonError",
           "ConfigError", "ContractViolation", "PipelineError", "TopologyError",
           "CheckpointError", "CorruptCheckpoint", "IncompatibleCheckpoint", "ReplayDivergence"]
__version__ = "0.1.0"
