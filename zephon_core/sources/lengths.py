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
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import ConfigError

__all__ = ["ComponentLengths", "resolve_lengths", "lengths_digest"]


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


def _as_lengths(name: str, values: Any, n: int, how: str) -> ComponentLengths:
    try:
        arr = np.asarray(values)
    except Exception as e:  # noqa: BLE001 - named below
        raise ConfigError(f"lengths of dataset {name!r}: not a sequence of ints ({e})") from e
    if arr.ndim != 1 or len(arr) != n:
        raise ConfigError(
            f"lengths of dataset {name!r}: {arr.shape} values for {n} rows; give one token "
            "count per row"
        )
    if arr.dtype.kind not in "iu" and not (
        arr.dtype.kind == "f" and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr))
    ):
        raise ConfigError(
            f"lengths of dataset {name!r}: dtype {arr.dtype}; give integer token counts"
        )
    arr = arr.astype(np.int64)
    if n and arr.min() < 0:
        raise ConfigError(f"lengths of dataset {name!r}: negative token count {int(arr.min())}")
    # a document of 0 tokens still takes a slot: count it as 1 so deficits move
    return ComponentLengths(np.maximum(arr, 1), how=how)


def _column(name: str, ds: Any, column: str, n: int) -> ComponentLengths:
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
    return _as_lengths(name, values, n, f"column:{column}")


def resolve_lengths(
    spec: Any, names: Sequence[str], datasets: Sequence[Any], sizes: Sequence[int]
) -> list[ComponentLengths | None]:
    """Per component: its lengths, or ``None`` where the pipeline must estimate them."""
    if spec is None:
        return [None] * len(names)
    if isinstance(spec, str):
        return [_column(n, d, spec, s) for n, d, s in zip(names, datasets, sizes, strict=True)]
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
    for n, d, s, v in zip(names, datasets, sizes, per, strict=True):
        if v is None:
            out.append(None)
        elif isinstance(v, str):
            out.append(_column(n, d, v, s))
        else:
            out.append(_as_lengths(n, v, s, "given"))
    return out


def lengths_digest(lengths: ComponentLengths) -> str:
    """What the fingerprint keeps of a component's lengths."""
    if lengths.per_row is not None:
        crc = zlib.crc32(np.ascontiguousarray(lengths.per_row, dtype="<i8").tobytes())
        return f"{lengths.how}:rows:{crc:08x}"
    return f"{lengths.how}:mean:{lengths.mean}"
