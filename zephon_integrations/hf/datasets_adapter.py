"""Hugging Face ``datasets`` as StaticMixtureWorkSource components.

``Dataset`` objects, ``DatasetDict`` splits and ``load_from_disk`` paths become
random-access components. Each fetch is one batched Arrow read per dataset per
chunk: ``table.take(rows)`` on the underlying Arrow table when the dataset has no
indices mapping and plain Python formatting (the fast path), else the dataset's own
``__getitems__``, which honours any format. Selected columns are respected either
way. A streaming ``IterableDataset`` cannot be read at random positions and is
refused with what to do instead.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from zephon_core import ConfigError


class HFComponent:
    """A ``datasets.Dataset`` read with one batched Arrow read per call."""

    def __init__(self, ds: Any, columns: Sequence[str] | None = None):
        self.ds = ds
        self._full = ds  # every column, for column_values (lengths= of token mixtures)
        fmt = getattr(ds, "format", None) or {}
        names = list(ds.column_names)
        wanted = list(columns) if columns is not None else fmt.get("columns")
        if wanted is not None:
            unknown = sorted(set(wanted) - set(names))
            if unknown:
                raise ConfigError(f"columns {unknown} are not in the dataset (it has {names})")
        self.columns = list(wanted) if wanted is not None else None
        self.fast = (
            getattr(ds, "_indices", None) is None
            and fmt.get("type") is None
            and not fmt.get("output_all_columns", False)
        )
        if self.fast:
            table = ds.data.table
            self.table = table.select(self.columns) if self.columns is not None else table
        elif self.columns is not None and columns is not None:
            self.ds = ds.select_columns(self.columns)

    def __len__(self) -> int:
        return len(self.ds)

    def zephon_fingerprint(self) -> str:
        """The dataset's own content fingerprint (``Dataset._fingerprint``, which changes
        with every transform and with the files it was loaded from) and the columns read;
        a checkpoint restores only over the same one."""
        return f"{self.ds._fingerprint}:{self.columns}"

    def column_values(self, name: str) -> Any:
        """One whole column as a numpy array, read through Arrow without building row
        dicts (``StaticMixtureWorkSource(lengths="num_tokens")``), also a column that is
        not among the ``columns`` read for training."""
        if name not in self._full.column_names:
            raise KeyError(name)
        return self._full.select_columns([name]).with_format("numpy")[name]

    def __getitems__(self, rows: list[int]) -> list[Any]:
        if self.fast:
            return self.table.take(rows).to_pylist()
        return self.ds.__getitems__(list(rows))

    def __getitem__(self, row: int) -> Any:
        return self.__getitems__([row])[0]


def hf_component(
    obj: Any, split: str | None = None, columns: Sequence[str] | None = None
) -> HFComponent:
    """One component from a Dataset, a DatasetDict (with ``split``) or a saved path."""
    import datasets

    if isinstance(obj, (str, os.PathLike)):
        obj = datasets.load_from_disk(os.fspath(obj))
    if isinstance(obj, (datasets.IterableDataset, datasets.IterableDatasetDict)):
        raise ConfigError(
            "a streaming IterableDataset cannot be read at random positions, which exact "
            "resume needs; load it without streaming=True (load_dataset(..., streaming=False) "
            "memory-maps it from disk), or materialize it once with "
            "Dataset.from_generator(...).save_to_disk(path) and pass that path"
        )
    if isinstance(obj, datasets.DatasetDict):
        if split is None:
            raise ConfigError(f"a DatasetDict needs split=...; it has {sorted(obj)}")
        if split not in obj:
            raise ConfigError(f"split {split!r} is not in the DatasetDict (it has {sorted(obj)})")
        obj = obj[split]
    if not isinstance(obj, datasets.Dataset):
        raise ConfigError(
            f"expected a datasets.Dataset, DatasetDict or a load_from_disk path, "
            f"got {type(obj).__name__}"
        )
    return HFComponent(obj, columns)


def hf_components(
    sources: Mapping[str, Any], split: str | None = None, columns: Sequence[str] | None = None
) -> dict[str, HFComponent]:
    """Components for ``StaticMixtureWorkSource(datasets=...)``, keeping the mapping order.

    Example::

        src = StaticMixtureWorkSource(hf_components({"prose": "data/prose", "code": code_ds},
                                                    split="train", columns=["text"]),
                                      {"prose": 0.7, "code": 0.3})
    """
    return {name: hf_component(obj, split, columns) for name, obj in sources.items()}
