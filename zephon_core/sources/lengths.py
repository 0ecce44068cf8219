"""Document lengths in tokens, known before fetch: what token-weighted mixing needs.

Three ways, per component:

* a sequence of ints (``lengths={"code": n_tokens_per_row}``);
* a column name (``lengths="num_tokens"``) read once: through the dataset's
  ``column_values(name)`` if it has one (``hf_component``), an HF ``Dataset`` through
  its numpy format (Arrow, no row dicts), any other dataset row by row;
* nothing: the pipeline *estimates* them when it compiles, running its own
  fetch/tokenize operators on a seeded sample of rows (``engine/length_estimate.py``).
  A component no larger than the sample is measured completely (exact lengths);
  otherwise each of its documents counts as the sample's mean.

Lengths enter the checkpoint fingerprint as a digest (:func:`lengths_digest`), so a
restore under other lengths (another tokenizer) is refused unless allowed.

Given lengths are checked: a null or fractional count names its row. A document of 0
tokens still takes a slot, so it counts as 1. A weighted dataset whose lengths are all
0 is refused: every document would count as 1 token and the dataset would take nearly
all the documents to reach its token share (a column that was never filled in). At
:data:`ZERO_SHARE_WARN` or more zeros a warning names the dataset: true empty documents
keep the shares exact, but so many are rare in training data, and if the zeros are
missing values the dataset takes up to ``1 / (1 - zeros)`` times its documents -- from
10 % on, more than a tenth off its share.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import ConfigError

__all__ = ["ComponentLengths", "resolve_lengths", "lengths_digest"]

#: the share of zero lengths in a weighted dataset from which a warning names it
ZERO_SHARE_WARN = 0.1

log = logging.getLogger(__name__)


class ComponentLengths:
    """One component's lengths: per row (``per_row``) or one mean for every row."""

    __slots__ = ("per_row", "mean", "how")

    def __init__(self, per_row: np.ndarray | None = None, mean: int | None = None, how: str = ""):
        self.per_row = per_row
        self.mean = mean
        self.how = how  # "given", "column:<name>", "measured", "estimated(<n> rows)"

    def of(self, row: int) -> int:
        return int(self.per_row[row]) if self.per_row is not None else int(self.mean)

    def max(self) -> int:
        return int(self.per_row.max()) if self.per_row is not None else int(self.mean)

    def average(self) -> float:
        return float(self.per_row.mean()) if self.per_row is not None else float(self.mean)


def _as_lengths(
    name: str, values: Any, n: int, how: str, weighted: bool = True
) -> ComponentLengths:
    what = f"lengths of dataset {name!r}" + (f" ({how})" if how != "given" else "")
    try:
        arr = np.asarray(values)
    except Exception as e:  # noqa: BLE001 - named below
        raise ConfigError(f"{what}: not a sequence of ints ({e})") from e
    if arr.ndim != 1 or len(arr) != n:
        raise ConfigError(f"{what}: {arr.shape} values for {n} rows; give one token count per row")
    if arr.dtype.kind in "fO":
        _check_whole(arr, what)
    elif arr.dtype.kind not in "iu":
        raise ConfigError(f"{what}: dtype {arr.dtype}; give integer token counts")
    arr = arr.astype(np.int64)
    if n and arr.min() < 0:
        row = int(np.argmin(arr))
        raise ConfigError(f"{what}: row {row} has a negative token count {int(arr[row])}")
    if n and weighted:
        _check_zeros(arr, what)
    # a document of 0 tokens still takes a slot: count it as 1 so deficits move
    return ComponentLengths(np.maximum(arr, 1), how=how)


def _check_whole(arr: np.ndarray, what: str) -> None:
    """Float or object lengths must all be whole numbers; name the first row that is not
    (a null in an Arrow column arrives as NaN, in a list as None)."""
    if arr.dtype.kind == "f":  # vectorized: a column can hold many millions of rows
        bad = np.isnan(arr)
        if not bad.any():
            bad = ~np.isfinite(arr) | (arr != np.round(arr))
        if not bad.any():
            return
        arr = arr[: int(np.argmax(bad)) + 1]
    for row, v in enumerate(arr.tolist()):
        number = isinstance(v, (int, float, np.number)) and not isinstance(v, (bool, np.bool_))
        if v is None or (number and v != v):
            raise ConfigError(
                f"{what}: row {row} is null; give every row a token count (or drop the row)"
            )
        ok = number and np.isfinite(v) and float(v).is_integer()
        if not ok:
            raise ConfigError(f"{what}: row {row} is {v!r}, not a whole token count")


def _check_zeros(arr: np.ndarray, what: str) -> None:
    zeros = int(np.count_nonzero(arr == 0))
    if zeros == len(arr):
        raise ConfigError(
            f"{what}: all {zeros} token counts are 0, so every document would count as 1 "
            "token and this dataset would take nearly every document to reach its token "
            "share; fill in the column (or pass lengths=None to have the pipeline measure them)"
        )
    if zeros >= ZERO_SHARE_WARN * len(arr):
        first = np.flatnonzero(arr == 0)[:5].tolist()
        log.warning(
            "%s: %d of %d token counts are 0 (rows %s, ...). Each counts as 1 token; if they "
            "are missing values, not empty documents, this dataset takes more documents "
            "than its token share",
            what,
            zeros,
            len(arr),
            first,
        )


def _column(name: str, ds: Any, column: str, n: int, weighted: bool = True) -> ComponentLengths:
    try:
        if hasattr(ds, "column_values"):  # e.g. zephon_integrations.hf.HFComponent
            values = ds.column_values(column)
        elif hasattr(ds, "with_format") and hasattr(ds, "column_names"):  # HF Dataset
            if column not in ds.column_names:
                raise KeyError(column)
            values = ds.select_columns([column]).with_format("numpy")[column]
        else:
            values = [row[column] for row in (ds[i] for i in range(n))]
    except (KeyError, TypeError, IndexError) as e:
        raise ConfigError(
            f"lengths={column!r}: dataset {name!r} has no column {column!r} to read token "
            f"counts from ({type(e).__name__}: {e}); add the column or pass lengths as numbers"
        ) from e
    return _as_lengths(name, values, n, f"column:{column}", weighted)


def resolve_lengths(
    spec: Any,
    names: Sequence[str],
    datasets: Sequence[Any],
    sizes: Sequence[int],
    weighted: Sequence[bool] | None = None,
) -> list[ComponentLengths | None]:
    """Per component: its lengths, or ``None`` where the pipeline must estimate them.
    ``weighted``: which components ever have a weight > 0 (default: all); only their
    zero lengths are refused or warned about."""
    if spec is None:
        return [None] * len(names)
    flags = list(weighted) if weighted is not None else [True] * len(names)
    if isinstance(spec, str):
        return [
            _column(n, d, spec, s, w)
            for n, d, s, w in zip(names, datasets, sizes, flags, strict=True)
        ]
    if isinstance(spec, Mapping):
        unknown = [k for k in spec if k not in names]
        if unknown:
            raise ConfigError(f"lengths given for unknown datasets {unknown!r}; known: {names!r}")
        per = [spec.get(n) for n in names]
    elif isinstance(spec, (list, tuple)) and len(spec) == len(names):
        per = list(spec)
    else:
        raise ConfigError(
            "lengths must be a column name, {name: per-row token counts | column name | "
            f"None}} or one entry per dataset; got {type(spec).__name__}"
        )
    out: list[ComponentLengths | None] = []
    for n, d, s, v, w in zip(names, datasets, sizes, per, flags, strict=True):
        if v is None:
            out.append(None)
        elif isinstance(v, str):
            out.append(_column(n, d, v, s, w))
        else:
            out.append(_as_lengths(n, v, s, "given", w))
    return out


def lengths_digest(lengths: ComponentLengths) -> str:
    """What the fingerprint keeps of a component's lengths."""
    if lengths.per_row is not None:
        crc = zlib.crc32(np.ascontiguousarray(lengths.per_row, dtype="<i8").tobytes())
        return f"{lengths.how}:rows:{crc:08x}"
    return f"{lengths.how}:mean:{lengths.mean}"
