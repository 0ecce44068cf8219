"""A collated token batch before its tensors are built: what crosses a worker's pipe.

Why: the tensors of a packed batch (``packed_batch.py``) are five int64 [B, L] arrays
(or a [B, 1, L, L] mask) derived from the tokens and each row's segment lengths. A
DataLoader worker that built them would ship ~10x the bytes of the tokens (655 KB per
8 x 2048 batch) through its pipe and spend its own time building them. So in a worker
``batch`` emits this instead -- the tokens in int32 where they fit, and the lengths --
and the training process builds the tensors (``build``) right before handing the batch
out: the same function builds them in-process, so both paths give identical tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .packed_batch import packed_fields

__all__ = ["TokenBatch", "wire_dtype"]

_NARROW = {np.dtype(t) for t in ("int8", "int16", "int32", "uint8", "uint16")}


def wire_dtype(tokens: np.ndarray, pad_id: int) -> type:
    """int32 when every token (and the pad id) fits without a check, else int64."""
    fits = tokens.dtype in _NARROW and -(2**31) <= pad_id < 2**31
    return np.int32 if fits else np.int64


@dataclass
class TokenBatch:
    """Rows of tokens, padded to one width, and what the model must be told about them.

    ``ids`` [B, L] (int32 or int64), ``lens`` [B] real tokens per row (a prefix of each
    row), ``seglens`` each packed row's segment lengths (None: rows are not packed).
    """

    ids: np.ndarray
    lens: np.ndarray
    seglens: list[np.ndarray] | None
    attention: str
    mask_dtype: str
    flash_kwargs: bool

    def build(self) -> dict[str, torch.Tensor]:
        """The batch's tensors (``batch.py``'s module docstring says what each holds)."""
        ids = self.ids.astype(np.int64, copy=False)
        if self.seglens is not None:
            return packed_fields(
                ids, self.lens, self.seglens, self.attention, self.mask_dtype, self.flash_kwargs
            )
        maskb = np.arange(ids.shape[1])[None, :] < self.lens[:, None]
        return {
            "input_ids": torch.from_numpy(ids),
            "labels": torch.from_numpy(np.where(maskb, ids, -100)),
            "attention_mask": torch.from_numpy(maskb.astype(np.int64)),
        }

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays this batch ships (the tensors it builds are larger)."""
        seg = sum(s.nbytes for s in self.seglens) if self.seglens is not None else 0
        return self.ids.nbytes + self.lens.nbytes + seg
