"""After training: load a finished run in any method's saved format, score it on any split,
predict on new text, and export it as a plain transformers folder.

The saved format is read from the files in `model/` (a PEFT adapter, bottleneck adapters, or a
whole model), so one loader serves every method without asking which one trained it.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import set_seed

from toolkit import attention, chain, checkpoints, evaluation, heads, hub, methods, models, precision, readers, runs, sharding
from toolkit.models import BOTTLENECK_CONFIG
from toolkit.errors import UserError, writing
from toolkit.recipe import Recipe, apply_overrides, find_recipe, made_with, parse, read_yaml, safe_yaml
from toolkit.recipe_data import override_leaves
from toolkit.tasks import TASKS, _fields, input_texts
from toolkit.setup import check_positions
from toolkit.train import Setup, eval_loaders



def run_recipe(run: Path, task_overrides: list[str] | None = None, task_from: str | None = None) -> Recipe:
    """The recipe a run was made from (its recipe.yaml), with the task replaced or overridden."""
    file = run / "recipe.yaml"
    if not file.is_file():
        raise UserError(f"{run}: no recipe.yaml here; point at a run folder (runs/<recipe>/<hash>)")
    try:
        raw = safe_yaml(file.read_text(encoding="utf-8"), str(file))
    except (UnicodeDecodeError, UserError) as exc:
        raise UserError(f"{file}: the run's recipe is damaged ({str(exc).split(': ')[-1] if isinstance(exc, UserError) else 'not UTF-8'}); "
                        "restore it or run the recipe again") from None
    if not isinstance(raw, dict):
        raise UserError(f"{file}: the run's recipe is damaged (not a mapping); restore it or run the recipe again")
    made_with(run, raw, runs_json(run / "metrics.json").get("recipe_hash") if runs.is_finished(run) else None,
              " (or change a setting on purpose: toolkit eval RUN task.KEY=VALUE)")
    model = raw.get("model")
    if isinstance(model, dict) and isinstance(model.get("checkpoint"), dict):  # the run it started from
        raw["model"] = {**model, "checkpoint": str(chained_base(run, str(raw.get("name"))))}
    ran = raw.get("task") if isinstance(raw.get("task"), dict) else {}  # the run's own, before --task-from
    if task_from:
        task = read_yaml(find_recipe(task_from)).get("task")
        if not isinstance(task, dict):  # a base file of settings alone: a KeyError traceback
            raise UserError(f"--task-from {task_from}: that recipe names no task (no task section, nor one in "
                            "its extends bases); give a recipe with a task")
        raw["task"] = task
    bad = [o for o in task_overrides or [] if o.partition("=")[0].strip().split(".")[0] != "task"]
    if bad:
        raise UserError(f"override '{bad[0]}': only task.* settings can change when scoring a run")
    recipe = parse(apply_overrides(raw, task_overrides or []))
    for key in recipe.task.saved_keys:  # held by the run's saved files (its tokenizer): as the run had them
        named = any(o.partition("=")[0].strip() == f"task.{key}" for o in task_overrides or [])
        if named and getattr(recipe.task, key) != ran.get(key):
            raise UserError(f"task.{key}: the run's saved tokenizer holds it as the run trained; it cannot change "
                            "when scoring a run (train a run with it instead)")
        setattr(recipe.task, key, ran.get(key))
    if not task_from:
        recipe.task.as_made(ran, {".".join(leaf) for leaf in override_leaves(task_overrides or [])})
    if task_overrides:
        recipe.task.rescoring(parse(raw).task, {".".join(leaf) for leaf in override_leaves(task_overrides)})
    return recipe


def load_model(run: Path, recipe: Recipe) -> tuple[torch.nn.Module | None, Any]:
    """(model, tokenizer) of a finished run, in eval mode; the model is None for in-context runs.
    It is built as the run built it: the same base (a chained run's upstream model/), the same
    model settings (attention module and its saved parameters, warm start), then the saved result."""
    check_finished(run)
    folder = run / "model"
    base = base_checkpoint(run, recipe)
    settings = recipe.model
    head = recipe.method.head(recipe.task, models.recipe_family(base, settings.warm_start))

    def build(checkpoint: str, head_kwargs: dict, warm_start: str | None) -> torch.nn.Module:
        set_seed(recipe.train.seed)  # weights the base lacks (a pooler) start as they did in the run
        return models.load(checkpoint, head, head_kwargs, settings.attention, warm_start=warm_start,
                           words=recipe.task.words_given, tokenizer=tok)[0]  # the run's, read once

    if not recipe.method.trains:  # seeded as the run was: an attention module's random start (additive)
        adopt_saved(run, recipe)  # the default prompt the run scored with
        set_seed(recipe.train.seed)
        model, tok = models.load(base, head, recipe.task.head_kwargs(), settings.attention,
                                 warm_start=settings.warm_start, words=recipe.task.words_given)
        return model.eval(), tok
    if not folder.is_dir():
        raise UserError(f"{run}: no model/ folder: the run's result, saved there when it finished, is gone; put "
                        "it back as the run wrote it, or run the recipe again with --force")
    check_saved(folder)
    tok = models.load_tokenizer(str(folder))
    adopt_saved(run, recipe)
    model = recipe.method.load(folder, lambda: build(base, recipe.task.head_kwargs(), settings.warm_start),
                               lambda: build(str(folder), {}, None))  # saved whole: warm-started already
    attention.load_saved(model, folder, settings.attention)  # what the method's format leaves out
    return model.eval(), tok


def check_finished(run: Path) -> None:
    """A run is read after training only once it finished (its metrics.json written), by every
    entry point alike: a bottleneck adapters run's export copied model/ without asking, so an
    interrupted one was "metrics.json: damaged (FileNotFoundError ...)" where a LoRA run's was this line."""
    if not runs.is_finished(run):
        raise UserError(f"{run}: the run is not finished (no metrics.json); run it to the end first")


def base_checkpoint(run: Path, recipe: Recipe) -> str:
    """The checkpoint a finished run started from: a chained run's upstream model/ (run_recipe
    put it in place of the reference), a smoke run's small model, else the checkpoint as written;
    checked against the files the run recorded of it (every load of the result goes through here)."""
    saved = runs_json(run / "metrics.json")
    chained = isinstance(saved.get("base_run"), str)  # run_recipe put the upstream's model/ in place
    if chained:
        base = recipe.model.checkpoint  # already small under --smoke: the upstream smoke run's
    else:
        base = models.smoke_checkpoint(recipe.model.checkpoint) if recipe.smoke else recipe.model.checkpoint
    changed = runs.base_changed(saved.get("base_files"), base)
    if changed is not None and recipe.smoke and not chained:  # the small model built again (chain.rebuilt_base)
        built = (saved.get("versions") or {}).get("transformers")
        raise UserError(f"{run}: a --smoke run, whose result is loaded onto the small random model it trained "
                        f"on; this toolkit and transformers {transformers_version()} build that model otherwise "
                        f"({changed.name} differs{f'; the run was made under transformers {built}' if built else ''}), "
                        "and the result would be scored on another model: run the recipe again with --smoke --force")
    if changed is not None:
        raise UserError(f"{run}: model.checkpoint {changed} changed since the run finished, and the run's "
                        "result is loaded onto that base (model/ holds only what trained; an in-context "
                        "run is the base itself): put the base back as it was, or run the recipe again "
                        "with --force on the new one")
    return base


def chained_base(run: Path, name: str) -> Path:
    """The model/ of the run a chained run (model.checkpoint: {run: ...}) started from, in the runs
    root this run lives in, as its metrics.json records it: found without the recipes it names."""
    check_finished(run)
    upstream = runs_json(run / "metrics.json").get("base_run")
    if not isinstance(upstream, str):
        raise UserError(f"{run}: a chained run (model.checkpoint: {{run: ...}}) whose metrics.json does not "
                        "name the run it started from; run it again with --force")
    folder = run.resolve().parents[len(Path(name).parts)] / upstream / "model"
    if not (folder / "config.json").is_file() and runs.is_finished(folder.parent):  # there, but model/ went
        raise UserError(f"{run}: it started from the run {upstream}, which is finished, but {chain.model_gone(folder)}; "
                        "put it back as that run wrote it (this run's result is loaded onto it)")
    if not (folder / "config.json").is_file():
        raise UserError(f"{run}: it started from the run {upstream}, whose model is not at {folder}; "
                        "keep a chained run in the runs folder of the run it started from")
    return folder


def adopt_saved(run: Path, recipe: Recipe) -> None:
    """Label names and text columns that training read from the files (the recipe says null):
    the model's, so data read now is mapped onto the classes the model has."""
    saved = runs_json(run / "metrics.json")
    if saved.get("label_names") and getattr(recipe.task, "label_names", "n/a") is None:  # read from files
        recipe.task.adopt_labels(list(saved["label_names"]))
    if saved.get("text_columns") and getattr(recipe.task, "text_columns", "n/a") is None:
        recipe.task.text_columns = list(saved["text_columns"])
    if hasattr(recipe.task, "adopt_prompt"):  # the default prompt the run trained with (none recorded: older)
        recipe.task.adopt_prompt(saved.get("prompt"))
    names = getattr(recipe.task, "label_names", "n/a")
    if "label_names" in saved and names != "n/a" and (names and list(names)) != saved["label_names"]:
        raise UserError(f"{run}: the model's labels are {', '.join(saved['label_names'] or ['(a regression)'])}; "
                        f"this task's are {', '.join(names or ['(a regression)'])}: a run is scored on the "
                        "labels it was trained on")


def transformers_version() -> str:
    import transformers

    return transformers.__version__


def runs_json(path: Path) -> Any:
    """A JSON file of a run folder; a damaged one is one line naming it."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError) as exc:
        raise UserError(f"{path}: damaged ({type(exc).__name__}: {str(exc).splitlines()[0][:120]}); "
                        "restore the run folder or run the recipe again") from None


def check_saved(folder: Path) -> None:
    """The saved model's files whole before any is loaded: each JSON parses, each safetensors
    file's header matches its length (safetensors' own reader checks both offsets and size)."""
    from safetensors import safe_open

    for path in sorted(folder.glob("*.json")):
        runs_json(path)
    for path in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(path), framework="pt") as handle:
                handle.keys()
        except Exception as exc:  # SafetensorError and OSError: a truncated or overwritten file
            raise UserError(f"{path}: damaged ({str(exc).splitlines()[0][:120]}); the file was cut "
                            "short or overwritten: restore the run folder or run the recipe again") from None
    changed = runs.result_changed(folder.parent)  # a file gone (a traceback), replaced or added since
    if changed is not None:
        raise UserError(f"{changed}: the run's model is not as the run saved it (metrics.json model_files), and "
                        "would be scored as its result; restore the run folder or run the recipe again with --force")


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


def check_hub_data(run: Path, recipe: Any, task_from: str | None) -> None:
    """`toolkit eval RUN` scores on the Hub data set the run was made with (metrics.json hub_data),
    or it is one line: the datasets cache moved to another revision scored other examples as the
    run's, exit 0 (data_sha256 covers local files only). A task named on purpose (--task-from, or
    another task.dataset) is not checked."""
    if task_from or not runs.is_finished(run):
        return
    changed = runs.hub_data_changed(runs_json(run / "metrics.json").get("hub_data"), recipe.task.hub_data())
    if changed is not None:
        raise UserError(f"task: the Hub data set '{changed}' is not the revision this run was made with "
                        "(metrics.json hub_data: its examples differ, the cache holds another revision "
                        "now; one with the same examples is scored); load that revision again, or name the data to score on, on purpose: "
                        "task.eval_file=/full/path")


def run_accelerator(run: Path, recipe: Recipe) -> Any:
    """The Accelerator a finished run's model computes under after training: the run's own
    train.mixed_precision, so that its autocast wraps the forward as it wrapped the run's own
    evaluation (made without it, `toolkit eval` of a bf16 run scored in fp32: other predictions,
    another chrF than metrics.json's, exit 0). A precision this machine cannot compute (fp16
    without a CUDA GPU) is one line, as `toolkit run` says it. The state of an earlier Accelerator
    in this process (the API after a run) is dropped: it kept its own precision otherwise."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    precision.check_device(recipe.train.mixed_precision, run)
    AcceleratorState._reset_state()
    acc = Accelerator(mixed_precision=recipe.train.mixed_precision, cpu=not torch.cuda.is_available())
    sharding.end_group_at_exit()
    return acc


def as_run_computed(model: torch.nn.Module, recipe: Recipe, acc: Any) -> torch.nn.Module:
    """`model` (load_model's) computing as the run computed when it scored it: its weights in the
    dtype they had (precision_mode bf16_master: bf16; in-context runs train no weights and keep
    the base's), on accelerate's device, its forward under `acc`'s autocast (outputs as fp32).
    Every entry point that computes with a run's model comes here (eval, predict, the API's,
    --glue-test); export does not: it writes the weights as they are."""
    if recipe.method.trains:
        precision.as_trained(model, recipe.train.precision_mode)
    return acc.prepare_model(model, evaluation_mode=True)


def computed_under(recipe: Recipe, acc: Any) -> dict[str, str]:
    """What a score made after training was computed under, as metrics.json records the run's."""
    return {"device": str(acc.device), "mixed_precision": recipe.train.mixed_precision,
            "precision_mode": recipe.train.precision_mode}


def evaluate_run(run: Path, split: str, task_overrides: list[str], task_from: str | None) -> dict:
    """Score a finished run on a split with the task's metrics, computed as the run computed
    (`as_run_computed`); writes eval-<split>.json, with what it was computed under."""
    recipe = run_recipe(run, task_overrides, task_from)
    acc = run_accelerator(run, recipe)
    if runs.is_finished(run):  # the model's classes, before the data is read and mapped to ids
        adopt_saved(run, recipe)
    recipe.task.scoring(split)  # what load checks of the references: the scored split's alone
    data = recipe.task.load()
    check_hub_data(run, recipe, task_from)
    if split == "eval":  # task.eval_file=<the run's train file>: scores of training examples, said as a run says it
        recipe.task.note_eval_in_train(data)
    raw = {suffix: recipe.task.as_scored(ds) for suffix, ds in split_of(data, split).items()}
    model, tok = load_model(run, recipe)
    recipe.task.note_unreadable_splits(tok, {split: raw})  # said with the notices, as a run says it
    if recipe.method.trains:  # in-context runs cut their prompts at method.max_length (checked there)
        check_positions(recipe, model, tok, recipe.task.max_length)  # an override past the positions
    problem = recipe.task.model_problem(model) if model is not None else None  # an override the model leaves unread
    if problem:
        raise UserError(problem)
    encode = recipe.method.encoder(recipe.task, tok)  # in-context: the raw rows as they are
    setup = Setup(recipe.task, model, tok, data.get("train"), {k: encode(ds) for k, ds in raw.items()},
                  raw, 0, 0, recipe.train.seed, scores_train=split == "train")
    recipe.task.say_notices(run=False)  # what encoding found, before the scoring that may take long
    prepared = as_run_computed(model, recipe, acc)
    if not recipe.method.trains:  # in-context: the method scores, as in the run itself
        metrics = recipe.method.evaluate(prepared, setup, acc)
    else:
        loaders, orders = eval_loaders(recipe, setup)
        metrics = evaluation.evaluate(prepared, loaders, recipe.task, acc, raw, sink=setup.predictions,
                                      orders=orders)
    recipe.task.say_notices(run=False)  # what scoring found (in-context prompts cut), as run and predict say it
    result = {"split": split, "eval": metrics, "examples": {k: len(v) for k, v in raw.items()},
              "task": recipe.to_dict()["task"], **computed_under(recipe, acc)}
    if recipe.task.metric_info():  # as metrics.json records it: sacreBLEU's signature, the decoding used
        result["metric_info"] = recipe.task.metric_info()
    if acc.is_main_process:  # what was scored, beside its scores: QA and generation tasks
        # all or none (runs.write_all_whole): a full disk at eval-<split>.json left this eval's
        # predictions beside the scores of the eval before (another eval_file, another model)
        texts, written = {}, []
        for suffix, rows in setup.predictions.items():
            path, files = run / f"predictions-{split}{suffix}.jsonl", recipe.task.prediction_files(rows, raw[suffix])
            texts.update(runs.prediction_texts(path, rows, files))
            written.append((path, files))
        texts[run / f"eval-{split}.json"] = runs.json_text(result)
        runs.write_all_whole(texts)
        for path, files in written:
            runs.retire_prediction_files(path, files, recipe.task.retired_prediction_files)
    say_smoke(run, recipe, "these scores")
    return result


def read_inputs(source: str, columns: list[str], lists: tuple[str, ...] = (), task: Any = None) -> list[dict]:
    """Rows to predict on, each holding the task's input fields under their names in `columns`
    (`_read_inputs`: the input's own names for them found by `task.input_fields`)."""
    rows, given = _read_inputs(source, columns, lists, task)
    return as_named(rows, given, columns)


def note_unreadable_inputs(task: Any, tok: Any, rows: list[dict], fields: list[str], where: str) -> None:
    """Inputs mostly of characters the tokenizer reads as its unknown token, said with predict's
    notices as a run says them of its splits (`Task.note_unreadable`)."""
    task.note_unreadable(tok, input_texts([r.get(f) for r in rows] for f in fields), where)


def as_named(rows: list[dict], given: list[str], names: list[str]) -> list[dict]:
    """Rows with the fields named `given` also under `names`, the task's names for them."""
    if given == names:
        return rows
    return [{**r, **{n: r[g] for n, g in zip(names, given)}} for r in rows]


def field_kinds(rows: list[Any]) -> dict[str, str]:
    """Field name -> "text", "list" or "other" over input rows (the union of their keys, in
    first-seen order), as `Task.input_fields` reads an input's fields."""
    out: dict[str, str] = {}
    for row in rows:
        for key, value in (row.items() if isinstance(row, dict) else ()):
            kind = "text" if isinstance(value, str) else "list" if isinstance(value, list) else "other"
            out[key] = kind if out.get(key, kind) == kind else "other"
    return out


def _given_fields(task: Any, columns: list[str], lists: tuple[str, ...], kinds: dict[str, str],
                  where: str) -> tuple[list[str], tuple[str, ...]]:
    """(the input's fields for `columns`, those of them that may hold lists of words)."""
    given = task.input_fields(columns, kinds, where) if task is not None else columns
    return given, tuple(g for n, g in zip(columns, given) if n in lists)


def _read_inputs(source: str, columns: list[str], lists: tuple[str, ...] = (),
                 task: Any = None) -> tuple[list[dict], list[str]]:
    """(rows to predict on, the input's names for the task's fields `columns`): JSONL or CSV with
    the task's input fields, a plain file in the task's
    own training-file format (`task.rows_of_own_format`: NER's CoNLL), or plain text (one example
    per line) for a single-field task; `-` reads standard input. A field in `lists` (NER's words)
    may hold a list of words instead of text. A pipe (`<(...)`, /dev/fd/N, a named FIFO) or a
    device is read like a file, once, in full (readers.spooled); one with no extension is told
    JSONL or plain text by its look, as standard input is."""
    stream = source != "-" and readers.stream_kind(Path(source))
    check_input_there(source)
    if source != "-":
        path = Path(source)
        if path.name.lower().removesuffix(".gz").endswith((".csv", ".tsv", ".json", ".jsonl")):
            if stream:
                with readers.spooled(path) as copy:
                    return _read_file(copy, columns, lists, task, source)
            return _read_file(path, columns, lists, task)
    with readers.source_file(source) as (path, name):
        lines, name, blank = readers.lines_of(path, name)  # the checks files get, stdin too; split at \n only
        unnamed = source == "-" or not Path(source).suffix  # a .txt name says plain text, as .csv says CSV
        fmt = _table_header(lines[0], columns) if lines and unnamed else None
        if fmt is not None:  # a CSV's header was predicted as a text, its values as one text a row, exit 0
            print(f"note: {name}: read as {fmt.upper()}: its first line is a header naming "
                  f"the task's field{'s' * (len(columns) > 1)} ({', '.join(columns)})", file=sys.stderr)
            with readers.as_format(path, fmt, name) as table:
                return _read_file(table, columns, lists, task, name)
    if not lines:
        raise UserError(f"--input: {name} holds no examples")
    own = task.rows_of_own_format(lines, blank, name) if task is not None else None
    if own is not None:  # the task's own training-file format (NER: CoNLL)
        return own, columns
    say_skipped(name, blank)
    by_look = source == "-" or stream and not Path(source).suffix  # no extension to decide
    document = _json_document(lines) if by_look else None  # one JSON object or list over the lines
    if document is not None:
        rows = task.predict_records(document) if task is not None else document
    elif by_look and lines[0].lstrip().startswith("{"):  # JSONL by its look
        rows = []
        for i, line in enumerate(lines, start=1):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise UserError(f"{name}:{i}: {readers.not_json_line(line, exc)}") from None
            if not isinstance(rows[-1], dict):  # as a file's reader says it (readers._jsonl_problem)
                raise UserError(f"{name}:{i}: expected a JSON object per line, got {readers.json_type(rows[-1])}")
        rows = task.predict_records(rows) if task is not None else rows
    elif len(columns) == 1:
        rows = [{columns[0]: line} for line in lines]
        task = None  # rows of the task's own names
    else:
        raise UserError(f"--input: this task reads {len(columns)} fields ({', '.join(columns)}); "
                        "give JSONL or CSV with those fields")
    columns, lists = _given_fields(task, columns, lists, field_kinds(rows), name)
    for i, row in enumerate(rows, start=1):
        missing = [c for c in columns if not isinstance(row, dict) or c not in row]  # null: _check_fields
        if missing:
            raise UserError(f"{name}: example {i} lacks field '{missing[0]}' (the task reads: "
                            f"{', '.join(columns)})" + readers.near_name(missing[0], row if isinstance(row, dict) else {}))
        _check_fields(row, columns, lists, f"{name}: example {i}")
    return rows, columns


def _table_header(line: str, columns: list[str]) -> str | None:
    """"csv" or "tsv" where a plain input's first line is a CSV/TSV header naming the task's
    fields (`sentence`; `sentence1,sentence2`; `id<TAB>sentence`), else None. Standard input, a
    pipe or a file without an extension was read as plain text: the header predicted as a text and
    each row's cells as one text (`ok,1`), or refused for a two-field task as not CSV."""
    import csv

    fmt = "tsv" if "\t" in line else "csv"
    cells = [c.strip() for c in next(csv.reader([line], delimiter="\t" if fmt == "tsv" else ","), [])]
    return fmt if cells and set(columns) <= set(cells) and len(set(cells)) == len(cells) else None


def say_skipped(name: str, blank: list[int]) -> None:
    """Output row N is not input line N where blank lines between examples are skipped: each row
    carries its text, and this says so. A one-column CSV/TSV file's lines of spaces alone, which
    pandas skips, were dropped unsaid (3 lines in, 2 rows out, exit 0), where a plain-text file's
    were said."""
    if blank:
        print(f"warning: {name}: {len(blank)} blank line{'s' * (len(blank) > 1)} between examples "
              f"(line {', '.join(map(str, blank[:3]))}{', ...' if len(blank) > 3 else ''}) skipped; the "
              "output has one row per non-blank line, each with its text", file=sys.stderr)


def check_input_there(source: str) -> None:
    """--input names a file (or a pipe, or `-`): checked before the model loads, by predict_run
    too (a missing file was said once the model had loaded, minutes for a large one)."""
    path = Path(source)
    if source != "-" and not path.is_file() and not readers.stream_kind(path):
        raise UserError(f"--input: {path} " + ("is a folder; give a file" if path.is_dir() else "does not exist"))


def _json_document(lines: list[str]) -> list[Any] | None:
    """The records of a JSON document written over several lines (a SQuAD document or a JSON list
    of records piped in, as files of those layouts are read): [the object], or the list of
    objects; None otherwise (JSON lines, read line by line; plain text)."""
    if len(lines) < 2 and not lines[0].lstrip().startswith("["):
        return None
    if not lines[0].lstrip().startswith(("{", "[")):
        return None
    try:
        value = json.loads("\n".join(lines))
    except json.JSONDecodeError:
        return None
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return value
    return [value] if isinstance(value, dict) and len(lines) > 1 else None


def _read_file(path: Path, columns: list[str], lists: tuple[str, ...], task: Any = None,
               shown: str | None = None) -> tuple[list[dict], list[str]]:
    """A structured input file: in the task's own nested layout as its training reader reads it
    (`Task.predict_file`: SQuAD's articles, under the task's names), else flat records through
    the shared reader."""
    own = task.predict_file(path) if task is not None else None
    return (own, columns) if own is not None else _read_structured(path, columns, lists, task, shown)


def _check_fields(row: dict, columns: list[str], lists: tuple[str, ...], where: str) -> None:
    """Each field the task reads is text that is not blank (or, where the task reads words, a
    list of words), as training's readers require: 5 or None would be predicted as "5", "None"."""
    for c in columns:
        value = row[c]
        if c in lists and isinstance(value, list) and value:  # words: each one text that shows
            bad = next((j for j, w in enumerate(value) if not isinstance(w, str) or readers.blank(w)), None)
            if bad is not None:
                word = value[bad]
                shown = "blank" if isinstance(word, str) else "null" if word is None else readers.json_type(word)
                raise UserError(f"{where}: '{c}' word {bad + 1} ({word!r:.40}) is {shown}; every word needs "
                                "to be text with a visible character")
            continue
        if not (isinstance(value, str) and not readers.blank(value)):
            shown = ("blank text" if isinstance(value, str) else "null" if value is None
                     else f"{readers.json_type(value)} ({json.dumps(value, default=str)[:40]})")
            raise UserError(f"{where}: field '{c}' is {shown}; expected text"
                            + (" or a list of words" if c in lists else ""))
    for c in columns:  # JSON parsed here (standard input, a pipe) and the API: a file's is `scan`'s
        for text in row[c] if isinstance(row[c], list) else [row[c]]:
            half = readers.SURROGATE.search(text)
            if half:
                raise UserError(f"{where}: field '{c}' holds {ascii(half.group())[1:-1]}, one half of a UTF-16 surrogate "
                                "pair without the other (a text cut inside an emoji or another character past "
                                "U+FFFF), which is no character: remove it, or write the character whole")


def _read_structured(path: Path, columns: list[str], lists: tuple[str, ...], task: Any = None,
                     shown: str | None = None) -> tuple[list[dict], list[str]]:
    """A CSV/TSV/JSON(L) input file through the shared reader (FILE:LINE for every bad record), in
    the JSON layouts the task's training reader takes (`Task.json_field`: `{"data": [...]}`)."""
    fmt = readers.file_format(path)
    field = readers.document_field(path, fmt, getattr(task, "json_field", None))
    keys = (lambda i: [field, i]) if field else None
    read = readers.read(path, fmt, field=field)
    ds = readers.lift_nested(read)  # {"translation": {"en": ...}} as a run reads it
    kinds = {name: "text" if getattr(f, "dtype", None) in ("string", "large_string") else
             "list" if type(f).__name__ in ("List", "LargeList", "Sequence") else "other"
             for name, f in ds.features.items()}
    columns, lists = _given_fields(task, columns, lists, kinds, str(path))
    missing = [c for c in columns if c not in ds.column_names]
    if missing:
        raise UserError(f"{path}: field '{missing[0]}' is missing (it has: {', '.join(ds.column_names)}); "
                        f"this task reads {', '.join(columns)}" + readers.near_name(missing[0], ds.column_names))
    for column in columns:
        if column not in lists:
            readers.check_text(ds, column, path, fmt, what=f"field '{column}'", keys=keys,
                               note=getattr(task, "note", None))
    if fmt in ("csv", "tsv") and len(read.column_names) == 1:  # a one-field file reads as plain text: one input a line
        say_skipped(shown or str(path), readers.skipped_lines(path, fmt))  # named as given (a pipe's copy)
    rows = ds.to_list()
    if ds is not read:  # the record as written (its objects whole), carried beside the prediction, and the fields read
        rows = [{**given, **{c: row[c] for c in columns}} for given, row in zip(read.to_list(), rows)]
    words = [c for c in columns if c in lists]
    for i, row in enumerate(rows if words else []):  # a field of words: each row checked as standard
        try:  # input's and the API's are (a null or blank word, a null row, a text beside lists)
            _check_fields(row, words, lists, "")
        except UserError as exc:
            raise UserError(f"{readers.where(path, fmt, i)}{exc}") from None
    return rows, columns


def _predicting_run(run: Path) -> tuple[Recipe, torch.nn.Module, Any, list[str]]:
    """(recipe, model, tokenizer, input field names) of a trained run whose task predicts."""
    recipe = run_recipe(run)
    if not recipe.method.trains:  # the tasks' list read "glue, ... (this is glue with icl)": no reason given
        raise UserError(f"{run}: predict labels new inputs with a trained model, and method {recipe.method.name} "
                        f"trains nothing (it scores {recipe.task.name}'s labelled splits as it runs); score other "
                        f"labelled data with toolkit eval {run} task.KEY=VALUE (a data setting of the task), or "
                        "train a method to predict with")
    if not recipe.task.predicts:
        kinds = ", ".join(n for n in TASKS.names() if TASKS.get(n).predicts)
        raise UserError(f"{run}: predict handles trained runs of the tasks {kinds} (this is "
                        f"{recipe.task.name} with {recipe.method.name})")
    model, tok = computing_model(run, recipe)
    return recipe, model, tok, recipe.task.predict_fields(model)


def computing_model(run: Path, recipe: Recipe) -> tuple[torch.nn.Module, Any]:
    """(model, tokenizer) of a finished run, computing as the run computed (predict's)."""
    acc = run_accelerator(run, recipe)
    model, tok = load_model(run, recipe)
    return as_run_computed(model, recipe, acc), tok


def _as_row(i: int, item: Any, names: list[str], lists: tuple[str, ...]) -> dict:
    """One API input as a row of the task's fields: a dict of them, a text (a one-field task), a
    tuple of texts in field order, or a list of words for a task that reads words (NER)."""
    expected = f"this task reads {', '.join(names)}"
    if isinstance(item, dict):
        missing = [n for n in names if n not in item]
        if missing:
            raise UserError(f"predict: input {i} has no '{missing[0]}' ({expected})" + readers.near_name(missing[0], item))
        _check_fields(item, names, lists, f"predict: input {i}")
        return item
    if len(names) == 1 and names[0] in lists and isinstance(item, list):  # words, checked as a file's are
        _check_fields({names[0]: item}, names, lists, f"predict: input {i}")
        return {names[0]: item}
    parts = [item] if isinstance(item, str) else list(item) if isinstance(item, (tuple, list)) else [item]
    if len(parts) != len(names) or not all(isinstance(p, str) for p in parts):
        raise UserError(f"predict: input {i} should be {len(names)} text(s) ({', '.join(names)}), got {item!r}")
    row = dict(zip(names, parts))
    _check_fields(row, names, lists, f"predict: input {i}")
    return row


def predict_rows(run: Path, texts: list[Any]) -> list[dict]:
    """The Python API's predict: per input its fields and the task's prediction (a label with its
    `score` and `probabilities`, tags per word, generated text, an answer span), in input order."""
    with runs.reading(run, "predict with"):
        recipe, model, tok, names = _predicting_run(run)
    texts = recipe.task.predict_records(texts)  # SQuAD's documents and articles: their questions
    records = [t for t in texts if isinstance(t, dict)]
    given, lists = _given_fields(recipe.task, names, recipe.task.predict_word_lists, field_kinds(records),
                                 "predict: each input") if records else (names, recipe.task.predict_word_lists)
    inputs = [_as_row(i, item, given, lists) for i, item in enumerate(texts)]
    note_unreadable_inputs(recipe.task, tok, inputs, given, "predict's inputs")
    with evaluation.finite_outputs():
        rows = recipe.task.predict(model, tok, as_named(inputs, given, names))
    recipe.task.say_notices(run=False)  # what was cut to fit, as a run says it (rule 8)
    say_smoke(run, recipe, "these predictions")
    return carried(inputs, named_back(rows, names, given), given, "predict's inputs")


def named_back(rows: list[dict], names: list[str], given: list[str]) -> list[dict]:
    """Prediction rows with the input's fields under the input's own names (`given`)."""
    back = {n: g for n, g in zip(names, given) if n != g}
    return [{back.get(k, k): v for k, v in r.items()} for r in rows] if back else rows


def carried(inputs: list[dict], rows: list[dict], read: list[str], what: str) -> list[dict]:
    """Prediction rows with every field of their input carried through under its own name, as a
    data frame gets a prediction column: the input's id field first (`_fields.row_key`), then the
    task's row (the fields it read, as it read them, and its prediction), then the input's other
    fields in its order. The rows held the fields the task read and the prediction alone: a
    file's `doc_id`, `source_url` or `split` was dropped (a summarization input's `id` too), and
    rows that repeat a text could be joined back to their inputs by position only (run_glue's
    predict writes an index; a pipeline returns rows in order). An input field that a
    prediction field of the same name would replace (a test file's gold `label` beside the
    predicted one) is kept as `input_NAME`, said in one note: predict reads no labels."""
    if not any(isinstance(r, dict) for r in inputs):
        return rows
    out, renamed = [], {}
    for given, row in zip(inputs, rows):
        if not isinstance(given, dict):  # an API text or tuple: nothing but the fields it read
            out.append(row)
            continue
        kept = {**_fields.row_key(given, read), **row}
        for key, value in given.items():
            if key not in kept:
                kept[key] = value
            elif key not in read and not _same(kept[key], value):
                name = renamed.get(key) or renamed.setdefault(key, _free_name(key, given, row))
                kept[name] = value
        out.append(kept)
    if renamed:
        shown = ", ".join(f"'{k}' as '{v}'" for k, v in renamed.items())
        many = len(renamed) > 1
        print(f"note: {what}: the input's field{'s' * many} of a predicted field's name kept beside "
              f"{'them' if many else 'it'}: {shown} (predict reads no labels; `toolkit eval` scores labelled data)",
              file=sys.stderr)
    return out


def _same(predicted: Any, given: Any) -> bool:
    """Whether a prediction row's field holds the input's value (QA's `id`: a number as its text)."""
    return predicted == given or (isinstance(predicted, str) and not isinstance(given, (dict, list))
                                  and predicted == str(given))


def _free_name(key: str, given: dict, row: dict) -> str:
    name = f"input_{key}"
    while name in given or name in row:
        name = f"input_{name}"
    return name


def predict_run(run: Path, source: str, output: str | None) -> int:
    """Predictions as JSONL (to a file or stdout: no --output, or `-`, as `--input -` reads
    standard input); returns how many were written."""
    output = None if output == "-" else output  # a file named "-" was written, "N predictions -> -"
    if output and Path(output).is_symlink():  # written where it points, as `> LINK` writes: the link was
        output = os.path.realpath(output)  # replaced by a file, the file it names left with its old predictions
    if output:
        check_destination(Path(output), folder=False, what="--output")
        if source != "-" and Path(output).exists() and Path(source).exists() and Path(output).samefile(source):
            raise UserError(f"--output: {output} is the --input file; writing there would replace the "
                            "inputs with their predictions: give another file")
    fmt = output_format(output)  # before the model loads: a name it cannot write is refused first
    check_input_there(source)
    with runs.reading(run, "predict with"):  # its model/ read whole, not while a --force rerun clears it
        recipe, model, tok, names = _predicting_run(run)
    rows, given = _read_inputs(source, names, recipe.task.predict_word_lists, recipe.task)
    note_unreadable_inputs(recipe.task, tok, rows, given, "standard input" if source == "-" else f"--input {source}")
    with evaluation.finite_outputs():  # before anything is written
        out = named_back(recipe.task.predict(model, tok, as_named(rows, given, names)), names, given)
    out = carried(rows, out, given, "--input")
    recipe.task.say_notices(run=False)  # what was cut to fit, as a run says it (rule 8)
    text = render(out, fmt)
    files = recipe.task.predict_files(out)
    for path in beside_output(output, files) if output else []:  # before anything is written
        check_destination(path, folder=False, what=f"--output (beside it, {path.name})")
        if source != "-" and path.exists() and Path(source).exists() and path.samefile(source):
            raise UserError(f"--output: {path}, written beside it, is the --input file; give another name")
    if output:
        data = text.encode("utf-8")
        with writing(Path(output), NOTHING_KEPT):  # whole or nothing: a full disk leaves no cut-short file
            runs.write_whole(Path(output), gzip.compress(data, mtime=0) if output.lower().endswith(".gz") else data)
        for path, content in zip(beside_output(output, files), files.values()):
            with writing(path, NOTHING_KEPT):
                runs.write_whole(path, (json.dumps(runs.finite(content), ensure_ascii=False, allow_nan=False)
                                        + "\n").encode("utf-8"))
    else:
        sys.stdout.write(text)
    say_smoke(run, recipe, "these predictions")
    return len(out)


def beside_output(output: str, files: dict[str, Any]) -> list[Path]:
    """Where a task's `predict_files` go: `OUT.NAME.json` beside --output, OUT its name less the
    output format's suffixes (preds.jsonl.gz -> preds.answers.json), as the run folder has
    predictions.answers.json beside predictions.jsonl."""
    path = Path(output)
    stem = path.name
    for suffix in (".gz", *OUTPUT_FORMATS):
        if stem.lower().endswith(suffix) and len(stem) > len(suffix):
            stem = stem[:-len(suffix)]
    return [path.with_name(f"{stem}.{name}.json") for name in files]


OUTPUT_FORMATS = {".jsonl": "jsonl", ".json": "json", ".csv": "csv"}


def output_format(output: str | None) -> str:
    """What --output's name asks for, as --input's name says what it holds: .csv, .json (one
    list) or .jsonl (`.gz` too, compressed); standard output and other names get JSONL. A .csv
    name had JSON lines written into it (exit 0). TSV is refused: its values are read unquoted
    (as GLUE's files are), so a text holding a tab or a line break cannot be written in one."""
    if not output:
        return "jsonl"
    suffixes = [x.lower() for x in Path(output).suffixes if x.lower() != ".gz"]
    suffix = suffixes[-1] if suffixes else ""
    if suffix == ".tsv":
        raise UserError(f"--output: {output}: TSV holds no tab or line break inside a value, which "
                        "predicted and input text may hold; name it .csv, .json or .jsonl")
    return OUTPUT_FORMATS.get(suffix, "jsonl")


def render(rows: list[dict], fmt: str) -> str:
    """Prediction rows as text in `fmt`. CSV: a column per field (in first-seen order), a
    list or mapping (NER's tags, every label's probability) as JSON in its cell, quoted where a
    value holds the delimiter, a quote or a line break, so a reader gets each value back."""
    import csv
    import io

    if fmt == "jsonl":
        return "".join(runs.jsonl_line(r) for r in rows)
    if fmt == "json":
        return json.dumps(runs.finite(rows), ensure_ascii=False, indent=1, allow_nan=False) + "\n"
    fields = list(dict.fromkeys(k for r in rows for k in r))
    buffer = io.StringIO(newline="")
    writer = csv.DictWriter(buffer, fields, lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: json.dumps(v, ensure_ascii=False) if isinstance(v, (dict, list)) else v
                         for k, v in r.items()})
    return buffer.getvalue()


def glue_test(run: Path, out_dir: Path) -> list[Path]:
    """GLUE server submission files (`SST-2.tsv`, ...: `index<TAB>prediction`) from test.tsv, by a
    trained run (as `toolkit predict`: an in-context run's labels come from its method's scoring,
    which predicts within `run`/`eval` only), from outputs checked finite as they are made."""
    with runs.reading(run, "predict --glue-test with"):  # writes into the run folder by default
        return _glue_test(run, out_dir)


def _glue_test(run: Path, out_dir: Path) -> list[Path]:
    recipe = run_recipe(run)
    if not recipe.method.trains:
        raise UserError(f"{run}: --glue-test predicts with trained runs (this is {recipe.task.name} with "
                        f"{recipe.method.name}, which trains nothing; its label words are scored by "
                        "`toolkit run` and `toolkit eval` on labelled splits only)")
    if out_dir.exists() and not out_dir.is_dir():  # was an OSError after every test set was predicted
        raise UserError(f"--output: {out_dir} is a file; --glue-test writes a folder (GLUE's files, one per test "
                        "set, beside other tasks' files already there): give a folder")
    check_folder_writable(out_dir, "--glue-test")
    with evaluation.finite_outputs():  # a diverged model's NaN logits made labels and scores unsaid
        written = recipe.task.submission(lambda: computing_model(run, recipe), out_dir)
    recipe.task.say_notices(run=False)  # the test texts cut to fit, as a run says it (rule 8)
    say_smoke(run, recipe, "the submission's predictions")
    return written


def _embed_base(run: Path, recipe: Recipe, out: Path, apart: bool, tokenizer: Any = None) -> str:
    """An unmerged export carries its base: config.json (the run's label names in
    id2label/label2id) and the base weights beside the adapter. transformers loads such a folder
    from itself, adapter included (its PEFT integration takes a folder with config.json as the
    base), offline and wherever the base was served from (a package, a cache, a local folder).
    What that integration does not rebuild as trained (`Method.transformers_loads`) gets the base in
    base/, and the line names the load that does. adapter_config.json keeps the base's Hub id for
    --push-to-hub. Says how to load the folder. `tokenizer`: the run's, where it is loaded already."""
    base = base_checkpoint(run, recipe)
    head = recipe.method.head(recipe.task, models.recipe_family(base, recipe.model.warm_start))
    set_seed(recipe.train.seed)  # weights the base lacks (a pooler, frozen) start as they did in the run
    base_model, _ = models.load(base, head, recipe.task.head_kwargs(),  # load_model adopted the labels
                                warm_start=recipe.model.warm_start, tokenizer=tokenizer)
    auto = heads.get(head).auto_class
    tok = tokenizer or models.load_tokenizer(str(out))  # a bottleneck folder: the copied run's
    # the base holds the generation config: in OUT/base/ where the base is saved apart
    decoding = read_as_run(recipe.task, base_model, tok, "OUT/base/generation_config.json" if apart else None)
    if tokenizer is None:
        models.save_tokenizer(tok, out)  # its padding side as generation needs it
    if apart:
        base_model.save_pretrained(out / "base")
        load = recipe.method.export_load.format(base=f"{auto}.from_pretrained(OUT/base)")
        if heads.get(head).peft_task_type == "QUESTION_ANS" and load.startswith("peft: "):
            load = ("peft, with the segment ids its QA model drops put back: "
                    f"toolkit.methods.pass_segments({load.removeprefix('peft: ')})")
        return f"the {recipe.method.name} folder with its base in base/; load it with {load}{decoding}"
    base_model.save_pretrained(out)
    return (f"the {recipe.method.name} adapter with its base beside it; {auto}.from_pretrained(OUT) "
            f"loads both, offline (peft installed); --merge makes a plain model{decoding}")


NOTHING_KEPT = "nothing was kept there: free some space or write elsewhere"


def export_run(run: Path, out: Path, merge: bool, push_to_hub: str | None) -> str:
    """A plain transformers folder where the method allows it; says what was written. The folder
    is written under a temporary name beside `out` and renamed at the end: an interrupted export
    leaves no half folder at `out`, and the next export clears what it left."""
    if push_to_hub and hub.offline():
        raise UserError(f"--push-to-hub {push_to_hub}: the Hub is off-line (HF_HUB_OFFLINE=1); "
                        "export to a folder and push it where the Hub is reachable")
    check_destination(out, folder=True, what="export")
    check_outside_runs(run, out)
    with runs.reading(run, "export"):  # model/ read whole, not while a --force rerun clears it
        return _export_run(run, out, merge, push_to_hub)


def check_outside_runs(run: Path, out: Path) -> None:
    """An export is the user's folder, kept apart from the toolkit's run folders: one inside a run
    folder (RUN/export, RUN/model/export, or another run's) was written, exit 0, and then went with
    that folder's `toolkit run --force` (which clears it whole), and one inside model/ sat in the
    run's result. A run folder is the one exported, or any holding recipe.yaml and identity.json."""
    home = Path(os.path.realpath(run))
    target = Path(os.path.realpath(out))
    owner = next((p for p in target.parents if p == home or (
        (p / "recipe.yaml").is_file() and (p / checkpoints.IDENTITY).is_file())), None)
    if owner is not None:
        raise UserError(f"export: {out} is inside the run folder {owner}, which `toolkit run --force` clears whole "
                        "(and whose model/ is the run's result): export to a folder outside the run folders")


def _export_run(run: Path, out: Path, merge: bool, push_to_hub: str | None) -> str:
    check_finished(run)
    recipe = run_recipe(run)
    if not recipe.method.trains:
        raise UserError(f"{run}: an in-context run trains nothing; export its base checkpoint instead")
    with _partial(out) as partial, writing(out, NOTHING_KEPT):
        note, model, tok = _export_into(run, recipe, partial, merge)
        note += specials_read_otherwise(recipe.task, partial) + _smoke_said(recipe)
        runs.follow_umask(partial)  # safetensors writes 0600 whatever the umask
        if out.exists():
            out.rmdir()  # empty (checked above)
        partial.rename(out)  # marked until here: a kill before it leaves a `.OUT.partial` the next export clears
        (out / PARTIAL_MARK).unlink()
    if push_to_hub:
        push(out, model, push_to_hub)
    return note


def _smoke_said(recipe: Recipe) -> str:
    """A --smoke run's export is the small random-weight model it trained on, whatever checkpoint
    its recipe names: said, as the folder's config alone (a 2-layer model of the family) is easy to
    take for the real one (the line said nothing of it, exit 0)."""
    if not recipe.smoke:
        return ""
    return f"; a --smoke run: this is the small random-weight model it trained on, not {_smoke_named(recipe)}"


def _smoke_named(recipe: Recipe) -> str:
    return recipe.model.checkpoint if isinstance(recipe.model.checkpoint, str) else "the checkpoint its recipe names"


def say_smoke(run: Path, recipe: Recipe, what: str) -> None:
    """One `warning:` line where a --smoke run's model made `what` (eval's scores, predict's and
    --glue-test's predictions), by every entry point, once they are made (an error before them is
    its one line alone): they were the small random-weight model's, said by export's line alone,
    and read as the checkpoint's the recipe names, exit 0."""
    if recipe.smoke and os.environ.get("RANK", "0") == "0":
        print(f"warning: {run}: a --smoke run: {what} are the small random-weight model's it "
              f"{'trained' if recipe.method.trains else 'ran'} on, not {_smoke_named(recipe)}'s", file=sys.stderr)


PARTIAL_MARK = ".toolkit-export"  # in a folder being exported (`_partial`), removed once it is put in place
# (the mark removed before the rename, an export killed between the two left an unmarked
# `.OUT.partial` that every later export refused as a user's own, "move it away")


def _not_ours(partial: Path, what: str) -> None:
    """`.OUT.partial` is where an export is written; something there that no export left (a user's
    own file or folder of that name, a link) is not cleared as an interrupted export's leftovers:
    a user's folder there lost its files, and a link to a folder had that folder emptied and the
    export written into it, exit 0."""
    raise UserError(f"export: {partial}, where an export to {partial.parent / partial.name[1:-8]} is written before it "
                    f"is put in place, {what}: move it away (or export elsewhere); it is left as it is")


@contextmanager
def _partial(out: Path) -> Iterator[Path]:
    """The folder an export is written in (`.OUT.partial` beside `out`), emptied of what an
    interrupted export left and held (flock on the folder itself) until it is renamed to `out` or
    removed. The lock in $TOOLKIT_CACHE (api._one_export) binds only processes that share that
    cache: an export from another cache cleared this one's half-written folder as an interrupted
    export's leftovers and wrote its own files into it. The folder is marked (PARTIAL_MARK) before
    anything is written in it: only a marked one is cleared, anything else there is `_not_ours`."""
    partial = out.parent / f".{out.name}.partial"
    if partial.is_symlink() or (partial.exists() and not partial.is_dir()):
        _not_ours(partial, "is a link" if partial.is_symlink() else "is a file")
    partial.mkdir(exist_ok=True)
    fd = runs.flock_held(partial, f"export: {out} is being written by another export right now (one that uses "
                                  "another $TOOLKIT_CACHE); wait for it to finish, or export elsewhere")
    children = list(partial.iterdir())
    if children and not (partial / PARTIAL_MARK).is_file():
        os.close(fd)
        _not_ours(partial, "holds files no export wrote")
    try:
        for child in children:  # what an interrupted export left
            shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        (partial / PARTIAL_MARK).touch()  # first: an export killed from here on leaves it marked
        yield partial
    finally:
        try:  # not renamed to `out`: removed, unless another export made a new one since
            if os.stat(partial).st_ino == os.fstat(fd).st_ino:
                shutil.rmtree(partial, ignore_errors=True)
        except OSError:
            pass
        os.close(fd)


def push(out: Path, model: Any, repo: str) -> None:
    """--push-to-hub: the model (a PEFT adapter alone: its adapter_config.json names the base's Hub
    id) and the tokenizer as the export saved it (its class, split_special_tokens,
    model_max_length), not the one in memory (T5's saved as TokenizersBackend was pushed as
    T5Tokenizer). Bottleneck adapters have no model object: their folder is uploaded as written
    (`None.push_to_hub` was an AttributeError traceback after the export was written)."""
    from huggingface_hub import HfApi
    from transformers import AutoTokenizer

    if model is None:
        api = HfApi()
        api.create_repo(repo, exist_ok=True)
        api.upload_folder(folder_path=str(out), repo_id=repo)
        return
    model.push_to_hub(repo)
    AutoTokenizer.from_pretrained(out).push_to_hub(repo)


def _export_into(run: Path, recipe: Recipe, out: Path, merge: bool) -> tuple[str, Any, Any]:
    folder = run / "model"
    if isinstance(recipe.model.attention, attention.Attention):
        raise UserError(f"export: the run uses the toolkit's attention module '{recipe.model.attention.name}', "
                        "which plain transformers does not have: a transformers folder would load with its "
                        "default attention and predict otherwise; use toolkit predict (or toolkit.predict)")
    if (folder / BOTTLENECK_CONFIG).is_file():
        if merge:
            raise UserError("--merge: bottleneck adapters add a non-linear layer, which no weight of "
                            "the base can absorb; export without --merge keeps the adapter folder")
        check_saved(folder)
        adopt_saved(run, recipe)
        shutil.copytree(folder, out, dirs_exist_ok=True)
        return _embed_base(run, recipe, out, apart=True), None, None
    model, tok = load_model(run, recipe)
    note = "a plain transformers model folder"
    peft_config = getattr(model, "peft_config", None)
    if peft_config is not None and merge:
        if next(iter(peft_config.values())).is_prompt_learning:
            raise UserError(f"--merge: {recipe.method.name} adds virtual tokens, not weight deltas; "
                            "it stays a PEFT folder (export without --merge)")
        model = methods.merged(model)
        note += " (adapter merged into the base)"
    if peft_config is not None and not merge:  # the base beside it holds the generation config
        note = _embed_base(run, recipe, out, apart=not recipe.method.transformers_loads, tokenizer=tok)
    else:
        note += read_as_run(recipe.task, model, tok)
    model.save_pretrained(out)
    models.save_tokenizer(tok, out)
    if not recipe.smoke:  # a smoke run's base is a local folder: the run's own name for it stays
        models.make_portable(out, base_checkpoint(run, recipe))
    return note, model, tok


def read_as_run(task: Any, model: Any, tok: Any, config_at: str | None = None) -> str:
    """An exported tokenizer reads a prediction input as the run read it, loaded as plain
    transformers loads it (`AutoTokenizer.from_pretrained`, `pipeline`): special tokens' strings
    in the text as text (`split_special_tokens`, saved in tokenizer_config.json; models.text_is_text),
    and cut where the run cut it (`model_max_length` = `Task.reading_limit`). The folder used to read
    "[SEP]", "</s>" or "<|endoftext|>" in a review as the control token and a text past
    task.max_length whole (or to the base's 512 positions), so it predicted otherwise than
    `toolkit predict`, exit 0. A pretraining objective's folder (nothing to predict) keeps
    transformers' reading: fill-mask finds its [MASK] in the text. Then what else a plain
    transformers user needs to read the outputs as the run did (`Task.export_settings`: extractive
    QA's answer search) and `decode_as_run`."""
    said = ""
    if task.predicts:
        tok.split_special_tokens = tok.init_kwargs["split_special_tokens"] = True
        limit = task.reading_limit()
        if limit is not None:
            tok.model_max_length = tok.init_kwargs["model_max_length"] = limit
            said = (f"; its tokenizer cuts at task.max_length={limit} tokens as the run did (model_max_length, "
                    "where truncation=True cuts)")
    return said + task.export_settings(tok) + decode_as_run(task, model, tok, config_at)


def specials_read_otherwise(task: Any, out: Path) -> str:
    """The exported tokenizer, loaded as plain transformers loads it, reads special tokens'
    strings as the run did, or the line says which it reads as the tokens. T5's SentencePiece
    vocabulary holds "</s>", "<pad>" and its sentinels as pieces, read from text whatever
    `split_special_tokens` says; the normalizer step models.text_is_text adds against that is in
    the saved tokenizer.json, but T5Tokenizer rebuilds its own normalizer and drops it (a
    "</s>" in a review was an end of sequence: a batch holding one stopped BART's and T5's
    classifiers with a ValueError). Such a folder's tokenizer is saved as `TokenizersBackend`,
    which loads tokenizer.json as written, where that reads and decodes as the run's and keeps
    what the task sets on it (a multilingual tokenizer's language codes: its own class is kept)."""
    if not task.predicts:
        return ""
    from transformers import AutoTokenizer

    ours = models.load_tokenizer(str(out), words=task.words_given)
    differ = _specials_differ(ours, AutoTokenizer.from_pretrained(out))
    if not differ:
        return ""
    config_file = out / "tokenizer_config.json"
    saved = json.loads(config_file.read_text(encoding="utf-8"))
    own = saved.get("tokenizer_class")
    config_file.write_text(json.dumps({**saved, "tokenizer_class": "TokenizersBackend"}, indent=2, ensure_ascii=False),
                           encoding="utf-8")
    generic = AutoTokenizer.from_pretrained(out)
    probe = ours(DECODE_PROBE)["input_ids"]
    # a multilingual tokenizer's language codes (src_lang, tgt_lang) live in its own class alone
    codes = [a for a in ("src_lang", "tgt_lang") if getattr(ours, a, None) is not None]
    if not _specials_differ(ours, generic) and all(hasattr(generic, a) for a in codes) and all(
            ours.decode(probe, skip_special_tokens=skip) == generic.decode(probe, skip_special_tokens=skip)
            for skip in (False, True)):
        return (f"; its tokenizer is saved as TokenizersBackend, which reads tokenizer.json as written ({own} "
                f"would read {_shown(differ)} in a text as the special tokens)")
    config_file.write_text(json.dumps(saved, indent=2, ensure_ascii=False), encoding="utf-8")
    return (f"; {own} reads {_shown(differ)} in a text as the special token{'s' if len(differ) > 1 else ''}, "
            "where the run read such strings as text: a text holding one is predicted otherwise")


DECODE_PROBE = "Plain text, with <angle> brackets & accents: café, naïve; 3 < 4. </s> [SEP]"


def _specials_differ(ours: Any, plain: Any) -> list[str]:
    return [t for t in ours.all_special_tokens
            if ours(t, add_special_tokens=False)["input_ids"] != plain(t, add_special_tokens=False)["input_ids"]]


def _shown(tokens: list[str]) -> str:
    return ", ".join(json.dumps(t) for t in tokens[:3]) + (f" and {len(tokens) - 3} more" if len(tokens) > 3 else "")


def decode_as_run(task: Any, model: Any, tok: Any, config_at: str | None = None) -> str:
    """An exported generation model decodes as the run scored it, for anyone who calls its
    `generate`: generation_config.json carries the recipe's decoding (num_beams, max_new_tokens,
    length_penalty, the length and repetition constraints, greedy: each the recipe's, else left
    the checkpoint's, as the run read it; the strategies no recipe decodes with cleared, as
    `Generation.kwargs` clears them; what greedy or beam search ignores unset,
    `Generation.saved`) and the pad token, and a decoder-only model's
    tokenizer pads on the left, where its prompts end at one column, an encoder-decoder's on the
    right, as the run padded its sources (BART's learnt positions move with left padding). The export held the base's
    generation_config (no beams, transformers' 20-token default), so the folder generated other
    text than `toolkit predict` on the run. A multilingual tokenizer is saved with the run's
    `src_lang` / `tgt_lang`; an encoder-decoder's config starts generation as training's decoder
    input starts (`decoder_start_token_id`, the target's code as `forced_bos_token_id` where the
    tokenizer marks one: `TextToText.decoding_start`). What a config cannot hold (the prompt's affixes; a
    decoder's repeat ban over its continuation alone) is said in the export's line, with where
    the generation config is (`config_at`: a base saved apart in OUT/base/ holds it, where the line
    named the folder's own generation_config.json, which such an export does not have)."""
    generation = getattr(task, "generation", None)
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    if generation is None or not inner.can_generate():
        return ""  # not a text-to-text task, or one answered by a head (extractive QA)
    task.set_languages(tok)  # a multilingual tokenizer's codes, saved with it as the run read them
    settings = {**generation.saved(inner, task.max_target_length), "pad_token_id": tok.pad_token_id,
                "eos_token_id": task.end_ids(inner, tok), **task.decoding_start(inner, tok)}
    said = []
    side = "left" if task.decoder_only else "right"
    tok.padding_side = tok.init_kwargs["padding_side"] = side  # what save_pretrained writes
    if task.decoder_only:
        if settings["no_repeat_ngram_size"]:
            said.append(f"the run banned repeated {settings['no_repeat_ngram_size']}-grams within the "
                        "continuation alone (generate's no_repeat_ngram_size bans them over the prompt too: "
                        "it is left unset)")
            settings["no_repeat_ngram_size"] = None
    inner.generation_config.update(**settings)
    prefix, suffix = task.affixes()
    source = task.source_text(task.raw_input({n: f"{{{n}}}" for n in task.predict_fields(model)}))
    prompt = json.dumps(prefix + source + suffix, ensure_ascii=False)
    if task.reading_limit() is None:  # the tokenizer's own cut would take the suffix first
        said.append(f"the run cut each source to fit task.max_length={task.max_length} tokens "
                    f"before the rest of the prompt; a longer one is read whole")
    return "; generate from the prompt " + prompt + f" (the run's decoding is in {config_at or 'generation_config.json'}" \
        + "".join(f"; {s}" for s in said) + ")"


def check_folder_writable(folder: Path, what: str) -> None:
    """A folder a command writes its files into (made where missing), checked before any model
    loads: `predict --glue-test` into a run folder of a shared, read-only runs folder (its default
    RUN/glue-test) or an --output there predicted every test set, then failed making the folder,
    the predictions lost."""
    existing = next((p for p in [folder, *folder.parents] if p.exists()), Path("."))
    if not existing.is_dir():
        raise UserError(f"{what}: {existing} is a file, so the folder {folder} cannot be made there; give "
                        "another folder (--output DIR)")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"{what}: cannot write in {existing} (permission denied), where it writes {folder}; "
                        "give a folder that can be written (--output DIR)")


# the longest name written beside a destination before it is put in place: an export's folder
# (`_partial`: `.OUT.partial`), a file's whole-or-nothing temporary (`runs.write_whole`:
# `OUT.<pid>-<8 hex>.tmp`, a pid of up to 7 digits)
PLACEHOLDER_EXTRA = {True: len(".") + len(".partial"), False: len(".1234567-12345678.tmp")}


def _check_name_room(path: Path, folder: bool, what: str) -> None:
    """The name the user gave and the temporary one written beside it first fit the file system's
    name limit: a 250-character export name was refused as "file name too long" naming the
    temporary `.OUT.partial`, which the user never gave, and one of 256 only by the OS."""
    above = next((p for p in path.parents if p.is_dir()), None)
    try:
        limit = os.pathconf(above or ".", "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    size, most = len(os.fsencode(path.name)), limit - PLACEHOLDER_EXTRA[folder]
    if size > most:
        raise UserError(f"{what}: {path}: its name is {size} bytes long, and at most {most} fit here: "
                        f"the file system takes names of up to {limit} bytes, and the toolkit writes "
                        f"{'the folder' if folder else 'the file'} under a temporary name "
                        f"{PLACEHOLDER_EXTRA[folder]} bytes longer first; give a shorter name")


def check_destination(path: Path, folder: bool, what: str) -> None:
    """A place the user names for output, refused before any model loads: a folder that exists
    and is not empty (or is a file), a missing parent, a parent that cannot be written."""
    if folder:  # an export: the tokenizer is saved there
        runs.check_utf8(path, what)
    _check_name_room(path, folder, what)
    if folder and path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise UserError(f"{what}: {path} exists and is {'not empty' if path.is_dir() else 'a file'}; "
                        "choose a new folder")
    if not folder and path.is_dir():
        raise UserError(f"{what}: {path} is a folder; give a file name (e.g. {path / 'predictions.jsonl'})")
    parent = path.parent
    if not parent.is_dir():  # a file on the way is said as one (it was "does not exist", beside `ls` showing it)
        blocker = next((p for p in [parent, *parent.parents] if p.exists() and not p.is_dir()), None)
        if blocker is not None:
            raise UserError(f"{what}: {blocker} is a file, not a folder, so {path} cannot be written under it; "
                            "give a path under a folder")
        raise UserError(f"{what}: the folder {parent} does not exist; create it first")
    if not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise UserError(f"{what}: cannot write in {parent} (permission denied)")
