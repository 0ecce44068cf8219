"""Re-mixing at a restore: new weights, new or removed datasets, positions kept.
(``docs/design.md`` §8)

Why: changing the mixture mid-run (an annealing phase, an ablation, a new dataset) is
the usual deliberate change, and a restore would otherwise refuse it as another
configuration. ``load_state_dict(state, allow_changes={"weights"})`` (and
``"components"`` to add or remove datasets) translates the checkpoint instead:

* every dataset in both mixtures keeps its cursors, so its position and epoch
  counters continue; a new dataset starts at its beginning;
* the inflight chunks replay exactly as they were written (they are renumbered to the
  new dataset order), so everything delivered before the cut stays delivered once;
  chunks after them follow the new weights, with the scheduler's credits started
  afresh;
* the translated state carries the new fingerprint, so the re-mixed run's own
  checkpoints resume exactly.

Datasets keep their places (each one's shuffle is keyed by its position): new ones are
appended, removed ones leave from the end. A removed dataset may still have pointers
in the inflight chunks; they must be read to replay exactly, so such a restore is
refused with the fix: keep the dataset with weight 0 for this restore (nothing new is
read from it) and drop it at a later checkpoint, once its inflight chunks are gone.

Operators with mixture targets (``ensure_mixture``: the source weights, or its own
``weights=``, which a re-mix may change too -- e.g. to name an added dataset) keep their
old targets in every flush segment that started before the first re-mixed chunk (the
lane state's ``prior``), so their replay repeats the delivered order exactly; later
segments follow the new targets. A second re-mix waits until each lane has passed a
flush since the first.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from ..chunk import WorkChunk
from ..digests.fingerprint import config_diff
from ..errors import ConfigError, IncompatibleCheckpoint
from ..ops.base import described_mixture_keys
from .resize import accept_resized, resize_lines, resized, resized_refusal
from .state import LaneState, PipelineState, Prior

log = logging.getLogger(__name__)

#: the allow_changes= names that re-mix
REMIX_CHANGES = frozenset({"weights", "components"})


def mixture_only_diff(
    saved: Mapping[str, Any], current: Mapping[str, Any], source: Any, ops: Sequence[Any] = ()
):
    """(other differences, mixture differences, component differences) of two configs;
    ``ops``: the operators of ``current`` (their ``mixture_keys`` are mixture too); a
    dataset's changed length counts as "other" (see :func:`classify_diff`)."""
    other, mix, comp, data = classify_diff(saved, current, source, ops)
    return other + data, mix, comp


def classify_diff(
    saved: Mapping[str, Any], current: Mapping[str, Any], source: Any, ops: Sequence[Any] = ()
):
    """(other, mixture, component, data) differences of two configs: ``data`` holds the
    length changes of datasets in both (their data changed: ``resize.py``)."""
    # a live source, a Source class (``zephon diff`` knows only the class), or None
    mix_keys = source.MIXTURE_KEYS if source is not None else frozenset()
    comp_keys = source.COMPONENT_KEYS if source is not None else frozenset()
    data_paths = resize_lines(saved, current)
    other, mix, comp, data = [], [], [], []
    for line in config_diff(saved, current):
        path = line.split(":", 1)[0]
        head = path.split(".")
        key = head[1].split("[", 1)[0] if len(head) > 1 and head[0] == "source" else None
        if path in data_paths:
            data.append(line)
        elif _op_mixture_key(head, current, ops):
            mix.append(line)
        elif key in comp_keys:
            comp.append(line)
        elif key in mix_keys:
            mix.append(line)
        else:
            other.append(line)
    return other, mix, comp, data


def _op_mixture_key(head: list[str], current: Mapping[str, Any], ops: Sequence[Any]) -> bool:
    """Whether a diff path (split at dots) is ``ops[i].<a mixture key of operator i>``:
    by the live operators ``ops`` when given, else by operator i's description (its
    ``"op"`` kind), so two states compare as a restore would (``zephon diff``)."""
    if len(head) < 2 or not head[0].startswith("ops[") or not head[0].endswith("]"):
        return False
    try:
        described = current["ops"][int(head[0][4:-1])]
        name = described["name"]
    except (KeyError, IndexError, TypeError, ValueError):
        return False
    key = head[1].split("[", 1)[0]
    if any(op.name == name and key in op.mixture_keys for op in ops):
        return True
    return key in described_mixture_keys(described)


def prior_targets(prior: Prior, op: Any) -> tuple[float, ...] | None:
    """The old targets ``op`` keeps in a flush segment begun before the re-mix (None:
    its own): its own old targets by name, else, for an operator that reads the source
    weights (a custom one has no ``mixture_keys``), the old source weights."""
    for name, targets in prior.ops:
        if name == op.name:
            return targets
    return prior.targets if op.reads_source_weights else None


def remix(state: PipelineState, plan: Any, allowed: frozenset[str]) -> PipelineState:
    """``state`` translated for ``plan``'s mixture (see the module docstring).

    Raises:
        IncompatibleCheckpoint: anything beyond the allowed mixture changes differs, a
            removed dataset is still inflight, or the source cannot re-mix.
    """
    source = plan.source
    other, mix, comp, _ = classify_diff(state.config, plan.config, source, plan.ops)
    changed = resized(state.config, plan.config)
    if changed and "data" not in allowed:  # the root cause: the data, not the mixture
        raise resized_refusal(changed, state.content, plan.content, other)
    refused = list(other)
    if comp and "components" not in allowed:
        refused += comp + ["(datasets were added or removed: allow_changes={'components'})"]
    if mix and not allowed & REMIX_CHANGES:
        refused += mix
    if refused:
        raise IncompatibleCheckpoint(
            "the checkpoint was written by a differently configured pipeline: "
            + "; ".join(refused[:10])
            + ". Rebuild the pipeline as it was; only the mixture may change at a restore "
            "(allow_changes={'weights'} / {'weights', 'components'})"
        )
    translate = source.remix_lane_state  # Source's default refuses: it cannot re-mix
    old_names = list(state.config["source"]["names"])
    new_names = list(source.component_names)
    index = {d: (new_names.index(n) if n in new_names else None) for d, n in enumerate(old_names)}
    moved = [(old_names[d], d, i) for d, i in index.items() if i is not None and i != d]
    if moved:
        name, d, i = moved[0]
        raise IncompatibleCheckpoint(
            f"dataset {name!r} moved from position {d} to {i} in the mixture; its shuffle is "
            "keyed by its position, so its rows would change: keep the existing datasets in "
            "their order, append new ones at the end, and leave a dataset in place with "
            "weight 0 rather than removing it from the middle"
        )
    old_w = tuple(float(w) for w in state.config["source"].get("weights", []))

    def in_new_order(old: tuple[float, ...]) -> tuple[float, ...]:
        targets = [0.0] * len(new_names)
        for d, w in enumerate(old):
            if index.get(d) is not None:
                targets[index[d]] = w / (sum(old) or 1.0)
        return tuple(targets)

    op_targets = _old_op_targets(state, plan, tuple(old_names), old_w)
    prior = in_new_order(old_w), tuple((name, in_new_order(t)) for name, t in op_targets)
    lanes = {}
    for lane, ls in state.lanes.items():
        lanes[lane] = _remix_lane(ls, old_names, new_names, index, translate, prior)
    log.info(
        "re-mixed the checkpoint: datasets %s -> %s (%s)",
        old_names,
        new_names,
        "; ".join((mix + comp)[:6]),
    )
    state = dataclasses.replace(state, lanes=lanes)
    if changed:  # allow_changes has "data": datasets of other lengths continue too
        state = accept_resized(state, plan)
    return dataclasses.replace(state, fingerprint=plan.fingerprint, config=plan.config)


def _old_op_targets(
    state: PipelineState, plan: Any, old_names: tuple[str, ...], old_w: tuple[float, ...]
) -> list[tuple[str, tuple[float, ...]]]:
    """(name, targets in the checkpoint's dataset order) of every operator with mixture
    targets, as the checkpoint's configuration describes it."""
    described = {d.get("name"): d for d in state.config.get("ops", []) if isinstance(d, dict)}
    out = []
    for op in plan.ops:
        if not op.mixture_keys or op.name not in described:
            continue
        try:
            out.append((op.name, op.targets_from(described[op.name], old_names, old_w)))
        except ConfigError as e:
            raise IncompatibleCheckpoint(
                f"operator {op.name!r}: its targets in the checkpoint cannot be read ({e})"
            ) from e
    return out


def _remix_lane(ls: LaneState, old_names, new_names, index, translate, prior) -> LaneState:
    if ls.prior is not None and ls.floor < ls.prior[0]:
        raise IncompatibleCheckpoint(
            f"lane {ls.lane} was re-mixed at chunk {ls.prior[0]} and has not passed a flush "
            "since: train a few more steps under the current mixture before re-mixing again"
        )
    if ls.exhausted:
        raise IncompatibleCheckpoint(
            f"lane {ls.lane} of the checkpoint had ended; a finished stream cannot be "
            "re-mixed: start a new run over the new mixture"
        )
    chunks = []
    for ch in ls.chunks:
        gone = [old_names[c] for c in ch.components if index[c] is None]
        if gone:
            raise IncompatibleCheckpoint(
                f"dataset {gone[0]!r} was removed, but lane {ls.lane}'s inflight chunk "
                f"{ch.chunk_id} still points into it ({len(gone)} rows), and replay must "
                f"read them: keep {gone[0]!r} in datasets with weight 0 for this restore "
                "(nothing new is read from it) and remove it at a later checkpoint"
            )
        components = tuple(index[c] for c in ch.components)
        chunks.append(WorkChunk(ch.lane, ch.chunk_id, components, ch.rows, ch.seed, ch.dropped))
    tokens = [0] * len(new_names)
    for d, t in enumerate(ls.tokens):
        if index.get(d) is not None:
            tokens[index[d]] = t
    new = ls.copy()
    new.chunks, new.tokens = chunks, tokens
    new.source = translate(old_names, ls.source)
    # flush segments that started before the first re-mixed chunk keep the old targets,
    # so their replay (now and at any later resume) repeats what was delivered
    new.prior = Prior(ls.next_chunk, *prior)
    return new
