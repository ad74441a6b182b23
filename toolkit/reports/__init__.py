"""Reports from run folders alone (see core.py): `render` writes report.md from the tables and
notes of core.py, the GLUE table of glue.py and the PNGs of plots.py."""

from __future__ import annotations

import datetime
from pathlib import Path

from toolkit import runs as run_folders
from toolkit.errors import UserError
from toolkit.reports import glue as glue_report, plots as plotting
from toolkit.reports.core import (
    BEFORE_FIELD, best_setting, budget, budget_notes, Cell, check_axis, collect, column, cost_table, declaration,
    declarations, describe_setting, files_below, grid_edge, groups, label, LABELS, main_metric, markdown,
    method_label, Metric, comparison_code, mixed_code, mixed_code_note, same_result_note, selected_checkpoint_note, not_finished_at, other_seeds, code_of, overlap_notes, overlaps, paired, Pivot, protocol_notes, t_interval, pivot_markdown, pivot_notes, pivots,
    provenance, rows, runs_notes, SECTIONS, unfinished_notes, setting, shown_names, Stat, varying, with_old_defaults)


def render(roots: Path | list[Path], plots: bool = True, row_key: str | None = None,
           col_key: str | None = None, metrics: list[str] | None = None, glue: bool = False,
           out: Path | None = None, sweep: tuple[dict[Path, str], str] | None = None) -> str:
    """Build report.md (and the PNGs) into `out` (default: the first runs folder); return its text.
    `sweep`: (its points' run folders -> their planned recipe.yaml text, its command): the report of those runs alone (`toolkit sweep
    --report`), the folder's other runs (another EPOCHS, LR_GRID or method list swept into it
    before) left out and counted: as one folder, a pivot cell chose its "best" across two budgets
    as if a grid the sweep never asked for, exit 0."""
    roots = [Path(roots)] if isinstance(roots, (str, Path)) else [Path(r) for r in roots]
    only = None if sweep is None else {p.resolve(): text for p, text in sweep[0].items()}
    items = collect(roots, only)  # each root a folder of runs, checked first
    if out is not None and out.exists() and not out.is_dir():
        raise UserError(f"report: --out {out} is a file; --out names the folder report.md and the plots go to")
    blocker = None if out is None else run_folders.file_in_the_way(out)
    if blocker is not None:  # one above it: "--out a/b: not a directory" named the folder, not the file `a`
        raise UserError(f"report: --out {out}: {blocker} is a file, not a folder, so {out} cannot be made under "
                        "it; give a path under a folder")
    out = out or roots[0]
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    parts = [f"# Report: {', '.join(map(str, roots))}", f"{provenance(items)} Written {when}. {STATISTIC}"]
    if sweep is not None:
        parts.append(_of_the_sweep(roots, only, sweep[1]))
    if glue:
        parts.append(glue_report.render(items))
    # a pivot where any of its options is given: `--metric f1` alone (the default axes) and an
    # empty `--rows ''` were dropped without a word, exit 0, the metric's typo never said
    if row_key is not None or col_key is not None or metrics:
        rows_by = "task" if row_key is None else row_key
        for i, p in enumerate(pivots(items, rows_by, "method" if col_key is None else col_key, metrics)):
            parts += [f"## {column(p.metric)}: {p.row_key} × {p.col_key}", pivot_markdown(p)]
            parts += _bullets(pivot_notes(p))
            if i == 0:
                parts += ["### Cost at the reported setting", cost_table(p)]
    header, table = rows(items)
    parts += ["## Every run (mean ± std over seeds)", markdown(header, table)]
    parts += _bullets(runs_notes(items) + unfinished_notes(roots, only))
    parts += ["### Budget of each row", *_bullets(budget_notes(items))]
    pngs = plotting.draw_all(items, out) if plots else {}  # drawn, not written yet
    if pngs:
        parts += ["## Plots", "\n".join(f"![{p.stem}]({p.name})" for p in pngs)]
        parts += _bullets(plotting.plot_notes(items))
    text = "\n\n".join(parts) + "\n"
    # nothing is written before every table, note and plot is drawn: a damaged log.jsonl left
    # some PNGs new beside the previous report.md, exit 2
    out.mkdir(parents=True, exist_ok=True)
    old = plotting.stale(out, pngs)  # the previous report's plots this one does not draw
    # the plots and report.md all or none (whole, or the previous report's, killed at any moment):
    # a full disk (or a folder in the place) at report.md left this report's plots beside the last one
    plotting.write_all({**pngs, out / "report.md": text.encode("utf-8")})
    for path in old:
        path.unlink(missing_ok=True)
    return text


# what every "±" and interval below is: a reader of the tables alone could not tell a sample std
# from a population one, a standard error or a confidence interval
STATISTIC = ("Every entry is the mean ± the sample standard deviation (n − 1) over its seeds, n shown; one "
             "seed shows no spread. A comparison of entries on matched seeds is their paired difference with "
             "its 95% Student's t interval (n − 1 df).")


def _of_the_sweep(roots: list[Path], only: dict[Path, str], command: str) -> str:
    """What a sweep's report covers: its own points, and how many other runs their folder holds."""
    others = sum(1 for root in roots for f in files_below(root, "metrics.json") if f.parent.resolve() not in only)
    return (f"The runs of one sweep alone: the {len(only)} point{'s' * (len(only) != 1)} `{command}` asked for"
            + (f"; {others} other finished run(s) in {', '.join(map(str, roots))} (another sweep's settings) are in "
               f"no table here (`toolkit report {' '.join(map(str, roots))}` reports every run there: a cell of several "
               "settings is then a grid, its best chosen on dev)." if others else "."))


def _bullets(notes: list[str]) -> list[str]:
    return ["\n".join(f"- {n}" for n in notes)] if notes else []
