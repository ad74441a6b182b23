"""Reports from synthetic run folders: pivot values, mean ± std and n, best-of-grid selection, the
overlap note, the GLUE average as GLUE defines it, published numbers, report.md and the PNGs."""

from __future__ import annotations

import json
import re
import shutil
import statistics
from pathlib import Path

import pytest
import yaml

from toolkit import reports as report
from toolkit.reports import glue as glue_report, plots as plotting
from toolkit.errors import UserError

DECL = {"accuracy": {"higher_is_better": True, "scale": 100.0}, "f1": {"higher_is_better": True, "scale": 100.0},
        "pearson": {"higher_is_better": True, "scale": 100.0}, "spearmanr": {"higher_is_better": True, "scale": 100.0},
        "matthews_correlation": {"higher_is_better": True, "scale": 100.0},
        "perplexity": {"higher_is_better": False, "scale": 1.0}, "loss": {"higher_is_better": False, "scale": 1.0},
        "rougeL": {"higher_is_better": True, "scale": 100.0}}


def fake_run(root: Path, task: str, method: str, seed: int, evals: dict, lr: float = 1e-3, main: str = "accuracy",
             trainable: int = 1000, model: str = "org/tiny", task_name: str = "glue", extra: dict | None = None,
             task_extra: dict | None = None) -> Path:
    """A finished run folder as `toolkit run` writes it (recipe.yaml, metrics.json, log.jsonl)."""
    recipe = {"model": {"checkpoint": model}, "task": {"name": task_name, "subset": task, **(task_extra or {})},
              "method": {"name": method, **(extra or {})}, "train": {"lr": lr, "seed": seed}, "smoke": False}
    run = root / "glue" / task / f"{model.split('/')[-1]}-{method}" / f"{task}{method}{seed}{lr}"
    run.mkdir(parents=True)
    (run / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    (run / "metrics.json").write_text(json.dumps({
        "eval": {**evals, "loss": 0.5}, "metric_declarations": {k: DECL[k.removesuffix("_mm")] for k in [*evals, "loss"]},
        "main_metric": main, "method": method, "seed": seed, "trainable_params": trainable,
        "trainable_percent": trainable / 1e4, "train_runtime_s": 10.0 + seed % 3, "train_samples_per_second": 5.0,
        "peak_memory_mb": 100.0 + trainable / 100, "device_name": "Test CPU", "git_commit": "a" * 40}))
    log = [{"step": s, "epoch": 0, "loss": 1.0 / s} for s in (1, 10, 20)]
    # two evaluations, as a run of two epochs: keep_best chose between them (one is no choice: core.evaluations)
    log.insert(2, {"step": 10, "epoch": 0.5, "eval": {main: next(iter(evals.values())), "loss": 0.6}})
    log.append({"step": 20, "epoch": 1, "eval": {main: next(iter(evals.values())), "loss": 0.5}})
    (run / "log.jsonl").write_text("".join(json.dumps(e) + "\n" for e in log))
    return run


def test_pivot_mean_std_n_and_best_of_a_learning_rate_grid(tmp_path: Path) -> None:
    for seed, acc in ((42, 0.80), (43, 0.84), (44, 0.82)):
        fake_run(tmp_path, "sst2", "full", seed, {"accuracy": acc})
    for seed, (low, high) in ((42, (0.70, 0.86)), (43, (0.72, 0.88))):
        fake_run(tmp_path, "sst2", "lora", seed, {"accuracy": low}, lr=1e-4)
        fake_run(tmp_path, "sst2", "lora", seed, {"accuracy": high}, lr=1e-3)
    (p,) = report.pivots(report.collect(tmp_path), "task", "method")
    assert p.rows == ["sst2"] and p.cols == ["full", "lora"]
    full = p.cells[("sst2", "full")].stat
    assert full.n == 3 and full.fmt(100.0) == f"82.00 ± {statistics.stdev([80, 84, 82]):.2f} (n=3)" == "82.00 ± 2.00 (n=3)"
    lora = p.cells[("sst2", "lora")]
    assert lora.stat.values == [0.86, 0.88] and lora.chosen == "train.lr=0.001"  # best mean of the grid
    assert [desc for desc, _ in lora.grid] == ["train.lr=0.0001", "train.lr=0.001"]
    notes = report.pivot_notes(p)
    assert any("reported train.lr=0.001" in n and "train.lr=0.0001: 71.00 ± 1.41 (n=2)" in n for n in notes)
    assert "| sst2 | 82.00 ± 2.00 (n=3) | 87.00 ± 1.41 (n=2) |" in report.pivot_markdown(p)


def test_best_at_the_grids_edge_is_flagged_and_run_notes_name_the_setting(tmp_path: Path) -> None:
    for seed in (42, 43):
        for lr, acc in ((1e-4, 0.70), (3e-4, 0.80), (1e-3, 0.84 + seed / 1e4)):
            fake_run(tmp_path, "sst2", "lora", seed, {"accuracy": acc}, lr=lr)
    (p,) = report.pivots(report.collect(tmp_path), "task", "method")
    assert p.cells[("sst2", "lora")].edge == "largest train.lr"
    assert any(n.endswith("the best is the grid's largest train.lr, so a wider grid may do better")
               for n in report.pivot_notes(p))
    for seed in (42, 43):  # now the middle value is best: no edge
        fake_run(tmp_path, "sst2", "lora", seed, {"accuracy": 0.84 if seed == 42 else 0.86}, lr=5e-4)
    (p,) = report.pivots(report.collect(tmp_path), "task", "method")
    assert p.cells[("sst2", "lora")].chosen == "train.lr=0.0005" and p.cells[("sst2", "lora")].edge == ""
    notes = report.runs_notes(report.collect(tmp_path))  # rows of one run name, told apart by their lr
    assert any(n.startswith("glue/sst2/tiny-lora [train.lr=0.0005] and glue/sst2/tiny-lora [train.lr=0.001] (sst2)") for n in notes), notes


def test_grid_is_listed_in_numeric_order(tmp_path: Path) -> None:
    for lr, acc in ((1e-4, 0.85), (3e-5, 0.82), (3e-4, 0.84)):
        fake_run(tmp_path, "sst2", "full", 42, {"accuracy": acc}, lr=lr)
    (p,) = report.pivots(report.collect(tmp_path), "task", "method")
    cell = p.cells[("sst2", "full")]
    assert [d for d, _ in cell.grid] == ["train.lr=3e-05", "train.lr=0.0001", "train.lr=0.0003"]  # not as text
    assert cell.chosen == "train.lr=0.0001" and cell.edge == ""


def test_lower_is_better_metric_picks_the_lowest_and_keeps_its_scale(tmp_path: Path) -> None:
    for lr, ppl in ((1e-4, 30.0), (1e-3, 12.5)):
        fake_run(tmp_path, "wiki", "lora", 42, {"perplexity": ppl}, lr=lr, main="perplexity", task_name="lm")
    (p,) = report.pivots(report.collect(tmp_path), "task", "method")
    assert report.column(p.metric) == "perplexity ↓"
    assert p.cells[("wiki", "lora")].stat.fmt(p.metric.scale) == "12.50 (n=1)"  # not a percentage


def test_overlap_note_names_rows_whose_intervals_overlap() -> None:
    acc = report.declaration("accuracy")
    a, b, c = report.Stat([0.80, 0.84]), report.Stat([0.81, 0.85]), report.Stat([0.90, 0.91])
    notes = report.overlap_notes([("lora", a), ("bitfit", b), ("full", c)], acc, "sst2")
    assert notes == ["bitfit and lora (sst2): accuracy 83.00 ± 2.83 vs 82.00 ± 2.83 overlap (mean ± std): "
                     "not separated by these seeds"]  # full's interval [90.3, 90.7] is clear of both
    assert report.overlap_notes([("x", report.Stat([0.8])), ("y", a)], acc)[-1].startswith("one seed only: x")


def test_glue_average_is_glues_definition(tmp_path: Path) -> None:
    evals = {"cola": {"matthews_correlation": 0.50},
             "mrpc": {"accuracy": 0.80, "f1": 0.90},
             "stsb": {"pearson": 0.88, "spearmanr": 0.86},
             "mnli": {"accuracy": 0.84, "accuracy_mm": 0.82}}
    scores = {t: glue_report.task_score(e, t) for t, e in evals.items()}
    assert scores == pytest.approx({"cola": 0.50, "mrpc": 0.85, "stsb": 0.87, "mnli": 0.83})
    assert glue_report.glue_average(scores) == pytest.approx((0.50 + 0.85 + 0.87 + 0.83) / 4)
    assert glue_report.task_score({"accuracy": 0.8}, "mrpc") is None  # F1 missing: no task score
    for seed, shift in ((42, 0.0), (43, 0.02)):
        for task, ev in evals.items():
            fake_run(tmp_path, task, "lora", seed, {k: v + shift for k, v in ev.items()},
                     main=glue_report.SPECS[task].main, extra={"r": 8, "alpha": 16},
                     task_extra={"max_train_samples": 8000} if task == "mnli" else None)
    text = glue_report.render(report.collect(tmp_path))
    mean = (0.50 + 0.85 + 0.87 + 0.83) / 4 * 100 + 1.0  # per-seed averages 76.25 and 78.25
    assert "| tiny lora | 51.00 ± 1.41 (n=2) |" in text and f"{mean:.2f} ± 1.41 (n=2)" in text
    assert "MNLI-m acc" in text and "MNLI-mm acc" in text and "Not in these runs: SST-2, QQP, QNLI, RTE, WNLI" in text
    # the protocol beside our numbers: the method's settings and any reduced training set
    assert "**ours: tiny lora** (alpha 16, r 8): dev split" in text
    assert "mnli: lr 0.001, batch ?, epochs None, at most 8000 training examples" in text
    assert "cola: lr 0.001, batch ?, epochs None, max length" in text


def test_protocol_says_whether_the_training_set_was_cut() -> None:
    assert glue_report._training_set({"train_samples": 10000}, {"max_train_samples": 10000}) == \
        ", a fixed random 10000 of the training examples"
    assert glue_report._training_set({"train_samples": 3668}, {"max_train_samples": 10000}) == ", all 3668 training examples"
    assert glue_report._training_set({"train_samples": 3668}, {}) == ", all 3668 training examples"


def test_published_numbers_carry_their_protocol() -> None:
    entries = {e["id"]: e for e in glue_report.published()}
    for e in entries.values():
        assert {"model", "method", "source", "split", "statistic", "seeds", "init", "scores", "not_here"} <= set(e)
    assert entries["bert-base-test"]["scores"]["cola"] == 52.1 and entries["bert-base-test"]["split"].startswith("test")
    assert entries["roberta-base-lora"]["scores"]["rte"] == 86.6 and "MNLI" in entries["roberta-base-lora"]["init"]
    lora = entries["roberta-base-lora"]
    avg = statistics.mean(lora["scores"][t] for t in glue_report.ORDER if t in lora["scores"])
    assert round(avg, 1) == lora["average"]["value"] == 87.2  # the paper's average is the mean of its row


def test_report_md_and_pngs_are_written_into_the_runs_folder(tmp_path: Path, cli) -> None:
    for seed in (42, 43):
        fake_run(tmp_path, "sst2", "full", seed, {"accuracy": 0.85 + seed / 1000}, trainable=100000)
        fake_run(tmp_path, "sst2", "adapters", seed, {"accuracy": 0.83 + seed / 1000}, trainable=2000,
                 extra={"config": "houlsby"})
    code, out, _ = cli("report", tmp_path, "--rows", "task", "--cols", "method")
    assert code == 0
    text = (tmp_path / "report.md").read_text()
    assert out.strip() == text.strip()
    assert "| task \\ method | full | houlsby |" in text and "Test CPU" in text and "aaaaaaaaaaaa" in text
    # what "±" is, said once at the top: a sample std (n − 1), not a standard error or an interval
    assert "mean ± the sample standard deviation (n − 1) over its seeds" in text.split("\n## ")[0]
    assert {p.name for p in tmp_path.glob("*.png")} == {"curves-sst2.png", "params-sst2.png", "cost-sst2.png"}
    assert all((tmp_path / f"{k}-sst2.png").read_bytes()[:4] == b"\x89PNG" for k in ("curves", "params", "cost"))
    assert "![params-sst2](params-sst2.png)" in text
    code, _, err = cli("report", tmp_path, "--rows", "colour")
    assert code == 2 and "report --rows 'colour'" in err
    with pytest.raises(UserError, match="no run has it"):
        report.pivots(report.collect(tmp_path), "task", "method", ["bleu"])


@pytest.mark.parametrize("entry", ["cli", "api"])
@pytest.mark.parametrize("damage", ["not JSON", "not a log entry"])
def test_a_report_that_fails_leaves_the_last_one_whole(tmp_path: Path, cli, entry: str, damage: str) -> None:
    """A damaged log.jsonl of a later task stopped the report (exit 2) after the earlier tasks'
    PNGs were written over the last report's, beside that report's report.md: half a report. Now
    nothing is written until every table, note and plot is drawn."""
    for seed in (42, 43):
        fake_run(tmp_path, "rte", "full", seed, {"accuracy": 0.60 + seed / 1000})
    assert cli("report", tmp_path)[0] == 0
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    assert set(before) == {"report.md", "curves-rte.png", "params-rte.png", "cost-rte.png"}
    fake_run(tmp_path, "rte", "full", 44, {"accuracy": 0.70})  # the next report's RTE plots differ
    for seed in (42, 43):
        run = fake_run(tmp_path, "sst2", "full", seed, {"accuracy": 0.80})
    (run / "log.jsonl").write_text((run / "log.jsonl").read_text() + ("{cut\n" if damage == "not JSON" else "[1]\n"))
    if entry == "cli":
        code, _, err = cli("report", tmp_path)
        assert code == 2 and f"{run / 'log.jsonl'}:6" in err
    else:
        with pytest.raises(UserError, match="log.jsonl:6"):
            toolkit_report([tmp_path], plots=True)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before


@pytest.mark.parametrize("entry", ["cli", "api"])
@pytest.mark.parametrize("how", ["rte runs removed", "no plots"])
def test_a_plot_the_new_report_does_not_draw_is_not_left_beside_it(tmp_path: Path, cli, entry: str, how: str) -> None:
    """The RTE runs removed (or the report run again with --no-plots): the last report's RTE (or
    every) PNG stayed beside the new report.md, looking current, exit 0. The plots the previous
    report.md linked and this one does not draw are removed; nothing else in the folder is."""
    for seed in (42, 43):
        for task in ("sst2", "rte"):
            fake_run(tmp_path, task, "full", seed, {"accuracy": 0.60 + seed / 1000})
    assert cli("report", tmp_path)[0] == 0
    assert len(list(tmp_path.glob("*.png"))) == 6
    (tmp_path / "cost-mine.png").write_bytes(b"a picture of the user's own")
    if how == "rte runs removed":
        shutil.rmtree(tmp_path / "glue" / "rte")
    no_plots = how == "no plots"
    if entry == "cli":
        assert cli("report", tmp_path, *(["--no-plots"] if no_plots else []))[0] == 0
    else:
        toolkit_report([tmp_path], plots=not no_plots)
    left = {p.name for p in tmp_path.glob("*.png")}
    assert left == {"cost-mine.png"} | (set() if no_plots else {"curves-sst2.png", "params-sst2.png", "cost-sst2.png"})
    assert all(f"({name})" in (tmp_path / "report.md").read_text() for name in left - {"cost-mine.png"})


def test_runs_from_before_fast_dropout_are_reported_as_torchs_dropout(tmp_path: Path) -> None:
    """A recipe.yaml written before train.fast_dropout existed ran torch's dropout: the report
    calls it fast_dropout=False, beside new runs' True, never None."""
    for seed in (42, 43):
        fake_run(tmp_path / "old", "sst2", "full", seed, {"accuracy": 0.80})  # no fast_dropout key
        new = fake_run(tmp_path / "new", "sst2", "full", seed, {"accuracy": 0.82})
        recipe = yaml.safe_load((new / "recipe.yaml").read_text())
        recipe["train"]["fast_dropout"] = True
        (new / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    items = report.collect([tmp_path / "old", tmp_path / "new"])
    assert len(items) == 4 and sorted({i["recipe"]["train"]["fast_dropout"] for i in items}) == [False, True]
    (p,) = report.pivots(items, "task", "method")
    assert [desc for desc, _ in p.cells[("sst2", "full")].grid] == ["train.fast_dropout=False", "train.fast_dropout=True"]


NEW_FIELDS = {"model": {"warm_start": None}, "train": {
    "skip_nonfinite": 0, "compile": "auto", "pad_multiple": None, "length_buckets": [], "precision_mode": "autocast",
    "compile_optimizer": "auto", "fast_dropout": False}}


@pytest.mark.parametrize("table", ["pivot", "runs table", "glue"])
def test_seeds_from_before_fields_were_added_join_new_seeds_at_the_value_they_ran(tmp_path: Path, table: str) -> None:
    """Seeds 42 and 43 ran before train.compile, pad_multiple, length_buckets, precision_mode,
    compile_optimizer, skip_nonfinite and model.warm_start existed; 44 and 45 after, each field at
    its default, on a CPU: what the old seeds did. Without the fields they were another setting
    ('train.compile=None' beside 'auto'): a pivot cell picked the better half of the seeds as a
    grid's best, the GLUE table half of them, exit 0. On a GPU an old run ran eager, not `auto`
    (compiled there): another setting, as it was."""
    for seed, acc in ((42, 0.80), (43, 0.82), (44, 0.60), (45, 0.62)):
        run = fake_run(tmp_path, "sst2", "full", seed, {"accuracy": acc})
        _stamp(run, device="cpu")
        if seed > 43:
            recipe = yaml.safe_load((run / "recipe.yaml").read_text())
            for section, fields in NEW_FIELDS.items():
                recipe[section].update(fields)
            (run / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    items = report.collect(tmp_path)
    if table == "pivot":
        cell = report.pivots(items, "task", "method")[0].cells[("sst2", "full")]
        assert sorted(cell.stat.values) == [0.60, 0.62, 0.80, 0.82] and not cell.grid
    elif table == "runs table":
        header, rows = report.rows(items)
        assert [(r[0], r[2], r[header.index("accuracy (%) ↑")]) for r in rows] == [("glue/sst2/tiny-full", "4", "71.00 ± 11.60")]
    else:
        (line,) = [l for l in glue_report.render(items).splitlines() if l.startswith("| tiny full")]
        assert "71.00 ± 11.60 (n=4)" in line
    for run in tmp_path.rglob("metrics.json"):
        _stamp(run.parent, device="cuda:0")
    header, rows = report.rows(report.collect(tmp_path))
    assert sorted(r[0] for r in rows) == ["glue/sst2/tiny-full [train.compile=False]", "glue/sst2/tiny-full [train.compile=auto]"]


def test_each_row_says_its_budget(tmp_path: Path) -> None:
    """The protocol line of every runs-table row: epochs or steps, train examples, length, lr, batch."""
    fake_run(tmp_path, "sst2", "full", 42, {"accuracy": 0.8}, task_extra={"max_length": 64})
    fake_run(tmp_path, "sst2", "lora", 42, {"accuracy": 0.7}, lr=3e-4)
    items = report.collect(tmp_path)
    for item in items:
        item["recipe"]["train"].update(batch_size=16, epochs=3, grad_accum=2 if item["metrics"]["method"] == "lora" else 1)
        item["metrics"].update(train_steps=60, train_samples=640)
    notes = report.budget_notes(items)
    assert notes == ["**glue/sst2/tiny-full**: epochs 3 (60 optimizer steps), 640 train examples, max length 64, "
                     "lr 0.001, batch 16",
                     "**glue/sst2/tiny-lora**: epochs 3 (60 optimizer steps), 640 train examples, max length the "
                     "model’s, lr 0.0003, batch 16 × 2 accumulated"]
    items[0]["recipe"]["train"]["max_steps"] = 200
    assert report.budget(items[0]).startswith("max steps 200 (60 optimizer steps)")
    # train.batch_size is per process: a 2-process run's batch was said as the papers' global one
    items[1]["metrics"]["num_processes"] = 2
    assert report.budget(items[1]).endswith("batch 16 × 2 accumulated × 2 processes")
    assert report.budget(items[0]).endswith("batch 16")
    assert "batch 16 × 2 accumulated × 2 processes, epochs 3" in glue_report.ours_protocol({"tiny lora": {"sst2": [items[1]]}})[0]
    assert "### Budget of each row" in report.render(tmp_path, plots=False)


@pytest.mark.parametrize("plot", ["params", "cost"])
def test_one_seed_is_drawn_without_an_error_bar(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plot: str) -> None:
    """An entry of one seed was drawn with a zero-height error bar and its caps (the cost bars with
    a zero-width one), which read as a measured, certain value where the tables show no ± at all;
    now only entries of two seeds or more have error bars, and the figure says what they are."""
    from toolkit.reports import plots

    for seed in (42, 43, 44):
        fake_run(tmp_path, "sst2", "full", seed, {"accuracy": 0.80 + seed / 100}, trainable=100000)
    fake_run(tmp_path, "sst2", "lora", 42, {"accuracy": 0.79}, trainable=2000)
    drawn = {}

    def keep(fig, path: Path) -> tuple[Path, bytes]:
        drawn[path.name.split("-")[0]] = fig
        return path, b""

    monkeypatch.setattr(plots, "_save", keep)
    group = plotting.entries(report.collect(tmp_path))["sst2"]
    getattr(plots, plot)("sst2", group, tmp_path)
    fig = drawn[plot]
    texts = " ".join(t.get_text() for t in fig.findobj(__import__("matplotlib").text.Text))
    assert "error bars: sample std over seeds, none for n=1" in texts, texts
    ax = fig.axes[0]
    if plot == "params":
        bars = {c.get_label(): c.has_yerr for c in ax.containers}
        assert bars == {"full (n=3)": True, "lora (n=1)": False}, bars
    else:
        (container,) = [c for c in ax.containers if getattr(c, "errorbar", None) is not None]
        spans = [seg for seg in container.errorbar.lines[2][0].get_segments()]
        finite = [len(seg) > 0 and bool((seg == seg).all()) for seg in spans]  # NaN: no bar drawn
        order = list(group)
        assert finite[order.index("full")] and not finite[order.index("lora")], (order, spans)
    plots._plt().close(fig)


def test_a_curve_of_one_point_is_a_labelled_marker() -> None:
    from toolkit.reports import plots

    plt = plots._plt()
    fig, ax = plt.subplots()
    plots._trace(ax, [100], [0.9], "lora", "C0", linewidth=1.2)
    plots._trace(ax, [1, 2, 3], [1.0, 0.8, 0.7], "full", "C1", linewidth=1.2)
    single, line = ax.get_lines()
    assert single.get_marker() == "o" and single.get_linestyle() == "None"
    assert line.get_linestyle() == "-" and [t.get_text() for t in ax.texts] == ["lora"]
    plt.close(fig)


@pytest.mark.parametrize("field", sorted(report.core.METRICS_FIELDS))
def test_a_metrics_field_of_the_wrong_type_is_one_line(tmp_path: Path, field: str) -> None:
    """Every field the report reads, given the wrong JSON type: one line naming file and field."""
    run = fake_run(tmp_path, "sst2", "lora", 42, {"accuracy": 0.9})
    data = json.loads((run / "metrics.json").read_text())
    kind = report.core.METRICS_FIELDS[field]
    data[field] = {"a": "text"} if "number" in kind or kind == "a list" else ["not", "this"]
    if field == "eval":
        data[field] = {"accuracy": "high"}
    (run / "metrics.json").write_text(json.dumps(data))
    with pytest.raises(UserError, match=rf"^report: .*metrics.json: '{field}' should be .+; this is not the "
                       "metrics.json a run writes"):
        report.render(tmp_path, plots=False)


def test_report_out_an_existing_file_is_one_line(tmp_path: Path, cli) -> None:
    fake_run(tmp_path, "sst2", "lora", 42, {"accuracy": 0.9})
    (tmp_path / "taken").write_text("mine")
    code, _, err = cli("report", str(tmp_path), "--out", str(tmp_path / "taken"), "--no-plots")
    assert code == 2 and err.strip().endswith("is a file; --out names the folder report.md and the plots go to")
    assert (tmp_path / "taken").read_text() == "mine"
    out = tmp_path / "taken" / "sub" / "r"  # a file above it: "taken/sub/r: not a directory" named the folder
    code, _, err = cli("report", str(tmp_path), "--out", str(out), "--no-plots")
    assert code == 2 and err == (f"error: report: --out {out}: {tmp_path / 'taken'} is a file, not a folder, so "
                                 f"{out} cannot be made under it; give a path under a folder\n")


def test_a_metric_recorded_as_null_is_left_out_and_named_never_a_traceback(tmp_path: Path, cli) -> None:
    """A run writes a NaN or infinite metric as null (strict JSON); the report raised a TypeError
    on it. Now it is left out of every mean and n (the GLUE average too) and a note names the run;
    every other field the report reads, null or missing, shows as "–" (plots: no bar)."""
    fake_run(tmp_path, "stsb", "full", 42, {"pearson": 0.80, "spearmanr": 0.70}, main="pearson")
    fake_run(tmp_path, "stsb", "full", 43, {"pearson": 0.90, "spearmanr": 0.90}, main="pearson")
    bad = fake_run(tmp_path, "stsb", "full", 44, {"pearson": 0.5, "spearmanr": 0.5}, main="pearson")
    data = json.loads((bad / "metrics.json").read_text())
    data["eval"]["pearson"] = None
    for key, kind in report.core.METRICS_FIELDS.items():  # every number the report reads: null, or gone
        if kind == report.core.NUMBER and key != "seed":
            data[key] = None
    del data["trainable_params"]
    (bad / "metrics.json").write_text(json.dumps(data))
    code, text, err = cli("report", tmp_path, "--rows", "task", "--cols", "method", "--glue")
    assert code == 0, err
    (p,) = report.pivots(report.collect(tmp_path), "task", "method")
    assert p.cells[("stsb", "full")].stat.values == [0.80, 0.90]  # n=2: the null is not a seed's score
    assert f"| stsb | 85.00 ± {100 * statistics.stdev([0.8, 0.9]):.2f} (n=2; 1 null) |" in text
    assert f"{bad}: pearson not a number (null in metrics.json: NaN or infinite); left out of every mean" in text
    glue = glue_report._rows(report.collect(tmp_path))["tiny full"]["stsb"]
    assert sorted(m["metrics"]["seed"] for m in glue) == [42, 43]  # the GLUE score needs both metrics
    assert (f"- {bad}: STS-B pearson not a number (null in metrics.json: NaN or infinite): seed 44 has no STS-B "
            "score, and is left out of that cell and of the per-seed GLUE average") in text.split("### Beside")[0]
    # the runs table counts the null seed beside n, as the pivot does; spearmanr: all 3
    assert "| glue/stsb/tiny-full | full | 3 | 85.00 ± 7.07 (n=2; 1 null) | 70.00 ± 20.00 |" in text


@pytest.mark.parametrize("entry", ["cli", "api"])
@pytest.mark.parametrize("null_seeds, cell", [
    ((44,), "94.25 ± 0.07 (n=2; 1 null)"),  # a diverged seed: n=2 read as all that ran, the mean flattered
    ((42, 43, 44), "– (n=0; 3 null)"),  # every seed: a blank cell read as never run
])
def test_a_pivot_cell_says_its_null_runs(tmp_path: Path, cli, entry: str, null_seeds: tuple, cell: str) -> None:
    """A run whose main metric is null (NaN: diverged, or an undefined Pearson) was left out of its
    pivot cell with no word there: the cell's n read as every seed that ran (a diverged seed
    dropped, the mean over the others flattering its method), or a blank as a method never run;
    with the main metric null in every run the pivot was not printed at all (exit 0). The cell
    counts its nulls and a note under the pivot names the runs. The runs table ("Every run")
    counts them alike: its cell read `(n=2)` beside `seeds 3`, and a metric null in every run
    of the report had no column there at all."""
    for seed in (42, 43, 44):
        fake_run(tmp_path, "stsb", "full", seed, {"pearson": 0.8, "spearmanr": 0.8}, main="pearson")
        run = fake_run(tmp_path, "stsb", "lora", seed, {"pearson": 0.9 + seed / 1000, "spearmanr": 0.5}, main="pearson")
        if seed in null_seeds:
            _edit_metrics(run, lambda t: t.replace(f'"pearson": {0.9 + seed / 1000}', '"pearson": NaN'))
    if entry == "cli":
        code, text, _ = cli("report", tmp_path, "--rows", "task", "--cols", "method", "--no-plots")
        assert code == 0
    else:
        text = toolkit_report([tmp_path], row_key="task", col_key="method")
    assert f"| stsb | 80.00 ± 0.00 (n=3) | {cell} |" in text
    runs_table = text.split("## Every run")[1]
    assert f"| glue/stsb/tiny-lora | lora | 3 | {cell} |" in runs_table
    (note,) = [line for line in text.splitlines() if line.startswith("- stsb / lora: pearson is null")]
    assert f"in {len(null_seeds)} run(s), left out of the cell's mean, its n and its choice of setting" in note
    assert sorted(note.split(": ")[-1].split("; ")) == sorted(str(r.parent) for r in tmp_path.rglob("metrics.json")
                                                              if "NaN" in r.read_text())
    for run in tmp_path.rglob("metrics.json"):  # the main metric null in every run: still a table
        _edit_metrics(run.parent, lambda t: re.sub(r'"pearson": [0-9.]+', '"pearson": NaN', t))
    code, text, _ = cli("report", tmp_path, "--rows", "task", "--cols", "method", "--no-plots")
    assert code == 0 and "| stsb | – (n=0; 3 null) | – (n=0; 3 null) |" in text
    runs_table = text.split("## Every run")[1]  # null in every run of the report: its column is still there
    assert "| run | method | seeds | pearson (%) ↑ | spearmanr (%) ↑ |" in runs_table
    assert "| glue/stsb/tiny-full | full | 3 | – (n=0; 3 null) | 80.00 ± 0.00 |" in runs_table


@pytest.mark.parametrize("entry", ["cli", "api"])
def test_a_seed_that_skipped_non_finite_batches_is_said_where_it_is_pooled(tmp_path: Path, cli, entry: str) -> None:
    """A run with train.skip_nonfinite that skipped 37 of its 100 updates finished, and was pooled
    as a seed like the others in the runs table, the pivot and the GLUE table with no word (its
    metrics.json's skipped_nonfinite was read by nothing). Each section that pools it says so."""
    for seed in (42, 43):
        run = fake_run(tmp_path, "rte", "lora", seed, {"accuracy": 0.6})
    _stamp_json(run, skipped_nonfinite=37, skipped_nonfinite_micro_batches=148, train_steps=100)
    if entry == "cli":
        code, text, _ = cli("report", tmp_path, "--rows", "task", "--cols", "method", "--glue", "--no-plots")
        assert code == 0
    else:
        text = toolkit_report([tmp_path], row_key="task", col_key="method", glue=True)
    # in the unit skipped: optimizer steps, and the micro-batches they held (grad_accum 4: it said "37 batch(es)")
    said = (f"{run}: skipped 37 of its 100 optimizer steps (148 micro-batches) for a non-finite loss "
            "(train.skip_nonfinite: no update "
            "on them); it is pooled as a seed, with fewer updates than its recipe's")
    glue_part, pivot_part, runs_part = (text.split("## GLUE")[1].split("## accuracy")[0],
                                        text.split("## accuracy")[1].split("## Every run")[0], text.split("## Every run")[1])
    assert f"- tiny lora / RTE: {said}" in glue_part and f"- rte / lora: {said}" in pivot_part and f"- {said}" in runs_part
    assert text.count("skipped 37") == 3


@pytest.mark.parametrize("entry", ["cli", "api"])
@pytest.mark.parametrize("how", ["null", "absent"])
@pytest.mark.parametrize("seeds", [(43,), (42, 43)])
def test_a_glue_run_without_a_task_score_is_said_in_the_glue_section(tmp_path: Path, cli, entry: str, how: str,
                                                                     seeds: tuple) -> None:
    """An MRPC run whose metrics.json holds no F1 (null, or not at all: a run from before it was
    scored, an edited file) has no GLUE task score. Absent, it dropped out of the GLUE table with no
    word (n=1 read as every seed), and with every MRPC run so the table said 'Not in these runs:
    MRPC', or 'No finished GLUE run here', exit 0."""
    for seed in (42, 43):
        run = fake_run(tmp_path, "mrpc", "lora", seed, {"accuracy": 0.80, "f1": 0.90}, main="f1")
        if seed in seeds:
            _edit_metrics(run, lambda t: t.replace('"f1": 0.9, ', '"f1": NaN, ' if how == "null" else ""))
    text = _glue_text(tmp_path, cli, entry)
    glue = text.split("## Every run")[0]
    what = "f1 not a number (null in metrics.json: NaN or infinite)" if how == "null" else "f1 not in its metrics.json"
    for seed in seeds:
        assert (f"{tmp_path}/glue/mrpc/tiny-lora/mrpclora{seed}0.001: MRPC {what}: seed {seed} has no MRPC score, "
                "and is left out of that cell and of the per-seed GLUE average") in glue
    if len(seeds) == 1:
        assert "| tiny lora | 80.00 (n=1; 1 no score) | 90.00 (n=1; 1 no score) |" in glue
    else:
        assert "No finished GLUE run here has a task score:" in glue and "No finished GLUE run here." not in glue


def _glue_text(runs: Path, cli, entry: str) -> str:
    """The GLUE report of `runs` as `toolkit report --glue` prints it (exit 0) or the API returns it."""
    if entry == "cli":
        code, text, _ = cli("report", runs, "--glue", "--no-plots")
        assert code == 0
        return text
    return toolkit_report([runs], glue=True)


GLUE_UNSCORED = {  # task: (its official metrics, the one a seed lacks, null or absent)
    "cola": ({"matthews_correlation": 0.4}, "matthews_correlation", "null"),  # one-class predictions: undefined
    "stsb": ({"pearson": 0.8, "spearmanr": 0.7}, "pearson", "null"),  # constant predictions
    "mrpc": ({"accuracy": 0.8, "f1": 0.9}, "f1", "null"),  # no positive predicted
    "mnli": ({"accuracy": 0.8, "accuracy_mm": 0.7}, "accuracy_mm", "absent"),  # a run scored on matched alone
}


@pytest.mark.parametrize("entry", ["cli", "api"])
@pytest.mark.parametrize("task", GLUE_UNSCORED)
def test_a_glue_cell_counts_its_seeds_without_a_task_score_beside_n(tmp_path: Path, cli, entry: str, task: str) -> None:
    """Three seeds ran; one has no task score (CoLA's MCC null on one-class predictions, STS-B's
    Pearson on constant ones, MRPC's F1, MNLI's mismatched accuracy not scored). The GLUE cell read
    `(n=2)` beside full's `(n=3)`, the mean of the seeds that scored, its missing seed said only in
    a note, where the pivot counts a null run in its cell (`(n=2; 1 null)`). Each of the task's
    columns now counts it beside n, for the row that lost it alone; the average is unchanged."""
    evals, lost, how = GLUE_UNSCORED[task]
    main = glue_report.SPECS[task].main
    for seed in (42, 43, 44):
        fake_run(tmp_path, task, "full", seed, evals, main=main)
        run = fake_run(tmp_path, task, "lora", seed, evals, main=main)
        if seed == 44:
            _edit_metrics(run, lambda t: t.replace(f'"{lost}": {evals[lost]}', f'"{lost}": NaN' if how == "null" else
                                                   '"absent": 0').replace(', "absent": 0', ""))
    text = _glue_text(tmp_path, cli, entry)
    glue = text.split("### Beside")[0]
    cells = [f"{100 * v:.2f} ± 0.00" for v in evals.values()]
    assert "| tiny full | " + " | ".join(c + " (n=3)" for c in cells) + " | " in glue
    assert "| tiny lora | " + " | ".join(c + " (n=2; 1 no score)" for c in cells) + " | " in glue
    assert f"seed 44 has no {glue_report.TITLES[task]} score" in glue


@pytest.mark.parametrize("entry", ["cli", "api"])
def test_a_small_trainable_percentage_keeps_its_significant_digits(tmp_path: Path, cli, entry: str) -> None:
    """Prompt tuning's 163,840 parameters of a 70B model are 0.00023% of it: the runs table and the
    cost table printed `0.000`, nothing trained by its percentage beside its count, and two small
    methods (0.0012% and 0.0014%) as one `0.001`. Three decimals, and more where the first two
    significant digits need them; full's 100.000 and LoRA's 0.327 as before."""
    for method, trainable, percent in (("full", 10**6, 100.0), ("lora", 3270, 0.327), ("prompt_tuning", 12, 0.0012),
                                       ("ia3", 14, 0.0014), ("prefix_tuning", 23, 0.00023)):
        run = fake_run(tmp_path, "sst2", method, 42, {"accuracy": 0.8}, trainable=trainable)
        _stamp_json(run, trainable_percent=percent)
    if entry == "cli":
        code, text, _ = cli("report", tmp_path, "--rows", "task", "--cols", "method", "--no-plots")
        assert code == 0
    else:
        text = toolkit_report([tmp_path], row_key="task", col_key="method")
    runs, cost = text.split("## Every run")[1], text.split("### Cost")[1].split("## Every run")[0]
    for method, shown in (("full", "100.000"), ("lora", "0.327"), ("prompt_tuning", "0.0012"), ("ia3", "0.0014"),
                          ("prefix_tuning", "0.00023")):
        assert re.search(rf"\| {method} \| [^\n]*\| {re.escape(shown)} \|", runs), (method, runs)
        assert re.search(rf"\| sst2 \| {method} \| [0-9,]+ \| {re.escape(shown)} \|", cost), (method, cost)


@pytest.mark.parametrize("line", ["train loss", "dev pearson"])
def test_a_curve_point_is_the_mean_of_every_seed_or_left_out_and_said(tmp_path: Path, line: str) -> None:
    """A seed whose log.jsonl holds a null at a step (an undefined Pearson, a NaN loss) made that
    step's point of the curve the mean of the other seeds: a jump that is not the training's,
    drawn without a word. A point is now the mean of every seed of the entry, or it is left out
    and the plot notes name the step."""
    runs = [fake_run(tmp_path, "stsb", "full", seed, {"pearson": 0.8}, main="pearson") for seed in (42, 43, 44)]
    log = [json.loads(x) for x in (runs[2] / "log.jsonl").read_text().splitlines()]
    hole = 10 if line == "train loss" else 20
    for entry in log:
        if entry["step"] == hole and (("eval" in entry) == (line != "train loss")):
            if "eval" in entry:
                entry["eval"]["pearson"] = None
            else:
                entry["loss"] = None
    (runs[2] / "log.jsonl").write_text("".join(json.dumps(e) + "\n" for e in log))
    items = report.collect(tmp_path)
    value = plotting._train_loss if line == "train loss" else plotting._dev_metric("pearson")
    steps, _ = plotting._mean_curve(items, value)
    assert hole not in steps and steps == sorted({1, 10, 20} - {hole} if line == "train loss" else {10})
    notes = plotting.plot_notes(items)
    assert notes == [f"curves-stsb.png, full: its {line} line leaves out step(s) {hole}, where not all of its 3 seeds "
                     "have a value (null in log.jsonl: NaN or infinite; or not logged): a mean over fewer seeds is "
                     "not the line's"], notes


def test_one_run_counts_once_in_a_mean(tmp_path: Path, cli) -> None:
    """`toolkit report runs runs/glue` read each run twice (n=4 for two seeds, a std of 5.77 for
    7.07); a copied run folder, or the same recipe and seed rerun on other data or processes, was
    averaged as a second seed. A folder counts once; one setting with one seed twice is one line."""
    for seed, acc in ((42, 0.80), (43, 0.90)):
        fake_run(tmp_path, "sst2", "full", seed, {"accuracy": acc})
    (p,) = report.pivots(report.collect([tmp_path, tmp_path / "glue"]), "task", "method")
    assert p.cells[("sst2", "full")].stat.values == [0.80, 0.90]
    code, text, _ = cli("report", tmp_path, tmp_path / "glue", "--rows", "task", "--cols", "method", "--no-plots")
    assert code == 0 and "| sst2 | 85.00 ± 7.07 (n=2) |" in text

    shutil.copytree(tmp_path / "glue", tmp_path / "copy")
    code, _, err = cli("report", tmp_path, "--no-plots")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "are one setting with one seed (train.seed=42), so a mean would count that seed twice" in err
    with pytest.raises(UserError, match="one setting with one seed"):
        toolkit_report([tmp_path])


def toolkit_report(folders: list[Path], **options) -> str:
    import toolkit

    return toolkit.report(folders, **options)


def test_runs_on_other_process_counts_are_not_seeds_of_one_entry(tmp_path: Path) -> None:
    """The number of processes sets the global batch (it is in the run id): seeds 44 and 45 on 2
    processes were averaged with seeds 42 and 43 on 1 as one entry of n=4."""
    for seed, acc, procs in ((42, 0.80, 1), (43, 0.82, 1), (44, 0.60, 2), (45, 0.62, 2)):
        run = fake_run(tmp_path, "sst2", "full", seed, {"accuracy": acc})
        data = json.loads((run / "metrics.json").read_text())
        (run / "metrics.json").write_text(json.dumps({**data, "num_processes": procs}))
    items = report.collect(tmp_path)
    header, table = report.rows(items)
    acc = header.index("accuracy (%) ↑")
    assert sorted((row[0], row[2], row[acc]) for row in table) == [
        ("glue/sst2/tiny-full [processes=1]", "2", "81.00 ± 1.41"),
        ("glue/sst2/tiny-full [processes=2]", "2", "61.00 ± 1.41")]
    cell = report.pivots(items, "task", "method")[0].cells[("sst2", "full")]
    assert cell.stat.values == [0.80, 0.82] and cell.chosen == "processes=1"  # a grid, listed in its note


@pytest.mark.parametrize("table", ["pivot", "runs table"])
def test_runs_under_other_strategies_are_not_seeds_of_one_entry(tmp_path: Path, table: str) -> None:
    """FSDP and ZeRO are another computation than DDP (reduction order; ZeRO's fp32 master weights
    under half precision): seeds of one recipe on 2 processes under DDP, FSDP and ZeRO-3, in
    separate runs folders, were pooled as seeds of one entry (n=6), exit 0. Each strategy is an
    entry now; a run from before metrics.json recorded `strategy` reads as its distributed_type
    says, and joins the new seeds of its strategy."""
    runs = [(42, 0.80, {"distributed_type": "MULTI_CPU"}),  # DDP, before the record
            (43, 0.82, {"distributed_type": "MULTI_CPU", "strategy": "ddp"}),
            (44, 0.60, {"distributed_type": "FSDP"}),  # FSDP, before the record
            (45, 0.62, {"distributed_type": "FSDP", "strategy": "fsdp"}),
            (46, 0.40, {"distributed_type": "DEEPSPEED", "strategy": "zero3"}),
            (47, 0.42, {"distributed_type": "DEEPSPEED", "strategy": "zero3"})]
    for seed, acc, fields in runs:
        _stamp(fake_run(tmp_path / str(seed), "sst2", "full", seed, {"accuracy": acc}), num_processes=2, **fields)
    items = report.collect([tmp_path / str(seed) for seed, _, _ in runs])
    if table == "runs table":
        header, rows = report.rows(items)
        acc = header.index("accuracy (%) ↑")
        assert sorted((row[0], row[2], row[acc]) for row in rows) == [
            ("glue/sst2/tiny-full [strategy=ddp]", "2", "81.00 ± 1.41"),
            ("glue/sst2/tiny-full [strategy=fsdp]", "2", "61.00 ± 1.41"),
            ("glue/sst2/tiny-full [strategy=zero3]", "2", "41.00 ± 1.41")]
    else:
        cell = report.pivots(items, "task", "method")[0].cells[("sst2", "full")]
        assert cell.stat.values == [0.80, 0.82] and cell.chosen == "strategy=ddp"  # a grid, not n=6


def _stamp(run: Path, **fields: str) -> None:
    data = json.loads((run / "metrics.json").read_text())
    (run / "metrics.json").write_text(json.dumps({**data, **fields}))


@pytest.mark.parametrize("field, first, second", [("data_sha256", "a" * 64, "b" * 64),
                                                   ("base_run", "pre/aaaaaaaaaaaa", "pre/bbbbbbbbbbbb")])
def test_seeds_on_other_data_are_not_one_entry(tmp_path: Path, field: str, first: str, second: str) -> None:
    """Seeds 44 and 45 ran after the data file was edited (another data_sha256), or fine-tuned
    from another run of the pretraining they chain to (another base_run): they are another entry,
    not two more seeds of the first."""
    for seed, acc, value in ((42, 0.80, first), (43, 0.82, first), (44, 0.60, second), (45, 0.62, second)):
        _stamp(fake_run(tmp_path, "sst2", "full", seed, {"accuracy": acc}), **{field: value})
    header, table = report.rows(report.collect(tmp_path))
    acc = header.index("accuracy (%) ↑")
    assert sorted((row[2], row[acc]) for row in table) == [("2", "61.00 ± 1.41"), ("2", "81.00 ± 1.41")]


def _as_run_wrote_it(run: Path, data: str | None, ran_on: str, processes: int = 1) -> None:
    """metrics.json with the recipe's hash and the run id runs.run_id gives for data `ran_on`;
    data_sha256 recorded as `data` (None: a run from before the field)."""
    import hashlib

    from toolkit import recipe as recipes

    made = recipes.built(yaml.safe_load((run / "recipe.yaml").read_text())).hash
    run_id = hashlib.sha256(f"{made}|{processes}|{ran_on}".encode()).hexdigest()[:12]
    _stamp(run, recipe_hash=made, num_processes=processes, run_id=run_id,
           **({"data_sha256": data} if data else {}))


@pytest.mark.parametrize("table", ["pivot", "runs table", "glue"])
def test_seeds_from_before_data_sha256_join_new_seeds_on_the_data_their_run_id_proves(tmp_path: Path,
                                                                                      table: str) -> None:
    """Seeds 42 and 43 ran before metrics.json recorded data_sha256, 44 and 45 after, one recipe
    on one data: the old seeds were another setting ('data=None'), a pivot cell reported the
    better half as a grid's best, the GLUE table averaged half the seeds, exit 0. Their run id
    proves their data (it hashes recipe, processes and data), so they are seeds of one entry;
    an old run whose id proves no recorded data (the file was edited since) stays apart."""
    data = "d" * 64
    for seed, acc in ((42, 0.80), (43, 0.82), (44, 0.60), (45, 0.62)):
        run = fake_run(tmp_path, "sst2", "full", seed, {"accuracy": acc})
        _as_run_wrote_it(run, data if seed > 43 else None, data)
    items = report.collect(tmp_path)

    def seen() -> list:
        if table == "pivot":
            return report.pivots(items, "task", "method")[0].cells[("sst2", "full")].stat.values
        if table == "runs table":
            header, rows = report.rows(items)
            return [(r[2], r[header.index("accuracy (%) ↑")]) for r in rows]
        return [line for line in glue_report.render(items).splitlines() if "| tiny full" in line]

    got = seen()
    if table == "pivot":
        assert sorted(got) == [0.60, 0.62, 0.80, 0.82]
    elif table == "runs table":
        assert got == [("4", "71.00 ± 11.60")]
    else:
        assert len(got) == 1 and "71.00 ± 11.60" in got[0], got
    _as_run_wrote_it(next(tmp_path.rglob("*full42*")), None, "e" * 64)  # seed 42 ran on other data
    items = report.collect(tmp_path)
    header, rows = report.rows(items)
    assert sorted(r[2] for r in rows) == ["1", "3"]


def _hub(revision: str, rows: str | None) -> dict:
    """metrics.json's hub_data of a run that read a Hub data set at `revision` (its datasets
    fingerprint) holding the examples `rows` (their content hash; None: a run from before it)."""
    return {"org/data sst2": {split: f"{revision}{split}" + (f" {rows}{split}" if rows else "")
                              for split in ("train", "validation")}}


@pytest.mark.parametrize("table", ["pivot", "runs table", "glue", "plots"])
def test_seeds_pool_on_one_hub_data_whatever_its_revision(tmp_path: Path, table: str) -> None:
    """A Hub data set's runs have no data files (data_sha256 is the empty set's for every
    revision): seeds 44 and 45, run after the Hub's rows changed, were pooled with 42 and 43 as
    four seeds of one entry, exit 0. The examples a run read (hub_data's content hash) decide:
    other rows are another task in every table and plot, said in one line (GLUE: refused), and
    a new revision holding the same rows pools (as does an old record of the same revision)."""
    runs = {}
    for seed, acc in ((42, 0.80), (43, 0.82), (44, 0.60), (45, 0.62)):
        runs[seed] = fake_run(tmp_path, "sst2", "full", seed, {"accuracy": acc})
        _stamp(runs[seed], hub_data=_hub("a", "x") if seed < 44 else _hub("b", "y"))

    def seen(items: list[dict]) -> list:
        if table == "pivot":
            (p,) = report.pivots(items, "task", "method")
            return sorted((r, c.stat.n) for (r, _), c in p.cells.items()), report.pivot_notes(p)
        if table == "runs table":
            header, rows = report.rows(items)
            return sorted(r[2] for r in rows), report.runs_notes(items)
        if table == "plots":
            return sorted((t, len(m)) for t, group in plotting.entries(items).items() for m in group.values()), \
                report.runs_notes(items)
        text = glue_report.render(items)
        return [line for line in text.splitlines() if "| tiny full" in line], []

    items = report.collect(tmp_path)
    if table == "glue":
        with pytest.raises(UserError, match=r"report --glue: tiny full / SST-2 holds runs on 2 versions of its data, eval set or metric definitions"):
            seen(items)
    else:
        got, notes = seen(items)
        assert len(got) == 2 and all("2" in str(g) for g in got), got
        said = [n for n in notes if "versions of their data" in n]
        assert len(said) == 1 and said[0].startswith("sst2: its runs span 2 versions of their data or eval set"), notes
    for seed in (44, 45):  # revision c holds the rows of a: the same data
        _stamp(runs[seed], hub_data=_hub("c", "x"))
    _stamp(runs[43], hub_data=_hub("a", None))  # recorded before the content hash: revision a's
    got, notes = seen(report.collect(tmp_path))
    if table == "glue":
        assert len(got) == 1 and "71.00 ± 11.60 (n=4)" in got[0], got
    elif table == "runs table":
        assert got == ["4"]
    else:
        assert [g[1] for g in got] == [4], got
    assert not [n for n in notes if "versions of their data" in n]


@pytest.mark.parametrize("table", ["pivot", "glue", "plots"])
def test_a_copy_of_the_data_under_another_path_is_the_same_task(tmp_path: Path, table: str) -> None:
    """Seeds 44 and 45 read GLUE from a copy of the data folder (task.data_dir, the same bytes: one
    data_sha256 and eval_sha256): they were another task, `rte (data_dir b)`, beside seeds 42 and
    43, and the GLUE table refused the cell; a copy is the same data (as for resume and eval).
    Other bytes under the other path stay another task."""
    for seed in (42, 43, 44, 45):
        run = fake_run(tmp_path, "rte", "lora", seed, {"accuracy": 0.70 + seed / 1000},
                       task_extra={"data_dir": f"/data/{'a' if seed < 44 else 'b'}/glue"})
        _stamp(run, data_sha256="d" * 64, eval_sha256="e" * 64)

    def seen() -> list:
        items = report.collect(tmp_path)
        if table == "pivot":
            return sorted((r, c.stat.n) for (r, _), c in report.pivots(items, "task", "method")[0].cells.items())
        if table == "plots":
            return sorted((t, len(runs)) for t, g in plotting.entries(items).items() for runs in g.values())
        return [line for line in glue_report.render(items).splitlines() if line.startswith("| tiny lora")]

    got = seen()
    assert (got == [("rte", 4)]) if table != "glue" else ("(n=4)" in got[0]), got
    for run in tmp_path.rglob("*lora4[45]*"):
        _stamp(run, data_sha256="f" * 64)
    if table == "glue":
        with pytest.raises(UserError, match="holds runs on 2 versions of its data, eval set or metric definitions"):
            seen()
    else:
        assert [n for _, n in seen()] == [2, 2]


@pytest.mark.parametrize("table", ["pivot", "runs table", "glue", "glue cli", "report.md"])
def test_runs_scored_on_other_eval_sets_are_other_tasks(tmp_path: Path, table: str, cli) -> None:
    """LoRA's lr 1e-3 seeds scored on 50 dev examples (task.max_eval_samples) beside its lr 1e-4
    seeds and full fine-tuning scored on all of dev: the pivot cell and the GLUE table took the
    subset's 94.25 as the best of a grid over task.max_eval_samples, and the plots drew it, exit 0.
    Runs of one task scored on other examples (metrics.json eval_sha256; a run from before it takes
    the one its task settings and data prove) are other tasks, said in one line (GLUE: refused);
    on one eval set nothing is split."""
    for seed in (42, 43):
        _stamp(fake_run(tmp_path, "rte", "full", seed, {"accuracy": 0.70 + seed / 1000}), eval_sha256="e" * 64)
        fake_run(tmp_path, "rte", "lora", seed, {"accuracy": 0.68 + seed / 1000}, lr=1e-4)  # before eval_sha256
        subset = fake_run(tmp_path, "rte", "lora", seed, {"accuracy": 0.90 + seed / 1000})
        _recipe_edit(subset, "task", max_eval_samples=50)
        _stamp(subset, eval_sha256="f" * 64)
    items = report.collect(tmp_path)
    if table == "glue":
        with pytest.raises(UserError, match=r"tiny lora / RTE holds runs on 2 versions of its data, eval set or metric definitions"):
            glue_report.render(items)
    elif table == "glue cli":
        code, _, err = cli("report", tmp_path, "--glue", "--no-plots")
        assert code == 2 and err.count("\n") == 1 and "tiny lora / RTE holds runs on 2 versions" in err, err
        assert not (tmp_path / "report.md").exists()
    elif table == "report.md":  # the CLI's text: the split said once, plots drawn per task
        code, text, err = cli("report", tmp_path, "--rows", "task", "--cols", "method")
        assert code == 0 and text.count("its runs span 2 versions of their data or eval set") == 2, err  # runs, pivot
        assert {p.name for p in tmp_path.glob("curves-*.png")} == {
            "curves-rte_eval_set_eeeeeeeeeeee_.png", "curves-rte_eval_set_ffffffffffff_.png"}
    else:
        if table == "pivot":
            (p,) = report.pivots(items, "task", "method")
            got = {k: c.stat.n for k, c in p.cells.items()}
            notes = report.pivot_notes(p)
            assert not [n for n in notes if "of the grid" in n], notes  # no grid over eval sets
        else:
            got, notes = {r[0]: r[2] for r in report.rows(items)[1]}, report.runs_notes(items)
        assert len(got) == 3 and any("eval set ffffffffffff" in str(k) for k in got) if table != "runs table" \
            else len(got) == 3, got
        said = [n for n in notes if "versions of their data or eval set" in n]
        assert len(said) == 1 and "eval set eeeeeeeeeeee: 4 run(s); eval set ffffffffffff: 2 run(s)" in said[0], notes
        assert not [n for n in notes if "rte [eval set eeeeeeeeeeee] and" in n and "ffffffffffff" in n]  # not paired
    for run in [r.parent for r in tmp_path.rglob("recipe.yaml") if "max_eval_samples" in r.read_text()]:
        shutil.rmtree(run)
    items = report.collect(tmp_path)
    assert not [n for n in report.runs_notes(items) if "eval set" in n]
    (p,) = report.pivots(items, "task", "method")
    assert set(p.rows) == {"rte"} and p.cells[("rte", "lora")].stat.n == 2


# --- metrics.json / recipe.yaml written elsewhere: one line, or a NaN left out and named ----------
def _edit_metrics(run: Path, change) -> None:
    file = run / "metrics.json"
    file.write_text(change(file.read_text()))


DAMAGED = [
    ("NaN token", lambda r: _edit_metrics(r, lambda t: t.replace('"accuracy": 0.8', '"accuracy": NaN')), None),
    ("Infinity token", lambda r: _edit_metrics(r, lambda t: t.replace('"accuracy": 0.8', '"accuracy": -Infinity')), None),
    ("declaration not a mapping", lambda r: _edit_metrics(r, lambda t: t.replace(
        '"accuracy": {"higher_is_better": true, "scale": 100.0}', '"accuracy": [1]')),
     r"'metric_declarations.accuracy' should be \{higher_is_better: true/false, scale: a number\}, got \[1\]"),
    ("declaration without its direction", lambda r: _edit_metrics(r, lambda t: t.replace(
        '"accuracy": {"higher_is_better": true, "scale": 100.0}', '"accuracy": {"scale": 100.0}')),
     r"'metric_declarations.accuracy' should be"),
    ("data_sha256 a number", lambda r: _edit_metrics(r, lambda t: t.replace('"eval": {', '"data_sha256": 5, "eval": {')),
     r"'data_sha256' should be a string, got 5"),
    ("recipe section a list", lambda r: (r / "recipe.yaml").write_text("train: [1, 2]\n"),
     r"recipe.yaml: 'train' should be a mapping, got \[1, 2\]"),
]


@pytest.mark.parametrize("case, damage, message", DAMAGED, ids=[c[0] for c in DAMAGED])
def test_a_metrics_json_written_elsewhere_is_one_line_or_a_named_gap(tmp_path: Path, cli, case: str, damage,
                                                                      message: str | None) -> None:
    """Python's json reads NaN / Infinity tokens, so a metrics.json holding one (a run writes null)
    crashed the report inside statistics.mean; malformed metric declarations, a recipe section that
    is not a mapping, or a fingerprint that is not a string crashed it with KeyError / TypeError.
    A non-number is left out and named as a null is; the rest is one line naming the file (CLI and API)."""
    import toolkit

    runs = [fake_run(tmp_path, "sst2", "lora", seed, {"accuracy": acc}) for seed, acc in ((42, 0.8), (43, 0.82), (44, 0.84))]
    damage(runs[0])
    code, out, err = cli("report", tmp_path, "--rows", "task", "--no-plots")
    if message is None:
        assert code == 0, err
        (p,) = report.pivots(report.collect(tmp_path), "task", "method")
        assert p.cells[("sst2", "lora")].stat.values == [0.82, 0.84]
        assert f"{runs[0]}: accuracy not a number" in out and "| sst2 | 83.00 ± 1.41 (n=2; 1 null) |" in out
        return
    assert code == 2 and len(err.strip().splitlines()) == 1 and re.search(message, err), err
    assert str(runs[0]) in err
    with pytest.raises(UserError, match=message):
        toolkit.report(tmp_path)


@pytest.mark.parametrize("entry", ["cli", "api"])
@pytest.mark.parametrize("recorded", [None, "absent"])
def test_a_seed_metrics_json_does_not_record_is_its_recipes(tmp_path: Path, cli, entry: str, recorded) -> None:
    """The GLUE protocol listed each cell's seeds from metrics.json alone: a run whose metrics.json
    has no seed (null, or written before the field) was a TypeError traceback; every table reads a
    run's seed one way (its recipe's train.seed, else metrics.json's)."""
    for seed in (43, 42):
        run = fake_run(tmp_path, "rte", "lora", seed, {"accuracy": 0.6 + seed / 1000})
        if seed == 43:
            data = json.loads((run / "metrics.json").read_text())
            data.pop("seed") if recorded == "absent" else data.update(seed=None)
            (run / "metrics.json").write_text(json.dumps(data))
    if entry == "cli":
        code, text, err = cli("report", tmp_path, "--glue", "--no-plots")
        assert code == 0, err
    else:
        text = toolkit_report([tmp_path], glue=True)
    assert "rte: lr 0.001, batch ?, epochs None, max length None, seeds [42, 43]" in text


def test_means_equal_to_float_rounding_are_a_tie(tmp_path: Path) -> None:
    """Means of 0.85 and 0.8500000000000001 (seeds 0.84, 0.86 and 0.80, 0.90): the 16th digit chose
    lr 0.001 as 'the best' of the grid; equal to float rounding is a tie, said, by grid order."""
    for seed, low, high in ((42, 0.84, 0.80), (43, 0.86, 0.90)):
        fake_run(tmp_path, "sst2", "lora", seed, {"accuracy": low}, lr=1e-4)
        fake_run(tmp_path, "sst2", "lora", seed, {"accuracy": high}, lr=1e-3)
    (p,) = report.pivots(report.collect(tmp_path), "task", "method")
    cell = p.cells[("sst2", "lora")]
    assert cell.chosen == "train.lr=0.0001" and cell.tied == ["train.lr=0.001"]


def test_a_tie_for_the_best_setting_is_said_and_does_not_follow_folder_names(tmp_path: Path) -> None:
    """Two settings of a grid with one mean: the cell reported whichever came first in the run
    folders' (hash) names and called it "the best". The first in grid order is reported, the same
    whatever the folders are called, and the note says the grid is tied."""
    for seed, acc in ((42, 0.80), (43, 0.82)):
        for lr in (1e-4, 1e-3, 3e-3):
            fake_run(tmp_path, "sst2", "lora", seed, {"accuracy": acc - (lr == 3e-3) * 0.1}, lr=lr)
    chosen = []
    for prefix in ("a", "z"):  # the 1e-3 runs' folders named to sort first, then last
        for run in tmp_path.rglob("*0.001"):
            run.rename(run.with_name(prefix + run.name.lstrip("az")))
        (p,) = report.pivots(report.collect(tmp_path), "task", "method")
        cell = p.cells[("sst2", "lora")]
        chosen.append(cell.chosen)
        assert cell.tied == ["train.lr=0.001"] and not cell.edge  # tied: not "the grid's smallest"
        assert any("tied on the mean with train.lr=0.001" in n for n in report.pivot_notes(p))
    assert chosen == ["train.lr=0.0001", "train.lr=0.0001"]


def test_a_cell_never_chooses_between_tasks_or_models(tmp_path: Path) -> None:
    """`--rows method --cols model` over SST-2 and RTE runs filled the cell with SST-2's 81 and the
    note `reported task.subset=sst2, the best of the grid [rte; sst2]`: a cell is a grid of one
    task and one model, so that is one line naming the axis to add; the curves' legend likewise
    keeps one line per model rather than the best model under the method's name."""
    from toolkit.reports import plots

    for seed, (a, b) in ((42, (0.8, 0.6)), (43, (0.82, 0.62))):
        fake_run(tmp_path, "sst2", "lora", seed, {"accuracy": a})
        fake_run(tmp_path, "rte", "lora", seed, {"accuracy": b})
        fake_run(tmp_path, "rte", "lora", seed, {"accuracy": b + 0.1}, model="org/other")
    items = report.collect(tmp_path)
    with pytest.raises(UserError, match=r"^report: the cell lora / tiny \(method \\ model\) holds runs of 2 tasks "
                       r"\(rte, sst2\), .*; put task on --rows or --cols"):
        report.pivots(items, "method", "model")
    with pytest.raises(UserError, match=r"the cell rte / lora \(task \\ method\) holds runs of 2 models \(other, tiny\)"):
        report.pivots(items, "task", "method")
    (p,) = report.pivots(items, "task", "model")
    assert p.cells[("rte", "tiny")].stat.values == [0.6, 0.62] and p.cells[("rte", "other")].stat.values == [0.7, 0.72]
    curves = plots.entries(items)
    assert sorted(curves["rte"]) == ["other lora", "tiny lora"] and list(curves["sst2"]) == ["lora"]


DATA_SETS = {  # two data sets of one task name, told apart by what they read
    "files": ({"train_file": "/d/easy/train.csv", "eval_file": "/d/easy/dev.csv"},
              {"train_file": "/d/hard/train.csv", "eval_file": "/d/hard/dev.csv"},
              "eval_file easy/dev.csv, train_file easy/train.csv"),
    "hub split": ({"dataset": "org/set", "eval_split": "validation"}, {"dataset": "org/set", "eval_split": "test"},
                  "eval_split validation"),
    "label column": ({"train_file": "/d/a.csv", "label_column": "topic"},
                     {"train_file": "/d/a.csv", "label_column": "sentiment"}, "label_column topic"),
}


@pytest.mark.parametrize("entry", ["cli", "api"])
@pytest.mark.parametrize("case", sorted(DATA_SETS))
def test_runs_of_one_task_name_on_other_data_are_other_tasks(tmp_path: Path, cli, case: str, entry: str) -> None:
    """Own-data runs of one task name on two data sets (files, a Hub split, another label column)
    were one task on every axis: the pivot's lora cell took the easy set's 99.25 as the 'best' of a
    grid beside full's 74.25 on the hard set, the notes paired the two sets by seed and one plot
    drew them as one task, exit 0. The task's label now names the data that tells them apart."""
    easy, hard, said = DATA_SETS[case]
    for seed in (42, 43):
        for data, method, acc in ((easy, "lora", 0.95), (hard, "lora", 0.60), (hard, "full", 0.70)):
            run = fake_run(tmp_path, "x", method, seed, {"accuracy": acc + seed / 1000}, task_name="text_classification",
                           task_extra=data)
            _recipe_edit(run, "task", subset=None)
            run.rename(run.parent / f"{run.name}-{'easy' if data is easy else 'hard'}")
    if entry == "cli":
        code, text, _ = cli("report", tmp_path, "--rows", "task", "--cols", "method", "--no-plots")
        assert code == 0
    else:
        import toolkit

        text = toolkit.report([tmp_path], row_key="task", col_key="method")
    pivot = [[c.strip() for c in line.strip("|").split("|")] for line in _tables(text)[0][2:]]
    other = said.replace("easy", "hard").replace("validation", "test").replace("topic", "sentiment")
    assert {r[0]: r[1:] for r in pivot} == {f"text_classification ({said})": ["", "99.25 ± 0.07 (n=2)"],
                                            f"text_classification ({other})": ["74.25 ± 0.07 (n=2)", "64.25 ± 0.07 (n=2)"]}
    assert "best mean accuracy on dev of the grid" not in text  # no grid across data sets
    pairs = [line for line in text.splitlines() if line.startswith("- ") and " − " in line]  # the notes
    assert len(pairs) == 2 and all("hard" in p or "test" in p or "sentiment" in p for p in pairs)
    plotted = plotting.entries(report.collect(tmp_path))
    assert sorted(plotted) == sorted(r[0] for r in pivot) and sorted(plotted[f"text_classification ({other})"]) == [
        "full", "lora"]


@pytest.mark.parametrize("entry", ["pivot", "glue", "plots"])
@pytest.mark.parametrize("a, b, labels", [
    ("/runs/a/123/model", "/runs/b/456/model", ["123/model", "456/model"]),  # two fine-tuned model/ folders
    ("org1/minilm", "org2/minilm", ["org1/minilm", "org2/minilm"]),
])
def test_two_models_whose_checkpoints_end_alike_are_two_models(tmp_path: Path, cli, entry: str, a: str, b: str,
                                                                labels: list[str]) -> None:
    """Checkpoints that end in the same name (`.../model` of two runs) were one model on every axis:
    a cell took the better of the two as the best of a grid, the GLUE table gave them one row, exit 0."""
    for seed in (42, 43):
        fake_run(tmp_path, "rte", "lora", seed, {"accuracy": 0.60 + seed / 1000}, model=a)
        fake_run(tmp_path / "b", "rte", "lora", seed, {"accuracy": 0.70 + seed / 1000}, model=b)
    if entry == "pivot":
        code, text, _ = cli("report", tmp_path, "--rows", "method", "--cols", "model", "--no-plots")
        assert code == 0 and f"| method \\ model | {labels[0]} | {labels[1]} |" in text
        assert "| lora | 64.25 ± 0.07 (n=2) | 74.25 ± 0.07 (n=2) |" in text and "of the grid" not in text
    elif entry == "glue":
        text = glue_report.render(report.collect(tmp_path))
        assert f"| {labels[0]} lora | 64.25 ± 0.07 (n=2) |" in text and f"| {labels[1]} lora | 74.25 ± 0.07 (n=2) |" in text
    else:
        assert sorted(plotting.entries(report.collect(tmp_path))["rte"]) == [f"{label} lora" for label in labels]


@pytest.mark.parametrize("entry", ["cli", "api"])
def test_smoke_runs_are_another_model_than_their_checkpoint(tmp_path: Path, cli, entry: str) -> None:
    """A smoke run (a small random-weight model) beside the real runs of its recipe: a pivot cell
    chose between them as a grid over `smoke` (`reported smoke=True`, exit 0). Its model is
    another model: a cell holding both is refused as one of two models, `--rows model` parts them."""
    for seed in (42, 43):
        fake_run(tmp_path, "rte", "lora", seed, {"accuracy": 0.50 + seed / 1000})
        recipe = fake_run(tmp_path / "smoke", "rte", "lora", seed, {"accuracy": 0.60}) / "recipe.yaml"
        recipe.write_text(recipe.read_text().replace("smoke: false", "smoke: true"))

    def pivot(*axes: str) -> tuple[int, str]:
        if entry == "cli":
            code, out, err = cli("report", tmp_path, "--rows", axes[0], "--cols", axes[1], "--no-plots")
            return code, out + err
        try:
            return 0, toolkit_report([tmp_path], row_key=axes[0], col_key=axes[1])
        except UserError as exc:
            return 2, str(exc)

    code, text = pivot("task", "method")
    assert code == 2 and "holds runs of 2 models (tiny, tiny (smoke: random weights))" in text
    code, text = pivot("model", "method")
    assert code == 0 and "| tiny | 54.25 ± 0.07 (n=2) |" in text and "of the grid" not in text
    assert "| tiny (smoke: random weights) | 60.00 ± 0.00 (n=2) † |" in text


NO_EFFECT_VALUES = {"name": "mine/sst2-lora", "train.log_every": 50, "train.report_to": ["tensorboard"],
                    "train.save_total_limit": 3, "train.save_every": 100, "train.keep_checkpoints": True,
                    "train.gradient_checkpointing": True, "train.eval_batch_size": 64, "method.batch_size": 4}


@pytest.mark.parametrize("entry", ["cli", "glue"])
@pytest.mark.parametrize("field", sorted(NO_EFFECT_VALUES))
def test_a_seed_rerun_with_a_field_that_changes_no_number_is_a_seed_not_a_grid(
        tmp_path: Path, cli, field: str, entry: str) -> None:
    """Three seeds, and a fourth run with report_to on (or another log_every, eval_batch_size, a
    copy of the recipe under another name): two settings, so the pivot reported the fourth seed's
    90.00 (n=1) as the best of a 'grid' over that field, and the GLUE table its 90.00, exit 0.
    Fields that change no number are not part of a setting: one entry of four seeds, and the same
    seed run twice that way is refused as counted twice."""
    assert set(NO_EFFECT_VALUES) == report.core.NO_EFFECT - {"out"}
    section, _, key = field.rpartition(".")

    def rerun(seed: int, acc: float) -> Path:
        run = fake_run(tmp_path / "again", "rte", "lora", seed, {"accuracy": acc})
        if section:
            _recipe_edit(run, section, **{key: NO_EFFECT_VALUES[field]})
        else:
            recipe = yaml.safe_load((run / "recipe.yaml").read_text())
            (run / "recipe.yaml").write_text(yaml.safe_dump({**recipe, key: NO_EFFECT_VALUES[field]}))
        return run

    for seed, acc in ((42, 0.80), (43, 0.82), (44, 0.84)):
        fake_run(tmp_path, "rte", "lora", seed, {"accuracy": acc})
    rerun(45, 0.90)
    expected = f"84.00 ± {statistics.stdev([80, 82, 84, 90]):.2f} (n=4)"
    if entry == "cli":
        code, text, _ = cli("report", tmp_path, "--rows", "task", "--cols", "method", "--no-plots")
        assert code == 0 and f"| rte | {expected} |" in text and "of the grid" not in text
    else:
        text = glue_report.render(report.collect(tmp_path))
        assert f"| tiny lora | {expected} | {expected} |" in text and "settings" not in text
    twice = rerun(42, 0.70)
    code, _, err = cli("report", tmp_path, "--no-plots")
    assert code == 2 and len(err.strip().splitlines()) == 1 and str(twice) in err and "count that seed twice" in err


def test_runs_from_before_main_metric_pivot_on_a_score_not_the_loss(tmp_path: Path, cli) -> None:
    """metrics.json from before `main_metric` was written, with the loss first in eval: the pivot
    was of the loss; one such run that scored nothing (eval {}) crashed the report with
    `RuntimeError: generator raised StopIteration`."""
    runs = [fake_run(tmp_path, "sst2", "lora", seed, {"accuracy": acc}) for seed, acc in ((42, 0.8), (43, 0.82), (44, 0.9))]
    for run in runs:
        data = json.loads((run / "metrics.json").read_text())
        del data["main_metric"]
        data["eval"] = {} if run == runs[2] else {"loss": data["eval"]["loss"], "accuracy": data["eval"]["accuracy"]}
        (run / "metrics.json").write_text(json.dumps(data))
    (p,) = report.pivots(report.collect(tmp_path), "task", "method")
    assert p.metric.name == "accuracy" and p.cells[("sst2", "lora")].stat.values == [0.8, 0.82]
    code, out, err = cli("report", tmp_path, "--rows", "task", "--no-plots")
    assert code == 0 and "## accuracy (%) ↑: task × method" in out, err


def test_a_numeric_pivot_axis_is_in_numeric_order(tmp_path: Path) -> None:
    """`--rows train.lr` listed 0.0001, 0.001, 1e-05 (text order): numbers are in numeric order."""
    for lr in (1e-3, 1e-5, 1e-4):
        fake_run(tmp_path, "sst2", "lora", 42, {"accuracy": 0.8}, lr=lr)
    (p,) = report.pivots(report.collect(tmp_path), "train.lr", "method")
    assert p.rows == ["1e-05", "0.0001", "0.001"]


T_975 = {1: 12.706205, 2: 4.302653, 3: 3.182446}  # Student's t, 97.5% quantile, by degrees of freedom


@pytest.mark.parametrize("case, a, b, expected", [
    # B is A + 1 point at every seed, listed in another order: mean ± std overlap, yet paired by
    # seed the gap is the same on every seed (pairing by order would pair 80 with 84 + 1 ...)
    ("same gap every seed", ([0.80, 0.84, 0.82], [42, 43, 44]), ([0.83, 0.81, 0.85], [44, 42, 43]),
     "b − a = +1.00 on each of the 3 seeds 42, 43, 44: no spread (every seed's difference is the same, so its t "
     "interval has zero width and measures no noise): not judged separated"),
    ("same gap, two seeds", ([0.80, 0.84], [42, 43]), ([0.83, 0.87], [42, 43]),
     "b − a = +3.00 on each of the 2 seeds 42, 43: no spread"),
    ("equal on every seed", ([0.80, 0.84], [42, 43]), ([0.80, 0.84], [42, 43]),
     "a − b = +0.00 on each of the 2 seeds 42, 43: no spread"),
    ("noisy gap", ([0.80, 0.84, 0.82], [42, 43, 44]), ([0.81, 0.86, 0.85], [42, 43, 44]),
     f"b − a = +2.00, 95% CI [{2 - T_975[2] / 3 ** 0.5:+.2f}, {2 + T_975[2] / 3 ** 0.5:+.2f}] (paired by seed "
     "over 3 seeds 42, 43, 44; t, 2 df): not separated"),
    ("unmatched seeds left out", ([0.80, 0.84, 0.70], [42, 43, 45]), ([0.81, 0.86, 0.90], [42, 43, 46]),
     f"b − a = +1.50, 95% CI [{1.5 - T_975[1] * 0.5:+.2f}, {1.5 + T_975[1] * 0.5:+.2f}] (paired by seed over 2 "
     "seeds 42, 43; t, 1 df): not separated by these seeds; seeds without a partner, left out: 45, 46"),
])
def test_a_comparison_over_matched_seeds_is_their_paired_difference(case: str, a, b, expected: str) -> None:
    """Two entries run on the same seeds are compared by the per-seed difference (matched by the
    seed's value) and its t interval with n − 1 df; a seed only one side ran is named, not paired."""
    acc = report.declaration("accuracy")
    notes = report.overlap_notes([("a", report.Stat(*a)), ("b", report.Stat(*b))], acc, "sst2")
    first = expected[0]  # the better-ranked entry is named first
    assert len(notes) == 1 and notes[0].startswith(f"{first} and {'ab'[first == 'a']} (sst2): accuracy ") \
        and expected in notes[0], notes


def test_a_pivot_of_seeded_runs_says_the_paired_difference(tmp_path: Path) -> None:
    for seed, acc, gap in ((42, 0.80, 0.010), (43, 0.84, 0.012), (44, 0.82, 0.011)):
        fake_run(tmp_path, "sst2", "full", seed, {"accuracy": acc})
        fake_run(tmp_path, "sst2", "lora", seed, {"accuracy": acc + gap})
    (p,) = report.pivots(report.collect(tmp_path), "task", "method")
    assert any(n.startswith("lora and full (sst2): accuracy lora − full = +1.10") and n.endswith(
        "2 df): separated by these seeds") for n in report.pivot_notes(p)), report.pivot_notes(p)


@pytest.mark.parametrize("values, shown", [
    ([0.8800, 0.88001, 0.88003], "88.00 ± <0.01 (n=3)"),  # three seeds that differ: a spread, however small
    ([0.88, 0.88, 0.88], "88.00 ± 0.00 (n=3)"),  # one number thrice: no spread
    ([0.83 - 0.80, 0.87 - 0.84], "3.00 ± 0.00 (n=2)"),  # equal to float rounding
    ([0.80, 0.84], "82.00 ± 2.83 (n=2)"),
    ([0.80], "80.00 (n=1)"),  # one seed: no ± at all
])
def test_a_spread_too_small_to_print_is_not_printed_as_none(values: list, shown: str) -> None:
    """Seeds of STS-B whose Pearson differed in the 5th digit printed "88.00 ± 0.00": the spread of
    seeds that all gave one number, which reads as certainty; now "± <0.01"."""
    assert report.Stat(values).fmt(100.0) == shown


@pytest.mark.parametrize("case", ["paired interval", "paired, no spread", "grid's best"])
def test_a_claim_is_printed_with_the_digits_that_show_it(tmp_path: Path, case: str) -> None:
    """A Pearson gap of 0.003 points on every seed printed "lora − full = +0.00, 95% CI [+0.00,
    +0.00]: separated", and a grid's best 80.43 beside its runner-up's 80.43: the numbers denied the
    claim they stood for. Each claim now prints with as many decimals as tell its numbers apart
    (2 where they suffice); equal numbers stay equal."""
    gaps = {"paired interval": (0.00002, 0.00003, 0.000025), "paired, no spread": (0.00003,) * 3}
    for seed, base in ((42, 0.80), (43, 0.84), (44, 0.82)):
        if case == "grid's best":
            fake_run(tmp_path, "stsb", "lora", seed, {"pearson": base}, lr=1e-4, main="pearson")
            fake_run(tmp_path, "stsb", "lora", seed, {"pearson": base + 0.000004}, lr=1e-3, main="pearson")
        else:
            fake_run(tmp_path, "stsb", "full", seed, {"pearson": base}, main="pearson")
            fake_run(tmp_path, "stsb", "lora", seed, {"pearson": base + gaps[case][seed - 42]}, main="pearson")
    (p,) = report.pivots(report.collect(tmp_path), "task", "method")
    notes = report.pivot_notes(p)
    if case == "grid's best":
        (note,) = [n for n in notes if "reported train.lr=0.001" in n]
        shown = re.findall(r"train\.lr=[0-9.e-]+: ([0-9.]+) ±", note)
        assert len(shown) == 2 and shown[0] != shown[1] and float(shown[1]) > float(shown[0]), note
        return
    (note,) = [n for n in notes if n.startswith("lora and full (stsb): pearson lora − full = ")]
    numbers = re.findall(r"[+-]\d+\.\d+", note.split(" (paired")[0].split(" on each")[0])
    assert numbers and all(float(x) > 0 for x in numbers), note  # none printed as +0.00
    if case == "paired interval":
        assert note.endswith("separated by these seeds") and "not separated" not in note, note
    else:
        assert "+0.003 on each of the 3 seeds" in note, note


KEPT_BEST = {"step": 20, "on": "accuracy", "value": 0.8, "eval_loss": 0.5, "ties": "lower eval loss"}
KEPT_LAST = {"step": 20, "on": "the last step (train.keep_best: no evaluation gave accuracy a defined value)"}


@pytest.mark.parametrize("table", ["runs table", "pivot", "glue"])
def test_best_and_last_checkpoints_are_not_pooled_or_compared_without_a_word(tmp_path: Path, table: str) -> None:
    """LoRA's seed 43 kept its last step (no evaluation defined the selection metric) beside seed
    42's best step on dev, and full fine-tuning kept its last step: one mean pooled a checkpoint
    selected on the dev set it is scored on with one that was not, and the row compared a
    dev-selected cell with an unselected one, exit 0 and no word. Each is one line; runs that all
    kept one kind say nothing."""
    for seed in (42, 43):
        _stamp(fake_run(tmp_path, "sst2", "lora", seed, {"accuracy": 0.80 + seed / 1000}),
               kept=KEPT_BEST if seed == 42 else KEPT_LAST)
        _stamp(fake_run(tmp_path, "sst2", "full", seed, {"accuracy": 0.82 + seed / 1000}), kept=KEPT_LAST)
    items = report.collect(tmp_path)

    def notes(items: list[dict]) -> list[str]:
        if table == "runs table":
            return report.runs_notes(items)
        if table == "pivot":
            return report.pivot_notes(report.pivots(items, "task", "method")[0])
        return [line[2:] for line in glue_report.render(items).splitlines() if line.startswith("- ")]

    said = notes(items)
    mixed = [n for n in said if "its runs report different checkpoints" in n]
    assert len(mixed) == 1 and "lora" in mixed[0].split(":")[0] and "the best on dev (seed 42)" in mixed[0] \
        and "the last step (seed 43: the last step (train.keep_best: no evaluation gave accuracy" in mixed[0], said
    if table != "glue":  # the GLUE protocol lines say each cell's kept checkpoint
        compared = [n for n in said if "checkpoint kept (" in n]
        assert len(compared) == 1 and "the best on dev and the last step" in compared[0], said
    for run in tmp_path.rglob("metrics.json"):
        _stamp(run.parent, kept=KEPT_BEST)
    assert not [n for n in notes(report.collect(tmp_path)) if "different checkpoints" in n or "checkpoint kept" in n]


def _recipe_edit(run: Path, section: str, **fields) -> None:
    recipe = yaml.safe_load((run / "recipe.yaml").read_text())
    recipe.setdefault(section, {}).update(fields)
    (run / "recipe.yaml").write_text(yaml.safe_dump(recipe))


PROTOCOL = [  # (what differs between the compared cells, how the lora runs are changed)
    ("train.epochs", lambda run: _recipe_edit(run, "train", epochs=10)),
    ("task.max_length", lambda run: _recipe_edit(run, "task", max_length=512)),
    ("task.max_train_samples", lambda run: _recipe_edit(run, "task", max_train_samples=1000)),
    ("model.checkpoint", lambda run: _recipe_edit(run, "model", checkpoint="org/other")),
    ("processes", lambda run: _stamp_json(run, num_processes=2)),
    ("toolkit commit", lambda run: _stamp_json(run, git_commit="b" * 40)),
]


def _stamp_json(run: Path, **fields) -> None:
    data = json.loads((run / "metrics.json").read_text())
    (run / "metrics.json").write_text(json.dumps({**data, **fields}))


@pytest.mark.parametrize("field, change", PROTOCOL, ids=[p[0] for p in PROTOCOL])
def test_cells_compared_side_by_side_on_other_protocols_are_said(tmp_path: Path, field: str, change) -> None:
    """LoRA beside full in one pivot row: a difference in anything but the method (each method's
    own learning rate and the grid selected on dev excepted) is named, with each cell's value."""
    for seed in (42, 43):
        fake_run(tmp_path, "sst2", "full", seed, {"accuracy": 0.80 + seed / 1e3}, lr=1e-4)
        for lr in (1e-3, 3e-3):  # a grid, and another lr than full's: neither is a protocol difference
            fake_run(tmp_path, "sst2", "lora", seed, {"accuracy": 0.81 + lr}, lr=lr, extra={"r": 8})
    (p,) = report.pivots(report.collect(tmp_path), "task", "method")
    assert not [n for n in report.pivot_notes(p) if "differ in more than method" in n]
    for run in tmp_path.glob("glue/sst2/tiny-lora/*"):
        change(run)
    (p,) = report.pivots(report.collect(tmp_path), "task", "method")
    (note,) = [n for n in report.pivot_notes(p) if "differ in more than method" in n]
    assert note.startswith(f"sst2: full, lora differ in more than method: {field} (full: ") and "train.lr" not in note


@pytest.mark.parametrize("entry", ["glue", "cli"])
@pytest.mark.parametrize("field, change", PROTOCOL, ids=[p[0] for p in PROTOCOL])
def test_glue_rows_of_one_model_on_other_protocols_are_said(tmp_path: Path, cli, entry: str, field: str,
                                                            change) -> None:
    """`make glue` for LoRA and for full fine-tuning: the GLUE table set their rows side by side
    as methods alone where their RTE runs differed in epochs, max length, a training subset, the
    process count or the toolkit's version (its Protocols list gave each row's settings apart),
    exit 0. One line per task says it, as the pivot does; rows of two models are two models, and
    a field every cell chose on dev (an lr grid) is a selection, not a difference."""
    for seed in (42, 43):
        for task, evals, main in (("rte", {"accuracy": 0.6}, "accuracy"), ("cola", {"matthews_correlation": 0.4},
                                                                          "matthews_correlation")):
            fake_run(tmp_path, task, "full", seed, {k: v + seed / 1e3 for k, v in evals.items()}, lr=1e-4, main=main)
            for lr in (1e-3, 3e-3):
                fake_run(tmp_path, task, "lora", seed, {k: v + lr for k, v in evals.items()}, lr=lr, main=main)

    def notes() -> list[str]:
        if entry == "glue":
            text = glue_report.render(report.collect(tmp_path))
        else:
            code, text, err = cli("report", tmp_path, "--glue", "--no-plots")
            assert code == 0, err
        return [line for line in text.splitlines() if line.startswith("- GLUE ") and "differ in more than" in line]

    assert notes() == []
    for run in tmp_path.glob("glue/rte/tiny-lora/*"):
        change(run)
    said = notes()
    if field == "model.checkpoint":  # another model: its own row, compared with no one
        assert said == []
    else:
        assert len(said) == 1 and said[0].startswith(f"- GLUE RTE: tiny full, tiny lora differ in more than method: "
                                                     f"{field} (tiny full: "), said
        assert "train.lr" not in said[0]


@pytest.mark.parametrize("entry", ["cli", "api"])
@pytest.mark.parametrize("field, change", PROTOCOL, ids=[p[0] for p in PROTOCOL])
def test_rows_of_the_runs_table_on_other_protocols_are_said(tmp_path: Path, cli, entry: str, field: str,
                                                            change) -> None:
    """The runs table's notes compared LoRA and full of one task by seed ('separated by these
    seeds') with no word that they ran other epochs, lengths, models or code, where the pivot of the
    same runs said it; the runs table says it by the same rule (protocol_notes)."""
    for seed in (42, 43):
        fake_run(tmp_path, "sst2", "full", seed, {"accuracy": 0.80 + seed / 1e3}, lr=1e-4)
        fake_run(tmp_path, "sst2", "lora", seed, {"accuracy": 0.85 + seed / 1e3}, extra={"r": 8})

    def runs_section() -> str:
        if entry == "cli":
            code, text, _ = cli("report", tmp_path, "--no-plots")
            assert code == 0
        else:
            text = toolkit_report([tmp_path])
        return text.split("## Every run")[1]

    assert "differ in more than method" not in runs_section()  # the method and its lr: the comparison
    for run in tmp_path.glob("glue/sst2/tiny-lora/*"):
        change(run)
    (note,) = [line for line in runs_section().splitlines() if "differ in more than method" in line]
    assert note.startswith("- sst2: glue/sst2/tiny-full, glue/sst2/tiny-lora") and f": {field} (glue/sst2/tiny-full: " in note


@pytest.mark.parametrize("entry", ["cli", "api"])
def test_a_grid_in_one_cell_does_not_excuse_the_field_in_the_others(tmp_path: Path, cli, entry: str) -> None:
    """LoRA chosen among 1 and 3 epochs beside full's one setting of 10 epochs: the epochs were the
    LoRA cell's selection, and the row's protocol note left them out for full too (exit 0, no word
    that full trained 10 epochs). A field is excused only where every cell of the row chose it."""
    for seed in (42, 43):
        _recipe_edit(fake_run(tmp_path, "sst2", "full", seed, {"accuracy": 0.80}), "train", epochs=10)
        for epochs in (1, 3):
            _recipe_edit(fake_run(tmp_path / f"e{epochs}", "sst2", "lora", seed, {"accuracy": 0.80 + epochs / 100}),
                         "train", epochs=epochs)
    if entry == "cli":
        code, text, _ = cli("report", tmp_path, "--rows", "task", "--cols", "method", "--no-plots")
        assert code == 0
    else:
        text = toolkit_report([tmp_path], row_key="task", col_key="method")
    assert ("- sst2: full, lora differ in more than method: train.epochs (full: 10, lora: 3); their gap is not the "
            "method's alone") in text
    for run in tmp_path.glob("glue/sst2/tiny-full/*"):  # full chose among epochs too: both cells' selections
        shutil.copytree(run, tmp_path / "e5" / run.relative_to(tmp_path))
        _recipe_edit(tmp_path / "e5" / run.relative_to(tmp_path), "train", epochs=5)
    pivot = toolkit_report([tmp_path], row_key="task", col_key="method").split("## Every run")[0]
    assert "differ in more than method" not in pivot


@pytest.mark.parametrize("entry, cells, average", [
    # BERT (test server): F1 alone on MRPC, Spearman alone on STS-B: not GLUE's task score
    ("bert-base-test", ["52.1", "88.9 (F1 only)", "85.8 (Spearman only)"], "–"),
    # LoRA's Table 2: accuracy alone on MRPC, Pearson alone on STS-B
    ("roberta-base-lora", ["63.4", "89.7 (acc only)", "91.5 (Pearson only)"], "–"),
    # DistilBERT: no metric stated per task, so nothing is claimed either way
    ("distilbert-dev", ["51.3", "87.5", "86.9"], f"{(51.3 + 87.5 + 86.9) / 3:.1f}"),
])
def test_a_published_number_on_another_metric_is_said_and_kept_out_of_the_average(
        tmp_path: Path, entry: str, cells: list[str], average: str) -> None:
    evals = {"cola": {"matthews_correlation": 0.5}, "mrpc": {"accuracy": 0.8, "f1": 0.9},
             "stsb": {"pearson": 0.88, "spearmanr": 0.86}}
    for task, ev in evals.items():
        fake_run(tmp_path, task, "lora", 42, ev, main=glue_report.SPECS[task].main)
    rows = glue_report._rows(report.collect(tmp_path))
    published = {e["id"]: e for e in glue_report.published()}
    table = glue_report.side_by_side(rows, ["cola", "mrpc", "stsb"], [published[entry]])
    line = next(line for line in table.splitlines() if line.startswith(f"| {entry} "))
    assert [c.strip() for c in line.strip("|").split("|")][1:5] == [*cells, average]


@pytest.mark.parametrize("entry, cells, average", [
    # MiniLM's release prints MNLI-m: the matched split alone, not GLUE's MNLI score (m and mm)
    ("minilm-l12-dev", ["85.7 (matched only)", "91.5"], "–"),
    # BERT prints both splits: their mean is GLUE's MNLI score, as ours is
    ("bert-base-test", [f"{(84.6 + 83.4) / 2:.1f}", "90.5"], f"{((84.6 + 83.4) / 2 + 90.5) / 2:.1f}"),
    # LoRA's overall accuracy on matched and mismatched together (stated in words): as printed
    ("roberta-base-lora", ["87.5", "93.3"], f"{(87.5 + 93.3) / 2:.1f}"),
])
def test_a_published_mnli_number_on_one_split_is_said_and_kept_out_of_the_average(
        tmp_path: Path, entry: str, cells: list[str], average: str) -> None:
    """A published MNLI number on the matched split alone (MiniLM's MNLI-m) stood beside our MNLI
    score, the mean of matched and mismatched, and in its row's average, as the same score (exit 0)."""
    evals = {"mnli": {"accuracy": 0.84, "accuracy_mm": 0.82}, "qnli": {"accuracy": 0.9}}
    for task, ev in evals.items():
        fake_run(tmp_path, task, "full", 42, ev, main=glue_report.SPECS[task].main)
    rows = glue_report._rows(report.collect(tmp_path))
    published = {e["id"]: e for e in glue_report.published()}
    table = glue_report.side_by_side(rows, ["mnli", "qnli"], [published[entry]])
    line = next(line for line in table.splitlines() if line.startswith(f"| {entry} "))
    assert [c.strip() for c in line.strip("|").split("|")][1:4] == [*cells, average]
    ours = next(line for line in table.splitlines() if line.startswith("| ours: "))
    assert [c.strip() for c in ours.strip("|").split("|")][1:4] == ["83.00", "90.00", "86.50"]


def test_a_glue_average_over_fewer_seeds_than_ran_says_which(tmp_path: Path) -> None:
    """The GLUE average is per seed over seeds every task ran: a seed one task lacks is named."""
    for seed in (42, 43, 44):
        fake_run(tmp_path, "cola", "lora", seed, {"matthews_correlation": 0.5 + seed / 1e3}, main="matthews_correlation")
    for seed in (42, 43):
        fake_run(tmp_path, "sst2", "lora", seed, {"accuracy": 0.9 + seed / 1e3})
    text = glue_report.render(report.collect(tmp_path))
    per_seed = [(0.5 + s / 1e3 + 0.9 + s / 1e3) / 2 * 100 for s in (42, 43)]
    line = next(row for row in text.splitlines() if row.startswith("| tiny lora"))
    assert line.rstrip(" |").endswith(f"{statistics.mean(per_seed):.2f} ± {statistics.stdev(per_seed):.2f} (n=2) "
                                      "(seeds scored on every task only: 42, 43)")


@pytest.mark.parametrize("entry", ["glue", "api", "cli"])
def test_a_glue_average_of_tasks_run_on_other_seeds_is_no_one_seeds(tmp_path: Path, cli, entry: str) -> None:
    """CoLA on seeds 42 and 43, SST-2 on 44 and 45: no seed ran every task, so the average is one
    mean of the task means. It was printed `70.25 (n=1)`, read as one run's average beside cells
    of n=2; it carries no n and says what it is."""
    for seed in (42, 43):
        fake_run(tmp_path, "cola", "lora", seed, {"matthews_correlation": 0.5 + seed / 1e3}, main="matthews_correlation")
        fake_run(tmp_path, "sst2", "lora", seed + 2, {"accuracy": 0.9 + seed / 1e3})
    if entry == "glue":
        text = glue_report.render(report.collect(tmp_path))
    elif entry == "api":
        text = toolkit_report([tmp_path], glue=True)
    else:
        code, text, err = cli("report", tmp_path, "--glue", "--no-plots")
        assert code == 0, err
    line = next(row for row in text.splitlines() if row.startswith("| tiny lora"))
    mean = statistics.mean([0.5425, 0.9425]) * 100
    assert line.rstrip(" |").endswith(f"| {mean:.2f} (the mean of the task means: no seed ran every task, so no "
                                      "per-seed average and no spread)"), line


def test_a_glue_cell_chosen_among_settings_on_dev_says_so(tmp_path: Path) -> None:
    """`make glue` with a learning-rate grid: each task's number is the best setting on dev, which
    is optimistic when reported on that dev set; the protocol line says which cells were chosen."""
    for seed in (42, 43):
        for lr, acc in ((1e-4, 0.60), (1e-3, 0.70)):
            fake_run(tmp_path, "rte", "lora", seed, {"accuracy": acc + seed / 1e3}, lr=lr)
        fake_run(tmp_path, "sst2", "lora", seed, {"accuracy": 0.9})
    text = glue_report.render(report.collect(tmp_path))
    (line,) = [row for row in text.splitlines() if row.startswith("- **ours: tiny lora**")]
    assert ("rte: lr 0.001, batch ?, epochs None, max length None, seeds [42, 43], the best of 2 settings "
            "(train.lr) on the dev score, selected and scored on the same dev set: optimistic; sst2:") in line
    assert line.count("the best of") == 1  # sst2 ran one setting: nothing was chosen


@pytest.mark.parametrize("entry", ["cli", "api"])
def test_a_glue_tie_between_settings_is_said_and_goes_by_grid_order(tmp_path: Path, cli, entry: str) -> None:
    """Two learning rates with one MRPC task score (accuracy and F1 traded): the GLUE table took the
    setting whose text sorted first (lr 0.0001 before 3e-05) and did not say it was a tie; the
    pivot's rule (core.choose) takes the first in grid order and says the tie."""
    for lr, acc, f1 in ((1e-4, 0.84, 0.86), (3e-5, 0.80, 0.90)):
        fake_run(tmp_path, "mrpc", "full", 42, {"accuracy": acc, "f1": f1}, lr=lr, main="f1")
    text = _glue_text(tmp_path, cli, entry)
    assert "| tiny full | 80.00 (n=1) | 90.00 (n=1) | 85.00 (n=1) |" in text
    assert ("the best of 2 settings (train.lr) on the dev score, selected and scored on the same dev set: "
            "optimistic; train.lr=3e-05 reported, tied on the mean with train.lr=0.0001") in text


@pytest.mark.parametrize("task_extra, part", [
    ({"max_eval_samples": 50}, "at most a fixed random 50 dev examples (task.max_eval_samples=50)"),
    ({"train_from_dev": 0.5}, "the 50% of the dev split left after training on a seeded 50% of it "
                              "(task.train_from_dev=0.5; no train.tsv)"),
    ({"train_from_dev": 0.25, "max_eval_samples": 100}, "the 75% of the dev split left after training on a seeded "
     "25% of it (task.train_from_dev=0.25; no train.tsv), of that at most a fixed random 100 dev examples "
     "(task.max_eval_samples=100)"),
    ({"max_train_samples": 100}, None),  # a cut training set: scored on the whole dev split
])
def test_a_glue_cell_scored_on_part_of_dev_says_so(tmp_path: Path, task_extra: dict, part: str | None) -> None:
    """A cell scored on part of dev (task.max_eval_samples, or QNLI trained on dev by
    task.train_from_dev and scored on the rest) stood under "GLUE (dev)" beside the published
    whole-dev numbers, its protocol "dev split": now the cell, the averages holding it and a
    note say on what it was scored."""
    for seed in (42, 43):
        fake_run(tmp_path, "rte", "lora", seed, {"accuracy": 0.7}, task_extra=task_extra)
        fake_run(tmp_path, "sst2", "lora", seed, {"accuracy": 0.9})
    text = glue_report.render(report.collect(tmp_path))
    ours = [row for row in text.splitlines() if row.startswith(("| tiny lora", "| ours: tiny lora"))]
    assert len(ours) == 2
    for row in ours:  # SST-2, RTE, the average
        cells = [c.strip() for c in row.strip("|").split("|")][1:4]
        assert [c.endswith("§") for c in cells] == [False, part is not None, part is not None], row
    notes = [line for line in text.splitlines() if line.startswith("- §")]
    (protocol,) = [row for row in text.splitlines() if row.startswith("- **ours: tiny lora**")]
    if part is None:
        assert not notes and "rte: lr 0.001, batch ?, epochs None, at most 100 training examples, max length" in protocol
        return
    assert notes == [f"- § tiny lora / RTE: scored on {part}, not the whole dev split that GLUE's dev numbers and the "
                     "published dev rows are on: not comparable with them, nor is an average that holds it"]
    assert f"rte: lr 0.001, batch ?, epochs None, scored on {part}, max length" in protocol


CARVED = "the 50% of the dev split left after training on a seeded 50% of it (task.train_from_dev=0.5; no train.tsv)"
CAPPED = "at most a fixed random 100 dev examples (task.max_eval_samples=100)"


@pytest.mark.parametrize("task_extra, marked, notes, protocol", [
    ({"train_from_dev": 0.5}, [True, False], {"MNLI-m": CARVED}, f"MNLI-m scored on {CARVED}"),
    ({"max_eval_samples": 100}, [True, True], {"MNLI": CAPPED}, f"scored on {CAPPED}"),
    ({"train_from_dev": 0.5, "max_eval_samples": 100}, [True, True],
     {"MNLI-m": f"{CARVED}, of that {CAPPED}", "MNLI-mm": CAPPED},
     f"MNLI-m scored on {CARVED}, of that {CAPPED}, MNLI-mm scored on {CAPPED}"),
])
def test_a_glue_column_is_marked_part_of_dev_only_where_its_split_was(tmp_path: Path, task_extra: dict,
                                                                     marked: list, notes: dict, protocol: str) -> None:
    """task.train_from_dev carves MNLI's matched dev split alone (the task's first); the mismatched
    column, scored on the whole dev_mismatched split, was marked § and noted as the carved
    remainder too. Each column is marked, noted and described by its own split."""
    for seed in (42, 43):
        fake_run(tmp_path, "mnli", "lora", seed, {"accuracy": 0.7, "accuracy_mm": 0.72}, task_extra=task_extra)
    text = glue_report.render(report.collect(tmp_path))
    (row,) = [r for r in text.splitlines() if r.startswith("| tiny lora")]
    cells = [c.strip() for c in row.strip("|").split("|")][1:3]  # MNLI-m, MNLI-mm
    assert [c.endswith("§") for c in cells] == marked, row
    said = [line for line in text.splitlines() if line.startswith("- §")]
    assert said == [f"- § tiny lora / {column}: scored on {part}, not the whole dev split that GLUE's dev numbers and "
                    "the published dev rows are on: not comparable with them, nor is an average that holds it"
                    for column, part in notes.items()], said
    (line,) = [r for r in text.splitlines() if r.startswith("- **ours: tiny lora**")]
    assert f"epochs None, {protocol}, max length" in line, line


@pytest.mark.parametrize("subset, evals, sizes, marked", [
    ("rte", {"accuracy": 0.7}, {"": 277}, [False]),  # RTE's 277 dev examples under a cap of 1000: whole
    ("rte", {"accuracy": 0.7}, {"": 1000}, [True]),  # the cap reached: a subset
    ("rte", {"accuracy": 0.7}, None, [True]),  # a run from before eval_samples was recorded: as it was
    ("mnli", {"accuracy": 0.7, "accuracy_mm": 0.72}, {"": 1000, "_mm": 900}, [True, False]),
    ("mnli", {"accuracy": 0.7, "accuracy_mm": 0.72}, {"": 800, "_mm": 900}, [False, False]),
], ids=["rte-whole", "rte-capped", "rte-unrecorded", "mnli-m-capped", "mnli-whole"])
def test_a_cap_above_a_dev_splits_size_is_not_said_part_of_dev(tmp_path: Path, subset: str, evals: dict,
                                                                sizes: dict | None, marked: list) -> None:
    """Finding: task.max_eval_samples at or above a dev split's size scores the split whole
    (tasks.subset), but the GLUE table marked the cell § "at most a fixed random 1000 dev examples
    ..., not the whole dev split": a false caveat on a whole-dev number, exit 0. metrics.json now
    records the examples scored per split (`eval_samples`), and a split scored on fewer than the
    cap is not marked; each column by its own split."""
    for seed in (42, 43):
        run = fake_run(tmp_path, subset, "lora", seed, evals, task_extra={"max_eval_samples": 1000})
        if sizes is not None:
            metrics = json.loads((run / "metrics.json").read_text())
            (run / "metrics.json").write_text(json.dumps({**metrics, "eval_samples": sizes}))
    text = glue_report.render(report.collect(tmp_path))
    (row,) = [r for r in text.splitlines() if r.startswith("| tiny lora")]
    cells = [c.strip() for c in row.strip("|").split("|")][1:1 + len(evals)]
    assert [c.endswith("§") for c in cells] == marked, row
    assert row.strip("| ").endswith("§") == any(marked), row  # the GLUE average holds it or not
    said = [line for line in text.splitlines() if line.startswith("- §")]
    assert bool(said) == any(marked), said


LAST = "the last step (train.keep_best is false or nothing was trained)"
BEST = "the best checkpoint on dev (keep_best; selected and scored on the same dev set, as the papers do)"


@pytest.mark.parametrize("rte, sst2, says", [
    ("best", "best", BEST + "."),
    (LAST, "best", BEST + ", except where a task below says what was kept."),
    (LAST, "the last step (train.keep_best: no evaluation gave accuracy a defined value)",
     "not selected on dev (each task below says what was kept)."),
])
def test_the_glue_protocol_says_which_checkpoint_each_task_kept(tmp_path: Path, rte: str, sst2: str, says: str) -> None:
    """The protocol said "the best checkpoint on dev (keep_best)" of every row, also of runs with
    train.keep_best false and of in-context runs (nothing trained): now it is said only where each
    run's metrics.json `kept` says so, and a task that kept its last step says why."""
    for seed in (42, 43):
        for task, kept in (("rte", rte), ("sst2", sst2)):
            run = fake_run(tmp_path, task, "lora", seed, {"accuracy": 0.7})
            metrics = json.loads((run / "metrics.json").read_text())
            metrics["kept"] = {"step": 20, "on": "accuracy", "value": 0.7} if kept == "best" else {"step": 20, "on": kept}
            (run / "metrics.json").write_text(json.dumps(metrics))
    text = glue_report.render(report.collect(tmp_path))
    (line,) = [row for row in text.splitlines() if row.startswith("- **ours: tiny lora**")]
    assert line.startswith(f"- **ours: tiny lora**: dev split, mean ± sample std over seeds, {says} rte:"), line
    for task, kept in (("rte", rte), ("sst2", sst2)):
        cell = line.split(f"{task}: ", 1)[1].split(";")[0].removesuffix(".")
        assert cell.endswith(f"seeds [42, 43], kept {kept}" if kept != "best" else "seeds [42, 43]"), cell


OTHER_CODE = {  # how seed 44 of full fine-tuning (and both RTE lora seeds) differ -> what the lines name:
    # (full's sst2 seeds, lora's GLUE average over its SST-2 and RTE cells); None: not a difference
    "toolkit commit": ({"git_commit": "b" * 40}, "toolkit commit aaaaaaaaaaaa (seeds 42, 43), bbbbbbbbbbbb (seed 44)",
                       "toolkit commit aaaaaaaaaaaa (SST-2 seeds 42, 43), bbbbbbbbbbbb (RTE seeds 42, 43)"),
    "uncommitted changes": ({"git_dirty": True}, "aaaaaaaaaaaa + uncommitted changes (seed 44)",
                            "toolkit commit aaaaaaaaaaaa (SST-2 seeds 42, 43), aaaaaaaaaaaa + uncommitted changes "
                            "(RTE seeds 42, 43)"),
    "torch version": ({"versions": {"torch": "9.9", "peft": "0.2"}}, "torch 2.0 (seeds 42, 43), 9.9 (seed 44)",
                      "torch 2.0 (SST-2 seeds 42, 43), 9.9 (RTE seeds 42, 43)"),
    "code record": ({"code": {"toolkit": "a" * 12, "torch": "2.0", "accelerate": "1.0"}}, None, None),  # the same code
    "code record, other peft": ({"code": {"toolkit": "a" * 12, "torch": "2.0", "peft": "0.1"}},
                                "peft 0.2 (seeds 42, 43), 0.1 (seed 44)",
                                "peft 0.2 (SST-2 seeds 42, 43), 0.1 (RTE seeds 42, 43)"),
    "resumed mid-run": ({"resumed_under_other_code": [{"step": 3, "was": {"torch": "1.0"}, "now": {"torch": "2.0"}}]},
                        "seed 44 resumed under other code than it started on",
                        "RTE seeds 42, 43 resumed under other code than it started on"),
}


@pytest.mark.parametrize("case", sorted(OTHER_CODE))
def test_seeds_on_other_code_are_marked_in_every_table_they_are_pooled_in(tmp_path: Path, cli, monkeypatch,
                                                                        case: str) -> None:
    """Seed 44 ran after a `git pull` (or a library upgrade, or was resumed under one): its score
    was pooled with seeds 42 and 43 into one mean ± std, the spread read as seed noise, nothing
    said. Now each figure derived from runs of other code is marked ‡ with one line naming what
    differs and which seeds ran on what: the runs table, the pivot, the GLUE table, its average
    (a task of mixed code, or tasks that ran on different code from one another: lora's RTE
    seeds ran on other code than its SST-2 seeds) and the side-by-side table, and each plot's
    legend or labels; `toolkit report` and toolkit.report. A field one run did not record is not
    a difference (runs from before it)."""
    import matplotlib.text
    import toolkit
    from toolkit.reports import plots

    change, named, across = OTHER_CODE[case]
    for seed, acc in ((42, 0.80), (43, 0.82), (44, 0.84)):
        run = fake_run(tmp_path, "sst2", "full", seed, {"accuracy": acc})
        _stamp_json(run, **{"versions": {"torch": "2.0", "peft": "0.2"}, **(change if seed == 44 else {})})
    for seed in (42, 43):
        _stamp_json(fake_run(tmp_path, "sst2", "lora", seed, {"accuracy": 0.8}), versions={"torch": "2.0", "peft": "0.2"})
        _stamp_json(fake_run(tmp_path, "rte", "lora", seed, {"accuracy": 0.6}),
                    **{"versions": {"torch": "2.0", "peft": "0.2"}, **change})
    resumed = case == "resumed mid-run"  # each RTE lora run changed code itself: that cell is marked too
    items = report.collect(tmp_path)
    header, table = report.rows(items)
    seeds = {row[0]: row[2] for row in table}
    assert seeds == {"glue/sst2/tiny-full": "3 ‡" if named else "3", "glue/sst2/tiny-lora": "2",
                     "glue/rte/tiny-lora": "2 ‡" if resumed else "2"}
    (p,) = report.pivots(items, "task", "method")
    glue_text = glue_report.render(items)
    drawn: list[list[str]] = []  # each figure's texts (titles, legends, tick labels), nothing written

    def keep(fig, path: Path) -> tuple[Path, bytes]:
        drawn.append([t.get_text() for t in fig.findobj(matplotlib.text.Text)])
        plots._plt().close(fig)
        return path, b""

    monkeypatch.setattr(plots, "_save", keep)
    draw = case in ("toolkit commit", "code record")  # the figures do not depend on what differs: drawn twice
    md = report.render(tmp_path, glue=True, out=tmp_path / "out", plots=draw)
    assert [name for group in plots.entries(items).values() for name in group] == (
        ["lora ‡" if resumed else "lora", "full ‡" if named else "full", "lora"])  # rte, then sst2
    notes = [n.removeprefix("- ").removeprefix("‡ ").split(":")[0] for n in report.runs_notes(items) + report.pivot_notes(p)
             + glue_text.splitlines() + plots.plot_notes(items) if "did not all run on one code" in n]
    if named is None:
        assert notes == [] and "‡" not in report.pivot_markdown(p) + report.cost_table(p) + glue_text + md
        assert drawn and not any("‡" in t for texts in drawn for t in texts)  # drawn: this case
        return
    # full's GLUE average is over SST-2 alone: the same runs as its SST-2 cell, whose line says it
    assert sorted(notes) == sorted(["glue/sst2/tiny-full", "sst2 / full", "tiny full / SST-2",
                                    "tiny lora / GLUE avg", "sst2 / full (plots)"]
                                   + ["glue/rte/tiny-lora", "rte / lora", "tiny lora / RTE", "rte / lora (plots)"] * resumed)
    for line in md.splitlines():
        if line.startswith(("- ‡ tiny full", "- ‡ sst2 / full", "- ‡ glue/sst2/tiny-full")):
            assert named in line, line
    assert f"- ‡ tiny lora / GLUE avg: its 4 runs did not all run on one code: {across}; it averages them" in md
    assert "| sst2 | 82.00 ± 2.00 (n=3) ‡ |" in report.pivot_markdown(p)
    assert "| sst2 | full ‡ |" in report.cost_table(p) and "| sst2 | lora |" in report.cost_table(p)
    ours = {line.split("|")[1].strip(): line for line in glue_text.splitlines() if line.startswith(("| tiny", "| ours"))}
    assert ours["tiny full"].rstrip(" |").endswith("82.00 ± 2.00 (n=3) ‡ over 1 tasks")  # SST-2 and its average
    assert ours["tiny lora"].rstrip(" |").endswith(" ‡")  # the average over SST-2 and RTE
    assert "82.00 ± 2.00 ‡" in ours["ours: tiny full"] and ours["ours: tiny lora"].count("‡") == 1 + resumed
    sst2_figures = [texts for texts in drawn if any(t.startswith("sst2") for t in texts)]
    assert len(sst2_figures) == 3 * draw  # curves, params, cost: each names full with its mark, lora without
    for texts in sst2_figures:
        assert any(t.startswith("full ‡") for t in texts) and not any(t.startswith("lora ‡") for t in texts), texts
    code, text, err = cli("report", tmp_path, "--rows", "task", "--cols", "method", "--no-plots")
    assert code == 0, err
    for said in (text, toolkit.report([tmp_path], row_key="task", col_key="method")):
        assert [line.startswith("- ‡ ") for line in said.splitlines() if named in line] == [True, True], said

# (method, seed, lr, accuracy, torch) of each run -> whether each comparison note is ‡, and what it names
V1, V2 = {"torch": "2.0"}, {"torch": "9.9"}
COMPARED = {
    "one code": ([("full", 42, 1e-3, 0.80, V1), ("full", 43, 1e-3, 0.84, V1), ("lora", 42, 1e-3, 0.81, V1),
                  ("lora", 43, 1e-3, 0.86, V1)], {"paired": None}),
    # each seed's pair ran on two codes: every difference is partly the code's
    "pairs across code": ([("full", 42, 1e-3, 0.80, V1), ("full", 43, 1e-3, 0.84, V1), ("lora", 42, 1e-3, 0.81, V2),
                           ("lora", 43, 1e-3, 0.86, V2)],
                          {"paired": "torch 9.9 (lora seeds 42, 43), 2.0 (full seeds 42, 43)"}),
    # each pair on one code, the seeds on two: the differences pooled as seeds are not seed noise
    "seeds across code": ([("full", 42, 1e-3, 0.80, V1), ("full", 43, 1e-3, 0.84, V2), ("lora", 42, 1e-3, 0.81, V1),
                           ("lora", 43, 1e-3, 0.86, V2)],
                          {"paired": "torch 2.0 (lora seed 42; full seed 42), 9.9 (lora seed 43; full seed 43)"}),
    # the seed on other code has no partner: left out of the difference, which is of one code
    "unpaired seed on other code": ([("full", 42, 1e-3, 0.80, V1), ("full", 43, 1e-3, 0.84, V1),
                                     ("full", 44, 1e-3, 0.82, V2), ("lora", 42, 1e-3, 0.81, V1),
                                     ("lora", 43, 1e-3, 0.86, V1)], {"paired": None}),
    # no seed in common: the mean ± std overlap note reads every run of both
    "overlap across code": ([("full", 42, 1e-3, 0.80, V1), ("full", 43, 1e-3, 0.84, V1), ("lora", 44, 1e-3, 0.81, V2),
                             ("lora", 45, 1e-3, 0.85, V2)],
                            {"overlap": "torch 9.9 (lora seeds 44, 45), 2.0 (full seeds 42, 43)"}),
    # a grid whose settings ran on two codes: the best of them is chosen across code
    "grid across code": ([("full", 42, 1e-3, 0.80, V1), ("full", 43, 1e-3, 0.84, V1), ("full", 42, 3e-3, 0.82, V2),
                          ("full", 43, 3e-3, 0.83, V2)],
                         {"grid": "torch 2.0 (train.lr=0.001 seeds 42, 43), 9.9 (train.lr=0.003 seeds 42, 43)",
                          # the runs table shows both settings as rows: their paired difference too
                          "paired": "torch 9.9 (full [train.lr=0.003] seeds 42, 43), 2.0 (full [train.lr=0.001] seeds 42, 43)"}),
}
COMPARISONS = {"paired": "paired by seed", "overlap": "overlap (mean ± std)", "grid": "the best mean accuracy"}


@pytest.mark.parametrize("case", sorted(COMPARED))
def test_comparisons_of_runs_on_other_code_are_marked(tmp_path: Path, case: str) -> None:
    """A paired difference subtracts seed s of one entry from seed s of the other, and pools the
    differences as seeds; an overlap note and a grid's choice read every seed of the entries they
    compare. Where the runs such a note reads did not all run on one code (one side upgraded, or
    seed 43 of both), the note is marked ‡ and names which runs ran on what, in the runs notes,
    the pivot notes and the rendered report, as pooled cells are; the same runs on one code, or
    a seed on other code that the difference leaves out, are not marked."""
    runs, expected = COMPARED[case]
    for method, seed, lr, acc, torch_version in runs:
        _stamp_json(fake_run(tmp_path, "sst2", method, seed, {"accuracy": acc}, lr=lr), versions=torch_version)
    items = report.collect(tmp_path)
    (p,) = report.pivots(items, "task", "method")
    md = report.render(tmp_path, glue=True, out=tmp_path / "out", plots=False, row_key="task", col_key="method")
    for kind, phrase in COMPARISONS.items():
        notes = [n for n in report.runs_notes(items) + report.pivot_notes(p) if phrase in n]
        lines = [line for line in md.splitlines() if phrase in line]
        if kind not in expected:
            assert not [n for n in notes if n.startswith("‡")], notes
            continue
        assert notes and len(lines) == len(notes), (notes, lines)
        named = expected[kind]
        for note in notes:
            assert note.startswith("‡ ") == bool(named), note
            if named:
                short = note.replace("glue/sst2/tiny-", "")  # the runs notes name runs, the pivot's methods
                assert f"its runs did not all run on one code: {named}: " in short, note
        assert all(line.startswith("- ‡ ") == bool(named) for line in lines), lines


def _tables(text: str) -> list[list[str]]:
    """The Markdown tables of a report, each as its lines."""
    tables, current = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            current.append(line)
        elif current:
            tables, current = tables + [current], []
    return tables


@pytest.mark.parametrize("rows", [None, "model", "train.lr"])
def test_a_bar_in_a_name_stays_in_its_cell_in_every_table(tmp_path: Path, rows: str | None) -> None:
    """A model (or run) named with `|` split its row of the runs table, the pivot and the GLUE
    table: every later cell sat under another column's header (the accuracy under `seeds`), exit
    0. Each row of every table now has its header's columns; the bar is escaped."""
    for seed, acc in ((42, 0.80), (43, 0.84)):
        fake_run(tmp_path, "sst2", "full", seed, {"accuracy": acc}, model="org/x|y")
        fake_run(tmp_path, "sst2", "lora", seed, {"accuracy": acc - 0.1}, model="org/x|y")
    text = report.render(tmp_path, plots=False, row_key=rows, glue=True)
    tables = _tables(text)
    assert len(tables) >= (3 if rows else 2)
    for table in tables:
        widths = {len(re.split(r"(?<!\\)\|", line)) for line in table}
        assert len(widths) == 1, table
    assert any("x\\|y" in line for table in tables for line in table)


@pytest.mark.parametrize("entry", ["cli", "api"])
def test_runs_not_finished_are_named_not_dropped_without_a_word(tmp_path: Path, cli, entry: str) -> None:
    """Three seeds of LoRA were started and one diverged and stopped (its folder keeps a
    checkpoint, no metrics.json): the report gave LoRA's mean over the two that finished, n=2,
    with no word of the third, a mean that flatters the method. Each run folder below the roots
    that is not finished is now named, with the step it kept, in one note."""
    import toolkit

    for seed, acc in ((42, 0.80), (43, 0.84), (44, 0.82)):
        fake_run(tmp_path, "sst2", "full", seed, {"accuracy": acc})
    for seed in (42, 43):
        fake_run(tmp_path, "sst2", "lora", seed, {"accuracy": 0.9})
    stopped = fake_run(tmp_path, "sst2", "lora", 44, {"accuracy": 0.1})
    (stopped / "metrics.json").unlink()
    (stopped / "checkpoints" / "step-000004").mkdir(parents=True)
    killed = fake_run(tmp_path, "sst2", "lora", 45, {"accuracy": 0.1})
    (killed / "metrics.json").unlink()
    if entry == "cli":
        code, text, err = cli("report", tmp_path, "--no-plots")
        assert code == 0, err
    else:
        text = toolkit.report([tmp_path])
    (note,) = [line for line in text.splitlines() if line.startswith("- ") and "not finished" in line]
    assert note.startswith("- 2 run(s) not finished") and f"{stopped} (checkpoint of step 4)" in note \
        and f"{killed} (no checkpoint)" in note, note
    assert "90.00 ± 0.00 | " in text and "| 2 (+2 not finished) |" in text  # the two finished seeds, and the two not


@pytest.mark.parametrize("entry", ["cli", "api"])
def test_a_seed_started_and_not_finished_is_counted_in_the_cell_it_would_join(tmp_path: Path, cli, entry: str) -> None:
    """Three LoRA seeds of RTE were started and one diverged and stopped (no metrics.json): the
    pivot cell, the GLUE cell and the runs table read `(n=2)`, the mean of the seeds that survived
    (flattering LoRA beside full's three), the stopped seed named only in one note at the report's
    end, where a null seed was counted in its cell. Each table now counts it beside its n, and the
    pivot and GLUE sections name it. An unfinished run of another setting (another task, another
    method) or of a seed that finished is no missing seed of the cell."""
    for seed, acc in ((42, 0.60), (43, 0.64), (44, 0.62)):
        fake_run(tmp_path, "rte", "full", seed, {"accuracy": acc})
    for seed in (42, 43):
        fake_run(tmp_path, "rte", "lora", seed, {"accuracy": 0.7 + seed / 1000})
    stopped = fake_run(tmp_path, "rte", "lora", 44, {"accuracy": 0.1})
    (stopped / "metrics.json").unlink()
    (stopped / "checkpoints" / "step-000004").mkdir(parents=True)
    other = fake_run(tmp_path, "sst2", "lora", 44, {"accuracy": 0.1})  # another task: its own cell, n=0
    (other / "metrics.json").unlink()
    again = fake_run(tmp_path / "copy", "rte", "full", 42, {"accuracy": 0.1})  # seed 42 of full finished already
    (again / "metrics.json").unlink()
    shutil.copytree(stopped, tmp_path / "zz" / "stopped")  # a copy of the stopped seed: still one seed
    options = dict(row_key="task", col_key="method", glue=True)
    if entry == "cli":
        code, text, err = cli("report", tmp_path, "--rows", "task", "--cols", "method", "--glue", "--no-plots")
        assert code == 0, err
    else:
        text = toolkit_report([tmp_path], **options)
    assert "| rte | 62.00 ± 2.00 (n=3) | 74.25 ± 0.07 (n=2; 1 not finished) |" in text  # the pivot
    assert "| tiny lora | – (n=0; 1 not finished) | 74.25 ± 0.07 (n=2; 1 not finished) |" in text
    assert "| tiny full | – | 62.00 ± 2.00 (n=3) |" in text
    assert "| glue/rte/tiny-lora | lora | 2 (+1 not finished) |" in text and "| glue/rte/tiny-full | full | 3 |" in text
    said = f"seed 44 at {stopped} (checkpoint of step 4)"
    assert [line for line in text.splitlines() if said in line] == [  # the GLUE section, then the pivot's
        f"- tiny lora / RTE: 1 run(s) started and not finished (no metrics.json: stopped, failed, diverged, killed, "
        f"or running now), out of that cell's n and mean and of the per-seed GLUE average: {said}",
        f"- rte / lora: 1 run(s) started and not finished (no metrics.json: stopped, failed, diverged, killed, or "
        f"running now), out of the cell's mean, its n and its choice of setting: {said}"]
    assert "| sst2 |  | – (n=0; 1 not finished) |" in text  # its own cell (test_every_method_and_task_started_*)
    assert str(again) not in text.replace(f"{again} (no checkpoint)", "")
    assert "- 4 run(s) not finished" in text  # the end note names every folder
    (p,) = report.pivots(report.collect(tmp_path), "task", "method")  # the API's own pivot
    assert [r["run"] for r in p.left[("rte", "lora")]] == [stopped] and ("rte", "full") not in p.left


@pytest.mark.parametrize("entry", ["cli", "api"])
def test_every_method_and_task_started_is_in_the_tables_when_every_seed_stopped(tmp_path: Path, cli, entry: str) -> None:
    """LoRA beside full on RTE, every LoRA seed diverged and stopped (no metrics.json), and every
    seed of a full fine-tune of SST-2 on a second model killed: the pivot had no lora column and
    the GLUE table no LoRA row and no SST-2 column, as if never run, the folders named only in
    the report's end note. Each is in its table, `– (n=0; k not finished)`, under the labels a
    finished run of its recipe gets (the model `org2/tiny` beside `org1/tiny`, not `tiny`)."""
    for seed, acc in ((42, 0.60), (43, 0.64), (44, 0.62)):
        fake_run(tmp_path, "rte", "full", seed, {"accuracy": acc}, model="org1/tiny")
        lora = fake_run(tmp_path, "rte", "lora", seed, {"accuracy": 0.1}, model="org1/tiny")
        (lora / "metrics.json").unlink()
    for seed in (42, 43):
        killed = fake_run(tmp_path / "other", "sst2", "full", seed, {"accuracy": 0.1}, model="org2/tiny")
        (killed / "metrics.json").unlink()
        fake_run(tmp_path / "null", "cola", "full", seed, {"matthews_correlation": None}, model="org3/tiny")
    if entry == "cli":
        code, text, err = cli("report", tmp_path, "--rows", "task", "--cols", "method", "--glue", "--no-plots")
        assert code == 0, err
        pivot = text
    else:
        text = toolkit_report([tmp_path], glue=True, plots=False)
        (p,) = report.pivots(report.collect(tmp_path), "task", "method")
        assert p.cols == ["full", "lora"] and p.rows == ["rte", "sst2"] and not p.cells.get(("rte", "lora"))
        assert [len(p.left[k]) for k in (("rte", "lora"), ("sst2", "full"))] == [3, 2]
        (q,) = report.pivots(report.collect(tmp_path), "task", "run")  # the run's name as a finished run's
        assert {k: len(v) for k, v in q.left.items()} == {("rte", "glue/rte/tiny-lora"): 3,
                                                          ("sst2", "other/glue/sst2/tiny-full"): 2}
        pivot = report.pivot_markdown(p)
    assert "| rte | 62.00 ± 2.00 (n=3) | – (n=0; 3 not finished) |" in pivot  # LoRA is there, none finished
    assert "| sst2 | – (n=0; 2 not finished) |  |" in pivot
    assert "| model / method | CoLA MCC | SST-2 acc | RTE acc | GLUE avg |" in text  # GLUE: the task, and each row
    assert "| org1/tiny full | – | – | 62.00 ± 2.00 (n=3) | 62.00 ± 2.00 (n=3) over 1 tasks |" in text
    assert "| org1/tiny lora | – | – | – (n=0; 3 not finished) | – |" in text
    assert "| org2/tiny full | – | – (n=0; 2 not finished) | – | – |" in text
    assert "| org3/tiny full | – (n=0; 2 no score) | – | – | – |" in text  # finished, none with a score
    assert "- org1/tiny lora / RTE: 3 run(s) started and not finished" in text


def test_a_recipe_field_no_run_has_is_not_a_pivot_axis(tmp_path: Path, cli) -> None:
    """`--rows train.lrr` (a typo) pivoted every run into one row labelled '–', exit 0, as if no
    run had set the field: one line with a did-you-mean, from the CLI and the API. A field some
    run has, null in others (method.r beside full fine-tuning), is an axis as before."""
    import toolkit

    for seed in (42, 43):
        fake_run(tmp_path, "sst2", "full", seed, {"accuracy": 0.8})
        fake_run(tmp_path, "sst2", "lora", seed, {"accuracy": 0.7}, extra={"r": 8})
    said = "report --rows 'train.lrr': no run's recipe has that field (did you mean 'train.lr'?)"
    code, _, err = cli("report", tmp_path, "--rows", "train.lrr", "--no-plots")
    assert code == 2 and err == f"error: {said}\n"
    with pytest.raises(toolkit.UserError, match=re.escape(said)):
        toolkit.report(tmp_path, row_key="train.lrr")
    with pytest.raises(toolkit.UserError, match=re.escape("report --cols 'method.rank': no run's recipe")):
        report.pivots(report.collect(tmp_path), "task", "method.rank")
    (p,) = report.pivots(report.collect(tmp_path), "method.r", "method")
    assert p.rows == ["8", "–"]


@pytest.mark.parametrize("entry", ["cli", "api"])
@pytest.mark.parametrize("axis, key", [("--rows", "train"), ("--cols", "train"), ("--rows", "task"),
                                      ("--cols", "method")])
def test_a_section_of_settings_is_not_a_pivot_axis(tmp_path: Path, cli, entry: str, axis: str, key: str) -> None:
    """`--rows train` pivoted on the whole train section as text: a row per seed (the seed is in
    it), each n=1, labelled by a page of settings, exit 0. It is one line naming fields in it; the
    sections that are axis labels (task, method, model) stay what they are."""
    import toolkit

    for seed in (42, 43):
        fake_run(tmp_path, "sst2", "full", seed, {"accuracy": 0.8 + seed / 1000})
    rows, cols = (key, "method") if axis == "--rows" else ("task", key)
    if key in report.LABELS:
        (p,) = report.pivots(report.collect(tmp_path), rows, cols)
        assert [c.stat.n for c in p.cells.values()] == [2]
        return
    said = f"report {axis} '{key}': that is a section of settings, not one field; name one field of it, such as {key}."
    if entry == "cli":
        code, _, err = cli("report", tmp_path, "--rows", rows, "--cols", cols, "--no-plots")
        assert code == 2 and err.startswith(f"error: {said}") and err.count("\n") == 1, err
    else:
        with pytest.raises(toolkit.UserError, match=re.escape(said)):
            toolkit.report(tmp_path, row_key=rows, col_key=cols)
    assert not (tmp_path / "report.md").exists()


@pytest.mark.parametrize("entry", ["cli", "api"])
def test_two_tasks_whose_names_make_one_file_name_get_a_plot_each(tmp_path: Path, cli, entry: str) -> None:
    """SST-2 read from `/d/x y` and from `/d/x_y` are two tasks, but their plot names were one
    (`curves-sst2_data_dir_x_y_.png`): the second task's plots were written over the first's and
    report.md linked both to them, exit 0. Each task now has files of its own."""
    for folder, acc in (("/d/x y", 0.6), ("/d/x_y", 0.9)):
        for seed in (42, 43):
            run = fake_run(tmp_path / folder[-3:], "sst2", "full", seed, {"accuracy": acc}, task_extra={"data_dir": folder})
            _stamp(run, train_runtime_s=100.0 if acc > 0.8 else 1.0)
    roots = [tmp_path / "x y", tmp_path / "x_y"]
    if entry == "cli":
        assert cli("report", *roots, "--out", tmp_path / "out")[0] == 0
    else:
        toolkit_report(roots, plots=True, out=tmp_path / "out")
    files = sorted(p.name for p in (tmp_path / "out").glob("*.png"))
    assert len(files) == 6 and len({f.split("-")[0] for f in files}) == 3, files
    text = (tmp_path / "out" / "report.md").read_text()
    assert all(f"({f})" in text for f in files)
    costs = [(tmp_path / "out" / f).read_bytes() for f in files if f.startswith("cost-")]
    assert costs[0] != costs[1]  # each task's own times


@pytest.mark.parametrize("entry", ["cli", "api"])
@pytest.mark.parametrize("given, said", [
    ({"metric": "f1"}, None),
    ({"metric": "f1x"}, "report --metric 'f1x': no run has it"),
    ({"metric": ""}, "report --metric '': no run has it (runs have: accuracy, f1"),
    ({"rows": ""}, "report --rows '': expected one of task, method, model, run"),
    ({"cols": ""}, "report --cols '': expected one of task, method, model, run"),
    ({"metric": ["f1", "f1"]}, None),  # one table, where it printed the same pivot twice
    ({"rows": "method", "cols": "method"}, "report: --rows and --cols are both 'method'"),  # a diagonal
], ids=["metric alone", "metric typo alone", "empty metric", "empty rows", "empty cols", "metric twice", "one axis twice"])
def test_a_pivot_option_given_alone_or_empty_is_not_dropped(tmp_path: Path, cli, entry: str, given: dict,
                                                            said: str | None) -> None:
    """`--metric f1` without --rows/--cols (or `--rows ''`) made no pivot and said nothing, exit 0:
    the F1 table asked for was not there, and a misspelt metric was never said. --metric alone
    pivots on the default axes (task × method); an empty axis or metric name is one line."""
    import toolkit

    for seed in (42, 43):
        fake_run(tmp_path, "mrpc", "full", seed, {"accuracy": 0.80, "f1": 0.86 + seed / 1000}, main="f1")
    if entry == "cli":
        args = [f"--{k}={v}" for k, vs in given.items() for v in (vs if isinstance(vs, list) else [vs])]
        code, out, err = cli("report", tmp_path, *args, "--no-plots")
        assert code == (2 if said else 0) and (err.startswith(f"error: {said}") if said else True), err
        text = out
    else:
        options = {{"metric": "metrics", "rows": "row_key", "cols": "col_key"}[k]:
                   (v if isinstance(v, list) else [v]) if k == "metric" else v for k, v in given.items()}
        if said:
            with pytest.raises(toolkit.UserError, match=re.escape(said)):
                toolkit.report(tmp_path, **options)
        else:
            text = toolkit.report(tmp_path, **options)
    if not said:
        assert text.count("## f1 (%) ↑: task × method") == 1 and "| mrpc | 90.25 ± 0.07 (n=2) |" in text


def test_runs_from_before_pair_separator_are_seeds_of_one_entry_with_new_ones(tmp_path: Path) -> None:
    """A recipe.yaml written before task.pair_separator existed, and a new one of a model that
    leaves it unset (null), ran the same encoding: one entry, its seeds pooled, no grid of
    'pair_separator=None' beside a setting of no key. A decoder's `eos` runs are an entry of their own."""
    for seed in (42, 43):
        fake_run(tmp_path / "old", "rte", "full", seed, {"accuracy": 0.60})  # no pair_separator key
        for value, folder in ((None, "new"), ("eos", "gpt2")):
            run = fake_run(tmp_path / folder, "rte", "full", seed + 10, {"accuracy": 0.62})
            recipe = yaml.safe_load((run / "recipe.yaml").read_text())
            recipe["task"]["pair_separator"] = value
            (run / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    (p,) = report.pivots(report.collect([tmp_path / "old", tmp_path / "new"]), "task", "method")
    cell = p.cells[("rte", "full")]
    assert cell.stat.n == 4 and not cell.grid  # one setting: no grid
    (p,) = report.pivots(report.collect([tmp_path / "old", tmp_path / "gpt2"]), "task", "method")
    assert sorted(desc for desc, _ in p.cells[("rte", "full")].grid) == ["task.pair_separator=None", "task.pair_separator=eos"]


def test_every_added_field_has_the_value_older_runs_had() -> None:
    """A recipe field added after runs were made (schema.added) is missing from those runs'
    recipe.yaml: without its old value in BEFORE_FIELD, a run from before the field was another
    setting than new seeds of the same recipe in `toolkit report` (task source_code/target_code
    were missing). Every section, task and method's added fields, so none can be forgotten."""
    import dataclasses

    from toolkit.methods import METHODS
    from toolkit.recipe_data import SECTIONS
    from toolkit.schema import NEUTRAL
    from toolkit.tasks import TASKS

    owners = [(section, cls) for section, cls in SECTIONS.items()]
    owners += [("task", TASKS.get(name)) for name in TASKS.names()] + [("method", METHODS.get(name)) for name in METHODS.names()]
    added = {(section, f.name): f.metadata[NEUTRAL] for section, cls in owners
             for f in dataclasses.fields(cls) if NEUTRAL in f.metadata}
    assert added  # task.pair_separator at least
    missing = {key: neutral for key, neutral in added.items() if key not in report.BEFORE_FIELD}
    assert not missing, f"add to reports.core.BEFORE_FIELD with their neutral values: {missing}"
    for key, neutral in added.items():
        old = report.BEFORE_FIELD[key]
        assert callable(old) or old == neutral, (key, old, neutral)
    # and a run's recipe without them reads as one with them at their neutral values
    recipe = report.with_old_defaults({"task": {}, "train": {}, "model": {}, "method": {}})
    assert all(recipe[section][key] == neutral for (section, key), neutral in added.items())
    # only where the named task or method has the field: a LoRA run has no train_layer_norms
    # (its entries' labels read "train_layer_norms False"), a translation no pair_separator
    named = report.with_old_defaults({"task": {"name": "translation"}, "method": {"name": "lora"}})
    assert "train_layer_norms" not in named["method"] and "pair_separator" not in named["task"]
    assert "source_code" in named["task"]
    assert report.with_old_defaults({"method": {"name": "adapters"}})["method"]["train_layer_norms"] is False


@pytest.mark.parametrize("entry", ["cli", "api"])
@pytest.mark.parametrize("link", ["run folder", "folder of runs", "loop"])
def test_runs_below_a_linked_folder_are_reported(tmp_path: Path, cli, entry: str, link: str) -> None:
    """A run folder (or a folder of runs) linked into the folder reported, from another disk:
    Path.rglob does not enter a linked folder, so its runs were in no table, no mean and no
    unfinished note ("1 finished runs" of 3), exit 0. Each is read, each real folder once (a link
    to a folder above it is no loop), and a damaged link is one line."""
    import toolkit

    root, elsewhere = tmp_path / "runs", tmp_path / "disk2"
    fake_run(root, "sst2", "full", 42, {"accuracy": 0.80})
    linked = [fake_run(elsewhere, "sst2", "full", seed, {"accuracy": acc}) for seed, acc in ((43, 0.84), (44, 0.82))]
    stopped = fake_run(elsewhere, "sst2", "full", 45, {"accuracy": 0.1})
    (stopped / "metrics.json").unlink()
    if link == "run folder":
        for run in (*linked, stopped):
            (root / run.name).symlink_to(run)
    else:
        (root / "more").symlink_to(elsewhere / "glue")
        if link == "loop":
            (elsewhere / "glue" / "up").symlink_to(elsewhere)  # through `more`, back above itself
    if entry == "cli":
        code, text, err = cli("report", root, "--rows", "task", "--cols", "method", "--no-plots")
        assert code == 0, err
    else:
        text = toolkit.report([root], row_key="task", col_key="method", plots=False)
    assert "3 finished runs" in text and "| sst2 | 82.00 ± 2.00 (n=3; 1 not finished) |" in text
    (note,) = [line for line in text.splitlines() if line.startswith("- 1 run(s) not finished")]
    assert stopped.name in note

    (root / "gone").mkdir()
    (root / "gone" / "metrics.json").symlink_to(tmp_path / "nowhere.json")
    if entry == "cli":
        code, _, err = cli("report", root, "--no-plots")
        assert code == 2 and len(err.strip().splitlines()) == 1 and "unreadable metrics.json" in err
    else:
        with pytest.raises(UserError, match="unreadable metrics.json"):
            toolkit.report([root], plots=False)


def _base(run: Path, field: str = "base_files", **files: str) -> None:
    """metrics.json's record of a run's base as runs.base_record writes it: {file: [size, mtime_ns,
    sha256]}, under `field`: base_files (the base an adapter or in-context result is loaded onto),
    base_weights (the base every method started from, since 2026-11-28), or both."""
    record = {"patterns": ["*.safetensors", "config.json"], "files": {
        name.replace("_", "."): [10, seed, sha] for seed, (name, sha) in enumerate(files.items())}}
    _stamp_json(run, **{f: record for f in field.split("+")})


# how a run records its base: an adapter run from before base_weights (base_files alone), a full
# fine-tune now (base_weights alone: its model/ is whole, so no base_files), an adapter run now (both)
BASE_RECORDS = [("lora", "base_files", "model_safetensors"), ("full", "base_weights", "model_safetensors"),
                ("lora", "base_weights+base_files", "model_safetensors"),
                ("full", "base_weights", "tokenizer_json")]  # the base's tokenizer edited between seeds


@pytest.mark.parametrize("method, field, changed", BASE_RECORDS)
@pytest.mark.parametrize("table", ["runs", "pivot", "glue", "plots", "cli", "api"])
def test_seeds_loaded_onto_other_base_weights_are_other_models(tmp_path: Path, cli, table: str, method: str,
                                                               field: str, changed: str) -> None:
    """Seeds on a local base folder (or a Hub id's cached snapshot) whose weights changed
    between them: metrics.json recorded each base's sha256, the report read none of it, and the
    four seeds were one entry, 71.00 ± 11.55 (n=4), exit 0. Each base is a model of its own. A
    full fine-tune recorded no base at all (base_files is the base a result loads onto), and its
    seeds on two bases were one entry whatever the report read: every method records
    base_weights now."""
    for seed, acc, sha in ((42, 0.80, "a1"), (43, 0.82, "a1"), (44, 0.60, "b2"), (45, 0.62, "b2")):
        _base(fake_run(tmp_path, "sst2", method, seed, {"accuracy": acc}), field,
              **{"model_safetensors": "w", "config_json": "json:c", "tokenizer_json": "t", changed: sha})
    items = report.collect(tmp_path)
    if table == "runs":
        _, rows = report.rows(items)
        assert sorted(r[3] for r in rows) == ["61.00 ± 1.41", "81.00 ± 1.41"]
        assert any("loaded onto 2 versions of the base model's files" in n for n in report.runs_notes(items))
    elif table == "pivot":
        with pytest.raises(UserError, match="holds runs of 2 models"):
            report.pivots(items, "task", "method")
        (p,) = report.pivots(items, "model", "method")
        assert sorted(c.stat.fmt(100.0) for c in p.cells.values()) == ["61.00 ± 1.41 (n=2)", "81.00 ± 1.41 (n=2)"]
    elif table == "glue":
        lines = [r for r in glue_report.render(items).splitlines() if r.startswith("| tiny")]
        assert len(lines) == 2 and all("(n=2)" in r for r in lines)
    elif table == "plots":  # a line per base, never one mean over both
        assert sorted(len(runs) for runs in plotting.entries(items)["sst2"].values()) == [2, 2]
    else:
        if table == "cli":
            code, text, err = cli("report", tmp_path, "--rows", "model", "--cols", "method", "--no-plots")
            assert code == 0, err
        else:
            text = toolkit_report([tmp_path], row_key="model", col_key="method")
        assert "81.00 ± 1.41 (n=2)" in text and "61.00 ± 1.41 (n=2)" in text and "(n=4)" not in text


def test_one_base_recorded_with_other_files_is_one_model(tmp_path: Path) -> None:
    """One base under records of other files (an in-context run records its tokenizer too, a
    snapshot gained a .bin beside its .safetensors) and runs that record no base (a full
    fine-tune, a run from before base_files) are not split from it: the files every record holds
    are compared."""
    _base(fake_run(tmp_path, "sst2", "lora", 42, {"accuracy": 0.80}), model_safetensors="a1", config_json="c")
    _base(fake_run(tmp_path, "sst2", "lora", 43, {"accuracy": 0.82}), model_safetensors="a1", config_json="c",
          pytorch_model_bin="x9", tokenizer_json="t")
    fake_run(tmp_path, "sst2", "lora", 44, {"accuracy": 0.84})
    # an adapter run now records the base twice (base_weights, base_files), one from before once
    _base(fake_run(tmp_path, "sst2", "lora", 45, {"accuracy": 0.86}), "base_weights+base_files",
          model_safetensors="a1", config_json="c")
    items = report.collect(tmp_path)
    assert {report.label(i, "model") for i in items} == {"tiny"}
    (p,) = report.pivots(items, "task", "method")
    assert p.cells[("sst2", "lora")].stat.fmt(100.0) == "83.00 ± 2.58 (n=4)"


@pytest.mark.parametrize("recorded", ["new run", "run from before score was recorded", "every run from before score",
                                      "every run from before declarations"])
@pytest.mark.parametrize("entry", ["cli", "api"])
def test_a_number_that_is_not_a_score_has_no_direction_and_no_best(tmp_path: Path, cli, entry: str,
                                                                     recorded: str) -> None:
    """SQuAD v2's best_f1_thresh (a threshold tuned on dev; tasks.Metric score=False) was
    declared in metrics.json as higher-is-better: the runs table headed it `best_f1_thresh ↑`, and
    `--metric best_f1_thresh` reported each cell's highest threshold as its best setting, exit 0.
    The declaration says it is no score; its header carries no direction, and a pivot of it is one
    line. A run written before that was recorded takes it from any run that records it, and runs
    that all predate it from the catalogue (tasks.CATALOGUE): old runs alone kept the ↑."""
    import toolkit
    from toolkit.tasks import TASKS

    squad = TASKS.get("squad")(version="v2")
    squad._extractive = True
    declared = {m.name: squad.declaration(m.name).as_dict() for m in squad.declared_metrics()}  # as run_metrics
    assert declared["best_f1_thresh"] == {"higher_is_better": True, "scale": 1.0, "score": False}
    assert "score" not in declared["best_f1"]  # a score's declaration is as it always was
    for seed, lr, thresh in ((42, 1e-3, -1.5), (43, 1e-3, -1.2), (42, 3e-3, 0.4), (43, 3e-3, 0.6)):
        run = fake_run(tmp_path, "squad_v2", "lora", seed, {"f1": 0.7 + seed / 1e3, "perplexity": 3.0}, lr=lr, main="f1")
        old = recorded.startswith("every") or (recorded != "new run" and seed == 42)
        _stamp_json(run, eval={"f1": 0.7 + lr, "perplexity": 3.0, "loss": 0.5, "best_f1_thresh": thresh},
                    metric_declarations={**DECL, "best_f1_thresh": {  # declared a percentage until 2026-11-27
                        "higher_is_better": True, "scale": 100.0 if old else 1.0, **({} if old else {"score": False})}})
        if recorded.endswith("declarations"):
            _edit_metrics(run, lambda t: json.dumps({k: v for k, v in json.loads(t).items() if k != "metric_declarations"}))
    if entry == "cli":
        code, text, err = cli("report", tmp_path, "--no-plots")
        assert code == 0, err
    else:
        text = toolkit.report([tmp_path], plots=False)
    head = next(line for line in text.splitlines() if line.startswith("| run |"))
    assert "| f1 (%) ↑ |" in head and "| perplexity ↓ |" in head and "| loss ↓ |" in head
    assert "| best_f1_thresh (not a score) |" in head
    assert "| -1.35 ± 0.21 |" in text and "| 0.50 ± 0.14 |" in text  # a logit threshold as it is, not x100
    said = "'best_f1_thresh': it is not a score"
    if entry == "cli":
        code, _, err = cli("report", tmp_path, "--rows", "task", "--metric", "best_f1_thresh", "--no-plots")
        assert code == 2 and len(err.strip().splitlines()) == 1 and said in err
    else:
        with pytest.raises(UserError, match=said):
            toolkit.report([tmp_path], row_key="task", metrics=["best_f1_thresh"], plots=False)


@pytest.mark.parametrize("entry", ["cli", "api"])
@pytest.mark.parametrize("recipe", ["missing", "empty"])
def test_a_metrics_json_without_its_recipe_is_one_line(tmp_path: Path, cli, entry: str, recipe: str) -> None:
    """Results gathered as metrics.json files alone (`rsync --include metrics.json`): every run's
    task, method, model and seed came from a recipe.yaml it lacks, so an RTE and an SST-2 LoRA run
    were two seeds of one entry of task '?', 80.00 ± 14.14 (n=2), exit 0. One line names the run."""
    import toolkit

    for task, seed, acc in (("sst2", 42, 0.9), ("rte", 43, 0.7)):
        run = fake_run(tmp_path, task, "lora", seed, {"accuracy": acc})
        if task == "rte":
            (run / "recipe.yaml").unlink() if recipe == "missing" else (run / "recipe.yaml").write_text("")
    said = f"holds a metrics.json and {'no' if recipe == 'missing' else 'an empty'} recipe.yaml"
    if entry == "cli":
        code, out, err = cli("report", tmp_path, "--rows", "task", "--cols", "method", "--no-plots")
        assert code == 2 and len(err.strip().splitlines()) == 1 and said in err and str(run) in err and not out
    else:
        with pytest.raises(UserError, match=said):
            toolkit.report([tmp_path], row_key="task", col_key="method", plots=False)
    assert not (tmp_path / "report.md").exists()


def test_every_method_records_the_base_it_started_from(tmp_path: Path, tiny_checkpoint, cli) -> None:
    """End to end: full fine-tuning and LoRA seeds on a local base folder whose weights were saved
    again between seed 42 and seed 43 (the folder trained again). A full fine-tune recorded
    nothing of its base (metrics.json base_files is the base a result loads onto: none for a
    whole model/), so its two seeds were one entry of n=2 on two models, exit 0. Every method
    records base_weights now, the report tells the two bases apart for each, and a full run's
    result still loads alone on the changed base (it is whole: base_weights is read by reports
    only)."""
    import csv
    import toolkit

    base = Path(shutil.copytree(tiny_checkpoint("bert"), tmp_path / "base"))
    rows = [("premise", "hypothesis", "label")] + [(f"film {i}", "and more", ("neg", "pos")[i % 2]) for i in range(8)]
    for name in ("train", "dev"):
        with (tmp_path / f"{name}.csv").open("w", newline="") as handle:
            csv.writer(handle).writerows(rows)
    runs = {}
    for method in ("full", "lora"):
        recipe = tmp_path / f"{method}.yaml"
        recipe.write_text(f"model: {{checkpoint: {base}}}\n"
                          f"task: {{name: text_classification, train_file: {tmp_path / 'train.csv'}, "
                          f"eval_file: {tmp_path / 'dev.csv'}, labels: [neg, pos], text_columns: [premise, hypothesis], "
                          "max_length: 16}\n"
                          f"method: {{name: {method}{', r: 4' if method == 'lora' else ''}}}\n"
                          "train: {max_steps: 1, batch_size: 4}\n")
        runs[method] = recipe
    made = {(m, 42): toolkit.run(r, runs_dir=tmp_path / "runs").dir for m, r in runs.items()}
    weights = base / "model.safetensors"
    kept = weights.read_bytes()
    weights.write_bytes(kept[:-1] + bytes([kept[-1] ^ 1]))  # another version of the base's weights
    (base / "generation_config.json").write_text('{"num_beams": 4}')  # the decoding a recipe leaves to it
    made.update({(m, 43): toolkit.run(r, ["train.seed=43"], runs_dir=tmp_path / "runs").dir for m, r in runs.items()})
    for (method, seed), run in made.items():
        recorded = json.loads((run / "metrics.json").read_text())
        files = set(recorded["base_weights"]["files"])  # weights, configs and the tokenizer's files
        assert {"model.safetensors", "config.json", "tokenizer_config.json"} <= files, (method, files)
        assert ("generation_config.json" in files) == (seed == 43), (method, files)
        assert (recorded["base_files"] is None) == (method == "full")
    items = report.collect(tmp_path / "runs")
    for method in ("full", "lora"):
        labels = {report.label(i, "model") for i in items if report.method_label(i) == method}
        assert len(labels) == 2 and all(label.startswith("base [base ") for label in labels), labels
    _, table = report.rows(items)
    assert sorted(r[2] for r in table) == ["1", "1", "1", "1"]  # no entry of two seeds on two bases
    code, text, err = cli("report", tmp_path / "runs", "--rows", "model", "--cols", "method", "--no-plots")
    assert code == 0 and "loaded onto 2 versions of the base model's files" in text and "(n=2)" not in text, err
    assert toolkit.evaluate(made[("full", 42)])  # a whole model/ loads on the changed base as before


BLEU_13A = "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.5.1"
POSITIVE = "F1 of label '{}' (id 1) as the positive class"


def _clm_scoring(**task) -> dict:
    from toolkit.tasks import TASKS

    return TASKS.get("clm")(**task).metric_info()  # as a run records it


SCORING = {  # (recipe fields, metric_info) of seeds 42 and 43, then of seeds 44 and 45 of the LoRA runs
    # task.bleu_tokenize: a recipe field that defines the metric, read as a grid (the higher BLEU "best")
    "bleu tokenizer": ({}, {"bleu_signature": BLEU_13A}, {"bleu_tokenize": "intl"},
                       {"bleu_signature": BLEU_13A.replace("13a", "intl")}),
    # the same recipe scored by another sacreBLEU: pooled as seeds of one entry
    "sacrebleu version": ({}, {"bleu_signature": BLEU_13A}, {}, {"bleu_signature": BLEU_13A.replace("2.5.1", "2.0.0")}),
    # task.labels in another order: `f1` is the F1 of another class (its positive label)
    "positive label": ({}, {"f1": POSITIVE.format("pos")}, {"labels": ["pos", "neg"]}, {"f1": POSITIVE.format("neg")}),
    # clm's task.eval_stride: the context each token's perplexity is scored with (the lower, "best")
    "perplexity stride": ({}, _clm_scoring(), {"eval_stride": 16}, _clm_scoring(eval_stride=16)),
}


@pytest.mark.parametrize("case", sorted(SCORING))
@pytest.mark.parametrize("table", ["runs", "pivot", "plots", "glue", "cli", "api"])
def test_runs_scored_under_other_metric_definitions_are_other_tasks(tmp_path: Path, cli, table: str, case: str) -> None:
    """metrics.json metric_info records what a run's metrics are (sacreBLEU's signature, which
    F1 `f1` is); the report read none of it: LoRA seeds scored with BLEU's intl tokenizer beside
    13a ones were a grid over task.bleu_tokenize and the pivot reported the tokenizer that scored
    higher as the best setting; seeds scored by another sacreBLEU, or with `f1` of another class,
    were one mean, exit 0. Each definition is a task of its own, said in one line; the decoding a
    run records there (`generation`) is a setting, not a definition, and splits nothing."""
    first_fields, first, fields, other = SCORING[case]
    assert first != other
    for seed, acc in ((42, 0.80), (43, 0.82), (44, 0.90), (45, 0.92)):
        run = fake_run(tmp_path, "sst2", "lora", seed, {"accuracy": acc}, task_extra=fields if seed > 43 else first_fields)
        _stamp_json(run, metric_info={**(other if seed > 43 else first), "generation": f"num_beams {seed}"})
    full = fake_run(tmp_path, "sst2", "full", 42, {"accuracy": 0.85})
    _stamp_json(full, metric_info=first)
    items = report.collect(tmp_path)
    split = "were scored under 2 definitions of their metrics"
    if table == "runs":
        _, rows = report.rows(items)
        assert sorted(r[3] for r in rows if r[1] == "lora") == ["81.00 ± 1.41", "91.00 ± 1.41"]
        assert sum(split in n for n in report.runs_notes(items)) == 1
    elif table == "pivot":
        (p,) = report.pivots(items, "task", "method")
        lora = sorted((r, cell.stat.n) for (r, c), cell in p.cells.items() if c == "lora")
        assert len(lora) == 2 and all(n == 2 for _, n in lora) and all("[scoring " in r for r, _ in lora), lora
        assert not [n for n in report.pivot_notes(p) if "of the grid" in n]  # no definition chosen as a setting
    elif table == "plots":
        assert len([t for t in plotting.entries(items) if t.startswith("sst2 [scoring ")]) == 2
    elif table == "glue":
        with pytest.raises(UserError, match="tiny lora / SST-2 holds runs on 2 versions of its data, eval set or metric"):
            glue_report.render(items)
    else:
        if table == "cli":
            code, text, err = cli("report", tmp_path, "--rows", "task", "--cols", "method", "--no-plots")
            assert code == 0, err
        else:
            text = toolkit_report([tmp_path], row_key="task", col_key="method")
        assert "(n=4)" not in text and text.count(split) == 2 and "reported train" not in text  # runs table, pivot
    shutil.rmtree(full)
    for run in [r.parent for r in tmp_path.rglob("metrics.json") if '"seed": 44' in r.read_text() or '"seed": 45' in r.read_text()]:
        shutil.rmtree(run)  # one definition left (its decoding recorded per run): nothing split
    items = report.collect(tmp_path)
    assert {report.label(i, "task") for i in items} == {"sst2"}
# What an in-context run (method icl, which trains nothing) never reads (Method.ignores: every
# training setting and task.max_length; refused at validate where set), at a trained run's values
UNREAD_BY_ICL = {"train.epochs": 10, "train.warmup_ratio": 0.06, "train.weight_decay": 0.1, "train.batch_size": 32,
                 "task.max_length": 256}


def _icl_beside_lora(root: Path) -> None:
    """sst2 runs of LoRA (seeds 42, 43) at a trained run's budget and of icl at the defaults, as
    their recipe.yaml files hold them."""
    for seed in (42, 43):
        lora = fake_run(root, "sst2", "lora", seed, {"accuracy": 0.80 + seed / 1e3}, extra={"r": 8})
        icl = fake_run(root, "sst2", "icl", seed, {"accuracy": 0.60 + seed / 1e3}, lr=2e-5, extra={"shots": 4})
        for key, value in UNREAD_BY_ICL.items():
            section, name = key.split(".")
            _recipe_edit(lora, section, **{name: value})
        _recipe_edit(icl, "train", epochs=3.0, warmup_ratio=0.0, weight_decay=0.0, batch_size=8)
        _recipe_edit(icl, "task", max_length=128)
        _stamp_json(icl, train_steps=0, train_samples=0, trainable_params=0,
                    kept={"step": 0, "on": "the last step (train.keep_best is false or nothing was trained)"})
        _stamp_json(lora, train_steps=60, train_samples=640, kept={"step": 60, "value": 0.8, "on": "accuracy"})


@pytest.mark.parametrize("entry", ["pivot", "runs table", "budget", "glue protocol"])
def test_settings_a_run_never_read_are_no_protocol_and_no_budget(tmp_path: Path, entry: str) -> None:
    """An in-context row beside a LoRA row was said to differ in train.epochs, warmup_ratio and
    weight_decay ("their gap is not the method's alone: run them on one protocol", which icl
    refuses: it reads none of them), and its budget line and GLUE protocol said "epochs 3, max
    length 128, lr 2e-05, batch 8", none of which it ran with (its prompts are cut at
    method.max_length or the model's limit), exit 0. A setting the run's method or task declares it
    never reads (Method.ignores, Task.ignores) is left out of both; what it reads is still said."""
    _icl_beside_lora(tmp_path)
    items = report.collect(tmp_path)
    icl = next(i for i in items if i["metrics"]["method"] == "icl")
    if entry == "pivot":
        (p,) = report.pivots(items, "task", "method")
        assert not [n for n in report.pivot_notes(p) if "differ in more than method" in n]
    elif entry == "runs table":
        assert not [n for n in report.runs_notes(items) if "differ in more than method" in n]
    elif entry == "budget":
        said = report.budget(icl)
        assert not any(w in said for w in ("epochs", "max length", "lr ", "batch")) and "trains nothing" in said
        lora = next(i for i in items if i["metrics"]["method"] == "lora")
        assert report.budget(lora) == "epochs 10 (60 optimizer steps), 640 train examples, max length 256, lr 0.001, batch 32"
    else:
        (line,) = glue_report.ours_protocol({"tiny icl": {"sst2": [icl]}})
        assert not any(w in line for w in ("epochs", "max length", "lr ", "batch")) and "shots 4" in line
    # nor another setting of the run's: an icl seed from before icl refused train.epochs is a seed
    # of the same entry, not a grid point the cell chose on dev
    extra = fake_run(tmp_path, "sst2", "icl", 44, {"accuracy": 0.9}, lr=2e-5, extra={"shots": 4})
    _recipe_edit(extra, "train", epochs=1.0, warmup_ratio=0.0, weight_decay=0.0, batch_size=8)
    _recipe_edit(extra, "task", max_length=128)
    (p,) = report.pivots(report.collect(tmp_path), "task", "method")
    assert p.cells[("sst2", "icl")].stat.n == 3 and not p.cells[("sst2", "icl")].grid
    # a setting both rows read is still said (the model), and the unread ones still not
    for run in tmp_path.glob("glue/sst2/tiny-icl/*"):
        _recipe_edit(run, "model", checkpoint="org/other")
    (p,) = report.pivots(report.collect(tmp_path), "task", "method")
    (note,) = [n for n in report.pivot_notes(p) if "differ in more than method" in n]
    assert "model.checkpoint" in note and not any(k in note for k in UNREAD_BY_ICL)


@pytest.mark.parametrize("entry", ["grid note", "protocol note", "glue protocol", "report.md"])
def test_a_setting_with_a_line_break_is_written_on_one_line(tmp_path: Path, entry: str) -> None:
    """icl's method.separator ("\\n\\n", its default) and template, a prompt's task.prefix/suffix,
    hold line breaks: written as they are, the GLUE protocol's bullet ended at "separator " and
    the rest of it became a paragraph of its own, and a grid over the separator was noted as
    "method.separator=<blank line>" (one note split in two), exit 0. A string value that is not
    one plain line is written JSON-quoted ("\\n\\n"), everywhere a setting's value is said."""
    for seed in (42, 43):
        for sep, acc, lr in (("\n\n", 0.60, 2e-5), ("\n", 0.62, 3e-5)):  # report.md: rows labelled by setting
            run = fake_run(tmp_path / ("" if entry == "report.md" else repr(sep)), "sst2", "icl", seed,
                           {"accuracy": acc + seed / 1e3}, lr=lr, extra={"shots": 4, "separator": sep})
            _recipe_edit(run, "task", prefix="Review:\n") if entry == "protocol note" and sep == "\n" else None
        fake_run(tmp_path, "sst2", "lora", seed, {"accuracy": 0.8}, extra={"r": 8})
    items = report.collect(tmp_path)
    if entry == "grid note":
        (p,) = report.pivots(items, "task", "method")
        notes = [n for n in report.pivot_notes(p) if "of the grid" in n]
        assert notes and 'method.separator="\\n"' in notes[0]
    elif entry == "protocol note":
        notes = [n for n in report.runs_notes(items) if "differ in more than" in n]
        assert notes and '"Review:\\n"' in notes[0]
    elif entry == "glue protocol":
        icl = [i for i in items if i["metrics"]["method"] == "icl" and i["recipe"]["method"]["separator"] == "\n\n"]
        notes = glue_report.ours_protocol({"tiny icl": {"sst2": icl}})
        assert 'separator "\\n\\n"' in notes[0]
    else:
        notes = [report.render(tmp_path, plots=False)]
        assert 'method.separator="\\n"' in notes[0]
        notes = [line for line in notes[0].splitlines() if line.startswith("- ")]
    assert all("\n" not in n for n in notes)


def test_a_setting_is_described_by_the_fields_its_recipe_holds(tmp_path: Path) -> None:
    """One recipe name run as LoRA and, by a `method.name=` override, as prefix tuning: the runs
    table named the prefix-tuning entry `[method.name=prefix_tuning method.r=None ...]`, LoRA's
    fields it never had, and the LoRA one `method.num_virtual_tokens=None`. A field a run's
    recipe does not hold is left out of its description."""
    lora = fake_run(tmp_path, "sst2", "lora", 42, {"accuracy": 0.8}, extra={"r": 8, "alpha": 16})
    prefix = fake_run(tmp_path, "sst2", "prefix_tuning", 42, {"accuracy": 0.7}, extra={"num_virtual_tokens": 4})
    prefix.rename(lora.parent / prefix.name)  # the same recipe name
    _, rows = report.rows(report.collect(tmp_path))
    labels = sorted(r[0] for r in rows)
    assert labels == ["glue/sst2/tiny-lora [method.alpha=16 method.name=lora method.r=8]",
                      "glue/sst2/tiny-lora [method.name=prefix_tuning method.num_virtual_tokens=4]"], labels


@pytest.mark.parametrize("trained, cut", [(100, True), (None, True), (2490, False)])
@pytest.mark.parametrize("entry", ["render", "cli", "api"])
def test_a_glue_cell_trained_on_part_of_its_training_set_is_marked(tmp_path: Path, cli, entry: str,
                                                                   trained: int | None, cut: bool) -> None:
    """RTE trained on a random 100 of its 2,490 training examples (task.max_train_samples=100)
    sat in the GLUE tables, its average and beside the published rows (trained on the whole set)
    unmarked, said only in the protocols list, exit 0. Now each such cell, the averages holding it
    and a note say so; a cap above the set's size (metrics.json train_samples below it) trained on
    the whole set and is not marked."""
    import toolkit

    for seed in (42, 43):
        run = fake_run(tmp_path, "rte", "lora", seed, {"accuracy": 0.7}, task_extra={"max_train_samples": 100 if cut else 5000})
        if trained is not None:
            _stamp_json(run, train_samples=trained)
        fake_run(tmp_path, "sst2", "lora", seed, {"accuracy": 0.9})
    if entry == "render":
        text = glue_report.render(report.collect(tmp_path))
    elif entry == "cli":
        code, text, err = cli("report", tmp_path, "--glue", "--no-plots")
        assert code == 0, err
    else:
        text = toolkit.report([tmp_path], glue=True)
    ours = [row for row in text.splitlines() if row.startswith(("| tiny lora", "| ours: tiny lora"))]
    assert len(ours) == 2
    for row in ours:  # SST-2, RTE, the average
        cells = [c.strip() for c in row.strip("|").split("|")][1:4]
        assert [c.endswith("¶") for c in cells] == [False, cut, cut], row
    notes = [line for line in text.splitlines() if line.startswith("- ¶")]
    assert notes == (["- ¶ tiny lora / RTE: trained on a fixed random 100 of the training examples "
                      "(task.max_train_samples=100), not the whole training set that GLUE's dev numbers and the "
                      "published rows trained on: not comparable with them, nor is an average that holds it"]
                     if cut else []), notes


@pytest.mark.parametrize("table", ["pivot", "runs", "cli"])
def test_old_runs_scored_on_other_subsets_are_other_eval_sets(tmp_path: Path, cli, table: str) -> None:
    """Runs from before metrics.json recorded eval_sha256 (2026-11-22..27) that differ only in
    task.max_eval_samples were one eval set and a grid: the pivot reported the subset that scored
    higher as the best setting, exit 0. The recipe's settings that choose the examples scored
    tell them apart where no hash was recorded; runs of one subset still pool as seeds."""
    for seed in (42, 43):
        fake_run(tmp_path, "sst2", "lora", seed, {"accuracy": 0.80 + seed / 1e4}, task_extra={"max_eval_samples": 50})
        fake_run(tmp_path, "sst2", "lora", seed, {"accuracy": 0.90 + seed / 1e4}, lr=1e-4, task_extra={"max_eval_samples": 100})
    items = report.collect(tmp_path)
    if table == "pivot":
        (p,) = report.pivots(items, "task", "method")
        cells = sorted((r, cell.stat.n, cell.grid) for (r, c), cell in p.cells.items())
        assert [(r, n) for r, n, _ in cells] == [
            ("sst2 [eval set not recorded (task.max_eval_samples=100)]", 2),
            ("sst2 [eval set not recorded (task.max_eval_samples=50)]", 2)], cells
        assert all(not grid for _, _, grid in cells)  # no subset chosen as a setting
    elif table == "runs":
        _, rows = report.rows(items)
        assert sorted(r[2] for r in rows) == ["2", "2"]
    else:
        code, text, err = cli("report", tmp_path, "--rows", "task", "--cols", "method", "--no-plots")
        assert code == 0 and "its runs span 2 versions of their data or eval set" in text and "(n=4)" not in text, err


def _on_device(run: Path, device: str, runtime: float, peak: float) -> None:
    data = json.loads((run / "metrics.json").read_text())
    data.update(device_name=device, train_runtime_s=runtime, train_samples_per_second=1000 / runtime,
                peak_memory_mb=peak)
    (run / "metrics.json").write_text(json.dumps(data))


@pytest.mark.parametrize("table", ["runs table", "runs table cli", "cost table", "cost plot"])
def test_a_grid_points_seeds_on_other_devices_are_never_one_time(tmp_path: Path, cli, table: str) -> None:
    """Two seeds of one grid point trained on a GPU (10 s) and one on the CPU (900 s): the runs
    table's and the cost table's `train s` was their mean, 306.7 ± 513.8, as one figure (and
    samples/s, peak MB likewise), the cost plot one bar. Each device's seeds now have their own
    figure, named with its device and n; an entry on one device reads as before."""
    for seed, device, runtime, peak in ((42, "NVIDIA H200", 10.0, 5000.0), (43, "NVIDIA H200", 12.0, 5100.0),
                                        (44, "cpu", 900.0, 700.0)):
        _on_device(fake_run(tmp_path, "rte", "lora", seed, {"accuracy": 0.6}), device, runtime, peak)
    for seed in (42, 43):
        fake_run(tmp_path, "rte", "full", seed, {"accuracy": 0.6})
    split = ["11.0 ± 1.4 on NVIDIA H200 (n=2); 900.0 on cpu (n=1)", "91.7 ± 11.8 on NVIDIA H200 (n=2); 1.1 on cpu (n=1)",
             "5100 on NVIDIA H200 (n=2); 700 on cpu (n=1)"]
    if table == "cost plot":
        group = plotting.entries(report.collect(tmp_path))["rte"]
        drawn = plotting.per_device(group)
        assert {k: len(v) for k, v in drawn.items()} == {
            **{k: 2 for k in group if "lora" not in k}, **{f"{k} [NVIDIA H200]": 2 for k in group if "lora" in k},
            **{f"{k} [cpu]": 1 for k in group if "lora" in k}}
        return
    if table == "runs table":
        text = toolkit_report([tmp_path])
    elif table == "runs table cli":
        code, text, err = cli("report", tmp_path, "--no-plots")
        assert code == 0, err
    else:
        (p,) = report.pivots(report.collect(tmp_path), "task", "method")
        text = report.cost_table(p)
    (lora,) = [line for line in text.splitlines() if "| lora |" in line]
    assert all(f"| {cell} |" in lora for cell in split), lora
    (full,) = [line for line in text.splitlines() if "| full |" in line]
    # one device: as before in the cost table (its device column names it); in the runs table, whose
    # rows span devices, each cell names its device (`test_rows_on_other_devices_name_their_device`)
    assert ("| 10.5 ± 0.7 | 5.0 ± 0.0 | 110 |" if table == "cost table" else
            "| 10.5 ± 0.7 on Test CPU | 5.0 ± 0.0 on Test CPU | 110 on Test CPU |") in full, full


@pytest.mark.parametrize("entry", ["cli", "api"])
def test_rows_on_other_devices_name_their_device(tmp_path: Path, cli, entry: str) -> None:
    """LoRA's seeds trained on a GPU (10 s), full fine-tuning's on the CPU (900 s): the runs table
    showed `11.0 ± 1.4` above `900.0 ± 0.0` under `train s`, no device anywhere in it, read as a
    method 80 times faster, exit 0 (the cost table has a device column; the runs table had none).
    Where the table's rows span devices, each time, throughput and memory cell names its device;
    rows all on one device read as before. A run on two processes ran on two devices: `2 × cpu`."""
    for seed in (42, 43):
        _on_device(fake_run(tmp_path, "rte", "lora", seed, {"accuracy": 0.6}), "NVIDIA H200", 10.0 + seed % 2, 5000.0)
        _on_device(fake_run(tmp_path, "rte", "full", seed, {"accuracy": 0.6}), "cpu", 900.0, 700.0)

    def table() -> dict[str, list[str]]:
        if entry == "cli":
            code, text, err = cli("report", tmp_path, "--no-plots")
            assert code == 0, err
        else:
            text = toolkit_report([tmp_path])
        lines = text.split("## Every run")[1].split("\n\n")[1].splitlines()[2:]
        return {line.split(" | ")[1]: line.strip("| ").split(" | ")[-3:] for line in lines}

    assert table() == {"lora": ["10.5 ± 0.7 on NVIDIA H200", "95.5 ± 6.4 on NVIDIA H200", "5000 on NVIDIA H200"],
                       "full": ["900.0 ± 0.0 on cpu", "1.1 ± 0.0 on cpu", "700 on cpu"]}, table()
    for run in tmp_path.rglob("metrics.json"):  # one device for every row: no device in the cells
        _on_device(run.parent, "cpu", 900.0, 700.0)
    assert table() == {m: ["900.0 ± 0.0", "1.1 ± 0.0", "700"] for m in ("lora", "full")}, table()
    for run in tmp_path.rglob("rtefull*"):  # full on two processes of that device: its time is of two
        _stamp(run, num_processes=2)
    assert table() == {"lora": ["900.0 ± 0.0 on cpu", "1.1 ± 0.0 on cpu", "700 on cpu"],
                       "full": ["900.0 ± 0.0 on 2 × cpu", "1.1 ± 0.0 on 2 × cpu", "700 on 2 × cpu"]}, table()
    (p,) = report.pivots(report.collect(tmp_path), "task", "method")
    assert [row.split(" | ")[-1] for row in report.cost_table(p).splitlines()[2:]] == ["2 × cpu |", "cpu |"]


@pytest.mark.parametrize("entry", ["cli", "api"])
@pytest.mark.parametrize("stopped", ["a method", "a grid point"])
def test_the_runs_table_lists_an_entry_every_seed_of_which_stopped(tmp_path: Path, cli, entry: str,
                                                                   stopped: str) -> None:
    """Every LoRA seed diverged and stopped (no metrics.json), or every seed of lr 3e-3 beside
    lr 1e-3's finished ones: the "Every run" table had no row for it, the runs named only in the
    report's end note, as if never run. It is a row now, `0 (+k not finished)`, under the name
    (and setting) a finished run of it would have."""
    for seed in (42, 43):
        fake_run(tmp_path, "rte", "full", seed, {"accuracy": 0.6})
        gone = fake_run(tmp_path, "rte", "lora" if stopped == "a method" else "full", seed, {"accuracy": 0.1},
                        lr=1e-3 if stopped == "a method" else 3e-3)
        (gone / "metrics.json").unlink()
    if entry == "cli":
        code, text, err = cli("report", tmp_path, "--no-plots")
        assert code == 0, err
    else:
        text = toolkit_report([tmp_path])
    table = text.split("## Every run")[1].split("\n\n")[1].splitlines()
    if stopped == "a method":
        assert table[2:] == ["| glue/rte/tiny-full | full | 2 | 60.00 ± 0.00 | 0.50 ± 0.00 | 0.100 | 1,000 | "
                             "10.5 ± 0.7 | 5.0 ± 0.0 | 110 |",
                             "| glue/rte/tiny-lora | lora | 0 (+2 not finished) |  |  | – | – | – | – | – |"], table
    else:
        assert table[2:] == ["| glue/rte/tiny-full [train.lr=0.001] | full | 2 | 60.00 ± 0.00 | 0.50 ± 0.00 | 0.100 | "
                             "1,000 | 10.5 ± 0.7 | 5.0 ± 0.0 | 110 |",
                             "| glue/rte/tiny-full [train.lr=0.003] | full | 0 (+2 not finished) |  |  | – | – | – | – "
                             "| – |"], table
    # the budget list has a line for every row of the table, by the table's names, in its order:
    # it had none for the entry every seed of which stopped
    budget_list = text.split("### Budget of each row")[1].split("\n\n")[1].splitlines()
    assert [line.split("**")[1] for line in budget_list] == [row.split(" | ")[0][2:] for row in table[2:]], budget_list
    assert budget_list[1].endswith(f"lr {1e-3 if stopped == 'a method' else 3e-3}, batch ? (no seed finished: 2 not "
                                   "finished)"), budget_list


def _notes_in(tmp_path: Path, table: str, **render) -> list[str]:
    """The notes under one table of the runs in `tmp_path`: the runs table's, the task x method
    pivot's, the GLUE table's, or report.md's (`render` passed on)."""
    items = report.collect(tmp_path)
    if table == "runs table":
        return report.runs_notes(items)
    if table == "pivot":
        return report.pivot_notes(report.pivots(items, "task", "method")[0])
    text = glue_report.render(items) if table == "glue" else report.render(tmp_path, plots=False, **render)
    return [line[2:] for line in text.splitlines() if line.startswith("- ")]


def _weights(sha: str, mtime: int) -> dict:
    """metrics.json `model_files` as runs.result_record writes it: [size, mtime, sha256] per file."""
    return {"patterns": ["*"], "files": {"adapter_model.safetensors": [4096, mtime, sha],
                                         "adapter_config.json": [300, mtime, "json:" + "c" * 64]}}


SAME_RESULT = [  # (how the runs record what they computed, lora seed -> metrics.json fields)
    ("weights", lambda seed: {"model_files": _weights("d" * 64, 1000 + seed), "train_loss": 0.3}),
    ("numbers", lambda seed: {"train_loss": 0.3}),
]


@pytest.mark.parametrize("table", ["runs table", "pivot", "glue", "report.md"])
@pytest.mark.parametrize("record, fields", SAME_RESULT, ids=[s[0] for s in SAME_RESULT])
def test_seeds_that_computed_one_identical_run_are_said(tmp_path: Path, table: str, record: str, fields) -> None:
    """LoRA's seeds 42, 43, 44 saved the same weights (or wrote every eval number and the train loss
    alike): the seed reached neither the data order nor the initialisation, and the cell read
    `85.00 ± 0.00 (n=3)` beside full's spread, a certainty no seed measured, exit 0 and no word.
    Now one line names the seeds and the distinct results; seeds whose results differ, or whose
    accuracies alone coincide (another eval loss), say nothing."""
    for seed in (42, 43, 44):
        _stamp(fake_run(tmp_path, "sst2", "lora", seed, {"accuracy": 0.85}), **fields(seed))
        _stamp(fake_run(tmp_path, "sst2", "full", seed, {"accuracy": 0.85}),
               train_loss=0.3 + seed / 1e3, model_files=_weights(f"{seed:064d}", 1000 + seed))

    def notes() -> list[str]:
        return _notes_in(tmp_path, table)

    said = [n for n in notes() if "gave one identical run" in n]
    assert len(said) == 1 and "lora" in said[0].split(":")[0] and "seeds 42, 43, 44" in said[0], said
    assert ("the same saved weights" if record == "weights" else "every eval number and the train loss equal") in said[0]
    assert "its n=3 holds 1 distinct result:" in said[0]
    # seed 44 computed another run: the line names 42 and 43 alone, and two distinct results
    run = next(tmp_path.rglob("*lora44*"))
    _stamp(run, eval={"accuracy": 0.85, "loss": 0.51}, train_loss=0.31, model_files=_weights("e" * 64, 9))
    said = [n for n in notes() if "gave one identical run" in n]
    assert len(said) == 1 and "seeds 42, 43 (" in said[0] and "44" not in said[0] and "holds 2 distinct results" in said[0]
    # equal accuracies alone are no identical run: the eval loss (and the weights) differ
    for seed in (42, 43):
        run = next(tmp_path.rglob(f"*lora{seed}*"))
        _stamp(run, eval={"accuracy": 0.85, "loss": 0.5 + seed / 1e3}, train_loss=0.3 + seed / 1e3,
               model_files=_weights(f"{seed:064d}", 9) if record == "weights" else None)
    assert not [n for n in notes() if "identical run" in n]


@pytest.mark.parametrize("table", ["pivot", "glue", "report.md"])
@pytest.mark.parametrize("stopped_at", ["reported", "other"])
def test_seeds_stopped_at_a_grid_point_count_at_that_point(tmp_path: Path, table: str, stopped_at: str) -> None:
    """LoRA's lr grid: at lr 1e-3 seeds 43 and 44 diverged and stopped, seed 42 scored 90; at lr
    1e-4 all three finished. The cell reported lr 1e-3 as `90.00 (n=1)`: the seeds that stopped
    at the chosen point had finished at the other, so they were "finished elsewhere", and the one
    survivor of three was the grid's best, exit 0. Now a point's stopped seeds count at that point:
    the cell (the reported point) and the grid note (each point) say them beside n."""
    for seed in (42, 43, 44):  # lr 1e-4: every seed finished; lr 1e-3: seeds 43 and 44 stopped
        fake_run(tmp_path, "rte", "lora", seed, {"accuracy": (0.84 if stopped_at == "reported" else 0.90) + seed / 1e4},
                 lr=1e-4)
        run = fake_run(tmp_path, "rte", "lora", seed, {"accuracy": 0.9004 if stopped_at == "reported" else 0.80}, lr=1e-3)
        if seed != 42:
            (run / "metrics.json").unlink()
    items = report.collect(tmp_path)
    if table == "pivot":
        (p,) = report.pivots(items, "task", "method")
        text = report.pivot_markdown(p) + "\n" + "\n".join(report.pivot_notes(p))
    else:
        text = glue_report.render(items) if table == "glue" else report.render(tmp_path, plots=False, row_key="task")
    cell = "90.04 (n=1; 2 not finished)" if stopped_at == "reported" else "90.43 ± 0.01 (n=3) |"
    assert cell in text, text
    if stopped_at == "other":
        assert "(n=3; 2 not finished)" not in text, text  # counted at its own point (the runs table: its row)
    if table != "glue":
        point = "train.lr=0.001: 90.04 (n=1; 2 not finished)" if stopped_at == "reported" else \
            "train.lr=0.001: 80.00 (n=1; 2 not finished)"
        assert point in text, text


@pytest.mark.parametrize("table", ["runs table", "pivot", "report.md"])
def test_checkpoints_selected_on_the_dev_set_they_are_scored_on_are_said(tmp_path: Path, table: str) -> None:
    """LoRA and full fine-tuning, every seed reporting its best step on dev (train.keep_best), read
    as plain dev scores: a grid's selection on dev is said beside the cell, this one was not (only
    the GLUE protocol said it). Now one line names the entries; runs that kept their last step say
    nothing, and an entry of both kinds is kept_note's line alone."""
    for seed in (42, 43):
        for method, acc in (("lora", 0.84), ("full", 0.86)):
            _stamp(fake_run(tmp_path, "sst2", method, seed, {"accuracy": acc + seed / 1e3}), kept=KEPT_BEST)

    def notes() -> list[str]:
        return _notes_in(tmp_path, table, row_key="task")

    said = [n for n in notes() if "best checkpoint on dev" in n]
    assert len(said) == (2 if table == "report.md" else 1), said
    assert all("full" in n and "lora" in n and "selected and scored on the same dev set: optimistic" in n
               and "on accuracy" in n for n in said)
    for run in tmp_path.rglob("*full42*"):
        _stamp(run, kept=KEPT_LAST)  # full's seeds kept two kinds: said by kept_note, lora alone here
    said = [n for n in notes() if "best checkpoint on dev" in n]
    assert said and all("lora" in n.split(": each")[0] and "full" not in n.split(": each")[0] for n in said), said
    for run in tmp_path.rglob("metrics.json"):
        _stamp(run.parent, kept=KEPT_LAST)
    assert not [n for n in notes() if "best checkpoint on dev" in n]


@pytest.mark.parametrize("table", ["pivot", "glue"])
def test_a_grid_whose_settings_ran_other_seeds_says_so(tmp_path: Path, table: str) -> None:
    """An lr grid of LoRA with lr 1e-3 run on seed 42 alone beside lr 1e-4 on seeds 42-44: the one
    seed's 90.00 was the grid's best over a three-seed mean, and the note listed n per point without
    saying the best was chosen on other seeds. Now the grid note names each setting's seeds; a grid
    run on one set of seeds says nothing of it."""
    fake_run(tmp_path, "rte", "lora", 42, {"accuracy": 0.90}, lr=1e-3)
    for seed in (42, 43, 44):
        fake_run(tmp_path, "rte", "lora", seed, {"accuracy": 0.84 + seed / 1e4}, lr=1e-4)

    def text() -> str:
        items = report.collect(tmp_path)
        if table == "pivot":
            return "\n".join(report.pivot_notes(report.pivots(items, "task", "method")[0]))
        return glue_report.render(items)

    assert "its settings ran other seeds (train.lr=0.0001: seeds 42, 43, 44; train.lr=0.001: seed 42)" in text()
    for seed in (43, 44):
        fake_run(tmp_path, "rte", "lora", seed, {"accuracy": 0.90 + seed / 1e4}, lr=1e-3)
    assert "other seeds" not in text() and "the best of 2 settings" in glue_report.render(report.collect(tmp_path))


@pytest.mark.parametrize("table", ["runs table", "pivot", "report.md"])
@pytest.mark.parametrize("task, task_extra, scored", [
    ("samsum", None, "$TOOLKIT_DATA/summarization/samsum/test.json"),  # the shipped preset: validation trains, test scores
    ("custom", {"train_file": "data/train.json", "eval_file": "data/test_2016.json"}, "data/test_2016.json"),
    ("custom", {"train_file": "data/train.json", "eval_file": "data/dev.json"}, None),  # a dev file: on dev, as before
])
def test_a_choice_made_on_a_test_split_is_said_to_be_one(tmp_path: Path, monkeypatch, table: str, task: str, task_extra,
                                                         scored) -> None:
    """SAMSum's preset (as IWSLT14's and Multi30k's) scores its test split, and every run keeps its
    best checkpoint on it (train.keep_best): an lr grid's best and each run's checkpoint were then
    chosen on the test numbers the report shows, which it called "selected and scored on the same
    dev set: optimistic, as in the papers", exit 0. Each such line now names the test split and
    says the number is no held-out test score; a run scored on a dev file reads as before."""
    for seed in (42, 43):
        for lr, rouge in ((1e-4, 0.30), (1e-3, 0.34)):
            _stamp(fake_run(tmp_path, task, "lora", seed, {"rougeL": rouge + seed / 1e4}, lr=lr, main="rougeL",
                            task_name="summarization", task_extra=task_extra),
                   kept={"step": 20, "on": "rougeL", "value": rouge, "eval_loss": 0.5, "ties": "lower eval loss"})
    notes = _notes_in(tmp_path, table, row_key="task")
    chosen = [n for n in notes if "selected and scored on the same" in n]
    assert chosen and all(("dev set" in n) == (scored is None) for n in chosen), chosen
    if table == "report.md":  # the plots' score axis: "test rougeL" where the runs scored a test split
        import matplotlib.text
        from toolkit.reports import plots

        drawn: list[str] = []

        def keep(fig, path: Path) -> tuple[Path, bytes]:
            drawn.extend(t.get_text() for t in fig.findobj(matplotlib.text.Text))
            plots._plt().close(fig)
            return path, b""

        monkeypatch.setattr(plots, "_save", keep)
        plots.draw_all(report.collect(tmp_path), tmp_path / "out")
        split = "dev" if scored is None else "test"
        assert f"{task}: {split} rougeL" in drawn and f"{split} rougeL (%) ↑" in drawn, drawn
        assert [n for n in plots.plot_notes(report.collect(tmp_path)) if "(plots): drawn at" in n] == [
            f"{task} / lora (plots): drawn at train.lr=0.001, the best mean rougeL of its 2 settings (train.lr) on the "
            f"{split} scores drawn (selected and scored on the same {'dev set' if split == 'dev' else 'test split'}: "
            "optimistic)"]
    if scored is None:
        assert not [n for n in notes if "test split" in n]
        return
    said = f"selected and scored on the same test split ({scored}), so its number is no held-out test score"
    assert all(said in n for n in chosen), chosen
    assert any("best checkpoint on its eval set (train.keep_best, on rougeL)" in n for n in chosen)
    if table != "runs table":  # the grid's best lr, chosen on the test split
        assert any("reported train.lr=0.001, the best mean rougeL on its test split of the grid" in n for n in chosen)
    for run in tmp_path.rglob(f"{task}lora43*"):  # seed 43 kept its last step: pooled with test-chosen ones
        _stamp(run, kept={"step": 20, "on": "the last step (train.keep_best is false or nothing was trained)"})
    mixed = [n for n in _notes_in(tmp_path, table, row_key="task") if "report different checkpoints" in n]
    assert mixed and all("the best on test (seed 42)" in n and "selected on the test split it is scored on (no "
                         "held-out score)" in n for n in mixed), mixed


def test_which_runs_scored_a_test_split() -> None:
    """`test_source` over the ways a run comes to score a test split: a preset's files (IWSLT14,
    Multi30k, SAMSum), a recipe's eval file named test, a Hub data set without a validation split
    (imdb: its test split, metrics.json hub_data); a dev or validation file, GLUE and a Hub data
    set's validation split are none."""
    from toolkit.reports import core
    from toolkit.tasks import is_test_source

    def source(task: dict, hub: dict | None = None) -> str | None:
        return core.test_source({"recipe": {"model": {"checkpoint": "org/tiny"}, "task": task, "method": {"name": "lora"},
                                            "train": {"seed": 42}}, "metrics": {"hub_data": hub} if hub else {}})

    pair = {"source_lang": "de", "target_lang": "en"}
    assert source({"name": "translation", "subset": "iwslt14", **pair}) == "$TOOLKIT_DATA/translation/iwslt14-de-en/test.{lang}"
    assert source({"name": "translation", "subset": "multi30k", "source_lang": "en", "target_lang": "de"}).endswith(
        "test_2016_flickr.{lang}.gz")
    assert source({"name": "mlm", "train_file": "lm/valid.txt", "eval_file": "lm/ptb.test.txt"}) == "lm/ptb.test.txt"
    assert source({"name": "ner"}) is None  # CoNLL-2003's valid.txt
    assert source({"name": "glue", "subset": "sst2"}) is None
    imdb = {"name": "text_classification", "dataset": "imdb"}
    assert source(imdb, {"imdb None": {"train": "a", "test": "b"}}) == "imdb[test]"
    assert source(imdb, {"imdb None": {"train": "a", "validation": "c", "test": "b"}}) is None
    assert [is_test_source(s) for s in ("latest.csv", "contest.json", "x[test]", "data/Test-2016.tsv")] == [
        False, False, True, True]


@pytest.mark.parametrize("table", ["pivot", "report.md"])
def test_a_comparison_with_a_grids_best_says_it_was_chosen_on_the_same_scores(tmp_path: Path, table: str) -> None:
    """LoRA's best of a 4-point lr grid beside full fine-tuning's one lr, on the same three seeds:
    the pivot's paired note read "lora − full = +1.00, 95% CI [...]: separated by these seeds", a
    test of the methods, where lora's side is the maximum of four means chosen on those very
    scores (biased up, and not counted in the interval), exit 0. The note now says which side a
    grid chose and among how many settings; a comparison of single settings reads as before."""
    for seed in (42, 43, 44):
        fake_run(tmp_path, "sst2", "full", seed, {"accuracy": 0.80 + seed / 1e4})
        for lr, acc in ((1e-4, 0.78), (3e-4, 0.79), (1e-3, 0.81), (3e-3, 0.80)):
            fake_run(tmp_path, "sst2", "lora", seed, {"accuracy": acc + seed / 1e4 + (seed % 2) / 1e3}, lr=lr)
    notes = [n for n in _notes_in(tmp_path, table, row_key="task") if n.startswith("lora and full (sst2)")]
    assert len(notes) == 1 and "separated by these seeds" in notes[0], notes
    assert notes[0].endswith("; lora is the best of 4 settings, chosen on these same scores: the choice favours it "
                             "and is not counted in the comparison (a grid's best is compared fairly on scores it was "
                             "not chosen on: other seeds, or a held-out split)"), notes
    # the plots draw lora at that best setting: their notes say so (the pivot's grid note is the pivot's alone)
    assert [n for n in plotting.plot_notes(report.collect(tmp_path)) if "(plots): drawn at" in n] == [
        "sst2 / lora (plots): drawn at train.lr=0.001, the best mean accuracy of its 4 settings (train.lr) on the dev "
        "scores drawn (selected and scored on the same dev set: optimistic)"]
    for run in list(tmp_path.rglob("sst2lora*")):  # lora's one lr left: no choice
        if not run.name.endswith("0.001"):
            shutil.rmtree(run)
    (note,) = [n for n in _notes_in(tmp_path, table, row_key="task") if n.startswith("lora and full (sst2)")]
    assert "chosen on these same scores" not in note and note.endswith("separated by these seeds"), note
    assert not [n for n in plotting.plot_notes(report.collect(tmp_path)) if "(plots): drawn at" in n]


@pytest.mark.parametrize("table", ["runs table", "pivot", "glue"])
def test_a_run_evaluated_once_chose_no_checkpoint(tmp_path: Path, table: str) -> None:
    """WikiText-2's recipes train one epoch and evaluate once, at its end: under train.keep_best
    metrics.json's `kept` holds that evaluation's value, and the report said "each run reports its
    best checkpoint on dev, selected and scored on the same dev set: optimistic" (on the test split
    it scores: "no held-out test score") of a run that chose nothing, exit 0. A run evaluated at one
    step (log.jsonl) kept its last step; with two, as before."""
    for seed in (42, 43):
        for method in ("lora", "full"):
            run = fake_run(tmp_path, "rte", method, seed, {"accuracy": 0.6 + seed / 1e3 + (method == "full") / 10})
            _stamp(run, kept={"step": 20, "on": "accuracy", "value": 0.6, "eval_loss": 0.5, "ties": "lower eval loss"})
            if method == "full":  # full evaluated once, lora twice
                log = [e for e in map(json.loads, (run / "log.jsonl").read_text().splitlines()) if e["step"] != 10 or "eval" not in e]
                (run / "log.jsonl").write_text("".join(json.dumps(e) + "\n" for e in log))
    notes = _notes_in(tmp_path, table)
    if table == "glue":
        text = glue_report.render(report.collect(tmp_path))
        (full,) = [line for line in text.splitlines() if line.startswith("- **ours: tiny full**")]
        assert "not selected on dev" in full and f"kept {report.core.ONE_EVALUATION}" in full, full
        (lora,) = [line for line in text.splitlines() if line.startswith("- **ours: tiny lora**")]
        assert "the best checkpoint on dev (keep_best" in lora and "kept the last step" not in lora, lora
        return
    best = [n for n in notes if "best checkpoint on dev" in n]
    assert len(best) == 1 and "lora" in best[0].split(": each")[0] and "full" not in best[0].split(": each")[0], best
    assert any(re.search(r"checkpoint kept \((glue/rte/tiny-)?full: the last step, (glue/rte/tiny-)?lora: the best on dev\)", n)
               for n in notes), notes


def test_a_run_folder_given_itself_is_reported_under_its_recipes_name(tmp_path: Path, cli) -> None:
    """`toolkit report runs/x/<id>` (the run folders `toolkit.sweep` returns, one run of a folder):
    a ValueError traceback (the run's name was its parent's path below the run itself). Named by
    its recipe, as the folder of runs names it, and its seeds pooled."""
    runs = [fake_run(tmp_path, "sst2", "lora", seed, {"accuracy": acc}) for seed, acc in ((42, 0.8), (43, 0.9))]
    for run in runs:
        text = (run / "recipe.yaml").read_text()
        (run / "recipe.yaml").write_text(f"name: glue/sst2/tiny-lora\n{text}")
    code, out, err = cli("report", *runs, "--no-plots", "--out", tmp_path / "out")
    assert code == 0, err
    assert "| glue/sst2/tiny-lora | lora | 2 | 85.00 ± 7.07 |" in out, out
