"""The WorkSource contract (``docs/design.md`` §2).

A :class:`WorkSource` produces the work of one lane as a sequence of
:class:`~zephon_core.chunk.WorkChunk`. A :class:`SourceSpec` is what a
``Pipeline`` is built from: it opens one WorkSource per lane and reads rows.

Contract (what a source you write yourself owes):

* ``next_chunk()`` returns the lane's next chunk (chunk ids 0, 1, 2, ...) or
  ``None`` when the lane is exhausted.
* ``state_dict()``/``load_state_dict()`` restore the position directly, in O(1)
  time and memory; a source is never replayed or re-advanced on restore.
* The chunk sequence is a pure function of configuration, seed and lane: no
  global RNG, wall clock, set/dict-hash order or ``hash()``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from ..chunk import WorkChunk


@runtime_checkable
class WorkSource(Protocol):
    def next_chunk(self) -> WorkChunk | None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@runtime_checkable
class SourceSpec(Protocol):
    """What ``Pipeline(source, ...)`` accepts."""

    #: Name of each component (dataset), indexed by ``WorkChunk.components``.
    component_names: tuple[str, ...]
    #: Target share of each component (normalized), used by ``ensure_mixture``.
    weights: tuple[float, ...]

    def open_lane(self, lane: int, num_lanes: int, seed: int) -> WorkSource:
        """The WorkSource of ``lane`` out of ``num_lanes`` canonical lanes."""
        ...

    def read(self, component: int, rows: Sequence[int]) -> list[Any]:
        """Read ``rows`` of one component with one batched read."""
        ...

    def describe(self) -> dict[str, Any]:
        """JSON-able description of everything that determines the chunk sequence."""
        ...
