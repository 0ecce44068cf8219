"""Provenance of a batch's rows: which document pieces make up each row.

``batch(provenance=True)`` adds ``batch["provenance"]``, an int64 tensor
``[num_segments, 7]`` whose columns are :data:`COLUMNS`:

* ``row`` -- the row of the batch (0 .. B-1);
* ``offset`` -- where the segment starts in that row (token index);
* ``dataset`` -- index into the pipeline's ``component_names``;
* ``dataset_row`` -- the row of that dataset the document was read from;
* ``epoch`` -- the dataset epoch the document was drawn in (0 first; -1 when the
  source cannot tell, see ``Source.pointer_epochs``);
* ``token_start``, ``token_end`` -- the segment's token range in the document as
  ``split`` sees it (after the tokenizer map, with split's ``bos_id``/``eos_id``
  framing); a document that is not split is ``0 .. its length``.

Segments are listed row by row, in row order. A packed row has one segment per
document piece, an unpacked (padded) row one. Non-token payloads (default collate)
get one segment per contributor with offset 0 and token range ``0 .. 0``.

Why it is built this way: every operator already owes replay its *contributors* --
``(chunk, offset, child, ..., component, n_tokens)`` per input fragment -- so the
origin of every piece reaches ``batch`` through the contract every operator keeps,
never through a field custom operators would have to learn. The lane keeps an
:class:`OriginTable` of its chunks still in play (dataset row and epoch per pointer);
``batch`` resolves a record's contributors as the record arrives (it may hold the
record across a flush, after which the table forgets that chunk), and the batch ships
one small int64 array -- a few hundred bytes, no Python object per token or document.
Turning it on changes no other tensor and no position of the stream, so it is no part
of the configuration's fingerprint: a checkpoint taken without it resumes with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..chunk import WorkChunk
from ..errors import ContractViolation
from ..records import Record

__all__ = ["COLUMNS", "OriginTable", "record_segments", "segments_array"]

#: the columns of ``batch["provenance"]``
COLUMNS = ("row", "offset", "dataset", "dataset_row", "epoch", "token_start", "token_end")

#: the epoch a source that cannot tell reports
UNKNOWN_EPOCH = -1


class OriginTable:
    """One lane's chunks whose records may still reach ``batch``: the dataset row and
    epoch of each pointer. The lane adds every chunk as it pulls (or replays) it and
    forgets the chunks no record of which can still arrive (``evict_below``)."""

    __slots__ = ("_chunks",)

    def __init__(self) -> None:
        self._chunks: dict[int, tuple[tuple[int, ...], list[int] | None]] = {}

    def add(self, chunk: WorkChunk, epochs: Any) -> None:
        """Remember ``chunk`` with the epoch of each pointer (None: unknown)."""
        if epochs is not None and not isinstance(epochs, list):
            epochs = [int(e) for e in epochs]  # a source's own sequence (numpy, tuple)
        self._chunks[chunk.chunk_id] = (chunk.rows, epochs)

    def evict_below(self, chunk_id: int) -> None:
        """Forget the chunks below ``chunk_id`` (added in increasing id order)."""
        chunks = self._chunks
        while chunks:
            first = next(iter(chunks))
            if first >= chunk_id:
                return
            del chunks[first]

    def origin(self, chunk_id: int, offset: int) -> tuple[int, int]:
        """(dataset row, epoch) of pointer ``offset`` of chunk ``chunk_id``."""
        entry = self._chunks.get(chunk_id)
        if entry is None:
            raise ContractViolation(
                f"provenance: chunk {chunk_id} is no longer known to its lane (an operator "
                "emitted a record after the flush that ended its chunk's epoch)"
            )
        rows, epochs = entry
        return rows[offset], UNKNOWN_EPOCH if epochs is None else epochs[offset]

    def __len__(self) -> int:
        return len(self._chunks)


def record_segments(
    name: str, record: Record, length: int | None, table: OriginTable, max_len: int | None
) -> list[tuple[int, int, int, int, int, int]]:
    """One row's segments without the row column: ``(offset, dataset, dataset_row, epoch,
    token_start, token_end)``. ``length`` is the row's token count (None: no tokens);
    ``max_len`` the upstream ``split``'s (None: documents are not split).

    Raises:
        ContractViolation: the contributors do not account for the row's tokens (a map
            after split that changed lengths, a custom operator that merges records
            without setting each contributor's ``n_tokens``), or a fragment comes from an
            operator other than ``split``.
    """
    cs = record.contributors
    if len(cs) == 1 and not cs[0].n_tokens and length is not None:
        sizes: Sequence[int] = (length,)
    else:
        sizes = [c.n_tokens for c in cs]
        if length is not None and (sum(sizes) != length or 0 in sizes):
            raise ContractViolation(
                f"{name}(provenance=True): the row at cursor {tuple(record.cursor)} holds "
                f"{length} tokens but its contributors account for {list(sizes)}; an "
                "operator between split and batch changed token counts (or merged records "
                "without setting each contributor's n_tokens)"
            )
    out = []
    at = 0
    for c, n in zip(cs, sizes):
        if c.child and max_len is None:
            raise ContractViolation(
                f"{name}(provenance=True): the row at cursor {tuple(record.cursor)} holds "
                f"fragment {c.child} of a document but no split() precedes batch: the "
                "fragment's token range is unknown"
            )
        row, epoch = table.origin(c.chunk_id, c.offset)
        start = c.child * max_len if c.child else 0
        out.append((at if length is not None else 0, c.component, row, epoch, start, start + n))
        at += n
    return out


def segments_array(rows: Sequence[list[tuple[int, ...]]]) -> np.ndarray:
    """``[num_segments, 7]`` int64 from each row's segments (:func:`record_segments`)."""
    flat = [(r, *seg) for r, segs in enumerate(rows) for seg in segs]
    if not flat:
        return np.zeros((0, len(COLUMNS)), dtype=np.int64)
    return np.array(flat, dtype=np.int64)
