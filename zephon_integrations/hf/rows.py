"""ZephonRows: a Zephon stream as the rows an unmodified ``Trainer`` batches again.

The Trainer always builds its own ``DataLoader(batch_size=per_device_train_batch_size)``
and lets accelerate wrap it, so the dataset it is given must yield single rows. Each
Zephon batch is cut into its rows, and the Trainer's loader stacks them back into the
same batch (the pipeline's batch size must equal the Trainer's).

Under ``dispatch_batches=False`` accelerate wraps the dataset in an
``IterableDatasetShard``: every rank iterates it, groups ``num_processes`` batches and
keeps slice ``process_index``. Rather than computing every rank's data on every rank,
a rank serves only its own Zephon lanes in its own slot and a placeholder in the
others -- the shard discards those slots unread.
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from zephon_core import ConfigError


class _NotThisRank:
    """Fills another rank's slot of an ``IterableDatasetShard`` group; never collated."""

    def __repr__(self) -> str:
        return "<zephon: another rank's row>"


NOT_THIS_RANK = _NotThisRank()


@dataclass
class Feed:
    """What this process serves in the current ``train()``.

    Attributes:
        loader: this process's Zephon loader; ``None`` when it reads nothing (a
            dispatching accelerate reads on rank 0 only).
        rows_per_output: rows in one Zephon output (its batch size, or 1 unbatched).
        slots: ranks per ``IterableDatasetShard`` group (1: serve the rows as they come).
        slot: this rank's slot in the group.
        slot_rows: rows per slot (the Trainer's per-device batch size).
        ended: this process's stream ended (a finite pipeline).
        provenance: ``(output number, provenance tensor)`` of the outputs read, taken out
            of them before they are cut into rows (``batch(provenance=True)``); the
            callback keeps a step's and drops older ones.
    """

    loader: DataLoader | None
    rows_per_output: int = 1
    slots: int = 1
    slot: int = 0
    slot_rows: int = 1
    ended: bool = False
    provenance: deque = field(default_factory=deque)


class ZephonRows(IterableDataset):
    """The ``train_dataset`` of a Trainer fed by :class:`ZephonCallback` (use
    ``callback.train_dataset``); the callback configures it in ``on_train_begin``."""

    def __init__(self) -> None:
        self.feed: Feed | None = None
        self._live: weakref.WeakSet = weakref.WeakSet()

    def close(self) -> None:
        """Stop the iterators still open (their Zephon loaders shut down now, not at exit)."""
        for rows in list(self._live):
            rows.close()
        self.feed = None

    def __iter__(self) -> Iterator[Any]:
        if get_worker_info() is not None:
            raise ConfigError(
                "ZephonRows runs in the training process: set "
                "dataloader_num_workers=0 and ZephonCallback(num_workers=N)"
            )
        if self.feed is None:
            raise ConfigError(
                "this dataset is fed by ZephonCallback: pass "
                "Trainer(train_dataset=cb.train_dataset, callbacks=[cb])"
            )
        rows = _rows(self.feed)
        self._live.add(rows)
        return rows


def _rows(feed: Feed) -> Iterator[Any]:
    # a generator: ranks that read nothing may create the iterator, never advance it
    if feed.loader is None:
        raise ConfigError("this rank does not read the Zephon stream (rank 0 dispatches)")
    own = _unbatch(feed.loader, feed.rows_per_output, feed.provenance)
    if feed.slots == 1:
        yield from own
        feed.ended = True
        return
    filler = [NOT_THIS_RANK] * feed.slot_rows
    while True:
        # take this rank's rows first so a group is only ever emitted whole
        mine = list(islice(own, feed.slot_rows))
        if len(mine) < feed.slot_rows:
            feed.ended = True
            return
        for slot in range(feed.slots):
            yield from mine if slot == feed.slot else filler


def _unbatch(loader: DataLoader, rows: int, provenance: deque) -> Iterator[Any]:
    for n, out in enumerate(loader):
        if isinstance(out, dict) and "provenance" in out:
            # segments per batch, not per row: the Trainer's collator could not stack them
            out = dict(out)
            provenance.append((n, out.pop("provenance")))
        if rows == 1:
            yield out
            continue
        if not isinstance(out, Mapping):
            raise ConfigError(f"a batched Zephon output must be a dict, got {type(out).__name__}")
        sizes = {len(v) for v in out.values()}
        if sizes != {rows}:
            raise ConfigError(
                f"a Zephon batch holds {sorted(sizes)} rows, expected {rows}: keep "
                "batch(drop_last=True) so every batch is full"
            )
        for i in range(rows):
            yield {k: v[i] for k, v in out.items()}
