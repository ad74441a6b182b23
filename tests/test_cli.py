"""User errors are one line with exit code 2 and leave no run folder; finished runs are not redone."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import ROOT, write_recipe
from toolkit.recipe_data import read_yaml, recipe_files

RECIPE = """model: {checkpoint: bert-base-uncased}
task: {name: glue, subset: sst2, max_length: 32}
method: {name: freeze}
train: {epochs: 1, lr: 1.0e-3, batch_size: 8}
"""


def _one_line_error(code: int, err: str, text: str) -> None:
    assert code == 2
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and text in lines[0], err


def test_uncached_hub_id_offline(tmp_path: Path, cli, runs_dir: Path) -> None:
    recipe = write_recipe(tmp_path / "r.yaml", RECIPE.replace("bert-base-uncased", "someone/not-cached-bert"))
    code, _, err = cli("run", recipe, "--runs-dir", runs_dir)
    _one_line_error(code, err, "cannot read the config of 'someone/not-cached-bert' off-line")
    assert "local folder" in err and not runs_dir.exists()


def test_missing_data_file(tmp_path: Path, cli, runs_dir: Path) -> None:
    (tmp_path / "data" / "glue" / "SST-2").mkdir(parents=True)
    (tmp_path / "data" / "glue" / "SST-2" / "dev.tsv").write_text("sentence\tlabel\nok\t1\n")
    recipe = write_recipe(tmp_path / "r.yaml", RECIPE)
    code, _, err = cli("run", recipe, "--runs-dir", runs_dir, f"task.data_dir={tmp_path / 'data'}", "--smoke")
    _one_line_error(code, err, "SST-2/train.tsv is not there")
    assert not runs_dir.exists()


def test_bad_recipe_and_bad_override(tmp_path: Path, cli, runs_dir: Path) -> None:
    recipe = write_recipe(tmp_path / "r.yaml", RECIPE)
    code, _, err = cli("run", recipe, "--runs-dir", runs_dir, "train.epochs=many")
    _one_line_error(code, err, "train.epochs: expected float, got str 'many'")
    code, _, err = cli("run", tmp_path / "missing.yaml", "--runs-dir", runs_dir)
    _one_line_error(code, err, "missing.yaml does not exist")
    assert not runs_dir.exists()


def test_finished_run_is_not_redone_unless_forced(tmp_path: Path, cli, runs_dir: Path) -> None:
    recipe = write_recipe(tmp_path / "recipes" / "glue" / "x.yaml", RECIPE)
    assert cli("run", recipe, "--smoke", "--runs-dir", runs_dir)[0] == 0
    (run,) = [p.parent for p in runs_dir.rglob("metrics.json")]
    assert run.parent == runs_dir / "glue" / "x"
    assert {"recipe.yaml", "metrics.json", "log.jsonl", "model"} <= {p.name for p in run.iterdir()}
    assert not (run / "checkpoints").exists()  # dropped when the run finished (train.keep_checkpoints)
    stamp = (run / "metrics.json").stat().st_mtime_ns
    code, out, _ = cli("run", recipe, "--smoke", "--runs-dir", runs_dir)
    assert code == 0 and "finished already" in out
    assert (run / "metrics.json").stat().st_mtime_ns == stamp
    assert cli("run", recipe, "--smoke", "--runs-dir", runs_dir, "--force")[0] == 0
    assert (run / "metrics.json").stat().st_mtime_ns != stamp
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["trainable_params"] < metrics["total_params"]  # freeze: only the head trains
    code, out, _ = cli("report", runs_dir, "--no-plots")
    assert code == 0 and "| glue/x (smoke: random weights) | freeze | 1 |" in out


def test_ls_lists_registries(cli) -> None:
    code, out, _ = cli("ls", "methods")
    assert code == 0 and {"full", "freeze", "lora"} <= set(out.split(":")[1].split())
    code, out, _ = cli("ls", "attention")
    assert "sdpa" in out and "eager" in out


def test_a_wrong_recipe_name_gets_three_names_and_where_the_rest_are(cli) -> None:
    code, _, err = cli("run", "demo/sst2/minilm-lorra")
    line = err.strip()
    assert code == 2 and "\n" not in line
    assert line.startswith("error: recipe demo/sst2/minilm-lorra does not exist (did you mean demo/sst2/minilm-lora, ")
    assert line.endswith(" or demo/sst2/minilm-adalora? `toolkit ls recipes` lists all "
                         f"{len(recipe_files([]))})") and line.count("demo/") == 4
    code, _, err = cli("validate", "nothing/like/this")
    assert code == 2 and err.strip().endswith(f"(`toolkit ls recipes` lists all {len(recipe_files([]))})")


DAMAGED_METRICS = {"cut short": b'{"eval": {"accu', "not an object": b"[1, 2]\n", "not UTF-8": b'{"eval": "\xff"}'}


@pytest.mark.parametrize("content", DAMAGED_METRICS.values(), ids=DAMAGED_METRICS.keys())
def test_a_damaged_metrics_json_is_not_a_finished_run(tmp_path: Path, cli, content: bytes) -> None:
    """A metrics.json cut short counted as finished: `run` said "finished already" (exit 0), a
    sweep skipped the point and listed it [finished], and only `report` found it. Every entry
    point that asks whether a run is finished says the one line; --force runs it again."""
    import toolkit
    from toolkit import recipe as recipes, runs

    recipe, root = ROOT / "recipes/demo/sst2/minilm-lora.yaml", tmp_path / "runs"
    out = runs.run_dir(recipes.load(recipe), root)
    out.mkdir(parents=True)
    (out / "recipe.yaml").write_text(recipes.dump(recipes.load(recipe)))
    (out / "metrics.json").write_bytes(content)
    said = f"{out / 'metrics.json'}: damaged ("
    for command in (["run", recipe], ["sweep", recipe], ["sweep", recipe, "--dry-run"], ["eval", out],
                    ["predict", out, "--input", recipe], ["export", out, tmp_path / "export"]):
        code, _, err = cli(*command, *(["--runs-dir", root] if command[0] in ("run", "sweep") else []))
        assert code == 2 and err.startswith(f"error: {said}") and err.count("\n") == 1, (command, err)
    for call in (lambda: toolkit.run(recipe, runs_dir=root), lambda: toolkit.sweep([recipe], runs_dir=root),
                 lambda: toolkit.evaluate(out), lambda: toolkit.Run(out).metrics):
        with pytest.raises(toolkit.UserError, match=re.escape(str(out / "metrics.json")) + ": damaged"):
            call()
    assert (out / "metrics.json").read_bytes() == content  # nothing ran


MAKE_PATHS = [("run", "RECIPE", ""), ("demo", "RUNS", "/demo"), ("glue", "RUNS", "/glue"),
              ("compare", "RUNS", "/compare-"), ("compare", "COMPARE_RUNS", ""), ("chain", "PRETRAIN", ""),
              ("chain", "FINETUNE", ""), ("chain", "RUNS", "/chain"), ("attention", "RUNS", "/attention"),
              ("smoke", "RUNS", "/smoke"), ("clean", "RUNS", "")]


@pytest.mark.parametrize("target, variable, tail", MAKE_PATHS)
def test_make_passes_a_path_with_spaces_as_one_argument(target: str, variable: str, tail: str) -> None:
    """`make run RECIPE="my recipes/r.yaml"` ran `toolkit run my recipes/r.yaml` (two arguments),
    and `make compare RUNS="my runs"` reported `my` and `runs/...`: every path a target takes
    reaches the command quoted, as one argument."""
    import shlex
    import subprocess

    path = "/tmp/my runs é/x.yaml" if variable in ("RECIPE", "PRETRAIN", "FINETUNE") else "/tmp/my runs é"
    out = subprocess.run(["make", "-n", target, f"{variable}={path}", "MODEL=minilm"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    assert path in out, out
    assert out.count(path) == out.count(f'"{path}{tail}') + out.count(f"{{run: '{path}',"), out  # every use quoted
    line = next(line for line in out.splitlines() if f'"{path}' in line)
    assert any(arg.startswith(path) for arg in shlex.split(line.replace("\\", ""))), line


def test_cp_into_a_missing_folder_is_one_line(tmp_path: Path, cli) -> None:
    """`toolkit cp NAME missing/x.yaml` traced back with FileNotFoundError."""
    code, _, err = cli("cp", "demo/sst2/minilm-lora", tmp_path / "missing" / "x.yaml")
    assert code == 2 and err == f"error: cp: {tmp_path / 'missing'} does not exist; create it first\n"
    assert not (tmp_path / "missing").exists()
    (tmp_path / "afile").write_text("the user's own")  # a file on the way was said not to exist
    for dest in (tmp_path / "afile" / "x.yaml", tmp_path / "afile" / "sub" / "x.yaml"):
        code, _, err = cli("cp", "demo/sst2/minilm-lora", dest)
        assert code == 2 and err == (f"error: cp: {tmp_path / 'afile'} is a file, not a folder, so {dest} cannot be "
                                     "written under it; give a path under a folder\n")


CHAINED = sorted(str(p.relative_to(ROOT / "recipes").with_suffix("")) for p in (ROOT / "recipes").rglob("*.yaml")
                 if not p.name.startswith("_") and isinstance(read_yaml(p).get("model", {}).get("checkpoint"), dict))


@pytest.mark.parametrize("name", CHAINED)
def test_a_copied_chained_recipe_stands_alone(tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """`toolkit cp` of a recipe chained to another (`model.checkpoint: {run: recipes/...}`) says the
    copy stands alone; run outside the checkout it said its upstream recipe does not exist. A
    `recipes/...` reference no folder here holds is the shipped recipe: the copy is the original's
    run (one recipe hash, one upstream run id), from any working directory."""
    from toolkit import recipe as recipes

    assert CHAINED, "no shipped recipe is chained"
    monkeypatch.chdir(tmp_path)
    code, out, err = cli("cp", name, tmp_path / "copy.yaml")
    assert code == 0, err
    code, out, err = cli("validate", tmp_path / "copy.yaml")
    assert code == 0 and "1 of 1 recipes valid" in out, err
    copy, original = recipes.plan(tmp_path / "copy.yaml"), recipes.plan(ROOT / "recipes" / f"{name}.yaml")
    assert (copy.recipe.hash, copy.recipe.upstream_id) == (original.recipe.hash, original.recipe.upstream_id)


@pytest.mark.parametrize("given, said", [("recipes/demo/sst2", "is a folder; give its .yaml files"),
                                         ("/dev/null", "is not a regular file"),
                                         ("RUN", "is a run folder; its recipe is RUN/recipe.yaml")])
def test_a_recipe_that_is_a_folder_or_a_device_is_said_as_such(tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch,
                                                                given: str, said: str) -> None:
    """`toolkit run recipes/demo/sst2` said `recipe recipes/demo/sst2 does not exist`, of a folder
    that is there; /dev/null likewise; a run folder (`toolkit.run(run)`) was told to give its
    .yaml files. Every entry point says what it is."""
    import toolkit

    monkeypatch.chdir(ROOT)
    if given == "RUN":
        given = str(write_recipe(tmp_path / "run" / "recipe.yaml", "method: {name: full}\n").parent)
        said = said.replace("RUN", given)
    line = f"recipe {given} {said}"
    for command in (["run", given], ["validate", given], ["sweep", given, "--dry-run"]):
        code, _, err = cli(*command, *(["--runs-dir", tmp_path / "runs"] if command[0] != "validate" else []))
        assert code == 2 and line in err.splitlines()[0], (command, err)
    with pytest.raises(toolkit.UserError, match=re.escape(line)):
        toolkit.run(given, runs_dir=tmp_path / "runs")
    assert not (tmp_path / "runs").exists()


def test_make_glue_with_no_recipe_for_model_and_method_says_so() -> None:
    """`make glue MODEL=robrta-base` ran `toolkit sweep` with no recipe: `sweep: no recipe given,
    e.g. toolkit sweep recipes/demo/...`, about a recipe the user never named."""
    import subprocess

    done = subprocess.run(["make", "-n", "glue", "MODEL=robrta-base"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 2 and "no recipes/glue/*/robrta-base-lora.yaml; MODEL and METHOD name" in done.stderr
    assert "toolkit sweep" not in done.stdout
    # GLUE_TASKS given empty: said as such (it was said as a pair with no recipe, of roberta-base-lora)
    done = subprocess.run(["make", "-n", "glue", "GLUE_TASKS="], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 2 and "make glue: GLUE_TASKS is empty; name the tasks" in done.stderr, done.stderr
    assert "toolkit sweep" not in done.stdout and done.stderr.count("\n") == 1


@pytest.mark.parametrize("variable, said", [
    ("METHODS=", "METHODS is empty; name the methods to compare"), ("METHODS= ", "METHODS is empty"),
    ("EPOCHS=3,10", "EPOCHS=3,10: one number of epochs, the one budget of every method"),
    ("EPOCHS=1 2", "EPOCHS=1 2: one number of epochs"),
    ("LR_GRID=x1, x3", "LR_GRID=x1, x3: one comma-separated list with no spaces"), ("LR_GRID=", "LR_GRID=: one")])
def test_make_compare_with_a_variable_it_cannot_take_is_one_line(variable: str, said: str) -> None:
    """`make compare METHODS=` said `sweep: no recipe given, e.g. toolkit sweep ...`, a command the
    user never typed; `EPOCHS=3,10` swept a grid of budgets and reported each method at its best on
    dev, exit 0 (EPOCHS is the one budget of every method); `EPOCHS="1 2"` said `recipe 2 does not
    exist`. Each is make's one line and exit 2 before anything runs."""
    import subprocess

    done = subprocess.run(["make", "-n", "compare", variable], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 2 and "toolkit sweep" not in done.stdout, done
    assert done.stderr.count("\n") == 1 and f"*** make compare: {said}" in done.stderr, done.stderr


@pytest.mark.parametrize("command", ["sweep", "validate"])
def test_a_recipe_whose_path_holds_an_equals_sign_is_a_recipe(tmp_path: Path, cli, command: str) -> None:
    """Beside recipes, `key=value` is an override (an axis for sweep); a recipe file whose path holds
    '=' (`grid/lr=1e-4/r.yaml`) was taken for one: `sweep` said "no recipe given" and `validate`
    checked every shipped recipe against a section 'grid/lr', 189 error lines. A word that names
    a file is the recipe; the overrides beside it still apply."""
    recipe = write_recipe(tmp_path / "grid" / "lr=1e-4" / "r.yaml",
                          "model: {checkpoint: bert-base-uncased}\ntask: {name: glue, subset: sst2}\n"
                          "method: {name: full}\ntrain: {lr: 1.0e-4}\n")
    if command == "sweep":
        code, out, err = cli("sweep", recipe, "train.lr=x1,x2", "--dry-run", "--runs-dir", tmp_path / "runs")
        assert code == 0 and "2 runs (dry run" in out and f"{recipe} train.lr=0.0002" in out, err
    else:
        code, out, err = cli("validate", recipe, "train.lr=2e-4")
        assert code == 0 and "1 of 1 recipes valid" in out, err
        code, out, err = cli("validate", recipe, "train.lr=-1")
        assert code == 2 and "0 of 1 recipes valid" in out and err.count("\n") == 1, err


# Every subcommand's argparse refusals, with what the one line must say: (argv, text in the line).
# {r} is a recipe, {run} a run folder, {new} a path not there (nothing is read: argparse refuses first).
ARGUMENT_ERRORS = {
    "run": [(["run"], "the following arguments are required: recipe ("),
            (["run", "{r}", "--output", "x"], "unrecognized arguments: --output x (--output is an option of toolkit predict;"),
            (["run", "{r}", "--stop-after", "x"], "argument --stop-after: expected a whole number, got 'x'"),
            (["run", "{r}", "--smoke", "lr"], "unrecognized arguments: lr; 'lr' is no override (key=value"),
            (["run", "{r}", "--train.lr=3e-4"], "; an override goes without the dashes: train.lr=3e-4 (")],
    "sweep": [(["sweep"], "the following arguments are required: RECIPE|key=v1,v2"),
              (["sweep", "{r}", "--resume"], "unrecognized arguments: --resume (--resume is an option of toolkit run;"),
              (["sweep", "{r}", "--seeds"], "argument --seeds: expected one argument"),
              (["sweep", "{r}", "--seed", "7"], "unrecognized arguments: --seed 7; did you mean --seeds? (")],
    "validate": [(["validate", "{r}", "--dry-run"], "unrecognized arguments: --dry-run (--dry-run is an option of "
                                                     "toolkit sweep;"),
                 (["validate", "{r}", "--smoke=yes"], "argument --smoke: ignored explicit argument 'yes'")],
    "ls": [(["ls", "recipe"], "argument what: invalid choice: 'recipe' (choose from"),
           (["ls", "recipes", "more"], "unrecognized arguments: more ("),
           (["ls", "--al"], "unrecognized arguments: --al ("),
           (["ls", "--version"], "unrecognized arguments: --version (--version is an option of toolkit itself "
                                 "(toolkit --version);")],
    "cp": [(["cp", "demo/sst2/minilm-lora"], "the following arguments are required: dest"),
           (["cp", "demo/sst2/minilm-lora", "{new}", "--merge"], "--merge is an option of toolkit export;")],
    "eval": [(["eval"], "the following arguments are required: run ("),
             (["eval", "{run}", "--smoke"], "--smoke is an option of toolkit run, toolkit sweep, toolkit validate;"),
             (["eval", "{run}", "--split"], "argument --split: expected one argument")],
    "predict": [(["predict"], "the following arguments are required: run"),
                (["predict", "{run}", "--inpt", "{r}"], "unrecognized arguments: --inpt {r}; did you mean --input?")],
    "export": [(["export", "{run}"], "the following arguments are required: out"),
               (["export", "{run}", "{new}", "--merged"], "unrecognized arguments: --merged; did you mean --merge?")],
    "report": [(["report"], "the following arguments are required: runs_dir"),
               (["report", "{run}", "--output", "{new}"], "; did you mean --out? (--output is an option of toolkit "
                                                          "predict;"),
               (["report", "{run}", "--rows", "task", "--metric"], "argument --metric: expected one argument"),
               (["report", "{run}", "--row", "task"], "unrecognized arguments: --row task; did you mean --rows? (")],
    "": [([], "toolkit: give a command: run, sweep, validate, ls, cp, eval, predict, export, report (toolkit --help"),
         (["runn", "{r}"], "toolkit: unknown command 'runn'; did you mean run? (the commands: run,")],
}


def test_every_subcommand_has_its_argument_errors_tested() -> None:
    from toolkit.cli import _subparsers, parser

    assert set(_subparsers(parser())) == set(ARGUMENT_ERRORS) - {""}


@pytest.mark.parametrize("argv, text", [case for cases in ARGUMENT_ERRORS.values() for case in cases],
                         ids=[f"{command or 'toolkit'}-{i}" for command, cases in ARGUMENT_ERRORS.items()
                              for i in range(len(cases))])
def test_an_argparse_refusal_is_one_line_naming_the_command_and_where_to_look(
        tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch, argv: list[str], text: str) -> None:
    """Rule: argparse's refusals (an unknown option, a missing argument, a bad choice or number) are
    user errors as any other: one line naming the subcommand, the problem and where to look, exit
    2, nothing written. They were argparse's usage block and then `toolkit: error: ...` (the
    top-level `toolkit` even for `toolkit sweep ... --resume`); an option of another subcommand
    (`sweep --resume`, `report --output`) or a near name of this one now says so."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TOOLKIT_RUNS", raising=False)
    names = {"r": str(ROOT / "recipes/demo/sst2/minilm-lora.yaml"), "run": "runs/some-run", "new": "out"}
    code, out, err = cli(*[a.format(**names) for a in argv])
    command = f"toolkit {argv[0]}: " if argv and "unknown command" not in text else "toolkit: "
    lines = err.splitlines()
    assert code == 2 and out == "" and len(lines) == 1 and lines[0].startswith(f"error: {command}"), err
    assert text.format(**names) in lines[0] and " --help " in lines[0], err
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_help_is_still_argparse_own(cli, capsys: pytest.CaptureFixture) -> None:
    from toolkit.cli import main

    with pytest.raises(SystemExit) as info:
        main(["sweep", "--help"])
    said = capsys.readouterr()
    assert info.value.code == 0 and said.out.startswith("usage: toolkit sweep ") and "--dry-run" in said.out


@pytest.mark.parametrize("target, args, text", [
    ("run", "--bogus", "error: toolkit run: unrecognized arguments: --bogus ("),
    ("glue", "--resume", "error: toolkit sweep: unrecognized arguments: --resume (--resume is an option of toolkit run;")])
def test_make_forwards_an_argparse_refusal_as_its_one_line(tmp_path: Path, target: str, args: str, text: str) -> None:
    """`make run ARGS=...` and `make glue ARGS=...` hand ARGS to the CLI: its refusal is the one line
    above make's own, and the target stops there (glue: before its report)."""
    import subprocess

    done = subprocess.run(["make", target, f"ARGS={args}", f"RUNS={tmp_path / 'runs'}", "MODEL=roberta-base"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    ours = [line for line in done.stderr.splitlines() if not line.startswith("make")]
    assert done.returncode == 2 and len(ours) == 1 and ours[0].startswith(text), done.stderr
    # no report ran (make's echo of the glue command names it, after the sweep's status check)
    assert "# Report" not in done.stdout and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("command", ["sweep", "validate", "report"])
def test_a_recipe_after_a_flag_is_a_recipe(tmp_path: Path, cli, command: str) -> None:
    """`toolkit sweep a.yaml --dry-run b.yaml`, `toolkit validate a.yaml --smoke b.yaml` and
    `toolkit report runs/a --no-plots runs/b`: the overrides after a flag were taken, the recipes
    and folders refused as unrecognized arguments (exit 2); they are the words the command takes,
    wherever the flags sit (an empty one refused as before the flags)."""
    first, second = (str(ROOT / f"recipes/demo/sst2/minilm-{m}.yaml") for m in ("lora", "full"))
    if command == "report":
        from test_report import fake_run

        for folder, task in (("a", "rte"), ("b", "mrpc")):
            fake_run(tmp_path / folder, task, "full", 42, {"accuracy": 0.7})
        code, out, err = cli("report", tmp_path / "a", "--no-plots", tmp_path / "b")
        assert code == 0 and "| glue/rte/tiny-full |" in out and "| glue/mrpc/tiny-full |" in out, err
        code, out, err = cli("report", tmp_path / "a", "--no-plots", "")
        assert code == 2 and err == "error: toolkit report: runs_dir: an empty path; give a file or a folder\n", err
        return
    if command == "sweep":
        code, out, err = cli("sweep", first, "--dry-run", second, "train.lr=x1,x2", "--runs-dir", tmp_path / "runs")
        assert code == 0 and "4 runs (dry run" in out and "minilm-full" in out, err
    else:
        code, out, err = cli("validate", first, "--smoke", second, "train.lr=2e-4")
        assert code == 0 and "2 of 2 recipes valid" in out, err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("rank", ["0", "1"])
def test_an_argparse_refusal_under_a_launch_is_said_once(cli, monkeypatch: pytest.MonkeyPatch, rank: str) -> None:
    """`make run NPROC=2 ARGS=--bogus`: every process of the launch refuses the same words; rank 0
    says it, the others exit 2 without a word (it was said once per process)."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", rank)
    code, out, err = cli("run", ROOT / "recipes/demo/sst2/minilm-lora.yaml", "--bogus")
    assert code == 2 and out == "" and len(err.splitlines()) == (rank == "0"), err


@pytest.mark.parametrize("argv, option", [
    (["run", "{r}", "--runs-dir", "train.lr=1e-4", "--smoke"], "--runs-dir"),
    (["sweep", "{r}", "--runs-dir", "method.r=4,8", "--dry-run"], "--runs-dir"),
    (["eval", "task.max_eval_samples=10"], "run"),
    (["predict", "{r}", "--output", "task.max_length=64"], "--output"),
    (["export", "{r}", "name=x"], "out"),
    (["report", "{r}", "--out", "train.seed=1"], "--out"),
], ids=["run", "sweep", "eval", "predict", "export", "report"])
def test_a_recipe_setting_where_a_path_goes_is_a_missing_value(tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch,
                                                               argv: list, option: str) -> None:
    """`toolkit run R --runs-dir $RUNS train.lr=1e-4` with RUNS unset ran at the recipe's own lr into
    a folder named `train.lr=1e-4`, exit 0: a recipe setting (section.key=value) as a path option's
    value, naming nothing, is one line saying the option's value is missing; nothing is written."""
    monkeypatch.chdir(tmp_path)
    recipe = str(ROOT / "recipes/demo/sst2/minilm-lora.yaml")
    words = [recipe if w == "{r}" else w for w in argv]
    setting = next(w for w in words if "=" in w)
    code, out, err = cli(*words)
    assert code == 2 and err.count("\n") == 1, err
    assert f"{option}: '{setting}' is a recipe setting (key=value), not a path: {option}'s own value is missing" in err
    assert list(tmp_path.iterdir()) == []
    (tmp_path / setting).mkdir()  # a folder of that name, there: a path
    from toolkit.cli import _given

    assert _given(option)(setting) == setting
