"""After training: load a finished run in any method's saved format, score it on any split,
predict on new text, and export it as a plain transformers folder.

The saved format is read from the files in `model/` (a PEFT adapter, bottleneck adapters, or a
whole model), so one loader serves every method without asking which one trained it.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path
from typing import Any

import torch

from toolkit import evaluation, models, runs
from toolkit.models import BOTTLENECK_CONFIG
from toolkit.errors import UserError
from toolkit.recipe import Recipe, apply_overrides, find_recipe, parse, read_yaml
from toolkit.tasks import TASKS
from toolkit.tasks.text_classification import read_text
from toolkit.train import Setup, eval_loaders



def run_recipe(run: Path, task_overrides: list[str] | None = None, task_from: str | None = None) -> Recipe:
    """The recipe a run was made from (its recipe.yaml), with the task replaced or overridden."""
    file = run / "recipe.yaml"
    if not file.is_file():
        raise UserError(f"{run}: no recipe.yaml here; point at a run folder (runs/<recipe>/<hash>)")
    import yaml

    raw = yaml.safe_load(file.read_text())
    if task_from:
        raw["task"] = read_yaml(find_recipe(task_from))["task"]
    bad = [o for o in task_overrides or [] if not o.startswith("task.")]
    if bad:
        raise UserError(f"override '{bad[0]}': only task.* settings can change when scoring a run")
    return parse(apply_overrides(raw, task_overrides or []))


def load_model(run: Path, recipe: Recipe) -> tuple[torch.nn.Module | None, Any]:
    """(model, tokenizer) of a finished run, in eval mode; the model is None for in-context runs."""
    if not runs.is_finished(run):
        raise UserError(f"{run}: the run is not finished (no metrics.json); run it to the end first")
    folder = run / "model"
    base = models.smoke_checkpoint(recipe.model.checkpoint) if recipe.smoke else recipe.model.checkpoint
    head = recipe.method.head(recipe.task, models.family_of(base))
    if not recipe.method.trains:
        model, tok = models.load(base, head, recipe.task.head_kwargs())
        return model.eval(), tok
    if not folder.is_dir():
        raise UserError(f"{run}: no model/ folder; the run saved nothing to load")
    tok = models.load_tokenizer(str(folder))
    saved = json.loads((run / "metrics.json").read_text())
    if saved.get("label_names") and getattr(recipe.task, "label_names", "n/a") is None:  # read from files
        recipe.task.adopt_labels(list(saved["label_names"]))
    if saved.get("text_columns") and getattr(recipe.task, "text_columns", "n/a") is None:
        recipe.task.text_columns = list(saved["text_columns"])
    model = recipe.method.load(folder, lambda: models.load(base, head, recipe.task.head_kwargs())[0],
                               lambda: models.load(str(folder), head, {})[0])
    return model.eval(), tok


def split_of(data: dict[str, Any], name: str) -> dict[str, Any]:
    """{suffix: raw dataset} of the split called `name` (eval, train or a labelled test) among
    what the task loaded."""
    if name == "eval":
        return data["eval"]
    if name == "train" and data.get("train") is not None:
        return {"": data["train"]}
    if name == "test" and data.get("test") is not None:
        if "label" not in data["test"].column_names:
            raise UserError("--split test: this test split has no labels to score; use "
                            "`toolkit predict` (or --glue-test for GLUE)")
        return {"": data["test"]}
    have = ["eval"] + [k for k in ("train", "test") if data.get(k) is not None]
    raise UserError(f"--split: '{name}' is not a split of this task (it has: {', '.join(have)})")


def evaluate_run(run: Path, split: str, task_overrides: list[str], task_from: str | None) -> dict:
    """Score a finished run on a split with the task's metrics; writes eval-<split>.json."""
    from accelerate import Accelerator


    recipe = run_recipe(run, task_overrides, task_from)
    data = recipe.task.load()
    raw = split_of(data, split)
    model, tok = load_model(run, recipe)
    acc = Accelerator(cpu=not torch.cuda.is_available())
    encode = recipe.method.encoder(recipe.task, tok)  # in-context: the raw rows as they are
    setup = Setup(recipe.task, model, tok, data.get("train"), {k: encode(ds) for k, ds in raw.items()},
                  raw, 0, 0, recipe.train.seed)
    prepared = acc.prepare_model(model, evaluation_mode=True)
    if not recipe.method.trains:  # in-context: the method scores, as in the run itself
        metrics = recipe.method.evaluate(prepared, setup, acc)
    else:
        loaders, orders = eval_loaders(recipe, setup)
        loaders = {k: acc.prepare(v) for k, v in loaders.items()}
        metrics = evaluation.evaluate(prepared, loaders, recipe.task, acc, raw, orders=orders)
    result = {"split": split, "eval": metrics, "examples": {k: len(v) for k, v in raw.items()},
              "task": recipe.to_dict()["task"]}
    if acc.is_main_process:
        runs.write_json(run / f"eval-{split}.json", result)
    return result


def read_inputs(source: str, columns: list[str]) -> list[dict]:
    """Rows to predict on: JSONL or CSV with the task's text columns, or plain text (one example
    per line) for a single-text task; `-` reads standard input."""
    if source == "-":
        text, name = sys.stdin.read(), "<stdin>"
    else:
        path = Path(source)
        if not path.is_file():
            raise UserError(f"--input: {path} does not exist")
        text, name = read_text(path), str(path)
    lines = [l for l in text.splitlines() if l.strip()]
    if not lines:
        raise UserError(f"--input: {name} holds no examples")
    if lines[0].lstrip().startswith("{"):
        rows = []
        for i, line in enumerate(lines, start=1):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise UserError(f"{name}:{i}: not valid JSON ({exc.msg})") from None
    elif source.endswith((".csv", ".tsv")):
        rows = list(csv.DictReader(io.StringIO(text), delimiter="\t" if source.endswith(".tsv") else ","))
    elif len(columns) == 1:
        rows = [{columns[0]: line} for line in lines]
    else:
        raise UserError(f"--input: this task reads {len(columns)} text columns ({', '.join(columns)}); "
                        "give JSONL or CSV with those fields")
    for i, row in enumerate(rows, start=1):
        missing = [c for c in columns if not isinstance(row, dict) or row.get(c) is None]
        if missing:
            raise UserError(f"{name}: example {i} lacks field '{missing[0]}' (the task reads: "
                            f"{', '.join(columns)})")
    return rows


def _predicting_run(run: Path) -> tuple[Recipe, torch.nn.Module, Any, list[str]]:
    """(recipe, model, tokenizer, input field names) of a trained run whose task predicts."""
    recipe = run_recipe(run)
    if not recipe.task.predicts or not recipe.method.trains:
        kinds = ", ".join(n for n in TASKS.names() if TASKS.get(n).predicts)
        raise UserError(f"{run}: predict handles trained runs of the tasks {kinds} (this is "
                        f"{recipe.task.name} with {recipe.method.name})")
    model, tok = load_model(run, recipe)
    return recipe, model, tok, recipe.task.predict_fields(model)


def predict_rows(run: Path, texts: list[Any]) -> list[dict]:
    """The Python API's predict: texts, (text, text) pairs or dicts of the task's fields in;
    per input its fields, `label`, `score` (the label's probability) and `probabilities` out."""
    recipe, model, tok, names = _predicting_run(run)
    inputs = []
    for i, item in enumerate(texts):
        if isinstance(item, dict):
            missing = [n for n in names if n not in item]
            if missing:
                raise UserError(f"predict: input {i} has no '{missing[0]}' (this task reads {', '.join(names)})")
            inputs.append(item)
            continue
        parts = [item] if isinstance(item, str) else list(item)
        if len(parts) != len(names) or not all(isinstance(p, str) for p in parts):
            raise UserError(f"predict: input {i} should be {len(names)} text(s) ({', '.join(names)}), got {item!r}")
        inputs.append(dict(zip(names, parts)))
    out = recipe.task.predict(model, tok, inputs)
    for row in out:
        if "probabilities" in row:
            row["score"] = row["probabilities"][row["label"]]
    return out


def predict_run(run: Path, source: str, output: str | None) -> int:
    """Predictions as JSONL (to a file or stdout); returns how many were written."""
    recipe, model, tok, names = _predicting_run(run)
    out = recipe.task.predict(model, tok, read_inputs(source, names))
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in out)
    if output:
        Path(output).write_text(text)
    else:
        sys.stdout.write(text)
    return len(out)


def glue_test(run: Path, out_dir: Path) -> list[Path]:
    """GLUE server submission files (`SST-2.tsv`, ...: `index<TAB>prediction`) from test.tsv."""
    recipe = run_recipe(run)
    return recipe.task.submission(lambda: load_model(run, recipe), out_dir)


def export_run(run: Path, out: Path, merge: bool, push_to_hub: str | None) -> str:
    """A plain transformers folder where the method allows it; says what was written."""
    if push_to_hub and models._offline():
        raise UserError(f"--push-to-hub {push_to_hub}: the Hub is off-line (HF_HUB_OFFLINE=1); "
                        "export to a folder and push it where the Hub is reachable")
    recipe = run_recipe(run)
    if not recipe.method.trains:
        raise UserError(f"{run}: an in-context run trains nothing; export its base checkpoint instead")
    if out.exists() and any(out.iterdir()):
        raise UserError(f"{out}: exists and is not empty; choose a new folder")
    folder = run / "model"
    if (folder / BOTTLENECK_CONFIG).is_file():
        if merge:
            raise UserError("--merge: bottleneck adapters add a non-linear layer, which no weight of "
                            "the base can absorb; export without --merge keeps the adapter folder")
        import shutil

        shutil.copytree(folder, out, dirs_exist_ok=True)
        return (f"the adapters folder (load it with toolkit.methods.adapters.load_adapters on "
                f"{recipe.model.checkpoint})")
    model, tok = load_model(run, recipe)
    note = "a plain transformers model folder"
    peft_config = getattr(model, "peft_config", None)
    if peft_config is not None and merge:
        if next(iter(peft_config.values())).is_prompt_learning:
            raise UserError(f"--merge: {recipe.method.name} adds virtual tokens, not weight deltas; "
                            "it stays a PEFT folder (export without --merge)")
        model = model.merge_and_unload()
        note += " (adapter merged into the base)"
    elif peft_config is not None:
        note = (f"the {recipe.method.name} folder (load it on its base "
                f"{recipe.model.checkpoint}; --merge makes a plain model where possible)")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    models.make_portable(out, recipe.model.checkpoint if not recipe.smoke else str(folder))
    if push_to_hub:
        model.push_to_hub(push_to_hub)
        tok.push_to_hub(push_to_hub)
    return note
