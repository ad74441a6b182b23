"""Every registered plug-in (method, task, attention module) has a test row: its name stands in
the rows of a `pytest.mark.parametrize` somewhere in tests/ (read with `ast`, rows given inline
or through module-level names they are built from). Registering also sets the plug-in's name."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


def _strings(node: ast.AST, names: dict[str, ast.AST], seen: set[str]) -> set[str]:
    """The string constants in `node`, following module-level names it uses."""
    found: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            found.add(sub.value)
        elif isinstance(sub, ast.Name) and sub.id in names and sub.id not in seen:
            seen.add(sub.id)
            found |= _strings(names[sub.id], names, seen)
    return found


def row_strings(path: Path) -> set[str]:
    """The strings in the parametrize rows of one test file."""
    tree = ast.parse(path.read_text())
    names = {t.id: node.value for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
             for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
             if isinstance(t, ast.Name) and node.value is not None}
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("mark.parametrize") and len(node.args) > 1:
            found |= _strings(node.args[1], names, set())
    return found


def untested(registered: list[str], strings: set[str]) -> list[str]:
    """Names that are no row's word (`lora` is in "{name: lora, r: 4}" and in ("lora", {...}))."""
    words = {w for s in strings for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", s)}
    return [name for name in registered if name not in words]


def _registries() -> dict[str, list[str]]:
    from toolkit.attention import ATTENTION
    from toolkit.methods import METHODS
    from toolkit.tasks import TASKS

    return {"method": METHODS.names(), "task": TASKS.names(), "attention": ATTENTION.names()}


@pytest.mark.parametrize("kind", ["method", "task", "attention"])
def test_every_registered_plugin_has_a_test_row(kind: str) -> None:
    strings = set().union(*(row_strings(p) for p in sorted(TESTS.glob("test_*.py"))))
    assert untested(_registries()[kind], strings) == []


def test_a_plugin_without_a_row_is_found(tmp_path: Path) -> None:
    file = tmp_path / "test_x.py"
    file.write_text('import pytest\nCASES = [("lora", {}), ("full", {})]\nMORE = CASES + [("x", 1)]\n'
                    '@pytest.mark.parametrize("name, s", MORE)\ndef test_a(name, s): ...\n'
                    '@pytest.mark.parametrize("r", ["{name: dora, r: 4}"])\ndef test_b(r): ...\n'
                    'OTHER = ["adalora"]\n')
    assert untested(["lora", "full", "dora", "adalora"], row_strings(file)) == ["adalora"]


def test_registering_sets_the_name_once() -> None:
    from toolkit.attention import ATTENTION
    from toolkit.methods import METHODS
    from toolkit.tasks import TASKS

    for registry in (METHODS, TASKS, ATTENTION):
        assert all(registry.get(name).name == name for name in registry.names())
