"""A collated token batch before its tensors are built: what crosses a worker's pipe.

Why: the tensors of a packed batch (``packed_batch.py``) are several int64 [B, L] arrays
(or a [B, 1, L, L] mask) derived from the tokens and each row's segment lengths. A
DataLoader worker that built them would ship ~10-20x the bytes of the tokens (655 KB per
8 x 2048 batch) through its pipe and spend its own time building them. So in a worker
``batch`` emits this instead -- the rows' real tokens back to back, in the narrowest
integer type that holds them exactly (uint16 for vocabularies under 65,536), and the
lengths -- and the training process builds the tensors (``build``) right before handing
the batch out. In-process the same ``build`` runs at once, so both paths give identical
tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .packed_batch import packed_fields

__all__ = ["TokenBatch", "narrow"]


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
        b = len(self.lens)
        ids = np.full((b, self.width), self.pad_id, dtype=np.int64)
        at = 0
        for r, n in enumerate(self.lens.tolist()):  # each row's tokens are a prefix of it
            ids[r, :n] = self.tokens[at : at + n]
            at += n
        if self.seglens is not None:
            return packed_fields(
                ids, self.lens, self.seglens, self.attention, self.mask_dtype, self.flash_kwargs
            )
        maskb = np.arange(self.width)[None, :] < self.lens[:, None]
        return {
            "input_ids": torch.from_numpy(ids),
            "labels": torch.from_numpy(np.where(maskb, ids, -100)),
            "attention_mask": torch.from_numpy(maskb.astype(np.int64)),
        }

    def for_wire(self) -> TokenBatch:
        """This batch with its tokens narrowed for the pipe (values unchanged)."""
        return TokenBatch(
            narrow(self.tokens), self.lens, self.width, self.pad_id, self.seglens,
            self.attention, self.mask_dtype, self.flash_kwargs, self.provenance,
        )  # fmt: skip
