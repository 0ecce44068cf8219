"""The WorkSource contract (``docs/design.md`` §2).

A :class:`WorkSource` produces the work of one lane as a sequence of
:class:`~zephon_core.chunk.WorkChunk`. A :class:`Source` (the :class:`SourceSpec`
protocol, plus capabilities with defaults) is what a ``Pipeline`` is built from: it
opens one WorkSource per lane and reads rows.

Why one class: the engine, the checkpoint and the distributed code use a source only
through the members listed here -- never by probing it with ``getattr``/``hasattr``
(``tests/sources/test_source_contract.py`` checks that) -- so what a source you write
yourself owes, and what it may add, is all on this page.

Contract (what a source you write yourself owes):

* ``next_chunk()`` returns the lane's next chunk (chunk ids 0, 1, 2, ...) or
  ``None`` when the lane is exhausted.
* ``state_dict()``/``load_state_dict()`` restore the position directly, in O(1)
  time and memory; a source is never replayed or re-advanced on restore. The state
  is a plain dict of JSON-able values (the checkpoint stores it as given).
* The chunk sequence is a pure function of configuration, seed and lane: no
  global RNG, wall clock, set/dict-hash order or ``hash()``.

Subclass :class:`Source` and implement the five required members
(``component_names``, ``weights``, ``open_lane``, ``read``, ``describe``); override an
optional one to offer that capability. An object that only has the five required
members (the :class:`SourceSpec` protocol) is accepted as it is and gets every default.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from ..chunk import WorkChunk
from ..errors import ConfigError, IncompatibleCheckpoint

__all__ = ["OPTIONAL_MEMBERS", "REQUIRED_MEMBERS", "Source", "SourceSpec", "WorkSource"]


@runtime_checkable
class WorkSource(Protocol):
    """One lane's chunks and its O(1) position."""

    def next_chunk(self) -> WorkChunk | None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@runtime_checkable
class SourceSpec(Protocol):
    """The members every source has (what ``Pipeline(source, ...)`` requires)."""

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


#: the members of :class:`SourceSpec`
REQUIRED_MEMBERS = ("component_names", "weights", "open_lane", "read", "describe")


class Source:
    """Base class of a source: the required members of :class:`SourceSpec` (abstract
    here) and every optional capability the engine uses, each with its default.

    A subclass implements ``component_names``, ``weights``, ``open_lane``, ``read`` and
    ``describe``, and overrides what it offers of the rest.
    """

    # -- required ---------------------------------------------------------------------

    #: Name of each component (dataset), indexed by ``WorkChunk.components``.
    component_names: tuple[str, ...]
    #: Target share of each component (normalized), used by ``ensure_mixture``.
    weights: tuple[float, ...]

    def open_lane(self, lane: int, num_lanes: int, seed: int) -> WorkSource:
        """The WorkSource of ``lane`` out of ``num_lanes`` canonical lanes."""
        raise NotImplementedError(f"{type(self).__name__}.open_lane")

    def read(self, component: int, rows: Sequence[int]) -> list[Any]:
        """Read ``rows`` of one component with one batched read."""
        raise NotImplementedError(f"{type(self).__name__}.read")

    def describe(self) -> dict[str, Any]:
        """JSON-able description of everything that determines the chunk sequence (it
        is the source's part of the pipeline's fingerprint)."""
        raise NotImplementedError(f"{type(self).__name__}.describe")

    # -- optional: the mixture ----------------------------------------------------------

    #: Rows per component (epochs in the mixture report, resized data at a restore);
    #: None: unknown.
    lengths: tuple[int, ...] | None = None
    #: What ``weights`` are shares of: ``"documents"`` or ``"tokens"``.
    weights_unit: str = "documents"
    #: The weights change over the run (a ``WeightSchedule``); None: fixed weights.
    schedule: Any = None
    #: ``describe()`` keys a re-mix (``allow_changes={"weights"}``) may change.
    MIXTURE_KEYS: frozenset[str] = frozenset()
    #: ``describe()`` keys that name the components (``allow_changes={"components"}``).
    COMPONENT_KEYS: frozenset[str] = frozenset()

    def weights_at(self, tokens: float = 0, documents: float = 0) -> tuple[float, ...]:
        """The normalized weights in force at a global position (default: ``weights``)."""
        return tuple(self.weights)

    def given_weights(self) -> tuple[float, ...]:
        """The weights as the user stated them, for display (default: ``weights``)."""
        return tuple(self.weights)

    def scheduled(self, lane_state: Mapping[str, Any]) -> tuple[tuple[int, ...] | None, int]:
        """(documents scheduled per component, tokens scheduled) by one lane, read from
        its ``state_dict()`` (default: unknown, 0). The mixture report sums them."""
        return None, 0

    def remix_lane_state(
        self, old_names: Sequence[str], state: Mapping[str, Any]
    ) -> dict[str, Any]:
        """A lane state saved under another mixture (``old_names``), for this one.

        Raises:
            IncompatibleCheckpoint: by default: this source cannot re-mix.
        """
        raise IncompatibleCheckpoint(
            f"the source {type(self).__name__} cannot re-mix a checkpoint "
            "(it has no remix_lane_state): rebuild it exactly as it was"
        )

    # -- optional: the stream -------------------------------------------------------------

    #: Whether lanes can end (a finite source ends the stream on every rank together).
    finite: bool = True

    def check_chunk(self, chunk: WorkChunk) -> None:
        """Raise ``CorruptCheckpoint`` unless a restored chunk fits this source
        (default: accepts every chunk)."""

    def resumes_at(self, lane: WorkSource) -> int | None:
        """The chunk id a lane opened here continues at (checked against the checkpoint
        after a restore; default: None, not checked)."""
        return None

    def io_stats(self) -> dict[str, dict[str, int]]:
        """Reads, cache hits and retries per component that counts them (default: {})."""
        return {}

    def pointer_epochs(self, lane: WorkSource, chunks: Sequence[WorkChunk]) -> list[Any] | None:
        """The dataset epoch of every pointer of ``chunks`` -- the last chunks ``lane``
        (one of this source's lanes) produced, consecutive, ending where it stands now --
        one sequence of ints per chunk; None when unknown (the default: a batch's
        provenance then reports epoch -1)."""
        return None

    # -- optional: content and lengths ----------------------------------------------------

    def content_fingerprints(self) -> dict[str, str]:
        """A digest of each component's content, compared at a restore (default: {})."""
        return {}

    def legacy_content_fingerprint(self, name: str) -> str | None:
        """Component ``name``'s digest as older states hold it (default: None, unknown)."""
        return None

    #: Components whose token lengths the pipeline must estimate before running.
    needs_length_estimate: tuple[int, ...] = ()

    def with_lengths(self, measured: Mapping[int, Any]) -> Source:
        """A copy with the ``measured`` token lengths (called only when
        ``needs_length_estimate`` names components)."""
        raise NotImplementedError(f"{type(self).__name__}.with_lengths")


#: the members of :class:`Source` beyond :data:`REQUIRED_MEMBERS`
OPTIONAL_MEMBERS = tuple(
    name for name in vars(Source) if not name.startswith("_") and name not in REQUIRED_MEMBERS
)


class _Plain(Source):
    """A :class:`SourceSpec` object that is not a :class:`Source`: its five members,
    and the defaults for the rest. Other attributes are its own (an operator may read
    them through ``ctx.source``)."""

    def __init__(self, spec: Any) -> None:
        self.spec = spec

    @property
    def component_names(self) -> tuple[str, ...]:  # type: ignore[override]
        return tuple(self.spec.component_names)

    @property
    def weights(self) -> tuple[float, ...]:  # type: ignore[override]
        return tuple(self.spec.weights)

    def open_lane(self, lane: int, num_lanes: int, seed: int) -> WorkSource:
        return self.spec.open_lane(lane, num_lanes, seed)

    def read(self, component: int, rows: Sequence[int]) -> list[Any]:
        return self.spec.read(component, rows)

    def describe(self) -> dict[str, Any]:
        return self.spec.describe()

    def __getattr__(self, name: str) -> Any:
        if name == "spec":  # not set yet (unpickling)
            raise AttributeError(name)
        return getattr(self.spec, name)


def as_source(spec: Any) -> Source:
    """``spec`` as a :class:`Source`: itself, or a :class:`SourceSpec` object with the
    defaults of every optional member.

    Raises:
        ConfigError: ``spec`` lacks a required member, or it is not a ``Source`` but
            defines an optional member (which the engine would not use).
    """
    if isinstance(spec, Source):
        return spec
    name = type(spec).__name__
    missing = [m for m in REQUIRED_MEMBERS if not hasattr(spec, m)]
    if missing:
        raise ConfigError(
            f"source {name} lacks {missing[0]!r}; pass a StaticMixtureWorkSource or "
            "subclass zephon_core.sources.Source (docs: Writing a WorkSource)"
        )
    extra = [m for m in OPTIONAL_MEMBERS if hasattr(spec, m)]
    if extra:
        raise ConfigError(
            f"source {name} defines {', '.join(map(repr, extra))} but does not subclass "
            "zephon_core.sources.Source, so the pipeline would not use them: subclass Source "
            "(its members are the whole contract; docs: Writing a WorkSource)"
        )
    return _Plain(spec)
