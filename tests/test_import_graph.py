"""No import circle in ``diagnostics/``: lower layers never reach back up, not even through an
import inside a function (which only hides a circle until the day it runs first)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "diagnostics"


def _modules(package: Path) -> dict[str, Path]:
    """Every module of ``package`` by dotted name (a package by its own name)."""
    modules = {}
    for path in package.rglob("*.py"):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _target(name: str, modules: dict[str, Path]) -> str | None:
    """The module of ``modules`` an import of ``name`` runs (its longest known prefix)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(package: Path) -> dict[str, set[str]]:
    """Each module's imports of the package's own modules, at any depth of its code."""
    modules = _modules(package)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
                base = node.module or ""
                if node.level:
                    here = name.split(".") if is_package else name.split(".")[:-1]
                    base = ".".join(here[: len(here) - node.level + 1] + ([base] if base else []))
                names = [f"{base}.{alias.name}" for alias in node.names] + [base]
            for imported in names:
                target = _target(imported, modules)
                if target is not None and target != name:
                    graph[name].add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_package_has_no_import_circle():
    found = circles(import_graph(PACKAGE))
    assert not found, "import circles: " + "; ".join(" ↔ ".join(component) for component in found)


def test_a_planted_circle_is_found(tmp_path):
    """The negative control: a lower module importing an upper one inside a function is a circle."""
    package = tmp_path / "pkg"
    (package / "store").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "store" / "__init__.py").write_text("from pkg.store.core import Store\n")
    (package / "store" / "core.py").write_text("def check():\n    from pkg.runner import run\n")
    (package / "runner.py").write_text("from pkg.store import Store\n")
    (package / "leaf.py").write_text("import pkg.runner\n")
    assert circles(import_graph(package)) == [["pkg.runner", "pkg.store", "pkg.store.core"]]
