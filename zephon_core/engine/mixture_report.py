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

__all__ = ["dataset_totals", "metrics_of", "mixture_report"]


def mixture_report(
    source: Any, tokens: Iterable[Sequence[int]], source_states: Iterable[Mapping[str, Any]]
) -> dict[str, dict[str, float]]:
    """Per-dataset numbers from the lanes' delivered token counters and source states."""
    states = list(source_states)
    out = dataset_totals(
        list(source.component_names), getattr(source, "lengths", None), tokens, states
    )
    scheduled = sum(
        st["tokens"]
        for st in states
        if isinstance(st, Mapping) and isinstance(st.get("tokens"), int)
    )
    target = _target(source, scheduled, int(sum(row["documents"] for row in out.values())))
    if target is not None:
        unit = getattr(source, "weights_unit", "documents")
        for i, row in enumerate(out.values()):
            row[f"{unit[:-1]}_share_target"] = target[i]
    return out


def dataset_totals(
    names: Sequence[str],
    sizes: Sequence[int] | None,
    tokens: Iterable[Sequence[int]],
    source_states: Iterable[Mapping[str, Any]],
) -> dict[str, dict[str, float]]:
    """``tokens``/``token_share``, ``documents``/``document_share`` and, given the
    datasets' sizes, ``epochs`` per dataset, summed over lanes (also what ``zephon
    inspect`` reads from a saved state)."""
    n = len(names)
    tok = [0] * n
    for lane_tokens in tokens:
        for i, t in enumerate(lane_tokens[:n]):
            tok[i] += t
    docs = [0] * n
    for st in source_states:
        cursors = st.get("cursors") if isinstance(st, Mapping) else None
        if isinstance(cursors, list) and len(cursors) == n:
            for i, c in enumerate(cursors):
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


def _target(source: Any, scheduled_tokens: int, documents: int) -> Sequence[float] | None:
    at = getattr(source, "weights_at", None)
    if at is not None:
        return list(at(tokens=scheduled_tokens, documents=documents))
    weights = getattr(source, "weights", None)
    return list(weights) if weights is not None else None


def metrics_of(report: Mapping[str, Mapping[str, float]], prefix: str = "zephon/") -> dict:
    """Flat metric names: ``zephon/token_share/<name>``, ``zephon/epochs/<name>``, ..."""
    out = {}
    for name, row in report.items():
        for key, value in row.items():
            out[f"{prefix}{key}/{name}"] = float(value)
    return out
