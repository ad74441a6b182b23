"""Start-up: `toolkit ls` and `toolkit validate` import none of the heavy libraries (a behaviour
test, not a timed one: it fails when someone adds an eager import), and the name tables they read
from transformers' and PEFT's source are the ones those libraries hold."""

from __future__ import annotations

import json
import os
import re
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


VALIDATED = ["recipes/demo/sst2/minilm-full.yaml", "recipes/demo/sst2/minilm-lora.yaml",
             "recipes/attention/sst2/minilm-local.yaml", "recipes/attention/sst2/minilm-sdpa.yaml"]


def test_validate_imports_no_heavy_library() -> None:
    """Each recipe validated in turn in one interpreter (an interpreter's start-up is most of a
    validate's time): a heavy import by any of them stays in sys.modules and fails it."""
    assert _heavy_after(*(["validate", recipe] for recipe in VALIDATED)) == {"codes": [0] * len(VALIDATED), "heavy": []}


def test_validate_every_recipe_imports_no_heavy_library() -> None:
    """Every shipped recipe checked, its data files included: exit 0 where every file is on this
    machine, else 2 (one line a missing file), with no heavy library imported either way."""
    from toolkit import recipe as recipes

    files = {f for path in (ROOT / "recipes").rglob("*.yaml") if not path.name.startswith("_")
             for _, f in recipes.named_files(recipes.load(path).task)}
    expected = 0 if all(f.is_file() for f in files) else 2
    assert _heavy_after(["validate"]) == {"codes": [expected], "heavy": []}


def test_report_imports_no_heavy_library(tmp_path: Path) -> None:
    """`toolkit report` reads run folders alone, each recipe.yaml checked against the hash its
    metrics.json records (toolkit/recipe.py `made_with`, as eval does): no torch for that. Two
    methods over two seeds, so the paired t interval is computed (scipy's t quantile: the one
    heavy library it may read)."""
    from toolkit import recipe as recipes

    for method in ("full", "lora"):
        for seed in (42, 43):
            made = recipes.load(ROOT / f"recipes/demo/sst2/minilm-{method}.yaml", [f"train.seed={seed}"])
            run = tmp_path / "runs" / method / str(seed)
            run.mkdir(parents=True)
            (run / "recipe.yaml").write_text(recipes.dump(made))
            (run / "metrics.json").write_text(json.dumps({
                "eval": {"accuracy": 0.5 + seed / 100 + (method == "lora") * (seed - 40) / 20}, "main_metric": "accuracy",
                "recipe_hash": made.hash, "seed": seed, "method": method}))
    result = _heavy_after(["report", str(tmp_path / "runs"), "--no-plots"])
    assert result == {"codes": [0], "heavy": ["scipy"]}


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

    for auto_class, name in ((h.auto_class, h.table) for h in heads.HEADS.values()):
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
    # the attention flags validate reads from the modeling files (models.check_attention): for every
    # family a run can name and each flag, what the imported class holds (read with transformers
    # imported, class_flag asks the class: the source's reading is checked here through its cache)
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    from toolkit.models import SUPPORT_FLAGS

    checked = 0
    for family in ("bert", "roberta", "gpt2", "bart", "t5", "xlm-roberta", "llama", "distilbert", "deberta-v2"):
        module = f"transformers.models.{family.replace('-', '_')}.modeling_{family.replace('-', '_')}"
        hf_tables._module_classes.cache_clear()
        imported = getattr(importlib.import_module("transformers"), MODEL_MAPPING_NAMES[family])
        for flag in SUPPORT_FLAGS.values():
            read = hf_tables._flag_in(hf_tables._module_classes(module), MODEL_MAPPING_NAMES[family], flag)
            assert read in (None, bool(getattr(imported, flag))), (family, flag)
            checked += read is not None
    assert checked >= 20, checked  # most read from the source, not left to the load


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


# Check first, import later: a mistake that needs no library is said before any is imported.
FIRST_ERROR = """
import json, sys
import toolkit
from toolkit.cli import main
kind, args = sys.argv[1], json.loads(sys.argv[2])
if kind == "cli":
    code, line = main(args), None
else:
    try:
        toolkit.run(args[0], args[1:])
        code, line = 0, None
    except toolkit.UserError as exc:
        code, line = 2, str(exc)
print(json.dumps({"code": code, "line": line, "heavy": [m for m in %r if m in sys.modules]}))
""" % (HEAVY,)


def _first_error(kind: str, args: list[str], tmp_path: Path) -> tuple[dict, str]:
    proc = subprocess.run([PYTHON, "-c", FIRST_ERROR, kind, json.dumps(args)], cwd=ROOT, text=True,
                          capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT),
                                                    "TOOLKIT_RUNS": str(tmp_path / "runs")})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def _sentences(tmp_path: Path) -> Path:
    data = tmp_path / "subjectivity.csv"
    data.write_text("sentence,kind\na moving film,subjective\nthe film runs 90 minutes,objective\n")
    return data


@pytest.mark.parametrize("kind", ["cli", "api"])
@pytest.mark.parametrize("mistake", ["typo", "missing file", "missing column", "missing field", "label as text"])
def test_errors_before_imports(tmp_path: Path, kind: str, mistake: str) -> None:
    """`toolkit run` and `toolkit.run`: a typo'd key, a missing file, a column or field the recipe
    names that the file lacks, and a column read twice are each one line, with no torch /
    transformers / datasets imported (columns the recipe leaves out are found in the file at load)."""
    data = _sentences(tmp_path)
    dialogues = tmp_path / "dialogues.jsonl"
    dialogues.write_text('{"transcript": "A: hi\\nB: hello", "notes": "they greet"}\n')
    own = ["demo/own-data/minilm-lora", f"task.train_file={data}", f"task.eval_file={data}"]
    args, expected = {
        "typo": (["demo/sst2/minilm-lora", "train.lrr=1e-4"], r"train.lrr: unknown key \(did you mean 'lr'\?\)"),
        "missing file": (own[:1] + [f"task.train_file={tmp_path / 'nope.csv'}", f"task.eval_file={data}"],
                         r"task.train_file: .*nope.csv(:)? (does not exist|no such file)"),
        "missing column": (own + ["task.label_column=label"], r"subjectivity.csv: column 'label' is missing \(it has: 'sentence', 'kind'\); "
                                r"set task.label_column"),
        "missing field": (["summarization/samsum/bart-base-lora", f"task.train_file={dialogues}",
                           f"task.eval_file={dialogues}", "task.source_field=dialogue"],
                          r"dialogues.jsonl: field 'dialogue' is missing \(it has: 'transcript', 'notes'\); "
                          r"set task.source_field"),
        "label as text": (own + ["task.label_column=kind", "task.text_columns=[kind]"],
                          r"task.label_column: 'kind' is also in task.text_columns"),
    }[mistake]
    result, stderr = _first_error(kind, (["run"] if kind == "cli" else []) + args, tmp_path)
    line = result["line"] if kind == "api" else stderr.strip()
    assert result["code"] == 2 and result["heavy"] == []
    assert re.search(expected, line), line
    assert "\n" not in line and "Traceback" not in line


def test_validate_takes_overrides_and_reads_the_heads(tmp_path: Path) -> None:
    data = _sentences(tmp_path)
    proc = subprocess.run([PYTHON, "-m", "toolkit.cli", "validate", "demo/own-data/minilm-lora",
                           f"task.train_file={data}", f"task.eval_file={data}", "task.label_column=kind"],
                          cwd=ROOT, text=True, capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert (proc.returncode, proc.stdout.strip()) == (0, "1 of 1 recipes valid"), proc.stderr
    proc = subprocess.run([PYTHON, "-m", "toolkit.cli", "validate", "demo/own-data/minilm-lora",
                           f"task.train_file={data}", f"task.eval_file={data}", "task.text_columns=[text]",
                           "task.label_column=kind"],
                          cwd=ROOT, text=True, capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2
    assert "column 'text' is missing (it has: 'sentence', 'kind'); set task.text_columns" in proc.stderr
