"""The operator contract (``docs/design.md`` §4).

An operator turns one lane's records into records. Compile binds one *template* per
operator; every lane of a run gets its own instance, ``template.for_lane(lane)``, and
a flush sentinel hands the lane a fresh one -- so "back to the state of a freshly
constructed operator, RNG included" holds by construction. Stateless operators are
used as they are (one instance for every lane; they may run on worker threads or
processes).

What an operator owes replay:

* set ``preserves_cursor_order=False`` if it buffers, reorders or keeps any
  history across records;
* propagate contributor metadata and set ``is_last_child`` correctly;
* emit tombstones for children it drops;
* ``flush()`` emits everything the instance holds -- the instance is dropped after
  it, and the runner checks that every offset of the epoch was delivered or
  tombstoned (``ContractViolation`` otherwise) -- except an operator whose traits say
  ``holds_across_flush``: it keeps its instance and reports what it keeps in
  ``held()`` (``batch(drop_last=True)`` and its partial batch, the one stall the
  pipeline allows);
* randomness is a pure function of (operator seed, ``ctx.lane``, something replay
  reproduces), never a counter kept elsewhere;
* ``describe()`` returns every parameter that changes the output (the configuration
  fingerprint), and ``content_fingerprint()`` a digest of user code it runs, if any
  (compared on restore; see ``digests/content.py``).

Tombstones never reach ``process``: the runner forwards them itself. Token arrays
reaching an operator that counts or concatenates tokens go through
:func:`token_array`, which refuses float or multi-dimensional ids.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ConfigError, ContractViolation
from ..records import Record


@dataclass(frozen=True)
class OpTraits:
    """Static facts about an operator that compile() plans with.

    Attributes:
        preserves_cursor_order: records leave in the order their cursors entered.
        stateless: holds nothing between records (may run on worker threads/processes).
        holds_across_flush: keeps its instance, and records (``held()``), over a flush.
    """

    preserves_cursor_order: bool = True
    stateless: bool = False
    holds_across_flush: bool = False


@dataclass(frozen=True)
class OpContext:
    """What compile() tells an operator about the pipeline it runs in (``lane`` is set
    on the instances ``for_lane`` makes; the template has None)."""

    seed: int
    index: int
    component_names: tuple[str, ...]
    weights: tuple[float, ...]
    source: Any = None
    upstream: tuple[Operator, ...] = field(default=())
    lane: int | None = None


class Operator:
    """Base class of all operators. Subclasses override ``process`` (and ``flush`` when
    they hold records).

    Example::

        class Reverse(Operator):
            traits = OpTraits(stateless=True)

            def process(self, record):
                ids = record.payload["input_ids"][::-1]
                return [record.with_payload({**record.payload, "input_ids": ids})]
    """

    traits = OpTraits()
    name = "op"
    parallelism = 1
    runner = "threads"  # where parallel work runs: "threads" or "processes" (stateless ops)

    def bind(self, ctx: OpContext) -> None:
        """Called once by compile() on the template, before any record flows."""
        self.ctx = ctx

    def for_lane(self, lane: int) -> Operator:
        """A fresh instance serving ``lane``. Default: a deep copy of the bound template
        (which never saw a record) with ``ctx.lane`` set; the context itself, with the
        source it refers to, is shared, not copied. Override it when a copy is costly."""
        ctx = dataclasses.replace(self.ctx, lane=lane)
        return copy.deepcopy(self, {id(self.ctx): ctx})

    #: the operator's behaviour depends on the source's mixture weights (``ctx.weights``);
    #: such operators implement ``set_targets`` so a re-mix can keep the old ones where
    #: replay needs them (``checkpoint/remix.py``)
    reads_source_weights = False

    #: ``describe()`` keys that hold mixture targets (``ensure_mixture``'s ``weights``): a
    #: re-mix may change them, and the operator keeps its old targets where replay needs
    #: them. Such operators implement ``set_targets`` and ``targets_from``.
    mixture_keys: frozenset[str] = frozenset()

    #: the ``"op"`` its ``describe()`` names, when that is not the class name: a
    #: configuration read without live operators (``zephon diff`` of two states) finds an
    #: operator's ``mixture_keys`` by it (:func:`described_mixture_keys`)
    described_as: str | None = None

    def set_targets(self, weights: tuple[float, ...]) -> None:
        """Use ``weights`` (normalized, in component order) as the mixture targets."""
        raise NotImplementedError(f"{type(self).__name__} has no mixture targets")

    def targets_from(
        self, described: dict[str, Any], names: tuple[str, ...], weights: tuple[float, ...]
    ) -> tuple[float, ...]:
        """The normalized targets of the operator ``described`` (a ``describe()`` of this
        kind, e.g. from a checkpoint's configuration) over datasets ``names`` whose source
        weights were ``weights``."""
        raise NotImplementedError(f"{type(self).__name__} has no mixture targets")

    def process(self, record: Record) -> Iterable[Record]:
        raise NotImplementedError

    def process_many(self, records: list[Record]) -> list[Record]:
        """Process a microbatch; the default calls ``process`` per record."""
        out: list[Record] = []
        for r in records:
            out.extend(self.process(r))
        return out

    def flush(self) -> Iterable[Record]:
        """Emit everything held (a flush sentinel; the instance is replaced afterwards)."""
        return ()

    def finish(self) -> Iterable[Record]:
        """End of the lane's stream. Defaults to ``flush``."""
        return self.flush()

    def held(self) -> list[Record]:
        """Records kept over a flush (``holds_across_flush`` operators only)."""
        return []

    def describe(self) -> dict[str, Any]:
        """JSON-able parameters that determine the output (part of the fingerprint)."""
        return {"op": type(self).__name__, "name": self.name}

    def content_fingerprint(self) -> str | None:
        """A digest of the user code this operator runs (``map``/``filter`` functions),
        compared on restore; None when ``describe()`` already says everything."""
        return None

    def label(self) -> str:
        return f"{self.name}@p{self.parallelism}"


def described_mixture_keys(described: Any) -> frozenset[str]:
    """The ``mixture_keys`` of the operator class a configuration entry (a ``describe()``)
    was written by, found by its ``"op"``; empty when no loaded class has mixture keys
    under that name (the built-in ones are loaded with ``zephon_core``)."""
    kind = described.get("op") if isinstance(described, dict) else None
    todo, seen = [Operator], set()
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        todo += cls.__subclasses__()
        if cls.mixture_keys and kind == (cls.described_as or cls.__name__):
            return cls.mixture_keys
    return frozenset()


def token_array(op: Operator, record: Record, key: str) -> Any:
    """``record.payload[key]`` checked to be a 1-D array (or list) of integer token ids.

    Raises:
        ConfigError: the payload has no ``key`` (tokenize with ``map()`` first).
        ContractViolation: the ids are not integers (floats would be truncated silently)
            or not one-dimensional.
    """
    try:
        tokens = record.payload[key]
    except (KeyError, TypeError, IndexError) as e:
        raise ConfigError(
            f"{op.name}: payload at cursor {tuple(record.cursor)} has no {key!r} "
            "token array; tokenize with map() first"
        ) from e
    arr = tokens if isinstance(tokens, np.ndarray) else np.asarray(tokens)
    if arr.ndim != 1 or (arr.dtype.kind not in "iu" and arr.size):
        raise ContractViolation(
            f"operator {op.name!r}: {key!r} at cursor {tuple(record.cursor)} is a "
            f"{arr.ndim}-D {arr.dtype} array of shape {arr.shape}; token ids must be a 1-D "
            "integer array (np.int32/np.int64): convert them in your map function"
        )
    return tokens


def check_tokens(op: Operator, records: list[Record], key: str, joined: Any) -> None:
    """One check of a concatenation of ``records``' token arrays (pack's and batch's hot
    path): a float or multi-dimensional member makes the whole result one; then name it."""
    if joined.ndim == 1 and not joined.size:
        return
    for r in records:
        token_array(op, r, key)
    raise ContractViolation(
        f"operator {op.name!r}: the {key!r} arrays of "
        f"{len(records)} records do not concatenate to 1-D integer ids"
    )
