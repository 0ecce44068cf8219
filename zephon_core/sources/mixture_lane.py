"""One lane of a ``StaticMixtureWorkSource``: its cursors, its scheduler, its rows.

The lane composes the concepts of the mixture: the rows at its cursors
(``mixture_rows.py``), the dataset of each slot (``scheduling.py``), its typed state
(``mixture_state.py``) and the repetition warning (``repetition.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..chunk import WorkChunk
from ..errors import CorruptCheckpoint
from ..rng import derive_seed
from .mixture_rows import LaneRows
from .mixture_state import DEFICIT_VERSION, SWRR_VERSION, MixtureLaneState
from .repetition import RepetitionWatch
from .scheduling import DeficitScheduler, RoundRobinScheduler

__all__ = ["StaticMixtureLane"]


class StaticMixtureLane:
    """The running state of one lane of a :class:`StaticMixtureWorkSource`: its
    cursors, its scheduler and its rows (``state_dict()``: a
    :class:`~zephon_core.sources.mixture_state.MixtureLaneState` as a plain dict)."""

    # ``source``: the StaticMixtureWorkSource (not imported: it imports this module)
    def __init__(self, source: Any, lane: int, num_lanes: int, seed: int):
        self._src = source
        self.lane = lane
        self.num_lanes = num_lanes
        self._seed = seed
        self._deficit = source.deficit_mode
        self._version = DEFICIT_VERSION if self._deficit else SWRR_VERSION
        self._sched: DeficitScheduler | RoundRobinScheduler = (
            DeficitScheduler(source, num_lanes) if self._deficit else RoundRobinScheduler(source)
        )
        self._rows = LaneRows(source, lane, num_lanes)
        self._retired = 0
        self._cursors = [0] * len(source.lengths)
        self._next_chunk_id = 0
        self._watch = RepetitionWatch(source.component_names, source.lengths)
        self._exhausted = self._rows.drained(self._cursors)

    @property
    def next_chunk_id(self) -> int:
        """The id of the chunk ``next_chunk()`` returns next."""
        return self._next_chunk_id

    def next_chunk(self) -> WorkChunk | None:
        """The next chunk (ids 0, 1, ...), or ``None`` once the lane has ended."""
        if self._exhausted:
            return None
        picks, rows = self._sched.fill(self._cursors, self._retired, self._rows)
        self._exhausted = self._rows.drained(self._cursors)
        self._check_repetition(picks)
        chunk_id = self._next_chunk_id
        self._next_chunk_id += 1
        return WorkChunk(
            lane=self.lane,
            chunk_id=chunk_id,
            components=tuple(picks),
            rows=rows,
            seed=derive_seed(self._seed, self.lane, chunk_id),
        )

    def pointer_epochs(self, chunks: Sequence[WorkChunk]) -> list[list[int]] | None:
        """The dataset epoch of each pointer of ``chunks``, the last consecutive chunks
        this lane made: cursor ``k`` of dataset ``d`` is position ``lane + C * k`` of its
        epochs, epoch ``position // N_d``, and walking the chunks back from the lane's
        cursors gives each pointer's cursor. None when the chunks do not end where the
        lane stands (they were not its last ones). Plain ints: a chunk holds tens of
        pointers, where numpy's per-call cost would dominate."""
        lengths, lane, c = self._src.lengths, self.lane, self.num_lanes
        cursors = list(self._cursors)
        n_ds = len(cursors)
        expected = self._next_chunk_id - 1
        out: list[list[int]] = []
        for chunk in reversed(chunks):
            if chunk.chunk_id != expected:
                return None
            expected -= 1
            comps = chunk.components
            epochs = [0] * len(comps)
            for j in range(len(comps) - 1, -1, -1):
                d = comps[j]
                if not 0 <= d < n_ds or cursors[d] <= 0:
                    return None
                cursors[d] -= 1
                epochs[j] = (lane + c * cursors[d]) // lengths[d]
            out.append(epochs)
        return out[::-1]

    def _check_repetition(self, picks: list[int]) -> None:
        """Warn (once per job and dataset) when a dataset starts repeating while another
        weighted one has not finished its first epoch."""
        rows, cursors, src = self._rows, self._cursors, self._src
        for d in dict.fromkeys(picks):
            if self._watch.seen(d) or rows.epoch_fraction(d, cursors[d] - 1) < 1:
                continue  # warned, or still in its first epoch
            behind = {
                src.component_names[e]: rows.epoch_fraction(e, cursors[e])
                for e in range(len(cursors))
                if e != d
                and src.ever_weighted[e]
                and rows.epoch_fraction(e, cursors[e]) < 1
                and (rows.limits[e] is None or cursors[e] < rows.limits[e])
            }
            self._watch.repeats(d, behind)

    def _typed_state(self) -> MixtureLaneState:
        return MixtureLaneState(
            version=self._version,
            next_chunk_id=self._next_chunk_id,
            cursors=list(self._cursors),
            credits=self._sched.state_dict(),
            exhausted=self._exhausted,
            retired=self._retired,
            tokens=self._sched.tokens if isinstance(self._sched, DeficitScheduler) else 0,
        )

    def state_dict(self) -> dict[str, Any]:
        return self._typed_state().to_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a position saved by :meth:`state_dict` (O(1), nothing is replayed).

        Raises:
            CorruptCheckpoint: the state is malformed or does not fit this source.
        """
        where = f"StaticMixtureLane lane={self.lane}"
        st = MixtureLaneState.from_dict(
            state, self._version, self._rows.limits, self._src.component_names, where
        )
        try:
            st.check_progress(self._src.chunk_size)
        except CorruptCheckpoint as e:
            raise CorruptCheckpoint(f"{where}: {e}") from None
        if self._rows.drained(st.cursors) != st.exhausted:
            raise CorruptCheckpoint(
                f"{where}: exhausted={st.exhausted} contradicts the cursors {st.cursors!r}"
            )
        self._sched.load_state_dict(st.credits)  # validates before changing anything
        if isinstance(self._sched, DeficitScheduler):
            self._sched.tokens = st.tokens
        self._cursors = list(st.cursors)
        self._retired = st.retired
        self._next_chunk_id = st.next_chunk_id
        self._exhausted = st.exhausted
        self._watch.restored(
            [self._rows.epoch_fraction(d, c - 1) >= 1 for d, c in enumerate(self._cursors)]
        )
