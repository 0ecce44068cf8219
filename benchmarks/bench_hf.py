"""HF datasets fetch: one batched Arrow read per chunk vs the alternatives a user would write.

Rows/s for reading 64-row chunks of random rows from an in-memory-mapped Dataset of
the embedded mixture: per-row ``ds[i]``, the dataset's own ``ds.__getitems__`` and
Zephon's ``HFComponent`` (``table.take`` on the Arrow table).
"""

from __future__ import annotations

import time

import numpy as np

from zephon_core.testing import corpora


def main(quick: bool = False, chunks: int = 300, chunk: int = 64) -> dict:
    chunks = 30 if quick else chunks
    import datasets

    from zephon_integrations.hf import hf_component

    docs = list(corpora.prose()) + list(corpora.code())
    ds = datasets.Dataset.from_dict(
        {"text": [d["text"] for d in docs] * 20, "id": [d["id"] for d in docs] * 20}
    )
    rng = np.random.default_rng(0)
    batches = [rng.integers(0, len(ds), chunk).tolist() for _ in range(chunks)]
    comp = hf_component(ds)

    def rate(fn) -> float:
        t0 = time.perf_counter()
        for rows in batches:
            fn(rows)
        return chunks * chunk / (time.perf_counter() - t0)

    per_row = rate(lambda rows: [ds[i] for i in rows])
    getitems = rate(lambda rows: ds.__getitems__(rows))
    take = rate(comp.__getitems__)
    return {
        "rows": len(ds),
        "per_row_rows_per_s": round(per_row),
        "getitems_rows_per_s": round(getitems),
        "zephon_take_rows_per_s": round(take),
        "speedup_vs_per_row": round(take / per_row, 1),
        "speedup_vs_getitems": round(take / getitems, 1),
    }


_NOTE = (
    "Rows/s of one pass over the same random 64-row chunks per method, one process."
)


def tables(result: dict) -> list[dict]:
    """The result as tables for ``docs/measurements.md``."""
    from report import flat_tables

    return flat_tables(result, _NOTE)


if __name__ == "__main__":
    import json

    print(json.dumps(main(), indent=2))
