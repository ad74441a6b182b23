"""Reports from run folders alone: tables, pivots, notes and plots, written as report.md.

Nothing is re-run: every number comes from a run's metrics.json, recipe.yaml and log.jsonl.
Runs of one setting that differ only in seed are one entry: mean ± sample standard deviation
over seeds with the count n shown, so a comparison says how much of a gap is noise. Each metric
is shown at the scale and with the direction its task declared (BLEU and perplexity are not
percentages). When a pivot cell holds several settings (a learning-rate grid), the best on the
cell's metric is reported and the grid is listed beside it. Written by hand: no library builds
pivot tables of seeded runs with declared metric directions.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from toolkit import recipe as recipes, runs as run_folders
from toolkit.errors import UserError
from toolkit.registry import did_you_mean
from toolkit.recipe_data import SECTION_NAMES, safe_yaml
from toolkit.methods import METHODS
from toolkit.tasks import TASKS, Metric, declaration, is_test_source
from toolkit.tasks._generation import BEFORE as GENERATION_BEFORE

LABELS = ("task", "method", "model", "run")
SECTIONS = SECTION_NAMES


# --- collecting ------------------------------------------------------------------------------
# Fields added to recipes after runs were made, with the value those older runs had in effect:
# a run whose recipe.yaml lacks one ran that way, and is reported so (not as "None").
# A value is a constant, or a function of the run's metrics.json where the value in effect
# depended on the device. Fields whose value then is the default now are listed too: left out, a
# run from before them was another setting than a new seed of the same recipe ("train.compile=None"
# beside "auto"), and a pivot cell picked the better of the two as a grid's best, exit 0.
BEFORE_FIELD: dict[tuple[str, str], Any] = {
    ("train", "fast_dropout"): False,  # torch's dropout until 2026-11-23
    ("model", "warm_start"): None,  # none until 2026-11-22 16:15
    ("train", "skip_nonfinite"): 0,  # none skipped until 2026-11-22 16:36
    # until 2026-11-26 17:17 no step was compiled and a batch padded to its longest text: what
    # `auto` does on a CPU, and `false` (with pad_multiple unset: 1 when not compiled) elsewhere
    ("train", "compile"): lambda m: ("auto" if str(m.get("device")).startswith("cpu") else False) if m.get("device") else None,
    ("train", "pad_multiple"): None,
    ("train", "length_buckets"): [],
    ("train", "precision_mode"): "autocast",  # bf16 was autocast over fp32 weights until 2026-11-26 18:14
    ("train", "compile_optimizer"): "auto",  # never compiled until 2026-11-27 09:11; auto is off
    # the tokenizer's own pair encoding (a classifier's; null where a launch leaves it unset)
    ("task", "pair_separator"): None,
    # a translation's language codes (task source_code / target_code), unset until 2026-11-27 23:23
    # (their declared `neutral`). Every field added with schema.added belongs here with its neutral
    # value: tests/test_report.py checks each one
    ("task", "source_code"): None,
    ("task", "target_code"): None,
    ("task", "line_by_line"): False,  # pretraining documents always packed into blocks until 2026-11-28
    ("method", "train_layer_norms"): False,  # Houlsby's LayerNorms frozen until 2026-11-28
    ("method", "rank_pattern"): {}, ("method", "alpha_pattern"): {},  # LoRA/DoRA per-layer ranks from 2026-11-28
}


# Fields added inside a nested settings block, with the value a run made before them had in
# effect, from the block: the generation settings a recipe leaves to the checkpoint since
# 2026-11-28 were cleared (the length and repetition constraints) or pinned (early_stopping true
# under beam search) before (`_generation.BEFORE`, which eval, predict and export read old runs by)
BEFORE_NESTED: dict[tuple[str, str, str], Any] = {("task", "generation", name): before
                                                   for name, before in GENERATION_BEFORE.items()}


def _declares(section: str, name: Any, key: str) -> bool:
    """Whether the task or method a recipe section names has the field `key` (a method's own
    field, Houlsby's train_layer_norms, is no setting of a LoRA run: set there, every LoRA entry's
    label read "train_layer_norms False"); a section naming none, or another section: yes."""
    registry = {"task": TASKS, "method": METHODS}.get(section)
    if registry is None or not isinstance(name, str) or name not in registry.names():
        return True
    return any(f.name == key for f in dataclasses.fields(registry.get(name)))


def with_old_defaults(recipe: dict, metrics: dict | None = None) -> dict:
    """`recipe` with each BEFORE_FIELD it lacks set to the value its run had in effect (a value
    that depends on the device: left out where metrics.json does not say the device), and each
    BEFORE_NESTED field its block lacks."""
    for (section, key), value in BEFORE_FIELD.items():
        if isinstance(recipe.get(section), dict) and key not in recipe[section] \
                and _declares(section, recipe[section].get("name"), key):
            value = value(metrics or {}) if callable(value) else value
            if value is not None or not callable(BEFORE_FIELD[(section, key)]):
                recipe[section][key] = json.loads(json.dumps(value))  # a list of its own per run
    for (section, name, key), before in BEFORE_NESTED.items():
        block = recipe.get(section, {}).get(name) if isinstance(recipe.get(section), dict) else None
        if isinstance(block, dict) and key not in block:
            block[key] = before(block) if callable(before) else before
    return recipe


def data_from_run_id(items: list[dict]) -> None:
    """A run from before metrics.json recorded `data_sha256` (2026-11-27) ran on data that its run
    id still says: the id hashes the recipe's hash, the process count and that same fingerprint
    (runs.run_id). Each such run takes the fingerprint of another run's that its id proves (an
    exact check, not a guess); one that no fingerprint proves stays unknown. Unknown, its seeds
    were another setting than new seeds of the same recipe on the same data: a pivot cell chose
    the "best" of them as if a grid, exit 0."""
    known = sorted({i["metrics"]["data_sha256"] for i in items if i["metrics"].get("data_sha256")})
    for item in items:
        m = item["metrics"]
        if m.get("data_sha256") or not m.get("recipe_hash") or not _is_number(m.get("num_processes")):
            continue
        run_id = m.get("run_id") or item["run"].name
        upstream = f"|{Path(m['base_run']).name}" if m.get("base_run") else ""
        for data in known:
            blob = f"{m['recipe_hash']}|{int(m['num_processes'])}|{data}{upstream}"
            if hashlib.sha256(blob.encode()).hexdigest()[:12] == run_id:
                m["data_sha256"] = data
                break


def hub_from_fingerprint(items: list[dict]) -> None:
    """A Hub data set's record (metrics.json hub_data: each split's datasets fingerprint, and since
    2026-11-28 a hash of its examples after a space, runs.hub_split_parts). A split recorded by
    its fingerprint alone takes the examples' hash another run recorded beside that same
    fingerprint (one revision is one set of examples: an exact proof, not a guess), so seeds
    from before the hash join new seeds on the same revision; one that none proves stays apart."""
    known = {}
    for item in items:
        for name, splits in (item["metrics"].get("hub_data") or {}).items():
            for split, value in (splits if isinstance(splits, dict) else {}).items():
                fingerprint, content = run_folders.hub_split_parts(value)
                if content:
                    known[(name, split, fingerprint)] = content
    for item in items:
        for name, splits in (item["metrics"].get("hub_data") or {}).items():
            for split, value in (splits if isinstance(splits, dict) else {}).items():
                fingerprint, content = run_folders.hub_split_parts(value)
                if not content and (name, split, fingerprint) in known:
                    splits[split] = f"{fingerprint} {known[(name, split, fingerprint)]}"


def hub_examples(metrics: dict) -> str | None:
    """What a run's Hub data sets held (metrics.json hub_data): a short hash over each split's
    examples (content hash; its datasets fingerprint where no content hash is known), so a new
    revision with the same rows is the same data and another one is not; None: no Hub data."""
    record = metrics.get("hub_data")
    if not isinstance(record, dict) or not record:
        return None
    def examples(value: Any) -> str:
        fingerprint, content = run_folders.hub_split_parts(value)
        return content or "revision " + fingerprint

    seen = {name: {split: examples(value) for split, value in splits.items()} if isinstance(splits, dict)
            else str(splits) for name, splits in record.items()}
    return hashlib.sha256(json.dumps(seen, sort_keys=True).encode()).hexdigest()[:12]


NUMBER = "a number"
# The fields of metrics.json the report reads, and the JSON type each has when present (a mapping:
# of names to numbers). What run_metrics.py writes; a file edited or damaged by hand is named.
METRICS_FIELDS: dict[str, str] = {
    "eval": "an object of numbers", "metric_declarations": "an object", "kept": "an object",
    "main_metric": "a string", "method": "a string", "device": "a string", "device_name": "a string",
    "git_commit": "a string", "seed": NUMBER, "trainable_params": NUMBER, "total_params": NUMBER,
    "trainable_percent": NUMBER, "train_runtime_s": NUMBER, "train_samples_per_second": NUMBER,
    "eval_runtime_s": NUMBER, "train_steps": NUMBER, "train_samples": NUMBER, "best_step": NUMBER,
    "peak_memory_mb": NUMBER, "num_processes": NUMBER, "data_sha256": "a string", "eval_sha256": "a string",
    "skipped_nonfinite": NUMBER, "skipped_nonfinite_micro_batches": NUMBER, "base_run": "a string",
    "code": "an object", "versions": "an object",
    "resumed_under_other_code": "a list", "recipe_hash": "a string", "hub_data": "an object",
    "base_files": "an object", "base_weights": "an object", "eval_samples": "an object of numbers",
    "metric_info": "an object",
}


def _not_a_number(token: str) -> None:
    """NaN / Infinity tokens (Python's json writes them; a run writes null): read as null, so a
    metric is left out of its means and named, as a null one is, never a NaN mean."""
    return None


def _declaration_problem(declared: Any) -> str | None:
    """What is wrong with metric_declarations (name -> {higher_is_better: bool, scale: number})."""
    for name, d in declared.items():
        if not isinstance(d, dict) or not isinstance(d.get("higher_is_better"), bool) or not _is_number(d.get("scale")) \
                or not isinstance(d.get("score", True), bool):
            return f"'metric_declarations.{name}' should be {{higher_is_better: true/false, scale: a number}}, got {json.dumps(d)[:60]}"
    return None


def _declared(name: str, d: dict | None) -> Metric:
    """A metric as a run's metrics.json declared it (the catalogue's for runs from before). A
    number the catalogue declares no score that a run declared a score was declared before
    `score` was recorded (2026-11-28), and its scale may be as wrong (SQuAD v2's best_f1_thresh,
    a threshold tuned on dev, was declared best_f1's percentage until 2026-11-27): it takes the
    catalogue's declaration. A report of old runs alone headed it `↑ (%)`, 100 times its value."""
    known = declaration(name)
    if not d or (not known.score and d.get("score", True)):
        return known
    return Metric(name, d["higher_is_better"], d["scale"], score=d.get("score", True))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_metrics(data: dict, file: Path) -> None:
    """Each field the report reads has the type run_metrics.py writes (null: not recorded)."""
    for key, kind in METRICS_FIELDS.items():
        value = data.get(key)
        if value is None:
            continue
        fits = {NUMBER: _is_number(value), "a string": isinstance(value, str),
                "an object": isinstance(value, dict), "a list": isinstance(value, list),
                "an object of numbers": isinstance(value, dict) and all(
                    _is_number(v) or v is None for v in value.values())}[kind]
        problem = None if fits else f"'{key}' should be {kind}, got {json.dumps(value)[:60]}"
        if fits and key == "metric_declarations":
            problem = _declaration_problem(value)
        if problem:
            raise UserError(f"report: {file}: {problem}; this is not the metrics.json a run writes: remove or "
                            "re-run that run")


def files_below(root: Path, name: str) -> list[Path]:
    """Every file `name` below `root`, in path order, through folders that are symbolic links too
    (a run folder linked in from another disk, or a linked folder of runs), each real folder
    walked once (a link to a folder above it is no loop). Path.rglob does not enter a linked
    folder: its runs were left out of every table, "1 finished runs" where 3 were given, exit 0."""
    found, walked = [], set()

    def walk(folder: Path) -> None:
        real = folder.resolve()
        if real in walked:
            return
        walked.add(real)
        try:
            entries = sorted(folder.iterdir())
        except OSError:  # a folder that cannot be listed holds no run the report can read
            return
        for entry in entries:
            if entry.name == name and not entry.is_dir():
                found.append(entry)
            elif entry.is_dir():
                walk(entry)

    walk(root)
    return sorted(found)


def collect(roots: Path | str | Iterable[Path | str], only: Mapping[Path, str] | None = None) -> list[dict[str, Any]]:
    """Every finished run below the root(s): its metrics.json plus the recipe it came from; with
    `only` (resolved run folders: a sweep's own points, each with its planned recipe.yaml text), those
    runs alone."""
    roots = [Path(roots)] if isinstance(roots, (str, Path)) else [Path(r) for r in roots]
    found, seen = [], set()
    for root in roots:
        if not root.is_dir():
            raise UserError(f"report: {root} is not a folder of runs")
        for metrics in files_below(root, "metrics.json"):
            run = metrics.parent
            if run.resolve() in seen or (only is not None and run.resolve() not in only):  # one folder reached from two roots (runs and runs/glue) counts once
                continue
            seen.add(run.resolve())
            try:
                recipe = safe_yaml((run / "recipe.yaml").read_text(), str(run / "recipe.yaml")) if (run / "recipe.yaml").is_file() else {}
                data = json.loads(metrics.read_text(), parse_constant=_not_a_number)
            except (ValueError, UserError, UnicodeDecodeError, OSError) as exc:
                # OSError: a dangling link, a folder named metrics.json, a file it may not read
                raise UserError(f"report: {run} holds an unreadable metrics.json or recipe.yaml "
                                f"({str(exc).split(': ')[-1] if isinstance(exc, UserError) else type(exc).__name__}); "
                                "remove or re-run that run") from None
            if not isinstance(data, dict) or not isinstance(recipe or {}, dict):
                raise UserError(f"report: {metrics} is not a run's metrics (not a JSON object)")
            if not recipe:
                # its task, model, method, settings and seed are the recipe's: without them every such run
                # was one setting of task '?' (an RTE and an SST-2 run pooled as two seeds), exit 0
                raise UserError(f"report: {run} holds a metrics.json and {'an empty' if (run / 'recipe.yaml').is_file() else 'no'} "
                                "recipe.yaml, so its task, model, method, settings and seed are unknown and it has no "
                                "place in any table; copy the run folder whole (recipe.yaml beside metrics.json), or "
                                "remove it")
            section = next((k for k in (*SECTIONS, "name") if k in (recipe or {})
                            and not isinstance(recipe[k], dict if k != "name" else str)), None)
            if section is not None:
                raise UserError(f"report: {run / 'recipe.yaml'}: '{section}' should be "
                                f"{'a mapping' if section != 'name' else 'a string'}, got "
                                f"{json.dumps(recipe[section], default=str)[:60]}; this is not the recipe.yaml a "
                                "run writes: remove or re-run that run")
            check_metrics(data, metrics)
            if recipe:  # the setting, seed and row it is reported under are the ones it ran
                recipes.made_with(run, recipe, data.get("recipe_hash"))
            name = run_name(run, root, recipe)
            # null: NaN or infinite when the run wrote it (strict JSON), e.g. an undefined Pearson
            evals = data.get("eval") or {}
            data["eval"] = {k: v for k, v in evals.items() if v is not None}
            found.append({"run": run, "name": name, "recipe": with_old_defaults(recipe or {}, data), "metrics": data,
                          "not_numbers": [k for k, v in evals.items() if v is None]})
    if not found:
        raise UserError(f"report: no finished run (metrics.json) below {', '.join(map(str, roots))}"
                        + (" among the sweep's own runs" if only is not None else ""))
    data_from_run_id(found)
    hub_from_fingerprint(found)
    base_labels(found)
    found = Runs(found)
    found.started = attach_unfinished(found, roots, only)
    # the runs every seed of which stopped are labelled with the finished ones, by the same labellers
    task_labels([*found, *found.started])  # before one_seed_once: a run scored under another metric definition is another setting
    one_seed_once(found)
    model_labels([*found, *found.started])
    return found


class Runs(list):
    """The finished runs (collect), and in `started` one stand-in per run not finished whose
    recipe no finished run has (every seed of its entry stopped: {run, name, recipe, metrics {},
    started_only}): labelled from its recipe as a finished run of it is, so the pivot and GLUE
    tables give its method or task a cell `– (n=0; k not finished)`. Without it a LoRA whose every
    seed diverged had no column, read as never run, named only in the end note."""

    started: list[dict] = []


def started_only(items: list[dict]) -> list[dict]:
    """The stand-ins of runs not finished whose entry has no finished run (`Runs.started`)."""
    return list(getattr(items, "started", []))


def run_name(run: Path, root: Path, recipe: dict) -> str:
    """A run's name on the `run` axis and in the runs table: its folder's parent below the root
    (the seeds of one entry side by side), a smoke run's marked so."""
    if run == root:  # a run folder given itself (`toolkit report runs/x/<id>`): named by its recipe, as a
        # folder of runs names it (a traceback: its parent is not below it)
        name = recipe.get("name") if isinstance(recipe.get("name"), str) and recipe.get("name") else run.parent.name
    else:
        name = str(run.parent.relative_to(root)) if run.parent != root else run.name
    return name + SMOKE * bool(recipe.get("smoke"))


def unfinished_runs(roots: Iterable[Path], only: Mapping[Path, str] | None = None) -> list[dict]:
    """Run folders below the roots with a recipe.yaml and no metrics.json (stopped, failed, killed,
    a seed that diverged, or running now): {run, step, recipe} (recipe None where it cannot be read);
    with `only`, those among these run folders alone (collect)."""
    seen, left = set(), []
    for root in roots:
        for file in files_below(Path(root), "recipe.yaml"):
            run = file.parent
            if (run / "metrics.json").is_file() or run.resolve() in seen \
                    or (only is not None and run.resolve() not in only):
                continue
            seen.add(run.resolve())
            try:  # a recipe.yaml it cannot read, or of another shape: the run is named, matched to no cell
                recipe = safe_yaml(file.read_text(), str(file))
                recipe = with_old_defaults(recipe) if isinstance(recipe, dict) else None
            except (UserError, UnicodeDecodeError, OSError, TypeError, ValueError, AttributeError):
                recipe = None
            left.append({"run": run, "step": run_folders.last_step(run), "recipe": recipe,
                         "name": run_name(run, Path(root), recipe or {})})
    # a sweep's point with no recipe.yaml yet (left to another process still starting it, or never
    # started): its planned recipe (`only`'s value). Its cell read `(n=1)` where the sweep asked for 2
    # seeds and one was running elsewhere, said nowhere, exit 0
    for run, planned in (only or {}).items():
        if run in seen or not planned or (run / "metrics.json").is_file() or (run / "recipe.yaml").is_file():
            continue
        recipe = with_old_defaults(safe_yaml(planned, str(run / "recipe.yaml")))
        left.append({"run": run, "step": None, "recipe": recipe,
                     "name": run_name(run, Path(next(iter(roots))), recipe)})
    return left


def _kept(run: dict) -> str:
    return f"checkpoint of step {run['step']}" if run["step"] is not None else "no checkpoint"


def unfinished_notes(roots: Iterable[Path], only: Mapping[Path, str] | None = None) -> list[str]:
    """Run folders below the roots that are not finished are in no table, and said: a mean over the
    seeds that finished is not the mean over the seeds that ran (a seed that diverged and stopped,
    dropped without a word, flatters its method), and an n of 2 does not tell that a third was
    started. The cells they would have joined count them too (`not_finished`)."""
    left = [f"{r['run']} ({_kept(r)})" for r in unfinished_runs(roots, only)]
    if not left:
        return []
    return [f"{len(left)} run(s) not finished (no metrics.json: stopped, failed, killed, or running now), "
            f"out of every mean above (the pivot and GLUE tables count each in the cell it started, beside n): "
            f"{'; '.join(left)}"]


def _recipe_setting(item: dict) -> str:
    """The setting a run's recipe alone gives (`_setting` without what metrics.json records): what
    a run not finished, which has no metrics.json, is matched to finished runs by."""
    made = _setting({"recipe": item["recipe"], "metrics": {}, "unread": unread(item)})
    return json.dumps({k: v for k, v in made.items() if k in item["recipe"]}, sort_keys=True, default=str)


def attach_unfinished(items: list[dict], roots: Iterable[Path], only: Mapping[Path, str] | None = None) -> list[dict]:
    """Each run not finished whose recipe is a finished run's but for the seed (and the fields that
    change no number) is one more seed started for that run's entry: kept on those runs
    (`item["unfinished"]`) so every table that pools them can count it beside its n
    (`not_finished`), as a null run is counted. Said only in one note at the report's end, a
    cell's n=2 read as every seed that ran where a third diverged and stopped: the mean of the
    seeds that survived, flattering the method, exit 0."""
    by_setting: dict[str, list[dict]] = defaultdict(list)
    for item in items:
        by_setting[_recipe_setting(item)].append(item)
    alone = []  # returned: stand-ins of the runs whose setting no finished run has (`Runs.started`)
    for run in unfinished_runs(roots, only):
        try:
            key = _recipe_setting({"recipe": run["recipe"]}) if run["recipe"] is not None else None
        except (TypeError, ValueError, AttributeError):  # a recipe.yaml of another shape: no setting
            key = None
        for item in by_setting.get(key, []) if key is not None else []:  # else named in unfinished_notes alone
            item.setdefault("unfinished", []).append(run)
        # a recipe of another shape (a section not a mapping, as collect refuses of a finished run)
        # has no label: named in unfinished_notes alone
        if key is not None and key not in by_setting and isinstance(run["recipe"].get("task"), dict) \
                and all(isinstance(run["recipe"].get(k, {}), dict) for k in SECTIONS):
            alone.append({"run": run["run"], "name": run["name"], "recipe": run["recipe"], "metrics": {},
                          "not_numbers": [], "unfinished": [run], "started_only": True})
    return alone


def not_finished(members: list[dict]) -> list[dict]:
    """The runs not finished started for these runs' entries (`attach_unfinished`), one per seed
    (two stopped attempts of one seed, a copy of its folder, are one seed missing; all are named
    in unfinished_notes): those of a seed no finished member has (a seed finished elsewhere, being
    run again, is no missing seed of theirs)."""
    seeds = {json.dumps(seed_of(m), default=str) for m in members}
    runs = sorted({id(r): r for m in members for r in m.get("unfinished", [])}.values(), key=lambda r: r["run"])
    out: dict[str, dict] = {}
    for run in runs:
        seed = json.dumps(_dig(run["recipe"], "train.seed"), default=str)
        if seed not in seeds:
            out.setdefault(seed, run)
    return list(out.values())


def not_finished_at(members: list[dict], chosen: list[dict]) -> list[dict]:
    """not_finished of the setting a table reports (`chosen`: its runs) among a cell's members of
    several settings (a grid): a seed that diverged at the reported lr and finished at another
    was "finished elsewhere", so the cell read `90.00 (n=1)`, the one seed of three that survived
    at the setting chosen as the best, exit 0. The members of other settings count at theirs."""
    if not chosen:
        return not_finished(members)
    at = setting(chosen[0])
    return not_finished([m for m in members if setting(m) == at])


def not_finished_text(runs: list[dict]) -> str:
    """'seed 44 at runs/.../<id> (checkpoint of step 4)' for each."""
    return "; ".join(f"seed {_dig(r['recipe'], 'train.seed')} at {r['run']} ({_kept(r)})" for r in runs)


def one_seed_once(items: list[dict]) -> None:
    """Runs of one setting are its seeds, and a mean over seeds counts each seed once: two runs of
    one setting and one seed (a copied folder, the run redone on another machine; other data and
    other process counts are other settings) would be averaged as two seeds with a spread that is
    not seed noise."""
    first: dict[tuple[str, Any], dict] = {}
    for item in items:
        key = (setting(item), seed_of(item))
        if key in first:
            raise UserError(f"report: {first[key]['run']} and {item['run']} are one setting with one seed "
                            f"(train.seed={key[1]}), so a mean would count that seed twice; report them "
                            "separately, or remove one")
        first[key] = item


def skipped_notes(items: list[dict], where: str = "") -> list[str]:
    """Each run that skipped batches for a non-finite loss (train.skip_nonfinite: no update on
    them): it finished, so it is pooled as a seed of its entry, and said, or a seed that trained
    on part of its updates read as one that trained on all of them."""
    return [f"{where}{item['run']}: skipped {item['metrics']['skipped_nonfinite']} of its "
            f"{item['metrics'].get('train_steps', '?')} optimizer steps{_micro(item['metrics'])} for a non-finite "
            "loss (train.skip_nonfinite: no update on them); it is pooled as a seed, with fewer updates than its recipe's"
            for item in items if (item["metrics"].get("skipped_nonfinite") or 0) > 0]


def _micro(metrics: dict) -> str:
    """The micro-batches the skipped steps held, where metrics.json records them (from 2026-11-28)."""
    n = metrics.get("skipped_nonfinite_micro_batches")
    return f" ({n} micro-batches)" if isinstance(n, int) and n else ""


def not_numbers_notes(items: list[dict]) -> list[str]:
    """Each run whose metrics.json holds a metric as null (not a finite number): it is left out of
    every mean and n of that metric, and said here rather than dropped without a word."""
    return [f"{item['run']}: {', '.join(item['not_numbers'])} not a number (null in metrics.json: NaN or "
            "infinite); left out of every mean and n of that metric" for item in items if item.get("not_numbers")]


def _dig(data: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        data = data.get(part) if isinstance(data, dict) else None
    return data


def method_label(item: dict) -> str:
    """The method's name; a method with a `config` choice (adapters: houlsby, pfeiffer) by it."""
    method = item["recipe"].get("method", {})
    name = method.get("name") or item["metrics"].get("method", "?")
    return str(method["config"]) if isinstance(method.get("config"), str) else str(name)


def label(item: dict, key: str) -> str:
    """An item's value on a pivot axis: task (subset or name), method, model, run, or a dotted
    recipe field such as train.lr."""
    recipe = item["recipe"]
    if key == "run":
        return item["name"]
    if key == "task":
        return item.get("task_label") or _task_name(recipe)
    if key == "method":
        return method_label(item)
    if key == "model":
        return item.get("model_label") or _checkpoint(recipe).split("/")[-1]
    value = _dig(recipe, key)
    return "–" if value is None else str(value)


def _task_name(recipe: dict) -> str:
    task = recipe.get("task", {})
    return str(task.get("subset") or task.get("name") or "?")


def _data_fields(recipe: dict) -> dict[str, str]:
    """The task fields that say which data it reads and what in it is the task: files, folders, a
    Hub data set, its config and splits, the columns read (train_file, eval_file, data_dir, dataset,
    eval_split, label_column, text_field...)."""
    task = recipe.get("task", {})
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in task.items() if v is not None
            and (k in ("dataset", "dataset_config") or k.endswith(DATA_SUFFIXES))}


DATA_SUFFIXES = ("_file", "_dir", "_split", "_field", "_column", "_columns")
PATH_SUFFIXES = ("_file", "_dir")  # fields naming where bytes are, not which of them are read


def _tail(value: str, others: set[str]) -> str:
    """The fewest trailing path parts of `value` that no other value ends with the same way."""
    parts = value.split("/")
    for n in range(1, len(parts) + 1):
        tail = "/".join(parts[-n:])
        if not any(o != value and "/".join(o.split("/")[-n:]) == tail for o in others):
            return tail
    return value


def task_labels(items: list[dict]) -> None:
    """Each run's task on a report axis: its name (a GLUE subset), and, where runs of one name read
    other data (two of one's own CSV sets, another eval file or split), the data fields that tell
    them apart. `text_classification` over two data sets was one task: a pivot cell took the best
    of the two as if a grid, notes paired them by seed and one plot drew them as one task."""
    _eval_from_task(items)
    by_name: dict[str, list[dict]] = defaultdict(list)
    for item in items:
        by_name[_task_name(item["recipe"])].append(item)
    for name, members in by_name.items():
        fields = [_data_fields(m["recipe"]) for m in members]
        keys = sorted({k for f in fields for k in f})
        # a file or folder named by another path that holds the same bytes (a copy: one data_sha256,
        # one eval_sha256 for every run) is the same data: another path alone made another task,
        # and the GLUE table refused the cell
        versions = {data_version(m) for m in members}
        copies = len(versions) == 1 and all(next(iter(versions)))
        differ = [k for k in keys if len({f.get(k) for f in fields}) > 1
                  and not (copies and k.endswith(PATH_SUFFIXES))]
        for member, f in zip(members, fields):
            said = [f"{k} {_tail(f[k], {g.get(k) for g in fields if g.get(k)}) if k in f else '–'}" for k in differ]
            member["task_label"] = f"{name} ({', '.join(said)})" if said else name
    data_labels(items)
    scoring_labels(items)


def data_version(item: dict) -> tuple[str, str]:
    """(the data a run read: its data files' sha256 and its Hub data sets' examples, _setting's
    `data` and `hub`; the examples it was scored on: metrics.json eval_sha256), each a short hash,
    '' where not recorded."""
    made = _setting(item)
    data = "" if made["data"] is None and made["hub"] is None else \
        hashlib.sha256(json.dumps([made["data"], made["hub"]]).encode()).hexdigest()[:12]
    return data, (item["metrics"].get("eval_sha256") or "")[:12] or _eval_settings(item)


# the task settings that choose which examples a run scores (beside its data files)
EVAL_CHOOSING = ("max_eval_samples", "train_from_dev", "eval_split", "eval_file")


def _eval_settings(item: dict) -> str:
    """'' where a run did not record eval_sha256 (before 2026-11-27) and no run of its task
    settings did: then the recipe's settings that choose the examples scored, as
    `not recorded (task.max_eval_samples=50)`. Runs from before the record that differ only in
    task.max_eval_samples were one eval set and a grid, the subset that scored higher chosen as the
    best setting, exit 0."""
    task = item["recipe"].get("task", {}) or {}
    said = [f"task.{k}={task[k]}" for k in EVAL_CHOOSING if task.get(k) is not None]
    return f"not recorded ({', '.join(said)})" if said else ""


def _eval_from_task(items: list[dict]) -> None:
    """A run from before metrics.json recorded eval_sha256 takes the one another run recorded with
    the same task settings and the same data (which examples are scored follows from them alone:
    max_eval_samples, a carved split, the eval file), so it is not an eval set of its own."""
    def key(item: dict) -> str:
        made = _setting(item)
        return json.dumps([item["recipe"].get("task"), made["data"], made["hub"]], sort_keys=True, default=str)

    known = {key(i): i["metrics"]["eval_sha256"] for i in items if i["metrics"].get("eval_sha256")}
    for item in items:
        if not item["metrics"].get("eval_sha256") and key(item) in known and not item.get("started_only"):
            item["metrics"]["eval_sha256"] = known[key(item)]


def data_labels(items: list[dict]) -> None:
    """Runs of one task label that read other versions of their data (a file edited between
    seeds, a Hub data set at a revision with other rows) or were scored on other examples
    (task.max_eval_samples, another carve of dev) are other tasks on every axis: as one, a pivot
    cell and the GLUE table chose the better version, or the eval subset that scored higher, as a
    grid's best, and a plot drew one line over both. Each such label gets what tells it apart
    (`sst2 [data 1a2b3c4d5e6f]`, `sst2 [eval set 3c4d5e6f7a8b]`), and the split is said in one
    line (`data_split_notes`); runs of one label on one version keep it unchanged."""
    by_label: dict[str, list[dict]] = defaultdict(list)
    for item in items:  # a run not finished has no metrics.json: no version recorded, none told apart
        if not item.get("started_only"):
            by_label[item["task_label"]].append(item)
    for name, members in by_label.items():
        versions = {id(m): data_version(m) for m in members}
        differ = [i for i, what in enumerate(("data", "eval set")) if len({v[i] for v in versions.values()}) > 1]
        if not differ:
            continue
        shown = {k: ", ".join(f"{('data', 'eval set')[i]} {v[i] or 'not recorded'}" for i in differ)
                 for k, v in versions.items()}
        counts: dict[str, int] = defaultdict(int)
        for m in members:
            counts[shown[id(m)]] += 1
            m["task_label"] = f"{name} [{shown[id(m)]}]"
        said = "; ".join(f"{v}: {n} run(s)" for v, n in sorted(counts.items()))
        what = "; ".join(("data: the task's data files' sha256, a Hub data set's examples",
                          "eval set: the examples scored, metrics.json eval_sha256 (another eval file, "
                          "task.max_eval_samples, another carve)")[i] for i in differ)
        for m in members:
            m["data_split"] = (f"{name}: its runs span {len(counts)} versions of their data or eval set ({what}): "
                               f"{said}; each is a task of its own in "
                               "every table and plot, never seeds or a grid of one entry: rerun the other version's "
                               "seeds on one data and eval set, or remove them")


# what metrics.json metric_info records of how a run was decoded, not of what its metrics are:
# a setting of the recipe (a grid over task.generation.num_beams is chosen on dev) or of the
# checkpoint's generation_config (base_weights records it)
DECODING = ("generation",)


def _scoring(metrics: dict) -> dict[str, str]:
    """What a run's metrics are, as metrics.json metric_info records it (sacreBLEU's signature:
    its tokenizer and version; which F1 `f1` is; NER's tag scheme), without the decoding; {} where
    nothing is recorded (a task that records nothing, or a run from before metric_info)."""
    info = metrics.get("metric_info")
    return {str(k): str(v) for k, v in info.items() if k not in DECODING} if isinstance(info, dict) else {}


def scoring_labels(items: list[dict]) -> None:
    """Runs of one task label whose metrics were computed under other definitions (BLEU tokenized
    13a and intl, or by another sacreBLEU; `f1` of another positive label; another tag scheme:
    metrics.json metric_info) are other tasks on every axis: their numbers are not of one metric.
    As one task, a recipe field that changes the definition (task.bleu_tokenize) was a grid and a
    pivot cell reported the definition that scored higher as the best setting, and the same recipe
    scored by another sacreBLEU pooled as seeds, exit 0. Each such run's label gets `[scoring
    <short hash>]` ('not recorded' where a run beside them records none), and one line says what
    differs; runs of one definition, or with one among unrecorded ones, are unchanged."""
    by_label: dict[str, list[dict]] = defaultdict(list)
    for item in items:  # a run not finished has no metrics.json: no version recorded, none told apart
        if not item.get("started_only"):
            by_label[item["task_label"]].append(item)
    for name, members in by_label.items():
        records = {id(m): r for m in members if (r := _scoring(m["metrics"]))}
        keys = {k: hashlib.sha256(json.dumps(r, sort_keys=True).encode()).hexdigest()[:12] for k, r in records.items()}
        if len(set(keys.values())) < 2:
            continue
        differ = sorted(k for k in {k for r in records.values() for k in r}
                        if len({r.get(k) for r in records.values()}) > 1)
        counts: dict[str, int] = defaultdict(int)
        shown: dict[str, str] = {}
        for m in members:
            m["scoring"] = keys.get(id(m), "not recorded")
            m["task_label"] = f"{name} [scoring {m['scoring']}]"
            counts[m["scoring"]] += 1
            shown[m["scoring"]] = ", ".join(f"{k} {records[id(m)].get(k, '–')}" for k in differ) if id(m) in records else ""
        said = "; ".join(f"scoring {k} ({shown[k]}): {n} run(s)" if shown[k] else f"scoring {k}: {n} run(s)"
                         for k, n in sorted(counts.items()))
        for m in members:
            m["scoring_split"] = (f"{name}: its runs were scored under {len(counts)} definitions of their metrics "
                                  f"(metrics.json metric_info: {', '.join(differ)}): {said}; their numbers are not of "
                                  "one metric, so each is a task of its own in every table and plot, never seeds or a "
                                  "grid of one entry: score them under one definition (toolkit eval), or report them apart")


def data_split_notes(items: list[dict]) -> list[str]:
    """The one line per task label that data_labels split by data version or scoring_labels by
    metric definition, and per model label that base_labels split by the base's weights."""
    return list(dict.fromkeys(i[k] for k in ("data_split", "scoring_split", "base_split") for i in items if i.get(k)))


def _base_files(metrics: dict) -> dict[str, str]:
    """{file: sha256} of the base a run was loaded from (runs.base_record: {files: {name: [size,
    mtime_ns, sha256]}}): metrics.json base_weights, which every method records since 2026-11-28,
    else base_files, which an adapter or in-context run recorded before it (a full fine-tune's
    model/ is whole: it had none, and its seeds on a base folder trained again between them
    were one entry, exit 0); {} not recorded (a full fine-tune from before base_weights, or any
    run from before 2026-11-27)."""
    files = (metrics.get("base_weights") or metrics.get("base_files") or {}).get("files")
    if not isinstance(files, dict):
        return {}
    return {str(n): str(v[-1]) if isinstance(v, list) and v else json.dumps(v) for n, v in files.items()}


def base_labels(items: list[dict]) -> None:
    """Runs of one checkpoint name that were loaded onto other weights (a local base folder
    trained again between seeds, a Hub id whose cached snapshot moved to another revision, a
    chained run's upstream run again with --force: metrics.json base_weights, or base_files for
    an adapter run from before it) are other models on every axis: as one, their seeds were one mean
    and a pivot cell or a GLUE row pooled two models, exit 0. Compared on the files every record
    of that name holds (an in-context run records the tokenizer too, and a snapshot may gain a
    .bin beside its .safetensors), each such run gets `base_weights` (a short hash, or 'not
    recorded' for a run beside them that has no record), which model_labels and _setting show;
    runs of one name on one base, or with one record among unrecorded ones, are unchanged."""
    by_checkpoint: dict[str, list[dict]] = defaultdict(list)
    for item in items:
        by_checkpoint[_checkpoint(item["recipe"]) + SMOKE * bool(item["recipe"].get("smoke"))].append(item)
    for name, members in by_checkpoint.items():
        records = {id(m): r for m in members if (r := _base_files(m["metrics"]))}
        common = set.intersection(*map(set, records.values())) if records else set()
        keys = {k: hashlib.sha256(json.dumps({n: r[n] for n in sorted(common)}).encode()).hexdigest()[:12]
                for k, r in records.items()}
        if len(set(keys.values())) < 2:
            continue
        counts: dict[str, int] = defaultdict(int)
        for m in members:
            m["base_weights"] = keys.get(id(m), "not recorded")
            counts[m["base_weights"]] += 1
        said = "; ".join(f"base {k}: {n} run(s)" for k, n in sorted(counts.items()))
        for m in members:
            m["base_split"] = (f"{name.split('/')[-1]}: its runs were loaded onto {len(counts)} versions of the base "
                               f"model's files (metrics.json base_weights: {', '.join(sorted(common))}): {said}; "
                               "each is a model of its own in every table and plot, never seeds or a grid of one "
                               "entry: rerun the other version's seeds on one base, or remove them")


def _checkpoint(recipe: dict) -> str:
    checkpoint = _dig(recipe, "model.checkpoint") or "?"
    return (checkpoint if isinstance(checkpoint, str) else json.dumps(checkpoint, sort_keys=True)).rstrip("/")


def model_labels(items: list[dict]) -> None:
    """Each run's model on a report axis: the checkpoint's last path part, or as many of its last
    parts as tell it from another checkpoint of the runs that ends alike (two fine-tuned `.../model`
    folders, `org1/minilm` and `org2/minilm`): as one label, a cell, a GLUE row and a plot took
    the better of two models as if a grid of one. A smoke run's is marked so: its model is not
    the checkpoint (a pivot cell chose between smoke and real runs as a grid over `smoke`)."""
    checkpoints = {_checkpoint(item["recipe"]) for item in items}
    for item in items:
        # a smoke run's model is a small random-weight one, not the checkpoint: another model
        item["model_label"] = (_tail(_checkpoint(item["recipe"]), checkpoints) + SMOKE * bool(item["recipe"].get("smoke"))
                               + (f" [base {item['base_weights']}]" if item.get("base_weights") else ""))


SMOKE = " (smoke: random weights)"


def check_axis(key: str, where: str) -> None:
    if key not in LABELS and key.split(".")[0] not in SECTIONS:
        raise UserError(f"report {where} '{key}': expected one of {', '.join(LABELS)} "
                        "or a recipe field such as train.lr")


# Recipe fields that do not change a run's numbers: its name, where it logs, what it keeps on disk,
# how memory is saved. Runs that differ only in them (a seed rerun with report_to, another
# eval_batch_size, a copy of the recipe under another name) are seeds of one setting: as two
# settings, a pivot cell chose the "best" of them, a seed reported as a grid's winner.
# method.batch_size: icl's (example, label word) pairs per forward, its eval batch size: its scores
# never depend on what else a batch holds (icl.label_scores), and two icl runs at 4 and 8 were a grid
NO_EFFECT = {"name", "out", "train.log_every", "train.report_to", "train.save_total_limit", "train.save_every",
             "train.keep_checkpoints", "train.gradient_checkpointing", "train.eval_batch_size", "method.batch_size"}


def _setting(item: dict) -> dict:
    """The resolved recipe without its seed, with the number of processes it ran on: that sets the
    global batch (batch × grad_accum × processes), so a 2-process run is not a seed of a 1-process one."""
    recipe = json.loads(json.dumps(item["recipe"]))
    for dotted in ("train.seed", *NO_EFFECT, *unread(item)):  # unread: no number depends on it
        *parents, last = dotted.split(".")
        section = _dig(recipe, ".".join(parents)) if parents else recipe
        if isinstance(section, dict):
            section.pop(last, None)
    # the task's data files (sha256) and a Hub data set's examples (hub_data): seeds of one entry
    # ran on one version of the data (a Hub data set's revisions were pooled as seeds: its data
    # files are none, every revision the same empty data_sha256), and a chained run's upstream run
    # folder (base_run): seeds of one entry started from one model
    # where the bytes were read from is not the setting once what they were is recorded (a copy of
    # the data folder is the same data, as for resume and eval): the files (data) and the
    # examples scored (eval, which also tells a train file from an eval file of the same bytes)
    if item["metrics"].get("data_sha256") and isinstance(recipe.get("task"), dict):
        recipe["task"] = {k: v for k, v in recipe["task"].items() if not k.endswith(PATH_SUFFIXES)}
    # FSDP and ZeRO are another computation than DDP (reduction order; ZeRO's fp32 master weights
    # under half precision): a setting of their own; one process and DDP (the runs before the
    # strategy was recorded too) add nothing, their process counts differ already
    way = run_folders.recorded_strategy(item["metrics"])
    if way not in run_folders.NEUTRAL_STRATEGIES:
        recipe["strategy"] = way
    return {**recipe, "processes": item["metrics"].get("num_processes"),
            "data": (item["metrics"].get("data_sha256") or "")[:12] or None, "hub": hub_examples(item["metrics"]),
            "eval": (item["metrics"].get("eval_sha256") or "")[:12] or None, "base": item["metrics"].get("base_run"),
            # the base's weights, where runs of one checkpoint name were loaded onto others (base_labels),
            # and the metrics' definition, where runs of one task were scored under others (scoring_labels)
            **({"base_weights": item["base_weights"]} if item.get("base_weights") else {}),
            **({"scoring": item["scoring"]} if item.get("scoring") else {})}


def setting(item: dict) -> str:
    """The resolved recipe without its seed: runs with equal settings are seeds of one entry."""
    return json.dumps(_setting(item), sort_keys=True)


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(data, dict):
        return {prefix: data}
    out: dict[str, Any] = {}
    for key, value in data.items():
        out.update(_flat(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def varying(settings: list[str]) -> list[str]:
    """Dotted recipe fields whose values differ between these settings (train.lr in an lr grid)."""
    flats = [_flat(json.loads(s)) for s in settings]
    keys = sorted({k for f in flats for k in f})
    return [k for k in keys if len({json.dumps(f.get(k)) for f in flats}) > 1]


def shown(value: Any) -> Any:
    """A setting's value as a report writes it: a string that is not one plain line (a line break
    or tab, spaces around it, empty: icl's separator "\n\n", a template, a prompt's suffix)
    JSON-quoted. Written as it was, its line break ended a note's bullet or split a note in two."""
    if isinstance(value, str) and (not value or not value.isprintable() or value != value.strip()):
        return json.dumps(value, ensure_ascii=False)
    return value


def describe_setting(item: dict, keys: list[str]) -> str:
    """`k=v ...` of the fields `keys` that tell this item's setting from the others'. A field its
    recipe does not hold (another method's `method.r` beside a prefix-tuning run) is left out: it
    read `method.r=None`, a setting the run never had."""
    made = _setting(item)
    held = _flat(made)

    def value(k: str) -> Any:  # one process and DDP, left out of the setting, by their name
        said = _dig(made, k)
        return shown(run_folders.recorded_strategy(item["metrics"]) if said is None and k == "strategy" else said)

    return " ".join(f"{k}={value(k)}" for k in keys if k in held or k == "strategy")


# --- statistics ------------------------------------------------------------------------------
@dataclass
class Stat:
    """Values of one metric over the seeds of one setting."""

    values: list[float]
    seeds: list[Any] = field(default_factory=list)  # values[i] came from the run of seeds[i]; [] if unknown
    runs: list[dict] = field(default_factory=list)  # values[i] came from runs[i] (its code); [] if not known

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return statistics.mean(self.values)

    @property
    def std(self) -> float:
        return statistics.stdev(self.values) if self.n > 1 else 0.0

    def interval(self) -> tuple[float, float]:
        return self.mean - self.std, self.mean + self.std

    def fmt(self, scale: float = 1.0, digits: int = 2, show_n: bool = True) -> str:
        text = f"{self.mean * scale:.{digits}f}"
        if self.n > 1:
            std = f"{self.std * scale:.{digits}f}"
            # seeds that differ (beyond float rounding: no_spread) never read as "± 0.00", the
            # spread of seeds that all gave one number
            if not no_spread(self.values) and float(std) == 0:
                std = f"<{10 ** -digits:.{digits}f}"
            text += f" ± {std}"
        return text + (f" (n={self.n})" if show_n else "")


def overlaps(a: Stat, b: Stat) -> bool:
    """mean ± std intervals intersect (both need two seeds or more to have an interval)."""
    (lo_a, hi_a), (lo_b, hi_b) = a.interval(), b.interval()
    return a.n > 1 and b.n > 1 and lo_a <= hi_b and lo_b <= hi_a


CONFIDENCE = 0.95


def paired(a: Stat, b: Stat) -> tuple[list[float], list[Any], list[str]]:
    """a − b per seed both ran, matched by the seed's value (never by the runs' order), the
    seeds matched, and the seeds only one side ran (left out of the difference)."""
    va, vb = dict(zip(a.seeds, a.values)), dict(zip(b.seeds, b.values))
    common = sorted((s for s in va if s in vb), key=_sortable)
    return [va[s] - vb[s] for s in common], common, sorted(set(va) ^ set(vb), key=_sortable)


def no_spread(values: list[float]) -> bool:
    """Whether the values are one value to float rounding (0.83 − 0.80 and 0.84 − 0.81 differ in
    the 17th digit): their sample std is then 0, a t interval of zero width, which reads as
    certainty where two or three seeds have only failed to show any noise."""
    return statistics.pstdev(values) <= 1e-9 * max(1.0, max(abs(v) for v in values))


def t_interval(values: list[float], level: float = CONFIDENCE) -> tuple[float, float, float]:
    """(mean, low, high): Student's t interval of the mean with n − 1 degrees of freedom (two
    seeds: 1 df, t = 12.7), the interval a handful of seeds supports; scipy's t quantile."""
    from scipy.stats import t

    mean = statistics.mean(values)
    half = t.ppf(0.5 + level / 2, len(values) - 1) * statistics.stdev(values) / len(values) ** 0.5
    return mean, mean - half, mean + half


def digits_apart(pairs: Iterable[tuple[float, float]], digits: int = 2, most: int = 6) -> int:
    """The fewest decimals (from `digits`, at most `most`) at which each pair of different numbers
    prints differently: a paired difference of +0.003 points with its interval printed "+0.00,
    95% CI [+0.00, +0.00]: separated", and a grid's best printed as its runner-up's 80.43, claimed
    what the printed numbers deny. Numbers equal to float rounding (core.choose's rule) stay equal."""
    pairs = [(x, y) for x, y in pairs if abs(x - y) > 1e-9 * max(1.0, abs(x), abs(y))]
    for d in range(digits, most):
        if all(f"{x:+.{d}f}" != f"{y:+.{d}f}" for x, y in pairs):
            return d
    return most


def paired_note(name_a: str, a: Stat, name_b: str, b: Stat, metric: Metric, where: str) -> str | None:
    """The difference of two entries over their matched seeds with its t interval: a seed moves
    both runs together (same data order, same init), so seeds that overlap as mean ± std can still
    separate two methods, and ones that look apart may not. None: fewer than two matched seeds.
    Marked ‡ where the paired runs did not all run on one code (comparison_code)."""
    diffs, common, unmatched = paired(a, b)
    if len(common) < 2:
        return None
    seeds = f"{len(common)} seeds {', '.join(map(str, common))}"
    if no_spread(diffs):
        mean = statistics.mean(diffs) * metric.scale
        text = (f"{name_a} and {name_b}{where}: {metric.name} {name_a} − {name_b} = "
                f"{mean:+.{digits_apart([(mean, 0.0)])}f} on each of the {seeds}: no spread (every seed's "
                "difference is the same, so its t interval has zero width and measures no noise): not judged "
                "separated; more seeds would say")
    else:
        mean, low, high = (v * metric.scale for v in t_interval(diffs))
        apart = low > 0 or high < 0
        d = digits_apart([(mean, 0.0), (low, 0.0), (high, 0.0), (low, high)])  # the claim readable in its numbers
        text = (f"{name_a} and {name_b}{where}: {metric.name} {name_a} − {name_b} = {mean:+.{d}f}, "
                f"{CONFIDENCE:.0%} CI [{low:+.{d}f}, {high:+.{d}f}] (paired by seed over {seeds}; t, "
                f"{len(common) - 1} df): " + ("separated by these seeds" if apart else "not separated by these seeds"))
    text += f"; seeds without a partner, left out: {', '.join(map(str, unmatched))}" if unmatched else ""
    matched = [(name_a, _runs_of(a, common)), (name_b, _runs_of(b, common))]
    return _code_marked(text, matched, "the per-seed differences are not the entries' alone")


def _runs_of(s: Stat, seeds: list) -> list[dict]:
    """The runs behind `seeds` of `s` (all of its runs when `seeds` is None); [] where unknown."""
    if len(s.runs) != len(s.values):
        return []
    if seeds is None:
        return list(s.runs)
    by_seed = dict(zip(s.seeds, s.runs))
    return [by_seed[x] for x in seeds if x in by_seed]


def comparison_code(sides: list[tuple[str, list[dict]]]) -> str:
    """mixed_code over the runs a comparison of entries reads (the matched seeds of a paired
    difference, every seed of an overlap of mean ± std), each seed named with its entry: the
    rule of a pooled figure, for a figure of two entries. '' when they ran on one code."""
    owner = {id(run): name for name, runs in sides for run in runs}
    return mixed_code([run for _, runs in sides for run in runs], lambda run: owner[id(run)])


def _code_marked(text: str, sides: list[tuple[str, list[dict]]], meaning: str) -> str:
    said = comparison_code(sides)
    return f"‡ {text}; its runs did not all run on one code: {said}: {meaning}" if said else text


def overlap_notes(entries: list[tuple[str, Stat]], metric: Metric, context: str = "",
                  chosen: dict[str, int] | None = None) -> list[str]:
    """Neighbours by rank: with two or more matched seeds, their paired difference and its t
    interval; otherwise where their mean ± std intervals overlap (their order is within noise).
    Either is marked ‡ where the runs it reads did not all run on one code. `chosen`: entries that
    are a grid's best (name -> its number of settings), chosen on the very scores compared:
    said (`chosen_clause`), or a paired "separated by these seeds" read as a test of the methods."""
    ranked = sorted(entries, key=lambda e: e[1].mean, reverse=metric.higher_is_better)
    notes = []
    for (name_a, a), (name_b, b) in zip(ranked, ranked[1:]):
        where = f" ({context})" if context else ""
        if (note := paired_note(name_a, a, name_b, b, metric, where)) is not None:
            notes.append(note + chosen_clause([name_a, name_b], chosen))
        elif overlaps(a, b):
            text = (f"{name_a} and {name_b}{where}: {metric.name} {a.fmt(metric.scale, show_n=False)} vs "
                    f"{b.fmt(metric.scale, show_n=False)} overlap (mean ± std): not separated by these seeds")
            notes.append(_code_marked(text, [(name_a, _runs_of(a, None)), (name_b, _runs_of(b, None))],
                                      "the spreads are not seed noise alone") + chosen_clause([name_a, name_b], chosen))
    single = [name for name, s in entries if s.n == 1]
    if single and len(entries) > 1:
        notes.append(f"one seed only{f' ({context})' if context else ''}: {', '.join(single)}: no spread to compare")
    return notes


def chosen_clause(names: list[str], chosen: dict[str, int] | None) -> str:
    """'; lora is the best of 4 settings, chosen on these same scores: ...' for the entries of a
    comparison that a grid chose (a pivot cell's best lr): the maximum of several noisy means is
    biased up, and the interval of a difference that uses the very scores that chose it does not
    count that choice. '' where no side was chosen among settings."""
    picked = [f"{name} is the best of {chosen[name]} settings" for name in names if (chosen or {}).get(name, 0) > 1]
    if not picked:
        return ""
    return (f"; {' and '.join(picked)}, chosen on these same scores: the choice favours "
            f"{'it' if len(picked) == 1 else 'them'} and is not counted in the comparison (a grid's best is "
            "compared fairly on scores it was not chosen on: other seeds, or a held-out split)")


# --- declarations ----------------------------------------------------------------------------
def declarations(items: list[dict]) -> dict[str, Metric]:
    """Every eval metric of the runs, first seen first, with the direction and scale its run
    declared in metrics.json (the toolkit's catalogue for runs written before declarations)."""
    out: dict[str, Metric] = {}
    for item in items:
        declared = item["metrics"].get("metric_declarations", {})
        for name in item["metrics"].get("eval", {}):
            if name not in out:
                out[name] = _declared(name, declared.get(name))
    # a number some run declares no score (SQuAD v2's best_f1_thresh, a threshold tuned on dev) is
    # none in every run: a run from before `score` was recorded declared it a score to maximise
    for item in items:
        for name, d in item["metrics"].get("metric_declarations", {}).items():
            if name in out and d.get("score") is False:
                out[name] = dataclasses.replace(out[name], score=False)
    return out


def with_nulled(decls: dict[str, Metric], items: list[dict]) -> dict[str, Metric]:
    """`decls` and each metric null in some run and in none of `decls` (null in every run: NaN or
    infinite), as the run declared it, in the runs' declared order: its cells count the nulls, not
    a table without it."""
    nulled = {n: i for i in reversed(items) for n in i.get("not_numbers", [])}
    added = [n for n in nulled if n not in decls]
    for name in added:
        declared = nulled[name]["metrics"].get("metric_declarations", {}).get(name)
        decls[name] = _declared(name, declared)
    if not added:
        return decls
    order = list(dict.fromkeys(n for i in items for n in [*i["metrics"].get("metric_declarations", {}),
                                                          *i["metrics"].get("eval", {}), *i.get("not_numbers", [])]))
    return {n: decls[n] for n in sorted(decls, key=lambda n: order.index(n) if n in order else len(order))}


def column(metric: Metric) -> str:
    """`accuracy (%) ↑`, `bleu ↑`, `perplexity ↓`: the scale and direction in the header."""
    unit = " (%)" if metric.scale == 100.0 else ""
    if not metric.score:  # a threshold tuned on dev: no direction is better
        return f"{metric.name}{unit} (not a score)"
    return f"{metric.name}{unit} {'↑' if metric.higher_is_better else '↓'}"


def main_metric(items: list[dict]) -> str | None:
    """The main metric the runs declared; for runs from before that field, the first metric that
    is not a loss (`loss` first in eval made the loss the main metric); None: nothing was scored."""
    declared = next((i["metrics"]["main_metric"] for i in items if i["metrics"].get("main_metric")), None)
    if declared:
        return declared
    names = [n for i in items for n in i["metrics"].get("eval") or {}]
    return next((n for n in names if n.split("_")[0] != "loss"), names[0] if names else None)


# --- the table of every run ------------------------------------------------------------------
def seed_of(item: dict) -> Any:
    """The run's seed: its recipe's train.seed, else the one metrics.json recorded."""
    seed = _dig(item["recipe"], "train.seed")
    return item["metrics"].get("seed") if seed is None else seed


# --- the code a number came from --------------------------------------------------------------
def code_of(item: dict) -> dict[str, str]:
    """What computed a run's numbers: the toolkit's commit (with a hash of uncommitted changes) and
    the library versions, from metrics.json's `code` (what checkpoints.code_versions records), or
    for runs written before it from `git_commit`, `git_dirty` and `versions`. Unrecorded fields
    are absent: they are not a difference."""
    m = item["metrics"]
    if isinstance(m.get("code"), dict):
        return {str(k): str(v) for k, v in m["code"].items() if v is not None}
    out = {str(k): str(v) for k, v in (m.get("versions") or {}).items() if v is not None}
    if m.get("git_commit"):
        out["toolkit"] = str(m["git_commit"])[:12] + (" + uncommitted changes" if m.get("git_dirty") else "")
    return out


def mixed_code(members: list[dict], part: Callable[[dict], str] | None = None) -> str:
    """'torch 2.1.0 (seeds 42, 43), 2.2.0 (seed 44); seed 45 resumed under other code' where the
    runs pooled into one figure (a mean ± std, a GLUE average) did not all run on one code and one
    set of library versions (or one of them changed code mid-run): its spread, or its value, is
    not of one code. '' when they did. `part` names the part of the figure a run is in (a GLUE
    average's task): where the runs span several parts, each seed is named with its part
    ('torch 2.1.0 (CoLA seeds 42, 43), 2.2.0 (SST-2 seeds 42, 43)')."""
    records = [code_of(m) for m in members]
    name = part if part and len({part(m) for m in members}) > 1 else None
    parts = []
    for key in sorted({k for r in records for k in r}):
        by_value: dict[str, list] = defaultdict(list)
        for member, record in zip(members, records):
            if key in record:
                by_value[record[key]].append(member)
        if len(by_value) > 1:
            parts.append(f"{'toolkit commit' if key == 'toolkit' else key} " + ", ".join(
                f"{value} ({_who(runs, name)})" for value, runs in by_value.items()))
    resumed = [m for m in members if m["metrics"].get("resumed_under_other_code")]
    if resumed:
        parts.append(f"{_who(resumed, name)} resumed under other code than it started on")
    return "; ".join(parts)


def _who(runs: list[dict], part: Callable[[dict], str] | None) -> str:
    """'seeds 42, 43', or with parts 'CoLA seeds 42, 43; SST-2 seed 44' (parts in first-seen order)."""
    if part is None:
        return _seeds([seed_of(r) for r in runs])
    by_part: dict[str, list] = defaultdict(list)
    for r in runs:
        by_part[part(r)].append(seed_of(r))
    return "; ".join(f"{p} {_seeds(seeds)}" for p, seeds in by_part.items())


def _seeds(seeds: list) -> str:
    return ("seed " if len(seeds) == 1 else "seeds ") + ", ".join(map(str, seeds))


def kept_kind(item: dict) -> str | None:
    """Which checkpoint a run's numbers are of (metrics.json `kept`): 'the best on dev' (selected
    on the dev set it is scored on: optimistic) or 'the last step'; None: not recorded."""
    kept = item["metrics"].get("kept")
    if not isinstance(kept, dict):
        return None
    if "value" not in kept or evaluations(item) == 1:  # one evaluation (the last step's): nothing was chosen
        return "the last step"
    # a run that scores a test split (`test_source`: SAMSum's preset) chose its step on that split
    return "the best on test" if test_source(item) else "the best on dev"


ONE_EVALUATION = "the last step (train.keep_best: its only evaluation, so no checkpoint was chosen)"


def evaluations(item: dict) -> int | None:
    """How many steps a run was evaluated at (log.jsonl's eval entries); None where its log is
    missing or unreadable. Under train.keep_best a run evaluated once (WikiText-2's recipes: one
    epoch, evaluated at its end) kept the only step it had: no checkpoint was chosen on the eval
    set, and its "best checkpoint, selected and scored on the same split" said one was."""
    if "evaluations" not in item:
        steps = set()
        try:
            for line in (Path(item["run"]) / "log.jsonl").read_text(encoding="utf-8").splitlines():
                entry = json.loads(line) if line.strip() else {}
                if isinstance(entry, dict) and "eval" in entry:
                    steps.add(entry.get("step"))
            item["evaluations"] = len(steps) or None
        except (OSError, ValueError, KeyError, TypeError):
            item["evaluations"] = None
    return item["evaluations"]


def kept_kinds(members: list[dict]) -> str:
    """'the best on dev' (or 'on test'), 'the last step', or both where an entry's runs kept each ('' unknown)."""
    return " and ".join(sorted({k for m in members if (k := kept_kind(m))}))


def kept_note(where: str, members: list[dict]) -> list[str]:
    """One line for an entry whose runs report different checkpoints: seeds that kept the best
    step on dev pooled with seeds that kept the last one (keep_best off for some, or a selection
    metric never defined: `kept.on` says why) were one mean, the best-on-dev seeds' optimism
    mixed in without a word."""
    by_kind: dict[str, list[dict]] = defaultdict(list)
    for m in members:
        if kept_kind(m):
            by_kind[kept_kind(m)].append(m)
    if len(by_kind) < 2:
        return []
    said = "; ".join(f"{kind} ({_who(runs, None)}"
                     + ("" if kind.startswith("the best on") else ": " + "; ".join(dict.fromkeys(
                         str(r["metrics"]["kept"].get("on")) if "value" not in r["metrics"]["kept"]
                         else ONE_EVALUATION for r in runs))) + ")"
                     for kind, runs in sorted(by_kind.items()))
    split = "the test split" if "the best on test" in by_kind else "the dev set"
    return [f"{where}: its runs report different checkpoints: {said}; its mean pools a checkpoint selected on "
            f"{split} it is scored on ({'no held-out score' if split == 'the test split' else 'optimistic'}) "
            "with ones that were not"]


def selected_checkpoint_note(where: str, entries: list[tuple[str, list[dict]]]) -> list[str]:
    """One line naming the entries every run of which reports its best step on dev (metrics.json
    `kept` with a value: train.keep_best), scored on that same dev set: a selection on the numbers
    shown, as a grid's best is, said beside a grid but not here, so LoRA and full fine-tuning each
    at their best epoch read as plain dev scores (the GLUE protocol said it; a pivot and the runs
    table did not). Entries whose runs kept both kinds are kept_note's."""
    best = [(name, runs) for name, runs in entries if runs and kept_kinds(runs) in ("the best on dev", "the best on test")]
    if not best:
        return []
    on = sorted({str(r["metrics"]["kept"].get("on")) for _, runs in best for r in runs})
    test = [name for name, runs in best if any(test_source(r) for r in runs)]
    dev = [name for name, _ in best if name not in test]
    out = [f"{where}: {', '.join(dev)}: each run reports its best checkpoint on dev "
           f"(train.keep_best, on {', '.join(on)}), selected and scored on the same dev set: optimistic, as the "
           "LoRA paper's best epoch; a held-out split would say how much"] if dev else []
    # the eval set a test split (SAMSum's preset, a task.eval_file test.txt): chosen on the numbers reported
    return out + ([f"{where}: {', '.join(test)}: each run reports its best checkpoint on its eval set (train.keep_best, "
                   f"on {', '.join(on)}), selected and scored on "
                   f"{eval_set(r for name, runs in best if name in test for r in runs)}, {ON_TEST}"] if test else [])


def mixed_code_note(where: str, members: list[dict], part: Callable[[dict], str] | None = None) -> list[str]:
    """One line for an entry (a pivot cell, a row of the runs table, a plotted line, a GLUE
    average) whose runs ran on other code; `part` as in mixed_code."""
    said = mixed_code(members, part)
    if not said:
        return []
    pooled = ("its mean ± std pools them as seeds, so the spread is not seed noise alone" if part is None else
              "it averages them, so it is no one code's score")
    return [f"‡ {where}: its {len(members)} runs did not all run on one code: {said}; {pooled}: rerun them "
            "on one version to compare"]


WEIGHT_FILES = (".safetensors", ".bin", ".pt", ".pth")


def result_of(item: dict) -> tuple | None:
    """What a run computed, to tell whether two seeds computed one thing: the hashes of the weights
    it saved (metrics.json `model_files`: `[size, mtime, sha256]` per file) where recorded, else
    every eval number and the train loss. None where nothing it records could tell two results
    apart: accuracies alone can coincide on a small dev set, a loss (a float) does not."""
    m = item["metrics"]
    files = (m.get("model_files") or {}).get("files") if isinstance(m.get("model_files"), dict) else None
    weights = {name: f[-1] for name, f in (files or {}).items()
               if str(name).endswith(WEIGHT_FILES) and isinstance(f, list) and f}
    if weights:
        return ("weights", tuple(sorted(weights.items())))
    numbers = {**(m.get("eval") or {}), "train_loss": m.get("train_loss")}
    if not any(isinstance(numbers.get(k), float) for k in ("loss", "train_loss")):
        return None
    return ("numbers", json.dumps(numbers, sort_keys=True, default=str))


def same_result_note(where: str, members: list[dict]) -> list[str]:
    """One line for an entry two or more of whose seeds computed one identical run (the same saved
    weights, or every eval number and the train loss equal): the seed reached neither the data
    order nor the initialisation (nor anything else), so the entry's ± is not seed noise, and a
    cell of n=3 such seeds read `88.00 ± 0.00 (n=3)`, a certainty no seed measured, exit 0."""
    by_result: dict[tuple, list[dict]] = defaultdict(list)
    for m in members:
        if (r := result_of(m)) is not None:
            by_result[r].append(m)
    same = [(r, runs) for r, runs in by_result.items() if len({str(seed_of(x)) for x in runs}) > 1]
    if not same:
        return []
    said = "; ".join(_seeds([seed_of(x) for x in runs]) + (" (the same saved weights)" if r[0] == "weights" else
                                                            " (every eval number and the train loss equal)")
                     for r, runs in same)
    distinct = len(by_result) + sum(1 for m in members if result_of(m) is None)
    return [f"{where}: {said} gave one identical run: the seed changed nothing in them (not the data order, not "
            f"the initialisation), so its ± is not seed noise and its n={len(members)} holds {distinct} distinct "
            f"result{'s' if distinct != 1 else ''}: check what the seed reaches (zero-shot prompting draws nothing "
            "with it; training needs a shuffled data order, a newly initialised weight or dropout) before reading a "
            "spread or a difference from it"]


def seeded_stat(items: list[dict], metric: str) -> Stat:
    """The metric over these runs, each value with its run's seed (for pairing by seed); seeds
    unknown or repeated: no seeds, so nothing is paired."""
    seeds = [seed_of(i) for i in items]
    known = None not in seeds and len(set(map(str, seeds))) == len(seeds)
    return Stat([i["metrics"]["eval"][metric] for i in items], seeds if known else [], list(items))


def _group_key(item: dict) -> tuple:
    return item["name"], setting(item)


def _fmt(values: list[float], scale: float = 1.0, digits: int = 2) -> str:
    return Stat(values).fmt(scale, digits, show_n=False)


# Cost fields a run may lack or hold as null (check_metrics lets both through): "–", never a crash.
def _number(value: Any, spec: str) -> str:
    return format(value, spec) if _is_number(value) else "–"


def _percent(value: Any) -> str:
    """A trainable percentage with 3 decimals, and as many more as show its first two significant
    digits: prompt tuning's 164k of a 70B model (0.00023%) printed `0.000`, read as nothing trained,
    beside its trainable count, and two small methods as one value."""
    if not _is_number(value):
        return "–"
    digits = 3
    while 0 < abs(value) < 10 ** (1 - digits) and digits < 12:
        digits += 1
    return f"{value:.{digits}f}"


def device_of(metrics: dict) -> str:
    """The device a run trained on, as metrics.json names it (its device_name, else its device),
    with the number of processes where it ran on several (`2 × NVIDIA H200`): a 2-process run's
    train s is the wall time of two devices, and its samples/s their sum, not one device's."""
    device = str(metrics.get("device_name") or metrics.get("device") or "no device recorded")
    n = metrics.get("num_processes")
    return f"{n:g} × {device}" if _is_number(n) and n > 1 else device


def by_device(ms: list[dict]) -> dict[str, list[dict]]:
    """Runs' metrics by the device each trained on, in the devices' name order."""
    out: dict[str, list[dict]] = defaultdict(list)
    for m in ms:
        out[device_of(m)].append(m)
    return dict(sorted(out.items()))


def _per_device(ms: list[dict], cell, named: bool = False) -> str:
    """A cost cell (`cell(ms)`) of one entry's seeds, one per device where they ran on several:
    the seeds of one grid point run on a GPU and on the CPU were one mean of their times (a GPU's
    10 s and a CPU's 900 s read as 455 ± 629 s), throughput and peak memory, exit 0. `named`: the
    table's rows ran on several devices, so a cell of one device names it too (`10.5 on cpu`)."""
    devices = by_device(ms)
    if len(devices) < 2:
        return cell(ms) + (f" on {next(iter(devices))}" if named and devices and cell(ms) != "–" else "")
    return "; ".join(f"{cell(group)} on {device} (n={len(group)})" for device, group in devices.items())


def _spread(ms: list[dict], key: str, named: bool = False) -> str:
    def cell(group: list[dict]) -> str:
        values = [m[key] for m in group if _is_number(m.get(key))]
        return _fmt(values, digits=1) if values else "–"
    return _per_device(ms, cell, named)


def _peak(ms: list[dict], named: bool = False) -> str:
    def cell(group: list[dict]) -> str:
        values = [m["peak_memory_mb"] for m in group if _is_number(m.get("peak_memory_mb"))]
        return f"{max(values):.0f}" if values else "–"
    return _per_device(ms, cell, named)



def groups(items: list[dict]) -> dict[tuple, list[dict]]:
    """Runs of one name and setting (all but the seed), in name order."""
    out: dict[tuple, list[dict]] = defaultdict(list)
    for item in items:
        out[_group_key(item)].append(item)
    return dict(sorted(out.items()))


def shown_names(grouped: dict[tuple, list[dict]]) -> dict[tuple, str]:
    """Each (name, setting) group's label: the run name, plus the fields that differ between that
    name's settings when it has several (`demo/sst2/minilm-lora [train.lr=0.003]`)."""
    settings: dict[str, list[str]] = defaultdict(list)
    for name, s in grouped:
        settings[name].append(s)
    out = {}
    for (name, s), members in grouped.items():
        keys = varying(settings[name]) if len(settings[name]) > 1 else []
        out[(name, s)] = f"{name} [{describe_setting(members[0], keys)}]" if keys else name
    return out


def table_rows(items: list[dict]) -> tuple[dict, dict, dict]:
    """The rows of the runs table and of its budget list: (the finished entries' groups, the groups
    of the entries every seed of which stopped, each row's shown name). An entry every seed of
    which stopped (diverged, failed, killed: no metrics.json) is a row of its own, `0 (+k not
    finished)`: it had none, named only in the report's end note, beside its finished neighbours
    (`Runs.started`). One rule for both lists: the budget list had no line for such a row, and
    named the others without the setting the table showed beside it."""
    grouped = groups(items)
    stopped = {k: v for k, v in groups(started_only(items)).items() if k not in grouped}
    return grouped, stopped, shown_names({**grouped, **stopped})


def _stopped_seeds(members: list[dict]) -> int:
    """How many seeds of an entry none of which finished were started (`not_finished`)."""
    return len(not_finished([{"recipe": {}, "metrics": {}, "unfinished": [r for m in members for r in m["unfinished"]]}]))


def rows(items: list[dict]) -> tuple[list[str], list[list[str]]]:
    """One row per run name and setting: every metric (mean ± std over seeds) and the costs. A
    seed whose metric is null (NaN or infinite: an undefined MCC or correlation, a diverged run)
    is counted beside n as the pivot counts it (`(n=1; 1 null)`, `– (n=0; 2 null)`): the cell read
    `(n=1)` beside `seeds 2`, and a metric null in every run had no column at all, exit 0."""
    decls = with_nulled(declarations(items), items)
    metric_names = [n for n in decls if n.split("_")[0] != "loss"] + [n for n in decls if n.split("_")[0] == "loss"]
    header = ["run", "method", "seeds", *[column(decls[n]) for n in metric_names], "trainable %",
              "trainable", "train s", "samples/s", "peak MB"]
    table = []
    grouped, stopped, names = table_rows(items)
    # rows that ran on other devices (LoRA on a GPU, full fine-tuning on the CPU) side by side: each
    # time, throughput and memory cell names its device, as the cost table's device column does (a
    # GPU's 10 s above a CPU's 900 s read as a 90x faster method, no device in the table, exit 0)
    named = len(by_device([i["metrics"] for i in items])) > 1
    for key, members in sorted({**grouped, **stopped}.items()):
        if key in stopped:
            left = _stopped_seeds(members)
            method = _dig(members[0]["recipe"], "method.name")
            table.append([names[key], str(method) if method is not None else "?", f"0 (+{left} not finished)",
                          *[""] * len(metric_names), "–", "–", "–", "–", "–"])
            continue
        ms = [m["metrics"] for m in members]
        left = len(not_finished(members))  # started, not finished: beside the seeds that are
        row = [names[key], ms[0].get("method", "?"), str(len(ms)) + (f" (+{left} not finished)" if left else "")
               + (" ‡" if mixed_code(members) else "")]
        for metric in metric_names:
            vals = [m["eval"][metric] for m in ms if metric in m.get("eval", {})]
            null = sum(metric in m.get("not_numbers", []) for m in members)
            # fewer values than seeds (a run without this metric, or with it null): n says how many
            text = Stat(vals).fmt(decls[metric].scale, show_n=len(vals) != len(ms)) if vals else ""
            if null:
                text = text[:-1] + f"; {null} null)" if text else f"– (n=0; {null} null)"
            row.append(text)
        row += [_percent(ms[0].get("trainable_percent")), _number(ms[0].get("trainable_params"), ","),
                _spread(ms, "train_runtime_s", named), _spread(ms, "train_samples_per_second", named), _peak(ms, named)]
        table.append(row)
    return header, table


def runs_notes(items: list[dict]) -> list[str]:
    """Overlap notes between the rows of one task on that task's main metric."""
    decls = declarations(items)
    by_task: dict[tuple[str, str], list[tuple[str, Stat]]] = defaultdict(list)
    grouped = groups(items)
    names = shown_names(grouped)
    for key, members in grouped.items():
        metric = main_metric(members)
        scored = [m for m in members if metric in m["metrics"].get("eval", {})]
        if scored:
            by_task[(label(members[0], "task"), metric)].append((names[key], seeded_stat(scored, metric)))
    notes = []
    for (task, metric), entries in by_task.items():
        notes += overlap_notes(entries, decls.get(metric, declaration(metric)), task)
    by_label: dict[str, list[tuple[str, list[dict]]]] = defaultdict(list)
    for key, members in grouped.items():
        by_label[label(members[0], "task")].append((names[key], members))
    for task, entries in by_label.items():
        # rows of one task are compared above as the pivot's cells are: where they differ in more
        # than the method and its learning rate (epochs, max length, the model...), said as there
        notes += protocol_notes([(name, Cell(members, Stat([]))) for name, members in entries], "method", task)
        notes += selected_checkpoint_note(task, entries)
    for key, members in grouped.items():
        notes += mixed_code_note(names[key], members)
        notes += kept_note(names[key], members)
        notes += same_result_note(names[key], members)
    return data_split_notes(items) + notes + not_numbers_notes(items) + skipped_notes(items)


def unread(item: dict) -> frozenset[str]:
    """The dotted recipe fields the run's method and task declare they never read
    (`Method.ignores`, `Task.ignores`: an in-context run's every training setting and
    task.max_length), as its recipe builds now; none where it does not build (a run from before a
    field was removed). Recipe.yaml still holds them at their defaults, which no number depended
    on: an icl row was said to differ from a LoRA row in train.epochs ("run them on one protocol",
    which icl refuses), and its budget said "epochs 3, max length 128, lr 2e-05, batch 8", exit 0."""
    if "unread" not in item:
        try:
            built = recipes.built(item["recipe"])
            item["unread"] = frozenset({**built.method.ignores(built.task), **built.task.ignores()})
        except (UserError, TypeError, ValueError, KeyError, AttributeError):
            item["unread"] = frozenset()
    return item["unread"]


def test_source(item: dict) -> str | None:
    """The test split a run scored, where it did (its task's `scored_source` as its recipe builds
    now: SAMSum's and IWSLT14's presets, a recipe's task.eval_file test.txt, a Hub split named
    test; or the Hub split a classifier fell back to where its data set has no validation split,
    metrics.json hub_data), else None. A checkpoint or a grid point chosen on the eval set is then
    chosen on the test split it reports, which no paper's test number is: the report's
    "selected and scored on the same dev set: optimistic, as in the papers" said otherwise."""
    if "test_source" not in item:
        try:
            source = recipes.built(item["recipe"]).task.scored_source()
        except (UserError, TypeError, ValueError, KeyError, AttributeError):
            source = None
        if source is None:  # a Hub data set without a validation split scores its test split
            for name, splits in (item["metrics"].get("hub_data") or {}).items():
                held = set(splits) if isinstance(splits, dict) else set()
                if "test" in held and not held & {"validation", "dev"}:
                    source = f"{name.split()[0]}[test]"
        item["test_source"] = source if source is not None and is_test_source(source) else None
    return item["test_source"]


def eval_set(members: Iterable[dict]) -> str:
    """'the same dev set' or, where a run scored a test split (`test_source`), 'the same test
    split (<its source>)': what a selection on the eval set was made on."""
    tests = sorted({s for m in members if (s := test_source(m))})
    return f"the same test split ({', '.join(tests)})" if tests else "the same dev set"


def split_word(members: Iterable[dict]) -> str:
    """'test' where one of these runs scored a test split (`test_source`), else 'dev': what a plot's
    axis and a curve's note call the scores (SAMSum's test ROUGE was drawn as "dev rougeL")."""
    return "test" if any(test_source(m) for m in members) else "dev"


ON_TEST = ("so its number is no held-out test score (a paper chooses on dev and scores the choice once on "
           "test): choose on a dev split (task.eval_file a dev file), then score that choice on the test split")


def budget(item: dict) -> str:
    """What a run was trained with, from its recipe and metrics.json: epochs or max steps (and
    the optimizer steps taken), train examples, max length, lr and batch; each only where the
    run read it (`unread`): a method that trains nothing says so instead."""
    tr, task, m = item["recipe"].get("train", {}), item["recipe"].get("task", {}), item["metrics"]
    skip = unread(item)
    parts = []
    if "train.epochs" in skip and "train.max_steps" in skip:
        parts.append(f"no training (method {item['recipe'].get('method', {}).get('name', '?')} trains nothing)")
    else:
        parts.append(f"max steps {tr['max_steps']}" if tr.get("max_steps") else f"epochs {tr.get('epochs', '?')}")
        if m.get("train_steps") is not None:
            parts[0] += f" ({m['train_steps']} optimizer steps)"
        if not item.get("started_only"):  # a stopped run wrote no count: said by budget_notes
            parts.append(f"{m['train_samples']} train examples" if m.get("train_samples") is not None
                         else "train examples ?")
    if "task.max_length" not in skip:
        parts.append(f"max length {task.get('max_length') or 'the model’s'}")
    if "train.lr" not in skip:
        parts.append(f"lr {tr.get('lr', '?')}")
    if "train.batch_size" not in skip:
        parts.append(batch(item))
    return ", ".join(parts)


def batch(item: dict) -> str:
    """'batch 16 × 2 accumulated × 2 processes': train.batch_size is per process, so a run on two
    processes took twice the examples per step; said as 'batch 16' alone, it read as the papers'
    (global) batch of 16."""
    tr, processes = item["recipe"].get("train", {}), item["metrics"].get("num_processes")
    return (f"batch {tr.get('batch_size', '?')}" + (f" × {tr['grad_accum']} accumulated" if (tr.get("grad_accum") or 1) > 1 else "")
            + (f" × {processes:g} processes" if _is_number(processes) and processes > 1 else ""))


def budget_notes(items: list[dict]) -> list[str]:
    """One protocol line per row of the runs table (a row's seeds share their recipe)."""
    grouped, stopped, names = table_rows(items)
    return [f"**{names[key]}**: {budget(members[0])}" + (f" (no seed finished: {_stopped_seeds(members)} not "
                                                         f"finished)" if key in stopped else "")
            for key, members in sorted({**grouped, **stopped}.items())]


def markdown(header: list[str], table: list[list[str]]) -> str:
    """A Markdown table; a `|` or a line break inside a cell (a run or model name, a setting's
    value) is escaped, or every later cell of its row would sit under another column's header."""
    def row(cells: list[str]) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|").replace("\r", " ").replace("\n", " ") for c in cells) + " |"

    return "\n".join([row(header), "|" + "|".join("---" for _ in header) + "|", *map(row, table)])


# --- pivots ----------------------------------------------------------------------------------
@dataclass
class Cell:
    """One pivot cell: the reported setting's runs and stat, and the grid it was chosen from."""

    items: list[dict]
    stat: Stat
    grid: list[tuple[str, Stat]] = field(default_factory=list)  # (setting, stat) when > 1 setting
    chosen: str = ""
    edge: str = ""  # "smallest train.lr" when the best is at an end of a one-number grid
    tied: list[str] = field(default_factory=list)  # other settings of the grid with the best's mean
    keys: list[str] = field(default_factory=list)  # the recipe fields the grid varied (selected on dev)

    @property
    def smoke(self) -> bool:
        return any(i["recipe"].get("smoke") for i in self.items)


def choose(by_setting: dict[str, list[dict]], score: Callable[[str], float]) -> tuple[str, list[str], list[str]]:
    """(the best setting by `score`, higher better; the settings in grid order; the others whose
    score equals the best's). Grid order (3e-05 before 0.0001, then the setting's text): the best
    of equal scores is the first in it, whatever the run folders' names or the settings' text, and
    the others are said as tied. One rule for every table that picks a setting on dev."""
    keys = varying(list(by_setting)) if len(by_setting) > 1 else []
    order = sorted(by_setting, key=lambda s: ([_sortable(_dig(_setting(by_setting[s][0]), k)) for k in keys], s))
    scores = {s: score(s) for s in order}
    top = max(scores.values())
    # equal to float rounding is equal: MRPC's (0.84 + 0.86) / 2 and (0.80 + 0.90) / 2 differ in
    # the 16th digit, which chose between them (the rule of no_spread)
    level = [s for s in order if top - scores[s] <= 1e-9 * max(1.0, abs(top))]
    return level[0], order, level[1:]


def best_setting(items: list[dict], metric: Metric) -> Cell | None:
    """Group by setting; the best mean on `metric` (its declared direction) is reported."""
    by_setting: dict[str, list[dict]] = defaultdict(list)
    for item in items:
        if metric.name in item["metrics"].get("eval", {}):
            by_setting[setting(item)].append(item)
    if not by_setting:
        return None
    stats = {s: seeded_stat(members, metric.name) for s, members in by_setting.items()}
    keys = varying(list(stats)) if len(stats) > 1 else []
    best, order, tied = choose(by_setting, lambda s: stats[s].mean if metric.higher_is_better else -stats[s].mean)
    cell = Cell(by_setting[best], stats[best])
    if len(stats) > 1:
        cell.grid = [(describe_setting(by_setting[s][0], keys), stats[s]) for s in order]
        cell.chosen = describe_setting(by_setting[best][0], keys)
        cell.keys = keys
        cell.tied = [describe_setting(by_setting[s][0], keys) for s in tied]
        cell.edge = "" if cell.tied else grid_edge({s: by_setting[s][0] for s in stats}, best, keys)
    return cell


def _numeric(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _sortable(value: Any) -> tuple:
    """Numbers by value, before anything else (by its text)."""
    if _numeric(value):
        return (0, float(value), "")
    return (1, 0.0, json.dumps(value, sort_keys=True))


def grid_edge(firsts: dict[str, dict], best: str, keys: list[str]) -> str:
    """When one numeric field varies over 3 or more values and the best is its smallest or
    largest, say which: the optimum may lie outside the grid."""
    if len(keys) != 1 or len(firsts) < 3:
        return ""
    values = {s: _dig(_setting(item), keys[0]) for s, item in firsts.items()}
    if not all(map(_numeric, values.values())):
        return ""
    if values[best] == max(values.values()):
        return f"largest {keys[0]}"
    if values[best] == min(values.values()):
        return f"smallest {keys[0]}"
    return ""


@dataclass
class Pivot:
    metric: Metric
    rows: list[str]
    cols: list[str]
    cells: dict[tuple[str, str], Cell]
    row_key: str
    col_key: str
    nulls: dict[tuple[str, str], list[dict]] = field(default_factory=dict)  # runs whose metric is null
    left: dict[tuple[str, str], list[dict]] = field(default_factory=dict)  # runs started, not finished


def _has(data: Any, dotted: str) -> bool:
    *parents, last = dotted.split(".")
    for part in parents:
        data = data.get(part) if isinstance(data, dict) else None
    return isinstance(data, dict) and last in data


def _in_some_recipe(items: list[dict], key: str, where: str) -> None:
    """A recipe field as a pivot axis is a field some run's recipe has: `--rows train.lrr` (a typo)
    made one row labelled '–', exit 0, as if no run had set it."""
    fields = sorted({k for item in items for k in _flat(item["recipe"])})
    if key in SECTIONS and key not in LABELS:
        # `--rows train`: a row per whole section as text, each seed's its own (the seed is in it), exit 0
        inside = [f for f in fields if f.startswith(key + ".")]
        raise UserError(f"report {where} '{key}': that is a section of settings, not one field; name one "
                        f"field of it, such as {', '.join(inside[:3])}")
    if key in LABELS or any(_has(item["recipe"], key) for item in items):
        return
    raise UserError(f"report {where} '{key}': no run's recipe has that field{did_you_mean(key, fields)}")


def pivots(items: list[dict], row_key: str, col_key: str, metrics: list[str] | None = None) -> list[Pivot]:
    """One table per metric: rows x cols, each cell the best setting's mean ± std (n)."""
    check_axis(row_key, "--rows")
    check_axis(col_key, "--cols")
    if row_key == col_key:  # every run on the diagonal: a table that compares nothing with anything
        raise UserError(f"report: --rows and --cols are both '{row_key}'; give two axes, e.g. --rows task --cols method")
    metrics = list(dict.fromkeys(metrics)) if metrics else metrics  # `--metric f1 --metric f1`: one table, not two
    _in_some_recipe(items, row_key, "--rows")
    _in_some_recipe(items, col_key, "--cols")
    # a metric null in some run (NaN or infinite: a diverged seed, an undefined correlation): its
    # cells say so, and a main metric null in every run is still a table, of its nulls
    decls = with_nulled(declarations(items), items)
    wanted = metrics or [m for m in dict.fromkeys(main_metric([i]) for i in items) if m in decls]
    for name in wanted:
        if name not in decls:
            raise UserError(f"report --metric '{name}': no run has it (runs have: {', '.join(decls)})")
        if not decls[name].score:
            # a pivot reports each cell's best setting by the metric and ranks its cells by it
            raise UserError(f"report --metric '{name}': it is not a score (a value tuned on the dev set, such as "
                            "a threshold), so no setting is better for a higher or lower one; pivot a score: "
                            f"{', '.join(n for n, m in decls.items() if m.score)}")
    out = []
    for name in wanted:
        metric = decls[name]
        members: dict[tuple[str, str], list[dict]] = defaultdict(list)
        nulls: dict[tuple[str, str], list[dict]] = defaultdict(list)
        for item in items:
            key = (label(item, row_key), label(item, col_key))
            if name in item["metrics"].get("eval", {}):
                members[key].append(item)
            elif name in item.get("not_numbers", []):
                nulls[key].append(item)
        for (r, c) in sorted(set(members) | set(nulls)):
            one_task_and_model(members.get((r, c), []) + nulls.get((r, c), []), f"{r} / {c}", row_key, col_key)
        cells = {k: c for k, v in members.items() if (c := best_setting(v, metric)) is not None}
        # counted at the reported setting: a grid point's seeds that stopped are its own, not "finished
        # elsewhere" because they finished at another point of the grid (`not_finished_at`)
        left = {k: runs for k in {*members, *nulls} if (runs := not_finished_at(
            members.get(k, []) + nulls.get(k, []), cells[k].items if k in cells else []))}
        # a method or task every seed of which stopped (no finished run to join): its own cell, `– (n=0;
        # k not finished)`, in the tables of the metrics its task's finished runs have (all, where none)
        scored = defaultdict(set)
        for item in items:
            scored[label(item, "task")] |= {*item["metrics"].get("eval", {}), *item.get("not_numbers", [])}
        alone: dict[tuple[str, str], list[dict]] = defaultdict(list)
        for stand_in in started_only(items):
            key = (label(stand_in, row_key), label(stand_in, col_key))
            if key not in members and key not in nulls and name in scored.get(label(stand_in, "task"), {name}):
                alone[key] += stand_in["unfinished"]
        left |= {k: not_finished([{"recipe": {}, "metrics": {}, "unfinished": runs}]) for k, runs in alone.items()}
        row_names = sorted({r for r, _ in [*cells, *nulls, *left]}, key=_axis_order)
        col_names = sorted({c for _, c in [*cells, *nulls, *left]}, key=_axis_order)
        out.append(Pivot(metric, row_names, col_names, cells, row_key, col_key, dict(nulls), left))
    return out


def _axis_order(value: str) -> tuple:
    """A pivot axis in numeric order where its labels are numbers (`--rows train.lr`: 1e-05 before
    0.0001, not after 0.001 as text sorts them), else by text."""
    try:
        return (0, float(value), value)
    except ValueError:
        return (1, 0.0, value)


def one_task_and_model(items: list[dict], cell: str, row_key: str, col_key: str) -> None:
    """A cell reports the best of its settings on dev: a grid of training settings of one task
    and one model. Runs of several tasks (or models) in one cell had the "best" chosen across
    them (`reported task.subset=sst2, the best of [rte; sst2]`): refused, naming the axis to add."""
    for axis in ("task", "model"):
        found = sorted({label(i, axis) for i in items})
        if len(found) > 1:
            raise UserError(f"report: the cell {cell} ({row_key} \\ {col_key}) holds runs of {len(found)} "
                            f"{axis}s ({', '.join(found)}), and a cell reports the best setting of one {axis}; "
                            f"put {axis} on --rows or --cols, or report those runs apart")


def pivot_markdown(p: Pivot) -> str:
    head = [f"{p.row_key} \\ {p.col_key}", *p.cols]
    table = []
    for r in p.rows:
        row = [r]
        for c in p.cols:
            cell, null, left = p.cells.get((r, c)), len(p.nulls.get((r, c), [])), len(p.left.get((r, c), []))
            counts = [f"{null} null"] * bool(null) + [f"{left} not finished"] * bool(left)
            text = "" if cell is None else cell.stat.fmt(p.metric.scale, show_n=False) + f" (n={cell.stat.n}"
            text += (f"; {'; '.join(counts)})" if text else f"– (n=0; {'; '.join(counts)})") if counts else (")" if text else "")
            row.append(text + ("" if cell is None else (" †" if cell.smoke else "") + (" ‡" if mixed_code(cell.items) else "")))
        table.append(row)
    return markdown(head, table)


def other_seeds(points: list[tuple[str, list[dict]]]) -> str:
    """'' where a grid's points ran one set of seeds; else the clause that says each point's: a
    point of one seed beside points of three is chosen on one seed's luck, and a best chosen
    over other seeds is not a comparison of the settings alone."""
    sets = {desc: sorted({seed_of(r) for r in runs}, key=_sortable) for desc, runs in points}
    if len({json.dumps(v, default=str) for v in sets.values()}) < 2:
        return ""
    return ("its settings ran other seeds (" + "; ".join(f"{d}: {_seeds(v)}" for d, v in sets.items())
            + "): the best is chosen on other evidence per setting, not on the settings alone")


def _with_left(text: str, left: list[dict]) -> str:
    """'84.43 ± 0.01 (n=3)' with its setting's seeds not finished counted beside n: a grid's best
    is chosen among the seeds that finished, and a point most of whose seeds diverged read as
    a whole point."""
    return text[:-1] + f"; {len(left)} not finished)" if left else text


def pivot_notes(p: Pivot) -> list[str]:
    notes = data_split_notes([i for cell in p.cells.values() for i in cell.items]
                             + [i for runs in p.nulls.values() for i in runs])
    for r in p.rows:
        notes += overlap_notes([(c, p.cells[(r, c)].stat) for c in p.cols if (r, c) in p.cells], p.metric, r,
                               {c: len(p.cells[(r, c)].grid) for c in p.cols if (r, c) in p.cells})
        notes += protocol_notes([(c, p.cells[(r, c)]) for c in p.cols if (r, c) in p.cells], p.col_key, r)
        notes += selected_checkpoint_note(r, [(c, p.cells[(r, c)].items) for c in p.cols if (r, c) in p.cells])
    for (r, c), runs in sorted(p.nulls.items()):
        notes.append(f"{r} / {c}: {p.metric.name} is null (NaN or infinite: a diverged run, an undefined correlation) "
                     f"in {len(runs)} run(s), left out of the cell's mean, its n and its choice of setting, never "
                     f"dropped without a word: {'; '.join(str(i['run']) for i in runs)}")
    for (r, c), runs in sorted(p.left.items()):
        notes.append(f"{r} / {c}: {len(runs)} run(s) started and not finished (no metrics.json: stopped, failed, "
                     f"diverged, killed, or running now), out of the cell's mean, its n and its choice of setting: "
                     f"{not_finished_text(runs)}")
    for (r, c), cell in sorted(p.cells.items()):
        notes += mixed_code_note(f"{r} / {c}", cell.items)
        notes += kept_note(f"{r} / {c}", cell.items)
        notes += same_result_note(f"{r} / {c}", cell.items)
        notes += skipped_notes(cell.items, f"{r} / {c}: ")
        if cell.grid:
            # the best prints apart from every setting it was chosen over (a tie is said as one)
            d = digits_apart((cell.stat.mean * p.metric.scale, st.mean * p.metric.scale) for _, st in cell.grid)
            grid = "; ".join(f"{desc}: {_with_left(st.fmt(p.metric.scale, d), not_finished(st.runs))}"
                             + (" ‡" if mixed_code(st.runs) else "") for desc, st in cell.grid)
            said = comparison_code([(desc, st.runs) for desc, st in cell.grid])  # the choice reads them all
            chosen_on = eval_set(st_run for _, st in cell.grid for st_run in st.runs)
            notes.append(("‡ " if said else "") + f"{r} / {c}: reported {cell.chosen}, the best mean {p.metric.name} "
                         f"{'on dev' if chosen_on.endswith('dev set') else 'on its test split'} of the grid "
                         f"[{grid}] (selected and scored on {chosen_on}"
                         + (": optimistic, as in the papers)" if chosen_on.endswith("dev set") else f", {ON_TEST})")
                         + (f"; the best is the grid's {cell.edge}, so a wider grid may do better" if cell.edge else "")
                         + (f"; tied on the mean with {', '.join(cell.tied)}: the first in grid order is reported, "
                            "the data does not choose between them" if cell.tied else "")
                         + (f"; its runs did not all run on one code: {said}: the choice is not between the "
                            "settings alone" if said else "")
                         + (f"; {other}" if (other := other_seeds([(d, st.runs) for d, st in cell.grid])) else ""))
    if any(c.smoke for c in p.cells.values()):
        notes.append("† smoke run: a small random-weight model; the number only shows the path runs")
    return notes


# The learning rate, which each method runs at its own (LoRA 1e-3 beside full 1e-4, as the papers
# and the shipped recipes do; the grid it was chosen from is said in the grid note), and the fields
# that do not change a run's numbers (NO_EFFECT): cells side by side that differ in them are on one
# protocol.
NOT_PROTOCOL = NO_EFFECT | {"train.lr"}


def _protocol(item: dict) -> dict[str, Any]:
    """What a run's numbers depend on besides its seed: the resolved recipe but the fields it
    never read (`unread`), the process count, the data and base run (as _setting), and the
    toolkit's commit (its version)."""
    code = {("toolkit commit" if k == "toolkit" else f"{k} version"): v for k, v in code_of(item).items()}
    skip = unread(item)
    # the strategy by its name where the setting leaves it out (one process, DDP: their process
    # counts tell them apart), for a note beside an FSDP or ZeRO cell
    return {**{k: v for k, v in _flat(_setting(item)).items() if k not in skip},
            "strategy": run_folders.recorded_strategy(item["metrics"]), **code}


def _on_axis(key: str, axis: str) -> bool:
    """Whether a flat recipe field is the compared axis itself (`method` covers method.r), or
    follows from it."""
    follows = {"task": ("data", "hub", "eval", "scoring"), "model": ("base", "base_weights")}  # another task has other data; another model, another base run
    return axis != "run" and (key == axis or key.startswith(axis + ".") or key in follows.get(axis, ()))


def protocol_notes(cells: list[tuple[str, Cell]], axis: str, context: str) -> list[str]:
    """One line where cells shown side by side (one pivot row) differ in more than the compared
    axis, a grid's selected fields and the learning rate: epochs, max length, a training subset,
    process count, the toolkit's version... Their gap is not the axis's alone. Eval sets are said
    by data_labels (each eval set is a task of its own)."""
    if len(cells) < 2:
        return []
    # which checkpoint each cell's runs report (the best on dev, or the last step): keep_best alike,
    # a run whose selection metric was never defined kept its last step beside best-on-dev cells
    protocols = [(name, {**_protocol(cell.items[0]), **({"checkpoint kept": kept} if (kept := kept_kinds(cell.items))
                                                        else {})}) for name, cell in cells]
    # a field a cell never read (`unread`) is no difference of that cell's: among those that read it
    # (a run that reads no train.keep_best, icl, trained no checkpoint to keep: none was chosen)
    skips = {name: unread(cell.items[0]) | ({"checkpoint kept"} if "train.keep_best" in unread(cell.items[0]) else set())
             for name, cell in cells}
    # a field is a selection, not a difference, where every cell chose it on dev: LoRA the best of
    # 1 and 3 epochs beside full's one run of 10 was not said (one cell's grid excused the other's)
    selected = set.intersection(*(set(cell.keys) for _, cell in cells))
    keys = sorted({k for _, pr in protocols for k in pr})
    code = {k for _, pr in protocols for k in pr if k == "toolkit commit" or k.endswith(" version")
            or k == "checkpoint kept"}  # not recorded (a run from before `kept`): not a difference
    differ = [k for k in keys if k not in NOT_PROTOCOL and k not in selected and not _on_axis(k, axis)
              and len({json.dumps(pr.get(k), sort_keys=True, default=str) for name, pr in protocols
                       if (k not in code or k in pr) and k not in skips[name]}) > 1  # a version not recorded is not a difference
              and (k != "strategy" or any(pr[k] not in run_folders.NEUTRAL_STRATEGIES for _, pr in protocols))]
    if not differ:
        return []
    said = "; ".join(f"{k} (" + ", ".join(f"{name}: {shown(pr.get(k))}" for name, pr in protocols if k not in skips[name]) + ")"
                     for k in differ)
    return [f"{context}: {', '.join(name for name, _ in cells)} differ in more than {axis}: {said}; "
            f"their gap is not the {axis}'s alone: run them on one protocol to compare them"]


def cost_table(p: Pivot) -> str:
    """Per cell, at the reported setting: parameters, time, throughput, memory and device; a
    cell whose seeds ran on other code is marked ‡ as in the pivot."""
    head = [p.row_key, p.col_key, "trainable", "trainable %", "train s", "samples/s", "peak MB", "device"]
    table = []
    for (r, c), cell in sorted(p.cells.items()):
        ms = [i["metrics"] for i in cell.items]
        devices = sorted({device_of(m) if m.get("device_name") or m.get("device") else "?" for m in ms})
        mark = " ‡" if mixed_code(cell.items) else ""  # the pivot cell's line says which code ran what
        table.append([r, c + mark, _number(ms[0].get("trainable_params"), ","), _percent(ms[0].get("trainable_percent")),
                      _spread(ms, "train_runtime_s"), _spread(ms, "train_samples_per_second"), _peak(ms),
                      ", ".join(devices)])
    return markdown(head, table)


# --- the whole report ------------------------------------------------------------------------
def provenance(items: list[dict]) -> str:
    devices = sorted({str(i["metrics"].get("device_name") or i["metrics"].get("device", "?")) for i in items})
    commits = sorted({str(i["metrics"].get("git_commit") or "unknown")[:12] for i in items})
    return f"{len(items)} finished runs; devices: {', '.join(devices)}; git commits: {', '.join(commits)}."
