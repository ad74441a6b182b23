"""The toolkit's import structure, read with `ast` (no module is imported): every arrow points
down. The module-level import graph of toolkit modules has no cycle, and no toolkit module is
imported inside a function to dodge one. A function-level import of a toolkit module is kept only
where it keeps a heavy library (torch & co.) out of a light module's import (`toolkit ls` and
`toolkit validate` stay torch-free, see test_startup.py).

`python tests/test_structure.py` prints the figures (cycles, back edges, function-level imports,
longest function, train.py lines) that the issue's notes compare.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "toolkit"
# what `import toolkit`, `toolkit ls` and `validate` must not import (test_startup.py's list), and
# the slow metric and plotting libraries
HEAVY = {"torch", "transformers", "datasets", "peft", "accelerate", "scipy", "sklearn", "safetensors",
         "matplotlib", "seqeval", "sacrebleu", "rouge_score", "evaluate"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _targets(node: ast.Import | ast.ImportFrom, here: str, is_package: bool) -> list[str]:
    """The modules an import statement loads (relative imports resolved)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:
        pkg = here.split(".") if is_package else here.split(".")[:-1]
        pkg = pkg[: len(pkg) - node.level + 1]
        base = ".".join(pkg + ([base] if base else []))
    # `from toolkit import models` loads the submodule toolkit.models; `from toolkit.recipe import
    # Recipe` resolves to toolkit.recipe (see `resolve`)
    return [f"{base}.{a.name}" for a in node.names]


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


class Module:
    def __init__(self, path: Path) -> None:
        self.path, self.name = path, module_name(path)
        self.tree = ast.parse(path.read_text(), str(path))
        self.is_package = path.name == "__init__.py"
        self.top: set[str] = set()  # modules imported when this one is
        self.nested: list[tuple[str, int, str]] = []  # (module, line, function) imported in a function
        self._walk(self.tree.body, None)

    def _walk(self, body: list[ast.stmt], function: str | None) -> None:
        for node in body:
            if _is_type_checking(node):
                continue
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _targets(node, self.name, self.is_package):
                    if function is None:
                        self.top.add(target)
                    else:
                        self.nested.append((target, node.lineno, function))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self._walk(node.body, node.name)
            else:
                for field in ("body", "orelse", "finalbody", "handlers"):
                    children = getattr(node, field, None) or []
                    self._walk([c for c in children if isinstance(c, ast.stmt)]
                               + [s for h in children if isinstance(h, ast.ExceptHandler) for s in h.body],
                               function)


def load() -> dict[str, Module]:
    return {m.name: m for m in (Module(p) for p in sorted(PACKAGE.rglob("*.py")))}


def resolve(target: str, mods: dict[str, Module]) -> str | None:
    """The toolkit module an imported name lives in (None: not a toolkit module)."""
    while target and target not in mods:
        target = target.rpartition(".")[0]
    return target or None


def graph(mods: dict[str, Module], nested: bool = False) -> dict[str, set[str]]:
    """Edges between toolkit modules: module-level imports, and with `nested` the imports inside
    functions too (the arrows a reader follows, whenever they run). A plug-in importing its own
    package is not counted: the package imports its plug-ins by name (`importlib`), not back."""
    edges: dict[str, set[str]] = {name: set() for name in mods}
    for name, mod in mods.items():
        targets = set(mod.top) | ({t for t, _, _ in mod.nested} if nested else set())
        for target in map(lambda t: resolve(t, mods), targets):
            if target and target != name and not name.startswith(target + "."):
                edges[name].add(target)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def back_edges(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Edges that close a cycle in a depth-first walk: the arrows that run back up."""
    colour: dict[str, int] = {}
    back: list[tuple[str, str]] = []

    def visit(v: str) -> None:
        colour[v] = 1
        for w in sorted(edges[v]):
            if colour.get(w) == 1:
                back.append((v, w))
            elif w not in colour:
                visit(w)
        colour[v] = 2

    for v in sorted(edges):
        if v not in colour:
            visit(v)
    return back


def heavy_at_import(mods: dict[str, Module], edges: dict[str, set[str]]) -> dict[str, bool]:
    """Whether importing a module imports a heavy library (its own imports or a toolkit module's)."""
    memo: dict[str, bool] = {}

    def heavy(name: str, seen: frozenset) -> bool:
        if name in memo:
            return memo[name]
        own = any(t.split(".")[0] in HEAVY for t in mods[name].top)
        result = own or any(heavy(t, seen | {name}) for t in edges[name] if t not in seen)
        memo[name] = result
        return result

    return {name: heavy(name, frozenset()) for name in mods}


def circle_dodges(mods: dict[str, Module], edges: dict[str, set[str]]) -> list[str]:
    """Toolkit modules imported inside a function although importing them at the top would add
    no heavy library to a light module: such an import can only be there to dodge a circle."""
    heavy = heavy_at_import(mods, edges)
    found = []
    for name, mod in mods.items():
        for raw, line, function in mod.nested:
            target = resolve(raw, mods)
            if not target or target == name:
                continue
            if heavy[name] or not heavy[target]:
                found.append(f"{mod.path.relative_to(ROOT)}:{line} ({function}) imports {target}")
    return found


def longest_function(mods: dict[str, Module]) -> tuple[int, str]:
    best = (0, "")
    for mod in mods.values():
        for node in ast.walk(mod.tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                best = max(best, (length, f"{mod.name}.{node.name}"))
    return best


def figures() -> dict:
    mods = load()
    edges, every = graph(mods), graph(mods, nested=True)
    nested = [n for m in mods.values() for n in m.nested]
    return {
        "modules": len(mods), "edges": sum(len(v) for v in edges.values()),
        "module_level_cycles": cycles(edges), "module_level_back_edges": back_edges(edges),
        "cycles": cycles(every), "back_edges": back_edges(every),
        "function_level_imports": len(nested),
        "function_level_toolkit_imports": sum(1 for t, _, _ in nested if resolve(t, mods)),
        "circle_dodges": sorted(set(circle_dodges(mods, edges))),
        "longest_function": longest_function(mods),
        "train_py_lines": len((PACKAGE / "train.py").read_text().splitlines()),
    }


def test_no_import_cycle() -> None:
    """Counting imports inside functions too: every arrow points down."""
    mods = load()
    every = graph(mods, nested=True)
    assert cycles(every) == [] and back_edges(every) == []


def test_no_import_inside_a_function_to_dodge_a_cycle() -> None:
    mods = load()
    assert circle_dodges(mods, graph(mods)) == []


def test_the_measure_sees_a_cycle_and_a_dodge(tmp_path: Path, monkeypatch) -> None:
    """The measure itself: a two-module circle and a light function-level import are found."""
    pkg = tmp_path / "toolkit"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from toolkit import b\n")
    (pkg / "b.py").write_text("import toolkit.a\n\ndef f():\n    from toolkit import c\n")
    (pkg / "c.py").write_text("import json\n")
    (pkg / "d.py").write_text("def g():\n    from toolkit import e\n")
    (pkg / "e.py").write_text("import torch\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", pkg)
    mods = load()
    edges = graph(mods)
    assert cycles(edges) == [["toolkit.a", "toolkit.b"]]
    assert len(back_edges(edges)) == 1
    assert circle_dodges(mods, edges) == ["toolkit/b.py:4 (f) imports toolkit.c"]


if __name__ == "__main__":
    for key, value in figures().items():
        print(f"{key}: {value}")
