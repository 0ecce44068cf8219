"""Content fingerprints and the replay value digest: changed data or code is loud.

A restore compares a digest of every component and every map/filter function with the
checkpoint's (``IncompatibleCheckpoint`` naming what changed, ``allow_changes=`` to
accept it), and replay compares the values of the record behind each lane's last
delivered output (``ReplayDivergence``), which catches edits the sampled digest misses.
"""

from __future__ import annotations

import copy
import logging

import numpy as np
import pytest
from helpers import CODE, PROSE, byte_tokenize

from zephon_core import (
    IncompatibleCheckpoint,
    Pipeline,
    ReplayDivergence,
    StaticMixtureWorkSource,
)
from zephon_core.checkpoint.state import PipelineState
from zephon_core.digests.content import FULL_ROWS, function_fingerprint
from zephon_core.testing import assert_streams_equal, first_difference, take

CUT = 9
# small enough to be digested whole, so an edit to any row is seen at restore
SMALL_PROSE, SMALL_CODE = PROSE[:FULL_ROWS], CODE[:FULL_ROWS]


def _pipe(
    prose=SMALL_PROSE, code=SMALL_CODE, fn=byte_tokenize, version=None, pred=None
) -> Pipeline:
    src = StaticMixtureWorkSource(
        {"prose": prose, "code": code}, {"prose": 0.7, "code": 0.3}, chunk_size=8, seed=7
    )
    pipe = (
        Pipeline(src, canonical_replicas=2, flush_every_k_chunks=2, seed=11, prefetch=0)
        .fetch()
        .map(fn, name="tokenize", version=version)
    )
    if pred is not None:
        pipe = pipe.filter(pred, name="keep")
    return pipe.split(max_len=64).pack(seq_len=64, bins=2).batch(batch_size=2)


def _state(**kw) -> dict:
    with _pipe(**kw) as pipe:
        take(pipe, CUT)
        return pipe.checkpoint()


def _edited(rows: list[dict], i: int) -> list[dict]:
    out = copy.deepcopy(rows)
    out[i] = dict(out[i], text=out[i]["text"][::-1])
    return out


def test_rows_edited_in_place_are_incompatible():
    state = _state()
    with pytest.raises(IncompatibleCheckpoint, match="dataset 'prose'"):
        _pipe(prose=_edited(SMALL_PROSE, 3)).load_state_dict(state)


def test_rows_reordered_with_the_same_count_are_incompatible():
    state = _state()
    with pytest.raises(IncompatibleCheckpoint, match="dataset 'code'") as ei:
        _pipe(code=list(reversed(SMALL_CODE))).load_state_dict(state)
    assert "allow_changes" in str(ei.value)


def test_another_map_function_is_incompatible():
    state = _state(fn=lambda p: byte_tokenize(p))
    with pytest.raises(IncompatibleCheckpoint, match="operator 'tokenize'"):
        # same name, same qualname "<lambda>", other behaviour
        _pipe(
            fn=lambda p: {**byte_tokenize(p), "input_ids": byte_tokenize(p)["input_ids"][1:]}
        ).load_state_dict(state)


def test_another_filter_threshold_is_incompatible():
    limit = 300
    state = _state(pred=lambda p: len(p["input_ids"]) < limit)
    limit = 200  # the closure value changed, the code did not  # noqa: F841
    other = 200
    with pytest.raises(IncompatibleCheckpoint, match="operator 'keep'"):
        _pipe(pred=lambda p: len(p["input_ids"]) < other).load_state_dict(state)


def test_same_code_elsewhere_keeps_its_fingerprint():
    def a(p):
        return len(p) > 2

    def b(p):
        # a comment, another line and another name: same behaviour

        return len(p) > 2

    def c(p):
        return len(p) > 3

    assert function_fingerprint(a) == function_fingerprint(b)
    assert function_fingerprint(a) != function_fingerprint(c)


def test_version_pins_a_function():
    state = _state(fn=lambda p: byte_tokenize(p), version="bytes-v1")
    again = _pipe(fn=lambda p: dict(byte_tokenize(p)), version="bytes-v1")
    again.load_state_dict(state)  # accepted: the user vouches for the same behaviour
    again.close()


def test_tokenizer_objects_are_fingerprinted_by_their_json():
    import tokenizers

    def train(texts):
        tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token=None))
        tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel()
        trainer = tokenizers.trainers.BpeTrainer(
            vocab_size=300,
            show_progress=False,
            initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
        )
        tok.train_from_iterator(texts, trainer=trainer)
        return tok

    a = train([d["text"] for d in PROSE])
    b = train([d["text"] for d in CODE])
    a2 = tokenizers.Tokenizer.from_str(a.to_str())

    def encoder(tok):
        return lambda p: {"input_ids": np.asarray(tok.encode(p["text"]).ids, dtype=np.int32)}

    assert function_fingerprint(encoder(a)) == function_fingerprint(encoder(a2))
    assert function_fingerprint(encoder(a)) != function_fingerprint(encoder(b))


def test_allow_changes_accepts_edited_data_and_continues_the_positions():
    state = _state()
    edited = _edited(SMALL_PROSE, 3)
    with pytest.raises(IncompatibleCheckpoint):
        _pipe(prose=edited).load_state_dict(state)
    pipe = _pipe(prose=edited)
    pipe.load_state_dict(state, allow_changes={"data"})
    tail = take(pipe, 10)
    pipe.close()
    with _pipe(prose=edited) as fresh:  # the same positions over the new data
        assert_streams_equal(take(fresh, CUT + 10)[CUT:], tail, "allowed data change")


def test_unknown_allow_changes_is_a_config_error():
    from zephon_core import ConfigError

    with pytest.raises(ConfigError, match="allow_changes"):
        _pipe().load_state_dict(_state(), allow_changes={"everything"})


def _target_row(state: dict) -> tuple[int, int]:
    """(component, row) of the record behind lane 0's last delivered output."""
    ls = state["lanes"][0]
    _, chunk_id, offset, _ = ls["cursor"]
    chunk = ls["chunks"][chunk_id - ls["floor"]]
    return chunk[2][offset], chunk[3][offset]


def test_value_only_divergence_is_detected_during_replay():
    # more rows than are digested whole, so most rows are only covered by the replay check
    prose = [dict(d, id=f"{d['id']}-{k}") for k in range(3) for d in PROSE]
    assert len(prose) > FULL_ROWS
    for cut in range(CUT, CUT + 40):
        with _pipe(prose=prose) as pipe:
            take(pipe, cut)
            state = pipe.checkpoint()
        component, row = _target_row(state)
        if component != 0:
            continue
        edited = _edited(prose, row)
        if _pipe(prose=edited).compile().content == _pipe(prose=prose).compile().content:
            break  # the edited row is not among the sampled ones
    else:
        pytest.fail("no cut whose replay target is an unsampled prose row")
    pipe = _pipe(prose=edited)
    pipe.load_state_dict(state)  # the sampled digest cannot see this edit
    with pytest.raises(ReplayDivergence, match="other values"):
        take(pipe, 5)
    pipe.close()
    # with the change allowed, the stream continues over the edited data
    pipe = _pipe(prose=edited)
    pipe.load_state_dict(state, allow_changes={"data"})
    assert len(take(pipe, 5)) == 5
    pipe.close()


def test_ranks_over_other_content_do_not_merge():
    from zephon_core.distributed import merge_local_checkpoints

    a = _pipe().bind(rank=0, world_size=2)
    b = _pipe(prose=_edited(SMALL_PROSE, 1)).bind(rank=1, world_size=2)
    reports = [a.local_checkpoint(), b.local_checkpoint()]
    with pytest.raises(IncompatibleCheckpoint, match="other data or functions") as refused:
        merge_local_checkpoints(reports, num_lanes=2)
    assert "dataset 'prose'" in str(refused.value) and "'code'" not in str(refused.value)


def test_version_1_states_still_restore(caplog):
    state = _state()
    with _pipe() as ref:
        expected = take(ref, CUT + 8)[CUT:]
    old = copy.deepcopy(state)
    old["version"] = 1
    del old["content"], old["zephon_version"]  # keys a version-1 state did not have
    for ls in old["lanes"]:
        del ls["digest"], ls["chunk_digests"]
    with caplog.at_level(logging.WARNING):
        parsed = PipelineState.from_dict(old)
    assert parsed.content is None and "version-1" in caplog.text
    pipe = _pipe()
    pipe.load_state_dict(old)
    assert_streams_equal(expected, take(pipe, 8), "restored from a version-1 state")
    pipe.close()


def _token_weighted(fn) -> Pipeline:
    """Token weights with lengths the pipeline estimates through ``fn``."""
    src = StaticMixtureWorkSource(
        {"prose": SMALL_PROSE, "code": SMALL_CODE},
        {"prose": 0.7, "code": 0.3},
        chunk_size=8,
        seed=7,
        weights_unit="tokens",
    )
    return (
        Pipeline(src, canonical_replicas=2, flush_every_k_chunks=2, seed=11, prefetch=0)
        .fetch()
        .map(fn, name="tokenize")
        .split(max_len=64)
        .pack(seq_len=64, bins=2)
        .batch(batch_size=2)
    )


def _tokenizer(step: int):
    """Another tokenizer under the same name: every ``step``-th byte."""

    def tokenize(p):
        out = byte_tokenize(p)
        return {**out, "input_ids": out["input_ids"][::step]}

    return tokenize


def test_another_tokenizer_is_reported_as_the_function_before_the_lengths_it_moved():
    with _token_weighted(_tokenizer(1)) as pipe:
        take(pipe, CUT)
        state = pipe.checkpoint()
    with pytest.raises(IncompatibleCheckpoint) as first:
        _token_weighted(_tokenizer(2)).load_state_dict(state)
    msg = str(first.value)
    assert "function of operator 'tokenize': closure 'step' differs" in msg
    assert "estimated token lengths moved with it" in msg and "token_lengths" in msg
    assert "Only the mixture differs" not in msg
    assert "allow_changes=['functions']" in msg
    # allowing the function: the moved lengths are named as its consequence
    with pytest.raises(IncompatibleCheckpoint) as second:
        _token_weighted(_tokenizer(2)).load_state_dict(state, allow_changes={"functions"})
    assert "moved with the changed function of operator 'tokenize'" in str(second.value)
    assert "{'functions', 'weights'}" in str(second.value)


def _next_rows(state: dict, pipe: Pipeline) -> list[tuple[int, int]]:
    """(component, row) of the chunk each lane fetches next after ``state``: rows the
    run has not read yet."""
    plan = pipe.compile()
    out = []
    for ls in state["lanes"]:
        src = plan.source.open_lane(ls["lane"], plan.num_lanes, plan.seed)
        src.load_state_dict(ls["source"])
        chunk = src.next_chunk()
        out += list(zip(chunk.components, chunk.rows))
    return out


def test_the_limit_an_unread_row_edited_outside_the_sample_is_read_as_it_is_now():
    # README "What Zephon refuses": a dataset without its own fingerprint is digested by
    # sampled rows; a row outside the sample that the run has not read yet is read when
    # the stream reaches it, as any loader would. Nothing can compare it without reading
    # the whole dataset: the resumed stream is the uninterrupted one over the edited data.
    prose = [dict(d, id=f"{d['id']}-{k}") for k in range(3) for d in PROSE]
    assert len(prose) > FULL_ROWS
    with _pipe(prose=prose) as pipe:
        take(pipe, CUT)
        state = pipe.checkpoint()
    sampled = _pipe(prose=prose).compile().content["components"]["prose"]
    for component, row in _next_rows(state, _pipe(prose=prose)):
        edited = _edited(prose, row)
        if component == 0 and _pipe(prose=edited).compile().content["components"]["prose"] == (
            sampled
        ):
            break
    else:
        pytest.fail("no unsampled prose row in the next chunks")
    pipe = _pipe(prose=edited)
    pipe.load_state_dict(state)  # accepted: neither the sample nor replay sees the row
    resumed = take(pipe, 150)
    pipe.close()
    with _pipe(prose=edited) as fresh:
        assert_streams_equal(take(fresh, CUT + 150)[CUT:], resumed, "over the edited data")
    with _pipe(prose=prose) as original:
        assert first_difference(take(original, CUT + 150)[CUT:], resumed) is not None
