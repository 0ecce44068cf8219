"""The ``zephon/*`` metrics both trainers log (Lightning and the HF Trainer).

Per dataset, each with its unit (``zephon_core/engine/mixture_report.py``):
``zephon/token_share/<name>``, ``zephon/token_share_target/<name>`` (token weights) or
``zephon/document_share_target/<name>`` (document weights),
``zephon/document_share/<name>``, ``zephon/tokens/<name>``, ``zephon/documents/<name>``,
``zephon/epochs/<name>``; ``zephon/inflight_chunks`` of the reading process; and for
datasets that count their reads (Parquet shards), ``zephon/io/<name>/<counter>``
(``row_group_reads``, ``cache_hits``, ``retries``: throttling shows up here), summed
over the DataLoader workers.
"""

from __future__ import annotations

from typing import Any

from zephon_core.engine.mixture_report import metrics_of

__all__ = ["loader_metrics"]


def loader_metrics(loader: Any) -> dict[str, float]:
    """The metrics of a running ``ZephonDataLoader`` (its consumer's view: exactly the
    outputs handed to training so far, whatever its workers read ahead)."""
    stats = loader.consumer.stats()
    out = metrics_of(stats["mixture"])
    out["zephon/inflight_chunks"] = float(sum(stats["inflight_chunks"].values()))
    for name, counters in stats.get("io", {}).items():
        for counter, value in counters.items():
            out[f"zephon/io/{name}/{counter}"] = float(value)
    return out
