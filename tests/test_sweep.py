"""Sweeps: the grid's order and values, scaled values, the dry-run listing, and that a re-run sweep
skips finished points and resumes an interrupted one (two --smoke points)."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pytest
import yaml

from conftest import write_recipe
from test_accounting import TASKS as ACCOUNTED
from toolkit import recipe as recipes, sweeps as sweep
from toolkit.errors import UserError

RECIPE = """model: {checkpoint: bert-base-uncased}
task: {name: glue, subset: sst2, max_length: 32}
method: {name: freeze}
train: {epochs: 1, lr: 1.0e-3, batch_size: 8, log_every: 1}
"""


def test_grid_is_the_product_recipe_outermost_seed_innermost() -> None:
    axes = sweep.parse_axes(["train.lr=1e-4,3e-4", "method.target_modules=[query,value],[key]"])
    assert axes == [("train.lr", ["1e-4", "3e-4"]), ("method.target_modules", ["[query,value]", "[key]"])]
    points = sweep.grid([Path("a.yaml"), Path("b.yaml")], axes, [42, 43])
    assert len(points) == 2 * 2 * 2 * 2
    assert points[0].overrides == ["train.lr=1e-4", "method.target_modules=[query,value]", "train.seed=42"]
    assert points[1].overrides[-1] == "train.seed=43" and points[2].overrides[1] == "method.target_modules=[key]"
    assert {p.recipe for p in points[:8]} == {Path("a.yaml")}
    assert sweep.grid([Path("a.yaml")], [], []) == [sweep.Point(Path("a.yaml"), [])]


def test_seeds_lists_counts_and_refusals() -> None:
    assert sweep.parse_seeds("42,43,44") == sweep.parse_seeds("42 43 44") == [42, 43, 44]
    assert sweep.parse_seeds("3") == [42, 43, 44]  # a count (make compare SEEDS=3)
    assert sweep.parse_seeds("1234") == [1234] and sweep.parse_seeds(None) == []
    with pytest.raises(UserError, match="listed twice"):
        sweep.parse_seeds("42,42")
    with pytest.raises(UserError, match="given twice"):
        sweep.parse_axes(["train.lr=1", "train.lr=2"])
    with pytest.raises(UserError, match="an empty value"):
        sweep.parse_axes(["train.lr=1,,2"])
    with pytest.raises(UserError, match="not both"):
        sweep.grid([Path("a.yaml")], [("train.seed", ["1"])], [42])
    with pytest.raises(UserError, match="not both"):  # a mapping axis sets train.seed too
        sweep.grid([Path("a.yaml")], [("train", ["{seed: 1}", "{seed: 2}"])], [42])
    with pytest.raises(UserError, match="the value 1e-4 is listed twice"):
        sweep.parse_axes(["train.lr=1e-4,3e-4,1e-4"])
    with pytest.raises(UserError, match="a count of seeds is 1 to 10"):
        sweep.parse_seeds("0")
    # a comma makes a list: `3,` is the seed 3 (it was the count 3: seeds 42, 43, 44)
    assert sweep.parse_seeds("3,") == sweep.parse_seeds(" 3 , ") == sweep.parse_seeds(",3") == [3]
    assert sweep.parse_seeds("0,") == [0] and sweep.parse_seeds(" 3 ") == [42, 43, 44]
    # a quoted value is one value (`"a,b"` was split into `"a` and `b"`); an apostrophe inside a word is a letter
    assert sweep.split_values('"a,b", c,[1, 2],{a: 1, b: 2}') == ['"a,b"', "c", "[1, 2]", "{a: 1, b: 2}"]
    assert sweep.split_values("don't,x") == ["don't", "x"]


def test_two_points_that_are_one_run_are_refused_before_anything_runs(tmp_path: Path, cli, runs_dir: Path) -> None:
    recipe = write_recipe(tmp_path / "recipes" / "s.yaml", RECIPE)
    # x1 is the recipe's own 1e-3: the same resolved recipe, so the same run folder
    code, _, err = cli("sweep", recipe, "train.lr=x1,1e-3", "--smoke", "--runs-dir", runs_dir)
    assert code == 2 and "points 1 (" in err and "and 2 (" in err and "are the same run" in err
    assert not runs_dir.exists()


def test_scaled_values_multiply_the_recipes_own_value(tmp_path: Path) -> None:
    write_recipe(tmp_path / "_base.yaml", RECIPE)
    leaf = write_recipe(tmp_path / "leaf.yaml", "extends: _base.yaml\ntrain: {lr: 2.0e-3}\n")
    point = sweep.resolve(sweep.Point(leaf, ["train.lr=x0.5", "train.epochs=x3", "method.name=freeze"]))
    assert point.overrides == ["train.lr=0.001", "train.epochs=3", "method.name=freeze"]
    with pytest.raises(UserError, match="no number there"):
        sweep.resolve(sweep.Point(leaf, ["train.warmup_steps=x2"]))
    # a text value that reads as a scale (a column named x1) says how to write it as text, which then runs
    with pytest.raises(UserError, match=r"no number there \(the text x1 itself is written quoted: task.label_column='x1'\)"):
        sweep.resolve(sweep.Point(leaf, ["task.label_column=x1"]))
    assert sweep.resolve(sweep.Point(leaf, ["task.label_column='x1'"])).overrides == ["task.label_column='x1'"]
    # an int setting scaled to a whole number is that int at any size (`.6g` made 1234567 x1 a float)
    big = write_recipe(tmp_path / "big.yaml", "extends: _base.yaml\ntrain: {max_steps: 1234567, seed: 4294967295}\n")
    point = sweep.resolve(sweep.Point(big, ["train.max_steps=x1", "train.seed=x1"]))
    assert point.overrides == ["train.max_steps=1234567", "train.seed=4294967295"]
    assert recipes.load(big, point.overrides).train.max_steps == 1234567
    # a factor or a product past a float's smallest read as 0: `x1e-400` swept lr 0, exit 0
    for factor, said in (("1e-400", "1e-400 is too small for a float"), ("1e-322", "1e-322 x 0.002 is too small")):
        with pytest.raises(UserError, match=f"'train.lr=x{factor}': {said}"):
            sweep.resolve(sweep.Point(leaf, [f"train.lr=x{factor}"]))


@pytest.mark.parametrize("lr", ["1.23456789e-4", "0.000166666666666667", "3.0e-4"])
def test_x1_is_the_recipes_own_value_exactly(tmp_path: Path, lr: str) -> None:
    """`.6g` rounded every scaled value: lr 1.23456789e-4 x1 ran with 0.000123457, another run
    than the recipe's own, exit 0. x1 is the value as written; another factor is the product to
    12 significant digits (3e-4 x0.3 is 9e-05, not 8.999999999999999e-05)."""
    write_recipe(tmp_path / "_base.yaml", RECIPE)
    leaf = write_recipe(tmp_path / "leaf.yaml", f"extends: _base.yaml\ntrain: {{lr: {lr}}}\n")
    own = recipes.load(leaf)
    point = sweep.resolve(sweep.Point(leaf, ["train.lr=x1"]))
    assert recipes.load(leaf, point.overrides).hash == own.hash
    with pytest.raises(UserError, match="are the same run"):
        sweep.plan([leaf], [f"train.lr=x1,{lr}"], None, tmp_path / "runs", False)
    for factor in (0.3, 3, 10):
        scaled = recipes.load(leaf, sweep.resolve(sweep.Point(leaf, [f"train.lr=x{factor}"])).overrides).train.lr
        assert scaled == pytest.approx(factor * own.train.lr, rel=1e-12) and len(repr(scaled)) <= 20, scaled


def test_dry_run_lists_and_a_rerun_skips_finished_and_resumes_interrupted(tmp_path: Path, cli,
                                                                          runs_dir: Path) -> None:
    recipe = write_recipe(tmp_path / "recipes" / "s.yaml", RECIPE)
    code, out, _ = cli("sweep", recipe, "train.lr=1e-3,2e-3", "--seeds", "42", "--smoke", "--dry-run",
                       "--runs-dir", runs_dir)
    assert code == 0 and out.count("[to run]") == 2 and "2 runs (dry run" in out and not runs_dir.exists()
    assert "s.yaml train.lr=1e-3 train.seed=42  ->  " in out
    # the first point finished and the second interrupted on purpose, as a killed sweep leaves
    # them (each the `toolkit run` a sweep starts per point, here in this process: a point's own
    # process is a run's start-up again, and a point to run starts the same child as one to resume)
    assert cli("run", recipe, "train.lr=1e-3", "train.seed=42", "--smoke", "--runs-dir", runs_dir)[0] == 0
    assert cli("run", recipe, "train.lr=2e-3", "train.seed=42", "--smoke", "--stop-after", "2",
               "--runs-dir", runs_dir)[0] == 0
    code, out, _ = cli("sweep", recipe, "train.lr=1e-3,2e-3", "--seeds", "42", "--smoke", "--dry-run",
                       "--runs-dir", runs_dir)
    listed = [line for line in out.splitlines() if "  ->  " in line]
    assert [line.rsplit("  ", 1)[1] for line in listed] == ["[finished]", "[resumes]"]
    code, out, _ = cli("sweep", recipe, "train.lr=1e-3,2e-3", "--seeds", "42", "--smoke", "--runs-dir", runs_dir)
    assert code == 0 and "sweep: 2 runs done" in out and out.count("finished already") == 1
    finished = sorted(runs_dir.rglob("metrics.json"))
    assert len(finished) == 2
    assert sorted(json.loads(f.read_text())["train_steps"] for f in finished) == [4, 4]
    (resumed,) = [f.parent for f in finished if yaml.safe_load((f.parent / "recipe.yaml").read_text())["train"]["lr"] == 2e-3]
    steps = [json.loads(line)["step"] for line in (resumed / "log.jsonl").read_text().splitlines() if "eval" not in line]
    assert steps == [1, 2, 3, 4]  # continued from its step-2 checkpoint, not started again
    stamps = [f.stat().st_mtime_ns for f in finished]
    code, out, _ = cli("sweep", recipe, "train.lr=1e-3,2e-3", "--seeds", "42", "--smoke", "--runs-dir", runs_dir)
    assert code == 0 and out.count("finished already") == 2
    assert [f.stat().st_mtime_ns for f in finished] == stamps
    code, _, err = cli("sweep", recipe, "train.lr=1e-3,fast", "--smoke", "--runs-dir", runs_dir)
    assert code == 2 and "train.lr: expected float, got str 'fast'" in err  # checked before any run


@pytest.mark.parametrize("target", ["compare", "glue", "demo"])
def test_make_dry_run_lists_and_skips_the_report(target: str) -> None:
    """`make compare|glue|demo` is one `toolkit sweep ... --report=...`: the report is the sweep's
    (of its own runs alone; none under --dry-run: test_a_sweeps_report_is_of_its_own_runs_alone),
    never a `toolkit report` of the whole folder, which reported the runs of an earlier EPOCHS,
    LR_GRID or ARGS beside these, each cell's "best" chosen across both as if a grid, exit 0."""
    import subprocess

    root = Path(__file__).resolve().parent.parent

    def commands(*extra: str) -> str:
        return subprocess.run(["make", "-n", target, "MODEL=minilm", *extra], cwd=root, capture_output=True,
                              text=True, check=True).stdout

    for given in (commands("ARGS=--dry-run"), commands()):
        assert "toolkit sweep" in given and "--report=" in given and "toolkit report" not in given, given
    assert "--dry-run" in commands("ARGS=--dry-run")


def _finished_points(recipes_: list[Path], axes: list[str], root: Path, scores: dict[str, float]) -> list[Path]:
    """Each point of the grid as a finished run (recipe.yaml, metrics.json, log.jsonl as a run writes
    them), its accuracy `scores[method]`: a sweep given the same grid skips them all."""
    from test_report import DECL

    points, folders = sweep.plan(recipes_, axes, "42", root, False)
    for point, folder in zip(points, folders):
        made = recipes.load(point.recipe, point.overrides)
        (folder / "model").mkdir(parents=True)  # its result (empty: nothing loads it here)
        (folder / "recipe.yaml").write_text(recipes.dump(made))
        acc = scores[made.method.name]
        (folder / "metrics.json").write_text(json.dumps({
            "eval": {"accuracy": acc, "loss": 0.5}, "metric_declarations": {k: DECL[k] for k in ("accuracy", "loss")},
            "main_metric": "accuracy", "recipe_hash": made.hash, "seed": 42, "method": made.method.name, "trainable_params": 10,
            "train_runtime_s": 1.0, "train_samples_per_second": 5.0, "peak_memory_mb": 100.0}))
        (folder / "log.jsonl").write_text("".join(json.dumps(e) + "\n" for e in (
            {"step": 1, "epoch": 0, "loss": 1.0}, {"step": 2, "epoch": 1, "eval": {"accuracy": acc, "loss": 0.5}})))
    return folders


def test_a_sweeps_report_is_of_its_own_runs_alone(tmp_path: Path, cli) -> None:
    """`make compare EPOCHS=1` then `make compare EPOCHS=3` (one folder, runs/compare-<task>-<model>):
    the second report chose each method's "best" across the two budgets as if a grid (lora at 1
    epoch, 90.00, under EPOCHS=3), exit 0. Rule: a sweep's report (`--report`, what the make
    targets run) covers exactly the points that sweep asked for; the folder's other runs are
    counted and left out. `toolkit report` of the folder, by hand, reports all of them: a cell of
    two budgets is a grid over train.epochs, said so with each setting's number."""
    root = tmp_path / "runs"
    lora, full = (Path(__file__).resolve().parent.parent / f"recipes/demo/sst2/minilm-{m}.yaml" for m in ("lora", "full"))
    _finished_points([lora, full], ["train.epochs=1"], root, {"lora": 0.90, "full": 0.70})
    _finished_points([lora, full], ["train.epochs=3"], root, {"lora": 0.60, "full": 0.80})
    code, out, err = cli("sweep", lora, full, "train.epochs=3", "--seeds", "42", "--runs-dir", root,
                         "--report=--rows task --cols method --no-plots")
    assert code == 0, err
    assert "| sst2 | 80.00 (n=1) | 60.00 (n=1) |" in out and "grid" not in out.split("## accuracy")[1], out
    assert "the 2 points `toolkit sweep " in out and "; 2 other finished run(s) in " in out, out
    assert (root / "report.md").read_text() in out
    code, out, _ = cli("report", root, "--rows", "task", "--cols", "method", "--no-plots")  # by hand: every run there
    assert code == 0 and "| sst2 | 80.00 (n=1) | 90.00 (n=1) |" in out
    assert "reported train.epochs=1.0, the best mean accuracy on dev of the grid [train.epochs=1.0: 90.00 (n=1); " \
           "train.epochs=3.0: 60.00 (n=1)]" in out, out
    # a second seed another process is running (two `make compare SEEDS=42,43` at once), its folder
    # holding no recipe.yaml yet: left to it, and counted in its cell (it read `(n=1)`, said nowhere)
    from toolkit import runs as run_folders

    _, seeds2 = sweep.plan([lora, full], ["train.epochs=3"], "42,43", root, False)
    with contextlib.ExitStack() as held:
        for folder in seeds2[1::2]:
            held.enter_context(run_folders.locked(folder, folder=True))
        code, out, err = cli("sweep", lora, full, "train.epochs=3", "--seeds", "42,43", "--runs-dir", root,
                             "--report=--rows task --cols method --no-plots")
    assert code == 0 and "2 left to the processes running them" in out, err
    assert "| sst2 | 80.00 (n=1; 1 not finished) | 60.00 (n=1; 1 not finished) |" in out, out
    (root / "report.md").unlink()
    code, out, _ = cli("sweep", lora, "train.epochs=3", "--seeds", "42", "--runs-dir", root, "--dry-run", "--report=")
    assert code == 0 and "# Report" not in out and not (root / "report.md").exists()
    for given, said in (("--rows tsk", "report --rows 'tsk': expected one of"), ("--out x", "give report options alone"),
                        ("--glu", "unrecognized arguments: --glu; did you mean --glue?"), ("'--glue", "No closing quotation")):
        code, out, err = cli("sweep", lora, "train.epochs=5", "--runs-dir", root, f"--report={given}")
        assert code == 2 and err.startswith(f"error: sweep --report '{given}': ") and said in err, err
        assert err.count("\n") == 1 and not (root / "demo/sst2/minilm-lora").joinpath("x").exists()
    assert len(list(root.rglob("recipe.yaml"))) == 4  # nothing ran


OWN = """model: {{checkpoint: {checkpoint}}}
task: {{name: text_classification, train_file: {train}, eval_file: {dev}, max_length: 16}}
method: {{name: lora, r: 2}}
train: {{epochs: 2, lr: 1.0e-3, batch_size: 8}}
"""


def own_recipe(tmp_path: Path, checkpoint: str) -> Path:
    for name, rows in (("train.csv", 60), ("dev.csv", 20)):
        (tmp_path / name).write_text("text,label\n" + "".join(f"review {i},{'pos' if i % 2 else 'neg'}\n" for i in range(rows)))
    return write_recipe(tmp_path / "own.yaml", OWN.format(checkpoint=checkpoint, train=tmp_path / "train.csv",
                                                          dev=tmp_path / "dev.csv"))


# processes -> (steps with grad_accum 1, with 3, (examples, evaluations) of train.max_steps=5): 60
# examples in batches of 8 are 8 micro-batches an epoch, 4 on each of 2 processes (whose 5 steps are
# an epoch and a step of 16, evaluated at the epoch's end and the last step)
DRY_RUN_STEPS = {1: (16, 6, (40, 1)), 2: (8, 4, (76, 2))}


@pytest.mark.parametrize("processes", sorted(DRY_RUN_STEPS))
def test_dry_run_gives_each_points_steps_examples_and_the_total(tmp_path: Path, cli, runs_dir: Path, monkeypatch,
                                                                tiny_checkpoint, processes: int) -> None:
    """The plan's steps are those the launch takes: under torchrun of 2 processes each step reads
    batch x grad_accum examples on each (the dry run counted one process's, twice the steps)."""
    recipe = own_recipe(tmp_path, tiny_checkpoint("bert"))
    monkeypatch.setenv("WORLD_SIZE", str(processes))
    code, out, err = cli("sweep", recipe, "train.grad_accum=1,3", "--dry-run", "--runs-dir", runs_dir)
    assert code == 0, err
    # 2 epochs of 8 / processes steps, or of ceil(8 / processes / 3)
    one, three, five = DRY_RUN_STEPS[processes]
    assert f"60 train examples, {one} optimizer steps reading 120 examples; 2 evaluations of 20" in out
    assert f"60 train examples, {three} optimizer steps reading 120 examples; 2 evaluations of 20" in out
    assert (f"2 runs (dry run: nothing was started): {one + three} optimizer steps reading 240 training examples "
            "in all") in out
    assert "about" not in out and not runs_dir.exists()
    (c,) = sweep.costs([sweep.Point(recipe, ["train.max_steps=5"])], smoke=False, processes=processes)
    assert (c.steps, c.examples_seen, c.evals) == (5, *five)


def test_estimate_extrapolates_measured_times_once_per_recipe_shape(tmp_path: Path, monkeypatch, tiny_checkpoint) -> None:
    recipe = own_recipe(tmp_path, tiny_checkpoint("bert"))
    points = [sweep.Point(recipe, o) for o in (["train.lr=1e-3"], ["train.lr=3e-3"], ["train.batch_size=4"])]
    measured = []

    def fake(point, rec, smoke):
        measured.append(point)
        return sweep.Timing(step_s=rec.train.batch_size / 4, eval_example_s=0.01, overhead_s=5.0)

    monkeypatch.setattr(sweep, "measure", fake)
    costs = sweep.costs(points, smoke=False)
    seconds = sweep.estimate(points, costs, smoke=False)
    assert measured == [points[0], points[2]]  # a learning rate does not change a step's time
    assert seconds[0] == seconds[1] == pytest.approx(16 * 2.0 + 2 * 20 * 0.01 + 5.0)
    assert costs[2].steps == 2 * 15 and seconds[2] == pytest.approx(30 * 1.0 + 2 * 20 * 0.01 + 5.0)
    assert [sweep.duration(s) for s in (40, 125, 7500, 200000)] == ["40 s", "2 min", "2 h 05 min", "2 d 7 h"]


def test_estimate_measures_real_steps_here_and_leaves_no_run(tmp_path: Path, cli, runs_dir: Path,
                                                             tiny_checkpoint) -> None:
    recipe = own_recipe(tmp_path, tiny_checkpoint("bert"))
    code, out, err = cli("sweep", recipe, "--estimate", "--runs-dir", runs_dir)
    assert code == 0, err
    assert "16 optimizer steps reading 120 examples; 2 evaluations of 20; about " in out
    assert "estimate: about" in out and f"Measured here: {sweep.MEASURED_STEPS} optimizer steps" in out and not runs_dir.exists()
    assert "about 0 s" not in out  # start-up alone takes seconds


def test_estimate_of_a_chained_point_measures_the_model_its_chain_starts_from(tmp_path: Path, cli, runs_dir: Path,
                                                                             tiny_checkpoint) -> None:
    """A chained point's measuring run looked for its upstream in the throw-away runs folder: every
    such estimate failed, finished upstream or not, saying `run it first: ... --runs-dir
    /tmp/toolkit-estimate-...` (a folder already gone). It measures the same shape on the model
    the chain starts from, and leaves no run."""
    own_recipe(tmp_path, tiny_checkpoint("bert"))
    upstream = write_recipe(tmp_path / "up.yaml", "extends: own.yaml\nmethod: {name: full}\n")
    chained = write_recipe(tmp_path / "chained.yaml", f"extends: own.yaml\nmodel: {{checkpoint: {{run: {upstream}}}}}\n")
    code, out, err = cli("sweep", chained, "--estimate", "--runs-dir", runs_dir)
    assert code == 0, err
    assert "estimate: about" in out and not runs_dir.exists()


def test_make_estimate_skips_the_report(tmp_path: Path, cli) -> None:
    import subprocess

    root = Path(__file__).resolve().parent.parent
    dry = subprocess.run(["make", "-n", "compare", "ARGS=--estimate"], cwd=root, capture_output=True, text=True,
                         check=True).stdout
    assert "--estimate" in dry and "toolkit report" not in dry


@pytest.mark.parametrize("seeds, expected", [([3], [3]), ([3, 7], [3, 7]), ((5,), [5]), (3, [42, 43, 44]),
                                             ("3", [42, 43, 44]), ("3,7", [3, 7]), (1234, [1234]), (None, None),
                                             ("3,", [3]), (",3", [3]), ("0,", [0])])
def test_api_seeds_as_a_list_are_seeds_never_a_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     seeds, expected: list[int]) -> None:
    """`toolkit.sweep(recipe, seeds=[3])` ran seeds 42, 43 and 44: the list was joined into "3",
    which `--seeds` reads as a count. A list holds seeds; an int or a string reads as --seeds does.
    None (the default) is each recipe's own train.seed, as `toolkit sweep` without --seeds: the
    default was 42, so a recipe with seed 7 ran 7 from the CLI and 42 from the API, exit 0."""
    import toolkit
    from toolkit import api

    recipe = write_recipe(tmp_path / "recipes" / "s.yaml", RECIPE)
    ran: list[list[str]] = []
    monkeypatch.setattr(api, "run", lambda path, overrides, **kw: ran.append(overrides))
    toolkit.sweep([recipe], **({} if seeds is None else {"seeds": seeds}), runs_dir=tmp_path / "runs")
    assert ran == ([[]] if expected is None else [[f"train.seed={s}"] for s in expected])
    with pytest.raises(UserError, match=r"seeds \[3, 3\]: a seed is listed twice"):
        toolkit.sweep([recipe], seeds=[3, 3], runs_dir=tmp_path / "runs")
    with pytest.raises(UserError, match=r"overrides\['train.lr=1'\]: a key is a dotted setting"):
        toolkit.run(recipe, {"train.lr=1": 2}, runs_dir=tmp_path / "runs")


@pytest.mark.parametrize("entry", ["cli", "api"])
@pytest.mark.parametrize("taken", ["before", "after the check"])
def test_a_point_another_process_is_running_is_left_to_it(tmp_path: Path, cli, capsys, runs_dir: Path,
                                                          monkeypatch: pytest.MonkeyPatch, entry: str,
                                                          taken: str) -> None:
    """Two sweeps of one grid at once (two terminals, `make compare` twice): the second stopped
    at the first point the other was running, with the run's refusal and the sweep's failure
    (exit 2), where the rest of the grid was free. Such a point is now left to the process that
    runs it, said in one line, and the sweep goes on; its last line names what it left.
    `after the check`: the other process took the point between the sweep's check and the
    point's own lock (the CLI's child imports torch first: two sweeps started at once both found
    it free), and the loser's refusal stopped its whole sweep, exit 2; it is left to it too."""
    import toolkit
    from toolkit import runs

    recipe = write_recipe(tmp_path / "recipes" / "s.yaml", RECIPE)
    # the holder is read from the lock, not cut out of its message at " right now" (a runs
    # folder so named was said as "<its path up to there>", the holder lost)
    runs_dir = runs_dir / "grid right now; x"
    points, folders = sweep.plan([recipe], ["train.lr=1e-3,2e-3"], "42", runs_dir, True)
    grid = "train.lr=1e-3,2e-3"
    if taken != "before":  # the check found each point free; the other process took it a moment later
        monkeypatch.setattr(runs, "run_elsewhere", lambda out: None)
        grid, folders = "train.lr=1e-3", folders[:1]  # one point: the CLI's is a child process to start
    with contextlib.ExitStack() as held:
        for folder in folders:  # held by another process
            held.enter_context(runs.locked(folder, folder=True))
        if entry == "cli":
            code, out, err = cli("sweep", recipe, grid, "--seeds", "42", "--smoke", "--runs-dir", runs_dir)
            assert code == 0 and err == "", err
        else:
            got = toolkit.sweep([recipe], [grid], seeds="42", runs_dir=runs_dir, smoke=True)
            out = capsys.readouterr().out
            assert [r.dir for r in got] == folders and all(r.metrics == {} for r in got)
    said = [line for line in out.splitlines() if "left to it" in line]
    # the CLI's sweep asks again who holds a point its child found taken (asked here: no one)
    holder = "another process" if (entry, taken) == ("cli", "after the check") else f"process {os.getpid()}"
    assert said == [f"{f} is being run by {holder} right now: left to it; the sweep goes on with the "
                    "next point" for f in folders], out
    assert entry == "api" or out.splitlines()[-1] == (
        f"sweep: 0 runs done; {len(folders)} left to the processes running them right now "
        f"({', '.join(map(str, folders))}): the same command later skips them once finished")
    assert not list(runs_dir.rglob("recipe.yaml"))  # nothing was started here


@pytest.mark.parametrize("lock", ["cache", "folder"])
def test_the_holder_of_a_run_is_read_from_its_lock_never_parsed_from_a_message(tmp_path: Path,
                                                                                lock: str) -> None:
    """runs.holder_of cut the refusal's message at its first " right now": a runs folder whose
    path held those words named a shorter path and no holder. It reads the Busy's fields now, for
    each lock (the cache's names the process; the folder's, taken under another $TOOLKIT_CACHE,
    cannot), and run_elsewhere takes only a Busy for a holder."""
    from toolkit import runs

    out = tmp_path / "a right now; b" / "s" / "abc123"
    out.mkdir(parents=True)
    holder = f"process {os.getpid()}" if lock == "cache" else "another process"
    with contextlib.ExitStack() as held:
        if lock == "cache":
            held.enter_context(runs._cache_lock(out))
        else:
            fd = runs.flock_held(out, "held")
            held.callback(os.close, fd)
        assert runs.run_elsewhere(out) == f"{out} is being run by {holder}"
        with pytest.raises(runs.Busy) as busy, runs.locked(out, folder=True):
            pass
        assert runs.holder_of(busy.value) == f"{out} is being run by {holder}"
    assert runs.run_elsewhere(out) is None


@pytest.mark.parametrize("entry", ["cli", "api"])
def test_a_sweep_launched_on_several_processes_speaks_once_and_cannot_leave_a_point(
        tmp_path: Path, cli, capsys, runs_dir: Path, monkeypatch: pytest.MonkeyPatch, entry: str) -> None:
    """Rule: the processes of one launch run the same points in the same order. Only rank 0
    holds (and so sees) a run's locks, so a point held elsewhere was left by rank 0 alone and the
    launch's processes went on to different points; now the launch stops there in one line
    (exit 2; torchrun stops the other processes). Its progress lines are said by rank 0 alone
    (each process printed them)."""
    import toolkit
    from toolkit import runs

    recipe = write_recipe(tmp_path / "recipes" / "s.yaml", RECIPE)
    grid = ["train.lr=1e-3,2e-3"]
    monkeypatch.setenv("WORLD_SIZE", "2")  # before the plan: a run's folder holds its process count
    points, folders = sweep.plan([recipe], grid, "42", runs_dir, True)
    with runs.locked(folders[0], folder=True):  # held by another process
        if entry == "cli":
            code, out, err = cli("sweep", recipe, *grid, "--seeds", "42", "--smoke", "--runs-dir", runs_dir)
            assert code == 2 and out == "[1/2] " + str(points[0]) + "\n", out
        else:
            with pytest.raises(UserError) as caught:
                toolkit.sweep([recipe], grid, seeds="42", runs_dir=runs_dir, smoke=True)
            err = f"error: {caught.value}\n"
    assert err == (f"error: sweep: {folders[0]} is being run by process {os.getpid()} right now; a sweep launched "
                   "on 2 processes cannot leave a point to another process (its processes would run different "
                   "points): wait for that run to finish, then run the sweep again\n"), err
    from toolkit import recipe as recipes

    for point, folder in zip(points, folders):  # both finished (recipe.yaml, model/, metrics.json): what each process says
        (folder / "model").mkdir(parents=True, exist_ok=True)
        (folder / "recipe.yaml").write_text(recipes.dump(recipes.load(point.recipe, point.overrides, smoke=True)))
        (folder / "metrics.json").write_text("{}")
    said = {}
    for rank in ("0", "1"):
        monkeypatch.setenv("RANK", rank)
        said[rank] = cli("sweep", recipe, *grid, "--seeds", "42", "--smoke", "--runs-dir", runs_dir)
        assert cli("sweep", recipe, *grid, "--seeds", "42", "--smoke", "--runs-dir", runs_dir,
                   "--dry-run")[1].count("2 runs (dry run") == (rank == "0")
    assert said["0"][0] == 0 and said["0"][1].splitlines()[-1] == "sweep: 2 runs done"
    assert said["1"] == (0, "", "")
    code, out, err = cli("sweep", recipe, *grid, "--seeds", "42", "--smoke", "--runs-dir", runs_dir, "--estimate")
    assert code == 2 and err.startswith("error: sweep --estimate: measures one process on this machine, and this "
                                        "launch has 2"), err


@pytest.mark.parametrize("edit", ["recipe", "base", "data"])
def test_a_point_is_run_as_planned_or_not_at_all(tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch,
                                                 edit: str) -> None:
    """A recipe (or a base it extends, or its data) edited while a sweep ran: the later points ran
    the edited recipe, exit 0, though the sweep had listed and checked the other one (a grid half
    of one recipe, half of another). The CLI and the API refuse such a point before it starts;
    the points before it are kept."""
    import subprocess

    import toolkit
    from toolkit import api, cli as cli_module

    data = tmp_path / "train.csv"
    data.write_text("text,label\na fine film,pos\na dull film,neg\n")
    base = write_recipe(tmp_path / "_base.yaml", RECIPE.replace("glue, subset: sst2", "text_classification, "
                        f"train_file: {data}, eval_file: {data}"))
    recipe = write_recipe(tmp_path / "leaf.yaml", "extends: _base.yaml\n")
    started, popen = [], subprocess.Popen

    def edited_after_the_first(*args, **kwargs):
        started.append(args)
        if edit == "data":
            data.write_text("text,label\na fine film,pos\na poor film,neg\n")
        else:
            target = recipe if edit == "recipe" else base
            target.write_text(target.read_text() + "train: {weight_decay: 0.1}\n" if edit == "recipe"
                              else target.read_text().replace("max_length: 32", "max_length: 24"))
        return popen(["true"]) if args and isinstance(args[0], list) else toolkit.Run(tmp_path / "x")

    original = (recipe.read_text(), base.read_text(), data.read_text())
    monkeypatch.setattr(cli_module.subprocess, "Popen", edited_after_the_first)
    code, out, err = cli("sweep", recipe, "train.lr=1e-3,2e-3", "--runs-dir", tmp_path / "runs")
    assert code == 2 and len(started) == 1 and "[2/2]" in out, (out, err)
    assert "sweep: run 2 of 2 (" in err and "is now another run than planned" in err and err.count("\n") == 1
    recipe.write_text(original[0]), base.write_text(original[1]), data.write_text(original[2])
    started.clear()
    monkeypatch.setattr(api, "run", edited_after_the_first)
    with pytest.raises(UserError, match=r"^sweep: run 2 of 2 \(.+\) is now another run than planned"):
        toolkit.sweep([recipe], ["train.lr=1e-3,2e-3"], seeds=None, runs_dir=tmp_path / "runs")
    assert len(started) == 1


@pytest.mark.parametrize("entry", ["cli", "api"])
def test_a_point_stopped_with_its_launch_stops_the_sweep_with_that_code(tmp_path: Path, cli, monkeypatch,
                                                                       entry: str) -> None:
    """Under a launch, a point whose process stopped because another process of the launch stopped
    first (exit errors.STOPPED_WITH_THE_LAUNCH) failed as a user error (exit 2, and --keep-going
    went on to a point whose peers were gone): the sweep stops with that code, which the launch
    passes over for the cause's (toolkit.launch.exit_code)."""
    import subprocess

    import toolkit
    from toolkit import api, cli as cli_module
    from toolkit.errors import STOPPED_WITH_THE_LAUNCH, PeerStopped

    started, popen = [], subprocess.Popen

    def lost(*args, **kwargs):
        started.append(args)
        if entry == "cli":
            return popen(["sh", "-c", f"exit {STOPPED_WITH_THE_LAUNCH}"])
        raise PeerStopped("process 1 of 2 stopped with the launch: another of its processes stopped first")

    recipe = write_recipe(tmp_path / "r.yaml", RECIPE)
    if entry == "cli":
        monkeypatch.setattr(cli_module.subprocess, "Popen", lost)
        code, _, err = cli("sweep", recipe, "train.lr=1e-3,2e-3", "--keep-going", "--runs-dir", tmp_path / "runs")
        assert code == STOPPED_WITH_THE_LAUNCH and "sweep: run 1 of 2 (" in err and "stopped with the launch" in err, err
    else:
        monkeypatch.setattr(api, "run", lost)
        with pytest.raises(PeerStopped, match=r"^sweep: run 1 of 2 \(.+\): process 1 of 2 stopped with the launch"):
            toolkit.sweep([recipe], ["train.lr=1e-3,2e-3"], seeds=None, runs_dir=tmp_path / "runs", keep_going=True)
    assert len(started) == 1


@pytest.mark.parametrize("entry", ["cli", "api"])
def test_a_sweep_of_no_recipe_is_refused_at_every_entry_point(tmp_path: Path, cli, entry: str) -> None:
    """`toolkit.sweep([])` (a glob that matched nothing) returned [] as if a grid had run, where
    `toolkit sweep train.lr=1e-4,3e-4` is one line: the same refusal in both, nothing made."""
    import toolkit

    said = "sweep: no recipe given"
    if entry == "api":
        with pytest.raises(UserError, match=said):
            toolkit.sweep([], ["train.lr=1e-4,3e-4"], runs_dir=tmp_path / "runs")
    else:
        code, _, err = cli("sweep", "train.lr=1e-4,3e-4", "--runs-dir", tmp_path / "runs")
        assert code == 2 and err.count("\n") == 1 and said in err, err
    assert not (tmp_path / "runs").exists()


def test_the_dry_run_says_what_the_sweep_does_with_a_finished_chained_point(tmp_path: Path, cli, runs_dir: Path,
                                                                           tiny_checkpoint) -> None:
    """A finished chained point whose upstream's model changed since (run again, edited) was listed
    `[finished]` by --dry-run, exit 0, where the sweep refuses it (chain.check_current): the dry run
    refuses it with the sweep's own line. Under --force a finished point runs again: it was listed
    `[finished]` and counted as done."""
    own_recipe(tmp_path, tiny_checkpoint("bert"))
    upstream = write_recipe(tmp_path / "up.yaml", "extends: own.yaml\nmethod: {name: full}\ntrain: {max_steps: 1}\n")
    chained = write_recipe(tmp_path / "chained.yaml", f"extends: own.yaml\nmodel: {{checkpoint: {{run: {upstream}}}}}\n"
                           "train: {max_steps: 1}\n")
    for recipe in (upstream, chained):
        code, _, err = cli("run", recipe, "--smoke", "--runs-dir", runs_dir)
        assert code == 0, err
    code, out, err = cli("sweep", chained, "--smoke", "--dry-run", "--runs-dir", runs_dir)
    assert code == 0 and "[finished]" in out and "0 still to run" in out, err
    code, out, err = cli("sweep", chained, "--smoke", "--dry-run", "--force", "--runs-dir", runs_dir)
    assert code == 0 and "[runs again: --force]" in out and "1 still to run" in out, err
    (config,) = [p for p in runs_dir.rglob("model/config.json") if "up" in str(p.relative_to(runs_dir)).split(os.sep)[0]]
    config.write_text(config.read_text().replace("{", '{"edited": 1, ', 1))
    sweep_said = cli("sweep", chained, "--smoke", "--runs-dir", runs_dir)
    dry_said = cli("sweep", chained, "--smoke", "--dry-run", "--runs-dir", runs_dir)
    assert sweep_said[0] == dry_said[0] == 2 and "no point was started" in dry_said[2], dry_said
    assert dry_said[2] == sweep_said[2] and dry_said[1] == ""


@pytest.mark.parametrize("entry", ["cli", "api"])
def test_a_chained_point_whose_upstream_no_point_makes_is_refused_before_the_first(tmp_path: Path, cli,
                                                                                   monkeypatch, entry: str) -> None:
    """Every point is checked before the first one starts: a chained point (`model.checkpoint:
    {run: ...}`) whose upstream run is not finished ran the points before it, then stopped at it
    (hours of a grid, then `run it first`). Refused before any point starts, unless an earlier
    point of the grid makes that upstream run."""
    import subprocess

    import toolkit
    from toolkit import api, cli as cli_module

    started, popen = [], subprocess.Popen
    monkeypatch.setattr(cli_module.subprocess, "Popen", lambda *a, **k: started.append(a) or popen(["true"]))
    monkeypatch.setattr(api, "run", lambda path, overrides, **kw: started.append(path) or toolkit.Run(tmp_path / "x"))

    def sweep(*recipes: str, axis: str = "train.lr=1e-4,2e-4") -> str:
        if entry == "api":
            try:
                toolkit.sweep(list(recipes), [axis], runs_dir=tmp_path / "runs")
            except UserError as exc:
                return str(exc)
            return ""
        code, _, err = cli("sweep", *recipes, axis, "--runs-dir", tmp_path / "runs")
        assert code in (0, 2) and err.count("\n") == code // 2, err
        return err

    said = sweep("demo/sst2/minilm-lora", "demo/sst2/minilm-full-from-wikitext")
    assert "sweep: run 3 of 4 (" in said and "model.checkpoint: run recipes/pretrain/wikitext-2/minilm-mlm.yaml " \
        "has not been run" in said and started == [], said
    # the pretraining at the lr the fine-tuning's reference names is the grid's own point: no refusal
    said = sweep("pretrain/wikitext-2/minilm-mlm", "demo/sst2/minilm-full-from-wikitext")
    assert said == "" and len(started) == 4, said
    # `smoke: true` (in the recipe or as here) is --smoke: the chained run makes its upstream smoke run
    said = sweep("demo/sst2/minilm-full-from-wikitext", axis="smoke=true")
    assert said == "" and len(started) == 5, said


@pytest.mark.parametrize("entry", ["cli", "api"])
def test_keep_going_runs_every_other_point_and_names_the_failed_ones_at_the_end(tmp_path: Path, cli, monkeypatch,
                                                                                entry: str) -> None:
    """`--keep-going` (`keep_going=True`): a point that fails (a diverged seed of an overnight `make
    glue`) is said and the sweep goes on; every failed point is named in one line at the end, exit 2.
    Without it the first failure stopped every later task and seed. Under a launch of several
    processes it is refused in one line before any point runs (a run failing on one process would
    leave the others' run waiting)."""
    import subprocess

    import toolkit
    from toolkit import api, cli as cli_module, runs as runs_module

    recipe = write_recipe(tmp_path / "recipes" / "s.yaml", RECIPE)
    started, popen = [], subprocess.Popen
    fails = {2, 4}

    def some_fail(*args, **kwargs):
        started.append(args)
        if len(started) in fails:
            raise UserError(f"the run's own line {len(started)}")
        return tmp_path / "x"

    axis = "train.lr=1e-3,2e-3,3e-3,4e-3"
    if entry == "cli":
        monkeypatch.setattr(cli_module.subprocess, "Popen", lambda *a, **k: started.append(a) or
                            popen(["false" if len(started) in fails else "true"]))
        # --report (make glue's): made after the failed points; none finished here, so said in the one line
        code, out, err = cli("sweep", recipe, axis, "--keep-going", "--runs-dir", tmp_path / "runs", "--report")
        assert code == 2 and err.count("\n") == 1 and err.endswith("; no report: report: none of the sweep's 4 runs finished\n"), err
        said = err
        assert "sweep: run 2 of 4" in out and "on with the next point" in out and "sweep: 2 runs done" in out, out
    else:
        monkeypatch.setattr(api, "run_one", some_fail)
        with pytest.raises(UserError) as caught:
            toolkit.sweep([recipe], [axis], runs_dir=tmp_path / "runs", keep_going=True)
        said = str(caught.value)
        assert "the run's own line 2" in said and "the run's own line 4" in said
    assert len(started) == 4, "every point ran"
    assert said.count(") failed") == 2 and f"run 2 of 4 ({recipe} train.lr=2e-3) failed" in said
    assert f"run 4 of 4 ({recipe} train.lr=4e-3) failed" in said and "2 of 4 runs failed" in said
    if entry == "cli":  # several processes: refused before any point runs
        started.clear()
        monkeypatch.setattr(runs_module, "world_size", lambda: 2)
        code, _, err = cli("sweep", recipe, axis, "--keep-going", "--runs-dir", tmp_path / "runs2")
        assert code == 2 and "sweep --keep-going: this launch has 2 processes" in err and started == [], err


@pytest.mark.parametrize("entry", ["cli", "api"])
def test_a_point_that_fails_stops_the_sweep_naming_it(tmp_path: Path, cli, monkeypatch, entry: str) -> None:
    """A point whose run fails stops the sweep with one line naming the point and saying the finished
    runs are kept. `toolkit.sweep` raised the run's own line alone: which point of the grid failed,
    and that the same call goes on from it, was not said."""
    import subprocess

    import toolkit
    from toolkit import api, cli as cli_module

    recipe = write_recipe(tmp_path / "recipes" / "s.yaml", RECIPE)
    started, popen = [], subprocess.Popen

    def second_fails(*args, **kwargs):
        started.append(args)
        if len(started) == 2:
            raise UserError("the run's own line")
        return tmp_path / "x"

    if entry == "cli":
        monkeypatch.setattr(cli_module.subprocess, "Popen", lambda *a, **k: started.append(a) or
                            popen(["false" if len(started) == 2 else "true"]))
        code, _, err = cli("sweep", recipe, "train.lr=1e-3,2e-3,3e-3", "--runs-dir", tmp_path / "runs")
        assert code == 2 and err.count("\n") == 1, err
        said = err
    else:
        monkeypatch.setattr(api, "run_one", second_fails)
        with pytest.raises(UserError) as caught:
            toolkit.sweep([recipe], ["train.lr=1e-3,2e-3,3e-3"], runs_dir=tmp_path / "runs")
        said = str(caught.value)
        assert "the run's own line" in said
    assert f"sweep: run 2 of 3 ({recipe} train.lr=2e-3) failed" in said and "finished runs are kept" in said
    assert len(started) == 2



# the tasks whose training rows are not their examples (LM blocks, QA windows), and glue's one row
# per example beside them; the other one-row tasks count as glue does (`Task.rows_are_examples`)
LM = ("train_file: $TOOLKIT_DATA/lm/wikitext-2/valid.txt, eval_file: $TOOLKIT_DATA/lm/wikitext-2/test.txt")
PLANNED = {"glue": ("bert", ACCOUNTED["glue"]), "clm": ("gpt2", ACCOUNTED["clm"]), "mlm": ("roberta", ACCOUNTED["mlm"]),
           "squad": ("bert", ACCOUNTED["squad"]),
           "denoise": ("bart", f"task: {{name: denoise, max_length: 32, {LM}}}"),
           "span_corruption": ("t5", f"task: {{name: span_corruption, max_length: 32, {LM}}}")}


@pytest.mark.parametrize("task", sorted(PLANNED))
def test_dry_run_counts_the_steps_of_the_rows_the_loop_batches(tmp_path: Path, tiny_checkpoint, task: str) -> None:
    """The plan's steps and examples are those of the encoded training split the loop batches
    (`setup.build`): LM blocks and QA windows, not the raw lines and questions. A CLM dry run of
    40 lines said 10 optimizer steps reading 40 examples; the run took 8 steps of its 31 blocks."""
    from toolkit.setup import build

    family, task_yaml = PLANNED[task]
    task_yaml = task_yaml.split("\n", 1)[-1]  # the task line, its model set here
    recipe = write_recipe(tmp_path / "r.yaml", f"model: {{checkpoint: {tiny_checkpoint(family)}}}\n{task_yaml}\n"
                          "method: {name: full}\ntrain: {epochs: 2, batch_size: 4}\n")
    overrides = ["task.max_train_samples=40", "task.max_eval_samples=4"]
    (c,) = sweep.costs([sweep.Point(recipe, overrides)], smoke=False)
    plan = recipes.plan(recipe, overrides)
    rows = len(build(plan).train)
    assert (task == "glue") == (rows == 40)  # blocks and windows are other counts than the lines and questions
    assert (c.train_examples, c.steps, c.examples_seen) == (rows, plan.recipe.train.optimizer_steps(rows)[1], 2 * rows)


def test_dry_run_of_a_packing_task_without_its_tokenizer_is_one_line(tmp_path: Path, cli, runs_dir: Path) -> None:
    """Off-line, with the checkpoint not in the Hub cache, a CLM point's blocks cannot be counted:
    one line that says so (the dry run of raw lines was a wrong count with exit 0)."""
    from toolkit import models

    if models.tokenizer_folder("gpt2") is not None:
        pytest.skip("gpt2 is in this machine's Hub cache")
    recipe = write_recipe(tmp_path / "r.yaml", f"model: {{checkpoint: gpt2}}\n{ACCOUNTED['clm'].split(chr(10), 1)[1]}\n"
                          "method: {name: full}\n")
    code, _, err = cli("sweep", recipe, "--dry-run", "--runs-dir", runs_dir)
    assert code == 2 and err.count("error: ") == 1, err
    assert "(the plan counts the clm training rows, its blocks or windows, with the checkpoint's tokenizer" in err
    assert not runs_dir.exists()
