"""ensure_mixture: keeps the delivered token share of each component near its target.

Per lane (one instance per lane; a flush hands the lane a fresh one), records
wait in a window of ``window`` records. Whenever the window is full, one record
leaves: the oldest held record whose main component (the one contributing most
tokens; ties: lowest index) is the most under-represented component (largest
``target_share * total - emitted`` tokens; ties: lowest index) among those
present in the window. ``flush`` drains the window in that same deficit order.

What it guarantees (its deficit state is the tokens emitted per component since the
lane's last flush): as long as every component with a positive target has a record in
the window at each release, the emitted tokens of each component stay within one
record's tokens of ``target * emitted`` -- the local share is then exact up to one
packed row. When a component is missing from the window (a long document of another
component fills it), nothing can be corrected and the deviation grows by what is
released. So it bounds the local error over flush segments whose components arrive
within ``window`` records of each other; it cannot reorder across flushes (they drain
it) or invent records that have not arrived.

In practice (``benchmarks/bench_mixture.py``): the source's token weights
(``weights_unit="tokens"``) set the long-run share; ``ensure_mixture`` smooths within a
flush segment -- it halves the local error when documents are short next to its
window, and adds nothing when one document fills it (whole source files of up to 69k
tokens in the demo corpus).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence

from ..errors import ConfigError
from ..records import Record, component_tokens
from ..validate import int_arg, weight_vector
from .base import OpContext, Operator, OpTraits


class EnsureMixtureOp(Operator):
    traits = OpTraits(preserves_cursor_order=False, stateless=False)

    def __init__(
        self,
        weights: Mapping[str, float] | Sequence[float] | None = None,
        window: int = 16,
        key: str = "input_ids",
        name: str = "ensure_mixture",
    ):
        window = int_arg("window", window, minimum=1, where="ensure_mixture")
        self.user_weights = weights
        self.window = window
        self.key = key
        self.name = name
        self.targets: tuple[float, ...] = ()
        self._start()

    #: its ``weights=`` may change at a re-mix, like the source's (``checkpoint/remix.py``)
    mixture_keys = frozenset({"weights"})
    described_as = "ensure_mixture"

    @property
    def reads_source_weights(self) -> bool:  # type: ignore[override]
        """Targets come from the source's weights (a re-mix changes them)."""
        return self.user_weights is None

    def targets_from(
        self, described: dict, names: tuple[str, ...], weights: tuple[float, ...]
    ) -> tuple[float, ...]:
        return _targets(described.get("weights"), names, weights)

    def set_targets(self, weights: tuple[float, ...]) -> None:
        s = sum(weights)
        self.targets = tuple(w / s for w in weights) if s > 0 else self.targets

    def _start(self) -> None:
        """A lane's state: the held window and the tokens emitted per component."""
        self._held: list[tuple[Record, dict[int, int], int, int]] = []
        self._emitted = [0] * max(len(self.targets), 1)
        self._total = 0

    def bind(self, ctx: OpContext) -> None:
        scheduled = ctx.source is not None and ctx.source.schedule is not None
        if self.user_weights is None and scheduled:
            raise ConfigError(
                "ensure_mixture() holds fixed targets, but the source's weights follow a "
                "WeightSchedule: give ensure_mixture(weights=...) explicitly, or leave it "
                "out (the source already schedules the mixture)"
            )
        super().bind(ctx)
        self.targets = self._resolve(ctx)
        self._start()

    def for_lane(self, lane: int) -> EnsureMixtureOp:
        new = copy.copy(self)  # cheaper than the default deep copy
        new.ctx = dataclasses.replace(self.ctx, lane=lane)
        new._start()
        return new

    def _resolve(self, ctx: OpContext) -> tuple[float, ...]:
        return _targets(self.user_weights, ctx.component_names, ctx.weights)

    def _pick(self) -> int:
        targets, emitted, total = self.targets, self._emitted, self._total
        present = {h[2] for h in self._held}
        best_c, best_def = -1, 0.0
        for c in sorted(present):
            d = (targets[c] if c < len(targets) else 0.0) * total - emitted[c]
            if best_c < 0 or d > best_def:
                best_c, best_def = c, d
        for i, h in enumerate(self._held):
            if h[2] == best_c:
                return i
        return 0

    def _release(self, i: int) -> Record:
        rec, shares, _, n = self._held.pop(i)
        for c, t in shares.items():
            self._emitted[c] += t
        self._total += n
        return rec

    def process(self, record: Record) -> list[Record]:
        shares = component_tokens(record, self.key)
        emitted = self._emitted
        for c in shares:
            if c >= len(emitted):
                emitted.extend([0] * (c + 1 - len(emitted)))
        main = max(shares, key=lambda c: (shares[c], -c))
        self._held.append((record, shares, main, sum(shares.values())))
        if len(self._held) < self.window:
            return []
        return [self._release(self._pick())]

    def flush(self) -> list[Record]:
        out = []
        while self._held:
            out.append(self._release(self._pick()))
        return out

    def describe(self) -> dict:
        w = self.user_weights
        if isinstance(w, Mapping):
            w = {str(k): float(v) for k, v in w.items()}
        elif w is not None:
            w = [float(x) for x in w]
        return {
            "op": self.described_as,
            "name": self.name,
            "weights": w,
            "window": self.window,
            "key": self.key,
        }


def _targets(
    weights: Mapping[str, float] | Sequence[float] | None,
    names: Sequence[str],
    source_weights: Sequence[float],
) -> tuple[float, ...]:
    """Normalized targets: ``weights`` over ``names``, or the source's when None."""
    raw = (
        list(source_weights)
        if weights is None
        else weight_vector(weights, names, "ensure_mixture", missing_is_zero=True)
    )
    s = sum(raw)
    return tuple(x / s for x in raw)
