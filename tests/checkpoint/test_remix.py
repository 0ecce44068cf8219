"""Re-mixing at a restore: weights changed, a dataset added, a dataset removed.

Each case checks what the re-mix promises: nothing delivered before the cut comes
again and no position is skipped (each lane keeps reading its own positions of every
dataset, in order), the new weights take over, and a second resume of the re-mixed
run is exact.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import CODE, PROSE, byte_tokenize, make_docs

from zephon_core import (
    IncompatibleCheckpoint,
    Operator,
    OpTraits,
    Pipeline,
    StaticMixtureWorkSource,
)
from zephon_core.errors import CorruptCheckpoint
from zephon_core.sources.mixture_rows import LaneRows
from zephon_core.testing import assert_resume_equivalent, assert_streams_equal, take

MATH = make_docs(70, 5, 300, 3, "m")
DATA = {"prose": PROSE, "code": CODE, "math": MATH}
LANES = 3
SEED = 7


def _pipe(weights: dict, unit: str = "tokens", ordered: bool = True, **kw) -> Pipeline:
    datasets = {n: DATA[n] for n in weights}
    lengths = {n: [len(d["text"].encode()) for d in ds] for n, ds in datasets.items()}
    src = StaticMixtureWorkSource(
        datasets,
        weights,
        chunk_size=8,
        seed=SEED,
        weights_unit=unit,
        lengths=lengths if unit == "tokens" else None,
        **kw,
    )
    pipe = Pipeline(src, canonical_replicas=LANES, seed=5).fetch().map(byte_tokenize, name="tok")
    if not ordered:  # reorders: inflight chunks and flush boundaries matter
        pipe = (
            Pipeline(src, canonical_replicas=LANES, flush_every_k_chunks=2, seed=5)
            .fetch()
            .map(byte_tokenize, name="tok")
            .shuffle(buffer_size=5)
        )
    return pipe


def _cut(weights: dict, n: int, **kw) -> tuple[list, dict]:
    with _pipe(weights, **kw) as pipe:
        out = take(pipe, n)
        return out, pipe.checkpoint()


def _lane_rows(names: list[str], lane: int, name: str, count: int) -> list[int]:
    """The rows a lane reads of one dataset, in order (its positions lane, lane + C, ...)."""
    src = StaticMixtureWorkSource({n: DATA[n] for n in names}, chunk_size=8, seed=SEED)
    return LaneRows(src, lane, LANES).rows(names.index(name), 0, count)


def _check_positions(outputs: list[dict], names: list[str], slack: int = 0) -> None:
    """No document twice, and per lane and dataset a gap-free prefix of its positions
    (but for the last ``slack`` ones, which a shuffle buffer may still hold)."""
    ids = [o["id"] for o in outputs]
    assert len(ids) == len(set(ids)), "a document was delivered twice"
    for name in names:
        letter = name[0]
        rows = {int(i[1:]) for i in ids if i[0] == letter}
        for lane in range(LANES):
            mine = _lane_rows(names, lane, name, len(DATA[name]) // LANES)
            got = [r in rows for r in mine]
            k = sum(got)
            settled = max(0, k - slack)
            assert all(got[:settled]), f"lane {lane} skipped a position of {name}"


def _token_share(outputs: list[dict], letter: str) -> float:
    n = [len(o["input_ids"]) for o in outputs]
    mine = [len(o["input_ids"]) for o in outputs if o["id"][0] == letter]
    return sum(mine) / sum(n)


def _second_resume_is_exact(pipe_fn, state: dict, warm: int, more: int = 20) -> None:
    with pipe_fn() as a:
        a.load_state_dict(state)
        take(a, warm)
        mid = a.checkpoint()
        expected = take(a, more)
    with pipe_fn() as b:
        b.load_state_dict(mid)
        assert_streams_equal(take(b, more), expected, "second resume")


@pytest.mark.parametrize("unit", ["tokens", "documents"])
def test_changed_weights_keep_positions_and_follow_the_new_mix(unit):
    old, new = {"prose": 0.8, "code": 0.2}, {"prose": 0.2, "code": 0.8}
    before, state = _cut(old, 20, unit=unit)
    with pytest.raises(IncompatibleCheckpoint, match="allow_changes=\\{'weights'\\}"):
        _pipe(new, unit=unit).load_state_dict(state)
    with _pipe(new, unit=unit) as pipe:
        pipe.load_state_dict(state, allow_changes={"weights"})
        after = take(pipe, 100)
    _check_positions(before + after, ["prose", "code"])
    if unit == "tokens":
        assert _token_share(before, "p") > 0.6
        assert _token_share(after[40:], "p") < 0.35
    _second_resume_is_exact(lambda: _pipe(new, unit=unit), state_after_remix(state, new, unit), 7)


def state_after_remix(state: dict, weights: dict, unit: str = "tokens", **kw) -> dict:
    """The re-mixed run's state right after the restore (its own fingerprint)."""
    with _pipe(weights, unit=unit, **kw) as pipe:
        pipe.load_state_dict(state, allow_changes={"weights", "components"})
        take(pipe, 1)
        return pipe.checkpoint()


def test_replay_under_reordering_operators_delivers_nothing_twice():
    old, new = {"prose": 0.7, "code": 0.3}, {"prose": 0.3, "code": 0.7}
    for cut in (5, 13, 22):
        before, state = _cut(old, cut, ordered=False)
        with _pipe(new, ordered=False) as pipe:
            pipe.load_state_dict(state, allow_changes={"weights"})
            after = take(pipe, 90)
        _check_positions(before + after, ["prose", "code"], slack=8)
        _second_resume_is_exact(
            lambda: _pipe(new, ordered=False),
            state_after_remix(state, new, ordered=False),
            warm=6,
        )


def test_an_added_dataset_starts_at_its_beginning():
    before, state = _cut({"prose": 0.7, "code": 0.3}, 20)
    new = {"prose": 0.4, "code": 0.3, "math": 0.3}
    with pytest.raises(IncompatibleCheckpoint, match="components"):
        _pipe(new).load_state_dict(state, allow_changes={"weights"})
    with _pipe(new) as pipe:
        pipe.load_state_dict(state, allow_changes={"weights", "components"})
        after = take(pipe, 90)
    assert not any(o["id"][0] == "m" for o in before)
    assert any(o["id"][0] == "m" for o in after)
    _check_positions(before + after, ["prose", "code", "math"])
    _second_resume_is_exact(lambda: _pipe(new), state_after_remix(state, new), warm=9)


def test_a_removed_dataset_leaves_through_weight_zero():
    three = {"prose": 0.4, "code": 0.3, "math": 0.3}
    before, state = _cut(three, 20)
    # math still has rows in the inflight chunks: removing it now is refused, with the fix
    with pytest.raises(IncompatibleCheckpoint, match="weight 0 for this restore"):
        _pipe({"prose": 0.5, "code": 0.5}).load_state_dict(
            state, allow_changes={"weights", "components"}
        )
    zero = {"prose": 0.5, "code": 0.5, "math": 0.0}
    with _pipe(zero) as pipe:
        pipe.load_state_dict(state, allow_changes={"weights"})
        middle = take(pipe, 60)
        later = pipe.checkpoint()
    inflight = sum(len(ch[3]) for ls in state["lanes"] for ch in ls["chunks"])
    assert any(o["id"][0] == "m" for o in middle[:inflight])  # the inflight ones replay
    assert not any(o["id"][0] == "m" for o in middle[inflight:])  # nothing new is read
    # once the inflight chunks are gone, the dataset can leave the configuration
    two = {"prose": 0.5, "code": 0.5}
    with _pipe(two) as pipe:
        pipe.load_state_dict(later, allow_changes={"weights", "components"})
        after = take(pipe, 40)
    assert not any(o["id"][0] == "m" for o in after)
    _check_positions(before + middle + after, ["prose", "code", "math"])
    _second_resume_is_exact(lambda: _pipe(two), state_after_remix(later, two), warm=5)


def test_other_changes_are_still_refused_with_weights_allowed():
    _, state = _cut({"prose": 0.7, "code": 0.3}, 10)
    src = StaticMixtureWorkSource(
        {"prose": PROSE, "code": CODE}, {"prose": 0.5, "code": 0.5}, chunk_size=16, seed=SEED
    )
    other = Pipeline(src, canonical_replicas=LANES, seed=5).fetch().map(byte_tokenize, name="tok")
    with pytest.raises(IncompatibleCheckpoint, match="chunk_size"):
        other.load_state_dict(state, allow_changes={"weights", "components"})


def test_reordered_datasets_are_refused():
    _, state = _cut({"prose": 0.7, "code": 0.3}, 10)
    with pytest.raises(IncompatibleCheckpoint, match="moved from position"):
        _pipe({"code": 0.5, "prose": 0.5}).load_state_dict(
            state, allow_changes={"weights", "components"}
        )


def _ensured(weights: dict, targets=None) -> Pipeline:
    """ensure_mixture with the source's weights, or its own ``targets``."""
    src = StaticMixtureWorkSource(
        {n: DATA[n] for n in weights}, weights, chunk_size=8, seed=SEED, shuffle=False
    )
    return (
        Pipeline(src, canonical_replicas=LANES, flush_every_k_chunks=2, seed=5)
        .fetch()
        .map(byte_tokenize, name="tok")
        .ensure_mixture(targets, window=6)
    )


@pytest.mark.parametrize("cut", [4, 11, 19, 30])
def test_remix_under_ensure_mixture_is_exact(cut):
    old, new = {"prose": 0.7, "code": 0.3}, {"prose": 0.2, "code": 0.8}
    with _ensured(old) as pipe:
        before = take(pipe, cut)
        state = pipe.checkpoint()
    with _ensured(new) as pipe:
        pipe.load_state_dict(state, allow_changes={"weights"})
        after = take(pipe, 30)  # within the first epoch of code (90 rows)
        states = []
        for _ in range(4):  # checkpoints inside the segments that started before the re-mix
            states.append((pipe.checkpoint(), take(pipe, 6)))
    # ensure_mixture replayed the delivered prefix under the old targets: nothing twice
    _check_positions(before + after, ["prose", "code"], slack=LANES * 6)
    ids = [o["id"] for o in before + after + [x for _, xs in states for x in xs]]
    assert len(ids) == len(set(ids))
    for st, expected in states:  # and every later resume of the re-mixed run is exact
        with _ensured(new) as again:
            again.load_state_dict(st)
            assert_streams_equal(take(again, 6), expected, "resume after the re-mix")
    prior = [ls.get("prior") for ls in state_after_remix_ensured(state, new)["lanes"]]
    assert any(p is not None for p in prior)  # the old targets travel with the state


def state_after_remix_ensured(state: dict, weights: dict) -> dict:
    with _ensured(weights) as pipe:
        pipe.load_state_dict(state, allow_changes={"weights"})
        take(pipe, 1)
        return pipe.checkpoint()


def test_unchanged_weights_allowed_is_a_plain_exact_resume():
    weights = {"prose": 0.7, "code": 0.3}
    with _pipe(weights) as ref:
        expected = take(ref, 40)[15:]
    _, state = _cut(weights, 15)
    with _pipe(weights) as pipe:
        pipe.load_state_dict(state, allow_changes={"weights"})
        assert_streams_equal(take(pipe, 25), expected, "allowed but unchanged")
    assert np.isfinite(_token_share(expected, "p"))


@pytest.mark.slow
def test_remix_through_dataloader_workers_matches_in_process():
    def build(weights):
        src = StaticMixtureWorkSource({n: DATA[n] for n in weights}, weights, chunk_size=8, seed=1)
        return (
            Pipeline(src, canonical_replicas=4, flush_every_k_chunks=2, seed=5)
            .fetch()
            .map(byte_tokenize, name="tok")
            .split(max_len=64)
            .pack(seq_len=64, bins=2)
            .ensure_mixture(window=4)
            .batch(batch_size=2)
        )

    old, new = {"prose": 0.7, "code": 0.3}, {"prose": 0.3, "code": 0.7}
    with build(old) as pipe:
        take(pipe, 13)
        state = pipe.checkpoint()
    with build(new) as pipe:
        pipe.load_state_dict(state, allow_changes={"weights"})
        expected = take(pipe, 24)
    loader = build(new).dataloader(num_workers=2, restore=state, allow_changes={"weights"})
    it = iter(loader)
    got = [next(it) for _ in range(12)]
    mid = loader.checkpoint()
    loader.close()
    assert_streams_equal(got, expected[:12], "re-mix through DataLoader workers")
    assert any("prior" in ls for ls in mid["lanes"])
    with build(new) as again:
        again.load_state_dict(mid)
        assert_streams_equal(take(again, 12), expected[12:], "resume of the loader's state")


# -- ensure_mixture(weights=...) changes at a re-mix too -------------------------------

OWN_TARGETS = {  # form: (targets before, targets naming the added dataset)
    "list": ([0.2, 0.8], [0.2, 0.3, 0.5]),
    "mapping": ({"prose": 0.2, "code": 0.8}, {"prose": 0.2, "code": 0.3, "math": 0.5}),
}


@pytest.mark.parametrize("form", ["list", "mapping"])
def test_added_dataset_with_ensure_mixture_weights(form):
    """The rebuilt pipeline's ensure_mixture(weights=...) names the added dataset: the
    restore re-mixes, the segments begun before it replay under the old targets (nothing
    twice, nothing skipped), and the re-mixed run's own checkpoints resume exactly."""
    old, new = {"prose": 0.7, "code": 0.3}, {"prose": 0.4, "code": 0.3, "math": 0.3}
    before_targets, new_targets = OWN_TARGETS[form]
    with _ensured(old, before_targets) as pipe:
        before = take(pipe, 11)
        state = pipe.checkpoint()
    with pytest.raises(IncompatibleCheckpoint, match="allow_changes=\\{'weights', 'components'\\}"):
        _ensured(new, new_targets).load_state_dict(state)

    def remixed() -> Pipeline:
        pipe = _ensured(new, new_targets)
        pipe.load_state_dict(state, allow_changes={"weights", "components"})
        return pipe

    with remixed() as pipe:
        after = take(pipe, 45)
    _check_positions(before + after, list(new), slack=LANES * 6)
    assert any(o["id"][0] == "m" for o in after)
    assert_resume_equivalent(remixed, [0, 1, 3, 7, 16, 30], 45)


def test_changed_ensure_mixture_weights_alone_remix_exactly():
    weights = {"prose": 0.7, "code": 0.3}
    with _ensured(weights, [0.2, 0.8]) as pipe:
        before = take(pipe, 17)  # a cut whose replay the new targets would reorder
        state = pipe.checkpoint()

    def remixed() -> Pipeline:
        pipe = _ensured(weights, [0.9, 0.1])
        pipe.load_state_dict(state, allow_changes={"weights"})
        return pipe

    with remixed() as pipe:
        after = take(pipe, 30)
    _check_positions(before + after, list(weights), slack=LANES * 6)
    assert_resume_equivalent(remixed, [0, 2, 5, 11, 20], 30)


def test_prior_without_operator_targets_still_restores():
    """States written before the prior named each operator's targets: operators that read
    the source weights take the prior's source targets."""
    old, new = {"prose": 0.7, "code": 0.3}, {"prose": 0.2, "code": 0.8}
    with _ensured(old) as pipe:
        take(pipe, 11)
        state = pipe.checkpoint()
    remixed = state_after_remix_ensured(state, new)
    lanes = [ls for ls in remixed["lanes"] if "prior" in ls]
    assert lanes and all(len(ls["prior"]) == 3 for ls in lanes)
    for ls in lanes:
        ls["prior"] = ls["prior"][:2]  # the earlier form: [chunk, [source targets]]
    with _ensured(new) as a, _ensured(new) as b:
        a.load_state_dict(state_after_remix_ensured(state, new))
        b.load_state_dict(remixed)
        assert_streams_equal(take(a, 20), take(b, 20), "prior in the earlier form")


@pytest.mark.parametrize(
    ("targets", "match"),
    [({"nope": [0.5, 0.5]}, "'nope'"), ({"ensure_mixture": [1.0]}, "must be 2 weights")],
)
def test_prior_with_foreign_operator_targets_is_corrupt(targets, match):
    with _ensured({"prose": 0.7, "code": 0.3}) as pipe:
        take(pipe, 11)
        state = pipe.checkpoint()
    remixed = state_after_remix_ensured(state, {"prose": 0.2, "code": 0.8})
    ls = next(ls for ls in remixed["lanes"] if "prior" in ls)
    ls["prior"][2] = targets
    with pytest.raises(CorruptCheckpoint, match=match), _ensured({"prose": 0.2, "code": 0.8}) as p:
        p.load_state_dict(remixed)


class _WeightTag(Operator):
    """A custom operator reading the source weights (``reads_source_weights`` and
    ``set_targets``, the base-class contract, no ``mixture_keys``): it tags each record
    with the share of 'prose' it sees."""

    traits = OpTraits(preserves_cursor_order=True)
    reads_source_weights = True

    def __init__(self) -> None:
        self.name = "weight_tag"
        self.targets: tuple[float, ...] | None = None

    def set_targets(self, weights: tuple[float, ...]) -> None:
        self.targets = tuple(weights)

    def process(self, record):
        t = self.targets if self.targets is not None else self.ctx.weights
        return [record.with_payload({**record.payload, "share": t[0] / sum(t)})]

    def flush(self):
        return []

    def describe(self) -> dict:
        return {"op": "weight_tag", "name": self.name}


def test_a_custom_operator_reading_the_source_weights_keeps_the_old_ones_in_replay():
    def build(weights: dict) -> Pipeline:
        src = StaticMixtureWorkSource(
            {"prose": PROSE, "code": CODE}, weights, chunk_size=4, seed=SEED
        )
        return (
            Pipeline(src, canonical_replicas=2, flush_every_k_chunks=4, seed=5, prefetch=0)
            .fetch()
            .then(_WeightTag())
        )

    with build({"prose": 0.6, "code": 0.4}) as pipe:
        take(pipe, 5)
        state = pipe.checkpoint()
    with build({"prose": 0.2, "code": 0.8}) as pipe:
        pipe.load_state_dict(state, allow_changes={"weights"})
        shares = [round(o["share"], 2) for o in take(pipe, 6)]
    # the segments begun before the re-mix replay (and continue) under the old weights
    assert shares[0] == 0.6, shares
