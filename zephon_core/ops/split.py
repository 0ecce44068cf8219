"""split: token sequences longer than ``max_len`` become children of <= max_len tokens,
optionally framed by ``bos_id`` / ``eos_id`` first (one per document, not per child).

``bos_id`` / ``eos_id`` are checked when the pipeline is described: token ids below
:data:`MAX_TOKEN_ID` (2**31 - 1; no vocabulary comes near it, so a larger id is a
mistake -- a byte count, a hash). A document whose token array is too narrow for them
(uint8 bytes and ``eos_id=256``) is framed in the smallest dtype that holds both."""

from __future__ import annotations

import numpy as np

from ..errors import ConfigError
from ..records import Contributor, Record, SampleCursor
from ..validate import int_arg
from .base import Operator, OpTraits, token_array

#: the largest token id split accepts for bos_id / eos_id (int32's maximum)
MAX_TOKEN_ID = 2**31 - 1

#: builds a named tuple from a tuple without its Python-level constructor (hot path)
_new = tuple.__new__


class SplitOp(Operator):
    """Cuts ``payload[key]`` into consecutive fragments of at most ``max_len`` tokens.

    Child ``i`` gets cursor ``(lane, chunk, offset, i)``; the last child carries
    ``is_last_child``. Other numpy arrays of the same length as ``payload[key]``
    are cut alongside; every other payload value is copied to each child.
    Every output's contributor records its token count (used by mixture stats).
    """

    traits = OpTraits(preserves_cursor_order=True, stateless=True)

    def __init__(
        self,
        max_len: int,
        key: str = "input_ids",
        parallelism: int = 1,
        name: str = "split",
        bos_id: int | None = None,
        eos_id: int | None = None,
    ):
        max_len = int_arg("max_len", max_len, minimum=1, where="split")
        ids = {"minimum": 0, "maximum": MAX_TOKEN_ID, "allow_none": True, "where": "split"}
        self.bos_id = int_arg("bos_id", bos_id, **ids)
        self.eos_id = int_arg("eos_id", eos_id, **ids)
        self.max_len = max_len
        self.key = key
        self.parallelism = parallelism
        self.name = name

    def process(self, record: Record) -> list[Record]:
        payload = record.payload
        tokens = token_array(self, record, self.key)
        if len(record.contributors) != 1 or record.cursor.child != 0:
            raise ConfigError(
                f"split: record {tuple(record.cursor)} is already a fragment or a merged "
                "record; put split() before pack() and use it once"
            )
        chunk_id, offset, _, _, component, _ = record.contributors[0]
        if self.bos_id is not None or self.eos_id is not None:
            payload, tokens = self._framed(record, payload, tokens)
        n = len(tokens)
        max_len = self.max_len
        if n <= max_len:  # most documents: one child, the record itself with its count
            contributor = _new(Contributor, (chunk_id, offset, 0, True, component, n))
            return [Record(payload, record.cursor, [contributor])]
        lane = record.cursor.lane
        last = (n - 1) // max_len
        key = self.key
        sliced = [k for k, v in payload.items() if k != key and _per_token(v, n)]
        out = []
        for i in range(last + 1):
            lo, hi = i * max_len, min(n, (i + 1) * max_len)
            child = dict(payload)
            child[key] = tokens[lo:hi]
            for k in sliced:
                child[k] = payload[k][lo:hi]
            out.append(
                Record(
                    child,
                    _new(SampleCursor, (lane, chunk_id, offset, i)),
                    [_new(Contributor, (chunk_id, offset, i, i == last, component, hi - lo))],
                )
            )
        return out

    def _framed(self, record: Record, payload: dict, tokens):
        """The document with ``bos_id`` before and ``eos_id`` after its tokens (a packed
        row then shows the model where each document ends, as pretraining data does)."""
        n = len(tokens)
        side = [k for k, v in payload.items() if k != self.key and _per_token(v, n)]
        if side:
            raise ConfigError(
                f"split(bos_id=/eos_id=): the record at {tuple(record.cursor)} carries "
                f"per-token arrays {side} that the inserted tokens would misalign; add the "
                "special tokens in your tokenize map instead"
            )
        tokens = np.asarray(tokens)
        if tokens.dtype.kind not in "iu":  # empty (token_array refuses other floats)
            tokens = tokens.astype(np.int64)
        special = [t for t in (self.bos_id, self.eos_id) if t is not None]
        dtype, info = tokens.dtype, np.iinfo(tokens.dtype)
        if not all(info.min <= t <= info.max for t in special):  # widen only when needed
            dtype = np.result_type(dtype, *(np.min_scalar_type(t) for t in special))
        parts = ([self.bos_id] if self.bos_id is not None else [], tokens)
        parts += ([self.eos_id] if self.eos_id is not None else [],)
        framed = np.concatenate([np.asarray(p, dtype=dtype) for p in parts])
        return {**payload, self.key: framed}, framed

    def describe(self) -> dict:
        out = {"op": "split", "name": self.name, "max_len": self.max_len, "key": self.key}
        # only when set: fingerprints of pipelines without them stay as they were
        if self.bos_id is not None:
            out["bos_id"] = self.bos_id
        if self.eos_id is not None:
            out["eos_id"] = self.eos_id
        return out


def _per_token(value: object, n: int) -> bool:
    """An array with one entry per token (cut alongside the tokens)."""
    return hasattr(value, "shape") and hasattr(value, "__len__") and len(value) == n
