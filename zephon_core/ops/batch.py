"""batch: collates a lane's records into dicts of torch tensors.

Token payloads (``payload[key]``) become ``input_ids`` int64 [B, L] and ``labels``
(-100 on padding); rows that are not packed get a padding ``attention_mask``, packed
rows what ``packed_batch.py`` describes key by key (labels masked at every document
start, ``position_ids`` restarting per document, per-document attention the way
Transformers models honour it). Other payloads go through torch's default collate.

``drop_last=True`` keeps a partial batch across a flush -- the one stall the
pipeline allows (the ``holds_across_flush`` trait), made safe by the replay filter
sitting right before batch -- and drops it only at the end of the stream.
``drop_last=False`` emits the partial batch at every flush. A batch record takes the
cursor of its last member, which is what the replay filter matches on resume.

``provenance=True`` adds ``provenance``: the segments that make up each row
(``batch_provenance.py``).
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import torch
from torch.utils.data import default_collate

from ..digests.value_digest import Deferred
from ..errors import ConfigError, PipelineError
from ..records import Record
from ..validate import bool_arg, int_arg
from .base import OpContext, Operator, OpTraits, check_tokens
from .batch_provenance import OriginTable, record_segments, segments_array
from .pack import PackOp
from .packed_batch import ATTENTION_MODES, MASK_DTYPES
from .split import SplitOp
from .token_batch import TokenBatch, tensors


class BatchOp(Operator):
    traits = OpTraits(preserves_cursor_order=True, stateless=False, holds_across_flush=True)

    def __init__(
        self,
        batch_size: int,
        drop_last: bool = True,
        seq_len: int | None = None,
        pad_to: str = "max",
        pad_id: int = 0,
        key: str = "input_ids",
        name: str = "batch",
        attention: str = "position_ids",
        mask_dtype: str = "float32",
        flash_kwargs: bool = False,
        provenance: bool = False,
    ):
        batch_size = int_arg("batch_size", batch_size, minimum=1, where="batch")
        drop_last = bool_arg("drop_last", drop_last, where="batch")
        if pad_to not in ("max", "longest"):
            raise ConfigError(f"batch(pad_to={pad_to!r}): use 'max' (pad to seq_len) or 'longest'")
        seq_len = int_arg("seq_len", seq_len, minimum=1, where="batch", allow_none=True)
        pad_id = int_arg("pad_id", pad_id, where="batch")
        if attention not in ATTENTION_MODES:
            raise ConfigError(f"batch(attention={attention!r}): use one of {ATTENTION_MODES}")
        if mask_dtype not in MASK_DTYPES:
            raise ConfigError(f"batch(mask_dtype={mask_dtype!r}): use one of {list(MASK_DTYPES)}")
        self.attention = attention
        self.mask_dtype = mask_dtype
        self.flash_kwargs = bool_arg("flash_kwargs", flash_kwargs, where="batch")
        #: add ``provenance`` (``batch_provenance.py``); not in ``describe()``: it changes
        #: no other value and no position, so a checkpoint resumes with it on or off
        self.provenance = bool_arg("provenance", provenance, where="batch")
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.seq_len = seq_len
        self.pad_to = pad_to
        self.pad_id = pad_id
        self.key = key
        self.name = name
        self._buf: list[Record] = []
        self._segs: list[list[tuple]] = []  # with provenance: each buffered row's segments
        #: the lane's chunks (set on a lane's instance when provenance is on)
        self.origins: OriginTable | None = None
        #: emit a TokenBatch (tensors built by the consumer); set on a worker's last op
        self.compact = False
        # counters of this lane's instance (the instance lives for the whole run)
        self.rows = self.pad_tokens = self.total_tokens = 0

    def bind(self, ctx: OpContext) -> None:
        super().bind(ctx)
        self._width = self.seq_len
        packs = [op for op in ctx.upstream if isinstance(op, PackOp)]
        if self._width is None and self.pad_to == "max":
            self._width = packs[-1].seq_len if packs else None
        #: rows are packed documents (the model must be told where each one starts)
        self.packed = bool(packs)
        splits = [op for op in ctx.upstream if isinstance(op, SplitOp) and op.key == self.key]
        #: fragment ``i`` of a document starts at token ``i * max_len`` (provenance)
        self._split_len = splits[-1].max_len if splits else None

    @property
    def width(self) -> int | None:
        """Every row's length, when fixed (``seq_len``, or an upstream ``pack``'s with
        ``pad_to="max"``); None when rows are padded to the batch's longest."""
        return self._width if self.pad_to == "max" else None

    def for_lane(self, lane: int) -> BatchOp:
        new = copy.copy(self)  # cheaper than the default deep copy
        new.ctx = dataclasses.replace(self.ctx, lane=lane)
        new._buf = []
        new._segs = []
        new.origins = None
        new.rows = new.pad_tokens = new.total_tokens = 0
        return new

    def process(self, record: Record) -> list[Record]:
        buf = self._buf
        buf.append(record)
        if self.provenance:  # now: after a flush the lane forgets the record's chunk
            self._segs.append(self._segments(record))
        if len(buf) < self.batch_size:
            return []
        self._buf = []
        return [self._collate(buf)]

    def flush(self) -> list[Record]:
        buf = self._buf
        if not buf or self.drop_last:
            return []  # drop_last: the partial batch stalls across the flush
        self._buf = []
        return [self._collate(buf)]

    def finish(self) -> list[Record]:
        buf, self._buf = self._buf, []
        if not buf:
            return []
        if self.drop_last:
            self._segs = []
            return [r.to_tombstone() for r in buf]
        return [self._collate(buf)]

    def _segments(self, record: Record) -> list[tuple]:
        if self.origins is None:
            raise PipelineError(
                f"{self.name}(provenance=True) runs outside a lane (no origin table); "
                "iterate the pipeline instead of calling the operator"
            )
        payload = record.payload
        tokens = payload.get(self.key) if isinstance(payload, dict) else None
        length = None if tokens is None else len(tokens)
        return record_segments(self.name, record, length, self.origins, self._split_len)

    def _provenance(self) -> np.ndarray | None:
        if not self.provenance:
            return None
        segs, self._segs = self._segs, []
        return segments_array(segs)

    def held(self) -> list[Record]:
        return list(self._buf)

    def _collate(self, records: list[Record]) -> Record:
        contributors = []
        for r in records:
            contributors.extend(r.contributors)
        payloads = [r.payload for r in records]
        first = payloads[0]
        if isinstance(first, dict) and self.key in first:
            payload = self._collate_tokens(records)
        else:
            payload = default_collate(payloads)
            provenance = self._provenance()
            if provenance is not None:
                if not isinstance(payload, dict):
                    raise ConfigError(
                        f"{self.name}(provenance=True) adds a key to the batch, but these "
                        f"records collate to a {type(payload).__name__}: emit dicts"
                    )
                payload["provenance"] = torch.from_numpy(provenance)
        # the last member is what the replay filter finds on resume: its digest lets it
        # check values, not only the position (computed when a state is taken)
        last = records[-1]
        return Record(payload, last.cursor, contributors, Deferred(last.payload))

    def _collate_tokens(self, records: list[Record]) -> dict:
        key = self.key
        payloads = [r.payload for r in records]
        last = records[-1]
        seqs = [p[key] for p in payloads]
        lengths = [len(s) for s in seqs]
        width = self._width if self.pad_to == "max" and self._width else max(lengths)
        if max(lengths) > width:
            raise ConfigError(
                f"batch: a row of {max(lengths)} tokens (batch ending at cursor "
                f"{tuple(last.cursor)}) exceeds seq_len={width}; add split()/pack() with "
                "that length or raise seq_len"
            )
        b = len(seqs)
        lens = np.asarray(lengths, dtype=np.int64)
        packed = "segment_lengths" in payloads[0]
        seglens = [p["segment_lengths"] for p in payloads] if packed else None
        fast = not self.compact and _same_int_rows(seqs)
        if not fast:
            try:
                joined = np.concatenate(seqs) if b > 1 else np.asarray(seqs[0])
            except ValueError:  # arrays of different dimensions
                joined = np.zeros((0, 0))
            if joined.dtype.kind not in "iu" or joined.ndim != 1:  # floats: truncated silently
                check_tokens(self, records, key, joined)
        n_tokens = sum(lengths)
        self.rows += b
        self.total_tokens += b * width
        self.pad_tokens += b * width - n_tokens
        if fast:  # in-process: the rows go straight into the tensors (one copy, not two)
            out = tensors(
                seqs, lens, width, self.pad_id, seglens, self.attention, self.mask_dtype,
                self.flash_kwargs,
            )  # fmt: skip
            provenance = self._provenance()
            if provenance is not None:
                out["provenance"] = torch.from_numpy(provenance)
            return out
        tb = TokenBatch(
            joined,
            lens,
            width,
            self.pad_id,
            seglens,
            self.attention,
            self.mask_dtype,
            self.flash_kwargs,
            self._provenance(),
        )
        # in a DataLoader worker the training process builds the tensors (token_batch.py)
        return tb.for_wire() if self.compact else tb.build()

    def describe(self) -> dict:
        return {
            "op": "batch",
            "name": self.name,
            "batch_size": self.batch_size,
            "drop_last": self.drop_last,
            "seq_len": self.seq_len,
            "pad_to": self.pad_to,
            "pad_id": self.pad_id,
            "key": self.key,
        } | (
            {
                "attention": self.attention,
                "mask_dtype": self.mask_dtype,
                "flash_kwargs": self.flash_kwargs,
            }
            if getattr(self, "packed", False)
            else {}
        )


def _same_int_rows(seqs: list) -> bool:
    """All rows 1-D integer arrays of one dtype: the values their concatenation would hold
    (anything else takes the concatenating path, which names what is wrong)."""
    first = seqs[0]
    if type(first) is not np.ndarray:
        return False
    dtype = first.dtype
    if dtype.kind not in "iu":
        return False
    for s in seqs:
        if type(s) is not np.ndarray or s.dtype != dtype or s.ndim != 1:
            return False
    return True
