"""The layout: folders in one order, no import cycles, the core imports no integration.

Every import counts, also one deferred into a function body and one under ``if
TYPE_CHECKING:`` (a type is a dependency of the reader): a reader can take the folders
top-down in :data:`LAYERS` and, inside a folder, the modules in an order where each one
only uses those before it.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import zephon_core
import zephon_integrations

REPO = Path(zephon_core.__file__).parent.parent
PACKAGES = ("zephon_core", "zephon_integrations")
FACE = "zephon_core"  # the package's __init__: re-exports, may import anything

#: Folders from top to bottom: a module imports only modules of its own folder or of a
#: folder below it. ``zephon_core/`` alone stands for the modules directly in it (records,
#: chunk, errors, rng, validate, progress, _version). The README's "Layout" section states
#: the same order.
LAYERS = (
    "zephon_integrations/",
    "zephon_core/cli/",
    "zephon_core/testing/",
    "zephon_core/engine/",
    "zephon_core/distributed/",
    "zephon_core/tracking/",
    "zephon_core/checkpoint/",
    "zephon_core/ops/",
    "zephon_core/sources/",
    "zephon_core/digests/",
    "zephon_core/",
)

#: The one cycle still allowed: the description builds its run handles, and they call
#: back into it (issue 20 item 1 removes it).
ALLOWED_CYCLE = frozenset(
    {"zephon_core.engine.pipeline", "zephon_core.engine.handle", "zephon_core.engine.torch_data"}
)


@functools.cache
def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _imports(mod: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules ``mod`` imports: ``from pkg import name`` is ``pkg.name`` when that is
    a module, else ``pkg`` (its ``__init__``); other packages' names are left out."""
    tree = ast.parse(path.read_text())
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                targets.add(sub if sub in modules else source)
        elif isinstance(node, ast.Import):
            targets.update(a.name for a in node.names)
    out = set()
    for target in targets:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target != mod:
            out.add(target)
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {mod: _imports(mod, path, modules) for mod, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[set[str]] = []

    def visit(m: str) -> None:
        index[m] = low[m] = len(index)
        stack.append(m)
        on_stack.add(m)
        for d in sorted(graph[m]):
            if d not in index:
                visit(d)
                low[m] = min(low[m], low[d])
            elif d in on_stack:
                low[m] = min(low[m], index[d])
        if low[m] == index[m]:
            component = set()
            while True:
                x = stack.pop()
                on_stack.discard(x)
                component.add(x)
                if x == m:
                    break
            if len(component) > 1:
                out.append(component)

    for m in sorted(graph):
        if m not in index:
            visit(m)
    return out


def _layer(mod: str) -> int:
    """The position in :data:`LAYERS` of the folder holding ``mod``."""
    if mod == FACE:
        return 0  # imported only by the integrations, beside which it sits
    path = _modules()[mod].relative_to(REPO)
    folder = "/".join(path.parts[:2]) + "/" if len(path.parts) > 2 else path.parts[0] + "/"
    if folder.startswith("zephon_integrations/"):
        folder = "zephon_integrations/"
    assert folder in LAYERS, f"{folder} is in no layer: add it to LAYERS (and the README)"
    return LAYERS.index(folder)


def test_no_import_cycles():
    cycles = [c for c in _cycles(_graph()) if c != ALLOWED_CYCLE]
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(sorted(c)) for c in cycles)


def test_the_allowed_cycle_still_exists():
    # once it is gone, drop ALLOWED_CYCLE so it cannot come back
    assert ALLOWED_CYCLE in _cycles(_graph())


def test_folders_import_only_their_own_or_lower_layers():
    wrong = [
        f"{mod} -> {dep}"
        for mod, deps in sorted(_graph().items())
        if mod != FACE
        for dep in sorted(deps)
        if _layer(dep) < _layer(mod)
    ]
    assert not wrong, f"imports of a higher layer (order: {LAYERS}):\n" + "\n".join(wrong)


def test_every_folder_has_a_layer():
    for mod in _modules():
        _layer(mod)


def test_the_core_imports_no_integration():
    for path in (REPO / "zephon_core").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                assert not name.startswith(
                    ("zephon_integrations", "lightning", "transformers", "accelerate", "datasets")
                ), (path, name)


def test_the_graph_reads_both_packages_of_this_tree():
    assert Path(zephon_integrations.__file__).parent.parent == REPO
    assert "zephon_integrations.lightning.datamodule" in _graph()
