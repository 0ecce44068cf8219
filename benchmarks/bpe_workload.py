"""The real-tokenizer workload of the throughput benchmarks, and its bare loop.

0.7/0.3 prose/code (document weights) -> byte-level BPE (``tokenizers``, vocab 8192,
trained here on the embedded corpus) -> split to <= 2048 -> pack 2048 (8 bins; Zephon
best fit, its default; the bare loop first fit)
-> shuffle (buffer 64) -> batch 8; Zephon with 8 lanes (1/2/4/8 workers divide them),
a flush every 2 chunks of 16 documents. The bare loop does the same steps with numpy and
no framework; both give the same batch keys (``input_ids``, ``labels``,
``position_ids``), so :func:`real_tokens` counts both alike.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset

from zephon_core import Pipeline, StaticMixtureWorkSource
from zephon_core.testing import corpora

SEQ, BINS, SHUFFLE, BATCH = 2048, 8, 64, 8
VOCAB, CHUNK, LANES, K, SEED = 8192, 16, 8, 2, 1234  # 8 lanes: 1/2/4/8 workers divide them
WEIGHTS = {"prose": 0.7, "code": 0.3}

# -- the tokenizer and the lookup that replaces it ---------------------------------------
def train_tokenizer(vocab_size: int = VOCAB) -> str:
    """A byte-level BPE trained on the embedded corpus (the examples' own), as its JSON."""
    import tempfile
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    from embedded import train_tokenizer as train

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "tokenizer.json"
        train(path, vocab_size)
        return path.read_text()


class BpeTokenize:
    """Batched map: text -> int32 ids. Pickles as its JSON; the Tokenizer is built lazily
    in each process that uses it."""

    def __init__(self, spec: str):
        self.spec = spec
        self._tok: Any = None

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        if self._tok is None:
            from tokenizers import Tokenizer

            self._tok = Tokenizer.from_str(self.spec)
        return [np.asarray(e.ids, dtype=np.int32) for e in self._tok.encode_batch(texts)]

    def __call__(self, payloads: list[dict]) -> list[dict]:
        return [{"input_ids": ids} for ids in self.encode([p["text"] for p in payloads])]

    def __getstate__(self) -> dict:
        return {"spec": self.spec, "_tok": None}

    def zephon_fingerprint(self) -> str:
        return hashlib.sha256(self.spec.encode()).hexdigest()[:32]


class LookupIds:
    """Batched map returning precomputed ids by document id: the framework without the
    tokenizer. Module level, so DataLoader workers can pickle it."""

    def __init__(self, table: dict[str, np.ndarray], tag: str):
        self.table = table
        self.tag = tag

    def encode(self, texts_or_ids: list[str]) -> list[np.ndarray]:
        return [self.table[i] for i in texts_or_ids]

    def __call__(self, payloads: list[dict]) -> list[dict]:
        table = self.table
        return [{"input_ids": table[p["id"]]} for p in payloads]

    def zephon_fingerprint(self) -> str:
        return self.tag  # a digest of the table would cost more than the lookups measured


def all_docs() -> tuple[dict, ...]:
    return corpora.prose() + corpora.code()


# -- Zephon --------------------------------------------------------------------------------
def zephon_pipeline(
    fn: Callable, prefetch: int = 3, provenance: bool = False, parallelism: int = 1
) -> Pipeline:
    source = StaticMixtureWorkSource(
        {"prose": corpora.prose(), "code": corpora.code()}, WEIGHTS, chunk_size=CHUNK, seed=SEED
    )
    return (
        Pipeline(
            source, canonical_replicas=LANES, flush_every_k_chunks=K, seed=SEED, prefetch=prefetch
        )
        .fetch()
        .map(fn, batched=True, parallelism=parallelism, name="tokenize")
        .split(max_len=SEQ)
        .pack(seq_len=SEQ, bins=BINS)
        .shuffle(buffer_size=SHUFFLE)
        .batch(batch_size=BATCH, provenance=provenance)
    )


# -- the bare loop -------------------------------------------------------------------------
_ARANGE = np.arange(SEQ, dtype=np.int64)


def collate(rows: list[tuple[np.ndarray, list[int]]]) -> dict[str, torch.Tensor]:
    """The keys and values Zephon's batch gives packed rows (ops/packed_batch.py)."""
    ids = np.zeros((len(rows), SEQ), np.int64)
    labels = np.full((len(rows), SEQ), -100, np.int64)
    pos = np.empty((len(rows), SEQ), np.int64)
    for r, (toks, segs) in enumerate(rows):
        n = len(toks)
        ids[r, :n] = toks
        labels[r, :n] = toks
        off = 0
        for s in segs:
            pos[r, off : off + s] = _ARANGE[:s]
            labels[r, off] = -100  # a document's first token is not predicted from the last
            off += s
        pos[r, n:] = _ARANGE[: SEQ - n]
    return {
        "input_ids": torch.from_numpy(ids),
        "labels": torch.from_numpy(labels),
        "position_ids": torch.from_numpy(pos),
    }


class FirstFitPacker:
    """First fit of fragments (<= SEQ tokens) into BINS open rows; a fragment that fits in
    none closes the fullest row. A row is ``(tokens, segment lengths)``, what
    :func:`collate` takes."""

    def __init__(self) -> None:
        self.fill, self.parts = [0] * BINS, [[] for _ in range(BINS)]

    def emit(self, b: int) -> tuple[np.ndarray, list[int]]:
        parts = self.parts[b]
        toks = np.concatenate(parts) if len(parts) > 1 else parts[0]
        self.fill[b], self.parts[b] = 0, []
        return toks, [len(p) for p in parts]

    def pack(self, frag: np.ndarray) -> list:
        """The rows ``frag`` completes or pushes out (zero, one or two)."""
        fill, parts, n = self.fill, self.parts, len(frag)
        for b in range(BINS):
            if fill[b] + n <= SEQ:
                parts[b].append(frag)
                fill[b] += n
                return [self.emit(b)] if fill[b] == SEQ else []
        b = max(range(BINS), key=fill.__getitem__)
        out = [self.emit(b)]
        parts[b].append(frag)
        fill[b] = n
        return out + [self.emit(b)] if n == SEQ else out

    def flush(self) -> list:
        """The open rows, in bin order (a packer used per batch of documents ends so)."""
        return [self.emit(b) for b in range(BINS) if self.parts[b]]


class BareLoop:
    """Mixture -> tokenize 16 documents at a time -> split -> first-fit pack (8 bins) ->
    64-slot shuffle buffer -> batches of 8, with numpy and nothing else."""

    def __init__(self, encode: Callable[[list], list[np.ndarray]], by_id: bool, seed: int = SEED):
        self.encode, self.by_id = encode, by_id
        self.docs = (corpora.prose(), corpora.code())
        self.rng = np.random.default_rng(seed)
        self.documents = self.real_tokens = self.batches = 0
        self._gen = self._batches()

    def __iter__(self) -> Iterator[dict]:
        return self._gen

    def close(self) -> None:
        self._gen.close()

    def _documents(self) -> Iterator[list]:
        rng, docs = self.rng, self.docs
        perms = [rng.permutation(len(d)) for d in docs]
        at = [0, 0]
        while True:
            picks = []
            for c in (rng.random(CHUNK) >= WEIGHTS["prose"]).astype(int).tolist():
                if at[c] == len(perms[c]):
                    perms[c], at[c] = rng.permutation(len(docs[c])), 0
                doc = docs[c][perms[c][at[c]]]
                at[c] += 1
                picks.append(doc["id"] if self.by_id else doc["text"])
            yield picks

    def _batches(self) -> Iterator[dict]:
        packer = FirstFitPacker()
        shuffle: list = []
        draws: list[int] = []
        rows: list = []

        for picks in self._documents():
            self.documents += len(picks)
            for ids in self.encode(picks):
                for lo in range(0, len(ids), SEQ):
                    for row in packer.pack(ids[lo : lo + SEQ]):
                        if len(shuffle) < SHUFFLE:
                            shuffle.append(row)
                            continue
                        if not draws:
                            draws = self.rng.integers(0, SHUFFLE, 256).tolist()
                        j = draws.pop()
                        shuffle[j], row = row, shuffle[j]
                        rows.append(row)
                        if len(rows) == BATCH:
                            self.batches += 1
                            self.real_tokens += sum(len(t) for t, _ in rows)
                            yield collate(rows)
                            rows = []


class BareLoopDataset(IterableDataset):
    """The bare loop behind ``DataLoader(num_workers=w)``: each worker runs its own loop
    (seeded by its id) and yields ready tensors, as a plain torch user would write it.
    What torch's worker machinery costs without Zephon: the denominator for the
    2-worker overhead goal."""

    def __init__(self, encode: Callable, by_id: bool):
        self.encode, self.by_id = encode, by_id

    def __iter__(self) -> Iterator[dict]:
        info = torch.utils.data.get_worker_info()
        return iter(BareLoop(self.encode, self.by_id, SEED + (info.id if info else 0)))


class _Loader:
    """A DataLoader with ``close()`` (the measuring loop closes what it built)."""

    def __init__(self, loader: DataLoader):
        self.loader = loader

    def __iter__(self) -> Iterator:
        self._it = iter(self.loader)
        return self._it

    def close(self) -> None:
        self._it._shutdown_workers()


def bare_loader(encode: Callable, by_id: bool, workers: int) -> _Loader:
    return _Loader(DataLoader(BareLoopDataset(encode, by_id), batch_size=None, num_workers=workers))


def real_tokens(kept: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> dict[str, float]:
    """Batches and real (non-padding) tokens of packed batches, from each batch's
    ``(input_ids, labels, position_ids)``. A row's padding is its last segment (positions
    restart at 0 there) when every token in it is ``pad_id`` 0 and every label -100; a
    real last segment has labels after its first token, so only a 1-token final fragment
    of token id 0 would be taken for padding."""
    real = 0
    for ids, labels, pos in kept:
        b, width = ids.shape
        col = torch.arange(width)
        last = torch.where(pos == 0, col, -1).amax(dim=1, keepdim=True)
        tail = col >= last
        pad = ((labels == -100) & (ids == 0)) | ~tail
        padded = pad.all(dim=1)
        real += b * width - int(((width - last.squeeze(1)) * padded).sum())
    return {"batches": float(len(kept)), "real_tokens": float(real)}


def keep_fields(batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What :func:`real_tokens` needs of a batch, kept during a timed window."""
    return batch["input_ids"], batch["labels"], batch["position_ids"]
