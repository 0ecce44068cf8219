"""StaticMixtureWorkSource: a fixed-weight mixture of random-access datasets.
(``docs/design.md`` §2)

Why this shape: a lane's position must be restorable in O(1) from a few
integers, whatever the dataset sizes and however far training went. So each
dataset is read as the infinite concatenation of its epochs, position ``p``
being row ``perm_(seed, d, p // N_d)(p % N_d)`` of epoch ``p // N_d`` (a keyed
bijection, never materialized; identity without shuffling). Lane ``l`` of ``C``
takes positions ``l, l + C, l + 2C, ...`` of every dataset, so the lanes
partition each epoch exactly (even when ``N_d < C``) and a lane's whole
position is one cursor per dataset (``mixture_rows.py``). The component of each slot
comes from a smooth weighted round-robin, exact over every ``sum(weights)`` slots
(``weights_unit="documents"``), or from token deficits when the weights are token
shares or change over the run (``scheduling.py``). A lane's state is a
:class:`~zephon_core.sources.mixture_state.MixtureLaneState` (``mixture_state.py``).
This module holds the configuration and composes them.

Per component ``num_epochs`` caps repetition; ``when_exhausted`` says what a capped
component does at its cap: ``"drop"`` (leave the mixture, the others go on) or
``"end"`` (the lane ends).

Example:
    >>> src = StaticMixtureWorkSource({"a": list(range(10)), "b": list(range(5))},
    ...                               weights={"a": 0.5, "b": 0.5}, chunk_size=4, seed=1)
    >>> lane = src.open_lane(0, num_lanes=2, seed=7)
    >>> chunk = lane.next_chunk()
    >>> chunk.chunk_id, chunk.components
    (0, (0, 1, 0, 1))
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..chunk import WorkChunk
from ..digests.content import component_fingerprint
from ..digests.legacy_digest import Budgeted as LegacyBudgeted
from ..errors import ConfigError, CorruptCheckpoint, PipelineError
from ..rng import derive_seed
from ..validate import bool_arg, int_arg, weight_vector
from ..validate import is_int as _is_int
from .base import Source, WorkSource
from .block_shuffle import block_bounds
from .lengths import ComponentLengths, lengths_digest, resolve_lengths
from .mixture import integer_weights
from .mixture_lane import StaticMixtureLane
from .mixture_state import SWRR_VERSION, lane_scheduled, remixed_state
from .schedule import WeightSchedule, weights_at

__all__ = ["StaticMixtureWorkSource", "StaticMixtureLane"]

log = logging.getLogger(__name__)

_UNITS = ("documents", "tokens")
_WHEN_EXHAUSTED = ("drop", "end")


def _check_dataset(name: str, ds: Any) -> int:
    if isinstance(ds, (str, bytes, Mapping)):
        raise ConfigError(
            f"dataset {name!r} is a {type(ds).__name__}, not a random-access dataset: pass "
            "datasets={'name': dataset, ...} or a list of datasets (each a list / HF Dataset)"
        )
    has_get = hasattr(ds, "__getitems__") or hasattr(ds, "__getitem__")
    try:
        n = len(ds)
    except (TypeError, NotImplementedError):
        n = None
    if n is None or not has_get:
        raise ConfigError(
            f"dataset {name!r} ({type(ds).__name__}) has no len() and __getitem__: a "
            "StaticMixtureWorkSource needs random access (a list, an HF datasets.Dataset, "
            "a map-style torch Dataset); iterable/streaming datasets cannot be used"
        )
    if n == 0:
        raise ConfigError(f"dataset {name!r} is empty (len 0): remove it or give it rows")
    return int(n)


class StaticMixtureWorkSource(Source):
    """A weighted mixture of random-access datasets, served as per-lane work chunks.

    Args:
        datasets: ``{name: dataset}`` (order kept) or a sequence (named "0", "1", ...);
            each dataset needs ``len()`` and ``__getitems__`` or ``__getitem__``.
        weights: per-dataset weights (mapping by name or sequence; default uniform), or a
            :class:`~zephon_core.sources.schedule.WeightSchedule` that changes them
            over the run.
        chunk_size: sample pointers per work chunk.
        seed: keys the per-(dataset, epoch) permutations.
        shuffle: permute rows within each epoch (else rows come in order).
        num_epochs: ``None`` for an infinite stream; an int caps every dataset, a
            mapping ``{name: int | None}`` caps some: each row is delivered at most that
            many times over all lanes.
        weights_unit: ``"documents"`` (weights are shares of documents; the default,
            see the README) or ``"tokens"`` (shares of tokens, scheduled by each
            document's length before it is fetched).
        lengths: token counts per row for ``"tokens"``: a column name, or
            ``{name: per-row counts | column name | None}``; missing ones are estimated
            by the pipeline at compile time (``lengths.py``).
        when_exhausted: a capped dataset at its cap ``"drop"`` s out of the mixture
            (the others continue; lanes end when every weighted dataset is capped and
            done) or ``"end"`` s the lane.
        shuffle_block: ``None`` (shuffle rows over the whole epoch), rows per block, or
            ``"row_group"`` (the dataset's own blocks, e.g. Parquet row groups; datasets
            without row groups keep the row-level shuffle): the
            epoch's blocks are permuted, each lane reads a contiguous run of them, and
            rows are shuffled within windows of ``shuffle_window`` blocks, so each block
            is read about once per epoch (``block_shuffle.py``).
        shuffle_window: blocks shuffled together per lane (with ``shuffle_block``).

    Raises:
        ConfigError: on any invalid argument; the message names the dataset and the fix.
    """

    def __init__(
        self,
        datasets: Mapping[str, Any] | Sequence[Any],
        weights: Mapping[str, float] | Sequence[float] | WeightSchedule | None = None,
        chunk_size: int = 64,
        seed: int = 0,
        shuffle: bool = True,
        num_epochs: int | Mapping[str, int | None] | None = None,
        weights_unit: str = "documents",
        lengths: Any = None,
        when_exhausted: str = "drop",
        shuffle_block: int | str | None = None,
        shuffle_window: int = 4,
    ) -> None:
        if isinstance(datasets, Mapping):
            bad = [k for k in datasets if not isinstance(k, str)]
            if bad:
                raise ConfigError(f"dataset names must be strings, got {bad!r}")
            names, dss = list(datasets.keys()), list(datasets.values())
        elif isinstance(datasets, (list, tuple)):
            names, dss = [str(i) for i in range(len(datasets))], list(datasets)
        else:
            raise ConfigError(
                f"datasets must be a mapping {{name: dataset}} or a list of datasets, got a "
                f"{type(datasets).__name__}: wrap a single dataset as {{'name': ds}}"
            )
        if not dss:
            raise ConfigError("datasets is empty: give at least one dataset")
        self._datasets = dss
        self.component_names: tuple[str, ...] = tuple(names)
        self.lengths: tuple[int, ...] = tuple(
            _check_dataset(n, d) for n, d in zip(names, dss, strict=True)
        )
        where = "StaticMixtureWorkSource"
        if weights_unit not in _UNITS:
            raise ConfigError(f"{where}(weights_unit={weights_unit!r}): use one of {_UNITS}")
        if when_exhausted not in _WHEN_EXHAUSTED:
            raise ConfigError(
                f"{where}(when_exhausted={when_exhausted!r}): use one of {_WHEN_EXHAUSTED}"
            )
        self.weights_unit = weights_unit
        self.when_exhausted = when_exhausted
        self.schedule: WeightSchedule | None = None
        if isinstance(weights, WeightSchedule):
            self.schedule = weights
            self._table = weights.resolve(self.component_names)
            first = self._table[0][1]
            self._given = tuple(float(w) for w in first)
            self.ever_weighted = tuple(
                any(w[d] > 0 for _, w in self._table) for d in range(len(names))
            )
        else:
            first = tuple(self._weight_list(weights))
            self._given: tuple[float, ...] = tuple(float(w) for w in first)
            self._table = ((0.0, tuple(w / sum(first) for w in first)),)
            self.ever_weighted = tuple(w > 0 for w in first)
        self.integer_weights: tuple[int, ...] = tuple(integer_weights(first))
        total = sum(self.integer_weights)
        self.weights: tuple[float, ...] = tuple(w / total for w in self.integer_weights)
        #: lanes schedule by token deficits (token shares or a schedule), else by SWRR
        self.deficit_mode = weights_unit == "tokens" or self.schedule is not None
        self.chunk_size = int_arg("chunk_size", chunk_size, minimum=1, where=where)
        self.seed = int_arg("seed", seed, where=where)
        self.shuffle = bool_arg("shuffle", shuffle, where=where)
        self.num_epochs = self._epochs(num_epochs)
        needs_tokens = weights_unit == "tokens" or (
            self.schedule is not None and self.schedule.by == "tokens"
        )
        if lengths is not None and not needs_tokens:
            raise ConfigError(
                f"{where}: lengths= given with weights_unit={weights_unit!r}; lengths are "
                "for weights_unit='tokens' (or a WeightSchedule by tokens)"
            )
        self.token_lengths: tuple[ComponentLengths | None, ...] = tuple(
            resolve_lengths(lengths, self.component_names, dss, self.lengths, self.ever_weighted)
        )
        self.needs_tokens = needs_tokens
        self._getitems = [getattr(d, "__getitems__", None) for d in dss]
        self.shuffle_block, self.shuffle_window, self.block_bounds = self._blocks(
            shuffle_block, shuffle_window
        )

    def _blocks(
        self, block: Any, window: Any
    ) -> tuple[Any, int, tuple[np.ndarray | None, ...] | None]:
        where = "StaticMixtureWorkSource"
        window = int_arg("shuffle_window", window, minimum=1, where=where)
        if block is None:
            return None, window, None
        if block != "row_group":
            block = int_arg("shuffle_block", block, minimum=1, where=where)
        if not self.shuffle:
            raise ConfigError(
                f"{where}(shuffle=False, shuffle_block={block!r}): a block shuffle needs "
                "shuffle=True; drop shuffle_block to read rows in order"
            )
        bounds = tuple(
            block_bounds(ds, n, block, name)
            for name, ds, n in zip(self.component_names, self._datasets, self.lengths, strict=True)
        )
        if all(b is None for b in bounds):
            raise ConfigError(
                f"{where}(shuffle_block='row_group'): no dataset has row groups (no "
                "block_bounds(), e.g. parquet_component); give shuffle_block=<rows per block>"
            )
        return block, window, bounds

    def weights_at(self, tokens: float = 0, documents: float = 0) -> tuple[float, ...]:
        """The normalized weights in force at a global position (read off the schedule,
        if any, at ``tokens`` or ``documents`` consumed)."""
        if self.schedule is None:
            return self._table[0][1]
        pos = tokens if self.schedule.by == "tokens" else documents
        return weights_at(self._table, float(pos))

    def _weight_list(self, weights: Mapping[str, float] | Sequence[float] | None) -> list[float]:
        if weights is None:
            return [1.0] * len(self.component_names)
        return weight_vector(weights, self.component_names, "StaticMixtureWorkSource")

    def _epochs(self, num_epochs: Any) -> tuple[int | None, ...] | int | None:
        where = "StaticMixtureWorkSource"
        if isinstance(num_epochs, Mapping):
            unknown = [k for k in num_epochs if k not in self.component_names]
            if unknown:
                raise ConfigError(
                    f"{where}: num_epochs given for unknown datasets {unknown!r}; known: "
                    f"{list(self.component_names)!r}"
                )
            return tuple(
                int_arg(f"num_epochs[{n!r}]", num_epochs.get(n), minimum=1, allow_none=True)
                for n in self.component_names
            )
        return int_arg("num_epochs", num_epochs, minimum=1, allow_none=True, where=where)

    def epochs_of(self, component: int) -> int | None:
        """The cap of one dataset (``None``: unbounded)."""
        e = self.num_epochs
        return e[component] if isinstance(e, tuple) else e

    # -- lengths (token mode) ------------------------------------------------------------

    @property
    def needs_length_estimate(self) -> tuple[int, ...]:
        """Datasets whose token lengths the pipeline must estimate before running."""
        if not self.needs_tokens:
            return ()
        return tuple(d for d, ln in enumerate(self.token_lengths) if ln is None)

    def with_lengths(self, measured: Mapping[int, ComponentLengths]) -> StaticMixtureWorkSource:
        """A copy whose unknown lengths are ``measured`` (the pipeline's estimate)."""
        new = copy.copy(self)
        tl = list(self.token_lengths)
        for d, ln in measured.items():
            tl[d] = ln
        new.token_lengths = tuple(tl)
        return new

    def _length_table(self) -> list[ComponentLengths]:
        missing = self.needs_length_estimate
        if missing:
            raise ConfigError(
                "token-weighted mixing needs the token length of every document of "
                f"{[self.component_names[d] for d in missing]}: pass lengths= (per-row "
                "counts or a column name), or run the source through a Pipeline, which "
                "estimates them with its own tokenizer when it compiles"
            )
        return [ln if ln is not None else ComponentLengths(mean=1) for ln in self.token_lengths]

    # -- reading ---------------------------------------------------------------------------

    def read(self, component: int, rows: Sequence[int]) -> list[Any]:
        """Read ``rows`` of dataset ``component`` with one batched read."""
        if not _is_int(component) or not 0 <= component < len(self._datasets):
            raise IndexError(
                f"component {component!r} out of range for {len(self._datasets)} datasets"
            )
        getitems = self._getitems[component]
        if getitems is not None:
            return list(getitems(list(rows)))
        ds = self._datasets[component]
        return [ds[r] for r in rows]

    def io_stats(self) -> dict[str, dict[str, int]]:
        """Per dataset that counts its reads (e.g. Parquet shards): reads, retries, ..."""
        return {
            name: ds.io_stats()
            for name, ds in zip(self.component_names, self._datasets, strict=True)
            if callable(getattr(ds, "io_stats", None))
        }

    @property
    def finite(self) -> bool:
        """Whether the lanes end (some weighted dataset is capped and ends the lane, or
        every weighted dataset is capped)."""
        capped = [
            self.epochs_of(d) is not None for d in range(len(self.lengths)) if self.ever_weighted[d]
        ]
        return any(capped) if self.when_exhausted == "end" else all(capped)

    def content_fingerprints(self) -> dict[str, str]:
        """A digest of each dataset's content (see ``digests/content.py``).

        Computed when a pipeline compiles, not cached: a dataset edited in place between
        two runs of one process must show up."""
        out = {}
        for d, (name, ds, n) in enumerate(
            zip(self.component_names, self._datasets, self.lengths, strict=True)
        ):
            try:
                out[name] = component_fingerprint(
                    ds, lambda rows, d=d: self.read(d, rows), n, derive_seed(self.seed, d)
                )
            except Exception as e:  # noqa: BLE001 - a read failed: name the dataset
                raise PipelineError(
                    f"reading dataset {name!r} for its content fingerprint "
                    f"failed: {type(e).__name__}: {e}",
                    operator="fingerprint",
                ) from e
        return out

    def legacy_content_fingerprint(self, name: str) -> str:
        """Dataset ``name``'s digest as states written before per-part digests hold it
        (``checkpoint/legacy_content.py``; read only to restore such a state)."""
        d = self.component_names.index(name)
        return component_fingerprint(
            self._datasets[d],
            lambda rows: self.read(d, rows),
            self.lengths[d],
            derive_seed(self.seed, d),
            hasher=LegacyBudgeted,
        )

    def check_chunk(self, chunk: WorkChunk) -> None:
        """Raise ``CorruptCheckpoint`` unless a restored chunk fits these datasets."""
        n_ds = len(self.lengths)
        if len(chunk) > self.chunk_size:
            raise CorruptCheckpoint(
                f"lane {chunk.lane} chunk {chunk.chunk_id}: {len(chunk)} "
                f"pointers, more than chunk_size={self.chunk_size}"
            )
        if max(chunk.components) < n_ds and max(chunk.rows) < min(self.lengths):
            return  # every pointer inside the shortest dataset: nothing to look up per row
        for d, r in zip(chunk.components, chunk.rows, strict=True):
            if d >= n_ds or r >= self.lengths[d]:
                what = (
                    f"dataset {d} of {n_ds}"
                    if d >= n_ds
                    else f"row {r} of dataset {self.component_names[d]!r} ({self.lengths[d]} rows)"
                )
                raise CorruptCheckpoint(
                    f"lane {chunk.lane} chunk {chunk.chunk_id} points at "
                    f"{what}, which does not exist"
                )

    def describe(self) -> dict[str, Any]:
        """JSON-able description of everything that determines the chunk sequence.

        The keys of the mixture (``MIXTURE_KEYS``) are what ``allow_changes=
        {"weights", "components"}`` may change at a restore."""
        e = self.num_epochs
        out: dict[str, Any] = {
            "class": type(self).__name__,
            "version": SWRR_VERSION,  # the description's version, not the lane state's
            "names": list(self.component_names),
            "lengths": list(self.lengths),
            "weights": list(self.integer_weights),
            "chunk_size": self.chunk_size,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "num_epochs": list(e) if isinstance(e, tuple) else e,
        }
        # keys beyond version 1 appear only when used: older fingerprints stay valid
        if self.weights_unit != "documents":
            out["weights_unit"] = self.weights_unit
        if self.schedule is not None:
            out["schedule"] = self.schedule.describe(self.component_names)
        if self.when_exhausted != "drop":
            out["when_exhausted"] = self.when_exhausted
        if self.shuffle_block is not None:
            out["shuffle_block"] = self.shuffle_block
            out["shuffle_window"] = self.shuffle_window
        if self.needs_tokens:
            out["token_lengths"] = [
                None if ln is None else lengths_digest(ln) for ln in self.token_lengths
            ]
        return out

    #: describe() keys a re-mix may change ("weights"; "components" also names/lengths)
    MIXTURE_KEYS = frozenset(
        {"weights", "weights_unit", "schedule", "num_epochs", "when_exhausted", "token_lengths"}
    )
    COMPONENT_KEYS = frozenset({"names", "lengths"})

    def open_lane(self, lane: int, num_lanes: int, seed: int) -> StaticMixtureLane:
        """The WorkSource of ``lane`` out of ``num_lanes``; ``seed`` keys the chunk seeds."""
        num_lanes = int_arg("num_lanes", num_lanes, minimum=1, where="open_lane")
        lane = int_arg("lane", lane, minimum=0, maximum=num_lanes - 1, where="open_lane")
        seed = int_arg("seed", seed, where="open_lane")
        return StaticMixtureLane(self, int(lane), int(num_lanes), int(seed))

    # -- re-mixing -------------------------------------------------------------------------

    def remix_lane_state(self, old_names: Sequence[str], state: Mapping[str, Any]) -> dict:
        """A lane state saved under another mixture (``old_names`` in its order), for this
        mixture (``mixture_state.remixed_state``).

        Raises:
            CorruptCheckpoint: the saved state is malformed.
        """
        return remixed_state(old_names, state, self.component_names, self.deficit_mode)

    def scheduled(self, lane_state: Mapping[str, Any]) -> tuple[tuple[int, ...] | None, int]:
        """(documents scheduled per dataset, tokens scheduled) by one lane's state."""
        return lane_scheduled(lane_state)

    def pointer_epochs(self, lane: WorkSource, chunks: Sequence[WorkChunk]) -> list[Any] | None:
        """The epoch of each pointer of ``chunks``, the last consecutive chunks ``lane``
        made (counted back from its cursors; ``StaticMixtureLane.pointer_epochs``)."""
        return lane.pointer_epochs(chunks) if isinstance(lane, StaticMixtureLane) else None

    def resumes_at(self, lane: WorkSource) -> int | None:
        """The chunk id ``lane`` (one of this source's) continues at."""
        return lane.next_chunk_id if isinstance(lane, StaticMixtureLane) else None

    def given_weights(self) -> tuple[float, ...]:
        """The weights as given (a schedule: its first weights), e.g. ``(0.7, 0.3)``;
        ``describe()`` holds them reduced to integers (``(7, 3)``) for the fingerprint."""
        return self._given

    def __repr__(self) -> str:
        weights = ", ".join(
            f"{n!r}: {w:g}" for n, w in zip(self.component_names, self._given, strict=True)
        )
        extra = f", weights_unit={self.weights_unit!r}" if self.weights_unit != "documents" else ""
        if self.schedule is not None:
            extra += ", scheduled"
        return (
            f"StaticMixtureWorkSource({{{weights}}}{extra}, chunk_size={self.chunk_size}, "
            f"seed={self.seed})"
        )
