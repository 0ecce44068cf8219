"""A pipeline whose states earlier Zephon releases wrote into ``tests/checkpoint/data/``
(read by ``tests/checkpoint/test_provenance.py`` and ``tests/test_cli.py``).

Self-contained (its corpus and tokenizer are defined here, the tokenizer pinned with
``version=``, so its content digest does not depend on the Python version): the same
code builds it under every release. Each file there was written by running
:func:`write` with that release's ``zephon_core`` first on ``PYTHONPATH``::

    cd /tmp && PYTHONPATH=<release checkout>:<repo>/tests python -c \
        "import golden; golden.write('NAME')"

* ``main-03a95f2``: main at 03a95f2 (schema 2, no ``zephon_version``);
* ``pre-9e697b7``: the commit before 9e697b7, before ``batch`` described its
  ``attention``, ``mask_dtype`` and ``flash_kwargs`` options.

Next to each state, ``<name>.json`` holds the digests of the outputs that release
delivered after the cut.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from zephon_core import Pipeline, StaticMixtureWorkSource

DATA = Path(__file__).resolve().parent / "checkpoint" / "data"
CUT = 9
AFTER = 12


def _docs(n: int, letter: str, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"text": f"{letter}{i}:" + letter * int(rng.integers(3, 150))} for i in range(n)]


PROSE = _docs(40, "p", 1)
CODE = _docs(25, "c", 2)


def tokenize(payload: dict) -> dict:
    return {"input_ids": np.frombuffer(payload["text"].encode(), dtype=np.uint8).astype(np.int64)}


def build(strategy: str = "first_fit") -> Pipeline:
    src = StaticMixtureWorkSource(
        {"prose": PROSE, "code": CODE}, {"prose": 0.6, "code": 0.4}, chunk_size=4, seed=3
    )
    return (
        Pipeline(src, canonical_replicas=2, flush_every_k_chunks=2, seed=5, prefetch=0)
        .fetch()
        .map(tokenize, name="tokenize", version="v1")
        .split(max_len=48)
        .pack(seq_len=48, bins=2, strategy=strategy)  # first fit: the states were written so
        .shuffle(buffer_size=4)
        .batch(batch_size=2)
    )


def digest(out: dict) -> str:
    h = hashlib.sha256()
    for k in sorted(out):
        v = out[k]
        v = v.numpy() if hasattr(v, "numpy") else np.asarray(v)
        h.update(k.encode() + str(v.shape).encode() + np.ascontiguousarray(v).tobytes())
    return h.hexdigest()[:16]


def write(name: str) -> None:
    """Cut :func:`build`'s stream after ``CUT`` outputs; save the state and the digests
    of the next ``AFTER`` outputs (run with the release's code first on the path)."""
    pipe = build()
    it = iter(pipe)
    for _ in range(CUT):
        next(it)
    pipe.save(DATA / f"{name}.state")
    after = [digest(next(it)) for _ in range(AFTER)]
    pipe.close()
    (DATA / f"{name}.json").write_text(json.dumps({"after": after}, indent=1) + "\n")
