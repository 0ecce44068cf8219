"""What the mixture delivered, per dataset, each number with its unit.

Why one place: ``stats()`` of an iterator, of a DataLoader, and the Lightning and HF
metrics all report the mixture, and a token share next to a document weight under one
name misled users. So every share here says its unit, and a target is reported only in
the unit the weights are stated in (``weights_unit``).

Per dataset (``mixture_report``):

* ``tokens`` -- tokens delivered in outputs taken by the consumer, and ``token_share``;
* ``documents`` -- documents the source has scheduled (read positions; this includes
  the few inflight chunks not yet delivered), ``document_share``;
* ``epochs`` -- ``documents / len(dataset)``: fractional passes over the dataset;
* ``token_share_target`` (token weights) or ``document_share_target`` (document
  weights): the weight in force now (a schedule is read at the current position).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..sources.base import Source

__all__ = ["dataset_totals", "metrics_of", "mixture_report"]


def mixture_report(
    source: Source, tokens: Iterable[Sequence[int]], source_states: Iterable[Mapping[str, Any]]
) -> dict[str, dict[str, float]]:
    """Per-dataset numbers from the lanes' delivered token counters and source states
    (read through ``source.scheduled``: the report knows no source's state keys)."""
    documents, scheduled = [], 0
    for st in source_states:
        docs, toks = source.scheduled(st)
        documents.append(docs)
        scheduled += toks
    out = dataset_totals(list(source.component_names), source.lengths, tokens, documents)
    total_docs = int(sum(row["documents"] for row in out.values()))
    target = source.weights_at(tokens=scheduled, documents=total_docs)
    unit = source.weights_unit
    for i, row in enumerate(out.values()):
        row[f"{unit[:-1]}_share_target"] = float(target[i])
    return out


def dataset_totals(
    names: Sequence[str],
    sizes: Sequence[int] | None,
    tokens: Iterable[Sequence[int]],
    documents: Iterable[Sequence[int] | None],
) -> dict[str, dict[str, float]]:
    """``tokens``/``token_share``, ``documents``/``document_share`` and, given the
    datasets' sizes, ``epochs`` per dataset, summed over lanes (also what ``zephon
    inspect`` reads from a saved state). ``documents``: per lane, the documents it
    scheduled per dataset (None: unknown)."""
    n = len(names)
    tok = [0] * n
    for lane_tokens in tokens:
        for i, t in enumerate(lane_tokens[:n]):
            tok[i] += t
    docs = [0] * n
    for lane_docs in documents:
        if lane_docs is not None and len(lane_docs) == n:
            for i, c in enumerate(lane_docs):
                docs[i] += c
    tok_total, doc_total = sum(tok), sum(docs)
    out: dict[str, dict[str, float]] = {}
    for i, name in enumerate(names):
        row = {
            "tokens": float(tok[i]),
            "token_share": tok[i] / tok_total if tok_total else 0.0,
            "documents": float(docs[i]),
            "document_share": docs[i] / doc_total if doc_total else 0.0,
        }
        if sizes is not None and i < len(sizes) and sizes[i]:
            row["epochs"] = docs[i] / sizes[i]
        out[name] = row
    return out


def metrics_of(report: Mapping[str, Mapping[str, float]], prefix: str = "zephon/") -> dict:
    """Flat metric names: ``zephon/token_share/<name>``, ``zephon/epochs/<name>``, ..."""
    out = {}
    for name, row in report.items():
        for key, value in row.items():
            out[f"{prefix}{key}/{name}"] = float(value)
    return out
