"""Typed errors. Every message names the values involved and the fix."""

from __future__ import annotations


class ZephonError(Exception):
    """Base class of every error Zephon raises on purpose."""


class ConfigError(ZephonError, ValueError):
    """A pipeline, source or operator was configured with invalid values."""


class ContractViolation(ZephonError, RuntimeError):
    """An operator broke the operator contract (e.g. kept data after flush(reset=True))."""


class PipelineError(ZephonError, RuntimeError):
    """An operator or source raised while the pipeline ran; wraps the original error."""


class TopologyError(ZephonError, ValueError):
    """Lanes, ranks and workers do not fit together."""


class CheckpointError(ZephonError, ValueError):
    """Base class of checkpoint problems."""


class CorruptCheckpoint(CheckpointError):
    """The checkpoint bytes are truncated, corrupted or not a Zephon checkpoint."""


class IncompatibleCheckpoint(CheckpointError):
    """The checkpoint was written by a differently configured pipeline or schema."""


class ReplayDivergence(ZephonError, RuntimeError):
    """Replay after a restore did not reproduce the saved replay cursor."""
