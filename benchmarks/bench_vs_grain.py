"""The bar, side by side in one run: Zephon vs Grain 0.2.18 on the same pipeline.

0.7/0.3 mixture of prose and code -> byte tokens -> fragments of <= 512 ->
shuffle buffer 64 -> first-fit pack 512 (8 bins) -> batch 8, one process; Grain with
its own operators (``FlatMapIterDataset`` splits documents). Measures throughput
(batches/s) of both. Needs `grain` (the `bench` extra;
`make bench` installs it).
"""

from __future__ import annotations

import itertools
import time

import numpy as np
from common import bar_pipeline, throughput

from zephon_core.testing import corpora

SEQ = 512


def _grain_pipeline(seed: int = 1234):
    """The same pipeline with Grain's own operators (``FlatMapIterDataset`` for the
    split, ``WindowShuffleIterDataset``, ``FirstFitPackIterDataset``)."""
    import grain
    import grain.experimental as ge

    def to_tokens(d):
        return {"input_ids": np.frombuffer(d["text"].encode("utf-8"), np.uint8).astype(np.int32)}

    docs = list(corpora.prose()) + list(corpora.code())
    longest = max(len(d["text"].encode("utf-8")) for d in docs)

    class Split(ge.FlatMapTransform):
        """First-fit packing needs fragments <= 512 tokens, as Zephon's split() makes."""

        max_fan_out = -(-longest // SEQ)

        def flat_map(self, d):
            ids = d["input_ids"]
            return [{"input_ids": ids[i : i + SEQ]} for i in range(0, len(ids), SEQ)]

    prose = grain.MapDataset.source(list(corpora.prose())).shuffle(seed=seed).repeat()
    code = grain.MapDataset.source(list(corpora.code())).shuffle(seed=seed + 1).repeat()
    mixed = grain.MapDataset.mix([prose, code], weights=[0.7, 0.3]).map(to_tokens)
    frags = ge.FlatMapIterDataset(mixed.to_iter_dataset(), Split())
    shuffled = ge.WindowShuffleIterDataset(frags, window_size=64, seed=seed)
    packed = ge.FirstFitPackIterDataset(
        shuffled, length_struct={"input_ids": SEQ}, num_packing_bins=8, shuffle_bins=False
    )
    return packed.batch(8, drop_remainder=True)


def grain_throughput(n: int, warmup: int = 50, repeats: int = 3) -> float:
    best = 0.0
    for _ in range(repeats):
        it = iter(_grain_pipeline())
        for _ in itertools.islice(it, warmup):
            pass
        t0 = time.perf_counter()
        for _ in itertools.islice(it, n):
            pass
        best = max(best, n / (time.perf_counter() - t0))
    return best


def main(n: int = 1500) -> dict:
    try:
        import grain  # noqa: F401
    except ImportError:
        return {"skipped": "grain is not installed (pip install 'zephon[bench]')"}
    zephon = throughput(lambda: bar_pipeline(prefetch=0), n)
    zephon_pump = throughput(lambda: bar_pipeline(prefetch=3), n)
    g = grain_throughput(n)
    return {
        "zephon_batches_per_s": round(zephon),
        "zephon_pump_batches_per_s": round(zephon_pump),
        "grain_batches_per_s": round(g),
        "ratio_zephon_vs_grain": round(max(zephon, zephon_pump) / g, 2),
    }


if __name__ == "__main__":
    import json

    print(json.dumps(main(), indent=2))
