"""Token-weighted mixtures: weights are token shares, scheduled by document lengths.

The realized token share must sit on target within the bound the deficit rule
promises, the stream must resume exactly, lengths come from the user, a column or the
pipeline's own estimate, and document-weighted mode must not change.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import CODE, PROSE, byte_tokenize
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_core import (
    ConfigError,
    IncompatibleCheckpoint,
    Pipeline,
    StaticMixtureWorkSource,
)
from zephon_core.testing import assert_resume_equivalent, take

LENS = {
    "prose": [len(d["text"].encode()) for d in PROSE],
    "code": [len(d["text"].encode()) for d in CODE],
}


def _source(unit="tokens", lengths=LENS, **kw) -> StaticMixtureWorkSource:
    return StaticMixtureWorkSource(
        {"prose": PROSE, "code": CODE},
        {"prose": 0.7, "code": 0.3},
        chunk_size=8,
        seed=7,
        weights_unit=unit,
        lengths=lengths if unit == "tokens" else None,
        **kw,
    )


def _scheduled(src: StaticMixtureWorkSource, lane: int, lanes: int, chunks: int):
    """(component, tokens) of every scheduled document of one lane, in order."""
    ws = src.open_lane(lane, lanes, seed=3)
    out = []
    for _ in range(chunks):
        ch = ws.next_chunk()
        out += [(c, LENS[src.component_names[c]][r]) for c, r in zip(ch.components, ch.rows)]
    return out


def test_token_shares_hit_the_target_within_one_document():
    picks = _scheduled(_source(), lane=1, lanes=4, chunks=200)
    tokens = np.array([t for _, t in picks])
    is_prose = np.array([c == 0 for c, _ in picks])
    cum_total, cum_prose = np.cumsum(tokens), np.cumsum(tokens * is_prose)
    # the deficit of prose never exceeds the longest document
    max_len = max(max(LENS["prose"]), max(LENS["code"]))
    assert np.max(np.abs(cum_prose - 0.7 * cum_total)) <= max_len
    assert abs(cum_prose[-1] / cum_total[-1] - 0.7) < 0.005
    # while document weights give prose far fewer tokens (code documents are longer)
    doc = _scheduled(_source(unit="documents"), lane=1, lanes=4, chunks=200)
    tok = np.array([LENS[("prose", "code")[c]][0] * 0 + t for c, t in doc])
    share = tok[[c == 0 for c, _ in doc]].sum() / tok.sum()
    assert share < 0.6


@pytest.mark.parametrize("lanes", [1, 3])
def test_lanes_still_partition_each_epoch(lanes):
    src = _source(num_epochs=2)
    seen: dict[tuple[int, int], int] = {}
    for lane in range(lanes):
        ws = src.open_lane(lane, lanes, seed=3)
        while (ch := ws.next_chunk()) is not None:
            for c, r in zip(ch.components, ch.rows):
                seen[(c, r)] = seen.get((c, r), 0) + 1
    assert len(seen) == len(PROSE) + len(CODE)
    assert set(seen.values()) == {2}


def test_source_state_restores_exactly():
    src = _source()
    a = src.open_lane(2, 4, seed=3)
    for _ in range(7):
        a.next_chunk()
    state = a.state_dict()
    assert state["version"] == 2 and set(state) >= {"deficits", "tokens"}
    b = src.open_lane(2, 4, seed=3)
    b.load_state_dict(state)
    for _ in range(20):
        assert a.next_chunk() == b.next_chunk()


def _pipe(unit="tokens", lengths=LENS, fn=byte_tokenize, **kw) -> Pipeline:
    return (
        Pipeline(_source(unit, lengths, **kw), canonical_replicas=3, flush_every_k_chunks=2, seed=5)
        .fetch()
        .map(fn, name="tokenize")
        .split(max_len=64)
        .pack(seq_len=64, bins=2)
        .shuffle(buffer_size=4)
        .batch(batch_size=2)
    )


def test_token_weighted_pipeline_resumes_exactly():
    assert_resume_equivalent(lambda: _pipe(), cut_points=[0, 1, 9, 40], total=70)


def test_estimated_lengths_resume_exactly_and_enter_the_fingerprint():
    assert_resume_equivalent(lambda: _pipe(lengths=None), cut_points=[3, 25], total=45)
    plan = _pipe(lengths=None).compile()
    kinds = plan.config["source"]["token_lengths"]
    # both datasets are smaller than the sample: measured whole, exact per-row lengths
    assert all(k.startswith("measured:rows:") for k in kinds)
    given = _pipe().compile().source
    assert np.array_equal(plan.source.token_lengths[0].per_row, given.token_lengths[0].per_row)


def test_a_tokenizer_that_changes_lengths_is_refused_at_restore():
    def shorter(p):
        out = byte_tokenize(p)
        return {**out, "input_ids": out["input_ids"][::2]}

    with _pipe(lengths=None) as pipe:
        take(pipe, 5)
        state = pipe.checkpoint()
    with pytest.raises(IncompatibleCheckpoint, match="token_lengths"):
        _pipe(lengths=None, fn=shorter).load_state_dict(state, allow_changes={"functions"})


def test_large_datasets_are_estimated_from_a_seeded_sample():
    from zephon_core.engine import length_estimate

    big = [dict(d, id=f"{d['id']}-{k}") for k in range(3) for d in CODE]
    assert len(big) > length_estimate.SAMPLE_ROWS
    src = StaticMixtureWorkSource(
        {"prose": PROSE, "code": big}, {"prose": 0.5, "code": 0.5}, weights_unit="tokens"
    )
    pipe = Pipeline(src, canonical_replicas=2, seed=1).fetch().map(byte_tokenize)
    est = pipe.compile().source.token_lengths[1]
    true_mean = np.mean([len(d["text"].encode()) for d in big])
    assert est.per_row is None and abs(est.mean - true_mean) / true_mean < 0.1


def test_lengths_from_a_column_of_rows():
    rows = [dict(d, n=n) for d, n in zip(PROSE, LENS["prose"])]
    src = StaticMixtureWorkSource(
        {"prose": rows, "code": [dict(d, n=n) for d, n in zip(CODE, LENS["code"])]},
        weights_unit="tokens",
        lengths="n",
    )
    assert list(src.token_lengths[0].per_row) == LENS["prose"]


def test_lengths_from_an_hf_dataset_column():
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"text": [d["text"] for d in PROSE], "n": LENS["prose"]})
    ds = ds.select(list(reversed(range(len(ds)))))  # an indices mapping must be honoured
    src = StaticMixtureWorkSource({"prose": ds}, weights_unit="tokens", lengths="n")
    assert list(src.token_lengths[0].per_row) == LENS["prose"][::-1]


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"weights_unit": "bytes"}, "weights_unit"),
        ({"weights_unit": "tokens", "lengths": "missing"}, "no column 'missing'"),
        ({"weights_unit": "tokens", "lengths": {"prose": [1, 2]}}, "one token count per row"),
        ({"weights_unit": "tokens", "lengths": {"nope": [1]}}, "unknown datasets"),
        ({"lengths": "n"}, "lengths are for weights_unit='tokens'"),
        ({"when_exhausted": "stop"}, "when_exhausted"),
        ({"num_epochs": {"prose": 0}}, "num_epochs"),
        ({"num_epochs": {"poetry": 1}}, "unknown datasets"),
    ],
)
def test_bad_mixture_arguments_are_config_errors(kw, match):
    with pytest.raises(ConfigError, match=match):
        StaticMixtureWorkSource({"prose": PROSE, "code": CODE}, **kw)


def test_a_source_without_lengths_outside_a_pipeline_says_how_to_get_them():
    src = StaticMixtureWorkSource({"prose": PROSE, "code": CODE}, weights_unit="tokens")
    with pytest.raises(ConfigError, match="pass lengths="):
        src.open_lane(0, 1, seed=0)


def test_estimation_without_a_tokenizer_is_a_config_error():
    src = StaticMixtureWorkSource({"prose": PROSE}, weights_unit="tokens")
    with pytest.raises(ConfigError, match="tokenizing map"):
        Pipeline(src, canonical_replicas=1).fetch().compile()


def test_document_weighted_sources_describe_themselves_as_before():
    desc = _source(unit="documents").describe()
    assert set(desc) == {
        "class",
        "version",
        "names",
        "lengths",
        "weights",
        "chunk_size",
        "seed",
        "shuffle",
        "num_epochs",
    }
    assert _source(unit="documents").open_lane(0, 2, 1).state_dict()["version"] == 1


class _Calls:  # a counter the function fingerprint does not digest (not a constant)
    n = 0


_CALLS = _Calls()


def _counting(p):
    _CALLS.n += 1
    return byte_tokenize(p)


def test_the_estimate_is_measured_once_per_source_and_tokenizer():
    src = StaticMixtureWorkSource({"prose": PROSE, "code": CODE}, weights_unit="tokens")
    _CALLS.n = 0
    Pipeline(src, canonical_replicas=2).fetch().map(_counting, name="tok").compile()
    assert _CALLS.n == len(PROSE) + len(CODE)
    Pipeline(src, canonical_replicas=3).fetch().map(_counting, name="tok").compile()
    assert _CALLS.n == len(PROSE) + len(CODE)  # the same source, tokenizer and seed: cached
    fresh = StaticMixtureWorkSource({"prose": PROSE, "code": CODE}, weights_unit="tokens")
    Pipeline(fresh, canonical_replicas=2).fetch().map(_counting, name="tok").compile()
    assert _CALLS.n == 2 * (len(PROSE) + len(CODE))  # another source object: measured


@given(
    weights=st.lists(st.floats(0.05, 1.0), min_size=2, max_size=4),
    sizes=st.lists(st.integers(1, 40), min_size=4, max_size=4),
    lanes=st.integers(1, 4),
    cut=st.integers(0, 12),
    epochs=st.integers(1, 2),
    seed=st.integers(0, 2**32),
)
@settings(max_examples=60, deadline=None)
def test_property_token_lanes_partition_epochs_and_restore_exactly(
    weights, sizes, lanes, cut, epochs, seed
):
    n = len(weights)
    rng = np.random.default_rng(seed)
    datasets = {f"d{i}": list(range(sizes[i])) for i in range(n)}
    lengths = {f"d{i}": rng.integers(1, 500, sizes[i]).tolist() for i in range(n)}
    src = StaticMixtureWorkSource(
        datasets,
        dict(zip(datasets, weights)),
        chunk_size=3,
        seed=seed,
        num_epochs=epochs,
        weights_unit="tokens",
        lengths=lengths,
    )
    seen: dict[tuple[int, int], int] = {}
    for lane in range(lanes):
        a = src.open_lane(lane, lanes, seed=1)
        chunks = []
        while (ch := a.next_chunk()) is not None:
            chunks.append(ch)
        b = src.open_lane(lane, lanes, seed=1)
        for _ in range(min(cut, len(chunks))):
            b.next_chunk()
        c = src.open_lane(lane, lanes, seed=1)
        c.load_state_dict(b.state_dict())
        rest = []
        while (ch := c.next_chunk()) is not None:
            rest.append(ch)
        assert rest == chunks[min(cut, len(chunks)) :]
        for ch in chunks:
            for comp, row in zip(ch.components, ch.rows):
                seen[(comp, row)] = seen.get((comp, row), 0) + 1
    assert len(seen) == sum(sizes[:n]) and set(seen.values()) == {epochs}


def test_lengths_from_a_column_of_an_hf_component_not_read_for_training():
    datasets = pytest.importorskip("datasets")
    from zephon_integrations.hf import hf_component

    ds = datasets.Dataset.from_dict({"text": [d["text"] for d in PROSE], "n": LENS["prose"]})
    comp = hf_component(ds.select(range(len(ds) - 1, -1, -1)), columns=["text"])
    src = StaticMixtureWorkSource({"prose": comp}, weights_unit="tokens", lengths="n")
    assert list(src.token_lengths[0].per_row) == LENS["prose"][::-1]
    assert set(src.read(0, [0])[0]) == {"text"}  # training still reads only its columns


def _zeroed(fraction: float) -> dict[str, list[int]]:
    """LENS with the first ``fraction`` of code's counts set to 0 (a column not filled in)."""
    code = list(LENS["code"])
    cut = round(fraction * len(code))
    return {"prose": LENS["prose"], "code": [0] * cut + code[cut:]}


def test_a_weighted_dataset_whose_lengths_are_all_zero_is_refused():
    """Every document would count as 1 token: code would take ~all the documents."""
    with pytest.raises(ConfigError, match=r"dataset 'code'.*all 90 token counts are 0"):
        _source(lengths=_zeroed(1.0))
    # unweighted, the column changes nothing: accepted
    StaticMixtureWorkSource(
        {"prose": PROSE, "code": CODE},
        {"prose": 1.0, "code": 0.0},
        weights_unit="tokens",
        lengths=_zeroed(1.0),
    )


def test_a_weighted_dataset_with_many_zero_lengths_is_named_in_a_warning(caplog):
    with caplog.at_level("WARNING", logger="zephon_core.sources.lengths"):
        _source(lengths=_zeroed(0.05))  # a few empty documents: plausible, silent
    assert not caplog.records
    with caplog.at_level("WARNING", logger="zephon_core.sources.lengths"):
        _source(lengths=_zeroed(0.5))
    (warning,) = caplog.records
    assert "dataset 'code'" in warning.getMessage() and "45 of 90 token counts are 0" in (
        warning.getMessage()
    )


def test_a_null_in_a_length_column_names_its_row():
    datasets = pytest.importorskip("datasets")
    n = list(LENS["prose"])
    n[7] = None
    ds = datasets.Dataset.from_dict({"text": [d["text"] for d in PROSE], "n": n})
    with pytest.raises(ConfigError, match=r"dataset 'prose' \(column:n\): row 7 is null"):
        StaticMixtureWorkSource({"prose": ds}, weights_unit="tokens", lengths="n")
    rows = [dict(d, n=v) for d, v in zip(PROSE, n)]  # rows read one by one: None
    with pytest.raises(ConfigError, match="row 7 is null"):
        StaticMixtureWorkSource({"prose": rows}, weights_unit="tokens", lengths="n")
    with pytest.raises(ConfigError, match="row 3 is 2.5, not a whole token count"):
        StaticMixtureWorkSource(
            {"prose": PROSE[:5]}, weights_unit="tokens", lengths={"prose": [1, 2, 3, 2.5, 4]}
        )
