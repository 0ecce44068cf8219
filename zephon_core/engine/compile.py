"""compile(): validate a pipeline description and plan how it runs (``docs/design.md`` §5).

* eviction mode -- monotone when every operator keeps cursor order, else
  epoch-based; ``flush_every_k_chunks`` is validated against it;
* the replay filter is inserted right before ``batch`` (or at the tail) and
  named after its neighbour;
* operators are grouped into stages: runs of stateless order-keeping
  operators with parallelism > 1 form a ``threads`` stage working on
  microbatches, or a ``processes`` stage when they ask for
  ``runner="processes"``; everything else runs ``inline``, item by item;
* which operator is the batch (and the replay filter) is decided here, once.

The plan holds bound operator *templates*. A run never feeds them: each lane takes
its own instances (``Operator.for_lane``), so a plan is immutable and can serve any
number of runs, iterators and DataLoader workers.
"""

from __future__ import annotations

import copy
import logging
import warnings
from dataclasses import dataclass
from typing import Any

from ..digests.content import content_fingerprints
from ..digests.fingerprint import fingerprint
from ..errors import ConfigError
from ..ops.base import OpContext, Operator
from ..ops.batch import BatchOp
from ..rng import derive_seed
from ..validate import int_arg
from .cores import core_share, resolve_parallelism
from .length_estimate import estimate_lengths
from .replay_filter import ReplayFilter
from .shipping import check_shippable

log = logging.getLogger(__name__)

DEFAULT_K = 4


@dataclass(frozen=True)
class Stage:
    runner: str  # "threads" | "processes" | "inline"
    ops: tuple[Operator, ...]
    indices: tuple[int, ...]  # the operators' positions in Plan.ops

    @property
    def parallel(self) -> bool:
        return self.runner != "inline"

    @property
    def cap(self) -> int:
        return sum(op.parallelism for op in self.ops) if self.parallel else 1


@dataclass(frozen=True)
class Plan:
    """The compiled plan of a pipeline description (see the module docstring)."""

    source: Any
    ops: tuple[Operator, ...]  # bound templates, the replay filter included
    stages: tuple[Stage, ...]
    replay_index: int | None  # position of the replay filter in ops
    batch_index: int | None  # position of the batch operator in ops
    epoch_based: bool
    k: int
    num_lanes: int
    seed: int
    prefetch: int
    queue_size: int
    checkpointing: bool
    stall_timeout_s: float | None
    config: dict[str, Any]
    content: dict[str, Any]
    fingerprint: str
    #: the core share ``parallelism="auto"`` was resolved with (None: no operator asked);
    #: a process with another share (a DataLoader worker) compiles its own plan
    auto_share: int | None = None

    def explain(self) -> str:
        lines = []
        for i, st in enumerate(self.stages):
            mode = "microbatches" if st.parallel else "stream_items"
            lines.append(f"Stage[{i}] place=local runner={st.runner} cap={st.cap} mode={mode}")
            sep = f" -[in_q={self.queue_size}]-> " if st.parallel else " -> "
            lines.append("  " + sep.join(op.label() for op in st.ops))
            if i + 1 < len(self.stages):
                lines.append(f"  --[stage_out={self.queue_size}]-->")
        lines.append(f"  ==[final_prefetch={self.prefetch}]==> pipeline_end")
        return "\n".join(lines)


def _fresh(op: Operator) -> Operator:
    """The plan's own copy of a user's operator (binding must not touch the user's)."""
    if type(op).__module__.startswith("zephon_core."):
        return copy.copy(op)
    try:
        return copy.deepcopy(op)
    except Exception:  # noqa: BLE001 - user objects that refuse deepcopy still run
        return copy.copy(op)


def _validate_ops(ops: list[Operator]) -> None:
    for i, op in enumerate(ops):
        if not isinstance(op, Operator):
            raise ConfigError(
                f"operator #{i} ({op!r}) is not a zephon_core.Operator; "
                "subclass Operator and pass it to pipe.then(op)"
            )
        p = resolve_parallelism(op.parallelism, where=f"operator {op.name!r}")
        if (p > 1 or op.parallelism == "auto") and not op.traits.stateless:
            raise ConfigError(
                f"operator {op.name!r} keeps state, so it cannot run with "
                f"parallelism={op.parallelism!r}; use parallelism=1"
            )
        runner = getattr(op, "runner", "threads")
        if runner not in ("threads", "processes"):
            raise ConfigError(
                f"operator {op.name!r}: runner={runner!r}; use 'threads' or 'processes'"
            )
        if runner == "processes" and not (op.traits.stateless and op.traits.preserves_cursor_order):
            raise ConfigError(
                f"operator {op.name!r} keeps state or reorders records, so "
                "it cannot run on worker processes; use runner='threads'"
            )
    batches = [i for i, op in enumerate(ops) if isinstance(op, BatchOp)]
    if len(batches) > 1:
        raise ConfigError(
            f"the pipeline has {len(batches)} batch operators; use one batch() at the end"
        )
    if batches:
        for op in ops[batches[0] + 1 :]:
            if not op.traits.preserves_cursor_order or not op.traits.stateless:
                raise ConfigError(
                    f"operator {op.name!r} after batch() buffers or reorders; only stateless "
                    "1:1 operators (e.g. map) may follow batch(), move it before batch()"
                )
    names = [op.name for op in ops]
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise ConfigError(
            f"operator names {dups} are used twice; pass name=... to tell them "
            "apart (names identify operators in errors and stats)"
        )


def resolve_k(k: int | None, monotone: bool) -> int:
    if k is None:
        return 0 if monotone else DEFAULT_K
    k = int_arg("flush_every_k_chunks", k, minimum=0)
    if monotone and k > 0:
        warnings.warn(
            f"flush_every_k_chunks={k} on a pipeline whose operators all keep "
            "cursor order: sentinels buy nothing there and would perturb batch "
            "boundaries, so it is forced to 0",
            stacklevel=4,
        )
        return 0
    if not monotone and k == 0:
        raise ConfigError(
            "flush_every_k_chunks=0 on a pipeline with reordering or "
            "history-keeping operators (pack, shuffle, ensure_mixture): without "
            "flush sentinels nothing could ever be evicted; set "
            f"flush_every_k_chunks to a positive value such as {DEFAULT_K}"
        )
    return k


def _stages(ops: list[Operator]) -> tuple[Stage, ...]:
    stages: list[Stage] = []
    for i, op in enumerate(ops):
        if getattr(op, "runner", "threads") == "processes":  # validated as stateless
            runner = "processes"
        elif op.traits.stateless and op.traits.preserves_cursor_order and op.parallelism > 1:
            runner = "threads"
        else:
            runner = "inline"
        if stages and stages[-1].runner == runner:
            last = stages[-1]
            stages[-1] = Stage(runner, last.ops + (op,), last.indices + (i,))
        else:
            stages.append(Stage(runner, (op,), (i,)))
    return tuple(stages)


def _bind(ops: list[Operator], source: Any, seed: int) -> None:
    for i, op in enumerate(ops):
        op.bind(
            OpContext(
                seed=derive_seed(seed, "op", i, op.name),
                index=i,
                component_names=tuple(source.component_names),
                weights=tuple(source.weights),
                source=source,
                upstream=tuple(ops[:i]),
            )
        )


def compile_plan(
    source: Any,
    ops: list[Operator],
    *,
    num_lanes: int,
    k: int | None,
    seed: int,
    prefetch: int,
    queue_size: int,
    checkpointing: bool,
    stall_timeout_s: float | None = None,
) -> Plan:
    _validate_ops(ops)
    monotone = all(op.traits.preserves_cursor_order for op in ops)
    k = resolve_k(k, monotone)
    ops = [_fresh(op) for op in ops]  # the user's objects stay unbound
    auto_share = core_share() if any(op.parallelism == "auto" for op in ops) else None
    for op in ops:  # "auto": this process's share of the cores (a worker's, in a worker)
        op.parallelism = resolve_parallelism(op.parallelism, where=f"operator {op.name!r}")
    batch_index = next((i for i, op in enumerate(ops) if isinstance(op, BatchOp)), None)
    user_ops = list(ops)
    replay_index = None
    if checkpointing:
        at = batch_index if batch_index is not None else len(ops)
        neighbour = (
            ops[batch_index].name
            if batch_index is not None
            else (ops[-1].name if ops else "source")
        )
        ops.insert(at, ReplayFilter(f"{neighbour}_replay_filter", monotone=monotone))
        replay_index = at
        if batch_index is not None:
            batch_index += 1
    _bind(ops, source, seed)
    # once per compile: the restore compares them, and they key the length estimate
    content = content_fingerprints(source, user_ops)
    if getattr(source, "needs_length_estimate", ()):
        # token-weighted mixing without given lengths: measure with these operators
        source = estimate_lengths(source, ops, seed, content)
        _bind(ops, source, seed)
    for op in ops:
        if getattr(op, "runner", "threads") == "processes":
            check_shippable(op)  # bound: exactly what the workers will receive
    config = {
        "canonical_replicas": num_lanes,
        "flush_every_k_chunks": k,
        "seed": seed,
        "source": source.describe(),
        "ops": [op.describe() for op in user_ops],
    }
    return Plan(
        source=source,
        ops=tuple(ops),
        stages=_stages(ops),
        replay_index=replay_index,
        batch_index=batch_index,
        epoch_based=not monotone,
        k=k,
        num_lanes=num_lanes,
        seed=seed,
        prefetch=prefetch,
        queue_size=queue_size,
        checkpointing=checkpointing,
        stall_timeout_s=stall_timeout_s,
        config=config,
        content=content,
        fingerprint=fingerprint(config),
        auto_share=auto_share,
    )
