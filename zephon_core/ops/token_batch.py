"""A collated token batch before its tensors are built: what crosses a worker's pipe.

Why: the tensors of a packed batch (``packed_batch.py``) are several int64 [B, L] arrays
(or a [B, 1, L, L] mask) derived from the tokens and each row's segment lengths. A
DataLoader worker that built them would ship ~10-20x the bytes of the tokens (655 KB per
8 x 2048 batch) through its pipe and spend its own time building them. So in a worker
``batch`` emits this instead -- the rows' real tokens back to back, in the narrowest
integer type that holds them exactly (uint16 for vocabularies under 65,536), and the
lengths -- and the training process builds the tensors (``build``) right before handing
the batch out. In-process ``batch`` hands its rows to :func:`tensors` at once (no
concatenation first); ``build`` cuts the received tokens into the same rows and calls it,
so both paths give identical tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .packed_batch import packed_fields

__all__ = ["TokenBatch", "narrow", "tensors"]


def narrow(tokens: np.ndarray) -> np.ndarray:
    """``tokens`` in uint16 or int32 when every value fits (checked), else unchanged."""
    if tokens.size == 0 or tokens.dtype.itemsize <= 2:
        return tokens
    lo, hi = int(tokens.min()), int(tokens.max())
    if 0 <= lo and hi < 1 << 16:
        return tokens.astype(np.uint16)
    if -(1 << 31) <= lo and hi < 1 << 31 and tokens.dtype.itemsize > 4:
        return tokens.astype(np.int32)
    return tokens


@dataclass
class TokenBatch:
    """Rows of tokens and what the model must be told about them.

    ``tokens`` every row's real tokens back to back (1-D), ``lens`` [B] tokens per row,
    ``width`` the padded row length, ``pad_id``; ``seglens`` each packed row's segment
    lengths (None: rows are not packed); ``provenance`` the rows' segments, int64
    ``[S, 7]`` (``batch_provenance.py``; None: not asked for).
    """

    tokens: np.ndarray
    lens: np.ndarray
    width: int
    pad_id: int
    seglens: list[np.ndarray] | None
    attention: str
    mask_dtype: str
    flash_kwargs: bool
    provenance: np.ndarray | None = None

    def build(self) -> dict[str, torch.Tensor]:
        """The batch's tensors (``batch.py``'s module docstring says what each holds)."""
        out = self._tensors()
        if self.provenance is not None:
            out["provenance"] = torch.from_numpy(self.provenance)
        return out

    def _tensors(self) -> dict[str, torch.Tensor]:
        rows, at, tokens = [], 0, self.tokens
        for n in self.lens.tolist():  # each row's tokens, back to back
            rows.append(tokens[at : at + n])
            at += n
        return tensors(
            rows, self.lens, self.width, self.pad_id, self.seglens,
            self.attention, self.mask_dtype, self.flash_kwargs,
        )  # fmt: skip

    def for_wire(self) -> TokenBatch:
        """This batch with its tokens narrowed for the pipe (values unchanged)."""
        return TokenBatch(
            narrow(self.tokens), self.lens, self.width, self.pad_id, self.seglens,
            self.attention, self.mask_dtype, self.flash_kwargs, self.provenance,
        )  # fmt: skip


def tensors(
    rows: list[np.ndarray],
    lens: np.ndarray,
    width: int,
    pad_id: int,
    seglens: list[np.ndarray] | None,
    attention: str,
    mask_dtype: str,
    flash_kwargs: bool,
) -> dict[str, torch.Tensor]:
    """The tensors of a batch of 1-D integer ``rows`` (``lens[r] == len(rows[r])``), each
    padded with ``pad_id`` to ``width`` (see :class:`TokenBatch` for the rest)."""
    ids = np.empty((len(rows), width), dtype=np.int64)
    for r, row in enumerate(rows):  # each value written once: the row, then its padding
        n = len(row)
        ids[r, :n] = row
        ids[r, n:] = pad_id
    if seglens is not None:
        return packed_fields(ids, lens, seglens, attention, mask_dtype, flash_kwargs)
    maskb = np.arange(width)[None, :] < lens[:, None]
    return {
        "input_ids": torch.from_numpy(ids),
        "labels": torch.from_numpy(np.where(maskb, ids, -100)),
        "attention_mask": torch.from_numpy(maskb.astype(np.int64)),
    }
