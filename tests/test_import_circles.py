"""No import circle anywhere in attnmem (calc, trace, kernels, measure, pages, the CLI): every import of every module
(module level and inside functions, relative ones resolved) read with ast, and the graph of
those modules has no cycle. A lazy import inside a function hides a circle from Python (the
second module is only imported at call time) but not from this test; a module importing its
own package (its ``__init__``) does not count."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ROOMS = ("attnmem",)


def _module_name(path: Path, root: Path) -> str:
    name = ".".join(path.relative_to(root).with_suffix("").parts)
    return name.removesuffix(".__init__")


def _imports(path: Path, name: str) -> set[str]:
    """Dotted names this module imports, and for ``from a import b`` also ``a.b``."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            out |= {mod} | {f"{mod}.{a.name}" for a in node.names}
    return out


def import_graph(paths: list[Path], root: Path = ROOT) -> dict[str, set[str]]:
    """module -> the modules of ``paths`` (files under ``root``) it imports, its own ancestor
    packages left out."""
    mods = {_module_name(p, root): p for p in paths}
    return {name: {m for m in _imports(p, name) if m in mods and m != name
                   and not name.startswith(m + ".")}
            for name, p in mods.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_in_the_package() -> None:
    paths = [p for room in ROOMS for p in sorted((ROOT / room).rglob("*.py"))]
    assert len(paths) > 150
    assert cycles(import_graph(paths)) == []


@pytest.mark.parametrize("graph, found", [
    ({"a": {"b"}, "b": set()}, []),
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
])
def test_the_checker_finds_circles(graph, found) -> None:
    assert cycles(graph) == found


def test_lazy_and_relative_imports_count(tmp_path: Path) -> None:
    pkg = tmp_path / "attnmem" / "measure"
    pkg.mkdir(parents=True)
    (pkg / "one.py").write_text("def f():\n    from . import two\n")
    (pkg / "two.py").write_text("from attnmem.measure.one import f\n")
    graph = import_graph(sorted(pkg.glob("*.py")), tmp_path)
    assert cycles(graph) == [["attnmem.measure.one", "attnmem.measure.two"]]
