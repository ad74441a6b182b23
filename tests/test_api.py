"""The Python API (toolkit/api.py): the CLI's work as functions that return results and raise
UserError, on a user's own `text,label` CSV with string labels."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

import toolkit
from conftest import PYTHON, ROOT, write_recipe

REVIEWS = [("a wonderful, moving film", "pos"), ("dull and far too long", "neg"), ("I loved every minute", "pos"),
           ("a waste of an evening", "neg"), ("brilliant acting", "pos"), ("boring plot", "neg")] * 4


def _own_data(tmp_path: Path) -> Path:
    data = tmp_path / "reviews.csv"
    data.write_text("text,label\n" + "".join(f'"{t}",{l}\n' for t, l in REVIEWS))
    return write_recipe(tmp_path / "mine.yaml", f"""model: {{checkpoint: bert-base-uncased}}
task: {{name: text_classification, train_file: {data}, eval_file: {data}, max_length: 32}}
method: {{name: lora, r: 4}}
train: {{epochs: 1, lr: 1.0e-3, batch_size: 8}}
""")


def test_run_evaluate_predict_export_from_python(tmp_path: Path) -> None:
    recipe = _own_data(tmp_path)
    run = toolkit.run(recipe, ["train.epochs=2"], runs_dir=tmp_path / "runs", smoke=True)
    assert isinstance(run, toolkit.Run) and (run.dir / "metrics.json").is_file()
    assert run.metrics["eval"]["accuracy"] == json.loads((run.dir / "metrics.json").read_text())["eval"]["accuracy"]
    again = toolkit.run(recipe, ["train.epochs=2"], runs_dir=tmp_path / "runs", smoke=True)
    assert again.dir == run.dir  # finished: returned as it is
    # the same overrides as one string and as a mapping of Python values: the same run
    assert toolkit.run(recipe, "train.epochs=2", runs_dir=tmp_path / "runs", smoke=True).dir == run.dir
    assert toolkit.run(recipe, {"train.epochs": 2}, runs_dir=tmp_path / "runs", smoke=True).dir == run.dir
    (one,) = toolkit.predict(run, "a fine film")  # one text is one input; a Run is a path
    assert one["text"] == "a fine film" and one["label"] in ("neg", "pos")
    scored = toolkit.evaluate(run.dir)
    assert scored["eval"]["accuracy"] == pytest.approx(run.metrics["eval"]["accuracy"])
    preds = toolkit.predict(run.dir, ["a wonderful film", {"text": "boring"}])
    assert [set(p) >= {"text", "label", "score", "probabilities"} for p in preds] == [True, True]
    for p in preds:
        assert p["label"] in ("neg", "pos") and p["score"] == max(p["probabilities"].values())
    note = toolkit.export(run.dir, tmp_path / "export", merge=True)
    assert (tmp_path / "export" / "config.json").is_file() and isinstance(note, str)


def test_user_errors_raise_with_the_clis_line(tmp_path: Path, capsys) -> None:
    with pytest.raises(toolkit.UserError, match=r"recipe demo/sst2/minilm-lorra does not exist \(did you mean"):
        toolkit.run("demo/sst2/minilm-lorra", runs_dir=tmp_path / "runs")
    with pytest.raises(toolkit.UserError, match=r"train.learning_rate: unknown key \(transformers' learning_rate is train.lr\)"):
        toolkit.run("demo/sst2/minilm-lora", ["train.learning_rate=1e-4"], runs_dir=tmp_path / "runs")
    with pytest.raises(toolkit.UserError, match="no recipe.yaml here"):
        toolkit.evaluate(tmp_path)
    assert capsys.readouterr().err == ""  # nothing printed, no traceback
    assert not (tmp_path / "runs").exists()


def test_import_toolkit_stays_light() -> None:
    code = ("import sys, toolkit; print(sorted(m for m in ('torch', 'transformers', 'datasets', 'peft', "
            "'accelerate') if m in sys.modules)); print(callable(toolkit.report), callable(toolkit.sweep))")
    out = subprocess.run([PYTHON, "-c", code + "; import toolkit.cli; print(callable(toolkit.report))"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["[]", "True", "True", "True"]


def test_own_files_in_two_arguments(tmp_path: Path) -> None:
    """The shipped own-data recipe on a user's `text,label` CSV: nothing but the two files."""
    data = tmp_path / "reviews.csv"
    data.write_text("text,label\n" + "".join(f'"{t}",{l}\n' for t, l in REVIEWS))
    run = toolkit.run("demo/own-data/minilm-lora", [f"task.train_file={data}", f"task.eval_file={data}"],
                      runs_dir=tmp_path / "runs", smoke=True)
    assert run.metrics["label_names"] == ["neg", "pos"] and run.metrics["text_columns"] == ["text"]
    (pred,) = toolkit.predict(run.dir, ["a moving film"])
    assert pred["label"] in ("neg", "pos") and set(pred["probabilities"]) == {"neg", "pos"}


# --- Python values in, by rule: every public function x every argument kind -------------------
import collections.abc  # noqa: E402
import inspect  # noqa: E402
import typing  # noqa: E402

from toolkit import api, arguments  # noqa: E402

PUBLIC = {name: getattr(toolkit, name) for name in toolkit.__all__ if name != "UserError"}
PUBLIC.update({name: getattr(api, name) for name in api.__all__})
PARAMETERS = [(name, p) for name, fn in sorted(PUBLIC.items())
              for p in inspect.signature(fn).parameters if p not in ("self", "args", "kwargs")]


def _hints(fn) -> dict:
    return typing.get_type_hints(fn.__init__ if inspect.isclass(fn) else getattr(fn, "__wrapped__", fn))


def _sample(tp) -> object:
    """A value of the right type (any: the types are checked before anything is done)."""
    for value in (None, "x", [], False, 1, Path("x")):
        if arguments.conform(value, tp, "sample") is not arguments._MISMATCH:
            return value
    raise AssertionError(tp)


def _iterables(tp) -> bool:
    """A list goes here, and a string is not a value of its own (sweep's seeds: "42,43" is)."""
    options = typing.get_args(tp) if typing.get_origin(tp) is typing.Union else (tp,)
    return str not in options and any(typing.get_origin(o) in (collections.abc.Iterable, list) for o in options)


def test_every_public_function_declares_and_checks_its_types() -> None:
    """Each function of toolkit.api that is not private is in __all__ (so walked below) and
    checked by @typed; every parameter has a type."""
    own = {n for n, f in vars(api).items() if inspect.isfunction(f) and f.__module__ == api.__name__
           and not n.startswith("_")}
    assert own - {"override_list"} <= set(api.__all__)
    for name, fn in PUBLIC.items():
        assert inspect.isclass(fn) or hasattr(fn, "__wrapped__"), f"{name} is not @typed"
        hints = _hints(fn)
        missing = [p for p in inspect.signature(fn).parameters if p not in hints and p != "self"]
        assert not missing, f"{name}: untyped {missing}"


@pytest.mark.parametrize("name,param", PARAMETERS, ids=[f"{n}-{p}" for n, p in PARAMETERS])
def test_a_wrong_type_is_one_line_naming_the_argument(name: str, param: str) -> None:
    fn = PUBLIC[name]
    hints = _hints(fn)
    values = {p: _sample(hints[p]) for p, spec in inspect.signature(fn).parameters.items()
              if spec.default is inspect.Parameter.empty}
    values[param] = object()
    with pytest.raises(toolkit.UserError, match=rf"^{name}: {param}: expected .+, got object"):
        fn(**values)


@pytest.mark.parametrize("name,param", [(n, p) for n, p in PARAMETERS if _iterables(_hints(PUBLIC[n])[p])])
def test_a_string_where_a_list_goes_is_one_item(name: str, param: str) -> None:
    tp = _hints(PUBLIC[name])[param]
    assert arguments.check("train.lr=1e-4", tp, param) == ["train.lr=1e-4"]
    assert arguments.check(iter(["a", "b"]), tp, param) == ["a", "b"]  # a generator: read once
    with pytest.raises(toolkit.UserError, match=rf"^{param}\[1\]: expected"):
        arguments.check(["a", 3.5], tp, param)


def test_overrides_are_a_mapping_or_key_value_strings(tmp_path: Path) -> None:
    assert api.override_list({"task.labels": ["no", "yes"], "train.lr": 1e-4, "x.path": tmp_path}) == \
        ['task.labels=["no", "yes"]', "train.lr=0.0001", f'x.path="{tmp_path}"']
    with pytest.raises(toolkit.UserError, match=r"^run: overrides: expected a mapping \(dict\) or a list of "
                       r"strings or None, got int 3"):
        toolkit.run("demo/sst2/minilm-lora", 3)
    with pytest.raises(toolkit.UserError, match=r"overrides\['train.lr'\]: expected a string, number"):
        toolkit.run("demo/sst2/minilm-lora", {"train.lr": object()}, runs_dir=tmp_path / "runs")
    # a NaN or an infinity was 'expected a string, number, ...' (it is a number: not a finite one)
    with pytest.raises(toolkit.UserError, match=r"^overrides\['train.lr'\]: inf is not a finite number$"):
        toolkit.run("demo/sst2/minilm-lora", {"train.lr": float("inf")}, runs_dir=tmp_path / "runs")
    with pytest.raises(toolkit.UserError, match=r"overrides\['train.length_buckets'\]: \[64, nan\] holds a number "
                       r"that is not a finite number"):
        toolkit.validate("demo/sst2/minilm-lora", {"train.length_buckets": [64, float("nan")]})
    with pytest.raises(toolkit.UserError, match=r"train.epochs: expected float, got str"):
        toolkit.run("demo/sst2/minilm-lora", {"train.epochs": "one"}, runs_dir=tmp_path / "runs")
    assert not (tmp_path / "runs").exists()


def test_damaged_metrics_is_a_user_error(tmp_path: Path) -> None:
    (tmp_path / "metrics.json").write_text('{"eval": {"accuracy": 0.9')
    with pytest.raises(toolkit.UserError, match=r"metrics.json: damaged \(.+\); run the recipe again"):
        toolkit.Run(tmp_path).metrics
    (tmp_path / "metrics.json").write_text("[1, 2]")
    with pytest.raises(toolkit.UserError, match=r"metrics.json: damaged \(not a JSON object\)"):
        toolkit.Run(str(tmp_path)).metrics
    assert toolkit.Run(tmp_path / "nothing").metrics == {}


# what `run` refuses before anything loads, each from another check: the recipe, a data file, a
# file's head, the accelerate settings of the environment
REFUSALS = [({}, ["train.lrr=1e-4"], "train.lrr: unknown key"),
            ({}, ["task.train_file=/nonexistent/t.csv"], "task.train_file: /nonexistent/t.csv does not exist"),
            ({}, ["task.label_column=kind"], "column 'kind' is missing"),
            ({"ACCELERATE_MIXED_PRECISION": "bf16"}, [], "ACCELERATE_MIXED_PRECISION=bf16")]


@pytest.mark.parametrize("env, overrides, said", REFUSALS, ids=[r[2] for r in REFUSALS])
def test_validate_refuses_what_run_refuses_at_every_entry_point(tmp_path: Path, cli, monkeypatch, env: dict,
                                                                 overrides: list[str], said: str) -> None:
    """The README names `validate` among the API's functions, and there was none: a notebook
    could not check a recipe before running it. `toolkit.validate`, `toolkit validate` (with
    `--smoke` as `run --smoke` checks) and both `run`s go through one check (`api._checked`):
    the same line, and nothing written."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    recipe = "demo/own-data/minilm-lora"
    runs = tmp_path / "runs"
    lines = []
    for smoke in ([], ["--smoke"]):
        for command in (["run", recipe, *overrides, *smoke, "--runs-dir", runs], ["validate", recipe, *overrides, *smoke]):
            code, _, err = cli(*command)
            assert code == 2 and err.count("\n") == 1 and said in err, (command, err)
            lines.append(re.sub(r"^\S+minilm-lora\.yaml: ", "", err.strip().removeprefix("error: ")))  # validate names the file
        for call in (toolkit.run, toolkit.validate):
            with pytest.raises(toolkit.UserError) as caught:
                call(recipe, overrides, **({"runs_dir": runs} if call is toolkit.run else {}), smoke=bool(smoke))
            lines.append(str(caught.value))
    assert len(set(lines)) == 1, lines
    assert not runs.exists()


def test_validate_returns_the_recipe_the_run_saves(cli) -> None:
    """`toolkit.validate` gives the resolved recipe, as the run's recipe.yaml holds it; --smoke
    the smoke-sized one."""
    from toolkit import recipe as recipes

    path = recipes.find_recipe("demo/sst2/minilm-lora")
    for smoke in (False, True):
        want = recipes.load(path, ["method.r=4"], smoke=smoke)
        got = toolkit.validate("demo/sst2/minilm-lora", {"method.r": 4}, smoke=smoke)
        assert got == {"name": want.name, **want.to_dict()}
    assert toolkit.validate(path)["method"]["r"] == 8
    code, out, _ = cli("validate", "demo/sst2/minilm-lora", "method.r=4", "--smoke")
    assert code == 0 and "1 of 1 recipes valid" in out


# Each CLI option (its dest) as the API function names it; None: the CLI's alone, as docs/cli.md says.
CLI_AS_API = {
    "run": ("run", {"recipe": "recipe", "overrides": "overrides", "smoke": "smoke", "resume": "resume",
                    "force": "force", "runs_dir": "runs_dir", "stop_after": "stop_after"}),
    "sweep": ("sweep", {"overrides": "recipes", "seeds": "seeds", "smoke": "smoke", "force": "force",
                        "runs_dir": "runs_dir", "keep_going": "keep_going", "dry_run": None, "estimate": None,
                        "report": None}),
    "validate": ("validate", {"recipes": "recipe", "smoke": "smoke"}),
    "eval": ("evaluate", {"run": "run_dir", "overrides": "overrides", "split": "split", "task_from": "task_from"}),
    "predict": ("predict", {"run": "run_dir", "input": None, "output": None, "glue_test": None}),
    "export": ("export", {"run": "run_dir", "out": "out", "merge": "merge", "push_to_hub": None}),
    "report": ("report", {"runs_dir": "runs_dir", "rows": "row_key", "cols": "col_key", "metric": "metrics",
                          "glue": "glue", "out": "out", "no_plots": "plots"}),
}


@pytest.mark.parametrize("command", sorted(CLI_AS_API))
def test_the_api_takes_the_cli_arguments_but_those_docs_name_as_the_cli_alone(command: str) -> None:
    """docs/cli.md: the Python API takes the CLI's arguments, but for the ones it names. `toolkit.run`
    had no `stop_after` (`toolkit run --stop-after N`); a new option on either side fails here."""
    import argparse

    from toolkit.cli import _subparsers, parser

    name, mapping = CLI_AS_API[command]
    dests = {a.dest for a in _subparsers(parser())[command]._actions
             if not isinstance(a, argparse._HelpAction) and a.dest != "verbose"}
    assert dests == set(mapping), (command, dests ^ set(mapping))
    params = set(inspect.signature(getattr(toolkit, name)).parameters)
    assert {v for v in mapping.values() if v} <= params, (name, {v for v in mapping.values() if v} - params)
    text = (ROOT / "docs/cli.md").read_text().split("\n\n")[1]  # the paragraph on the API
    for dest in (d for d, v in mapping.items() if v is None):
        assert f"--{dest.replace('_', '-')}" in text, (command, dest)


def _flat_eval_recipe(tmp_path: Path) -> Path:
    """A regression recipe whose eval labels do not vary: its Pearson is undefined (null)."""
    (tmp_path / "train.csv").write_text("text,label\ngood film,1.0\nbad film,2.0\nok film,3.0\ngreat,4.0\n")
    (tmp_path / "eval.csv").write_text("text,label\nfine film,2.0\nfine too,2.0\n")
    return write_recipe(tmp_path / "flat.yaml", f"""model: {{checkpoint: sentence-transformers/all-MiniLM-L6-v2}}
task: {{name: text_classification, train_file: {tmp_path / 'train.csv'}, eval_file: {tmp_path / 'eval.csv'},
        problem: regression, max_length: 16}}
method: {{name: lora, r: 4}}
train: {{max_steps: 1, lr: 1.0e-3, batch_size: 2}}
""")


@pytest.mark.parametrize("second", ["run", "evaluate"])
def test_each_call_says_its_own_warnings(tmp_path: Path, capsys, second: str) -> None:
    """Rule: a call in a process that ran others says what the same call says in a fresh one. A
    score the data leaves undefined (Pearson of labels that do not vary: recorded as null) was
    warned about once per process: a second `toolkit.run` (another seed) or a `toolkit.evaluate`
    after the run recorded null in silence, exit 0."""
    recipe = _flat_eval_recipe(tmp_path)
    said = "warning: pearson is undefined (labels do not vary over 2 example(s)); recorded as null"
    run = toolkit.run(recipe, runs_dir=tmp_path / "runs", smoke=True)
    assert said in capsys.readouterr().err
    if second == "run":
        again = toolkit.run(recipe, {"train.seed": 7}, runs_dir=tmp_path / "runs", smoke=True)
        assert again.metrics["eval"]["pearson"] is None
    else:
        assert toolkit.evaluate(run)["eval"]["pearson"] is None
    assert said in capsys.readouterr().err


def test_a_run_resumed_after_an_undefined_score_finishes_as_the_whole_run(tmp_path: Path, capsys, monkeypatch) -> None:
    """Rule: a value the loop kept through a checkpoint is read back as the loop held it. A score the
    data leaves undefined is NaN in the loop and null in trainer_state.json; a run stopped after its
    last evaluation (killed while finishing) read that null back as None, wrote metrics.json, then
    its final line's `{v:.4f}` was a TypeError traceback (exit 1) for a finished run."""
    from toolkit import run_metrics

    recipe = _flat_eval_recipe(tmp_path)
    whole = toolkit.run(recipe, runs_dir=tmp_path / "whole", smoke=True)
    with monkeypatch.context() as m:  # killed while finishing: the last checkpoint holds the evaluation
        m.setattr(run_metrics, "build", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
        with pytest.raises(KeyboardInterrupt):  # toolkit.errors.Interrupted
            toolkit.run(recipe, runs_dir=tmp_path / "parts", smoke=True)
    capsys.readouterr()
    resumed = toolkit.run(recipe, runs_dir=tmp_path / "parts", smoke=True)
    out = capsys.readouterr().out
    assert f"{resumed.dir}: pearson=nan, spearmanr=nan, loss=" in out
    assert resumed.metrics["eval"] == whole.metrics["eval"] and resumed.metrics["eval"]["pearson"] is None


@pytest.mark.parametrize("entry", ["run", "sweep", "Run"])
def test_a_run_names_its_folder_wherever_the_caller_goes_next(tmp_path: Path, monkeypatch, entry: str) -> None:
    """Rule: a Run the API returns names the folder it was made for, whatever the caller's working
    folder is later. With a relative runs_dir, a notebook's `%cd` after `toolkit.run` made
    `run.metrics` {} (a finished run read as not finished) and predict "no recipe.yaml here", exit 0."""
    (tmp_path / "here").mkdir()
    (tmp_path / "there").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    args = ("demo/sst2/minilm-lora", ["train.max_steps=1"])
    if entry == "sweep":
        (run,) = toolkit.sweep([args[0]], args[1], runs_dir="runs", smoke=True)
    else:
        run = toolkit.run(*args, runs_dir="runs", smoke=True)
        run = toolkit.Run(run.dir.relative_to(Path.cwd())) if entry == "Run" else run
    monkeypatch.chdir(tmp_path / "there")
    assert run.dir == tmp_path / "here" / run.dir.relative_to(tmp_path / "here")
    assert run.metrics["eval"]["accuracy"] is not None
    assert toolkit.predict(run, ["a fine film"])[0]["label"] in ("negative", "positive")
