"""The GLUE benchmark table: official metrics per task, the GLUE average as GLUE defines it, and
published numbers beside ours with the protocol of each.

GLUE's score (Wang et al. 2019): a task with several metrics scores the unweighted mean of them
(MRPC and QQP: accuracy and F1; STS-B: Pearson and Spearman; MNLI: matched and mismatched
accuracy), and the benchmark average is the unweighted mean of the task scores. Over fewer than
the nine tasks it is an average of those tasks only, said so beside it, and the published rows
are averaged over the same tasks so the two can be compared. Written by hand: no library keeps
seeded runs, task scores and published protocols together.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from importlib import resources
from typing import Any

from toolkit.errors import UserError
from toolkit.recipe_data import safe_yaml
from toolkit.reports import core as report
from toolkit.tasks.glue import SPECS

ORDER = ["cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli"]
TITLES = {"cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "stsb": "STS-B", "qqp": "QQP", "mnli": "MNLI",
          "qnli": "QNLI", "rte": "RTE", "wnli": "WNLI"}
SHORT = {"accuracy": "acc", "f1": "F1", "matthews_correlation": "MCC", "pearson": "Pearson",
         "spearmanr": "Spearman"}


def official(task: str) -> list[str]:
    """The eval keys GLUE scores a task by: each metric on each dev split (MNLI: m and mm)."""
    spec = SPECS[task]
    return [m + sfx for sfx in spec.dev_files for m in spec.metrics]


def task_score(evals: dict[str, float], task: str) -> float | None:
    """Mean of the task's official metrics (fractions); None when one is missing."""
    keys = official(task)
    if any(k not in evals for k in keys):
        return None
    return statistics.mean(evals[k] for k in keys)


def glue_average(scores: dict[str, float]) -> float:
    """Unweighted mean of task scores: GLUE's macro-average over the tasks given."""
    return statistics.mean(scores.values())


def published() -> list[dict[str, Any]]:
    """The published entries shipped with the toolkit (toolkit/data/published.yaml)."""
    text = resources.files("toolkit").joinpath("data/published.yaml").read_text()
    return safe_yaml(text, "toolkit/data/published.yaml")


def _cells(items: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """(row label: model + method, task) -> every finished GLUE run of it."""
    cells: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for item in items:
        task = _subset(item)
        if item["recipe"].get("task", {}).get("name") == "glue" and task in SPECS:
            model = report.label(item, "model")  # a smoke run's says so, kept at the row's end
            row = f"{model.removesuffix(report.SMOKE)} {report.method_label(item)}" + report.SMOKE * model.endswith(report.SMOKE)
            cells[(row, task)].append(item)
    return dict(sorted(cells.items()))


def not_finished(items: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """(row, task) -> the runs started for that cell and not finished (report.not_finished: a seed
    that diverged and stopped, or was killed): the cell's n counts the seeds that finished only,
    and read as every seed `make glue` started where one failed, its mean flattering the row."""
    rows = _rows(items)  # counted at the reported setting (report.not_finished_at: an lr grid's point)
    left = {key: runs for key, members in _cells(items).items()
            if (runs := report.not_finished_at(members, rows.get(key[0], {}).get(key[1], [])))}
    # a row or task every seed of which stopped has no finished run to join: its own cell (`– (n=0;
    # k not finished)`), labelled by _cells as a finished run of its recipe is
    cells = _cells(items)
    for key, stand_ins in _cells(report.started_only(items)).items():
        if key not in cells:
            left[key] = report.not_finished([{"recipe": {}, "metrics": {}, "unfinished": [
                r for s in stand_ins for r in s["unfinished"]]}])
    return dict(sorted(left.items()))


def _settings(items: list[dict]) -> dict[tuple[str, str], dict[str, list[dict]]]:
    """(row label: model + method, task) -> setting -> its runs that have the task score."""
    out: dict[tuple[str, str], dict[str, list[dict]]] = {}
    for (row, task), members in _cells(items).items():
        one_data(row, task, members)
        by_setting: dict[str, list[dict]] = defaultdict(list)
        for m in members:
            if task_score(m["metrics"]["eval"], task) is not None:
                by_setting[report.setting(m)].append(m)
        if by_setting:
            out[(row, task)] = dict(by_setting)
    return out


def one_data(row: str, task: str, members: list[dict]) -> None:
    """A GLUE cell is one task's data and metrics: runs of it on other data (another data_dir, an
    edited file, a Hub revision with other rows) or scored under another definition of a metric
    (metrics.json metric_info: the report's task label tells them apart) had their
    "best" chosen across the versions as if a grid of settings, exit 0. One line."""
    labels = sorted({report.label(m, "task") for m in members})
    if len(labels) > 1:
        raise UserError(f"report --glue: {row} / {TITLES[task]} holds runs on {len(labels)} versions of its data, eval set "
                        "or metric definitions "
                        f"({'; '.join(labels)}), and a GLUE cell pools the seeds of one: remove the runs of the "
                        "versions you do not report, or report each version's runs folder apart")


def _rows(items: list[dict]) -> dict[str, dict[str, list[dict]]]:
    """row label (model + method) -> task -> the runs of its best setting (on the task score)."""
    out: dict[str, dict[str, list[dict]]] = defaultdict(dict)
    for (row, task), by_setting in _settings(items).items():
        out[row][task] = by_setting[_choice(by_setting, task)[0]]
    return dict(out)


def _choice(by_setting: dict[str, list[dict]], task: str) -> tuple[str, list[str], list[str]]:
    """The best setting on the mean task score, the grid order and the tied: the pivot's rule
    (core.choose). A tie went to the setting whose text sorted first (lr 0.0001 before 3e-05),
    and was not said."""
    return report.choose(by_setting, lambda s: statistics.mean(task_score(m["metrics"]["eval"], task)
                                                              for m in by_setting[s]))


def grids(items: list[dict]) -> dict[tuple[str, str], str]:
    """(row, task) -> "the best of 3 settings (train.lr)" where a cell's number was chosen on dev
    among several: reported on that same dev set, it is optimistic, and the protocol says so."""
    out = {}
    for (row, task), by in _settings(items).items():
        if len(by) > 1:
            keys = report.varying(list(by))
            best, _, tied = _choice(by, task)
            out[(row, task)] = (f"the best of {len(by)} settings ({', '.join(keys)}) on the dev score, "
                                "selected and scored on the same dev set: optimistic"
                                + (f"; {report.describe_setting(by[best][0], keys)} reported, tied on the mean with "
                                   f"{', '.join(report.describe_setting(by[s][0], keys) for s in tied)} (the first "
                                   "in grid order; the data does not choose between them)" if tied else "")
                                + (f"; {other}" if (other := report.other_seeds(
                                    [(report.describe_setting(by[k][0], keys), by[k]) for k in by])) else ""))
    return out


def _average_stat(cells: dict[str, list[dict]]) -> tuple[report.Stat, bool]:
    """The GLUE average per seed (seeds present in every task), then mean ± std over seeds.
    Falls back to the mean of task means (no spread) when no seed is common to all tasks."""
    per_seed: dict[str, dict[Any, float]] = {
        t: {report.seed_of(m): task_score(m["metrics"]["eval"], t) for m in ms} for t, ms in cells.items()}
    common = set.intersection(*(set(v) for v in per_seed.values()))
    if common:
        seeds = sorted(common, key=str)
        return report.Stat([glue_average({t: per_seed[t][s] for t in cells}) for s in seeds], seeds), True
    return report.Stat([glue_average({t: statistics.mean(v.values()) for t, v in per_seed.items()})]), False


def _average_runs(cells: dict[str, list[dict]]) -> list[dict]:
    """The runs the GLUE average is computed from (`_average_stat`): those of the seeds every task
    ran, or every run where no seed is common to all tasks."""
    common = set.intersection(*({report.seed_of(m) for m in ms} for ms in cells.values()))
    return [m for t in sorted(cells, key=ORDER.index) for m in cells[t] if not common or report.seed_of(m) in common]


def part_of_dev(runs: list[dict], suffix: str = "") -> str | None:
    """What a cell's runs were scored on, on the dev split of eval keys ending in `suffix` (MNLI's
    matched "", mismatched "_mm"), where it is not the whole dev split that GLUE's dev numbers and
    the published dev rows are on (their recipe's task: one setting per cell), else None: a carved
    remainder (task.train_from_dev: trained on the rest of dev, not on train.tsv; the task carves
    its first dev split alone, MNLI's matched: the mismatched split is scored whole) or a random
    subset (task.max_eval_samples, of every dev split; not where the runs' metrics.json
    `eval_samples` shows the split scored whole: a cap above its size, RTE's 277 under 1000, was
    said as "not the whole dev split", exit 0)."""
    task = runs[0]["recipe"].get("task", {}) if runs else {}
    carve, cap = None if suffix else task.get("train_from_dev"), task.get("max_eval_samples")
    scored = [m["metrics"].get("eval_samples", {}).get(suffix) for m in runs]
    if cap and all(isinstance(n, int) and n < cap for n in scored):  # fewer than the cap: the whole split
        cap = None
    parts = []
    if carve:
        parts.append(f"the {1 - carve:.0%} of the dev split left after training on a seeded {carve:.0%} of it "
                     f"(task.train_from_dev={carve}; no train.tsv)")
    if cap:
        parts.append(f"{'of that ' if carve else ''}at most a fixed random {cap} dev examples (task.max_eval_samples={cap})")
    return ", ".join(parts) or None


PART = " §"  # a cell scored on part of dev: its note says which part


def part_of_train(runs: list[dict]) -> str | None:
    """What a cell's runs trained on where it is not the whole training set that GLUE's dev
    numbers and the published rows trained on: a fixed random subset (task.max_train_samples, where
    metrics.json's train_samples shows the set was cut: a cap at or above the set's size trained on
    all of it), else None. Such a cell sat beside the published rows unmarked, said only among the
    protocols below the tables, exit 0. (task.train_from_dev, no train.tsv at all, is part_of_dev's.)"""
    task = runs[0]["recipe"].get("task", {}) if runs else {}
    cap = task.get("max_train_samples")
    if not cap or task.get("train_from_dev"):
        return None
    sizes = [m["metrics"].get("train_samples") for m in runs]
    if all(isinstance(n, int) and 0 < n < cap for n in sizes):  # fewer than the cap: the whole set
        return None
    return f"a fixed random {cap} of the training examples (task.max_train_samples={cap})"


SUBSET = " ¶"  # a cell trained on part of the training set: its note says so


def key_suffix(task: str, key: str) -> str:
    """The dev split an official eval key is scored on, by its suffix ("" or MNLI's "_mm")."""
    return next((sfx for sfx in SPECS[task].dev_files if sfx and key.endswith(sfx)), "")


def parts_of_dev(runs: list[dict], task: str) -> dict[str, str]:
    """{column: what it was scored on} for a cell's dev splits scored on part of dev
    (`part_of_dev`): "" for the whole task where every split was scored alike, else each such
    split's column suffix ("-m", "-mm", as the table's head): MNLI with task.train_from_dev carves
    matched alone, and its mismatched column, scored on the whole split, was marked too."""
    said = {sfx: part_of_dev(runs, sfx) for sfx in SPECS[task].dev_files}
    if len(set(said.values())) == 1:
        return {"": part} if (part := next(iter(said.values()))) else {}
    return {("-" + sfx.lstrip("_") if sfx else "-m"): part for sfx, part in said.items() if part}


def _task_of(item: dict) -> str:
    return TITLES.get(_subset(item), _subset(item))


def _subset(item: dict) -> str:
    """The GLUE task a run is of (its recipe's task.subset), whatever its report axis label says."""
    return str(item["recipe"].get("task", {}).get("subset"))


def _average_mark(cells: dict[str, list[dict]]) -> str:
    """' ‡' where the GLUE average pools runs of other code: a task cell of mixed code, or tasks
    that ran on different code from one another (each cell of one code); then ' §' where a task
    scored on part of dev (`part_of_dev`): the average holds a number not on GLUE's dev split."""
    return ((" ‡" if report.mixed_code(_average_runs(cells), _task_of) else "")
            + (PART if any(part_of_dev(ms) for ms in cells.values()) else "")
            + (SUBSET if any(part_of_train(ms) for ms in cells.values()) else ""))


def without_score(items: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """(row, task) -> its finished runs with no task score (an official metric null or absent:
    `unscored_notes` names each): out of the cell's n, counted beside it as the pivot counts a
    null run, where `(n=1)` read as every seed that ran (a CoLA seed whose MCC is undefined on
    one-class predictions, dropped, its cell the mean of the seeds that scored)."""
    return {key: runs for key, members in _cells(items).items()
            if (runs := [m for m in members if task_score(m["metrics"]["eval"], key[1]) is None])}


def ours_table(rows: dict[str, dict[str, list[dict]]], tasks: list[str],
               left: dict[tuple[str, str], list[dict]] | None = None,
               no_score: dict[tuple[str, str], list[dict]] | None = None) -> str:
    head = ["model / method"]
    for t in tasks:
        for key in official(t):
            base = key.removesuffix("_mm")
            split = "-mm" if key.endswith("_mm") else "-m" if t == "mnli" else ""
            head.append(f"{TITLES[t]}{split} {SHORT.get(base, base)}")
    head.append("GLUE avg")
    table = []
    for row, cells in rows.items():
        line = [row]
        for t in tasks:
            for key in official(t):
                vals = [m["metrics"]["eval"][key] for m in cells.get(t, [])]
                mark = " ‡" if report.mixed_code(cells.get(t, [])) else ""  # seeds on other code: a line below
                mark += PART if vals and part_of_dev(cells[t], key_suffix(t, key)) else ""
                mark += SUBSET if vals and part_of_train(cells[t]) else ""
                # seeds that ran and are out of n: no task score, or started and not finished
                out = [f"{n} no score" for n in [len((no_score or {}).get((row, t), []))] if n]
                out += [f"{n} not finished" for n in [len((left or {}).get((row, t), []))] if n]
                text = report.Stat(vals).fmt(100.0) if vals else ""
                line.append((text[:-1] + "".join(f"; {o}" for o in out) + ")") + mark if vals
                            else f"– (n=0; {'; '.join(out)})" if out else "–")
        if not cells:  # a row none of whose seeds finished with a score: its cells say what ran
            table.append(line + ["–"])
            continue
        stat, paired = _average_stat(cells)
        note = "" if set(cells) == set(tasks) else f" over {len(cells)} tasks"
        # a seed some task lacks is out of the per-seed average: said, so n is not read as every seed
        ran = {report.seed_of(m) for ms in cells.values() for m in ms}
        if paired and len(stat.seeds) < len(ran):
            note += f" (seeds scored on every task only: {', '.join(map(str, stat.seeds))})"
        # no seed ran every task: one mean of the task means, of no one seed, whose "(n=1)" read as
        # a single run's average (every task's cell above it n=3)
        line.append(stat.fmt(100.0, show_n=paired) + _average_mark(cells) + note
                    + ("" if paired else " (the mean of the task means: no seed ran every task, so no per-seed "
                                         "average and no spread)"))
        table.append(line)
    return report.markdown(head, table)


def _published_score(entry: dict, task: str) -> float | None:
    scores = entry.get("scores", {})
    if task == "mnli" and "mnli" in scores and "mnli_mm" in scores:
        return (scores["mnli"] + scores["mnli_mm"]) / 2
    return scores.get(task)


def published_keys(entry: dict, task: str) -> list[str] | None:
    """The official eval keys (`official`) a published task number is on: its stated metric on each
    dev split the entry has a number for (`mnli` is matched, `mnli_mm` mismatched, as
    published.yaml says). None: a source that does not state its metric (shown as printed)."""
    stated = entry.get("metrics", {})
    metric = stated.get(task, stated.get("other"))
    if metric not in SHORT or task not in SPECS:
        return None
    scores = entry.get("scores", {})
    return [metric + sfx for sfx in SPECS[task].dev_files if task + sfx in scores]


def other_metric(entry: dict, task: str) -> str | None:
    """What a published number is on where it is not GLUE's task score, which ours is (BERT's
    MRPC: F1 alone, not the mean of accuracy and F1; LoRA's STS-B: Pearson alone, not with
    Spearman; MiniLM's MNLI: the matched split alone, not matched and mismatched): "F1 only",
    "matched only". None: the same score, or a source that does not state its metric."""
    keys = published_keys(entry, task)
    if not keys or sorted(keys) == sorted(official(task)):
        return None
    metrics = list(dict.fromkeys(k.removesuffix("_mm") for k in keys))
    splits = [("mismatched" if k.endswith("_mm") else "matched") for k in keys if k.startswith(metrics[0])]
    said = [SHORT[m] for m in metrics] if len(metrics) < len(SPECS[task].metrics) else []
    said += splits if len(splits) < len(SPECS[task].dev_files) else []
    return f"{', '.join(said)} only"


def side_by_side(rows: dict[str, dict[str, list[dict]]], tasks: list[str], entries: list[dict]) -> str:
    """Task scores (ours by GLUE's definition, theirs as published) and averages over our tasks."""
    head = ["row", *[TITLES[t] for t in tasks], f"avg of these {len(tasks)}", "source's own avg"]
    table = []
    for row, cells in rows.items():
        line = [f"ours: {row}"]
        for t in tasks:
            vals = [task_score(m["metrics"]["eval"], t) for m in cells.get(t, [])]
            mark = " ‡" if report.mixed_code(cells.get(t, [])) else ""  # the runs of the line above's ‡
            mark += PART if vals and part_of_dev(cells[t]) else ""
            mark += SUBSET if vals and part_of_train(cells[t]) else ""
            line.append(report.Stat(vals).fmt(100.0, show_n=False) + mark if vals else "–")
        stat, _ = _average_stat(cells)
        line += [stat.fmt(100.0, show_n=False) + _average_mark(cells) if set(cells) == set(tasks) else "–", "–"]
        table.append(line)
    for e in entries:
        vals = {t: _published_score(e, t) for t in tasks}
        line = [f"{e['id']} ({e['split'].split()[0]})"]
        other = {t: other_metric(e, t) for t in tasks}
        # a number on another metric is shown with it, and kept out of the average beside ours
        line += ["–" if vals[t] is None else f"{vals[t]:.1f}" + (f" ({other[t]})" if other[t] else "") for t in tasks]
        have = [v for t, v in vals.items() if v is not None and not other[t]]
        line.append(f"{statistics.mean(have):.1f}" if len(have) == len(tasks) else "–")
        line.append(f"{e['average']['value']:.1f}" if e.get("average") else "–")
        table.append(line)
    return report.markdown(head, table)


def protocols(entries: list[dict]) -> list[str]:
    out = []
    for e in entries:
        metrics = ", ".join(f"{k}: {v}" for k, v in e.get("metrics", {}).items())
        avg = f" Its own average {e['average']['value']} is over {e['average']['over']}." if e.get("average") else ""
        out.append(f"**{e['id']}** ({e['model']}, {e['method']}): {e['source']}. Split: {e['split']}. "
                   f"Statistic: {e['statistic']} (seeds: {e['seeds']}). Init: {e['init']}. Metrics: {metrics}.{avg} "
                   f"Not reproduced here: {e['not_here']}.")
    return out


def _training_set(metrics: dict, task: dict) -> str:
    """", all 3668 training examples", or ", a fixed random 10000 of the training examples" when
    task.max_train_samples cut the set (metrics.json's train_samples is the training set's size)."""
    cap, size = task.get("max_train_samples"), metrics.get("train_samples")
    if not size:
        return f", at most {cap} training examples" if cap else ""
    return f", a fixed random {cap} of the training examples" if cap and size >= cap else f", all {size} training examples"


def not_best(runs: list[dict]) -> list[str]:
    """Why runs of a cell kept their last step, not the best one on dev, as metrics.json's `kept`
    says (train.keep_best off, an in-context run that trains nothing, no defined selection
    metric), each reason once; [] where every run kept its best (or predates `kept`)."""
    # a run evaluated once kept that evaluation's step, the last: no checkpoint was chosen on dev
    return list(dict.fromkeys(m["metrics"]["kept"]["on"] if "value" not in m["metrics"]["kept"] else report.ONE_EVALUATION
                              for m in runs if isinstance(m["metrics"].get("kept"), dict)
                              and report.kept_kind(m) == "the last step"))


def ours_protocol(rows: dict[str, dict[str, list[dict]]], chosen: dict[tuple[str, str], str] | None = None) -> list[str]:
    """What each of our cells was trained with, from its recipe: the protocol beside the number,
    and where it was chosen among settings on dev (`chosen`, from grids())."""
    out = []
    for row, cells in rows.items():
        parts = []
        for t, ms in cells.items():
            tr, task = ms[0]["recipe"].get("train", {}), ms[0]["recipe"].get("task", {})
            budget = f"max steps {tr['max_steps']}" if tr.get("max_steps") else f"epochs {tr.get('epochs')}"
            subset = _training_set(ms[0]["metrics"], task)
            subset += "".join(f", {TITLES[t] + column + ' ' if column else ''}scored on {part}"
                              for column, part in parts_of_dev(ms, t).items())
            skip = report.unread(ms[0])  # what the run never read (an in-context run: every training setting)
            if "train.epochs" in skip and "train.max_steps" in skip:
                budget, subset = "no training", ""
            said = [f"lr {tr.get('lr')}" * ("train.lr" not in skip), report.batch(ms[0]) * ("train.batch_size" not in skip),
                    f"{budget}{subset}", f"max length {task.get('max_length')}" * ("task.max_length" not in skip)]
            parts.append(f"{t}: {', '.join(p for p in said if p)}, "
                         f"seeds {sorted((report.seed_of(m) for m in ms), key=report._sortable)}"
                         + (f", {(chosen or {})[(row, t)]}" if (row, t) in (chosen or {}) else "")
                         + "".join(f", kept {why}" for why in not_best(ms)))
        method = next(iter(cells.values()))[0]["recipe"].get("method", {})  # one method per row
        settings = ", ".join(f"{k} {report.shown(v)}" for k, v in method.items() if k != "name" and v is not None and not isinstance(v, (dict, list)))
        # the best checkpoint on dev only where every run kept it: the others' tasks say what they kept
        last = sum(bool(not_best(ms)) for ms in cells.values())
        best = ("the best checkpoint on dev (keep_best; selected and scored on the same dev set, as the papers do)"
                + (", except where a task below says what was kept" if last else ""))
        kept = "not selected on dev (each task below says what was kept)" if last == len(cells) else best
        out.append(f"**ours: {row}**{f' ({settings})' if settings else ''}: dev split, mean ± sample std over "
                   f"seeds, {kept}. " + "; ".join(parts) + ".")
    return out


def protocol_notes(items: list[dict], rows: dict[str, dict[str, list[dict]]]) -> list[str]:
    """Per task, one line where the rows of one model (its methods side by side, as `make glue`
    for two METHODs lays them) ran it on other protocols than the method and what each cell chose
    on dev: epochs, max length, batch, a training subset, the toolkit's version. The pivot and the
    runs table said it (core.protocol_notes); the GLUE table compared LoRA at max length 512
    with full fine-tuning at 128 as methods alone, its Protocols list read row by row, exit 0."""
    settings, out = _settings(items), []
    for task in ORDER:
        by_model: dict[str, list[tuple[str, report.Cell]]] = defaultdict(list)
        for row, cells in rows.items():
            if task in cells:
                grid = settings[(row, task)]
                keys = report.varying(list(grid)) if len(grid) > 1 else []  # chosen on dev: a selection
                by_model[report.label(cells[task][0], "model")].append(
                    (row, report.Cell(cells[task], report.Stat([]), keys=keys)))
        for entries in by_model.values():
            out += report.protocol_notes(entries, "method", f"GLUE {TITLES[task]}")
    return out


def unscored_notes(items: list[dict]) -> list[str]:
    """One line per GLUE run an official metric of which is null in metrics.json (an undefined
    Pearson of constant predictions: NaN): that run has no task score, so its seed is out of the
    task's cell and of its row's per-seed GLUE average; said in the GLUE section itself, where the
    n of the cell and the seeds of the average would otherwise be read as all that ran."""
    notes = []
    for item in items:
        task = _subset(item)
        if item["recipe"].get("task", {}).get("name") != "glue" or task not in SPECS:
            continue
        null = [k for k in official(task) if k in item.get("not_numbers", [])]
        # an official metric metrics.json does not hold at all (a run from before it was scored, or
        # a file edited): the run dropped out of the table, its task listed as "not in these runs"
        absent = [k for k in official(task) if k not in item["metrics"].get("eval", {}) and k not in null]
        if null or absent:
            what = "; ".join(part for part in (
                f"{', '.join(null)} not a number (null in metrics.json: NaN or infinite)" if null else "",
                f"{', '.join(absent)} not in its metrics.json" if absent else "") if part)
            notes.append(f"{item['run']}: {TITLES[task]} {what}: seed {report.seed_of(item)} has no {TITLES[task]} "
                         "score, and is left out of that cell and of the per-seed GLUE average")
    return notes


def render(items: list[dict]) -> str:
    rows = _rows(items)
    ran = {_subset(i) for i in items if i["recipe"].get("task", {}).get("name") == "glue"}
    if not rows:  # finished GLUE runs none of which has a task score are said, not "no run"
        unscored = unscored_notes(items)
        return "## GLUE\n\n" + ("No finished GLUE run here." if not unscored else
                                 "No finished GLUE run here has a task score:\n\n" + "\n".join(f"- {n}" for n in unscored))
    left = not_finished(items)
    # every row and task a sweep started is in the table: one whose every seed stopped or has no
    # score too, its cells `– (n=0; ...)` (a LoRA row whose every seed diverged read as never run)
    started = [*left, *without_score(items)]
    shown = dict(sorted({**{row: {} for row, _ in started}, **rows}.items()))  # the rows with a score: every other part
    tasks = [t for t in ORDER if any(t in cells for cells in rows.values()) or any(k[1] == t for k in started)]
    missing = [TITLES[t] + (" (ran, but no run has a task score: see above)" if t in ran else "")
               for t in ORDER if t not in tasks]
    entries = published()
    parts = ["## GLUE (dev): official metrics, mean ± std over seeds (n)", ours_table(shown, tasks, left, without_score(items))]
    notes = ["GLUE avg: per task the mean of its official metrics (MRPC/QQP: accuracy and F1; STS-B: "
             "Pearson and Spearman; MNLI: matched and mismatched), then the unweighted mean over tasks; "
             "computed per seed, then mean ± std over seeds."]
    notes += [n for row, cells in rows.items() for t, ms in cells.items()
              for n in report.mixed_code_note(f"{row} / {TITLES[t]}", ms)]
    notes += [n for row, cells in rows.items() if len(cells) > 1  # one task: its cell's line says it
              for n in report.mixed_code_note(f"{row} / GLUE avg", _average_runs(cells), _task_of)]
    notes += protocol_notes(items, rows)
    notes += unscored_notes(items)
    notes += [f"{row} / {TITLES[t]}: {len(runs)} run(s) started and not finished (no metrics.json: stopped, failed, "
              f"diverged, killed, or running now), out of that cell's n and mean and of the per-seed GLUE average: "
              f"{report.not_finished_text(runs)}" for (row, t), runs in left.items()]
    notes += [n for row, cells in rows.items() for t, ms in cells.items()
              for n in report.kept_note(f"{row} / {TITLES[t]}", ms)]
    notes += [n for row, cells in rows.items() for t, ms in cells.items()
              for n in report.same_result_note(f"{row} / {TITLES[t]}", ms)]
    notes += [n for row, cells in rows.items() for t, ms in cells.items()
              for n in report.skipped_notes(ms, f"{row} / {TITLES[t]}: ")]
    notes += [f"§ {row} / {TITLES[t]}{column}: scored on {part}, not the whole dev split that GLUE's dev numbers "
              "and the published dev rows are on: not comparable with them, nor is an average that holds it"
              for row, cells in rows.items() for t, ms in cells.items() for column, part in parts_of_dev(ms, t).items()]
    notes += [f"¶ {row} / {TITLES[t]}: trained on {part}, not the whole training set that GLUE's dev numbers and "
              "the published rows trained on: not comparable with them, nor is an average that holds it"
              for row, cells in rows.items() for t, ms in cells.items() if (part := part_of_train(ms))]
    if missing:
        notes.append(f"Not in these runs: {', '.join(missing)}. The average is over the {len(tasks)} tasks "
                     "above only and is not comparable with a nine-task GLUE score.")
    parts.append("\n".join(f"- {n}" for n in notes))
    parts += ["### Beside published numbers (task scores; ours by GLUE's definition, theirs as published)",
              side_by_side(rows, tasks, entries),
              "- Published numbers differ from ours in split, statistic, initialisation and metric variant, "
              "listed below. Where a source reports one metric of a two-metric task (BERT: F1 on MRPC, "
              "Spearman on STS-B; LoRA: accuracy on MRPC, Pearson on STS-B), or MNLI's matched split alone "
              "(MiniLM), its number is not the GLUE task score ours is: it is shown with what it is on "
              "(\"F1 only\", \"matched only\") and left out of its row's "
              "average over our tasks. A row on the test split is not our dev split: its label says so.",
              "### Protocols", "\n".join(f"- {p}" for p in ours_protocol(rows, grids(items)) + protocols(entries))]
    return "\n\n".join(parts)
