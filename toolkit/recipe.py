"""The recipe: YAML + `key=value` overrides -> typed dataclasses, validated before any weight loads.

The layers below: toolkit/schema.py builds and checks settings dataclasses; toolkit/recipe_data.py
holds the recipe's data (sections, YAML, overrides, hash). Here, above the registries, models and
chained runs, a raw recipe is built into its plug-ins and checked as a whole (names, model family x
head x method x task, attention, a `{run: ...}` checkpoint's own recipe).
"""

from __future__ import annotations

import dataclasses
import os
import unicodedata
from pathlib import Path
from typing import Any

from toolkit import attention, chain, methods, models, readers, runs, tasks, tracking
from toolkit.errors import UserError
from toolkit.recipe_data import (SECTIONS, SMOKE_CAPS, SMOKE_LENGTHS, SMOKE_NEW_TOKENS, ModelConfig, Recipe,
                                 RunPlan, TrainConfig, apply_overrides, dump, find_recipe, read_yaml,
                                 recipe_files, recipe_name, recipes_root, safe_yaml, smoke_sized)
from toolkit.registry import did_you_mean, foreign_hint
from toolkit.schema import NO_EFFECT, WAS, build_dataclass, build_plugin

# what callers read from here (the data and schema below are re-exported: one name to import)
__all__ = ["ModelConfig", "Recipe", "RunPlan", "SECTIONS", "SMOKE_CAPS", "SMOKE_LENGTHS", "SMOKE_NEW_TOKENS",
           "TrainConfig", "apply_overrides", "build_dataclass", "build_plugin", "built", "check", "check_data", "check_environment",
           "dump", "find_recipe",
           "finished_as_made", "load", "made_with", "parse", "parse_plan", "plan", "read_yaml", "recipe_files", "recipe_name", "recipes_root",
           "safe_yaml", "smoke_sized", "upstream"]


def parse(raw: dict, name: str = "recipe", smoke: bool = False, origin: Path | None = None,
          seen: tuple[Path, ...] = ()) -> Recipe:
    """Raw mapping -> Recipe; checks fields, names and combinations (no weights are loaded). A run's
    recipe.yaml read back (inference): its data file settings as it holds them (a run made before
    their one form names a file relative to the folder it ran in, which eval says as such)."""
    return parse_plan(raw, name, smoke, origin, seen, launch=False).recipe


def parse_plan(raw: dict, name: str = "recipe", smoke: bool = False, origin: Path | None = None,
               seen: tuple[Path, ...] = (), launch: bool = True) -> RunPlan:
    """Raw mapping -> the recipe and the run its `{run: ...}` checkpoint names (loaded to check
    this one: its model family is this run's), kept beside the recipe, out of its hash. `launch`:
    the data file settings in their one form (tasks.canonical_data_paths), as a run is made."""
    recipe = built(raw, name, smoke)
    checked = RunPlan(recipe)
    if isinstance(recipe.model.checkpoint, dict):
        checked.upstream = upstream(recipe.model.checkpoint, origin, smoke, seen)
        chain.check(recipe, checked.upstream.recipe)
        recipe.upstream_id = runs.run_id(checked.upstream.recipe)
        recipe.upstream_id_first = runs.run_id_as(checked.upstream.recipe, "first")
        recipe.upstream_id_before = runs.run_id_as(checked.upstream.recipe, "before")
        recipe.checkpoint_as_written = recipe.model.checkpoint
        recipe.model.checkpoint = chain.canonical(recipe.model.checkpoint, origin)
    else:
        _canonical_folder(recipe)
    check(recipe, checked.base, checked.saved_dropout)
    if launch:  # after check: it names them as written
        recipe.task_as_written = tasks.canonical_data_paths(recipe.task) or None
    return checked


def _canonical_folder(recipe: Recipe) -> None:
    """A local base folder in one form: its absolute path, the run's `model/` where a run folder is
    named (models.local_dir): `base`, `./base/`, `/abs/base`, `~/base`, a symbolic link to it or
    `runs/x/<id>` for `runs/x/<id>/model` were hashed as spelled, one fine-tuning of one base as
    many run ids as spellings. recipe.yaml holds that form (eval, predict and export find the base
    from anywhere); the hash before it (Recipe.hash_as_before) covers the spelling."""
    folder = models.local_dir(recipe.model.checkpoint) if isinstance(recipe.model.checkpoint, str) else None
    if folder is not None and str(folder.resolve()) != recipe.model.checkpoint:
        recipe.checkpoint_as_written = recipe.model.checkpoint
        recipe.model.checkpoint = str(folder.resolve())


def built(raw: dict, name: str = "recipe", smoke: bool = False) -> Recipe:
    """Raw mapping -> Recipe, each section and plug-in built and its fields checked, without the
    checks across fields that read a model's config or a chained run's recipe (`check`): what a
    recipe's hash needs, so a run folder's recipe.yaml is judged on this machine or any other."""
    raw = dict(raw)
    saved_name, saved_smoke = raw.pop("name", None), raw.pop("smoke", False)  # a run's recipe.yaml
    if not isinstance(saved_smoke, bool):
        raise UserError(f"smoke: expected true or false, got {saved_smoke!r}")
    if saved_name is not None and not isinstance(saved_name, str):
        raise UserError(f"name: expected a string, got {saved_name!r}")
    if saved_name and not _plain_relative(saved_name):  # the run folder is runs/<name>/<hash>
        raise UserError(f"name: '{saved_name}' is not a relative path of folder names (e.g. "
                        "demo/sst2/minilm-lora); a run folder is <runs>/<name>/<hash>, inside the runs folder")
    name, smoke = saved_name or name, smoke or saved_smoke
    _check_printable(name, named=bool(saved_name))
    allowed = {"model", "task", "method", "train"}
    if "extends" in raw:  # read_yaml takes a file's own; what is left came from elsewhere
        raise UserError("extends: only a recipe file names its bases; an override or a run's recipe.yaml "
                        "cannot add one (write a recipe file that extends it)")
    for key in raw:
        if key not in allowed:
            hint = foreign_hint(str(key)) or did_you_mean(str(key), sorted(allowed | {'extends'}))
            raise UserError(f"{key}: unknown section{hint}")
    for key in ("model", "task", "method"):
        if key not in raw:
            raise UserError(f"{key}: required section is missing")
    sections = {key: build_dataclass(cls, raw.get(key, {}), key) for key, cls in SECTIONS.items()}
    sections["model"].attention = attention.from_recipe(sections["model"].attention, "model.attention")
    if isinstance(sections["model"].attention, attention.Attention):
        sections["model"].attention.run_seed = sections["train"].seed  # draws follow the run's seed
    task = build_plugin(tasks.TASKS, raw["task"], "task")
    task.run_seed = sections["train"].seed  # training draws (masks, noise) follow the run's seed
    method = build_plugin(methods.METHODS, raw["method"], "method")
    return Recipe(model=sections["model"], task=task, method=method, train=sections["train"],
                  name=task.run_name(name), smoke=smoke)


def made_with(run: Path, raw: dict, recorded: Any, then: str = "") -> None:
    """A run folder's recipe.yaml (`raw`, as read) must be the recipe the run was made with:
    metrics.json records its hash (`recorded`, its `recipe_hash`, as `Recipe.hash` computes it).
    Edited by hand after the run, it was read as written: eval scored another setting (max_length,
    eval_file) and wrote it as the run's score, predict and export read the model under other
    settings, and a report put the run in another seed group or row (seed, method, lr), exit 0.
    A run from before the field (`recorded` None) is not judged. A run made before fields were
    added to the schema is judged on its recipe as written (its hash then covered the fields it
    had; built now, the new fields' defaults would change it): unedited, it is taken. `then`:
    what the caller would do on purpose instead (eval's task.KEY=VALUE), said in the line."""
    if recorded is None:
        return
    try:
        if Recipe.digest({"smoke": False, **{k: v for k, v in raw.items() if k != "name"}}) == recorded:
            return  # as written: every field it has, as the run had them
    except (TypeError, ValueError):  # keys JSON cannot sort (1: and a:): not what a run writes
        pass
    file = run / "recipe.yaml"
    try:
        made = built(raw)
        now, first, before = made.hash, made.hash_as_first_forms, made.hash_as_before  # runs made under older forms
    except UserError as exc:
        now = first = before = f"unreadable ({exc})"
    if recorded not in (now, first, before):
        raise UserError(f"{file}: not the recipe this run was made with (it hashes as {now}; metrics.json "
                        f"records recipe_hash {recorded}): it was edited after the run; put it back as the run "
                        f"wrote it{then}, or run the changed recipe as a run of its own (toolkit run on a "
                        "copy of it as a recipe)")


def without_effect_changed(recipe: Recipe, run: Path) -> list[str]:
    """The settings that change no result (schema.NO_EFFECT, where they do not) that the launch of
    `recipe` asks otherwise than the run folder `run` (its recipe.yaml) was made with, each as
    `train.report_to [] (now ['wandb'])`: one run id, so the run is "finished already" and the
    launch sends nothing to the trackers, logs no more often. Said, not silent. [] where the same,
    or where recipe.yaml does not read."""
    try:
        raw = safe_yaml((run / "recipe.yaml").read_text(encoding="utf-8"), "recipe.yaml")
    except (OSError, UnicodeDecodeError, UserError):
        return []
    made = raw.get("train") if isinstance(raw, dict) else None
    if not isinstance(made, dict):
        return []
    said = []
    for f in dataclasses.fields(recipe.train):  # (task.data_dir: where its files are, named as they are)
        if NO_EFFECT in f.metadata and f.metadata[NO_EFFECT](recipe.train):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            was, asked = made.get(f.name, default), getattr(recipe.train, f.name)
            if was != asked and not (isinstance(was, list) and isinstance(asked, list) and sorted(was) == sorted(asked)):
                said.append(f"train.{f.name} {was} (now {asked})")
    return said


def finished_as_made(run: Path, then: str = "") -> bool:
    """Whether a run is finished (runs.is_finished), its recipe.yaml the recipe it was made with
    (`made_with`) and its model/ there: a finished run whose recipe.yaml was edited, damaged or
    removed after it, or whose model/ was removed, was skipped as finished by `run` and `sweep`,
    exit 0, while `eval` and `report` refused it; now every entry point says it in one line.
    `then`: what that entry point would do instead."""
    if not runs.is_finished(run):
        return False
    file = run / "recipe.yaml"
    try:
        raw = safe_yaml(file.read_text(encoding="utf-8"), str(file))
    except FileNotFoundError:
        raw = None
    except (OSError, UnicodeDecodeError, UserError) as exc:
        raise UserError(f"{file}: the finished run's recipe is damaged ({str(exc).split(': ')[-1]}); put it back "
                        f"as the run wrote it{then}") from None
    if not isinstance(raw, dict):
        said = "is gone" if raw is None else "is damaged (not a mapping)"
        raise UserError(f"{file}: the finished run's recipe {said}; put it back as the run wrote it{then}")
    try:
        metrics = runs.read_json(run / "metrics.json")
    except (OSError, ValueError):
        metrics = {}
    recorded = metrics.get("recipe_hash") if isinstance(metrics, dict) else None
    made_with(run, raw, recorded, then)
    ran_as = metrics.get("run_id") if isinstance(metrics, dict) else None
    if isinstance(ran_as, str) and ran_as != run.name:  # its folder renamed, or copied onto another id
        raise UserError(f"{run}: this folder holds the finished run {ran_as} (metrics.json run_id), not run "
                        f"{run.name}: a run folder renamed or copied onto another run's id is not that run; put "
                        "it back under its own id, or run the recipe again with --force to train this run")
    method = raw.get("method") if isinstance(raw.get("method"), dict) else {}
    trains = method.get("name") not in methods.METHODS or methods.METHODS.get(method["name"]).trains
    if trains and not (run / "model").is_dir():  # the result itself: said as gone, not "finished already"
        raise UserError(f"{run / 'model'}: the finished run's model is gone (its result; eval, predict and export "
                        "load it); put it back as the run saved it, or run the recipe again with --force")
    changed = runs.result_changed(run)
    if changed is not None:
        raise UserError(f"{changed}: the finished run's model is not as the run saved it (metrics.json "
                        "model_files); put it back as the run saved it, or run the recipe again with --force")
    return True


def _check_printable(name: str, named: bool) -> None:
    """A run's name (`name:`, else the recipe file's path) is a folder name of the run and is
    printed in lines, notes and report tables: a control character (a newline split every table
    row it stood in) or a byte that is not UTF-8 (a lone surrogate: the run's lock and files could
    not be named, a traceback) is refused before anything is written."""
    odd = next((c for c in name if unicodedata.category(c) in ("Cc", "Cs")), None)
    if odd is None:
        return
    what = "a byte that is not UTF-8" if unicodedata.category(odd) == "Cs" else f"a control character ({ascii(odd)})"
    source = "" if named else " (from the recipe file's name)"
    raise UserError(f"name: {ascii(name)}{source} holds {what}; a run's name is a folder name printed in lines "
                    "and tables: rename the file or set name: to printable text")


def _plain_relative(name: str) -> bool:
    """`demo/sst2/x`: relative, each part a folder name (not empty, `.`, `..` or with a backslash)."""
    parts = name.split("/")
    return not name.startswith(("/", "~")) and all(p not in ("", ".", "..") and "\\" not in p for p in parts)


def _check_compile_optimizer(recipe: Recipe) -> None:
    """train.compile_optimizer: true where the compiled update cannot be the eager one (it skips a
    non-finite step on the device and reads nothing to the host; toolkit/optimizer_step.py)."""
    train = recipe.train
    if train.compile_optimizer is not True or not recipe.method.trains:
        return
    if train.mixed_precision == "fp16":
        raise UserError("train.compile_optimizer: true with mixed_precision: fp16, whose loss scaler decides "
                        "on the host each step; use bf16, or compile_optimizer: false")
    if recipe.method.steps_on_host:
        raise UserError(f"train.compile_optimizer: true with method {recipe.method.name}, whose per-step hook "
                        "(after_step, skipped_step) runs on the host; set compile_optimizer: false")


def check(recipe: Recipe, base: Recipe | None = None, saved_dropout: tuple[float, str] | None = None) -> None:
    """Cross-field checks: task settings, attention, model family x head x method x task. `base`
    is the recipe at the bottom of a `{run: ...}` chain (RunPlan.base): continued pretraining
    keeps the model family of its base; None: this recipe names its model itself.
    `saved_dropout`: the dropout an upstream run saved in the model this one loads (RunPlan.saved_dropout)."""
    task = recipe.task
    task.check_fields()
    task.check()
    tracking.check(recipe.train.report_to)
    train = recipe.train
    if train.precision_mode == "bf16_master" and train.mixed_precision != "bf16":  # toolkit/precision.py
        raise UserError(f"train.precision_mode: bf16_master keeps the weights in bf16, so it needs "
                        f"train.mixed_precision: bf16 (got {train.mixed_precision}); set that, or "
                        "precision_mode: autocast")
    _check_compile_optimizer(recipe)
    if recipe.method.trains and not train.max_steps and train.epochs == 0:  # the loop takes >= 1 step
        raise UserError("train.epochs: 0 trains no epoch, yet the run would take one optimizer step; "
                        "set epochs above 0, or train.max_steps")
    if train.warmup_steps and train.warmup_ratio:  # the loop would take the steps, the ratio unsaid
        raise UserError(f"train.warmup_steps: {train.warmup_steps} and train.warmup_ratio: {train.warmup_ratio} "
                        "both set the warm-up; keep one (set the other to 0)")
    base = base or recipe
    if recipe.model.warm_start and not recipe.method.trains:  # in-context prompting scores the model as it is
        raise UserError(f"model.warm_start: {recipe.model.warm_start} joins copies of the encoder by new, "
                        f"untrained cross-attention, and method {recipe.method.name} trains nothing: it would "
                        "score a model no one trained; remove model.warm_start, or train it first and chain "
                        "to that run")
    if recipe.model.warm_start and recipe.model.attention is not None:
        raise UserError("model.attention: a warm-started encoder-decoder keeps the encoder's own "
                        "attention; remove model.attention or model.warm_start")
    if isinstance(base.model.checkpoint, str):  # a local folder the tokenizer is loaded from
        runs.check_utf8(base.model.checkpoint, "model.checkpoint")
    # the model this recipe builds: a chained recipe may warm-start an encoder-decoder from its base's body
    family = models.recipe_family(base.model.checkpoint, recipe.model.warm_start or base.model.warm_start)
    # a module's sizes are bounded by the checkpoint's: the recipe names it, so under --smoke too
    # (the small model a smoke run builds holds at least its positions and is no yardstick of the real run)
    sizes = (models.readable_sizes(base.model.checkpoint) if isinstance(recipe.model.attention, attention.Attention)
             and isinstance(base.model.checkpoint, str) else None)
    models.check_attention(recipe.model.attention, family, sizes)
    if recipe.method.trains and isinstance(base.model.checkpoint, str):
        models.check_attention_dropout(recipe.model.attention, base.model.checkpoint, recipe.model.dropout,
                                        saved_dropout)
    shape = models.readable_sizes(base.model.checkpoint, with_positions=False) if isinstance(base.model.checkpoint, str) else None
    if shape and shape[1]:  # the real checkpoint's width, under --smoke too: no layer of it is wider
        methods.check_sizes(recipe.method, shape[1], f"the width of {base.model.checkpoint}")
    if isinstance(recipe.model.checkpoint, str):  # a run's model/ (or its run folder) as a path
        _check_trained_attention(recipe)
    if isinstance(recipe.model.attention, attention.Attention):
        reason = recipe.model.attention.incompatible_method(recipe.method)
        if reason:
            raise UserError(f"model.attention: '{recipe.model.attention.name}' cannot run with "
                            f"method {recipe.method.name}: {reason}")
    models.check_head(base.model.checkpoint, family, recipe.method.head(task, family))
    folder = models.tokenizer_folder(base.model.checkpoint, recipe.smoke) if isinstance(base.model.checkpoint, str) else None
    if folder is not None:  # the tokenizer the run reads (a warm start's is the encoder's)
        task.check_tokenizer(folder, base.model.checkpoint)
    if recipe.train.metric is not None:  # after the head: a task's metrics may follow it (squad v2's best_*)
        names = task.metric_names()
        if recipe.train.metric not in names:
            raise UserError(f"train.metric: '{recipe.train.metric}' is not a metric of this task"
                            f"{did_you_mean(recipe.train.metric, names)}")
    config = models.checkpoint_config(base.model.checkpoint) if isinstance(base.model.checkpoint, str) else {}
    reason = recipe.method.incompatible_checkpoint(family, task, config)
    if reason:
        raise UserError(f"method.name: '{recipe.method.name}' cannot run here: {reason}")
    refuse_ignored(recipe)


def _smoke_sized_as(key: str, value: Any) -> bool:
    """Whether `value` is the size --smoke gives setting `key` (recipe_data.smoke_sized): a smoke
    recipe holds that cap whatever the recipe wrote, which the recipe as written was checked for.
    Any other value was given by hand: any value was let through, so `toolkit eval SMOKE-RUN
    task.max_target_length=20` of an extractive QA run (or `smoke=true` beside it) scored without
    it and recorded it in eval-eval.json as used, exit 0, where the same run without --smoke refuses it."""
    section, _, name = key.partition(".")
    caps = {**{f"{s}.{k}": v for (s, k), v in SMOKE_CAPS.items()}, **{f"task.{k}": v for k, v in SMOKE_LENGTHS.items()},
            "task.generation.max_new_tokens": SMOKE_NEW_TOKENS}
    return key in caps and value == caps[key]


def refuse_ignored(recipe: Recipe) -> None:
    """A setting the method or the task declares it never reads here (`Method.ignores`,
    `Task.ignores`: icl's training settings, an extractive SQuAD run's generation) set to other
    than its default: one line, not a run of something else whose recipe.yaml records the value
    as used. A setting at its default, written or not, is no request (shipped recipes keep theirs)."""
    ignored = {**recipe.method.ignores(recipe.task), **recipe.task.ignores()}
    for key, why in ignored.items():
        *path, name = key.split(".")
        owner: Any = recipe
        for part in path:
            owner = getattr(owner, part)
        f = next(f for f in dataclasses.fields(owner) if f.name == name)
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        value = getattr(owner, name)
        if value == default or value == f.metadata.get(WAS, default) or recipe.smoke and _smoke_sized_as(key, value):
            continue
        raise UserError(f"{key}: {why}; remove it (it is {value!r}, which the run would record in "
                        f"recipe.yaml without using it)")


def _check_trained_attention(recipe: Recipe) -> None:
    """A model folder saved with a toolkit attention module (an earlier run's model/, its
    attention.json beside the weights) is those weights under that module, as a `{run: ...}`
    checkpoint is (chain.check): a recipe naming no attention, or the module with other settings,
    left the module or its trained parameters behind, exit 0."""
    folder = models.local_dir(recipe.model.checkpoint)
    if folder is None:
        return
    trained = attention.settings_of(folder)
    reason = attention.left_behind(trained, recipe.model.attention, bool(recipe.model.warm_start))
    if reason:
        raise UserError(f"model.attention: model.checkpoint {folder} was trained with attention module "
                        f"'{trained.name}' (its {attention.SETTINGS_FILE}), {reason}")


# The folders the toolkit reads from the environment. Set, each names a folder: one that is a file,
# or (for what is read, not made) names nothing, is a mistake said before anything runs.
ENV_FOLDERS = {"TOOLKIT_DATA": "a folder of data sets", "TOOLKIT_TOKENIZERS": "a folder of tokenizers",
               "TOOLKIT_CACHE": "a folder the toolkit may write (locks, smoke models)",
               "TOOLKIT_RUNS": "a folder of runs"}
MADE_FOLDERS = ("TOOLKIT_CACHE", "TOOLKIT_RUNS")  # created when missing


def check_environment() -> None:
    """Each TOOLKIT_* folder variable that is set names a folder (TOOLKIT_CACHE and TOOLKIT_RUNS
    may name one still to be made): a file there crashed with NotADirectoryError deep in a run,
    and a data folder that is not there read as "valid" and left the task to look elsewhere."""
    for name, what in ENV_FOLDERS.items():
        value = os.environ.get(name)
        if not value:
            continue
        path = Path(value).expanduser()
        runs.check_utf8(path, name)
        if path.exists() and not path.is_dir():
            raise UserError(f"{name}: {path} is a file; set it to {what}, or unset it")
        if not path.exists() and name not in MADE_FOLDERS:
            raise UserError(f"{name}: {path} does not exist; set it to {what}, or unset it")


def named_files(task: Any) -> list[tuple[str, Path]]:
    """(setting, path) of every file the task's `*_file` settings name, as `load` reads them
    (`$TOOLKIT_DATA` / task.data_dir expanded, `{lang}` as each side's language)."""
    langs = [v for v in (getattr(task, "source_lang", None), getattr(task, "target_lang", None)) if isinstance(v, str)]
    out = []
    for f in dataclasses.fields(task):
        value = getattr(task, f.name)
        if f.name.endswith("_file") and isinstance(value, str) and value:
            names = [value.replace("{lang}", lang) for lang in langs] if "{lang}" in value else [value]
            out += [(f"task.{f.name}", Path(task.expand(n))) for n in names]
    return out


def not_a_file(setting: str, path: Path) -> str:
    """Why a data file a recipe names cannot be read (a pipe: `readers.stream_refused`)."""
    return readers.stream_refused(setting, path) or \
        f"{setting}: {path}: " + ("is not a file" if path.exists() else "no such file")


def hub_name_here(setting: str, value: str) -> str | None:
    """The one line for a Hub data set id (`task.dataset`) that is also a path here, None otherwise:
    `datasets.load_dataset` reads a local folder of that name before the Hub's, so `task.dataset:
    imdb` beside a folder `imdb/` trained on whatever files the folder held (every file whose name
    says `train` joined, `test` read as the eval split), exit 0; a folder `save_to_disk` wrote and
    a local file are no Hub data set (said as one at load, where the Hub was off-line)."""
    path = Path(value).expanduser()
    if not path.exists():
        return None
    if path.is_dir() and any((path / n).is_file() for n in ("dataset_dict.json", "state.json", "dataset_info.json")):
        return (f"{setting}: '{value}' is a folder datasets' save_to_disk wrote ({path.resolve()}), not a Hub data set "
                "id; write each split to JSONL (load_from_disk(...)[split].to_json(...)) and give the files as "
                "task.train_file / task.eval_file")
    if not path.is_dir():
        return (f"{setting}: '{value}' is a file here ({path.resolve()}), and {setting} names a Hub data set "
                "(owner/name); give local files as task.train_file / task.eval_file")
    if not could_be_hub_id(value):  # a path (/data/x, ./x, ~/x, a/b/c): no Hub data set of that name to run from elsewhere
        return (f"{setting}: '{value}' is a local folder ({path.resolve()}), not a Hub data set id (owner/name), "
                "and is not read as one; give its files as task.train_file / task.eval_file")
    return (f"{setting}: '{value}' names a Hub data set, and it is also a folder here ({path.resolve()}), which "
            "datasets reads instead; give local data as task.train_file / task.eval_file, or run from a folder "
            "without it to read the Hub's")


def could_be_hub_id(value: str) -> bool:
    """Whether `value` has a Hub repository id's shape, `name` or `owner/name`, rather than only a
    path's (absolute, `./`, `../`, `~`, or more than one `/`)."""
    return not value.startswith(("/", ".", "~")) and value.rstrip("/").count("/") <= 1


def datasets_builders() -> set[str]:
    """The names `datasets.load_dataset` takes for its own builders (csv, json, parquet, text,
    imagefolder ...): the subpackages of its `packaged_modules`, listed without importing it."""
    import importlib.util

    spec = importlib.util.find_spec("datasets")
    if spec is None or not spec.submodule_search_locations:
        return set()
    folder = Path(next(iter(spec.submodule_search_locations))) / "packaged_modules"
    return {p.name for p in folder.iterdir() if (p / "__init__.py").is_file()} if folder.is_dir() else set()


def builder_named(setting: str, value: str) -> str | None:
    """The one line for a Hub data set id that names one of datasets' builders (`task.dataset:
    json`), None otherwise: `load_dataset("csv")` with no data files reads every file of its kind
    in the working directory whose name says a split (train.csv, validation.csv ...), each later
    split cast to the first one's column types, exit 0; off-line it was "needs the Hub"."""
    if value not in datasets_builders():
        return None
    return (f"{setting}: '{value}' is datasets' builder for local files, not a Hub data set (owner/name); "
            "give the files as task.train_file / task.eval_file (each read and checked on its own)")


def check_data(recipe: Recipe) -> None:
    """The TOOLKIT_* folders are folders, each local data file the task names is there, and its
    header or first record holds the columns / fields the recipe reads, each read for one purpose:
    said in milliseconds, before torch or datasets load (a run, `toolkit validate`, the Python API).
    A Hub data set id the task names (`task.dataset`) is not a path here (`hub_name_here`) nor
    one of datasets' builders (`builder_named`)."""
    check_environment()
    data_dir = getattr(recipe.task, "data_dir", None)
    if data_dir and not tasks.data_root(data_dir).is_dir():  # the recipe's $TOOLKIT_DATA, checked as that is
        path = tasks.data_root(data_dir)
        raise UserError(f"task.data_dir: {path} " + ("is a file" if path.exists() else "does not exist") +
                        "; set it to a folder of data sets (it stands for $TOOLKIT_DATA in the task's paths), "
                        "or remove it")
    hub_id = getattr(recipe.task, "dataset", None)
    if isinstance(hub_id, str) and (builder_named("task.dataset", hub_id) or hub_name_here("task.dataset", hub_id)):
        raise UserError(builder_named("task.dataset", hub_id) or hub_name_here("task.dataset", hub_id))
    for setting, path in named_files(recipe.task):
        if not path.is_file():
            raise UserError(not_a_file(setting, path))
        readers.one_bom_at_most(path)
        readers.one_json_document(path)
    for setting, path, named in recipe.task.head_fields():
        for i, (column, key) in enumerate(named):
            other = next((k for c, k in named[:i] if c == column and k != key), None)
            if other is not None:
                raise UserError(f"{key}: '{column}' is also {other}; a column is read either as "
                                "text or as the label, not both")
        if not path.is_file():
            raise UserError(not_a_file(setting, path))
        names = readers.head_names(path)
        if names is None:
            continue
        kind = "column" if readers.file_format(path, tuple(readers.FORMATS.values())) in ("csv", "tsv") else "field"
        for column, key in named:
            if column not in names:
                raise UserError(f"{path}: {kind} '{column}' is missing (it has: "
                                f"{', '.join(repr(n) for n in names)}); set {key}" + readers.near_name(column, names))


def load(path: str | Path, overrides: list[str] | None = None, smoke: bool = False) -> Recipe:
    """Read, override and check a recipe (see `plan`): the recipe alone, for what hashes, saves
    or reads it; a run needs the whole plan."""
    return plan(path, overrides, smoke).recipe


def plan(path: str | Path, overrides: list[str] | None = None, smoke: bool = False,
         seen: tuple[Path, ...] = ()) -> RunPlan:
    """Read, override and check a recipe, with the runs it chains to. With `smoke`, the recipe as
    written is checked first: a value --smoke would shrink anyway (`train.batch_size=abc`) is
    still an error, and the length as written is kept for the model's position check."""
    path = Path(path)
    raw = apply_overrides(read_yaml(path), overrides or [])
    seen = seen + (path.resolve(),)
    written = settled(parse_plan(raw, name=recipe_name(path), origin=path, seen=seen))
    # `smoke: true` (in the file or `smoke=true`) is --smoke: it swapped in the small random model
    # but kept the full data and steps. Sizing is idempotent: a smoke run's recipe.yaml is the same run
    if smoke or written.recipe.smoke:
        sized = smoke_sized(raw, written.recipe.task, written.recipe.train, written.recipe.method)
        small = settled(parse_plan(sized, name=written.recipe.name, smoke=True, origin=path, seen=seen))
        small.written_max_length = written.recipe.task.max_length
        return small
    if not seen[:-1]:  # the run launched: its chain as run (an upstream's first pass above is not)
        chain.check_smoke(written)
    return written




def settled(plan: RunPlan) -> RunPlan:
    """The plan with what its task leaves to the toolkit decided for its model (`Task.settle`):
    a recipe being launched, never a run's recipe.yaml read back, which says what its run did."""
    recipe, base = plan.recipe, plan.base
    family = models.recipe_family(base.model.checkpoint, recipe.model.warm_start or base.model.warm_start)
    recipe.task.settle(family, recipe.method.trains)
    return plan


def upstream(ref: dict, origin: Path | None, smoke: bool, seen: tuple[Path, ...]) -> RunPlan:
    """The plan of the recipe a `{run: ..., overrides: [...]}` checkpoint names, loaded and checked."""
    for key in ref:
        if key not in chain.KEYS:
            raise UserError(f"model.checkpoint.{key}: unknown key (a run reference has: run, overrides)")
    run, overrides = ref.get("run"), ref.get("overrides") or []
    if not isinstance(run, str):
        raise UserError("model.checkpoint.run: expected the path of a recipe, e.g. "
                        "{run: recipes/pretrain/wikitext-2/minilm-mlm.yaml}")
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        raise UserError("model.checkpoint.overrides: expected a list of key=value strings")
    path = chain.recipe_file(run, origin)
    if path.resolve() in seen:
        raise UserError(f"model.checkpoint.run: {run} leads back to a recipe already in this chain")
    if not path.is_file():
        raise UserError(f"model.checkpoint.run: recipe {run} does not exist")
    try:
        return plan(path, overrides, smoke=smoke, seen=seen)
    except UserError as exc:
        raise UserError(f"model.checkpoint.run ({run}): {exc}") from None
