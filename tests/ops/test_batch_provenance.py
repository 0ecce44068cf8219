"""batch(provenance=True): every row rebuilt from its segments, nothing else changed,
resumed exactly (``ops/batch_provenance.py``)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from helpers import byte_tokenize, make_docs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zephon_core import Pipeline, StaticMixtureWorkSource
from zephon_core.errors import ConfigError, ContractViolation
from zephon_core.ops.batch_provenance import COLUMNS
from zephon_core.testing import assert_resume_equivalent
from zephon_core.testing.resume import first_difference

# small datasets: a few hundred batches run through several epochs of each
WEB = make_docs(11, 3, 160, 5, "w")
BOOKS = make_docs(7, 20, 300, 6, "b")
DATA = {"web": WEB, "books": BOOKS}


def _source(num_epochs: int | None = None, shuffle_block: int | None = None):
    return StaticMixtureWorkSource(
        DATA,
        {"web": 0.6, "books": 0.4},
        chunk_size=4,
        seed=3,
        num_epochs=num_epochs,
        shuffle_block=shuffle_block,
        shuffle_window=2,
    )


def packed(
    provenance: bool = True, num_epochs: int | None = None, drop_last: bool = True, **kw
) -> Pipeline:
    """tokenize -> split -> pack -> shuffle -> ensure_mixture -> batch, over a mixture."""
    return (
        Pipeline(_source(num_epochs), canonical_replicas=4, flush_every_k_chunks=2, seed=11, **kw)
        .fetch()
        .map(byte_tokenize, name="tokenize")
        .split(max_len=48, eos_id=3)
        .pack(seq_len=64, bins=3)
        .shuffle(buffer_size=6)
        .ensure_mixture(window=6)
        .batch(batch_size=4, drop_last=drop_last, provenance=provenance)
    )


def document(names, dataset: int, row: int, eos_id: int | None = 3) -> np.ndarray:
    """What split sees of a document: the tokenizer's output, framed."""
    ids = byte_tokenize(DATA[names[dataset]][row])["input_ids"].astype(np.int64)
    return np.concatenate([ids, [eos_id]]) if eos_id is not None else ids


def rebuild(batch: dict, names, pad_id: int = 0, eos_id: int | None = 3) -> torch.Tensor:
    """``input_ids`` from the provenance alone; each row's segments must tile it."""
    ids = batch["input_ids"]
    out = torch.full_like(ids, pad_id)
    ends = [0] * len(ids)
    for row, off, ds, drow, _ep, start, end in batch["provenance"].tolist():
        assert off == ends[row], "segments tile the row from its start, in order"
        piece = document(names, ds, drow, eos_id)[start:end]
        assert len(piece) == end - start > 0
        out[row, off : off + len(piece)] = torch.from_numpy(piece)
        ends[row] = off + len(piece)
    return out


def test_every_row_is_rebuilt_from_its_provenance_and_nothing_else_changes():
    on, off = packed(), packed(provenance=False)
    names = on.component_names
    assert names == ("web", "books")
    seen: Counter = Counter()
    for a, b in zip(_take(on, 150), _take(off, 150)):
        prov = a["provenance"]
        assert prov.dtype == torch.int64 and prov.shape[1] == len(COLUMNS) == 7
        assert torch.equal(rebuild(a, names), a["input_ids"])
        rest = {k: v for k, v in a.items() if k != "provenance"}
        assert first_difference(rest, b) is None
        seen.update(prov[:, 4].tolist())
    assert len(seen) >= 3  # several epochs of the small datasets went by


def _take(pipe: Pipeline, n: int) -> list:
    with pipe.iterate() as it:
        return [next(it) for _ in range(n)]


def test_each_epoch_delivers_each_document_once():
    """A finite stream of 3 epochs: (dataset, row, epoch) of every document start is
    every row of every epoch exactly once -- the epoch column is the source's."""
    pipe = packed(num_epochs=3, drop_last=False)
    starts = Counter()
    with pipe.iterate() as it:
        for batch in it:
            for _r, _o, ds, row, ep, start, _e in batch["provenance"].tolist():
                if start == 0:
                    starts[(ds, row, ep)] += 1
    rows = [(d, r) for d, docs in enumerate((WEB, BOOKS)) for r in range(len(docs))]
    assert starts == Counter({(d, r, e): 1 for d, r in rows for e in range(3)})


def test_unpacked_rows_have_one_segment_each():
    pipe = (
        Pipeline(_source(), canonical_replicas=2, seed=1)
        .fetch()
        .map(byte_tokenize)
        .split(max_len=40)
        .batch(batch_size=3, pad_to="longest", pad_id=1, provenance=True)
    )
    for batch in _take(pipe, 40):
        prov = batch["provenance"]
        assert prov[:, 0].tolist() == [0, 1, 2] and not prov[:, 1].any()
        assert torch.equal(rebuild(batch, pipe.component_names, 1, None), batch["input_ids"])
        lengths = batch["attention_mask"].sum(1)
        assert torch.equal(prov[:, 6] - prov[:, 5], lengths)


@pytest.mark.parametrize("cut_with", [False, True])
def test_a_checkpoint_resumes_with_provenance_turned_on(cut_with):
    """Provenance is no part of the configuration: a state taken with it off (or on)
    resumes with it on, continuing exactly, epochs of the replayed chunks included."""
    reference = _take(packed(), 90)
    first = packed(provenance=cut_with)
    with first.iterate() as it:
        for _ in range(57):
            next(it)
        state = it.checkpoint()
    with packed().iterate(restore=state) as it:
        tail = [next(it) for _ in range(33)]
    for i, (a, b) in enumerate(zip(reference[57:], tail)):
        assert first_difference(a, b) is None, i
    assert any(b["provenance"][:, 4].max() > 0 for b in tail)  # epochs past the first


def test_with_provenance_turns_it_on_for_a_built_pipeline():
    built = packed(provenance=False)
    on = built.with_provenance()
    reference = _take(packed(), 12)
    for a, b in zip(reference, _take(on, 12)):
        assert first_difference(a, b) is None
    assert "provenance" not in _take(on.with_provenance(False), 1)[0]
    assert "provenance" not in _take(built, 1)[0]  # the description it came from is unchanged
    with pytest.raises(ConfigError, match="no batch"):
        Pipeline(_source()).fetch().with_provenance()


def test_resume_equivalence_in_process():
    assert_resume_equivalent(packed, cut_points=[0, 1, 13, 40], total=70)


def test_resume_equivalence_across_two_ranks_and_back_to_one():
    assert_resume_equivalent(packed, cut_points=[14], total=40, dp_size=2, resume_dp_size=1)


@pytest.mark.slow
def test_resume_equivalence_through_two_dataloader_workers():
    assert_resume_equivalent(packed, cut_points=[0, 21], total=45, num_workers=2)


def test_without_a_split_each_document_is_whole():
    pipe = (
        Pipeline(_source(), canonical_replicas=2, seed=1)
        .fetch()
        .map(byte_tokenize)
        .filter(lambda p: len(p["input_ids"]) <= 160)
        .pack(seq_len=160, bins=2)
        .batch(batch_size=2, provenance=True)
    )
    names = pipe.component_names
    for batch in _take(pipe, 40):
        assert not batch["provenance"][:, 5].any()
        assert torch.equal(rebuild(batch, names, 0, None), batch["input_ids"])


def test_a_map_that_changes_fragment_lengths_is_refused():
    pipe = (
        Pipeline(_source(), canonical_replicas=1, seed=1)
        .fetch()
        .map(byte_tokenize)
        .split(max_len=40)
        .map(lambda p: {"input_ids": p["input_ids"][: max(1, len(p["input_ids"]) - 1)]}, name="cut")
        .batch(batch_size=2, pad_to="longest", provenance=True)
    )
    with pytest.raises(ContractViolation, match="changed token counts"):
        _take(pipe, 5)


def test_records_without_tokens_get_their_document():
    pipe = (
        Pipeline(_source(), canonical_replicas=2, seed=1)
        .fetch()
        .map(lambda p: {"n": torch.tensor(len(p["text"]))})
        .batch(batch_size=3, provenance=True)
    )
    for batch in _take(pipe, 10):
        prov = batch["provenance"]
        lengths = [len(DATA[pipe.component_names[d]][r]["text"]) for d, r in prov[:, 2:4].tolist()]
        assert batch["n"].tolist() == lengths


def test_a_source_that_cannot_tell_epochs_reports_minus_one():
    class NoEpochs(StaticMixtureWorkSource):
        def pointer_epochs(self, lane, chunks):
            return None

    src = NoEpochs(DATA, chunk_size=4, seed=3)
    pipe = Pipeline(src, seed=1).fetch().map(byte_tokenize).split(40).batch(2, provenance=True)
    prov = _take(pipe, 3)[-1]["provenance"]
    assert (prov[:, 4] == -1).all() and (prov[:, 3] >= 0).all()


# -- combinations of operators ----------------------------------------------------------


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lanes=st.sampled_from([1, 2, 4]),
    k=st.sampled_from([1, 3]),
    max_len=st.sampled_from([None, 17, 64]),
    eos=st.booleans(),
    pack=st.sampled_from([None, 64, 100]),
    shuffle=st.booleans(),
    mixture=st.booleans(),
    drop=st.booleans(),
    block=st.sampled_from([None, 3]),
    batch_size=st.sampled_from([1, 3]),
)
def test_any_combination_rebuilds_its_rows(
    lanes, k, max_len, eos, pack, shuffle, mixture, drop, block, batch_size
):
    if pack is not None and max_len is None:
        max_len = pack  # pack needs fragments that fit
    eos_id = 3 if eos and max_len is not None else None
    src = _source(shuffle_block=block)
    reorders = pack is not None or shuffle or mixture
    pipe = Pipeline(
        src, canonical_replicas=lanes, flush_every_k_chunks=k if reorders else None, seed=2
    ).with_options(prefetch=0)
    pipe = pipe.fetch().map(byte_tokenize)
    if drop:
        pipe = pipe.filter(lambda p: len(p["input_ids"]) % 3 != 0)
    if max_len is not None:
        pipe = pipe.split(max_len=max_len, eos_id=eos_id)
    if pack is not None:
        pipe = pipe.pack(seq_len=pack, bins=2)
    if shuffle:
        pipe = pipe.shuffle(buffer_size=5)
    if mixture:
        pipe = pipe.ensure_mixture(window=4)
    width = pack or max_len or 320
    pipe = pipe.batch(batch_size=batch_size, seq_len=width, pad_id=0, provenance=True)
    plain = pipe._evolve(_ops=pipe._ops[:-1]).batch(batch_size=batch_size, seq_len=width)
    for a, b in zip(_take(pipe, 25), _take(plain, 25)):
        assert torch.equal(rebuild(a, pipe.component_names, 0, eos_id), a["input_ids"])
        assert first_difference({k: v for k, v in a.items() if k != "provenance"}, b) is None
