"""A finished run's folder as the entry points after training read and write it (eval, predict,
--glue-test, export; CLI and API): they hold the run's lock (shared), so a --force rerun or a
resume of the run is one line either way round; the run's recipe.yaml must be the one it was
made with; eval says what encoding found; a resume needs the run's log of the steps before."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

import toolkit
from toolkit import runs

SHORT = ["task.max_train_samples=16", "task.max_eval_samples=8", "train.max_steps=2"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A --smoke GLUE (SST-2) LoRA run of two steps, shared by every test here (kept as made)."""
    return toolkit.run("demo/sst2/minilm-lora", SHORT, runs_dir=tmp_path_factory.mktemp("runs"), smoke=True).dir


@pytest.fixture
def run_copy(trained: Path, tmp_path: Path) -> Path:
    """A copy of the shared run, at the same depth (runs/<recipe>/<id>), to edit."""
    copy = tmp_path / "runs" / trained.parent.name / trained.name
    shutil.copytree(trained, copy)
    return copy


def _inputs(tmp_path: Path) -> Path:
    source = tmp_path / "in.txt"
    source.write_text("a fine film\nsomething dull\n")
    return source


# every entry point that reads or writes a finished run: (name, call(run, tmp) -> None, what it writes)
ENTRY_POINTS = {
    "cli eval": (lambda cli, run, tmp: _cli(cli, "eval", run), lambda run, tmp: run / "eval-eval.json"),
    "api evaluate": (lambda cli, run, tmp: toolkit.evaluate(run), lambda run, tmp: run / "eval-eval.json"),
    "cli predict": (lambda cli, run, tmp: _cli(cli, "predict", run, "--input", _inputs(tmp), "--output", tmp / "p.jsonl"),
                    lambda run, tmp: tmp / "p.jsonl"),
    "api predict": (lambda cli, run, tmp: toolkit.predict(run, ["a fine film"]), None),
    "cli glue-test": (lambda cli, run, tmp: _cli(cli, "predict", run, "--glue-test"), lambda run, tmp: run / "glue-test"),
    "cli export": (lambda cli, run, tmp: _cli(cli, "export", run, tmp / "out"), lambda run, tmp: tmp / "out"),
    "api export": (lambda cli, run, tmp: toolkit.export(run, tmp / "out"), lambda run, tmp: tmp / "out"),
}


def _cli(cli, *args) -> None:
    code, _, err = cli(*args)
    if code:
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        raise toolkit.UserError(err.strip().removeprefix("error: "))


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_an_entry_point_after_training_refuses_while_the_run_is_trained(run_copy: Path, tmp_path: Path, cli,
                                                                        entry: str) -> None:
    """`toolkit eval RUN` during a `--force` rerun (or a resume) of the same run scored the old model
    and wrote eval-eval.json into the folder being cleared and trained, exit 0; predict and export
    read a model/ the rerun was replacing. Each now refuses in one line, writing nothing."""
    call, written = ENTRY_POINTS[entry]
    (run_copy / "eval-eval.json").unlink(missing_ok=True)
    with runs.locked(run_copy, folder=True):  # what `toolkit run --force` holds while it trains
        with pytest.raises(toolkit.UserError, match=r"is being trained by process \d+ right now .*; .* once that has finished"):
            call(cli, run_copy, tmp_path)
    assert written is None or not written(run_copy, tmp_path).exists()
    call(cli, run_copy, tmp_path)  # once it has finished, the same call works
    assert written is None or written(run_copy, tmp_path).exists()


def test_a_rerun_is_refused_while_an_entry_point_reads_the_run(trained: Path, cli) -> None:
    """The other way round: `run --force` while an eval (or two) reads the run is one line naming it."""
    root = trained.parent.parent.parent.parent
    with runs.reading(trained, "evaluate"), runs.reading(trained, "export"):  # readers go side by side
        code, _, err = cli("run", "demo/sst2/minilm-lora", *SHORT, "--smoke", "--force", "--runs-dir", root)
    assert code == 2 and re.search(r"is being run by process \d+ \((evaluate|export) of the finished run\)", err), err
    assert (trained / "metrics.json").is_file() and (trained / "model").is_dir()


# the readers of a folder of runs: a run's recipe.yaml says its row, seed group and setting
REPORTS = {"cli report": lambda cli, root: _cli(cli, "report", root, "--no-plots"),
           "api report": lambda cli, root: toolkit.report([root])}


@pytest.mark.parametrize("entry", REPORTS)
@pytest.mark.parametrize("edit", [(r"seed: \d+", "seed: 7"), (r"name: lora", "name: ia3"), (r"lr: \S+", "lr: 0.5")],
                         ids=["seed", "method", "lr"])
def test_a_report_refuses_a_run_recipe_edited_after_the_run(run_copy: Path, cli, entry: str, edit: tuple) -> None:
    """`toolkit report` read recipe.yaml as written: a run whose seed, method or lr was edited by
    hand was reported as another seed, in another row or grid point, exit 0 (eval, predict and
    export refused it). The same one line as theirs, and no report.md."""
    root = run_copy.parent.parent
    text = (run_copy / "recipe.yaml").read_text()
    edited = re.sub(edit[0], edit[1], text, count=1)
    assert edited != text
    (run_copy / "recipe.yaml").write_text(edited)
    with pytest.raises(toolkit.UserError, match=r"recipe.yaml: not the recipe this run was made with .*put it back"):
        REPORTS[entry](cli, root)
    assert not (root / "report.md").exists()
    (run_copy / "recipe.yaml").write_text(text)
    REPORTS[entry](cli, root)  # as the run wrote it: reported
    assert (root / "report.md").is_file()


@pytest.mark.parametrize("entry", [*REPORTS, "api evaluate", "cli predict"])
def test_a_run_from_before_a_field_was_added_is_taken_and_judged_as_written(run_copy: Path, tmp_path: Path, cli,
                                                                           entry: str) -> None:
    """A run made before train.skip_nonfinite existed: its recipe.yaml lacks the field and its
    recipe_hash covers the fields it had. Built now, the field's default changed the hash, so
    the unedited run was refused as edited, by the report and by eval, predict and export alike.
    Judged as written, it is taken; edited as well, it is still one line."""
    from toolkit.recipe_data import Recipe

    text = (run_copy / "recipe.yaml").read_text()
    old = re.sub(r"\n  skip_nonfinite: 0", "", text)
    assert old != text
    raw = yaml.safe_load(old)
    metrics = json.loads((run_copy / "metrics.json").read_text())
    metrics["recipe_hash"] = Recipe.digest({k: v for k, v in raw.items() if k != "name"})
    (run_copy / "metrics.json").write_text(json.dumps(metrics))
    call = REPORTS.get(entry) or (lambda cli, root: ENTRY_POINTS[entry][0](cli, run_copy, tmp_path))
    for recipe, taken in ((old, True), (re.sub(r"lr: \S+", "lr: 0.5", old, count=1), False)):
        (run_copy / "recipe.yaml").write_text(recipe)
        if taken:
            call(cli, run_copy.parent.parent)
        else:
            with pytest.raises(toolkit.UserError, match=r"recipe.yaml: not the recipe this run was made with"):
                call(cli, run_copy.parent.parent)


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_a_run_recipe_edited_after_the_run_is_one_line(run_copy: Path, tmp_path: Path, cli, entry: str) -> None:
    """recipe.yaml edited by hand after the run (here max_length) was read as written: eval scored
    another setting and wrote it as the run's score, predict and export read the model under it,
    exit 0. It must hash as metrics.json's recipe_hash, else one line saying what would be right."""
    call, written = ENTRY_POINTS[entry]
    (run_copy / "eval-eval.json").unlink(missing_ok=True)
    text = (run_copy / "recipe.yaml").read_text()
    edited = re.sub(r"max_length: \d+", "max_length: 16", text)
    assert edited != text
    (run_copy / "recipe.yaml").write_text(edited)
    with pytest.raises(toolkit.UserError, match=r"recipe.yaml: not the recipe this run was made with .*put it back"):
        call(cli, run_copy, tmp_path)
    assert written is None or not written(run_copy, tmp_path).exists()


# every entry point after training that writes files: (call(cli, run, tmp), the folder it writes in)
WRITERS = {
    "cli eval": (ENTRY_POINTS["cli eval"][0], lambda run, tmp: run),
    "api evaluate": (ENTRY_POINTS["api evaluate"][0], lambda run, tmp: run),
    "cli predict --output": (lambda cli, run, tmp: _cli(cli, "predict", run, "--input", _inputs(tmp), "--output",
                                                         tmp / "ro" / "p.jsonl"), lambda run, tmp: tmp / "ro"),
    "cli glue-test": (ENTRY_POINTS["cli glue-test"][0], lambda run, tmp: run),
    "cli glue-test --output": (lambda cli, run, tmp: _cli(cli, "predict", run, "--glue-test", "--output",
                                                           tmp / "ro" / "sub"), lambda run, tmp: tmp / "ro"),
    "cli glue-test --output new/new": (lambda cli, run, tmp: _cli(cli, "predict", run, "--glue-test", "--output",
                                                                   tmp / "ro" / "a" / "sub"), lambda run, tmp: tmp / "ro"),
    "cli export": (lambda cli, run, tmp: _cli(cli, "export", run, tmp / "ro" / "out"), lambda run, tmp: tmp / "ro"),
    "api export": (lambda cli, run, tmp: toolkit.export(run, tmp / "ro" / "out"), lambda run, tmp: tmp / "ro"),
}


@pytest.mark.parametrize("entry", WRITERS)
def test_a_place_an_entry_point_cannot_write_is_one_line_before_the_model_loads(
        run_copy: Path, tmp_path: Path, cli, entry: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A shared, read-only runs folder (or an --output there): `predict --glue-test` (its default
    RUN/glue-test, or --output DIR) loaded the model and predicted every test set, then failed
    making the folder, the predictions lost. Every writer says it in one line before the model
    loads, and writes nothing."""
    import os

    from toolkit import inference

    call, place = WRITERS[entry]
    ro = place(run_copy, tmp_path)
    ro.mkdir(exist_ok=True)
    before = sorted(p.name for p in ro.iterdir())
    real = os.access  # what a read-only folder answers (as root, chmod alone does not stop writes)
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if Path(p) == ro else real(p, mode, **kw))

    def loaded(*args, **kwargs):
        raise AssertionError("the model was loaded before the place it writes was checked")

    monkeypatch.setattr(inference, "load_model", loaded)
    with pytest.raises(toolkit.UserError, match=rf"{re.escape(str(ro))}.*(not writable|cannot be written|permission denied)"):
        call(cli, run_copy, tmp_path)
    assert sorted(p.name for p in ro.iterdir()) == before  # nothing written there


@pytest.fixture(scope="module")
def qa_run(tmp_path_factory: pytest.TempPathFactory, squad_sample: Path) -> Path:
    """A --smoke extractive QA run (its eval writes predictions-eval.jsonl beside eval-eval.json)."""
    return toolkit.run("squad/v1.1/minilm-full", [*SHORT, f"task.eval_file={squad_sample}"],
                       runs_dir=tmp_path_factory.mktemp("qa"), smoke=True).dir


@pytest.mark.parametrize("entry", ["cli eval", "api evaluate"])
def test_an_eval_the_disk_cannot_hold_leaves_the_eval_before_whole(qa_run: Path, tmp_path: Path, cli, entry: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk at eval-<split>.json left this eval's predictions-<split>.jsonl beside the
    scores of the eval before (here of 4 examples, the predictions of 8), a pair that is no one
    eval. Its files are written all or none (runs.write_all_whole), and nothing partial stays."""
    import errno

    run_copy = tmp_path / "runs" / qa_run.parent.name / qa_run.name
    shutil.copytree(qa_run, run_copy)

    def evaluate(samples: int) -> None:
        if entry == "cli eval":
            _cli(cli, "eval", run_copy, f"task.max_eval_samples={samples}")
        else:
            toolkit.evaluate(run_copy, overrides=[f"task.max_eval_samples={samples}"])

    def scored() -> dict[str, str]:
        return {p.name: p.read_text() for p in run_copy.iterdir() if p.name.startswith(("eval-", "predictions-"))}

    evaluate(4)
    before = scored()
    assert {"eval-eval.json", "predictions-eval.jsonl"} <= set(before), before
    real = Path.write_bytes

    def full_at_the_scores(self, data):
        if self.name.startswith("eval-eval.json"):
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", full_at_the_scores)
    with pytest.raises(toolkit.UserError, match="no space left"):
        evaluate(8)
    monkeypatch.undo()
    assert scored() == before
    assert not [p for p in run_copy.iterdir() if p.name.endswith(".tmp")]


def _make_run(cli, root: Path) -> None:
    import os
    import subprocess
    import sys

    args = " ".join([*SHORT, "--smoke", "--runs-dir", str(root)])
    done = subprocess.run(["make", "run", "RECIPE=demo/sst2/minilm-lora", f"ARGS={args}",
                           f"VENV={Path(sys.executable).parent.parent}"], cwd=Path(__file__).parent.parent,
                          capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items() if "MAKE" not in k})
    err = [line for line in done.stderr.splitlines() if not line.startswith("make:")]
    if done.returncode:
        assert done.returncode == 2 and len(err) == 1 and err[0].startswith("error: "), done
        raise toolkit.UserError(err[0].removeprefix("error: "))
    assert "is finished already" in done.stdout, done


# every entry point that launches a recipe and skips it when finished: call(cli, runs folder)
LAUNCHES = {
    "cli run": lambda cli, root: _cli(cli, "run", "demo/sst2/minilm-lora", *SHORT, "--smoke", "--runs-dir", root),
    "api run": lambda cli, root: toolkit.run("demo/sst2/minilm-lora", SHORT, runs_dir=root, smoke=True),
    "cli sweep": lambda cli, root: _cli(cli, "sweep", "demo/sst2/minilm-lora", *SHORT, "--smoke", "--runs-dir", root),
    "cli sweep --dry-run": lambda cli, root: _cli(cli, "sweep", "demo/sst2/minilm-lora", *SHORT, "--smoke",
                                                  "--dry-run", "--runs-dir", root),
    "api sweep": lambda cli, root: toolkit.sweep(["demo/sst2/minilm-lora"], SHORT, runs_dir=root, smoke=True),
    "make run": _make_run,
}


@pytest.mark.parametrize("entry", LAUNCHES)
@pytest.mark.parametrize("edit", ["edited", "gone", "model gone", "another run's folder", "unedited"])
def test_a_finished_run_is_skipped_only_with_the_recipe_it_was_made_with(trained: Path, tmp_path: Path, cli,
                                                                         entry: str, edit: str) -> None:
    """Rule: a finished run is finished as made. Its recipe.yaml edited (or removed) after the run,
    its model/ removed, or another finished run's folder renamed or copied onto its id (that run's
    metrics stood for this one), `run` and `sweep` still skipped it as finished, exit 0, over a folder
    that eval, predict and report then refused; now every launch says so in one line, exit 2,
    before anything loads, the folder as it was (--force trains it again). The unedited run is
    still finished already."""
    root = tmp_path / "runs"
    run = Path(shutil.copytree(trained, root / "demo/sst2/minilm-lora" / trained.name))
    text = (run / "recipe.yaml").read_text()
    if edit == "edited":
        (run / "recipe.yaml").write_text(re.sub(r"seed: \d+", "seed: 7", text, count=1))
    elif edit == "gone":
        (run / "recipe.yaml").unlink()
    elif edit == "model gone":  # the run's result itself
        shutil.rmtree(run / "model")
    elif edit == "another run's folder":  # a finished run's folder renamed or copied onto this run's id
        metrics = json.loads((run / "metrics.json").read_text())
        (run / "metrics.json").write_text(json.dumps({**metrics, "run_id": "0123456789ab"}))
    before = {p: p.read_bytes() if p.is_file() else None for p in root.rglob("*")}
    if edit == "unedited":
        LAUNCHES[entry](cli, root)
    else:
        said = {"edited": "recipe.yaml: not the recipe this run was made with", "gone": "recipe.yaml: the finished run's "
                "recipe is gone", "model gone": "model: the finished run's model is gone",
                "another run's folder": f"{run.name}: this folder holds the finished run 0123456789ab \\(metrics.json "
                "run_id\\), not run"}[edit]
        with pytest.raises(toolkit.UserError, match=rf"{said}.*put it back .*--force"):
            LAUNCHES[entry](cli, root)
    assert {p: p.read_bytes() if p.is_file() else None for p in root.rglob("*")} == before


def _flip_a_weight(model: Path) -> None:
    path = model / "adapter_model.safetensors"
    data = bytearray(path.read_bytes())
    data[-3] ^= 1  # a weight's byte: the size, the header and every other file as saved
    path.write_bytes(bytes(data))


MODEL_CHANGES = {"weights gone": lambda model: (model / "adapter_model.safetensors").unlink(),
                 "weights changed": _flip_a_weight,
                 "file added": lambda model: shutil.copy(model / "adapter_model.safetensors", model / "model.safetensors")}


@pytest.mark.parametrize("entry", [*ENTRY_POINTS, *LAUNCHES])
@pytest.mark.parametrize("change", MODEL_CHANGES)
def test_a_finished_runs_model_changed_since_the_run_is_one_line(trained: Path, tmp_path: Path, cli, entry: str,
                                                                 change: str) -> None:
    """Rule: a finished run's result is model/ as the run saved it (metrics.json model_files: each
    file's size and sha256). A weight file removed was a HFValidationError traceback from eval,
    predict and export (PEFT looked for it on the Hub) and "finished already" from run and sweep;
    one replaced or added (another run's weights) was scored, predicted and exported as this
    run's, exit 0. Now one line naming the file, at every entry point, nothing written; a copy of
    the folder (new file times, the same bytes) is the run as saved."""
    root = tmp_path / "runs"
    run = Path(shutil.copytree(trained, root / "demo/sst2/minilm-lora" / trained.name))
    (run / "eval-eval.json").unlink(missing_ok=True)
    MODEL_CHANGES[change](run / "model")
    said = {"weights gone": "adapter_model.safetensors is gone", "weights changed": "adapter_model.safetensors "
            "changed since the run saved it", "file added": "model.safetensors was added since the run"}[change]
    with pytest.raises(toolkit.UserError, match=rf"model/{said}: the (finished )?run's model is not as the run saved it"):
        if entry in LAUNCHES:
            LAUNCHES[entry](cli, root)
        else:
            ENTRY_POINTS[entry][0](cli, run, tmp_path)
    written = ENTRY_POINTS.get(entry, (None, None))[1]
    assert written is None or not written(run, tmp_path).exists()


@pytest.mark.parametrize("entry", ["cli eval", "api evaluate"])
@pytest.mark.parametrize("setting", ["task.max_target_length=20", "task.generation.max_new_tokens=50",
                                     "task={max_target_length: 20}"])
def test_eval_of_a_smoke_run_refuses_a_setting_the_run_never_reads(tmp_path: Path, cli, entry: str,
                                                                   setting: str) -> None:
    """Rule: a setting the run never reads is refused unless at its default, a --smoke run's too;
    only the size --smoke itself gives a setting (max_target_length 32, max_new_tokens 16) is let
    through. Any value of a key --smoke sizes was: `toolkit eval SMOKE-RUN task.max_target_length=20`
    of an extractive QA run scored without it and wrote it into eval-eval.json as the setting
    used, exit 0, where the same eval of a run made without --smoke refuses it."""
    from toolkit import recipe as recipes

    made = recipes.plan(recipes.find_recipe("squad/v1.1/minilm-full"), smoke=True).recipe
    run = tmp_path / "runs" / made.name / "0123456789ab"  # its recipe.yaml and metrics.json: all this reads
    run.mkdir(parents=True)
    (run / "recipe.yaml").write_text(recipes.dump(made))
    (run / "metrics.json").write_text(json.dumps({"recipe_hash": made.hash, "eval": {}}))
    key = setting.split("=")[0] if "{" not in setting else "task.max_target_length"
    with pytest.raises(toolkit.UserError, match=rf"^{re.escape(key)}: an extractive run .* generates nothing"):
        _cli(cli, "eval", run, setting) if entry == "cli eval" else toolkit.evaluate(run, overrides=[setting])
    assert sorted(p.name for p in run.iterdir()) == ["metrics.json", "recipe.yaml"]


@pytest.fixture(scope="module")
def chained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A --smoke chain: MLM pretraining, then SST-2 fine-tuning from its model/ (the fine-tuning run)."""
    return toolkit.run("demo/sst2/minilm-full-from-wikitext", SHORT, runs_dir=tmp_path_factory.mktemp("chain"),
                       smoke=True).dir


CHAINED = {  # an entry point that starts from, or loads onto, the upstream run's model/
    "cli run": lambda cli, root, run: _cli(cli, "run", "demo/sst2/minilm-full-from-wikitext", *SHORT, "train.seed=5",
                                           "--smoke", "--runs-dir", root),
    "api run": lambda cli, root, run: toolkit.run("demo/sst2/minilm-full-from-wikitext", [*SHORT, "train.seed=5"],
                                                  runs_dir=root, smoke=True),
    "cli eval": lambda cli, root, run: _cli(cli, "eval", run),
    "api predict": lambda cli, root, run: toolkit.predict(run, ["a fine film"]),
}


@pytest.mark.parametrize("entry", CHAINED)
@pytest.mark.parametrize("how", ["gone", "emptied", "changed"])
def test_a_chain_whose_upstream_model_is_gone_says_so(chained: Path, tmp_path: Path, cli, entry: str,
                                                      how: str) -> None:
    """Rule: a finished run's model/ removed (or emptied) after the run is said as that. A chained
    run from it said "run ... saves full's own parameters, not a model; full has no method.merge:
    chain from a run that saves a whole model (full, ...)", the wrong cause and a contradiction;
    eval and predict of a finished chained run said to keep it in its upstream's runs folder,
    where it was. Changed since (other weights of the same size), a new chained run started from
    weights that are not that run's result, exit 0."""
    root = Path(shutil.copytree(chained.parents[3], tmp_path / "runs"))
    (model,) = root.glob("pretrain/*/*/*/model")
    if how == "changed":  # other weights of the same size: a chained run started from what is not that run's result
        weights = bytearray((model / "model.safetensors").read_bytes())
        weights[-3] ^= 1
        (model / "model.safetensors").write_bytes(bytes(weights))
    else:
        shutil.rmtree(model)
    if how == "emptied":
        model.mkdir()
    said = {"gone": " is gone", "emptied": " holds no config.json", "changed": "/model.safetensors changed since the "
            "run (saved it|finished)"}[how]
    run = root / chained.relative_to(chained.parents[3])
    if how == "changed" and "run" not in entry:  # a whole model of its own: loaded without the upstream's
        CHAINED[entry](cli, root, run)
        return
    with pytest.raises(toolkit.UserError, match=rf"{re.escape(str(model))}{said}.*put it back as (the|that) run wrote it"):
        CHAINED[entry](cli, root, run)


def test_an_unedited_run_recipe_is_taken_and_runs_before_the_record_are_not_judged(run_copy: Path, tmp_path: Path,
                                                                                    cli, chained: Path) -> None:
    """No false refusal: a smoke run (sized recipe), a chained run ({run: ...} checkpoint, read
    from the run it started from), an override on purpose, and a run whose metrics.json predates
    recipe_hash (not judged, even edited)."""
    assert "accuracy" in toolkit.evaluate(chained)["eval"]
    assert "| accuracy" in toolkit.report([chained.parents[3]])  # both runs of the chain, as written
    assert "accuracy" in toolkit.evaluate(run_copy, overrides={"task.max_length": 16})["eval"]
    metrics = json.loads((run_copy / "metrics.json").read_text())
    del metrics["recipe_hash"]
    (run_copy / "metrics.json").write_text(json.dumps(metrics))
    (run_copy / "recipe.yaml").write_text(re.sub(r"max_length: \d+", "max_length: 16", (run_copy / "recipe.yaml").read_text()))
    assert "accuracy" in toolkit.evaluate(run_copy)["eval"]


@pytest.mark.parametrize("how", ["cli", "api"])
def test_eval_says_what_encoding_its_split_found(trained: Path, cli, capsys, how: str) -> None:
    """`toolkit eval` (and the API's evaluate) cut texts at max_length without a word, where run
    and predict say it (rule 8)."""
    if how == "cli":
        code, _, err = cli("eval", trained, "task.max_length=8")
        assert code == 0
    else:
        toolkit.evaluate(trained, overrides={"task.max_length": 8})
        err = capsys.readouterr().err
    assert re.search(r"warning: \d+ of 8 texts? cut at task.max_length=8 tokens", err), err


@pytest.mark.parametrize("how", ["gone", "emptied", "tail lost"])
def test_a_resume_without_the_runs_log_is_one_line(tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch,
                                                   how: str) -> None:
    """log.jsonl deleted (or emptied) between launches: the resumed run wrote a log starting at the
    checkpoint, its curve missing the early steps, exit 0. As a checkpoint with a file gone, it is
    one line naming the file and what would be right; the folder is left as it was. `tail lost`:
    the log's last lines before the checkpoint are gone (a host crash takes a file's unsynced tail:
    the checkpoint was synced, the log was not), and the resumed log had a hole; the log is now
    synced before each checkpoint is renamed into place, and a log without the last line its
    checkpoint's state says was written is the same line."""
    import os

    from toolkit import runs

    synced: list[str] = []
    real_fsync, real_replace = runs.fsync, os.replace
    monkeypatch.setattr(runs, "fsync", lambda path: (synced.append(Path(path).name), real_fsync(path)))
    monkeypatch.setattr(os, "replace", lambda a, b: (synced.append(f"rename {Path(b).name}"), real_replace(a, b)))
    common = ["demo/sst2/minilm-lora", *SHORT[:2], "train.max_steps=3", "train.save_every=1", "train.log_every=1",
              "--smoke", "--runs-dir", tmp_path / "runs"]
    code, _, err = cli("run", *common, "--stop-after", 2)
    assert code == 0, err
    run = next((tmp_path / "runs").rglob("log.jsonl")).parent
    renames = [i for i, done in enumerate(synced) if done == "rename step-000002"]
    assert renames and "log.jsonl" in synced[:renames[0]], synced  # on disk before its checkpoint is
    lines = (run / "log.jsonl").read_text().splitlines()
    if how == "gone":
        (run / "log.jsonl").unlink()
    elif how == "emptied":
        (run / "log.jsonl").write_text("")
    else:
        assert [json.loads(line)["step"] for line in lines][-1] == 2
        (run / "log.jsonl").write_text("".join(f"{line}\n" for line in lines if json.loads(line)["step"] < 2))
    before = sorted(p.name for p in (run / "checkpoints").iterdir())
    code, _, err = cli("run", *common)
    said = {"gone": "is gone", "emptied": "holds no line of step 1",
            "tail lost": r"holds no line of step 2, the last one written before the checkpoint of step 2 \(it ends "
                         r"at step 1: its lines after that were lost\)"}[how]
    assert code == 2 and re.search(rf"log.jsonl: {said}.*step 2.*--force", err), err
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == before
    assert not (run / "metrics.json").exists()
    assert cli("run", *common, "--force")[0] == 0
    assert json.loads((run / "log.jsonl").read_text().splitlines()[0])["step"] == 1


@pytest.mark.parametrize("entry", ["cli", "api"])
def test_data_edited_while_the_run_trains_is_not_recorded_as_its_data(tmp_path: Path, cli, tiny_checkpoint,
                                                                     monkeypatch: pytest.MonkeyPatch, entry: str) -> None:
    """Rule: metrics.json's data_sha256 is the data the run read (and its run id hashed), taken
    before it is read. It was taken when the run finished: a training file edited while the run
    trained was recorded as the run's data, so eval scored the edited file as the run's, exit 0,
    and refused the file the run was made with."""
    from conftest import write_recipe

    from toolkit import run_metrics

    data = tmp_path / "train.csv"
    made = "text,label\n" + "".join(f"sentence {i} is {'good' if i % 2 else 'bad'},{i % 2}\n" for i in range(16))
    data.write_text(made)
    recipe = write_recipe(tmp_path / "r.yaml", f"""model: {{checkpoint: {tiny_checkpoint('bert')}}}
task: {{name: text_classification, train_file: {data}, eval_file: {data}, max_length: 16}}
method: {{name: full}}
train: {{max_steps: 2, lr: 1.0e-3, batch_size: 4, seed: 7}}
""")
    build = run_metrics.build

    def edited_meanwhile(*args, **kwargs):  # the file edited while the run trained, before it finished
        data.write_text(made + "one more sentence,1\n")
        return build(*args, **kwargs)

    monkeypatch.setattr(run_metrics, "build", edited_meanwhile)
    if entry == "cli":
        code, _, err = cli("run", recipe, "--runs-dir", tmp_path / "runs")
        assert code == 0, err
        (run,) = [p.parent for p in (tmp_path / "runs").rglob("metrics.json")]
    else:
        run = toolkit.run(recipe, runs_dir=tmp_path / "runs").dir
    monkeypatch.undo()
    with pytest.raises(toolkit.UserError, match="not the data this run was made with"):
        toolkit.evaluate(run)
    data.write_text(made)  # the data the run read: scored as the run's
    assert "accuracy" in toolkit.evaluate(run)["eval"]


def _report(cli, root: Path, *args) -> None:
    _cli(cli, "report", root, *args)


# every writer, with the file it writes (given the runs folder and the run) and its command
IN_THE_PLACE = {
    "run": (lambda root, run: run / "metrics.json",
            lambda cli, root, run: _cli(cli, "run", "demo/sst2/minilm-lora", *SHORT, "--smoke", "--runs-dir", root)),
    "api run": (lambda root, run: run / "log.jsonl",
                lambda cli, root, run: toolkit.run("demo/sst2/minilm-lora", SHORT, runs_dir=root, smoke=True)),
    "run (a file in the place of model/)": (
        lambda root, run: run / "model",
        lambda cli, root, run: _cli(cli, "run", "demo/sst2/minilm-lora", *SHORT, "--smoke", "--runs-dir", root)),
    "sweep": (lambda root, run: run / "metrics.json",
              lambda cli, root, run: _cli(cli, "sweep", "demo/sst2/minilm-lora", *SHORT, "--smoke", "--runs-dir", root)),
    "api sweep": (lambda root, run: run / "identity.json",
                  lambda cli, root, run: toolkit.sweep(["demo/sst2/minilm-lora"], SHORT, runs_dir=root, smoke=True)),
    "cli eval": (lambda root, run: run / "eval-eval.json", lambda cli, root, run: _cli(cli, "eval", run)),
    "api evaluate": (lambda root, run: run / "eval-eval.json", lambda cli, root, run: toolkit.evaluate(run)),
    "cli glue-test": (lambda root, run: run / "glue-test" / "SST-2.tsv",
                      lambda cli, root, run: _cli(cli, "predict", run, "--glue-test")),
    "report": (lambda root, run: root / "report.md", lambda cli, root, run: _report(cli, root)),
    "api report": (lambda root, run: root / "report.md", lambda cli, root, run: toolkit.report(root)),
    "cp": (lambda root, run: root / "minilm-lora.yaml",
           lambda cli, root, run: _cli(cli, "cp", "demo/sst2/minilm-lora", root, "--force")),
}


@pytest.mark.parametrize("entry", IN_THE_PLACE)
def test_a_folder_where_a_writer_writes_a_file_is_one_line_before_the_work(
        trained: Path, tmp_path: Path, cli, entry: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder in the place of a file a writer writes (metrics.json, log.jsonl, identity.json,
    eval-<split>.json, report.md, a recipe `cp` copies): the run trained whole and then failed
    writing metrics.json, eval scored the whole split, the report wrote its plots beside the last
    report.md, and the line named the writer's temporary file (`metrics.json.123-ab12cd34.tmp: is
    a directory`), a name the user never gave. Now one line naming the user's path, before the
    work, and nothing written."""
    from toolkit import inference, train

    where, call = IN_THE_PLACE[entry]
    root = tmp_path / "runs"  # the run where `run` and `sweep` put it: runs/demo/sst2/minilm-lora/<id>
    run_copy = root / trained.relative_to(trained.parents[3])
    shutil.copytree(trained, run_copy)
    if entry.split(" (")[0].endswith(("run", "sweep")):  # an unfinished run: what a run or a sweep goes on with
        (run_copy / "metrics.json").unlink()
    place = where(root, run_copy)
    if place.name == "model":  # the other way round: a file where the run makes its folder
        shutil.rmtree(place)
        place.write_text("the user's own")
    else:
        place.unlink(missing_ok=True)
        place.mkdir(parents=True)
        (place / "mine.txt").write_text("the user's own")
    before = sorted(str(p.relative_to(root)) for p in root.rglob("*"))

    def worked(*args, **kwargs):
        raise AssertionError("the work was done before the place it writes was checked")

    monkeypatch.setattr(inference, "load_model", worked)
    monkeypatch.setattr(train, "run", worked)
    with pytest.raises(toolkit.UserError, match=rf"^{re.escape(str(place))}: is (a folder|a file), where"):
        call(cli, root, run_copy)
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*")) == before  # no plot, no temporary
    assert (place if place.is_file() else place / "mine.txt").read_text() == "the user's own"
    if entry == "run":  # --force, which the line names, removes it and runs
        monkeypatch.undo()
        _cli(cli, "run", "demo/sst2/minilm-lora", *SHORT, "--smoke", "--runs-dir", root, "--force")
        assert runs.is_finished(run_copy)


@pytest.mark.parametrize("entry", ["cp --force", "report", "api report"])
def test_a_writer_the_disk_cannot_hold_keeps_the_file_before_and_names_the_users(
        run_copy: Path, tmp_path: Path, cli, entry: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk: `cp --force` wrote the copy in place, so the user's own file it replaced was cut
    to what fit (a cut recipe can still read as one), and the line said "while writing a file";
    a report wrote its plots, then failed at report.md, the new plots beside the last report. Now
    every file is written whole beside its place and renamed, all or none: the files before stay,
    nothing partial is left, and the line names the user's file, not a temporary one."""
    import errno

    root = run_copy.parent.parent
    if entry.startswith("cp"):
        place = tmp_path / "mine.yaml"
        place.write_text("# the user's own recipe\n" * 50)
        call = lambda: _cli(cli, "cp", "demo/sst2/minilm-lora", place, "--force")  # noqa: E731
    else:
        _report(cli, root)
        place = root / "report.md"
        (run_copy / "log.jsonl").write_text((run_copy / "log.jsonl").read_text().splitlines()[0] + "\n")  # new curves
        call = (lambda: _report(cli, root)) if entry == "report" else (lambda: toolkit.report(root))
    folder = place.parent
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    real = Path.write_bytes

    def full(self, data):
        if self.name.startswith(place.name):
            real(self, data[:10])  # what fit
            raise OSError(errno.ENOSPC, "No space left on device")  # as write() says it: no file named
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", full)
    with pytest.raises(toolkit.UserError, match=rf"no space left on the device while writing {re.escape(str(place))};"):
        call()
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} == before
    if entry.startswith("cp"):  # with room, a link is written through, as cp(1) and the copy in place did
        (tmp_path / "link.yaml").symlink_to(place)
        _cli(cli, "cp", "demo/sst2/minilm-lora", tmp_path / "link.yaml", "--force")
        assert (tmp_path / "link.yaml").is_symlink() and "minilm" in place.read_text()


RUNS = {name: IN_THE_PLACE[name][1] for name in ("run", "api run", "sweep", "api sweep")}


@pytest.mark.parametrize("entry", RUNS)
@pytest.mark.parametrize("where", ["the run folder", "a folder above it"])
@pytest.mark.parametrize("force", [False, True])
def test_a_file_where_the_run_folder_goes_is_one_line_naming_it(trained: Path, tmp_path: Path, cli, entry: str,
                                                               where: str, force: bool) -> None:
    """A file where the run's folder goes (or a folder above it: `runs/demo`): the run said
    `runs/.../<id>: not a directory` (naming the run folder, where `runs/demo` was the file) or
    `file exists`, naming neither the file in the way nor what to do; --force too. One line naming
    the file, before anything runs, and the file left as it was."""
    root = tmp_path / "runs"
    run = root / trained.relative_to(trained.parents[3])
    place = run if where == "the run folder" else run.parents[2]
    place.parent.mkdir(parents=True)
    place.write_text("the user's own")
    call = RUNS[entry]
    if force:
        call = {"run": lambda cli, root, run: _cli(cli, "run", "demo/sst2/minilm-lora", *SHORT, "--smoke",
                                                   "--runs-dir", root, "--force"),
                "api run": lambda cli, root, run: toolkit.run("demo/sst2/minilm-lora", SHORT, runs_dir=root,
                                                              smoke=True, force=True),
                "sweep": lambda cli, root, run: _cli(cli, "sweep", "demo/sst2/minilm-lora", *SHORT, "--smoke",
                                                     "--runs-dir", root, "--force"),
                "api sweep": lambda cli, root, run: toolkit.sweep(["demo/sst2/minilm-lora"], SHORT, runs_dir=root,
                                                                  smoke=True, force=True)}[entry]
    with pytest.raises(toolkit.UserError, match=rf"^{re.escape(str(place))}: is a file, where .*move it away"):
        call(cli, root, run)
    assert place.read_text() == "the user's own"
