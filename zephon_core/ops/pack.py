"""pack: online packing of token fragments into ``bins`` open bins, first fit or best fit.

Exact rules, per lane (one instance per lane; a flush hands the lane a fresh one):

* ``strategy="best_fit"`` (the default): a fragment goes into the bin with the least
  room that still holds it (ties: lowest index), so an empty bin is opened only when no
  partly filled one has room -- the bins a flush emits partly filled are fewer and fuller
  (``benchmarks/bench_padding.py``);
* ``strategy="first_fit"``: into the lowest-index bin with room for it (the default
  before best fit: states written with it name it in their configuration);
* a bin that becomes exactly full is emitted, and its slot is empty again;
* if no bin has room, the fullest bin (ties: lowest index) is emitted and the
  fragment starts a new bin in that slot;
* ``flush`` emits all non-empty bins in slot order, then resets.

A packed record's cursor is its first fragment's; its contributors are all
fragments' contributors. Its payload is ``{key: concatenated tokens,
"segment_lengths": int32 array}`` which ``batch`` turns into position and
segment ids. Zero-length fragments become tombstones.
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np

from ..errors import ConfigError
from ..records import Record
from ..validate import int_arg
from .base import Operator, OpTraits, check_tokens


#: the packing rules ``pack(strategy=)`` accepts (the module docstring states them)
STRATEGIES = ("first_fit", "best_fit")


class _Bin:
    __slots__ = ("fill", "parts", "lens")

    def __init__(self) -> None:
        self.fill = 0
        self.parts: list[Record] = []
        self.lens: list[int] = []  # each part's token count


class PackOp(Operator):
    traits = OpTraits(preserves_cursor_order=False, stateless=False)

    def __init__(
        self,
        seq_len: int,
        bins: int = 8,
        key: str = "input_ids",
        strategy: str = "best_fit",
        name: str = "pack",
    ):
        seq_len = int_arg("seq_len", seq_len, minimum=1, where="pack")
        bins = int_arg("bins", bins, minimum=1, where="pack")
        if strategy not in STRATEGIES:
            raise ConfigError(f"pack(strategy={strategy!r}): use one of {STRATEGIES}")
        self.seq_len = seq_len
        self.bins = bins
        self.key = key
        self.strategy = strategy
        self.name = name
        self._open: list[_Bin] = [_Bin() for _ in range(bins)]

    def for_lane(self, lane: int) -> PackOp:
        new = copy.copy(self)  # cheaper than the default deep copy; only the bins are state
        new.ctx = dataclasses.replace(self.ctx, lane=lane)
        new._open = [_Bin() for _ in range(self.bins)]
        return new

    def _emit(self, b: _Bin) -> Record:
        parts, lens = b.parts, b.lens
        key = self.key
        try:
            tokens = (
                np.concatenate([p.payload[key] for p in parts])
                if len(parts) > 1
                else np.asarray(parts[0].payload[key])
            )
        except ValueError:  # arrays of different dimensions
            tokens = np.zeros((0, 0))
        if tokens.dtype.kind not in "iu" or tokens.ndim != 1:  # one check per emitted bin
            check_tokens(self, parts, key, tokens)
        contributors = []
        for p, n in zip(parts, lens):
            for c in p.contributors:
                contributors.append(c if c[5] else c._replace(n_tokens=n))
        b.fill = 0
        b.parts = []
        b.lens = []
        return Record(
            {key: tokens, "segment_lengths": np.array(lens, dtype=np.int32)},
            parts[0].cursor,
            contributors,
        )

    def _first_fit(self, n: int) -> _Bin | None:
        room = self.seq_len - n
        for b in self._open:
            if b.fill <= room:
                return b
        return None

    def _best_fit(self, n: int) -> _Bin | None:
        room, best, top = self.seq_len - n, None, -1
        for b in self._open:  # the fullest bin that holds n; strict <: ties to the lowest index
            f = b.fill
            if top < f <= room:
                if f == room:
                    return b  # fills it exactly: no fuller bin can hold n
                best, top = b, f
        return best

    def process(self, record: Record) -> list[Record]:
        try:
            n = len(record.payload[self.key])  # ids are checked once per emitted bin
        except (KeyError, TypeError, IndexError) as e:
            raise ConfigError(
                f"pack: payload at cursor {tuple(record.cursor)} has no "
                f"{self.key!r} token array; tokenize with map() first"
            ) from e
        seq_len = self.seq_len
        if n > seq_len:
            raise ConfigError(
                f"pack: fragment of {n} tokens at cursor {tuple(record.cursor)} "
                f"exceeds seq_len={seq_len}; add split(max_len={seq_len}) "
                "before pack()"
            )
        if n == 0:
            return [record.to_tombstone()]
        bins = self._open
        b = self._best_fit(n) if self.strategy == "best_fit" else self._first_fit(n)
        if b is not None:
            b.parts.append(record)
            b.lens.append(n)
            b.fill += n
            return [self._emit(b)] if b.fill == seq_len else []
        fullest = bins[0]
        for other in bins:
            if other.fill > fullest.fill:
                fullest = other
        out = self._emit(fullest)
        fullest.parts.append(record)
        fullest.lens.append(n)
        fullest.fill = n
        return [out] if n < seq_len else [out, self._emit(fullest)]

    def flush(self) -> list[Record]:
        return [self._emit(b) for b in self._open if b.parts]

    def describe(self) -> dict:
        return {
            "op": "pack",
            "name": self.name,
            "seq_len": self.seq_len,
            "bins": self.bins,
            "key": self.key,
            "strategy": self.strategy,
        }
