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
smooth weighted round-robin, exact over every ``sum(weights)`` slots.

Example:
    >>> src = StaticMixtureWorkSource({"a": list(range(10)), "b": list(range(5))},
    ...                               weights={"a": 0.5, "b": 0.5}, chunk_size=4, seed=1)
    >>> lane = src.open_lane(0, num_lanes=2, seed=7)
    >>> chunk = lane.next_chunk()
    >>> chunk.chunk_id, chunk.components
    (0, (0, 1, 0, 1))
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..checkpoint.content import component_fingerprint
from ..errors import ConfigError, CorruptCheckpoint, PipelineError
from ..rng import derive_seed
from ..validate import bool_arg, int_arg, weight_vector
from ..validate import is_int as _is_int
from .chunk import WorkChunk
from .mixture import SmoothWeightedRoundRobin, integer_weights
from .permutation import KeyedPermutation

__all__ = ["StaticMixtureWorkSource", "StaticMixtureLane"]

_STATE_VERSION = 1
_STATE_KEYS = frozenset({"version", "next_chunk_id", "cursors", "swrr", "exhausted"})
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
        weights: per-dataset weights (mapping by name or sequence); default uniform.
            Converted to exact integer ratios with :func:`integer_weights`.
        chunk_size: sample pointers per work chunk.
        seed: keys the per-(dataset, epoch) permutations.
        shuffle: permute rows within each epoch (else rows come in order).
        num_epochs: ``None`` for an infinite stream, else every row is delivered
            exactly ``num_epochs`` times over all lanes and then lanes end.

    Raises:
        ConfigError: on any invalid argument; the message names the dataset and the fix.
    """

    def __init__(
        self,
        datasets: Mapping[str, Any] | Sequence[Any],
        weights: Mapping[str, float] | Sequence[float] | None = None,
        chunk_size: int = 64,
        seed: int = 0,
        shuffle: bool = True,
        num_epochs: int | None = None,
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
        self.integer_weights: tuple[int, ...] = tuple(integer_weights(self._weight_list(weights)))
        total = sum(self.integer_weights)
        self.weights: tuple[float, ...] = tuple(w / total for w in self.integer_weights)
        where = "StaticMixtureWorkSource"
        self.chunk_size = int_arg("chunk_size", chunk_size, minimum=1, where=where)
        self.seed = int_arg("seed", seed, where=where)
        self.shuffle = bool_arg("shuffle", shuffle, where=where)
        self.num_epochs = int_arg("num_epochs", num_epochs, minimum=1, allow_none=True, where=where)
        self._getitems = [getattr(d, "__getitems__", None) for d in dss]

    def _weight_list(self, weights: Mapping[str, float] | Sequence[float] | None) -> list[float]:
        if weights is None:
            return [1.0] * len(self.component_names)
        return weight_vector(weights, self.component_names, "StaticMixtureWorkSource")

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

    @property
    def finite(self) -> bool:
        """Whether the lanes end (``num_epochs`` given)."""
        return self.num_epochs is not None

    def content_fingerprints(self) -> dict[str, str]:
        """A digest of each dataset's content (see ``checkpoint/content.py``).

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
        """JSON-able description of everything that determines the chunk sequence."""
        return {
            "class": type(self).__name__,
            "version": _STATE_VERSION,
            "names": list(self.component_names),
            "lengths": list(self.lengths),
            "weights": list(self.integer_weights),
            "chunk_size": self.chunk_size,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "num_epochs": self.num_epochs,
        }

    def open_lane(self, lane: int, num_lanes: int, seed: int) -> StaticMixtureLane:
        """The WorkSource of ``lane`` out of ``num_lanes``; ``seed`` keys the chunk seeds."""
        num_lanes = int_arg("num_lanes", num_lanes, minimum=1, where="open_lane")
        lane = int_arg("lane", lane, minimum=0, maximum=num_lanes - 1, where="open_lane")
        seed = int_arg("seed", seed, where="open_lane")
        return StaticMixtureLane(self, int(lane), int(num_lanes), int(seed))


class StaticMixtureLane:
    """The running state of one lane of a :class:`StaticMixtureWorkSource`.

    State keys (``state_dict()``): ``version`` (1), ``next_chunk_id``, ``cursors``
    (per dataset, how many of this lane's positions were consumed), ``swrr`` (the
    mixture credits) and ``exhausted`` (the lane has ended; finite epochs only).
    """

    def __init__(self, source: StaticMixtureWorkSource, lane: int, num_lanes: int, seed: int):
        self._src = source
        self.lane = lane
        self.num_lanes = num_lanes
        self._seed = seed
        n_ds = len(source.lengths)
        self._swrr = SmoothWeightedRoundRobin(source.integer_weights)
        self._cursors = [0] * n_ds
        self._next_chunk_id = 0
        self._limits: list[int | None] = [None] * n_ds
        if source.num_epochs is not None:  # cursor k is valid while lane + k*C < E*N_d
            ends = [source.num_epochs * n for n in source.lengths]
            self._limits = [max(0, -(-(end - lane) // num_lanes)) for end in ends]
        self._exhausted = self._all_drained()
        # Caches of pure functions of k (never part of the state).
        per_chunk = [source.chunk_size * w for w in source.weights]
        self._block = [max(64, min(4096, math.ceil(32 * m))) for m in per_chunk]
        self._buf: list[np.ndarray | None] = [None] * n_ds
        self._buf_start = [0] * n_ds
        self._perm: list[tuple[int, KeyedPermutation] | None] = [None] * n_ds

    def _all_drained(self, cursors: Sequence[int] | None = None) -> bool:
        cursors = self._cursors if cursors is None else cursors
        return all(
            w == 0 or (lim is not None and cur >= lim)
            for w, cur, lim in zip(self._src.integer_weights, cursors, self._limits, strict=True)
        )

    # -- rows ------------------------------------------------------------------------------

    def _permutation(self, d: int, epoch: int) -> KeyedPermutation:
        cached = self._perm[d]
        if cached is None or cached[0] != epoch:
            key = derive_seed(self._src.seed, d, epoch)
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
        out = np.empty(size, dtype=np.int64)
        for a, b in zip(cuts[:-1], cuts[1:], strict=True):
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
        size, cursors, limits = self._src.chunk_size, self._cursors, self._limits
        remaining = [
            None if lim is None else lim - cur for cur, lim in zip(cursors, limits, strict=True)
        ]
        active = [
            w > 0 and (r is None or r > 0)
            for w, r in zip(self._src.integer_weights, remaining, strict=True)
        ]
        picks: list[int] = []
        while len(picks) < size and any(active):
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
        self._exhausted = self._all_drained()
        chunk_id = self._next_chunk_id
        self._next_chunk_id += 1
        return WorkChunk(
            lane=self.lane,
            chunk_id=chunk_id,
            components=tuple(picks),
            rows=rows,
            seed=derive_seed(self._seed, self.lane, chunk_id),
        )

    def state_dict(self) -> dict[str, Any]:
        return {
            "version": _STATE_VERSION,
            "next_chunk_id": self._next_chunk_id,
            "cursors": list(self._cursors),
            "swrr": self._swrr.state_dict(),
            "exhausted": self._exhausted,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a position saved by :meth:`state_dict` (O(1), nothing is replayed).

        Raises:
            CorruptCheckpoint: the state is malformed or does not fit this source.
        """
        where = f"StaticMixtureLane lane={self.lane}"
        if not isinstance(state, Mapping):
            raise CorruptCheckpoint(f"{where}: state must be a dict, got {type(state).__name__}")
        if set(state) != _STATE_KEYS:
            raise CorruptCheckpoint(
                f"{where}: state keys {sorted(map(str, state))} != expected {sorted(_STATE_KEYS)}"
            )
        version, next_id = state["version"], state["next_chunk_id"]
        cursors, exhausted = state["cursors"], state["exhausted"]
        if version != _STATE_VERSION or not _is_int(version):
            raise CorruptCheckpoint(f"{where}: state version {version!r}, expected 1")
        if not _is_int(next_id) or next_id < 0:
            raise CorruptCheckpoint(f"{where}: next_chunk_id must be an int >= 0, got {next_id!r}")
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
        consumed, size = sum(int(c) for c in cursors), self._src.chunk_size
        fits = consumed == next_id * size or (
            exhausted and (next_id - 1) * size < consumed < next_id * size
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
        self._swrr.load_state_dict(state["swrr"])  # validates before changing anything
        self._cursors = [int(c) for c in cursors]
        self._next_chunk_id = int(next_id)
        self._exhausted = exhausted
