"""The typed, versioned state of one lane of a ``StaticMixtureWorkSource``.

Why typed: the checkpoint holds a lane's source state as a plain dict, and every field
of it is checked when it is read back (a state from another source or a damaged file
is refused, never half-loaded). :class:`MixtureLaneState` is that check and that
dict in one place: ``from_dict`` validates what a ``to_dict`` wrote, and ``to_dict``
writes exactly the dict the checkpoint held before this class existed, so states
written by earlier releases restore unchanged.

Versions: ``1`` schedules by smooth weighted round-robin over documents (``swrr``
credits; ``retired`` only once a re-mix removed a dataset); ``2`` by token deficits
(``deficits`` and ``tokens``, the tokens scheduled on this lane; ``retired`` always).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import CorruptCheckpoint
from ..validate import is_int as _is_int

__all__ = ["DEFICIT_VERSION", "MixtureLaneState", "SWRR_VERSION", "lane_scheduled"]

SWRR_VERSION = 1  # smooth round-robin over documents (static weights)
DEFICIT_VERSION = 2  # token deficits (token shares or a schedule)
_KEYS = {
    SWRR_VERSION: frozenset({"version", "next_chunk_id", "cursors", "swrr", "exhausted"}),
    DEFICIT_VERSION: frozenset(
        {"version", "next_chunk_id", "cursors", "deficits", "tokens", "retired", "exhausted"}
    ),
}


@dataclasses.dataclass
class MixtureLaneState:
    """One lane's position: ``cursors`` (per dataset, how many of this lane's positions
    were consumed), the scheduler's ``credits`` (``swrr`` or ``deficits``), and the
    counters that check them against each other."""

    version: int
    next_chunk_id: int
    cursors: list[int]
    #: the scheduler's state: ``swrr`` (version 1) or ``deficits`` (version 2), as the
    #: scheduler's own ``state_dict()`` wrote it (it validates it at its load)
    credits: Any
    exhausted: bool
    #: pointers read from datasets a re-mix removed
    retired: int = 0
    #: tokens scheduled on this lane (version 2: the position a weight schedule reads)
    tokens: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The plain dict the checkpoint holds (its keys are those of every release)."""
        if self.version == DEFICIT_VERSION:
            return {
                "version": DEFICIT_VERSION,
                "next_chunk_id": self.next_chunk_id,
                "cursors": list(self.cursors),
                "deficits": self.credits,
                "tokens": self.tokens,
                "retired": self.retired,
                "exhausted": self.exhausted,
            }
        out = {
            "version": SWRR_VERSION,
            "next_chunk_id": self.next_chunk_id,
            "cursors": list(self.cursors),
            "swrr": self.credits,
            "exhausted": self.exhausted,
        }
        if self.retired:
            out["retired"] = self.retired
        return out

    @classmethod
    def from_dict(
        cls, state: Any, version: int, limits: Sequence[int | None], names: Sequence[str],
        where: str,
    ) -> MixtureLaneState:  # fmt: skip
        """Validate a saved state of ``version`` for datasets ``names`` (each cursor at
        most its limit; None: unbounded).

        Raises:
            CorruptCheckpoint: the state is malformed or of another version.
        """
        if not isinstance(state, Mapping):
            raise CorruptCheckpoint(f"{where}: state must be a dict, got {type(state).__name__}")
        if state.get("version") != version:
            kind = "token-deficit" if version == DEFICIT_VERSION else "round-robin"
            raise CorruptCheckpoint(
                f"{where}: state version {state.get('version')!r}, but this source schedules "
                f"by {kind} (version {version}): the state comes from a differently "
                "configured source"
            )
        keys = _KEYS[version]
        got = set(state) - ({"retired"} if version == SWRR_VERSION else set())
        if got != keys:
            raise CorruptCheckpoint(
                f"{where}: state keys {sorted(map(str, state))} != expected {sorted(keys)}"
            )
        next_id, cursors, exhausted = state["next_chunk_id"], state["cursors"], state["exhausted"]
        retired = state.get("retired", 0)
        if not _is_int(next_id) or next_id < 0:
            raise CorruptCheckpoint(f"{where}: next_chunk_id must be an int >= 0, got {next_id!r}")
        if not _is_int(retired) or retired < 0:
            raise CorruptCheckpoint(f"{where}: retired must be an int >= 0, got {retired!r}")
        n_ds = len(names)
        if not isinstance(cursors, (list, tuple)) or len(cursors) != n_ds:
            raise CorruptCheckpoint(
                f"{where}: cursors must be a list of {n_ds} ints, got {cursors!r}"
            )
        for d, (cur, lim) in enumerate(zip(cursors, limits, strict=True)):
            if not _is_int(cur) or cur < 0 or (lim is not None and cur > lim):
                raise CorruptCheckpoint(
                    f"{where}: cursor of dataset {names[d]!r} is {cur!r}, "
                    f"expected an int in [0, {'inf' if lim is None else lim}]"
                )
        if not isinstance(exhausted, bool):
            raise CorruptCheckpoint(f"{where}: exhausted must be a bool, got {exhausted!r}")
        tokens = state.get("tokens", 0)
        if version == DEFICIT_VERSION and (not _is_int(tokens) or tokens < 0):
            raise CorruptCheckpoint(f"{where}: tokens must be an int >= 0, got {tokens!r}")
        return cls(
            version=version,
            next_chunk_id=int(next_id),
            cursors=[int(c) for c in cursors],
            credits=state["deficits" if version == DEFICIT_VERSION else "swrr"],
            exhausted=exhausted,
            retired=int(retired),
            tokens=int(tokens) if version == DEFICIT_VERSION else 0,
        )

    def check_progress(self, chunk_size: int) -> None:
        """The cursors must account for every pointer of the chunks produced.

        Raises:
            CorruptCheckpoint: they do not (a state of a differently configured source).
        """
        consumed = sum(self.cursors) + self.retired
        next_id = self.next_chunk_id
        fits = consumed == next_id * chunk_size or (
            self.exhausted and (next_id - 1) * chunk_size < consumed <= next_id * chunk_size
        )
        if not fits:
            raise CorruptCheckpoint(
                f"cursors sum to {consumed} pointers but {next_id} chunks of {chunk_size} "
                "were produced: the state comes from a differently configured source"
            )


def remixed_state(
    old_names: Sequence[str], state: Any, names: Sequence[str], deficit: bool
) -> dict[str, Any]:
    """A lane state saved under another mixture (``old_names`` in its order), for the
    datasets ``names``: every dataset in both keeps its cursor (its position and
    epochs), new ones start at 0, the scheduler's credits start afresh, and the
    pointers of removed datasets count as ``retired``.

    Raises:
        CorruptCheckpoint: the saved state is malformed.
    """
    if not isinstance(state, Mapping) or not isinstance(state.get("cursors"), list):
        raise CorruptCheckpoint(f"a lane's source state is malformed: {state!r}")
    old = list(state["cursors"])
    if len(old) != len(old_names) or not all(_is_int(c) and c >= 0 for c in old):
        raise CorruptCheckpoint(f"source cursors {old!r} do not fit datasets {old_names!r}")
    by_name = dict(zip(old_names, old, strict=True))
    retired = int(state.get("retired", 0)) + sum(c for n, c in by_name.items() if n not in names)
    tokens = state.get("tokens", 0)
    n = len(names)
    return MixtureLaneState(
        version=DEFICIT_VERSION if deficit else SWRR_VERSION,
        next_chunk_id=state["next_chunk_id"],
        cursors=[int(by_name.get(name, 0)) for name in names],
        credits=[0] * n,
        exhausted=False,
        retired=retired,
        tokens=tokens if _is_int(tokens) else 0,
    ).to_dict()


def lane_scheduled(state: Any) -> tuple[tuple[int, ...] | None, int]:
    """(documents scheduled per dataset, tokens scheduled) by one lane, read from its
    saved state without validating it (the mixture report and ``zephon inspect``)."""
    if not isinstance(state, Mapping):
        return None, 0
    cursors, tokens = state.get("cursors"), state.get("tokens")
    docs = tuple(cursors) if isinstance(cursors, list) else None
    return docs, tokens if isinstance(tokens, int) else 0
