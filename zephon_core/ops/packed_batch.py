"""What a batch of packed rows tells the model: labels, positions, attention.

A packed row holds several documents (or fragments of them) back to back. Trained as
one sequence, attention and next-token labels would cross from one document into the
next. So, for packed rows, ``batch`` emits (key by key):

* ``input_ids`` [B, L] int64 -- the tokens, ``pad_id`` after the row's last segment;
* ``labels`` [B, L] int64 -- the tokens, with ``-100`` on padding **and on the first
  token of every segment** (HF causal LMs shift labels inside the model: that token
  would otherwise be predicted from the previous document's last token);
* ``position_ids`` [B, L] int64 -- restarting at 0 at every segment; a row's padding
  counts as one more segment (0, 1, ...), so no real token ever attends to it;
* and, by ``attention``:

  - ``"position_ids"`` (default): no ``attention_mask``. Transformers (5.x) then
    derives a per-document causal mask from the restarting ``position_ids`` for
    eager, SDPA and flex attention -- **but only when no KV cache is built**: pass
    ``use_cache=False`` (the Zephon HF and Lightning integrations set
    ``config.use_cache = False`` for you, ``zephon_integrations/packed_cache.py``).
    Flash-attention reads the same boundaries from ``position_ids`` for a single
    row; with ``flash_kwargs=True`` the batch also carries ``cu_seq_lens_q/k``
    (int32, cumulative segment boundaries over the flattened ``B * L`` tokens, each
    row's padding one more segment) and ``max_length_q/k``, as
    ``DataCollatorWithFlattening`` produces them, which the varlen kernels use for
    any batch size.
  - ``"mask_4d"``: ``attention_mask`` [B, 1, L, L], additive (0 where a token may
    attend, the dtype's minimum elsewhere), block-diagonal and causal; used as is by
    eager and SDPA attention whatever the cache. Costs ``B * L * L`` values per batch
    (large for long rows; built in the training process, not shipped by workers).
  - ``"mask_2d"``: the padding-only ``attention_mask`` [B, L] and ``segment_ids``
    [B, L] (1..n per segment, 0 on padding), for models that take segment ids
    themselves. Transformers models attend across documents with it.

Rows that are not packed get a padding ``attention_mask`` [B, L] and ``labels`` with
``-100`` on padding, which every attention implementation honours.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["ATTENTION_MODES", "MASK_DTYPES", "packed_fields"]

ATTENTION_MODES = ("position_ids", "mask_4d", "mask_2d")
MASK_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def packed_fields(
    ids: np.ndarray,
    lens: np.ndarray,
    seglens: list[np.ndarray],
    attention: str,
    mask_dtype: str,
    flash_kwargs: bool,
) -> dict:
    """The tensors of a packed batch (see the module docstring); ``ids`` [B, L] int64 is
    padded after each row's ``lens[r]`` tokens, ``seglens[r]`` holds row ``r``'s segment
    lengths. Written row by row and segment by segment: a few slices per document cost
    less than full-size boolean masks (a batch holds few documents, many tokens)."""
    b, width = ids.shape
    ramp = np.arange(width, dtype=np.int64)
    pos = np.empty((b, width), dtype=np.int64)
    labels = ids.copy()
    segs = [seg.tolist() for seg in seglens]
    for r, row_segs in enumerate(segs):
        prow, lrow, at = pos[r], labels[r], 0
        for n in row_segs:
            prow[at : at + n] = ramp[:n]
            if n:
                lrow[at] = -100  # the first token of every segment
            at += n
        # padding counts as one more document (positions 0, 1, ... after the last segment)
        prow[at:] = ramp[: width - at]
        lrow[at:] = -100
    out = {
        "input_ids": torch.from_numpy(ids),
        "labels": torch.from_numpy(labels),
        "position_ids": torch.from_numpy(pos),
    }
    if attention == "mask_2d":
        real = ramp[None, :] < lens[:, None]
        seg = _segment_ids(pos)
        seg[~real] = 0  # padding: segment 0
        out["attention_mask"] = torch.from_numpy(real.astype(np.int64))
        out["segment_ids"] = torch.from_numpy(seg)
    elif attention == "mask_4d":
        out["attention_mask"] = _block_causal(pos, MASK_DTYPES[mask_dtype])
    if flash_kwargs:
        out.update(_flash_kwargs(segs, lens, width))
    return out


def _segment_ids(pos: np.ndarray) -> np.ndarray:
    """1..n per segment (the padding tail is one more)."""
    return np.cumsum(pos == 0, axis=1)


def _block_causal(pos: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    seg = torch.from_numpy(_segment_ids(pos))
    width = seg.shape[1]
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    allowed = (seg[:, :, None] == seg[:, None, :]) & causal
    mask = torch.zeros(allowed.shape, dtype=dtype)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[:, None]


def _flash_kwargs(seglens: list[list[int]], lens: np.ndarray, width: int) -> dict:
    lengths: list[int] = []
    for row, segs in enumerate(seglens):
        lengths.extend(int(x) for x in segs)
        pad = width - int(lens[row])
        if pad:
            lengths.append(pad)
    cu = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=cu[1:])
    cu_t = torch.from_numpy(cu)
    longest = max(lengths)
    return {
        "cu_seq_lens_q": cu_t,
        "cu_seq_lens_k": cu_t.clone(),
        "max_length_q": longest,
        "max_length_k": longest,
    }
