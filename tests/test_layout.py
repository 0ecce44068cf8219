"""The engine's layout: no import cycles, and the core never imports an integration.

Every import counts, also one deferred into a function body (only imports under ``if
TYPE_CHECKING:`` are not edges): a reader can take the modules in an order where each
one only uses those before it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import zephon_core

ROOT = Path(zephon_core.__file__).parent


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    mod = _module(path)
    package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
    out: set[str] = set()
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for n in ast.walk(node))
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.add(target)
            for alias in node.names:  # "from . import x" may name a submodule
                out.add(f"{target}.{alias.name}")
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def _graph() -> dict[str, set[str]]:
    modules = {_module(p): p for p in ROOT.rglob("*.py")}
    graph = {}
    for mod, path in modules.items():
        deps = set()
        for target in _imports(path):
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != mod and not mod.startswith(target + "."):
                deps.add(target)
        graph[mod] = deps
    return graph


def test_no_import_cycles_in_the_engine():
    graph = _graph()
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph[m]):
            if d.endswith("__init__") or d == "zephon_core":
                continue
            if state.get(d) == 1:
                cycles.append(stack[stack.index(d) :] + [d])
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    # package __init__ modules re-export; cycles through them are not a reading order
    cycles = [c for c in cycles if not any(x.count(".") == 0 or _is_package(x) for x in c)]
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def _is_package(mod: str) -> bool:
    return (ROOT.parent / Path(*mod.split(".")) / "__init__.py").exists()


def test_the_core_imports_no_integration():
    for path in ROOT.rglob("*.py"):
        for target in _imports(path):
            assert not target.startswith(
                ("zephon_integrations", "lightning", "transformers", "accelerate", "datasets")
            ), (path, target)
