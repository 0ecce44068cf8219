"""Zephon vs HF ``datasets`` (5.x ``IterableDataset``) on the real-tokenizer workload, per
real (non-padding) token, in interleaved rounds, with an exactness column (cut, restore,
compare) for every peer.

The HF pipeline is written as the datasets docs show it: each corpus
``Dataset.from_list(...).to_iterable_dataset(num_shards=8)`` (shards: for the shuffle and
for DataLoader workers), repeated, ``interleave_datasets([...], probabilities=[0.7, 0.3],
seed, stopping_strategy="all_exhausted")``, ``.shuffle(seed, buffer_size=1000)`` on the
documents (where the docs place it, with its default buffer), ``.map(tokenize,
batched=True)`` with the same BPE as ``bpe_workload.py``, then packing to 2048 in a batched
``.map`` (the docs' ``group_texts`` idiom: stateless, each map batch packed on its own
with the bare loop's first-fit packer), and batches of 8 made by
``torch.utils.data.DataLoader(batch_size=8, collate_fn=...)`` with the bare loop's
collate (the same keys), in process and with ``num_workers=2``.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import rounds
from bench_vs_grain import _compare, _summary, _table, exact
from bpe_workload import (
    BATCH,
    CHUNK,
    SEED,
    SEQ,
    WEIGHTS,
    BareLoop,
    BpeTokenize,
    FirstFitPacker,
    collate,
    keep_fields,
    real_tokens,
    train_tokenizer,
    zephon_pipeline,
)
from torch.utils.data import DataLoader

from zephon_core.testing import corpora

# cuts: batches at which a state is taken, the later ones past the first refill of HF's
# shuffle buffer (~500 documents, ~90 batches: a cut before it resumes from the start);
# after: batches compared after each cut
FULL = dict(window=500, warmup=24, rounds=5, cuts=(3, 150, 300), after=10)
QUICK = dict(window=40, warmup=4, rounds=3, cuts=(3, 150), after=4)
SHARDS = 8  # per corpus: DataLoader workers take whole shards (the docs' advice: >= workers)
SHUFFLE_DOCS = 1000  # IterableDataset.shuffle's default buffer_size
PACK_DOCS = 64  # documents packed per map batch (see the table note)
WORKERS = 2
BARE, ZEPHON = "bare loop", "Zephon iterate()"
ZEPHON_W = f"Zephon dataloader(num_workers={WORKERS})"
HF, HF_W = "HF datasets, in process", f"HF datasets, DataLoader(num_workers={WORKERS})"
FRESH = object()  # "start from the beginning", as distinct from any state (None included)


# -- the HF pipeline -----------------------------------------------------------------------
class _Tokenize:
    """The batched map: the workload's BPE over a batch's ``text`` column."""

    def __init__(self, encode: Callable[[list[str]], list[np.ndarray]]):
        self.encode = encode

    def __call__(self, batch: dict) -> dict:
        return {"input_ids": self.encode(batch["text"])}


def pack_rows(batch: dict) -> dict:
    """The batched packing map: split to <= SEQ, first fit into 8 bins, the open bins
    closed at the end of the map batch (a stateless map, so HF's state covers it)."""
    packer = FirstFitPacker()
    rows = [
        row
        for ids in batch["input_ids"]
        for lo in range(0, len(ids), SEQ)
        for row in packer.pack(ids[lo : lo + SEQ])
    ]
    rows += packer.flush()
    return {"input_ids": [t for t, _ in rows], "segments": [s for _, s in rows]}


def collate_rows(rows: list[dict]) -> dict:
    """DataLoader's ``collate_fn``: the bare loop's collate (the same keys and values)."""
    return collate([(r["input_ids"], r["segments"]) for r in rows])


def hf_dataset(encode: Callable[[list[str]], list[np.ndarray]], seed: int = SEED):
    """The HF pipeline up to packed rows (``input_ids``, ``segments``)."""
    from datasets import Dataset, interleave_datasets

    def source(docs: tuple) -> Any:
        # repeated: the window outlasts one pass, as Zephon's and the bare loop's sources do
        return Dataset.from_list(list(docs)).to_iterable_dataset(num_shards=SHARDS).repeat(None)

    mixed = interleave_datasets(
        [source(corpora.prose()), source(corpora.code())],
        probabilities=[WEIGHTS["prose"], WEIGHTS["code"]],
        seed=seed,
        stopping_strategy="all_exhausted",
    )
    return (
        mixed.shuffle(seed=seed, buffer_size=SHUFFLE_DOCS)
        .map(_Tokenize(encode), batched=True, batch_size=CHUNK, remove_columns=["text", "id"])
        .map(pack_rows, batched=True, batch_size=PACK_DOCS, remove_columns=["input_ids"])
    )


class HfRun:
    """One iteration of the HF pipeline behind a DataLoader; ``restore``: a state from
    ``IterableDataset.state_dict()`` loaded into the fresh dataset first."""

    def __init__(self, encode: Callable, workers: int = 0, restore: Any = FRESH):
        self.ds = hf_dataset(encode)
        if restore is not FRESH:
            self.ds.load_state_dict(restore)
        self.loader = DataLoader(
            self.ds, batch_size=BATCH, collate_fn=collate_rows, num_workers=workers
        )
        self._it: Any = None

    def __iter__(self) -> Iterator[dict]:
        self._it = iter(self.loader)
        return self._it

    def checkpoint(self) -> Any:
        # without torchdata's StatefulDataLoader this is what a datasets user can save;
        # with workers the main process's dataset is not the one iterated
        return self.ds.state_dict()

    def close(self) -> None:
        if self._it is not None and hasattr(self._it, "_shutdown_workers"):
            self._it._shutdown_workers()


class ZephonRun:
    """Zephon's ``iterate()`` (workers 0) or ``dataloader(num_workers=...)``."""

    def __init__(self, build: Callable, workers: int = 0, restore: Any = FRESH):
        kw = {} if restore is FRESH else {"restore": restore}
        pipe = build()
        self.handle = pipe.dataloader(num_workers=workers, **kw) if workers else pipe.iterate(**kw)

    def __iter__(self) -> Iterator[dict]:
        return iter(self.handle)

    def checkpoint(self) -> Any:
        return self.handle.checkpoint()

    def close(self) -> None:
        self.handle.close()


# -- exactness: cut, restore into a fresh pipeline, compare --------------------------------
def exact_resume(start: Callable[[Any], Any], cuts: tuple[int, ...], after: int) -> str:
    """``start(state)`` -> a run (iterable with ``checkpoint()`` and ``close()``), from the
    beginning for :data:`FRESH`. For each cut ``c`` the state is taken before batch ``c``
    of an uninterrupted run, a fresh run started from it, and its next ``after`` batches
    compared with the uninterrupted run's; every cut that differs is named."""
    run, reference, states = start(FRESH), [], {}
    it = iter(run)
    for i in range(max(cuts) + after):
        if i in cuts:
            states[i] = run.checkpoint()
        reference.append({k: np.array(v) for k, v in next(it).items()})
    run.close()
    bad = []
    for at, state in states.items():
        again = start(state)
        try:
            why = _compare(reference[: at + after], itertools.islice(iter(again), after), at)
        finally:
            again.close()
        if why:
            bad.append(why)
    if bad:
        return "no: " + "; ".join(bad)
    return f"yes (cuts at {', '.join(map(str, cuts))}; {after} batches compared after each)"


# -- the run -------------------------------------------------------------------------------
def _window(build: Callable, size: int, warmup: int) -> Callable[[], rounds.Sample]:
    return rounds.window(build, size, warmup, count=real_tokens, keep=keep_fields)


def main(quick: bool = False) -> dict:
    try:
        import datasets
    except ImportError:
        return {"skipped": "datasets is not installed (pip install 'zephon[hf]')"}
    cfg = QUICK if quick else FULL
    tok = BpeTokenize(train_tokenizer())
    win, warm = cfg["window"], cfg["warmup"]
    prefetched = warm + 2 * WORKERS  # the batches workers prefetch while the first is awaited
    r = rounds.run(
        {
            BARE: _window(lambda: BareLoop(tok.encode, by_id=False), win, warm),
            ZEPHON: _window(lambda: ZephonRun(lambda: zephon_pipeline(tok)), win, warm),
            HF: _window(lambda: HfRun(tok.encode), win, warm),
            ZEPHON_W: _window(
                lambda: ZephonRun(lambda: zephon_pipeline(tok), WORKERS), win, prefetched
            ),
            HF_W: _window(lambda: HfRun(tok.encode, WORKERS), win, prefetched),
        },
        cfg["rounds"],
    )
    cuts, after = cfg["cuts"], cfg["after"]

    def zephon(workers: int) -> str:
        return exact_resume(
            lambda s: ZephonRun(lambda: zephon_pipeline(tok), workers, s), cuts, after
        )

    def hf(workers: int) -> str:
        return exact_resume(lambda s: HfRun(tok.encode, workers, s), cuts, after)

    exactness = {
        BARE: "no checkpoint",
        ZEPHON: exact(lambda: zephon(0)),
        HF: exact(lambda: hf(0)),
        ZEPHON_W: exact(lambda: zephon(WORKERS)),
        HF_W: exact(lambda: hf(WORKERS)),
    }
    return {
        "config": cfg,
        "versions": {"datasets": datasets.__version__},
        "bpe": {"rows": _summary(r, BARE, SEQ), "exact": exactness, "load": r.load},
    }


# -- tables ---------------------------------------------------------------------------------
def tables(result: dict) -> list[dict]:
    if "skipped" in result:
        rows = [[result["skipped"]]]
        title = "Zephon vs HF datasets"
        return [{"title": title, "columns": ["skipped"], "rows": rows, "note": ""}]
    cfg = result["config"]
    return [
        _table(
            f"Real tokenizer: Zephon, HF datasets {result['versions']['datasets']} and the "
            "bare loop",
            result["bpe"],
            BARE,
            "The workload of bpe_workload.py: 0.7/0.3 prose/code, BPE 8192 (trained on the "
            "embedded corpus) called on 16 documents at a time, split/pack 2048 (8 bins), "
            "batch 8. Zephon: bpe_workload's pipeline as it is (8 lanes, chunks of 16, "
            "prefetch 3, best-fit packing; its dataloader's 2 workers divide the lanes). "
            "HF configured per the datasets docs: to_iterable_dataset(num_shards=8) "
            "per corpus (repeated), interleave_datasets with probabilities [0.7, 0.3] "
            "(stopping_strategy all_exhausted; the sources repeat, so it never stops), "
            f"shuffle(seed, buffer_size={SHUFFLE_DOCS}) on documents (the docs shuffle before "
            "map; 1000 is the default), map(tokenize, batched=True), packing as a batched "
            f"map of {PACK_DOCS} documents (the docs' group_texts idiom, stateless so that "
            "the dataset's state_dict covers it; the open bins close at the end of each map "
            "batch, hence more padding than a packer that carries them over; a larger map "
            "batch pads less but its first batches wait for the whole map batch), batched by "
            "DataLoader(batch_size=8, collate_fn) as the docs' PyTorch page does, with the "
            "bare loop's packer and collate. No shuffle of packed rows in HF (Zephon and the "
            "bare loop shuffle 64 rows after packing). Exactness: a state taken before "
            f"batches {', '.join(map(str, cfg['cuts']))} of an uninterrupted run (Zephon "
            "checkpoint(); HF IterableDataset.state_dict(), as torchdata's "
            "StatefulDataLoader is not installed; with workers that is the main process's "
            "dataset, which the workers do not advance), restored into a freshly built "
            "pipeline (restore= / load_state_dict), the next "
            f"{cfg['after']} batches compared tensor for tensor with the uninterrupted run's. "
            "HF's docs say a shuffle buffer is refilled, not restored: its buffer yields "
            "half of its 1000 documents at a time, and a cut before the first half is out "
            "(~90 batches here) resumes by replaying from the start, hence the later cuts. "
            f"Window {cfg['window']} batches after {cfg['warmup']} (+{2 * WORKERS} with "
            f"workers); {cfg['rounds']} interleaved rounds (order rotated per round), each "
            "ratio taken within a round; median (min-max) over the rounds. Real tokens are "
            "counted in one untimed pass over the same, deterministic batches.",
        )
    ]


if __name__ == "__main__":
    import json

    print(json.dumps(main(quick="--quick" in sys.argv), indent=2, default=str))
