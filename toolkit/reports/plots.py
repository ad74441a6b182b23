"""The report's pictures, one file per task and kind, so no axis mixes metrics of two tasks:
- curves-<task>.png: train loss and the eval metric against the optimizer step (log.jsonl),
  one line per method at its reported (best) setting, mean over its seeds at the steps all of
  them have a value at (others are left out and said; one logged point: a labelled marker);
- params-<task>.png: the metric against trainable parameters (log x), error bars over seeds;
- cost-<task>.png: train time and peak memory per entry, horizontal bars (names stay readable).
An entry whose seeds ran on other code is named with ‡ in every plot, and said in `plot_notes`.
Legends sit outside the axes so labels never cover data.
"""

from __future__ import annotations

import hashlib
import json
import re
import statistics
from collections import defaultdict
from pathlib import Path

from toolkit import runs as run_folders
from toolkit.errors import UserError
from toolkit.reports import core as report


class _Figures:
    """Figures drawn off-screen without pyplot, with pyplot's two calls used here: the
    `matplotlib.use("Agg")` this took switched the backend of the whole process, so a notebook's
    own plots stopped showing after `toolkit.report(..., plots=True)`. A bare Figure saves as PNG
    through the Agg canvas whatever the backend."""

    @staticmethod
    def subplots(*args, figsize=None, **kwargs):
        from matplotlib.figure import Figure

        fig = Figure(figsize=figsize)
        return fig, fig.subplots(*args, **kwargs)

    @staticmethod
    def close(fig) -> None:  # nothing of it is registered anywhere: it goes with its last reference
        pass


def _plt():
    return _Figures


def entries(items: list[dict]) -> dict[str, dict[str, list[dict]]]:
    """task -> method label -> the runs (seeds) of that method's best setting on the task's main
    metric, as the pivot reports it: a learning-rate grid shows as its winner, not as 3 lines."""
    return {task: {name: cell.items for name, cell in group.items()} for task, group in _chosen(items).items()}


def _chosen(items: list[dict]) -> dict[str, dict[str, report.Cell]]:
    """`entries` with each entry's pivot cell (its grid, where its setting was chosen among several)."""
    by_task: dict[str, dict[str, report.Cell]] = defaultdict(dict)
    cells: dict[tuple[str, str], list[dict]] = defaultdict(list)
    models: dict[str, set[str]] = defaultdict(set)
    for item in items:
        models[report.label(item, "task")].add(report.label(item, "model"))
    for item in items:
        # several models on a task: a line per model and method, never the best model as "lora"
        several = len(models[report.label(item, "task")]) > 1
        model = report.label(item, "model").removesuffix(report.SMOKE)  # a smoke run's says so: once, at the end
        name = f"{model} " * several + report.method_label(item) + (" (smoke)" if item["recipe"].get("smoke") else "")
        cells[(report.label(item, "task"), name)].append(item)
    for (task, name), members in sorted(cells.items()):
        metric = report.declarations(members).get(report.main_metric(members))
        cell = report.best_setting(members, metric) if metric else None
        if cell is not None:  # seeds of other code: marked in every legend and label (plot_notes)
            by_task[task][name + (" ‡" if report.mixed_code(cell.items) else "")] = cell
    return dict(by_task)


def plot_notes(items: list[dict]) -> list[str]:
    """The ‡ line of each plotted entry (a line, a point, a bar) whose seeds ran on other code: the
    plots draw their mean as the pivot does, so they say so as the pivot does; and the setting
    each entry chosen among several is drawn at (its grid's best on the scores drawn), which the
    plots' legends ("lora") do not show: the pivot's note says it of the pivot alone, and a report
    without a pivot (`toolkit report RUNS`, plots on) said it nowhere."""
    chosen = _chosen(items)
    return ([n for task, group in sorted(chosen.items()) for name, cell in group.items()
             for n in report.mixed_code_note(f"{task} / {name.removesuffix(' ‡')} (plots)", cell.items)]
            + [f"{task} / {name.removesuffix(' ‡')} (plots): drawn at {cell.chosen}, the best mean "
               f"{report.main_metric(cell.items)} of its {len(cell.grid)} settings ({', '.join(cell.keys)}) on the "
               f"{report.split_word(cell.items)} scores drawn (selected and scored on the same "
               f"{'test split' if report.split_word(cell.items) == 'test' else 'dev set'}: optimistic)"
               for task, group in sorted(chosen.items()) for name, cell in group.items() if cell.grid]
            + partial_notes(items))


def _log(run: Path) -> list[dict]:
    path = run / "log.jsonl"
    if not path.is_file():
        return []
    entries = []
    for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
        if line.strip():
            try:
                entries.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise UserError(f"{path}:{n}: not valid JSON ({exc.msg}); the run's log is damaged: "
                                "remove that line, or report with --no-plots") from None
            if not isinstance(entries[-1], dict) or not isinstance(entries[-1].get("step", 0), int):
                raise UserError(f"{path}:{n}: not a log entry (an object with an integer step)")
    return entries


def _mean_curve(runs: list[dict], value) -> tuple[list[int], list[float]]:
    """Mean over seeds at each step every seed has a value at (`value(entry)` -> float or None)."""
    at, _ = _per_step(runs, value)
    steps = sorted(s for s, seeds in at.items() if len(seeds) == len(runs))
    return steps, [statistics.mean(at[s].values()) for s in steps]


def _per_step(runs: list[dict], value) -> tuple[dict[int, dict[int, float]], list[int]]:
    """step -> {seed's position: its value there} (a run's last entry at a step counts), and the
    steps some seed has a value at and another has none: a null in log.jsonl (an undefined
    correlation, a NaN loss) or a step not logged. Their mean would be over fewer seeds than the
    line is of, a jump that is not the training's; `_mean_curve` leaves them out and
    `partial_notes` says so."""
    at: dict[int, dict[int, float]] = defaultdict(dict)
    for position, item in enumerate(runs):
        for entry in _log(item["run"]):
            v = value(entry)
            if v is not None:
                at[entry["step"]][position] = v
    return at, sorted(s for s, seeds in at.items() if len(seeds) < len(runs))


def _train_loss(entry: dict) -> float | None:
    return entry.get("loss") if "eval" not in entry else None


def _dev_metric(name: str):
    return lambda entry: (entry.get("eval") or {}).get(name)


def partial_notes(items: list[dict]) -> list[str]:
    """One line per curve that leaves out steps not every seed of its entry has a value at."""
    notes = []
    by_task = entries(items)
    names = stems(list(by_task))
    for task, group in sorted(by_task.items()):
        metric = report.main_metric(next(iter(group.values())))
        for name, runs in group.items():
            split = report.split_word(runs)
            for what, value in (("train loss", _train_loss), (f"{split} {metric}", _dev_metric(metric))):
                _, partial = _per_step(runs, value)
                if partial:
                    shown = ", ".join(map(str, partial[:8])) + (", ..." if len(partial) > 8 else "")
                    notes.append(f"curves-{names[task]}.png, {name}: its {what} line leaves out step(s) {shown}, where "
                                 f"not all of its {len(runs)} seeds have a value (null in log.jsonl: NaN or infinite; "
                                 "or not logged): a mean over fewer seeds is not the line's")
    return notes


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def stems(tasks: list[str]) -> dict[str, str]:
    """Each task's part of its plot files' names: `_safe` of its label, and where two labels make
    one name (`dev 1.csv` and `dev_1.csv`, `données` and `donnèes`), a short hash of the label
    after it: one name for both, the second task's plots were written over the first's, and
    report.md linked both tasks to them, exit 0."""
    out: dict[str, str] = {}
    for task in tasks:
        same = [t for t in tasks if _safe(t) == _safe(task)]
        out[task] = _safe(task) + (f"-{hashlib.sha256(task.encode()).hexdigest()[:8]}" if len(same) > 1 else "")
    return out


def _legend(fig, ax) -> None:
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, frameon=False)


def _trace(ax, steps: list[int], values: list[float], name: str, color: str, **line) -> None:
    """A line through a run's logged points; a single point (one eval per run) is no line: it is
    drawn as a marker with its name written beside it."""
    if len(steps) == 1:
        ax.plot(steps, values, marker="o", linestyle="none", markersize=6, label=name, color=color)
        ax.annotate(name, (steps[0], values[0]), xytext=(5, 4), textcoords="offset points", fontsize=7, color=color)
    else:
        ax.plot(steps, values, label=name, color=color, **line)


def curves(task: str, group: dict[str, list[dict]], out: Path, stem: str | None = None) -> tuple[Path, bytes] | None:
    metric_name = report.main_metric(next(iter(group.values())))
    metric = report.declarations([i for g in group.values() for i in g]).get(metric_name)
    plt = _plt()
    fig, (ax_loss, ax_eval) = plt.subplots(1, 2, figsize=(11, 4))
    drawn = False
    for i, (name, runs) in enumerate(group.items()):
        steps, loss = _mean_curve(runs, _train_loss)
        if steps:
            _trace(ax_loss, steps, loss, name, f"C{i % 10}", linewidth=1.2)
            drawn = True
        steps, vals = _mean_curve(runs, _dev_metric(metric_name))
        if steps and metric is not None:
            _trace(ax_eval, steps, [v * metric.scale for v in vals], name, f"C{i % 10}", marker="o", markersize=3)
    if not drawn:
        plt.close(fig)
        return None
    ax_loss.set(xlabel="optimizer step", ylabel="train loss (mean over seeds)", title=f"{task}: train loss")
    split = report.split_word(i for g in group.values() for i in g)  # SAMSum's preset scores its test split
    ax_eval.set(xlabel="optimizer step", ylabel=f"{split} {report.column(metric)}" if metric else split,
                title=f"{task}: {split} {metric_name}")
    _legend(fig, ax_eval)
    return _save(fig, out / f"curves-{stem or _safe(task)}.png")


def params(task: str, group: dict[str, list[dict]], out: Path, stem: str | None = None) -> tuple[Path, bytes] | None:
    """Metric against trainable parameters, log x: what each method buys per parameter."""
    metric_name = report.main_metric(next(iter(group.values())))
    metric = report.declarations([i for g in group.values() for i in g]).get(metric_name)
    if metric is None:  # no run of the task scored its main metric (null, or an older run)
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, runs in group.items():
        vals = [r["metrics"]["eval"][metric_name] for r in runs if metric_name in r["metrics"]["eval"]]
        n_params = runs[0]["metrics"].get("trainable_params")
        if not vals or not report._is_number(n_params) or n_params <= 0:
            continue
        stat = report.Stat(vals)
        # one seed has no spread to show: a zero-height bar with its caps read as a measured,
        # certain value (the tables show no ± for n=1)
        ax.errorbar([n_params], [stat.mean * metric.scale], yerr=[stat.std * metric.scale] if stat.n > 1 else None,
                    fmt="o", capsize=3, label=f"{name} (n={stat.n})")
    if not ax.has_data():
        plt.close(fig)
        return None
    ax.set_xscale("log")
    ax.set(xlabel="trainable parameters (log scale)",
           ylabel=f"{report.split_word(i for g in group.values() for i in g)} {report.column(metric)}",
           title=f"{task}: {metric_name} vs trainable parameters\n(mean; error bars: sample std over seeds, none for n=1)")
    ax.grid(True, which="both", alpha=0.3)
    _legend(fig, ax)
    return _save(fig, out / f"params-{stem or _safe(task)}.png")


def per_device(group: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """The entries of a cost plot: each entry whose seeds trained on several devices split into
    one per device, `name [device]`; the others as they are."""
    split: dict[str, list[dict]] = {}
    for name, runs in group.items():
        devices: dict[str, list[dict]] = defaultdict(list)
        for run in runs:
            devices[report.device_of(run["metrics"])].append(run)
        split |= {name: runs} if len(devices) < 2 else {f"{name} [{d}]": devices[d] for d in sorted(devices)}
    return split


def cost(task: str, group: dict[str, list[dict]], out: Path, stem: str | None = None) -> tuple[Path, bytes] | None:
    """Train time and peak memory per entry (mean over seeds; error bars: std), one bar per device
    where an entry's seeds trained on several (`name [device]`): a GPU's and a CPU's times were
    one bar, their mean."""
    plt = _plt()
    group = per_device(group)
    names = list(group)
    height = max(2.5, 0.45 * len(names) + 1.2)
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, height), sharey=True)
    for ax, key, xlabel in ((ax_t, "train_runtime_s", "train time (s)"), (ax_m, "peak_memory_mb", "peak memory (MB)")):
        # a run that did not record the field has no bar (NaN), never a bar at 0
        stats = [report.Stat([r["metrics"][key] for r in group[n] if report._is_number(r["metrics"].get(key))])
                 for n in names]
        nan = float("nan")
        ax.barh(range(len(names)), [s.mean if s.n else nan for s in stats],
                xerr=[s.std if s.n > 1 else nan for s in stats], capsize=3, color="#4C72B0")
        ax.set(xlabel=xlabel)
        ax.grid(True, axis="x", alpha=0.3)
    ax_t.set_yticks(range(len(names)), names, fontsize=8)
    ax_t.invert_yaxis()
    fig.suptitle(f"{task}: cost per method (mean; error bars: sample std over seeds, none for n=1)")
    return _save(fig, out / f"cost-{stem or _safe(task)}.png")


def _save(fig, path: Path) -> tuple[Path, bytes]:
    """The figure as PNG bytes for `path`, drawn in memory: nothing is written until every plot
    and the report's text are drawn (`draw_all`, `render`)."""
    import io

    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=110, bbox_inches="tight")
    _plt().close(fig)
    return path, png.getvalue()


def draw_all(items: list[dict], out: Path) -> dict[Path, bytes]:
    """Every plot for every task of the runs, as path -> PNG bytes, none of them written yet: a
    damaged log.jsonl of the third task stopped the report after the first task's PNGs were
    written over the last report's, beside its report.md (exit 2, a half-written report)."""
    drawn = {}
    by_task = entries(items)
    names = stems(list(by_task))
    for task, group in sorted(by_task.items()):
        for draw in (curves, params, cost):
            png = draw(task, group, out, names[task])
            if png is not None:
                drawn[png[0]] = png[1]
    return drawn


def all_plots(items: list[dict], out: Path) -> list[Path]:
    """Every plot for every task of the runs, written once all are drawn; returns the files."""
    drawn = draw_all(items, out)
    write_all(drawn)
    return list(drawn)


PLOT_LINK = re.compile(r"!\[[^\]\n]*\]\(((?:curves|params|cost)-[^)/\\\n]*\.png)\)")


def stale(out: Path, drawn: dict[Path, bytes]) -> list[Path]:
    """The plots the report.md in `out` links (written by the report before this one) that this
    report does not draw: a task whose runs were removed, or `--no-plots`. Left beside the new
    report.md they looked current (a cost-rte.png of runs no longer there). Only files that
    report linked, by the report's own names: nothing else in the folder is touched."""
    previous = out / "report.md"
    try:
        text = previous.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return []
    names = dict.fromkeys(PLOT_LINK.findall(text))
    return [out / n for n in names if (out / n).is_file() and out / n not in drawn]


def write_all(files: dict[Path, bytes]) -> None:
    """Every file whole, all or none (runs.write_all_whole), their folders made."""
    for path in files:
        path.parent.mkdir(parents=True, exist_ok=True)
    run_folders.write_all_whole(files)
