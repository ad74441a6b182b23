"""One computation, one run id (docs/reliability.md, "A run's identity"): a set-like list in any
order, a derived default written out or left unset, a chained run's upstream however its path is
spelled, are one run id; the shipped recipes keep theirs, and a run made under the id a recipe had
before these canonical forms is still found (finished already, eval, resume)."""

from __future__ import annotations

import dataclasses
import json
import os
import typing
from pathlib import Path

import pytest

import toolkit
from toolkit import attention, methods, recipe as recipes, runs, tasks
from toolkit.recipe_data import ModelConfig, Recipe, TrainConfig
from toolkit.schema import DERIVED, NO_EFFECT, UNORDERED, UNUSED_WHEN

ROOT = Path(__file__).resolve().parent.parent
HASHES = json.loads((ROOT / "tests/data/shipped_recipe_hashes.json").read_text())

# the shipped recipes whose hash the canonical forms change: each writes a derived default out
# (eval_stride: 256 = max_length // 2), so it hashes as the recipes that leave it; their runs made
# before are found under the old id (Recipe.hash_as_before, test below)
WRITES_A_DERIVED_DEFAULT = {"pretrain/ptb/gpt2-clm.yaml", "pretrain/wikitext-2/gpt2-clm.yaml"}

# list fields whose order changes the computation: not hashed sorted
ORDERED = {
    ("task", "ner", "labels"): "tag ids in list order: the head's rows",
    ("task", "text_classification", "labels"): "label ids in list order: the head's rows",
    ("task", "text_classification", "text_columns"): "a text pair, first and second segment",
    ("task", "text_classification", "metrics"): "the first is the main metric (selection)",
    ("method", "icl", "verbalizers"): "one word per label, in label order",
    # every generation task's `generation` block (nested: `<task>.generation`)
    ("task", "generation", "exponential_decay_length_penalty"): "[start, factor]: a pair, not a set",
}


def _settings_classes() -> list[tuple[str, str, type]]:
    """(section, plug-in name, settings class) of every settings class a recipe can hold."""
    found = [("model", "", ModelConfig), ("train", "", TrainConfig)]
    found += [("task", n, tasks.TASKS.get(n, "task")) for n in tasks.TASKS.names()]
    found += [("method", n, methods.METHODS.get(n, "method")) for n in methods.METHODS.names()]
    found += [("attention", n, attention.ATTENTION.get(n, "attention")) for n in attention.ATTENTION.names()]
    nested = []
    for section, name, cls in found:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            for tp in (hints[f.name], *typing.get_args(hints[f.name])):
                if dataclasses.is_dataclass(tp):
                    nested.append((section, f"{name}.{f.name}", tp))
    return found + nested


def _list_fields() -> list[tuple[str, str, type, dataclasses.Field]]:
    out = []
    for section, name, cls in _settings_classes():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if "list[" in str(hints[f.name]):
                out.append((section, name, cls, f))
    return out


def test_shipped_recipe_ids_are_unchanged() -> None:
    """Every shipped recipe, plain and --smoke, hashes as it did before the canonical forms
    (tests/data/shipped_recipe_hashes.json: computed by the toolkit before them), except those that
    write a derived default out, whose hash before is still what finds their runs. The gpt2-clm
    recipes (WikiText-2, PTB) changed on purpose on 2026-11-28 (documents: text, run_clm's reading:
    another computation, another id); their entries are the new ids."""
    paths = sorted(p for p in (ROOT / "recipes").rglob("*.yaml") if not p.name.startswith("_"))
    seen = 0
    for path in paths:
        rel = str(path.relative_to(ROOT / "recipes"))
        for smoke in (False, True):
            key = rel + (" --smoke" if smoke else "")
            if key not in HASHES:  # a recipe shipped since
                continue
            seen += 1
            recipe = recipes.load(path, [], smoke=smoke)
            assert recipe.hash_as_before == HASHES[key], key
            assert (recipe.hash == HASHES[key]) is (rel not in WRITES_A_DERIVED_DEFAULT), key
    assert seen > 300


def test_every_list_field_is_declared_set_like_or_ordered() -> None:
    """A list field is hashed sorted (schema.UNORDERED) or named here with why its order matters:
    a new list field is classified, not left to hash its spelling."""
    for section, name, _, f in _list_fields():
        key = (section, "generation" if name.endswith(".generation") else name, f.name)
        assert bool(f.metadata.get(UNORDERED)) != (key in ORDERED), key


def _raw(section: str, name: str, field: str, value: object) -> dict:
    raw = {"model": {"checkpoint": "some/model"}, "task": {"name": "glue", "subset": "sst2"}, "method": {"name": "full"}, "train": {}}
    if section in ("task", "method"):
        raw[section] = {"name": name, field: value}
    else:
        raw[section][field] = value
    return raw


def _two(tp: typing.Any) -> list:
    (inner,) = typing.get_args([a for a in typing.get_args(tp) if a is not type(None)][0]
                               if typing.get_origin(tp) is not list else tp)
    if typing.get_origin(inner) is typing.Literal:
        return list(typing.get_args(inner))[:2]
    return [7, 3] if inner is int else ["value", "query"]


@pytest.mark.parametrize("where", [(s, n, f.name) for s, n, _, f in _list_fields()
                                   if f.metadata.get(UNORDERED) and NO_EFFECT not in f.metadata],
                         ids=lambda w: ".".join(p for p in w if p))
def test_a_set_like_list_in_any_order_is_one_run_id(where: tuple[str, str, str]) -> None:
    """Finding: `method.target_modules: [value, query]` and `[query, value]` (PEFT takes a set), or
    `train.length_buckets` in another order, were two run ids of one computation: the second
    trained again. Now hashed sorted; another set is another id."""
    section, name, field = where
    cls = next(c for s, n, c in _settings_classes() if (s, n) == (section, name))
    items = _two(typing.get_type_hints(cls)[field])
    one, other, fewer = (recipes.built(_raw(section, name, field, v)) for v in (items, items[::-1], items[:1]))
    assert one.hash == other.hash
    assert one.hash != fewer.hash
    assert one.hash_as_before != other.hash_as_before  # as before: written order hashed
    assert getattr(getattr(other, section), field) == items[::-1]  # recipe.yaml keeps it as written


def _derived_fields() -> list[tuple[str, str, str]]:
    return [(s, n, f.name) for s, n, c in _settings_classes() for f in dataclasses.fields(c) if DERIVED in f.metadata]


def test_every_derived_default_is_declared() -> None:
    assert {(s, f) for s, _, f in _derived_fields()} >= {("train", "eval_batch_size"), ("train", "pad_multiple"),
                                                         ("task", "eval_stride"), ("task", "max_new_tokens")}


# what a derived default needs to be known from the recipe: unset pad_multiple is 1 only where the
# step is eager for sure (compile: auto decides on the device, so there 1 stays hashed as written)
DERIVED_GIVEN = {("train", "pad_multiple"): {"compile": False}}


def _derived_raw(section: str, name: str, field: str, value: object) -> dict:
    task, _, block = name.partition(".")
    if block:
        return _raw("task", task, block, {} if value is None else {field: value})
    raw = _raw(section, name, field, value)
    if section == "train":
        raw["train"] = {**DERIVED_GIVEN.get((section, field), {}), **({} if value is None else {field: value})}
    return raw


@pytest.mark.parametrize("where", _derived_fields(), ids=lambda w: ".".join(p for p in w if p))
def test_a_derived_default_written_out_is_one_run_id(where: tuple[str, str, str]) -> None:
    """Finding: `train.eval_batch_size: 64` beside `batch_size: 32` (unset: twice the batch),
    clm's `eval_stride: 256` beside `max_length: 512` (unset: half of it), or a generation task's
    `generation.max_new_tokens` equal to its `max_target_length` (unset: that), was another run id
    of the run that leaves it unset. Now hashed as unset; another value is another id."""
    section, name, field = where
    unset = recipes.built(_derived_raw(section, name, field, None))
    holder, settings = None, getattr(unset, section)
    if "." in name:
        holder, settings = settings, getattr(settings, name.partition(".")[2])
    f = next(f for f in dataclasses.fields(settings) if f.name == field)
    value = f.metadata[DERIVED](settings, holder)
    assert isinstance(value, int), where
    written, other = (recipes.built(_derived_raw(section, name, field, v)) for v in (value, value + 1))
    assert written.hash == unset.hash
    assert other.hash != unset.hash
    assert written.hash_as_before != unset.hash_as_before
    if (section, field) in DERIVED_GIVEN:  # without what makes it known: hashed as written
        without = {**_raw(section, name, field, value), "train": {field: value}}
        assert recipes.built(without).hash != recipes.built({**without, "train": {}}).hash


@pytest.mark.parametrize("where", [(s, n, f.name) for s, n, c in _settings_classes() for f in dataclasses.fields(c)
                                   if UNUSED_WHEN in f.metadata], ids=lambda w: ".".join(p for p in w if p))
def test_a_setting_that_is_not_read_is_one_run_id(where: tuple[str, str, str]) -> None:
    """Finding: `train.epochs` beside `train.max_steps` (which sets the schedule alone, as
    Trainer's max_steps overrides num_train_epochs) is never read, yet `epochs: 5` and `epochs: 3`
    with one max_steps were two run ids of one computation. Hashed as its default there; where
    it is read, another value is another id. --smoke (which writes max_steps itself) keeps it."""
    assert where == ("train", "", "epochs")  # the one such field today; a new one: add its case here
    at = lambda **train: recipes.built({**_raw("train", "", "epochs", 3.0), "train": train}).hash  # noqa: E731
    assert at(max_steps=10, epochs=5.0) == at(max_steps=10) == at(max_steps=10, epochs=1.0)
    assert at(max_steps=10) != at(max_steps=11)
    assert at(epochs=5.0) != at()
    smoke = [recipes.built({**_raw("train", "", "epochs", 3.0), "train": {"max_steps": 4, "epochs": e}}, smoke=True)
             for e in (1.0, 5.0)]
    assert smoke[0].hash != smoke[1].hash  # as before: the smoke ids of the recipes stay


# the settings that cannot change a run's result (model/, scores, what its finished folder holds),
# hashed as their default (schema.NO_EFFECT): two values each, and what else makes them matter
NO_EFFECT_VALUES = {
    "report_to": (["tensorboard"], [], "trackers are told the metrics; no number depends on them"),
    "log_every": (1, 50, "how often the loss is logged"),
    "save_every": (5, 0, "step checkpoints a stop resumes from; a finished run keeps model/ alone"),
    "save_total_limit": (3, 1, "how many step checkpoints; a finished run keeps model/ alone"),
    "data_dir": ("/elsewhere/data", None, "its files are in the id by contents, named relative to it"),
}
# where a NO_EFFECT setting does change what a run leaves: there it is hashed (its train settings)
MATTERS_WITH = {"save_every": {"keep_checkpoints": True}, "save_total_limit": {"keep_checkpoints": True}}


def _shipped_of_task(name: str) -> Recipe:
    """A recipe of task `name` as a shipped one sets it up (what it requires written)."""
    for path in sorted((ROOT / "recipes").rglob("*.yaml")):
        if not path.name.startswith("_") and f"name: {name}" in path.read_text():
            recipe = recipes.built(recipes.read_yaml(path))
            if recipe.task.name == name:
                return recipe
    raw = _raw("task", name, "max_length", 128)
    return recipes.built({**raw, "task": {**raw["task"], **({"subset": "sst2"} if name == "glue" else {})}})


def _no_effect_fields() -> list[tuple[str, str, str]]:
    return [(s, n, f.name) for s, n, c in _settings_classes() for f in dataclasses.fields(c) if NO_EFFECT in f.metadata]


def test_every_setting_without_effect_is_named() -> None:
    """Every NO_EFFECT field is one of those named here with why (a new one is argued, not slipped in)."""
    assert {f for _, _, f in _no_effect_fields()} == set(NO_EFFECT_VALUES)
    assert {n for s, n, f in _no_effect_fields() if f == "data_dir"} == set(tasks.TASKS.names())


@pytest.mark.parametrize("where", _no_effect_fields(), ids=lambda w: ".".join(p for p in w if p))
def test_a_setting_that_cannot_change_the_result_is_one_run_id(where: tuple[str, str, str]) -> None:
    """Finding: `train.report_to: [wandb]` (trackers), `log_every`, `save_every` / `save_total_limit`
    of a run that keeps no step checkpoint, and `task.data_dir` (whose files are hashed by their
    contents) change no model and no score, yet each value was a run id of its own: the same
    computation trained again, a sweep's "finished already" missed it. Now hashed as the default;
    the hash before (which finds runs made then) keeps them."""
    section, name, field = where
    one, other, _ = NO_EFFECT_VALUES[field]
    if section == "task":  # a task of each kind as a shipped recipe sets it up (some need a subset)
        shipped = _shipped_of_task(name)
        at = [dataclasses.replace(shipped, task=dataclasses.replace(shipped.task, **{field: v})) for v in (one, other)]
    else:
        at = [recipes.built(_raw(section, name, field, v)) for v in (one, other)]
    assert at[0].hash == at[1].hash, where
    assert at[0].hash_as_before != at[1].hash_as_before, where
    if field in MATTERS_WITH:
        kept = [recipes.built({**_raw(section, name, field, v), "train": {field: v, **MATTERS_WITH[field]}})
                for v in (one, other)]
        assert kept[0].hash != kept[1].hash


def _data_spellings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], str]:
    """One file of $TOOLKIT_DATA spelled seven ways (the working directory a sibling of the data
    root's parent), and the canonical form."""
    data = Path(os.environ["TOOLKIT_DATA"])
    rel = "glue/RTE/dev.tsv"
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to(data / "glue/RTE")
    monkeypatch.chdir(tmp_path / "elsewhere")
    monkeypatch.setenv("HERE", str(data))
    spellings = [f"$TOOLKIT_DATA/{rel}", f"${{TOOLKIT_DATA}}/{rel}", str(data / rel),
                 os.path.relpath(data / rel), "$TOOLKIT_DATA/glue/./RTE/../RTE/dev.tsv", f"$HERE/{rel}",
                 str(tmp_path / "link/dev.tsv")]
    return spellings, f"$TOOLKIT_DATA/{rel}"


MINILM = {"checkpoint": "nreimers/MiniLM-L6-H384-uncased"}
OWN_DATA = {"name": "text_classification", "train_file": "$TOOLKIT_DATA/glue/RTE/train.tsv",
            "text_columns": ["sentence1", "sentence2"], "label_column": "label"}


def test_a_data_file_spelled_any_way_is_one_run_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding (the data file rule): `task.eval_file: $TOOLKIT_DATA/glue/RTE/dev.tsv`, the same file
    by its absolute path, by a path relative to another working directory, through `..`, another
    variable or a symbolic link to its folder, were hashed as spelled: one computation, as many run
    ids as spellings (`make run` from another folder trained again). Now `$TOOLKIT_DATA/<path>` for
    a file under the data root, the same on every machine, and recipe.yaml holds it; a file outside
    it is its absolute path. Another file is another id, and the hash before keeps each spelling
    (runs made then are found)."""
    spellings, form = _data_spellings(tmp_path, monkeypatch)
    plan = lambda **task: recipes.parse_plan({"model": MINILM, "method": {"name": "full"},  # noqa: E731
                                              "task": {**OWN_DATA, **task}}, name="d").recipe
    loaded = [plan(eval_file=spelled) for spelled in spellings]
    assert {r.task.eval_file for r in loaded} == {form}
    assert {runs.run_id(r, 1, "none") for r in loaded} == {runs.run_id(loaded[0], 1, "none")}
    assert len({r.hash_as_before for r in loaded}) == len(spellings)
    assert runs.run_ids(loaded[2], 1, "none")[-1] != runs.run_id(loaded[2], 1, "none")  # a run made then: found
    rooted = plan(eval_file=spellings[2], data_dir=os.path.relpath(os.environ["TOOLKIT_DATA"]))
    assert rooted.task.eval_file == form and rooted.hash == loaded[0].hash
    assert rooted.task.data_dir == os.environ["TOOLKIT_DATA"]  # recipe.yaml: found from anywhere
    outside = tmp_path / "dev.tsv"
    outside.write_bytes(Path(os.environ["TOOLKIT_DATA"], "glue/RTE/dev.tsv").read_bytes())
    copy = plan(eval_file="../dev.tsv")
    assert copy.task.eval_file == str(outside) and copy.hash != loaded[0].hash
    assert plan(eval_file="$TOOLKIT_DATA/glue/RTE/train.tsv").hash != loaded[0].hash
    for made in (copy, loaded[3], rooted):  # recipe.yaml, read back from anywhere, hashes as the run did
        assert recipes.built(made.to_dict()).hash == made.hash


def test_a_data_root_spelled_any_way_is_one_run_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GLUE reads its folder under `task.data_dir` (else $TOOLKIT_DATA): the root unset, written as
    $TOOLKIT_DATA, absolute, relative or through a link is one run id (its files are in the id by
    their contents); a root holding other data is another id."""
    data = Path(os.environ["TOOLKIT_DATA"])
    spellings, _ = _data_spellings(tmp_path, monkeypatch)
    (tmp_path / "root").symlink_to(data)
    plan = lambda **task: recipes.parse_plan({"model": MINILM, "method": {"name": "full"},  # noqa: E731
                                              "task": {"name": "glue", "subset": "rte", **task}}, name="g").recipe
    ids = {runs.run_id(plan(**({"data_dir": d} if d else {})), 1, "none")
           for d in (None, "$TOOLKIT_DATA", str(data), os.path.relpath(data), str(tmp_path / "root"))}
    assert len(ids) == 1
    other = tmp_path / "other" / "glue" / "RTE"
    other.mkdir(parents=True)
    for name in ("train.tsv", "dev.tsv"):
        (other / name).write_text((data / "glue/RTE" / name).read_text()[:2000].rsplit("\n", 1)[0] + "\n")
    assert runs.run_id(plan(data_dir=str(tmp_path / "other")), 1, "none") not in ids


def test_train_metric_naming_the_main_metric_is_one_run_id_for_every_task() -> None:
    """`train.metric` unset selects on the task's main metric: written as that, one run id."""
    done = set()
    for path in sorted((ROOT / "recipes").rglob("*.yaml")):
        if path.name.startswith("_"):
            continue
        recipe = recipes.load(path)
        if recipe.task.name in done or not recipe.method.trains:
            continue
        done.add(recipe.task.name)
        main = recipe.task.main_metric()
        written = dataclasses.replace(recipe, train=dataclasses.replace(recipe.train, metric=main))
        assert written.hash == recipe.hash, path
        names = [n for n in recipe.task.metric_names() if n != main]
        if names:
            other = dataclasses.replace(recipe, train=dataclasses.replace(recipe.train, metric=names[-1]))
            assert other.hash != recipe.hash, path
    assert done >= set(tasks.TASKS.names()) - {"text_classification"}


def test_smoke_keeps_the_sizes_it_writes_hashed() -> None:
    """--smoke always writes train.eval_batch_size (16 over a batch of 8): both spellings are one
    already there, and the smoke ids of every recipe stay (the shipped-ids test covers them)."""
    recipe = recipes.load(ROOT / "recipes/demo/sst2/minilm-lora.yaml", smoke=True)
    assert recipe.train.eval_batch_size == 2 * recipe.train.batch_size
    assert recipe.hashed_dict()["train"]["eval_batch_size"] == 16


def _chained(tmp_path: Path, name: str, ref: dict) -> Path:
    base = ROOT / "recipes/demo/sst2/minilm-full.yaml"
    path = tmp_path / f"{name}.yaml"
    path.write_text(json.dumps({"extends": str(base), "name": "chained", "model": {"checkpoint": ref}}))
    return path


def test_a_chained_reference_spelled_any_way_is_one_run_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding: `{run: recipes/pretrain/...}`, the same file by its absolute path, `./recipes/...`,
    a path through a symbolic link or with an empty `overrides: []` were hashed as spelled: one
    fine-tuning of one upstream run had as many run ids as spellings. Now the reference is hashed
    in one form (chain.canonical), that of the shipped recipes, and recipe.yaml holds it."""
    monkeypatch.chdir(ROOT)
    rel = "recipes/pretrain/wikitext-2/minilm-mlm.yaml"
    (tmp_path / "link").symlink_to(ROOT / "recipes/pretrain")
    spellings = [{"run": rel}, {"run": str(ROOT / rel)}, {"run": "./" + rel}, {"run": rel, "overrides": []},
                 {"run": str(tmp_path / "link/wikitext-2/minilm-mlm.yaml")},
                 {"run": "$HERE/" + rel}]
    monkeypatch.setenv("HERE", str(ROOT))
    shipped = recipes.load(ROOT / "recipes/demo/sst2/minilm-full-from-wikitext.yaml")
    for smoke in (False, True):
        loaded = [recipes.load(_chained(tmp_path, f"c{i}", ref), smoke=smoke) for i, ref in enumerate(spellings)]
        ids = {runs.run_id(r, 1, "none") for r in loaded}
        assert len(ids) == 1, [r.checkpoint_as_written for r in loaded]
        assert {r.model.checkpoint["run"] for r in loaded} == {rel}
        if not smoke:
            assert loaded[0].hash == shipped.hash  # the shipped spelling is the one form
    other = recipes.load(_chained(tmp_path, "o", {"run": rel, "overrides": ["train.seed=3"]}))
    assert runs.run_id(other, 1, "none") not in ids


def test_a_local_base_folder_spelled_any_way_is_one_run_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            tiny_checkpoint) -> None:
    """Finding: `model.checkpoint` naming one local folder as `base`, `./base/`, its absolute path,
    `~/...`, a symbolic link, or an earlier run's folder for its `model/`, was hashed as spelled:
    as many run ids as spellings of one base. Now the folder's absolute path (recipe.yaml holds
    it); a Hub id is hashed as written, and another folder is another id."""
    import shutil

    base = Path(shutil.copytree(tiny_checkpoint("bert"), tmp_path / "run" / "abc" / "model"))
    (tmp_path / "link").symlink_to(base)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    spellings = ["run/abc/model", "./run/abc/model/", str(base), "~/run/abc/model", "link", "run/abc", str(tmp_path / "run/abc")]
    raw = "task: {name: glue, subset: sst2, max_length: 32}\nmethod: {name: lora}\n"
    loaded = []
    for i, spelled in enumerate(spellings):
        path = tmp_path / f"r{i}.yaml"
        path.write_text(f"name: one\nmodel: {{checkpoint: '{spelled}'}}\n{raw}")
        loaded.append(recipes.load(path))
    assert {r.hash for r in loaded} == {loaded[0].hash}, [r.checkpoint_as_written for r in loaded]
    assert {r.model.checkpoint for r in loaded} == {str(base.resolve())}
    assert len({r.hash_as_before for r in loaded}) == len(spellings)  # as before: one id per spelling
    other = Path(shutil.copytree(base, tmp_path / "other"))
    (tmp_path / "o.yaml").write_text(f"name: one\nmodel: {{checkpoint: '{other}'}}\n{raw}")
    assert recipes.load(tmp_path / "o.yaml").hash != loaded[0].hash


def _trained_before(runs_dir: Path, monkeypatch: pytest.MonkeyPatch, overrides: list[str], form: str = "before") -> Path:
    """A run made by the toolkit before the canonical forms (its hash as written: hash_as_before),
    or under the first ones (hash_as_first_forms: before the data files' form and NO_EFFECT)."""
    with monkeypatch.context() as then:
        then.setattr(Recipe, "hash", getattr(Recipe, "hash_as_" + ("before" if form == "before" else "first_forms")))
        return toolkit.run("demo/sst2/minilm-lora", overrides, runs_dir=runs_dir, smoke=True).dir


@pytest.mark.parametrize("form", ["before", "first"])
def test_a_run_made_under_its_old_id_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli, form: str) -> None:
    """The constraint: a recipe that hashes otherwise now (its target_modules in another order than
    sorted, before the canonical forms; and its log_every, under the first ones) finds the run made
    under its old id: `run` says it is finished already (not trained again beside it), `eval`
    takes its recipe.yaml as the one it was made with, and a chain or a resume looks in the same
    folder (runs.run_dir)."""
    short = ["task.max_train_samples=8", "task.max_eval_samples=8", "train.max_steps=1",
             *(["train.log_every=5"] if form == "first" else []), "method.target_modules=[value, query]"]
    old = _trained_before(tmp_path / "runs", monkeypatch, short, form)
    recipe = recipes.load(ROOT / "recipes/demo/sst2/minilm-lora.yaml", short, smoke=True)
    assert old.name != runs.run_id(recipe) and old.name in runs.run_ids(recipe)
    assert runs.run_dir(recipe, tmp_path / "runs") == old
    code, out, err = cli("run", "demo/sst2/minilm-lora", *short, "--smoke", "--runs-dir", tmp_path / "runs")
    assert code == 0 and "finished already" in out, (out, err)
    assert sorted(p.name for p in old.parent.iterdir()) == [old.name]
    code, out, err = cli("eval", old)
    assert code == 0, err
    # a new run (no folder of either id yet) goes under the canonical id
    fresh = recipes.load(ROOT / "recipes/demo/sst2/minilm-lora.yaml", [*short[:-1], "train.seed=5"], smoke=True)
    assert runs.run_dir(fresh, tmp_path / "runs").name == runs.run_id(fresh)
    assert os.environ.get("TOOLKIT_CACHE")


@pytest.mark.parametrize("method", ["full", "lora"])
def test_a_finished_run_is_finished_only_on_its_base_as_it_is(tmp_path: Path, cli, tiny_checkpoint, method: str) -> None:
    """The reverse defect: two computations under one run id. The id names a base folder, not its
    files: the base trained or edited again (its config's dropout, its tokenizer's ids) and the
    same recipe launched was "finished already", its metrics of the earlier base, exit 0 (a
    chained run's changed upstream was one line already). Now `run` and `sweep` (its --dry-run
    too) refuse it in one line, nothing written; the unchanged base, and a copy of it with new
    file times, is finished already; --force trains on the base as it is."""
    import shutil

    base = Path(shutil.copytree(tiny_checkpoint("bert"), tmp_path / "base"))
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"model: {{checkpoint: {base}}}\n"
                      "task: {name: glue, subset: sst2, max_length: 32, max_train_samples: 8, max_eval_samples: 8}\n"
                      f"method: {{name: {method}}}\ntrain: {{max_steps: 1, batch_size: 4}}\n")
    root = tmp_path / "runs"
    code, out, err = cli("run", recipe, "--runs-dir", root)
    assert code == 0, err
    copied = Path(shutil.copytree(base, tmp_path / "copy"))  # the same bytes, new file times
    shutil.rmtree(base)
    copied.rename(base)
    code, out, err = cli("run", recipe, "--runs-dir", root)
    assert code == 0 and "finished already" in out, err
    config = json.loads((base / "config.json").read_text())
    (base / "config.json").write_text(json.dumps({**config, "hidden_dropout_prob": 0.3}))
    listing = sorted(str(p) for p in root.rglob("*"))
    for args in (["run", recipe], ["sweep", recipe, "train.seed=42,43"], ["sweep", recipe, "train.seed=42,43", "--dry-run"]):
        code, out, err = cli(*args, "--runs-dir", root)
        assert code == 2 and "config.json changed since" in err and "--force" in err, (args, err)
        assert len(err.strip().splitlines()) == 1, err
    assert sorted(str(p) for p in root.rglob("*")) == listing
    code, out, err = cli("run", recipe, "--runs-dir", root, "--force")
    assert code == 0, err
    code, out, err = cli("run", recipe, "--runs-dir", root)
    assert code == 0 and "finished already" in out, err


def test_a_run_records_its_base_as_it_started_on_it(tmp_path: Path, cli, tiny_checkpoint) -> None:
    """metrics.json base_weights was taken when the run finished: a base folder trained again
    while a full fine-tune ran (its weights are not a lean checkpoint's, so the resume went on)
    was recorded as the new one, the finished run was "finished already" on it and a report pooled
    it with the new base's seeds, exit 0. The record is taken as the run starts, kept in its
    checkpoints, so a stop and a resume keep it too."""
    import shutil

    base = Path(shutil.copytree(tiny_checkpoint("bert"), tmp_path / "base"))
    started = runs.base_record(str(base), ("*.safetensors",))["files"]["model.safetensors"][2]
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"model: {{checkpoint: {base}}}\n"
                      "task: {name: glue, subset: sst2, max_length: 32, max_train_samples: 8, max_eval_samples: 8}\n"
                      "method: {name: full}\ntrain: {max_steps: 2, batch_size: 4, save_every: 1}\n")
    root = tmp_path / "runs"
    code, out, err = cli("run", recipe, "--runs-dir", root, "--stop-after", 1)
    assert code == 0, err
    weights = base / "model.safetensors"
    kept = weights.read_bytes()
    weights.write_bytes(kept[:-1] + bytes([kept[-1] ^ 1]))  # the base trained again meanwhile
    code, out, err = cli("run", recipe, "--runs-dir", root)
    assert code == 0, err
    (metrics,) = [json.loads(p.read_text()) for p in root.rglob("metrics.json")]
    assert metrics["base_weights"]["files"]["model.safetensors"][2] == started
    code, out, err = cli("run", recipe, "--runs-dir", root)
    assert code == 2 and "model.safetensors changed since" in err, err


def test_one_computation_is_found_from_every_entry_point_however_spelled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                        cli) -> None:
    """The issue's case end to end: a run made through the API with its data file as
    `$TOOLKIT_DATA/...`, then launched from another working directory with the file by a relative
    path, with `train.log_every` and `train.report_to` set (CLI `run`, which `make run` calls), by
    its absolute path (`sweep`, the API): each is "finished already", one run folder, and its
    recipe.yaml (which names the file as `$TOOLKIT_DATA/...`) is evaluated from there."""
    data = Path(os.environ["TOOLKIT_DATA"]) / "glue/RTE/dev.tsv"
    short = ["task.max_train_samples=8", "task.max_eval_samples=8", "train.max_steps=1"]
    made = toolkit.run("demo/own-data/minilm-lora", [*short, "task.eval_file=$TOOLKIT_DATA/glue/RTE/dev.tsv"],
                       runs_dir=tmp_path / "runs", smoke=True).dir
    assert "eval_file: $TOOLKIT_DATA/glue/RTE/dev.tsv" in (made / "recipe.yaml").read_text()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    runs_dir = tmp_path / "runs"
    code, out, err = cli("run", "demo/own-data/minilm-lora", *short, f"task.eval_file={os.path.relpath(data)}",
                         "train.log_every=1", "train.report_to=[tensorboard]", "--smoke", "--runs-dir", runs_dir)
    assert code == 0 and f"{made} is finished already" in out, (out, err)
    assert f"note: {made} was made with train.log_every 10 (now 1); train.report_to [] (now ['tensorboard'])" in err
    code, out, err = cli("sweep", "demo/own-data/minilm-lora", *short, f"task.eval_file={data}", "train.seed=42",
                         "--smoke", "--runs-dir", runs_dir)
    assert code == 0 and f"{made} is finished already" in out, (out, err)
    again = toolkit.run("demo/own-data/minilm-lora", [*short, f"task.eval_file={data}", "train.log_every=3"],
                        runs_dir=runs_dir, smoke=True)
    assert again.dir == made
    assert [p.name for p in made.parent.iterdir()] == [made.name]
    code, out, err = cli("eval", made)
    assert code == 0, err


@pytest.mark.parametrize("task", ["squad", "clm"])
def test_rescoring_knows_the_runs_own_file_however_an_override_spells_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                          task: str) -> None:
    """A run's recipe.yaml names its files in one form (`$TOOLKIT_DATA/...`); `toolkit eval RUN
    task.X_file=<the same file by a relative or absolute path>` is the run's own file. SQuAD with
    another split_seed: its articles drawn otherwise (some the run trained on scored as held out),
    one line naming split_seed, as for the same spelling; clm on its own train file: scored as the
    run held it out, no refusal. Compared as written, the other spelling was taken for another file
    (SQuAD: another line; clm: refused as another train file)."""
    data = Path(os.environ["TOOLKIT_DATA"])
    made_file, key, draw = {"squad": ("squad/v1.1/dev-v1.1.json", "eval_file", {"split_articles": 0.2}),
                            "clm": ("lm/wikitext-2/valid.txt", "train_file", {})}[task]
    made = dataclasses.replace(_shipped_of_task(task).task, **{key: f"$TOOLKIT_DATA/{made_file}"}, **draw)
    if task == "clm":
        made = dataclasses.replace(made, eval_file=None, dataset=None)
    monkeypatch.chdir(tmp_path)
    for spelled in (f"$TOOLKIT_DATA/{made_file}", os.path.relpath(data / made_file), str(data / made_file)):
        if task == "squad":
            asked = dataclasses.replace(made, **{key: spelled}, split_seed=7)
            with pytest.raises(toolkit.UserError, match="^task.split_seed: the run split"):
                asked.rescoring(made, {f"task.{key}", "task.split_seed"})
        else:
            dataclasses.replace(made, **{key: spelled}).rescoring(made, {f"task.{key}"})
