"""Typed errors. Every message names the values involved and the fix.

Zephon's promise is "the resumed stream is exactly the uninterrupted one, or one of
these errors says why not". None of them is ever replaced by a silent fresh start,
an empty stream or a hang.
"""

from __future__ import annotations

from typing import Any


class ZephonError(Exception):
    """Base class of every error Zephon raises on purpose."""


class ConfigError(ZephonError, ValueError):
    """A pipeline, source or operator was configured with invalid values."""


class ContractViolation(ZephonError, RuntimeError):
    """An operator or source broke its contract (e.g. kept data after a flush)."""


class LifecycleError(ZephonError, RuntimeError):
    """An object was used out of order: a restore after iteration started, a handle
    used after ``close()``, or a second stream from a pipeline that already has one."""


class PipelineError(ZephonError, RuntimeError):
    """An operator or source raised while the pipeline ran; wraps the original error.

    Attributes:
        operator: name of the operator (or stage) that failed, if known.
        cursor: the ``SampleCursor`` of the record it failed on, if known.
    """

    def __init__(self, message: str, *, operator: str | None = None, cursor: Any = None) -> None:
        super().__init__(message)
        self.operator = operator
        self.cursor = cursor

    def __reduce__(self) -> tuple:
        # keeps operator/cursor across processes (DataLoader workers, runner=processes)
        return (_rebuild, (type(self), str(self), self.operator, self.cursor))


def _rebuild(
    cls: type[PipelineError], message: str, operator: str | None, cursor: Any
) -> PipelineError:
    return cls(message, operator=operator, cursor=cursor)


class PipelineStalled(PipelineError):
    """No output for ``stall_timeout_s``: a stage is blocked, or an operator drops or
    holds every record. The message names the stage, lane and cursor."""


class SourceChanged(PipelineError):
    """A file the running job indexed was deleted or rewritten under it: the stream
    cannot stay the one its checkpoints describe. The message names the file."""


class CorruptData(PipelineError):
    """A data file's bytes failed their check twice, the second time read afresh from
    storage: a Parquet page checksum, the row group's digest, or decoding. The file is
    damaged where it is stored; the message names the file and row group."""


class StorageThrottled(PipelineError):
    """Object storage kept throttling (503 SlowDown, 429) after the capped retries: the
    data may be fine, the store limited the request rate. The message names the file and
    what to do."""


class TopologyError(ZephonError, ValueError):
    """Lanes, ranks and workers do not fit together."""


class CheckpointError(ZephonError, ValueError):
    """Base class of checkpoint problems."""


class CorruptCheckpoint(CheckpointError):
    """The checkpoint bytes are truncated, corrupted, out of range or not a Zephon
    checkpoint."""


class IncompatibleCheckpoint(CheckpointError):
    """The checkpoint was written by a differently configured pipeline, over other data or
    functions, or with another schema."""


class MissingLanes(IncompatibleCheckpoint):
    """A per-rank (DCP-shaped) state lacks lanes this rank owns now. The message names the
    lanes the state holds, the ones this rank needs, and how to save a state that has them.
    """


class UntrustedCheckpoint(CheckpointError):
    """Reading the file would unpickle a global that can run code; it was not read. The
    message names the globals and how to read a file you trust."""


class MissingCheckpointState(CheckpointError):
    """A training run resumes from a checkpoint that holds no Zephon state, so the data
    stream would silently restart from its beginning."""


class ReplayDivergence(ZephonError, RuntimeError):
    """Replay after a restore did not reproduce what was delivered before the checkpoint."""
