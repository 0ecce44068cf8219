"""Running a microbatch through a run of operators, and naming what failed.

Shared by every runner: inline stages, ``threads`` stages and the worker processes
of ``processes`` stages. Tombstones skip the operators: they go straight to the
caller's list (they tell the tracker children will never be delivered).
"""

from __future__ import annotations

from collections.abc import Sequence
from time import perf_counter

from ..errors import PipelineError, ZephonError
from ..ops.base import Operator
from ..records import TOMBSTONE, Record
from .stats import OpStats


def call_failed(op: Operator, lane: int, record: Record | None, e: Exception) -> PipelineError:
    where = f" at cursor {tuple(record.cursor)}" if record is not None else ""
    return PipelineError(
        f"operator {op.name!r} failed on lane {lane}{where}: {type(e).__name__}: {e}",
        operator=op.name,
        cursor=record.cursor if record is not None else None,
    )


def _failing_record(op: Operator, records: list[Record]) -> Record | None:
    """Which record made a stateless operator fail (re-running it is side-effect free)."""
    if len(records) == 1 or not op.traits.stateless or getattr(op, "batched", False):
        # a stateful operator cannot be re-run to find the culprit
        return records[0] if records else None
    for r in records:
        try:
            op.process(r)
        except Exception:  # noqa: BLE001
            return r
    return None


def run_ops(
    ops: Sequence[Operator],
    records: list[Record],
    lane: int,
    tombs: list[Record],
    stats: Sequence[OpStats],
) -> list[Record]:
    """Push a microbatch through ``ops`` layer by layer; tombstones skip to ``tombs``.

    Layer-by-layer equals item-by-item because each operator's output depends
    only on the sequence of its own inputs. ``stats[i]`` counts ``ops[i]``.
    """
    for op, st in zip(ops, stats):
        if not records:
            return records
        live = [r for r in records if r.payload is not TOMBSTONE]
        if len(live) != len(records):
            tombs.extend(r for r in records if r.payload is TOMBSTONE)
        t0 = perf_counter()
        if op.traits.stateless or type(op).process_many is not Operator.process_many:
            try:
                records = op.process_many(live)
            except ZephonError:  # already typed and located
                raise
            except Exception as e:  # noqa: BLE001 - re-raised with where it came from
                raise call_failed(op, lane, _failing_record(op, live), e) from e
        else:
            records = []
            r = None
            try:
                for r in live:
                    records.extend(op.process(r))
            except ZephonError:  # already typed and located
                raise
            except Exception as e:  # noqa: BLE001
                raise call_failed(op, lane, r, e) from e
        st.seconds += perf_counter() - t0
        st.records_in += len(live)
        st.records_out += len(records)
    return records
