"""Estimating documents' token lengths with the pipeline's own operators.

Why: token-weighted mixing (``sources/deficit.py``) needs each document's length
before it is fetched. When the user gives no lengths, the pipeline that will
tokenize the documents is the right judge: at compile time it runs its leading
stateless operators (fetch, map, ...) over a seeded sample of each dataset's rows,
until they carry ``input_ids``, and counts those tokens. A dataset no larger than
the sample is measured completely and gets exact per-row lengths; a larger one counts
each document as the sample's mean. Both enter the fingerprint
(``sources/lengths.py``), so a resume under another tokenizer is refused unless
allowed.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..ops.base import Operator
from ..ops.filter import FilterOp
from ..records import Contributor, Record, SampleCursor
from ..rng import derive_seed
from ..sources.lengths import ComponentLengths
from ..sources.permutation import KeyedPermutation

log = logging.getLogger(__name__)

#: rows measured per dataset (smaller datasets are measured whole)
SAMPLE_ROWS = 256
_KEY = "input_ids"


def estimate_lengths(
    source: Any, ops: Sequence[Operator], seed: int, content: dict[str, dict[str, str]]
) -> Any:
    """``source`` with every missing token length measured (``source.with_lengths``).
    ``content``: the datasets' and operators' content fingerprints, as compile computed
    them; with the seed and the operators they key the cache, so changed data or a
    changed tokenizer is measured anew."""
    missing = source.needs_length_estimate
    if not missing:
        return source
    chain = _leading_chain(ops)
    # measured once per source and operators: DataLoader workers and later compiles of a
    # pickled or reused source find the result on it (a cache, never part of the config)
    key = json.dumps(
        [
            seed,
            content.get("components", {}),
            [[op.describe(), content.get("ops", {}).get(op.name)] for op in chain],
        ],
        sort_keys=True,
        default=str,
    )
    cache = source.__dict__.setdefault("_length_cache", {})
    if key in cache:
        return source.with_lengths(cache[key])
    measured = {}
    for d in missing:
        n = source.lengths[d]
        if n <= SAMPLE_ROWS:
            rows = list(range(n))
        else:
            perm = KeyedPermutation(n, derive_seed(seed, "length-sample", d))
            rows = sorted(perm(i) for i in range(SAMPLE_ROWS))
        counts = _measure(source, chain, d, rows)
        if n <= SAMPLE_ROWS:
            measured[d] = ComponentLengths(np.maximum(counts, 1), how="measured")
        else:
            mean = max(1, round(float(np.mean(counts))))
            measured[d] = ComponentLengths(mean=mean, how=f"estimated({len(rows)} rows)")
        log.info(
            "dataset %r: %s token lengths, mean %.0f tokens per document",
            source.component_names[d],
            measured[d].how,
            measured[d].average(),
        )
    cache[key] = measured
    return source.with_lengths(measured)


def _leading_chain(ops: Sequence[Operator]) -> list[Operator]:
    """The operators up to the first that is not one-to-one and stateless (filters
    skipped)."""
    chain = []
    for op in ops:
        if not (op.traits.stateless and op.traits.preserves_cursor_order):
            break
        if not isinstance(op, FilterOp):  # a filter drops documents, it does not size them
            chain.append(op)
    return chain


def _has_tokens(payload: Any) -> bool:
    return isinstance(payload, dict) and _KEY in payload


def _measure(source: Any, chain: list[Operator], d: int, rows: list[int]) -> np.ndarray:
    name = source.component_names[d]
    records = [
        Record((d, r), SampleCursor(0, 0, i, 0), [Contributor(0, i, 0, True, d, 0)])
        for i, r in enumerate(rows)
    ]
    try:
        for op in chain:
            if records and all(_has_tokens(r.payload) for r in records):
                break  # tokenized: later operators (split, ...) only rearrange tokens
            records = op.process_many(records) if records else records
    except Exception as e:  # noqa: BLE001 - named: the estimate runs user code
        raise ConfigError(
            f"estimating token lengths of dataset {name!r}: operator {op.name!r} failed "
            f"({type(e).__name__}: {e}); pass lengths= to StaticMixtureWorkSource instead"
        ) from e
    counts = []
    for rec in records:
        p = rec.payload
        if not _has_tokens(p):
            raise ConfigError(
                f"estimating token lengths of dataset {name!r}: after its leading "
                f"operators {[op.name for op in chain]} a record has no {_KEY!r} (payload "
                f"{type(p).__name__}); weights_unit='tokens' needs a tokenizing map before "
                "any split/pack/shuffle, or lengths= given to the source"
            )
        counts.append(len(p[_KEY]))
    if len(counts) != len(rows):
        raise ConfigError(
            f"estimating token lengths of dataset {name!r}: the leading operators "
            f"{[op.name for op in chain]} dropped records; give lengths= to the source"
        )
    return np.asarray(counts, dtype=np.int64)
