"""HF datasets fetch: one batched Arrow read per chunk vs the alternatives a user would write.

Rows/s for reading 64-row chunks of random rows from an in-memory-mapped Dataset of
the embedded mixture: per-row ``ds[i]``, the dataset's own ``ds.__getitems__`` and
Zephon's ``HFComponent`` (``table.take`` on the Arrow table). Each method makes one pass
over the same chunks per round, in interleaved rounds (``rounds.py``).
"""

from __future__ import annotations

import numpy as np
import rounds

from zephon_core.testing import corpora

# window: chunks read per method and round (one pass); warmup: chunks read first, untimed
FULL = dict(window=300, warmup=10, rounds=5, chunk=64)
QUICK = dict(window=30, warmup=5, rounds=3, chunk=64)
BASES = ("per_row", "getitems")


def main(quick: bool = False) -> dict:
    cfg = QUICK if quick else FULL
    import datasets

    from zephon_integrations.hf import hf_component

    docs = list(corpora.prose()) + list(corpora.code())
    ds = datasets.Dataset.from_dict(
        {"text": [d["text"] for d in docs] * 20, "id": [d["id"] for d in docs] * 20}
    )
    rng = np.random.default_rng(0)
    chunk = cfg["chunk"]
    batches = [
        rng.integers(0, len(ds), chunk).tolist() for _ in range(cfg["warmup"] + cfg["window"])
    ]
    comp = hf_component(ds)
    methods = {
        "per_row": lambda rows: [ds[i] for i in rows],
        "getitems": ds.__getitems__,
        "zephon_take": comp.__getitems__,
    }
    r = rounds.run(
        {
            # a pass: the method mapped over the chunks, one read per item
            name: rounds.window(lambda fn=fn: map(fn, batches), cfg["window"], cfg["warmup"])
            for name, fn in methods.items()
        },
        cfg["rounds"],
    )
    rows = [
        {  # an item is one chunk of `chunk` rows
            "method": name,
            "rows_per_s": rounds.Spread.of(chunk * v for v in r.rates(name, "items")).to_json(),
        }
        | {f"vs_{b}": r.ratio(name, b, "items").to_json() for b in BASES}
        for name in methods
    ]
    return {"config": cfg, "quick": quick, "dataset_rows": len(ds), "rows": rows, "load": r.load}


def tables(result: dict) -> list[dict]:
    """The result as tables for ``docs/measurements.md``."""
    cfg, s = result["config"], rounds.cell
    window = (
        f"Window: one pass of {cfg['window']} chunks of {cfg['chunk']} random rows per method "
        f"and round, after {cfg['warmup']} chunks of warm-up."
    )
    return [
        {
            "title": "Reading chunks of random rows from a datasets.Dataset",
            "columns": ["method", "rows/s"] + [f"vs {b} (within round)" for b in BASES],
            "rows": [
                [r["method"], s(r["rows_per_s"], 0)] + [s(r[f"vs_{b}"], 2, "x") for b in BASES]
                for r in result["rows"]
            ],
            "note": f"A Dataset of {result['dataset_rows']:,} rows (the embedded mixture x 20); "
            "every method reads the same chunks, one process. "
            + rounds.method(cfg["rounds"], result["load"], window, result["quick"]),
        }
    ]


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(main(quick="--quick" in sys.argv), indent=2))
