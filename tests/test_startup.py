"""Start-up: `toolkit ls` and `toolkit validate` import none of the heavy libraries (a behaviour
test, not a timed one: it fails when someone adds an eager import), and the name tables they read
from transformers' and PEFT's source are the ones those libraries hold."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import PYTHON, ROOT, write_recipe

HEAVY = ("torch", "transformers", "datasets", "peft", "accelerate", "scipy", "sklearn", "safetensors")

# In a fresh interpreter: run the commands in-process, then list the heavy modules imported.
PROBE = """
import json, sys
from toolkit.cli import main
codes = [main(argv) for argv in json.loads(sys.argv[1])]
print(json.dumps({"codes": codes, "heavy": [m for m in %r if m in sys.modules]}))
""" % (HEAVY,)


def _heavy_after(*commands: list[str]) -> dict:
    proc = subprocess.run([PYTHON, "-c", PROBE, json.dumps(list(commands))], cwd=ROOT, text=True,
                          capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_ls_imports_no_heavy_library() -> None:
    result = _heavy_after(["ls"], ["ls", "methods"], ["ls", "tasks"], ["ls", "recipes"])
    assert result == {"codes": [0, 0, 0, 0], "heavy": []}


@pytest.mark.parametrize("recipe", ["recipes/demo/sst2/minilm-full.yaml", "recipes/demo/sst2/minilm-lora.yaml",
                                    "recipes/attention/sst2/minilm-local.yaml",
                                    "recipes/attention/sst2/minilm-sdpa.yaml"])
def test_validate_imports_no_heavy_library(recipe: str) -> None:
    assert _heavy_after(["validate", recipe]) == {"codes": [0], "heavy": []}


def test_validate_every_recipe_imports_no_heavy_library() -> None:
    assert _heavy_after(["validate"]) == {"codes": [0], "heavy": []}


def test_validate_of_a_local_model_folder_reads_its_config(tmp_path: Path) -> None:
    """A local checkpoint's family comes from its config.json, read as JSON."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    recipe = write_recipe(tmp_path / "r.yaml", f"model: {{checkpoint: {folder}}}\n"
                          "task: {name: glue, subset: sst2}\nmethod: {name: lora}\n")
    assert _heavy_after(["validate", str(recipe)]) == {"codes": [0], "heavy": []}


def test_source_tables_match_the_libraries() -> None:
    """What hf_tables reads from the source equals what the imported modules hold."""
    import importlib

    from toolkit import heads, hf_tables, tasks  # noqa: F401  (tasks may declare heads of their own)

    for auto_class, name, _ in (h.__dict__.values() for h in heads.HEADS.values()):
        source = hf_tables._module_tables(hf_tables.AUTO)[name]
        imported = getattr(importlib.import_module("transformers"), auto_class)._model_mapping._model_mapping
        assert source == dict(imported), name
    for name in ("TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING",
                 "TRANSFORMERS_MODELS_TO_IA3_TARGET_MODULES_MAPPING"):
        source = hf_tables._module_tables("peft.utils.constants")[name]
        assert source == getattr(importlib.import_module("peft.utils.constants"), name), name
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    generated = hf_tables._module_tables("transformers.models.auto.auto_mappings")["CONFIG_MAPPING_NAMES"]
    assert generated and set(generated) <= set(CONFIG_MAPPING_NAMES)
    from transformers.modeling_utils import AttentionInterface

    from toolkit.attention import ATTENTION
    from toolkit.methods.prefix_tuning import WRAPPED

    ours = ATTENTION.names()  # registered into the same class-level table once a model was loaded
    builtin = tuple(k for k in AttentionInterface._global_mapping if k not in ours and not k.startswith(WRAPPED))
    assert hf_tables._builtin_attention() == builtin


def test_a_table_changed_in_place_is_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A literal the module later updates is not its value: that name falls back to an import."""
    package = tmp_path / "fakepkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "tables.py").write_text("A = {'x': 1}\nB = OrderedDict([('y', 2)])\nC = {'z': 3}\n"
                                       "C.update({'w': 4})\nD = {}\nD['v'] = 5\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from toolkit import hf_tables

    assert hf_tables._module_tables("fakepkg.tables") == {"A": {"x": 1}, "B": {"y": 2}}
    assert "fakepkg" not in sys.modules


def test_lazy_module_rebinds_the_name_it_stands_for() -> None:
    from toolkit.lazy import LazyModule, lazy

    namespace: dict = {}
    namespace["js"] = namespace["alias"] = lazy("json", namespace)
    assert isinstance(namespace["js"], LazyModule)
    assert namespace["js"].dumps([1]) == "[1]"
    assert namespace["js"] is json and namespace["alias"] is json
