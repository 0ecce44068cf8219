"""The source contract (``sources/base.py``): a custom source implements only the
required members and runs and resumes exactly; the engine uses nothing else."""

from __future__ import annotations

import ast
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import zephon_core
from zephon_core import Pipeline
from zephon_core.chunk import WorkChunk
from zephon_core.errors import ConfigError, CorruptCheckpoint
from zephon_core.sources import Source
from zephon_core.sources.base import OPTIONAL_MEMBERS, REQUIRED_MEMBERS, as_source

ROWS = [f"row{i}" for i in range(40)]


class CountingLane:
    """Rows ``lane, lane + C, ...`` of one list, four per chunk, ending after the list."""

    def __init__(self, lane: int, num_lanes: int, seed: int):
        self.lane, self.num_lanes, self.seed = lane, num_lanes, seed
        self.next_id = 0

    def next_chunk(self) -> WorkChunk | None:
        rows = [
            p
            for p in range(self.lane + 4 * self.next_id * self.num_lanes, len(ROWS), self.num_lanes)
        ][:4]
        if not rows:
            return None
        chunk = WorkChunk(self.lane, self.next_id, (0,) * len(rows), tuple(rows), self.seed)
        self.next_id += 1
        return chunk

    def state_dict(self) -> dict[str, Any]:
        return {"next": self.next_id}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or not isinstance(state.get("next"), int):
            raise CorruptCheckpoint(f"CountingLane: bad state {state!r}")
        self.next_id = state["next"]


class MinimalSource(Source):
    """Only the required members of the contract."""

    component_names = ("rows",)
    weights = (1.0,)

    def open_lane(self, lane: int, num_lanes: int, seed: int) -> CountingLane:
        return CountingLane(lane, num_lanes, seed)

    def read(self, component: int, rows: Sequence[int]) -> list[Any]:
        return [ROWS[r] for r in rows]

    def describe(self) -> dict[str, Any]:
        return {"class": "MinimalSource", "rows": len(ROWS)}


def _pipe(source: Any) -> Pipeline:
    return Pipeline(source, canonical_replicas=2, seed=5).fetch()


@pytest.mark.parametrize("make", [MinimalSource, lambda: _duck(MinimalSource())])
def test_a_minimal_custom_source_runs_and_resumes_exactly(make):
    full = _pipe(make())
    reference = list(full)
    full.close()
    assert sorted(reference) == sorted(ROWS)  # every row once: the stream ended
    for cut in (1, 7, 23):
        first = _pipe(make())
        it = iter(first)
        head = [next(it) for _ in range(cut)]
        state = first.checkpoint()
        first.close()
        again = _pipe(make())
        again.load_state_dict(state)
        assert head + list(again) == reference, cut
        again.close()


def test_the_defaults_of_the_optional_members():
    src = MinimalSource()
    assert src.finite is True and src.lengths is None and src.schedule is None
    assert src.weights_at(tokens=10, documents=3) == (1.0,)
    assert src.given_weights() == (1.0,)
    assert src.scheduled({"next": 3}) == (None, 0)
    assert src.io_stats() == {} and src.content_fingerprints() == {}
    assert src.needs_length_estimate == () and src.weights_unit == "documents"
    with pytest.raises(zephon_core.errors.IncompatibleCheckpoint, match="cannot re-mix"):
        src.remix_lane_state(["rows"], {"next": 0})
    pipe = _pipe(src)
    list(pipe)
    mixture = pipe.stats()["mixture"]
    pipe.close()
    # the report reads the lanes through scheduled(): no documents known, target stated
    assert mixture["rows"]["documents"] == 0 and mixture["rows"]["document_share_target"] == 1


def test_the_mixture_report_reads_documents_through_the_source():
    class Reporting(MinimalSource):
        def scheduled(self, lane_state):
            return (4 * lane_state["next"],), 0

    pipe = _pipe(Reporting())
    list(pipe)
    mixture = pipe.stats()["mixture"]
    pipe.close()
    assert mixture["rows"]["documents"] == 4 * 5 * 2  # 5 chunks of 4 rows on each lane


class _Duck:
    """A source that is no Source subclass: the five members, delegated."""

    def __init__(self, inner: MinimalSource):
        self.component_names, self.weights = inner.component_names, inner.weights
        self.open_lane, self.read, self.describe = inner.open_lane, inner.read, inner.describe


def _duck(inner: MinimalSource) -> _Duck:
    return _Duck(inner)


def test_an_object_with_optional_members_must_subclass_source():
    duck = _duck(MinimalSource())
    duck.finite = False  # would be ignored: refused instead
    with pytest.raises(ConfigError, match="'finite'.*subclass"):
        Pipeline(duck)
    with pytest.raises(ConfigError, match="lacks 'read'"):
        del duck.read
        as_source(duck)


def test_the_contract_lists_every_member_once():
    assert set(REQUIRED_MEMBERS).isdisjoint(OPTIONAL_MEMBERS)
    for name in OPTIONAL_MEMBERS:  # each optional member has a default on Source
        assert hasattr(Source, name), name


# -- the engine uses a source only through the contract ------------------------------

PACKAGE = Path(zephon_core.__file__).parent
ENGINE_SIDE = ("engine", "checkpoint", "distributed", "ops", "digests", "tracking")


def _mentions_source(node: ast.AST) -> bool:
    names = [n.id for n in ast.walk(node) if isinstance(n, ast.Name)]
    names += [n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)]
    return any("source" in n.lower() or "src" in n.lower() or "spec" in n.lower() for n in names)


def _probes_a_source(call: ast.Call) -> bool:
    """``getattr``/``hasattr`` of a public name on an object that names a source (torch's
    DataLoader iterator, which torch_data.py calls ``source``, is probed for private
    torch names: it is no WorkSource)."""
    if not isinstance(call.func, ast.Name) or call.func.id not in ("getattr", "hasattr"):
        return False
    if len(call.args) < 2:
        return False
    name = call.args[1].value if isinstance(call.args[1], ast.Constant) else None
    return _mentions_source(call.args[0]) and not (isinstance(name, str) and name[:1] == "_")


def test_no_getattr_or_hasattr_probes_a_source():
    """Capabilities are members of ``Source`` with defaults, never probed: a
    ``getattr``/``hasattr`` of a source fails here."""
    found = []
    for folder in ENGINE_SIDE:
        for path in sorted((PACKAGE / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and _probes_a_source(node):
                    found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert not found, "source probed by getattr/hasattr (add it to Source): " + ", ".join(found)


@pytest.mark.parametrize(
    "code, probe",
    [
        ("getattr(plan.source, 'finite', True)", True),
        ("hasattr(src, 'remix_lane_state')", True),
        ("getattr(ctx.source, 'vocab', None)", True),
        ("getattr(op, 'runner', 'threads')", False),
        ("getattr(source, '_shutdown_workers', None)", False),  # torch's loader iterator
    ],
)
def test_the_probe_check_sees_a_probe(code, probe):
    call = next(n for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Call))
    assert _probes_a_source(call) is probe
