"""Token-share accuracy of mixtures on the demo corpus (prose 0.7 / code 0.3).

The demo's pipeline (BPE tokenizer trained on the spot, split 512, pack 512, shuffle 64,
batch 8, 4 lanes) is run for ``--tokens`` delivered tokens in each configuration; after
every batch the delivered tokens per dataset are read from ``stats()``. Printed, per
configuration:

* ``overall`` -- realized token share of prose over the whole run;
* ``max_dev_1e6`` -- the largest |share - target| over every sliding window of 10^6
  tokens after the first (in percentage points), and ``max_dev_1e7`` over 10^7;
* ``max_dev_Nb`` -- the same over sliding windows of N batches (what ``ensure_mixture``
  is for).

Configurations: document weights (the default), token weights, each with and without
``ensure_mixture`` (the "before and after" of its window), and token weights over the
same corpus with documents cut at line boundaries (source files run up to 69k tokens;
a window of 10^6 tokens cannot be within 1 point when one document is 7 % of it).

Run: ``python benchmarks/bench_mixture.py [--tokens 20000000]``
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

from embedded import BatchTokenizer, train_tokenizer  # noqa: E402

from zephon_core import Pipeline, StaticMixtureWorkSource  # noqa: E402
from zephon_core.testing import corpora  # noqa: E402

TARGET = 0.7
SEQ, BATCH = 512, 8


def cut_documents(docs, max_chars: int | None) -> list[dict]:
    """Documents cut at line boundaries into pieces of at most ``max_chars`` characters
    (the usual preparation of source files for training; ``None``: as they are)."""
    if max_chars is None:
        return list(docs)
    out = []
    for d in docs:
        piece, n = [], 0
        for line in d["text"].splitlines(keepends=True):
            if piece and n + len(line) > max_chars:
                out.append({"text": "".join(piece), "id": f"{d['id']}#{len(out)}"})
                piece, n = [], 0
            piece.append(line)
            n += len(line)
        if piece:
            out.append({"text": "".join(piece), "id": f"{d['id']}#{len(out)}"})
    return out


def build(
    tok: Path, unit: str, ensure: int | None, k: int = 2, max_chars: int | None = None
) -> Pipeline:
    datasets = {
        "prose": cut_documents(corpora.prose(), max_chars),
        "code": cut_documents(corpora.code(), max_chars),
    }
    src = StaticMixtureWorkSource(
        datasets,
        {"prose": TARGET, "code": 1 - TARGET},
        chunk_size=16,
        seed=2026,
        weights_unit=unit,
        # exact lengths, as a length column would give them (the pipeline's own estimate
        # measures small datasets whole, but samples large ones)
        lengths=_lengths(tok, datasets) if unit == "tokens" else None,
    )
    pipe = (
        Pipeline(src, canonical_replicas=4, flush_every_k_chunks=k, seed=2026, prefetch=0)
        .fetch()
        .map(BatchTokenizer(tok), name="tokenize", batched=True)
        .split(max_len=SEQ)
        .pack(seq_len=SEQ, bins=8)
        .shuffle(buffer_size=64)
    )
    if ensure:
        pipe = pipe.ensure_mixture(window=ensure)
    return pipe.batch(batch_size=BATCH)


def _lengths(tok: Path, datasets: dict) -> dict:
    encode = BatchTokenizer(tok)
    return {n: [len(o["input_ids"]) for o in encode(list(ds))] for n, ds in datasets.items()}


def run(tok: Path, unit: str, ensure: int | None, tokens: int, k: int = 2, max_chars=None) -> dict:
    t0 = time.perf_counter()
    prose, total = [0], [0]
    with build(tok, unit, ensure, k, max_chars) as pipe:
        it = iter(pipe)
        while total[-1] < tokens:
            next(it)
            mix = pipe.stats()["mixture"]
            prose.append(int(mix["prose"]["tokens"]))
            total.append(int(mix["prose"]["tokens"] + mix["code"]["tokens"]))
    p, t = np.asarray(prose, dtype=np.float64), np.asarray(total, dtype=np.float64)
    out = {
        "config": f"{unit}{' + ensure_mixture(' + str(ensure) + ')' if ensure else ''}, k={k}"
        + (f", documents cut to <= {max_chars} chars" if max_chars else ""),
        "tokens": int(t[-1]),
        "batches": len(t) - 1,
        "overall_pct": round(100 * p[-1] / t[-1], 3),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    for w in (10**6, 10**7):
        out[f"max_dev_{w:.0e}_pp"] = _max_dev_tokens(p, t, w, skip=10**6)
    for nb in (16, 64, 256):
        out[f"max_dev_{nb}b_pp"] = _max_dev_batches(p, t, nb)
    return out


def _max_dev_tokens(p: np.ndarray, t: np.ndarray, window: int, skip: int) -> float | None:
    """Largest deviation over sliding windows of >= ``window`` tokens starting after the
    first ``skip`` tokens."""
    first = int(np.searchsorted(t, skip))
    devs = []
    for i in range(first + 1, len(t)):
        j = int(np.searchsorted(t, t[i] - window, side="right")) - 1
        if j < first:  # windows start after the first window
            continue
        devs.append(abs((p[i] - p[j]) / (t[i] - t[j]) - TARGET))
    return round(100 * max(devs), 3) if devs else None


def _max_dev_batches(p: np.ndarray, t: np.ndarray, n: int) -> float:
    dp, dt = p[n:] - p[:-n], t[n:] - t[:-n]
    return round(100 * float(np.max(np.abs(dp / dt - TARGET))), 3)


#: (weights_unit, ensure_mixture window, documents cut to at most this many chars)
CONFIGS = [
    ("documents", None, None),
    ("documents", 64, None),
    ("tokens", None, None),
    ("tokens", 64, None),
    ("tokens", None, 12000),
    ("tokens", None, 4000),
    ("tokens", 64, 4000),
]


def main(quick: bool = False, tokens: int = 20_000_000) -> list[dict]:
    tokens = 2_000_000 if quick else tokens
    with tempfile.TemporaryDirectory() as d:
        tok = Path(d) / "tokenizer.json"
        train_tokenizer(tok)
        rows = []
        for unit, ensure, max_chars in CONFIGS:
            rows.append(run(tok, unit, ensure, tokens, max_chars=max_chars))
            print(json.dumps(rows[-1]), file=sys.stderr)
    return rows


_NOTE = (
    "Token-share error of the prose dataset over sliding windows, one row per "
    "configuration."
)


def tables(result: list[dict]) -> list[dict]:
    """The result as tables for ``docs/measurements.md``."""
    from report import flat_tables

    return flat_tables({"configurations": result}, _NOTE)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=20_000_000)
    args = ap.parse_args()
    print(json.dumps(main(tokens=args.tokens), indent=2))
