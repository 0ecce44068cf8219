"""Zephon vs Grain 0.2.18 on the same pipelines, in interleaved rounds, with an exactness
column (cut, restore, compare) for both.

1. The bar, byte tokens: 0.7/0.3 mixture of prose and code -> byte tokens -> fragments
   of <= 512 -> shuffle buffer 64 -> pack 512 (8 bins; Zephon's default best fit,
   Grain's first fit) -> batch 8, one process; Grain with its own operators (``FlatMapIterDataset`` splits documents,
   ``WindowShuffleIterDataset``, ``FirstFitPackIterDataset``). Turning bytes into tokens
   costs next to nothing, so this is a pure-overhead figure: what each framework's own
   machinery costs per batch.
2. The real tokenizer (``bpe_workload.py``: BPE 8192, split/pack 2048, shuffle 64,
   batch 8) for Zephon, Grain and the bare loop: where a trainer's data time goes.

Grain reads the in-memory lists with ``ReadOptions(num_threads=0)``, as its
``ReadOptions`` docstring advises for data already in memory (threads would only contend
for the GIL); its default (16 threads, buffer 500, tuned for remote disks) is a row of
its own. Needs ``grain`` (the ``bench`` extra; ``make bench`` installs it).
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import rounds
from common import bar_pipeline

from zephon_core.testing import corpora

FULL = dict(bar_window=1500, bar_warmup=50, bpe_window=500, bpe_warmup=24, rounds=5, cut=60)
QUICK = dict(bar_window=400, bar_warmup=10, bpe_window=10, bpe_warmup=4, rounds=3, cut=20)
BAR_SEQ = 512
IN_MEMORY = "Grain, ReadOptions(num_threads=0)"
DEFAULT = "Grain, default ReadOptions (16 threads)"


def grain_pipeline(
    seq: int = BAR_SEQ,
    encode: Callable[[str], np.ndarray] | None = None,
    threads: int = 0,
    seed: int = 1234,
    shuffle_after_pack: bool = False,
):
    """Grain's own operators for the same steps; ``encode`` None: byte tokens."""
    import grain
    import grain.experimental as ge

    def byte_tokens(text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int32)

    enc = encode or byte_tokens

    def to_tokens(d: dict) -> dict:
        return {"input_ids": enc(d["text"])}

    docs = list(corpora.prose()) + list(corpora.code())
    longest = max(len(d["text"].encode("utf-8")) for d in docs)  # >= its token count

    class Split(ge.FlatMapTransform):
        """First-fit packing needs fragments <= seq tokens, as Zephon's split() makes."""

        max_fan_out = -(-longest // seq)

        def flat_map(self, d):
            ids = d["input_ids"]
            return [{"input_ids": ids[i : i + seq]} for i in range(0, len(ids), seq)]

    prose = grain.MapDataset.source(list(corpora.prose())).shuffle(seed=seed).repeat()
    code = grain.MapDataset.source(list(corpora.code())).shuffle(seed=seed + 1).repeat()
    mixed = grain.MapDataset.mix([prose, code], weights=[0.7, 0.3]).map(to_tokens)
    options = grain.ReadOptions(num_threads=threads) if threads == 0 else grain.ReadOptions()
    frags = ge.FlatMapIterDataset(mixed.to_iter_dataset(options), Split())

    def pack(ds):
        return ge.FirstFitPackIterDataset(
            ds, length_struct={"input_ids": seq}, num_packing_bins=8, shuffle_bins=False
        )

    def shuffle(ds):
        return ge.WindowShuffleIterDataset(ds, window_size=64, seed=seed)

    rows = shuffle(pack(frags)) if shuffle_after_pack else pack(shuffle(frags))
    return rows.batch(8, drop_remainder=True)


def grain_real_tokens(kept: list[np.ndarray]) -> dict[str, float]:
    """Grain's packed batches mark padding with segment id 0."""
    real = sum(int((s != 0).sum()) for s in kept)
    return {"batches": float(len(kept)), "real_tokens": float(real)}


def _grain_window(build: Callable, size: int, warmup: int) -> Callable[[], rounds.Sample]:
    return rounds.window(
        build, size, warmup, count=grain_real_tokens, keep=lambda b: b["input_ids_segment_ids"]
    )


def _zephon_window(build: Callable, size: int, warmup: int) -> Callable[[], rounds.Sample]:
    from bpe_workload import keep_fields, real_tokens

    return rounds.window(build, size, warmup, count=real_tokens, keep=keep_fields)


# -- exactness: cut, restore into a fresh pipeline, compare --------------------------------
def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    return np.array_equal(np.asarray(a), np.asarray(b))


def _compare(reference: list, resumed: Iterable, at: int) -> str | None:
    for i, (x, y) in enumerate(zip(reference[at:], resumed)):
        if not _equal(x, y):
            return f"batch {at + i} differs after a cut at {at}"
    return None


def exact_grain(build: Callable, cuts: tuple[int, ...], n: int) -> str:
    """``get_state()`` at each cut, ``set_state()`` on a fresh pipeline's iterator."""
    it = iter(build())
    reference, states = [], {}
    for i in range(n):
        if i in cuts:
            states[i] = it.get_state()
        reference.append(next(it))
    for at, state in states.items():
        fresh = iter(build())
        fresh.set_state(state)
        bad = _compare(reference, itertools.islice(fresh, n - at), at)
        if bad:
            return f"no: {bad}"
    return f"yes ({len(cuts)} cuts in {n} batches)"


def exact_zephon(build: Callable, cuts: tuple[int, ...], n: int) -> str:
    """``checkpoint()`` at each cut, restored into a freshly built pipeline."""
    reference, states = [], {}
    with build().iterate() as it:
        for i in range(n):
            if i in cuts:
                states[i] = it.checkpoint()
            reference.append({k: v.numpy() for k, v in next(it).items()})
    for at, state in states.items():
        with build().iterate(restore=state) as fresh:
            bad = _compare(reference, itertools.islice(fresh, n - at), at)
        if bad:
            return f"no: {bad}"
    return f"yes ({len(cuts)} cuts in {n} batches)"


def exact(check: Callable[[], str]) -> str:
    try:
        return check()
    except Exception as e:  # a framework that cannot restore is a row, not a crash
        return f"no: {type(e).__name__}: {str(e)[:120]}"


# -- the run -------------------------------------------------------------------------------
def _summary(r: rounds.Rounds, base: str, seq: int) -> list[dict]:
    return [
        {
            "variant": name,
            "batches_per_s": r.rate(name, "batches").to_json(),
            "real_tokens_per_s": r.rate(name, "real_tokens").to_json(),
            "padding": 1 - r.mean(name, "real_tokens", "batches") / (8 * seq),
            "vs_base_batches": r.ratio(name, base, "batches").to_json(),
            "vs_base_real_tokens": r.ratio(name, base, "real_tokens").to_json(),
        }
        for name in r.samples
    ]


def main(quick: bool = False) -> dict:
    try:
        import grain  # noqa: F401
    except ImportError:
        return {"skipped": "grain is not installed (pip install 'zephon[bench]')"}
    cfg = QUICK if quick else FULL
    cuts = (3, cfg["cut"] // 3, cfg["cut"] - 5)
    win, warm = cfg["bar_window"], cfg["bar_warmup"]
    bar = rounds.run(
        {
            "Zephon, prefetch=0 (no pump thread)": _zephon_window(
                lambda: bar_pipeline(prefetch=0).iterate(), win, warm
            ),
            "Zephon, prefetch=3": _zephon_window(
                lambda: bar_pipeline(prefetch=3).iterate(), win, warm
            ),
            IN_MEMORY: _grain_window(lambda: grain_pipeline(threads=0), win, warm),
            DEFAULT: _grain_window(lambda: grain_pipeline(threads=16), win, warm),
        },
        cfg["rounds"],
    )
    bar_exact = {
        "Zephon, prefetch=0 (no pump thread)": exact(
            lambda: exact_zephon(lambda: bar_pipeline(prefetch=0), cuts, cfg["cut"])
        ),
        "Zephon, prefetch=3": exact(
            lambda: exact_zephon(lambda: bar_pipeline(prefetch=3), cuts, cfg["cut"])
        ),
        IN_MEMORY: exact(
            lambda: exact_grain(lambda: grain_pipeline(threads=0), cuts, cfg["cut"])
        ),
        DEFAULT: exact(
            lambda: exact_grain(lambda: grain_pipeline(threads=16), cuts, cfg["cut"])
        ),
    }
    result: dict[str, Any] = {
        "config": cfg,
        "bar": {"rows": _summary(bar, IN_MEMORY, BAR_SEQ), "exact": bar_exact, "load": bar.load},
    }
    result["bpe"] = _bpe(cfg, cuts)
    return result


def _bpe(cfg: dict, cuts: tuple[int, ...]) -> dict:
    """The real tokenizer: Zephon, Grain (per its in-memory advice) and the bare loop."""
    from bpe_workload import SEQ, BareLoop, BpeTokenize, train_tokenizer, zephon_pipeline

    tok = BpeTokenize(train_tokenizer())

    def encode(text: str) -> np.ndarray:
        return tok.encode([text])[0]

    def grain_bpe():
        return grain_pipeline(SEQ, encode, threads=0, shuffle_after_pack=True)

    win, warm = cfg["bpe_window"], cfg["bpe_warmup"]
    r = rounds.run(
        {
            "bare loop": _zephon_window(lambda: BareLoop(tok.encode, by_id=False), win, warm),
            "Zephon iterate()": _zephon_window(lambda: zephon_pipeline(tok).iterate(), win, warm),
            IN_MEMORY: _grain_window(grain_bpe, win, warm),
        },
        cfg["rounds"],
    )
    n = max(cfg["cut"] // 2, 12)
    bpe_cuts = tuple(sorted({3, n // 2, n - 3}))
    exactness = {
        "bare loop": "no checkpoint",
        "Zephon iterate()": exact(
            lambda: exact_zephon(lambda: zephon_pipeline(tok), bpe_cuts, n)
        ),
        IN_MEMORY: exact(lambda: exact_grain(grain_bpe, bpe_cuts, n)),
    }
    return {"rows": _summary(r, "bare loop", SEQ), "exact": exactness, "load": r.load}


# -- tables ---------------------------------------------------------------------------------
_s, _load = rounds.cell, rounds.load_range


def _table(title: str, sec: dict, base: str, note: str) -> dict:
    return {
        "title": title,
        "columns": [
            "variant",
            "batches/s",
            "real tokens/s",
            "padding",
            f"vs {base} (batches)",
            f"vs {base} (real tokens)",
            "exact resume (cut, restore, compare)",
        ],
        "rows": [
            [
                r["variant"],
                _s(r["batches_per_s"], 0),
                _s(r["real_tokens_per_s"], 0),
                f"{100 * r['padding']:.1f} %",
                _s(r["vs_base_batches"], 2, "x"),
                _s(r["vs_base_real_tokens"], 2, "x"),
                sec["exact"][r["variant"]],
            ]
            for r in sec["rows"]
        ],
        "note": note + f" Load average (1 min) over the rounds: {_load(sec['load'])}.",
    }


def tables(result: dict) -> list[dict]:
    if "skipped" in result:
        skipped = [[result["skipped"]]]
        return [{"title": "Zephon vs Grain", "columns": ["skipped"], "rows": skipped, "note": ""}]
    cfg = result["config"]
    method = (
        f"{cfg['rounds']} interleaved rounds (order rotated per round), each ratio taken "
        "within a round; median (min-max) over the rounds. Real tokens are counted in one "
        "untimed pass over the same, deterministic batches."
    )
    grain_choice = (
        "Grain reads the in-memory lists with ReadOptions(num_threads=0): its ReadOptions "
        "docstring recommends 0 threads when the data are already in memory, to avoid GIL "
        "contention; the default (16 threads, prefetch buffer 500) was tuned for remote "
        "disks and is shown for reference."
    )
    return [
        _table(
            "Byte tokens (pure overhead): the bar pipeline, one process",
            result["bar"],
            IN_MEMORY,
            "Byte tokens cost next to nothing, so this is each framework's own cost per "
            "batch, not what a trainer with a real tokenizer sees (next table). 0.7/0.3 "
            "prose/code, split 512, shuffle 64, pack 512 (8 bins: Zephon best fit, its default; "
            "Grain first fit, its packer), batch 8. "
            f"Window {cfg['bar_window']} batches after {cfg['bar_warmup']}; {method} "
            f"{grain_choice} Exactness: checkpoint (Zephon) or get_state (Grain) at several "
            "batches, restored into a freshly built pipeline (set_state on a fresh iterator "
            "for Grain), the batches after the cut compared with an uninterrupted run.",
        ),
        _table(
            "Real tokenizer: Zephon, Grain and the bare loop",
            result["bpe"],
            "bare loop",
            "BPE 8192 (trained on the embedded corpus), split/pack 2048, shuffle 64, batch 8 "
            "(Grain: tokenizer called per document in its map, packing then a 64-row window "
            "shuffle, as Zephon's pipeline orders them). "
            f"Window {cfg['bpe_window']} batches after {cfg['bpe_warmup']}; {method}",
        ),
    ]


if __name__ == "__main__":
    import json

    print(json.dumps(main(quick="--quick" in sys.argv), indent=2, default=str))
