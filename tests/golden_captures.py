"""Pipelines whose map/filter functions capture objects, with states 03a95f2 wrote for
them in ``tests/checkpoint/data/captures-<case>-03a95f2.*`` (read by
``tests/checkpoint/test_legacy_digest.py``).

03a95f2 digested a captured object whole, by its type's ``module.qualname`` and its
state; this release digests the fields the code reads and names a user's class without
its module (``digests/digest_walk.py``). So the function digests these states hold
are not the ones this release computes, and a restore compares them by 03a95f2's rules
(``digests/legacy_digest.py``). One case per kind of captured object; ``records``:
a dataset whose rows are objects of a user class (its component digest moved the same
way).

The files were written by running :func:`write` with 03a95f2's ``zephon_core`` first on
the path (this module and ``golden.py`` unchanged; the function digests hold byte code,
so the Python matters too: it is recorded in the ``.json``)::

    git archive 03a95f2 | tar -x -C /tmp/old
    cd /tmp && PYTHONPATH=/tmp/old:<repo>/tests python -c \
        "import golden_captures as g; [g.write(c) for c in g.CASES]"

Do not edit the functions or classes below: their byte code and names are in the
digests of those states.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys

import numpy as np
from golden import AFTER, CODE, CUT, DATA, PROSE, digest

from zephon_core import Pipeline, StaticMixtureWorkSource

RELEASE = "03a95f2"


@dataclasses.dataclass
class Settings:
    offset: int = 3
    max_len: int = 40
    out_dir: str = "/tmp/run-1"  # not read by the functions


class Doc:
    """A row of the ``records`` case."""

    def __init__(self, text: str):
        self.text = text


class Shift:
    """A callable object: the ``object`` case."""

    def __init__(self, offset: int):
        self.offset = offset

    def __call__(self, payload: dict) -> dict:
        return {"input_ids": _ids(payload["text"]) + self.offset}


def _ids(text: str) -> np.ndarray:
    return np.frombuffer(text.encode(), dtype=np.uint8).astype(np.int64)


def _namespace_map(args: argparse.Namespace):
    def tokenize(payload: dict) -> dict:
        return {"input_ids": _ids(payload["text"])[: args.max_len] + args.offset}

    return tokenize


def _namespace_filter(args: argparse.Namespace):
    def keep(payload: dict) -> bool:
        return len(payload["text"]) >= args.min_len

    return keep


def _dict_map(cfg: dict):
    def tokenize(payload: dict) -> dict:
        return {"input_ids": _ids(payload["text"])[: cfg["max_len"]] + cfg.get("offset", 0)}

    return tokenize


def _dataclass_map(payload: dict, settings: Settings = Settings(offset=5)) -> dict:  # noqa: B008
    return {"input_ids": _ids(payload["text"])[: settings.max_len] + settings.offset}


def _shifted(payload: dict, settings: Settings) -> dict:
    return {"input_ids": _ids(payload["text"])[: settings.max_len] + settings.offset}


GLOBAL_CFG = {"offset": 7, "max_len": 36, "log_every": 100}


def _global_map(payload: dict) -> dict:
    return {"input_ids": _ids(payload["text"])[: GLOBAL_CFG["max_len"]] + GLOBAL_CFG["offset"]}


def _doc_map(doc: Doc) -> dict:
    return {"input_ids": _ids(doc.text)}


def _args() -> argparse.Namespace:
    return argparse.Namespace(offset=2, max_len=44, min_len=8, resume_from="/tmp/ckpt-1")


CASES = ("namespace", "dict", "dataclass", "object", "partial", "global", "records")


def build(case: str) -> Pipeline:
    """The pipeline of ``case`` (one of :data:`CASES`)."""
    prose, code = PROSE, CODE
    if case == "records":
        prose, code = [Doc(d["text"]) for d in PROSE], [Doc(d["text"]) for d in CODE]
    fn = {
        "namespace": lambda: _namespace_map(_args()),
        "dict": lambda: _dict_map({"offset": 4, "max_len": 42, "save_to": "/tmp/x"}),
        "dataclass": lambda: _dataclass_map,
        "object": lambda: Shift(6),
        "partial": lambda: functools.partial(_shifted, settings=Settings(offset=1, max_len=30)),
        "global": lambda: _global_map,
        "records": lambda: _doc_map,
    }[case]()
    src = StaticMixtureWorkSource(
        {"prose": prose, "code": code}, {"prose": 0.6, "code": 0.4}, chunk_size=4, seed=3
    )
    pipe = Pipeline(src, canonical_replicas=2, flush_every_k_chunks=2, seed=5, prefetch=0)
    pipe = pipe.fetch()
    if case == "namespace":
        pipe = pipe.filter(_namespace_filter(_args()), name="keep")
    return (
        pipe.map(fn, name="tokenize")
        .split(max_len=48)
        .pack(seq_len=48, bins=2, strategy="first_fit")  # the states were written so
        .shuffle(buffer_size=4)
        .batch(batch_size=2)
    )


def name(case: str) -> str:
    return f"captures-{case}-{RELEASE}"


def recorded(case: str) -> dict:
    """``{"after": [output digests], "python": "3.11"}`` as the release wrote them."""
    return json.loads((DATA / f"{name(case)}.json").read_text())


def write(case: str) -> None:
    """Cut ``case``'s stream after ``CUT`` outputs; save the state and the digests of the
    next ``AFTER`` outputs (run with the release's code first on the path)."""
    pipe = build(case)
    it = iter(pipe)
    for _ in range(CUT):
        next(it)
    pipe.save(DATA / f"{name(case)}.state")
    after = [digest(next(it)) for _ in range(AFTER)]
    pipe.close()
    python = f"{sys.version_info[0]}.{sys.version_info[1]}"
    text = json.dumps({"after": after, "python": python}, indent=1)
    (DATA / f"{name(case)}.json").write_text(text + "\n")
