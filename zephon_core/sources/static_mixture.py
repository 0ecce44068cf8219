"""StaticMixtureWorkSource: a fixed-weight mixture of random-access datasets.
(``docs/design.md`` §2)

Why this shape: a lane's position must be restorable in O(1) from a few
integers, whatever the dataset sizes and however far training went. So each
dataset is read as the infinite concatenation of its epochs, position ``p``
being row ``perm_(seed, d, p // N_d)(p % N_d)`` of epoch ``p // N_d`` (a keyed
bijection, never materialized; identity without shuffling). Lane ``l`` of ``C``
takes positions ``l, l + C, l + 2C, ...`` of every dataset, so the lanes
partition each epoch exactly (even when ``N_d < C``) and a lane's whole
position is one cursor per dataset. The component of each slot comes from a
smooth weighted round-robin, exact over every ``sum(weights)`` slots
(``weights_unit="documents"``), or from token deficits when the weights are token
shares or change over the run (``deficit.py``, ``schedule.py``).

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
import math
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
from .block_shuffle import BlockShuffle, block_bounds
from .deficit import TokenDeficit
from .lengths import ComponentLengths, lengths_digest, resolve_lengths
from .mixture import SmoothWeightedRoundRobin, integer_weights
from .permutation import KeyedPermutation, map_many
from .repetition import warn_repeat
from .schedule import WeightSchedule, fixed_point_shares, weights_at

__all__ = ["StaticMixtureWorkSource", "StaticMixtureLane"]

log = logging.getLogger(__name__)

_STATE_VERSION = 1  # smooth round-robin over documents (static weights)
_DEFICIT_VERSION = 2  # token deficits (token shares or a schedule)
_STATE_KEYS = frozenset({"version", "next_chunk_id", "cursors", "swrr", "exhausted"})
_DEFICIT_KEYS = frozenset(
    {"version", "next_chunk_id", "cursors", "deficits", "tokens", "retired", "exhausted"}
)
_UNITS = ("documents", "tokens")
_WHEN_EXHAUSTED = ("drop", "end")
_SCALAR_SEGMENT = 8  # epoch segments shorter than this are mapped without numpy


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


class StaticMixtureWorkSource:
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
            self.ever_weighted = tuple(
                any(w[d] > 0 for _, w in self._table) for d in range(len(names))
            )
        else:
            first = tuple(self._weight_list(weights))
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
            "version": _STATE_VERSION,
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
        mixture: every dataset in both keeps its cursor (its position and epochs), new ones
        start at 0, the scheduler's credits start afresh under the new weights, and the
        pointers of removed datasets count as ``retired``.

        Raises:
            CorruptCheckpoint: the saved state is malformed.
        """
        if not isinstance(state, Mapping) or not isinstance(state.get("cursors"), list):
            raise CorruptCheckpoint(f"a lane's source state is malformed: {state!r}")
        old = list(state["cursors"])
        if len(old) != len(old_names) or not all(_is_int(c) and c >= 0 for c in old):
            raise CorruptCheckpoint(f"source cursors {old!r} do not fit datasets {old_names!r}")
        by_name = dict(zip(old_names, old, strict=True))
        cursors = [int(by_name.get(n, 0)) for n in self.component_names]
        retired = int(state.get("retired", 0)) + sum(
            c for n, c in by_name.items() if n not in self.component_names
        )
        tokens = state.get("tokens", 0)
        n = len(self.component_names)
        if self.deficit_mode:
            return {
                "version": _DEFICIT_VERSION,
                "next_chunk_id": state["next_chunk_id"],
                "cursors": cursors,
                "deficits": [0] * n,
                "tokens": tokens if _is_int(tokens) else 0,
                "retired": retired,
                "exhausted": False,
            }
        out = {
            "version": _STATE_VERSION,
            "next_chunk_id": state["next_chunk_id"],
            "cursors": cursors,
            "swrr": [0] * n,
            "exhausted": False,
        }
        if retired:
            out["retired"] = retired
        return out


class StaticMixtureLane:
    """The running state of one lane of a :class:`StaticMixtureWorkSource`.

    State keys (``state_dict()``): ``version`` (1), ``next_chunk_id``, ``cursors``
    (per dataset, how many of this lane's positions were consumed), ``swrr`` (the
    mixture credits), ``exhausted`` (the lane has ended) and, after a re-mix removed
    a dataset, ``retired`` (pointers read from datasets no longer in the mixture).
    Token-deficit lanes (version 2) keep ``deficits`` and ``tokens`` (tokens
    scheduled on this lane, the position a weight schedule reads) instead of
    ``swrr``, and always ``retired``.
    """

    def __init__(self, source: StaticMixtureWorkSource, lane: int, num_lanes: int, seed: int):
        self._src = source
        self.lane = lane
        self.num_lanes = num_lanes
        self._seed = seed
        n_ds = len(source.lengths)
        self._deficit = source.deficit_mode
        if self._deficit:
            self._credits = TokenDeficit(n_ds)
            self._lens = source._length_table() if source.needs_tokens else None
            self._shares: tuple[float, list[int]] | None = None
        else:
            self._swrr = SmoothWeightedRoundRobin(source.integer_weights)
        self._tokens = 0  # tokens scheduled on this lane (deficit mode)
        self._retired = 0
        self._cursors = [0] * n_ds
        self._next_chunk_id = 0
        self._limits: list[int | None] = [None] * n_ds
        for d, n in enumerate(source.lengths):  # cursor k is valid while lane + k*C < E*N_d
            epochs = source.epochs_of(d)
            if epochs is not None:
                self._limits[d] = max(0, -(-(epochs * n - lane) // num_lanes))
        self._repeat_seen = [False] * n_ds
        self._exhausted = self._all_drained()
        # Caches of pure functions of k (never part of the state).
        per_chunk = [source.chunk_size * w for w in source.weights]
        self._block = [max(64, min(4096, math.ceil(32 * m))) for m in per_chunk]
        self._buf: list[np.ndarray | None] = [None] * n_ds
        self._buf_start = [0] * n_ds
        self._perm: list[tuple[int, KeyedPermutation] | None] = [None] * n_ds
        bounds = source.block_bounds
        # per dataset: a block shuffle, or None for the row-level permutation
        self._blocks = [
            None
            if bounds is None or b is None
            else BlockShuffle(
                b, source.shuffle_window, num_lanes, derive_seed(source.seed, d, "blocks")
            )
            for d, b in enumerate(bounds or [None] * n_ds)
        ]

    def _all_drained(self, cursors: Sequence[int] | None = None) -> bool:
        cursors = self._cursors if cursors is None else cursors
        done = [
            lim is not None and cur >= lim for cur, lim in zip(cursors, self._limits, strict=True)
        ]
        weighted = self._src.ever_weighted
        if self._src.when_exhausted == "end":
            return any(d and w for d, w in zip(done, weighted, strict=True))
        return all(d or not w for d, w in zip(done, weighted, strict=True))

    # -- rows ------------------------------------------------------------------------------

    def _epoch_key(self, d: int, epoch: int) -> int:
        """The key of dataset ``d``'s row permutation in ``epoch``."""
        return derive_seed(self._src.seed, d, epoch)

    def _permutation(self, d: int, epoch: int) -> KeyedPermutation:
        cached = self._perm[d]
        if cached is None or cached[0] != epoch:
            key = self._epoch_key(d, epoch)
            cached = (epoch, KeyedPermutation(self._src.lengths[d], key))
            self._perm[d] = cached
        return cached[1]

    def _compute_rows(self, d: int, k0: int, size: int) -> np.ndarray:
        """Rows of this lane's cursors ``k0 .. k0 + size - 1`` of dataset ``d``."""
        n = self._src.lengths[d]
        pos = self.lane + self.num_lanes * (k0 + np.arange(size, dtype=np.int64))
        local = pos % n
        if not self._src.shuffle:
            return local
        epochs = pos // n
        cuts = [0, *(np.flatnonzero(np.diff(epochs)) + 1).tolist(), size]
        if len(cuts) > 3 and self._blocks[d] is None:
            # a small dataset: many epochs in one pass, each under its own key
            first = int(epochs[0])
            keys = [self._epoch_key(d, e) for e in range(first, int(epochs[-1]) + 1)]
            return map_many(n, keys, epochs - first, local)
        out = np.empty(size, dtype=np.int64)
        for a, b in zip(cuts[:-1], cuts[1:], strict=True):
            if self._blocks[d] is not None:
                out[a:b] = self._blocks[d].map_array(local[a:b], int(epochs[a]))
                continue
            perm = self._permutation(d, int(epochs[a]))
            if b - a < _SCALAR_SEGMENT:
                out[a:b] = [perm(int(i)) for i in local[a:b]]
            else:
                out[a:b] = perm.map_array(local[a:b])
        return out

    def _rows(self, d: int, k0: int, count: int) -> list[int]:
        buf, start = self._buf[d], self._buf_start[d]
        if buf is None or k0 < start or k0 + count > start + len(buf):
            size = max(count, self._block[d])
            limit = self._limits[d]
            if limit is not None:
                size = min(size, limit - k0)
            buf, start = self._compute_rows(d, k0, size), k0
            self._buf[d], self._buf_start[d] = buf, start
        return buf[k0 - start : k0 - start + count].tolist()

    # -- WorkSource ------------------------------------------------------------------------

    @property
    def next_chunk_id(self) -> int:
        """The id of the chunk ``next_chunk()`` returns next."""
        return self._next_chunk_id

    def next_chunk(self) -> WorkChunk | None:
        """The next chunk (ids 0, 1, ...), or ``None`` once the lane has ended."""
        if self._exhausted:
            return None
        if self._deficit:
            picks, rows = self._deficit_picks()
        else:
            picks, rows = self._swrr_picks()
        self._exhausted = self._all_drained()
        self._check_repetition(picks)
        chunk_id = self._next_chunk_id
        self._next_chunk_id += 1
        return WorkChunk(
            lane=self.lane,
            chunk_id=chunk_id,
            components=tuple(picks),
            rows=rows,
            seed=derive_seed(self._seed, self.lane, chunk_id),
        )

    def _remaining(self) -> list[int | None]:
        return [
            None if lim is None else lim - cur
            for cur, lim in zip(self._cursors, self._limits, strict=True)
        ]

    def _ends_lane(self, remaining: Sequence[int | None]) -> bool:
        """``when_exhausted="end"``: a weighted capped dataset just ran out."""
        return self._src.when_exhausted == "end" and any(
            r is not None and r <= 0 and w
            for r, w in zip(remaining, self._src.ever_weighted, strict=True)
        )

    def _swrr_picks(self) -> tuple[list[int], tuple[int, ...]]:
        size, cursors = self._src.chunk_size, self._cursors
        remaining = self._remaining()
        active = [
            w > 0 and (r is None or r > 0)
            for w, r in zip(self._src.integer_weights, remaining, strict=True)
        ]
        picks: list[int] = []
        while len(picks) < size and any(active) and not self._ends_lane(remaining):
            # Pick as many slots as no active dataset can run out during.
            room = [r for r, a in zip(remaining, active, strict=True) if a and r is not None]
            batch = self._swrr.pick_many(min([size - len(picks), *room]), active)
            picks += batch
            for d in dict.fromkeys(batch):
                if remaining[d] is not None:
                    remaining[d] -= batch.count(d)
                    active[d] = remaining[d] > 0
        present = list(dict.fromkeys(picks))
        if len(present) == 1:
            d = present[0]
            rows = tuple(self._rows(d, cursors[d], len(picks)))
            cursors[d] += len(picks)
        else:
            iters: list[Any] = [None] * len(cursors)
            for d in present:
                count = picks.count(d)
                iters[d] = iter(self._rows(d, cursors[d], count))
                cursors[d] += count
            rows = tuple(map(next, [iters[c] for c in picks]))
        return picks, rows

    def _current_shares(self) -> list[int]:
        """Fixed-point shares at this lane's position (once per chunk)."""
        src = self._src
        table = src._table
        if len(table) == 1:
            pos = 0.0
        elif src.schedule is not None and src.schedule.by == "tokens":
            pos = float(self._tokens * self.num_lanes)
        else:
            pos = float((sum(self._cursors) + self._retired) * self.num_lanes)
        weights = weights_at(table, pos)
        cached = self._shares
        if cached is None or cached[0] != weights:
            cached = (weights, fixed_point_shares(weights))
            self._shares = cached
        return cached[1]

    def _deficit_picks(self) -> tuple[list[int], tuple[int, ...]]:
        size, cursors, lens = self._src.chunk_size, self._cursors, self._lens
        shares = self._current_shares()
        remaining = self._remaining()
        eligible = [
            d
            for d, (s, r) in enumerate(zip(shares, remaining, strict=True))
            if s > 0 and (r is None or r > 0)
        ]
        picks: list[int] = []
        rows: list[int] = []
        credits = self._credits
        # each eligible dataset's next row and its length (the pick looks ahead at them)
        nxt_row = [0] * len(cursors)
        nxt_len = [1] * len(cursors)

        def peek(d: int) -> None:
            nxt_row[d] = row = self._rows(d, cursors[d], 1)[0]
            nxt_len[d] = lens[d].of(row) if lens is not None else 1

        for d in eligible:
            peek(d)
        while len(picks) < size and eligible and not self._ends_lane(remaining):
            d = credits.pick(eligible, nxt_len, shares)
            length = nxt_len[d]
            credits.charge(d, length, shares, eligible)
            self._tokens += length
            picks.append(d)
            rows.append(nxt_row[d])
            cursors[d] += 1
            if remaining[d] is not None:
                remaining[d] -= 1
                if remaining[d] <= 0:
                    eligible = [c for c in eligible if c != d]
                    continue
            peek(d)
        return picks, tuple(rows)

    def _check_repetition(self, picks: Sequence[int]) -> None:
        """Warn (once per process and dataset) when a dataset starts repeating while
        another weighted one has not finished its first epoch."""
        seen = self._repeat_seen
        for d in dict.fromkeys(picks):
            if seen[d]:
                continue
            n, C = self._src.lengths[d], self.num_lanes
            if self.lane + C * (self._cursors[d] - 1) < n:
                continue  # still in its first epoch
            seen[d] = True
            behind = {
                self._src.component_names[e]: (self.lane + C * self._cursors[e]) / ne
                for e, ne in enumerate(self._src.lengths)
                if e != d
                and self._src.ever_weighted[e]
                and (self.lane + C * self._cursors[e]) < ne
                and (self._limits[e] is None or self._cursors[e] < self._limits[e])
            }
            if behind:
                warn_repeat(self._src.component_names, d, behind)

    def state_dict(self) -> dict[str, Any]:
        if self._deficit:
            return {
                "version": _DEFICIT_VERSION,
                "next_chunk_id": self._next_chunk_id,
                "cursors": list(self._cursors),
                "deficits": self._credits.state_dict(),
                "tokens": self._tokens,
                "retired": self._retired,
                "exhausted": self._exhausted,
            }
        out = {
            "version": _STATE_VERSION,
            "next_chunk_id": self._next_chunk_id,
            "cursors": list(self._cursors),
            "swrr": self._swrr.state_dict(),
            "exhausted": self._exhausted,
        }
        if self._retired:
            out["retired"] = self._retired
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a position saved by :meth:`state_dict` (O(1), nothing is replayed).

        Raises:
            CorruptCheckpoint: the state is malformed or does not fit this source.
        """
        where = f"StaticMixtureLane lane={self.lane}"
        if not isinstance(state, Mapping):
            raise CorruptCheckpoint(f"{where}: state must be a dict, got {type(state).__name__}")
        want_version = _DEFICIT_VERSION if self._deficit else _STATE_VERSION
        keys = _DEFICIT_KEYS if self._deficit else _STATE_KEYS
        got = set(state) - (set() if self._deficit else {"retired"})
        if state.get("version") != want_version:
            kind = "token-deficit" if want_version == _DEFICIT_VERSION else "round-robin"
            raise CorruptCheckpoint(
                f"{where}: state version {state.get('version')!r}, but this source schedules "
                f"by {kind} (version {want_version}): the state comes from a differently "
                "configured source"
            )
        if got != keys:
            raise CorruptCheckpoint(
                f"{where}: state keys {sorted(map(str, state))} != expected {sorted(keys)}"
            )
        next_id, cursors, exhausted = state["next_chunk_id"], state["cursors"], state["exhausted"]
        retired = state.get("retired", 0)
        if not _is_int(next_id) or next_id < 0:
            raise CorruptCheckpoint(f"{where}: next_chunk_id must be an int >= 0, got {next_id!r}")
        if not _is_int(retired) or retired < 0:
            raise CorruptCheckpoint(f"{where}: retired must be an int >= 0, got {retired!r}")
        n_ds = len(self._cursors)
        if not isinstance(cursors, (list, tuple)) or len(cursors) != n_ds:
            raise CorruptCheckpoint(
                f"{where}: cursors must be a list of {n_ds} ints, got {cursors!r}"
            )
        for d, (cur, lim) in enumerate(zip(cursors, self._limits, strict=True)):
            if not _is_int(cur) or cur < 0 or (lim is not None and cur > lim):
                raise CorruptCheckpoint(
                    f"{where}: cursor of dataset {self._src.component_names[d]!r} is {cur!r}, "
                    f"expected an int in [0, {'inf' if lim is None else lim}]"
                )
        if not isinstance(exhausted, bool):
            raise CorruptCheckpoint(f"{where}: exhausted must be a bool, got {exhausted!r}")
        consumed, size = sum(int(c) for c in cursors) + int(retired), self._src.chunk_size
        fits = consumed == next_id * size or (
            exhausted and (next_id - 1) * size < consumed <= next_id * size
        )
        if not fits:
            raise CorruptCheckpoint(
                f"{where}: cursors sum to {consumed} pointers but {next_id} chunks of {size} "
                "were produced: the state comes from a differently configured source"
            )
        if self._all_drained(cursors) != exhausted:
            raise CorruptCheckpoint(
                f"{where}: exhausted={exhausted} contradicts the cursors {list(cursors)!r}"
            )
        if self._deficit:
            tokens = state["tokens"]
            if not _is_int(tokens) or tokens < 0:
                raise CorruptCheckpoint(f"{where}: tokens must be an int >= 0, got {tokens!r}")
            self._credits.load_state_dict(state["deficits"])  # validates first
            self._tokens = int(tokens)
        else:
            self._swrr.load_state_dict(state["swrr"])  # validates before changing anything
        self._cursors = [int(c) for c in cursors]
        self._retired = int(retired)
        self._next_chunk_id = int(next_id)
        self._exhausted = exhausted
        self._repeat_seen = [
            self.lane + self.num_lanes * (c - 1) >= n
            for c, n in zip(self._cursors, self._src.lengths, strict=True)
        ]
