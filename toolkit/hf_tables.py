"""Name tables of transformers and PEFT (model types, heads, attention kernels, LoRA targets),
read without importing them.

`toolkit validate` asks transformers whether a model_type is one it knows, whether a family has a
head of some kind and whether an attention name is registered, and PEFT whether it has default
target modules for a family. The answers are literal tables in their source (transformers'
models/auto/*.py and AttentionInterface class, peft/utils/constants.py), but importing either
library imports torch: seconds. The tables are read here with `ast` (milliseconds, once a
process). Where the library is imported already (the commands that load models import it
first), or its source does not hold a table as a literal that nothing changes (another
release's layout), the module itself answers; tests/test_startup.py compares the tables read
here with the imported ones.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any, Mapping

AUTO = "transformers.models.auto.modeling_auto"
MUTATORS = frozenset({"update", "pop", "popitem", "setdefault", "clear", "__setitem__", "__delitem__"})


def _imported(module: str) -> bool:
    """Whether the library `module` belongs to is imported: its own tables then cost little more."""
    return module.split(".")[0] in sys.modules


def _source(module: str) -> Path | None:
    """The .py file of a module of an installed package, found without importing the package."""
    try:
        spec = importlib.util.find_spec(module.split(".")[0])  # top level: located, not imported
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    parts = module.split(".")[1:]
    path = Path(list(spec.submodule_search_locations)[0]).joinpath(*parts[:-1], parts[-1] + ".py")
    return path if path.is_file() else None


def _literal(node: ast.expr) -> dict | None:
    """A `{...}` or `OrderedDict([...])` of constants as a dict; None for anything else."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "OrderedDict" \
            and len(node.args) == 1 and not node.keywords:
        node = node.args[0]
    try:
        value = ast.literal_eval(node)
        return dict(value) if isinstance(value, (dict, list, tuple)) else None
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def _tree(module: str) -> ast.Module | None:
    """The parsed source of an installed module, not imported; None where it cannot be read."""
    path = _source(module)
    if path is None:
        return None
    try:
        return ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return None


@functools.lru_cache(maxsize=None)
def _module_tables(module: str) -> dict[str, dict]:
    """Top-level `NAME = <literal table>` of a module, leaving out any name the module assigns
    twice or changes in place (its value is then not the literal)."""
    tree = _tree(module)
    if tree is None:
        return {}
    tables: dict[str, dict] = {}
    assigned: dict[str, int] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            assigned[name] = assigned.get(name, 0) + 1
            table = _literal(node.value)
            if table is not None:
                tables[name] = table
    changed = {name for name, count in assigned.items() if count > 1}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in MUTATORS and isinstance(node.value, ast.Name):
            changed.add(node.value.id)
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, (ast.Store, ast.Del)) \
                and isinstance(node.value, ast.Name):
            changed.add(node.value.id)
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            changed.add(node.target.id)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            changed.update(node.names)
    return {name: table for name, table in tables.items() if name not in changed}


def table(module: str, name: str) -> Mapping[str, Any]:
    """The dict `module.name`: read from the source, or from the module where that is imported
    already or the source does not hold it as a literal."""
    if not _imported(module):
        found = _module_tables(module).get(name)
        if found is not None:
            return found
    return getattr(importlib.import_module(module), name)


def model_table(name: str) -> Mapping[str, str]:
    """One of modeling_auto's `MODEL_FOR_..._MAPPING_NAMES` (model_type -> class name)."""
    return table(AUTO, name)


def knows_model_type(model_type: str) -> bool:
    """Whether transformers has a config class for `model_type` (its CONFIG_MAPPING_NAMES: the
    generated table in auto_mappings.py, which configuration_auto.py only adds to)."""
    config_auto = "transformers.models.auto.configuration_auto"
    if not _imported(config_auto):
        generated = _module_tables("transformers.models.auto.auto_mappings").get("CONFIG_MAPPING_NAMES", {})
        if model_type in generated:
            return True
    return model_type in importlib.import_module(config_auto).CONFIG_MAPPING_NAMES


@functools.lru_cache(maxsize=1)
def _builtin_attention() -> tuple[str, ...]:
    """The keys of `AttentionInterface._global_mapping` in modeling_utils.py's source."""
    path = _source("transformers.modeling_utils")
    if path is None:
        return ()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return ()
    start = text.find("\nclass AttentionInterface(")
    if start < 0:
        return ()
    lines = text[start + 1:].splitlines()
    end = next((i for i, line in enumerate(lines[1:], 1) if line[:1] not in ("", " ", "\t", "#")), len(lines))
    try:
        tree = ast.parse("\n".join(lines[:end]))
    except SyntaxError:
        return ()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_global_mapping"
                                                for t in node.targets) and isinstance(node.value, ast.Dict):
            keys = [k.value for k in node.value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
            return tuple(keys) if len(keys) == len(node.value.keys) else ()
    return ()


def attention_names(registered: bool = False) -> list[str]:
    """`eager` and the attention implementations transformers has: those its source registers,
    or with `registered` (which imports transformers' modeling code) every name registered now,
    the toolkit's own and any another package added included."""
    if registered or _imported("transformers") or not _builtin_attention():
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        return ["eager", *ALL_ATTENTION_FUNCTIONS.valid_keys()]
    return ["eager", *_builtin_attention()]


def valid_attention(registered: bool = False) -> list[str]:
    """What transformers takes as attn_implementation: the names and their `paged|` forms (which
    models.check_attention refuses by name: the toolkit runs no paged cache)."""
    names = attention_names(registered)
    return names + [f"paged|{k}" for k in names if "|" not in k]


@functools.lru_cache(maxsize=None)
def _module_classes(module: str) -> dict[str, tuple[tuple[str, ...], dict[str, Any]]]:
    """Each top-level class of a module: (its bases' names, its class-level `NAME = constant`s)."""
    tree = _tree(module)
    if tree is None:
        return {}
    classes = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            bases = tuple(b.id if isinstance(b, ast.Name) else "" for b in node.bases)
            consts = {}
            for item in node.body:
                target = item.targets[0] if isinstance(item, ast.Assign) and len(item.targets) == 1 else \
                    item.target if isinstance(item, ast.AnnAssign) and item.value is not None else None
                if isinstance(target, ast.Name) and isinstance(item.value, ast.Constant):
                    consts[target.id] = item.value.value
            classes[node.name] = (bases, consts)
    return classes


def class_flag(family: str, class_name: str, flag: str) -> bool | None:
    """A class attribute of transformers' `class_name` of the family `model_type` (`_supports_sdpa`,
    `_supports_flex_attn`, ...) read from its modeling file without importing transformers (which
    imports torch: validate stays light): the class's own, else its bases' in that file, in order,
    else PreTrainedModel's (False). None where the file or a base outside it does not say (the
    imported class answers then, or the load)."""
    folder = family.replace("-", "_")
    module = f"transformers.models.{folder}.modeling_{folder}"
    if _imported("transformers"):
        try:
            return bool(getattr(getattr(importlib.import_module("transformers"), class_name), flag))
        except (AttributeError, ImportError):
            return None
    return _flag_in(_module_classes(module), class_name, flag)


def _flag_in(classes: dict[str, tuple[tuple[str, ...], dict[str, Any]]], class_name: str, flag: str) -> bool | None:
    """`flag` of `class_name` among a module's `classes` (_module_classes), by its bases in order."""
    order, seen = [class_name], set()
    while order:
        name = order.pop(0)
        if name in seen:
            continue
        seen.add(name)
        if name == "PreTrainedModel":
            return False
        if name not in classes:
            return None
        bases, consts = classes[name]
        if flag in consts:
            return bool(consts[flag])
        order = [b for b in bases if b] + order
    return None

