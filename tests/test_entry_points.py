"""Every entry point (the CLI, the Python API, the make targets) as a hostile user or a hostile
environment tries it: signals a scheduler sends, streams that are closed or cannot encode a
character, a file size limit, malformed environment variables. Each rule is stated in its test's
docstring and in docs/reliability.md ("Entry points and the environment")."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
import typing
from typing import Any

import pytest

from conftest import ROOT, write_recipe

STOPS = {"ctrl-c": None, "SIGTERM": signal.SIGTERM, "SIGHUP": signal.SIGHUP}


@pytest.mark.parametrize("where", ["before the first checkpoint", "while the second checkpoint is written"])
@pytest.mark.parametrize("stop", list(STOPS))
def test_sigterm_and_sighup_stop_a_run_as_ctrl_c_does(tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch,
                                                      stop: str, where: str) -> None:
    """Rule: SIGTERM (`kill`, SLURM, Kubernetes) and SIGHUP (a closed terminal) stop a command as
    Ctrl-C does: one line naming the signal, exit 128 + its number, the last whole checkpoint kept
    and nothing half-written (no folder without a checkpoint, no checkpoint cut short). Python's
    default ended the process on the spot, leaving both behind."""
    from toolkit import checkpoints, runs, train

    def interrupt(*args: Any, **kwargs: Any) -> None:
        if STOPS[stop] is None:
            raise KeyboardInterrupt
        os.kill(os.getpid(), STOPS[stop])  # the handler raises in this thread, at once
        time.sleep(5)
        raise AssertionError("the signal was not handled")

    sync_tree = runs.sync_tree

    def second_save(folder: Path, **kwargs: Any) -> None:  # its files written, its state file not yet
        if folder.name.startswith("tmp-") and runs.checkpoints(folder.parent.parent):
            interrupt()
        sync_tree(folder, **kwargs)

    if where == "before the first checkpoint":
        monkeypatch.setattr(train.Loop, "_epoch", interrupt)
    else:
        monkeypatch.setattr(checkpoints.runs, "sync_tree", second_save)
    before = signal.getsignal(signal.SIGTERM)
    code, _, err = cli("run", "demo/sst2/minilm-lora", "--smoke", "train.save_every=2", "--runs-dir", tmp_path / "runs")
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 128 + (STOPS[stop] or signal.SIGINT) and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("error: interrupted" if STOPS[stop] is None else f"error: {stop}: interrupted"), err
    assert not list((tmp_path / "runs").rglob("tmp-*"))
    if where == "before the first checkpoint":
        assert "nothing was kept" in lines[0] and not list((tmp_path / "runs").rglob("recipe.yaml")), err
    else:
        assert "keeps the checkpoint of step 2" in lines[0], err
        assert [c.name for c in (tmp_path / "runs").rglob("step-*")] == [runs.step_name(2)]
    assert signal.getsignal(signal.SIGTERM) is before  # a handler is installed only while a command runs


def test_sigterm_to_a_sweep_alone_stops_its_run_too(tmp_path: Path, tiny_checkpoint) -> None:
    """Rule: a stop signal sent to the sweep's process alone (`kill PID`, not the process group as
    Ctrl-C is) reaches the run it started: the sweep said nothing and died, and its run trained
    on, orphaned. Now: one line, exit 143, the run keeps its checkpoint and has stopped; also when the
    sweep was started with the stop signals blocked (the handlers unblock them while a command runs)."""
    data = tmp_path / "d.csv"
    data.write_text("text,label\n" + "".join(f"movie {i} was {'good' if i % 2 else 'bad'},{i % 2}\n" for i in range(64)))
    recipe = write_recipe(tmp_path / "r.yaml", f"""model: {{checkpoint: {tiny_checkpoint('bert')}}}
task: {{name: text_classification, train_file: {data}, eval_file: {data}, max_length: 16}}
method: {{name: full}}
train: {{max_steps: 100000, batch_size: 2, save_every: 2, eval_every: 100000}}
""")
    runs = tmp_path / "runs"
    # started with the stop signals blocked, as a launcher or test runner may leave them (a mask is
    # inherited across exec): the sweep never stopped, and its run trained on (found in the suite)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGHUP})
    try:
        proc = subprocess.Popen([sys.executable, "-m", "toolkit.cli", "sweep", str(recipe), "train.lr=1e-3,1e-4",
                                 "--runs-dir", str(runs)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                start_new_session=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    deadline = time.monotonic() + 120
    while not list(runs.rglob("trainer_state.json")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=60)  # the run still writing to the pipe would hold it open
    except subprocess.TimeoutExpired:  # say which process still runs, and what it does with signals
        pytest.fail(f"the sweep (exit {proc.poll()}) or its run still runs 60 s after SIGTERM: {_group_state(proc.pid)}")
    finally:
        os.killpg(proc.pid, signal.SIGKILL) if proc.poll() is None else None
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert proc.returncode == 143 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("error: SIGTERM: sweep stopped at run 1 of 2") and "keeps the checkpoint" in lines[0]
    with pytest.raises(ProcessLookupError):  # nothing of the sweep is left running
        os.killpg(proc.pid, 0)


def _group_state(group: int) -> str:
    """Each live process of a process group: its command line's tail, state and signal masks
    (blocked, ignored, caught), read from /proc: what a stop that did not happen needs explained."""
    out = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            if os.getpgid(int(status.parent.name)) != group:
                continue
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
            cmd = (status.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[-80:]
        except (OSError, ProcessLookupError):
            continue
        out.append(f"[{status.parent.name} {cmd.strip()} state {fields.get('State', '?').strip()} blocked "
                   f"{fields.get('SigBlk', '?').strip()} ignored {fields.get('SigIgn', '?').strip()} caught "
                   f"{fields.get('SigCgt', '?').strip()}]")
    return " ".join(out) or "no process left in its group"


def _toolkit(*args: Any, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess:
    """`python -m toolkit.cli ARGS` in a process of its own, with `env` over the test's environment."""
    return subprocess.run([sys.executable, "-m", "toolkit.cli", *map(str, args)], cwd=cwd, capture_output=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **env}, timeout=120)


@pytest.mark.parametrize("encoding", ["ascii:strict", "latin-1:strict"])
def test_a_stream_that_cannot_encode_a_character_is_no_traceback(tmp_path: Path, encoding: str) -> None:
    """Rule: standard output is UTF-8 whatever the locale (the bytes report.md and `predict
    --output` hold), and standard error writes what the terminal cannot show as a backslash
    escape: `report` (its mean ± std) and `predict` (an input's é) under PYTHONIOENCODING=ascii
    ended in a UnicodeEncodeError traceback, exit 1, after the work was done."""
    folder = tmp_path / "données ☃"
    folder.mkdir()
    done = _toolkit("cp", "demo/sst2/minilm-lora", folder, PYTHONIOENCODING=encoding)
    assert done.returncode == 0 and done.stdout.decode("utf-8").strip() == str(folder / "minilm-lora.yaml"), done
    done = _toolkit("validate", folder / "nö.yaml", PYTHONIOENCODING=encoding)
    assert done.returncode == 2 and b"Traceback" not in done.stderr and done.stderr.count(b"\n") == 1, done
    said = done.stderr.decode(encoding.split(":")[0])  # the terminal's own encoding, escapes for the rest
    assert said.startswith("error: recipe ") and "does not exist" in said and "☃" not in said, said


@pytest.mark.parametrize("limit_kb, writer", [(300, "tokenizers (model/ at the end)"), (20, "torch (the first checkpoint)")])
def test_a_file_size_limit_mid_save_is_one_line_and_the_run_goes_on(tmp_path: Path, cli, limit_kb: int,
                                                                     writer: str) -> None:
    """Rule: a write the place cannot take is one line naming the limit, exit 2, and the run goes
    on from its last whole checkpoint. A file over `ulimit -f` (or over a file system's largest
    file: FAT32's 4 GiB) fails with EFBIG, as Python ignores SIGXFSZ: tokenizers said `File too
    large (os error 27)` and torch's writer `unexpected pos`, both tracebacks, exit 1, and the
    cut checkpoint stayed in checkpoints/tmp-*."""
    import resource

    from conftest import MINILM
    from toolkit import models, runs

    models.smoke_checkpoint(MINILM)  # the small model --smoke trains, built (cached) before the limit
    command = ["run", "demo/sst2/minilm-lora", "--smoke", "train.save_every=2", "--runs-dir", tmp_path / "runs"]
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit_kb * 1024, hard))
    try:
        code, _, err = cli(*command)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert "file size limit" in lines[0] and "goes on from the last checkpoint" in lines[0], err
    assert not list((tmp_path / "runs").rglob("tmp-*"))
    kept = [runs.last_step(f.parent) for f in (tmp_path / "runs").rglob("identity.json")]
    assert kept == ([4] if limit_kb == 300 else []), (kept, err)  # no checkpoint: no folder either
    code, out, err = cli(*command)
    assert code == 0 and ("resuming from" in out + err) == (limit_kb == 300), out + err
    assert len(list((tmp_path / "runs").rglob("metrics.json"))) == 1


def _make(*args: str) -> subprocess.CompletedProcess:
    """`make ARGS` in the repo as a user types it: not as a sub-make of the suite's own `make test`,
    whose MAKEFLAGS/MAKELEVEL would make it print "make[1]: Entering directory" on stdout."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    return subprocess.run(["make", *args], cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)


@pytest.mark.parametrize("nproc", ["abc", "0", "-1", "2x", ""])
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_make_run_with_a_bad_nproc_is_one_line_before_any_launch(nproc: str, strategy: str) -> None:
    """Rule: a make variable holding what it cannot be is one line and a non-zero exit before
    anything starts. `make run NPROC=abc` printed accelerate's 40-line usage, NPROC=0 a torch
    elastic AssertionError traceback, NPROC=-1 a ValueError traceback."""
    done = _make("run", f"NPROC={nproc}", f"STRATEGY={strategy}", "VENV=/nonexistent")
    assert done.returncode == 2 and done.stdout == "", done
    assert done.stderr.splitlines()[0] == f"NPROC={nproc}: the number of processes, a whole number from 1 (make run NPROC=2)"


@pytest.mark.parametrize("target", ["demo", "glue", "compare", "chain", "attention", "smoke", "clean"])
def test_make_with_an_empty_runs_is_one_line_not_the_filesystem_root(target: str) -> None:
    """Rule: a make variable naming a place may not be empty: `make demo RUNS=` (an unset variable
    exported) ran `toolkit run ... --runs-dir "/demo"`, runs at the filesystem's root."""
    done = _make("-n", target, "RUNS=", "ARGS=--dry-run")
    assert done.returncode == 2 and done.stdout == "" and "RUNS is empty: give the folder for the runs" in done.stderr


@pytest.mark.parametrize("entry", ["run", "validate", "sweep", "cp", "make run", "make chain PRETRAIN", "make chain FINETUNE"])
def test_an_empty_recipe_is_no_recipe_given_at_every_entry_point(tmp_path: Path, cli, entry: str) -> None:
    """docs/make.md: an empty RECIPE, PRETRAIN or FINETUNE is one line (`no recipe given`) before
    anything runs. `toolkit run ""` (`make run RECIPE=`) said "run_one: path: an empty path",
    a function of the toolkit's, and `make chain FINETUNE=` trained the whole pretraining first."""
    if entry.startswith("make "):
        target, _, var = entry[5:].partition(" ")
        done = _make("-n", target, f"{var or 'RECIPE'}=", f"RUNS={tmp_path}")
        code, out, err = done.returncode, done.stdout, done.stderr
        if target == "run":  # one command: toolkit run says it
            assert out.strip().startswith(".venv/bin/toolkit run \"\"")
            code, out, err = cli("run", "")
    else:
        code, out, err = cli(*{"run": ["run", ""], "validate": ["validate", ""], "sweep": ["sweep", "", "--dry-run"],
                               "cp": ["cp", "", tmp_path / "x.yaml"]}[entry])
    assert code == 2 and "no recipe given" in err and err.count("\n") == 1 and "run_one" not in err, err
    assert "toolkit run" not in out and not list(tmp_path.iterdir())


@pytest.mark.parametrize("name", ["data", "tokenizers"])
def test_the_default_data_and_tokenizer_folders_are_looked_for_as_the_makefile_looks(tmp_path: Path, name: str) -> None:
    """docs/install.md: with TOOLKIT_DATA / TOOLKIT_TOKENIZERS unset, the first of ../shared/NAME,
    ../NAME and ./NAME beside the checkout, for `toolkit` as for the Makefile. The toolkit looked in
    ./NAME first (tokenizers: never in ../NAME), so with two copies `toolkit run` and `make run`
    of one recipe read other data, each exit 0."""
    from toolkit.errors import beside_checkout

    makefile = (ROOT / "Makefile").read_text()
    order = re.search(rf"TOOLKIT_{name.upper()} \?= \$\(abspath \$\(firstword \$\(wildcard ([^)]*)\)", makefile).group(1).split()
    assert order == [f"../shared/{name}", f"../{name}", name]
    repo = tmp_path / "work" / "checkout"
    repo.mkdir(parents=True)
    assert beside_checkout(name, repo) == Path(name)  # none there: the working folder's
    for i, place in reversed(list(enumerate(order))):  # each one found before those after it
        (repo / place).mkdir(parents=True)
        assert beside_checkout(name, repo).resolve() == (repo / place).resolve(), place


EMPTY = {"run": ["run", ""], "validate": ["validate", ""], "sweep": ["sweep", "", "train.lr=1e-4,1e-3", "--dry-run"],
         "cp": ["cp", "", "{tmp}"],
         "run --runs-dir": ["run", "demo/sst2/minilm-lora", "--runs-dir", ""],
         "sweep --runs-dir": ["sweep", "demo/sst2/minilm-lora", "--dry-run", "--runs-dir", " "],
         "cp dest": ["cp", "demo/sst2/minilm-lora", ""], "eval": ["eval", ""], "predict": ["predict", "", "--glue-test"],
         "predict --input": ["predict", "{tmp}", "--input", ""], "predict --output": ["predict", "{tmp}", "--output", ""],
         "export run": ["export", "", "{tmp}/out"], "export out": ["export", "{tmp}", ""], "report": ["report", ""],
         "report --out": ["report", "{tmp}", "--out", ""]}
EMPTY_API = {"run": lambda tmp: toolkit_api().run(""), "run runs_dir": lambda tmp: toolkit_api().run("x.yaml", runs_dir=""),
             "sweep": lambda tmp: toolkit_api().sweep([" "]), "evaluate": lambda tmp: toolkit_api().evaluate(""),
             "predict": lambda tmp: toolkit_api().predict("", ["a"]), "export": lambda tmp: toolkit_api().export(tmp, ""),
             "report": lambda tmp: toolkit_api().report(""), "report out": lambda tmp: toolkit_api().report(tmp, out="")}


def toolkit_api() -> Any:
    import toolkit

    return toolkit


@pytest.mark.parametrize("entry", [*EMPTY, *(f"api {k}" for k in EMPTY_API)])
def test_an_empty_path_is_one_line_at_every_entry_point(tmp_path: Path, cli, capsys: pytest.CaptureFixture,
                                                         monkeypatch: pytest.MonkeyPatch, entry: str) -> None:
    """Rule: an empty path (`make run RECIPE=`, `--runs-dir "$OUT"` with OUT unset) is a mistake,
    said as one line, never read as the folder `.` or as the default place: a recipe '' was 'recipe
    . is a folder', `--runs-dir ''` ran into ./runs, `--output ''` wrote to standard output, and
    `export RUN ''` was an OSError traceback (rmdir '.')."""
    monkeypatch.chdir(tmp_path)
    if entry.startswith("api "):
        with pytest.raises(toolkit_api().UserError, match="an empty path|no recipe given"):
            EMPTY_API[entry[4:]](tmp_path)
        return
    try:
        code, _, err = cli(*[a.format(tmp=tmp_path) for a in EMPTY[entry]])
    except SystemExit as exc:  # argparse's own refusal: its usage line, then the one error line
        code, err = exc.code, capsys.readouterr().err
    lines = [line for line in err.splitlines() if not line.startswith("usage:")]
    assert code == 2 and len(lines) == 1 and ("an empty path" in err or "no recipe given" in err), err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "minilm-lora.yaml").exists()


@pytest.mark.parametrize("texts", [[], (), iter([])], ids=["list", "tuple", "iterator"])
def test_predict_on_no_inputs_is_no_predictions(tmp_path: Path, texts: Any) -> None:
    """Rule: the API's predict maps inputs to predictions, so no inputs are no predictions (the
    last, empty chunk of a caller's batching loop): it was a ValueError traceback from inside the
    task's encoder ("Column 'cut' doesn't exist"). A folder that is no run is still said."""
    import toolkit

    run = tmp_path / "run"
    run.mkdir()
    (run / "recipe.yaml").write_text("model: {checkpoint: x}\n")
    assert toolkit.predict(run, texts) == []
    with pytest.raises(toolkit.UserError, match="no recipe.yaml here"):
        toolkit.predict(tmp_path, texts)


class _ClosedPipe(io.TextIOBase):
    """Standard output whose reader left (`toolkit ... | head -1`, after the first line)."""

    encoding = "utf-8"

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


@pytest.mark.parametrize("command", ["ls", "run"])
def test_a_closed_stdout_ends_the_command_as_sigpipe_would(tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch,
                                                             command: str) -> None:
    """Rule: a reader that leaves (`| head`) ends the command as SIGPIPE ends a C tool: exit 141,
    no traceback, nothing half-written. `toolkit run ... | head` died at its first printed line
    with exit 0, no word, and a run folder without a checkpoint left behind; now the run stops as
    Ctrl-C stops it (one line on stderr, which is still open; the folder goes)."""
    monkeypatch.setattr(sys, "stdout", _ClosedPipe())
    args = ["ls", "recipes"] if command == "ls" else ["run", "demo/sst2/minilm-lora", "--smoke", "train.eval_every=2",
                                                      "train.save_every=2", "--runs-dir", tmp_path / "runs"]
    code, _, err = cli(*args)
    assert code == 141 and "Traceback" not in err, err
    if command == "ls":
        assert err == ""
    else:
        assert err.count("error:") == 1 and "standard output was closed (its reader left): interrupted" in err, err
        assert "nothing was kept" in err and not list((tmp_path / "runs").rglob("recipe.yaml")), err


def test_a_closed_stderr_keeps_the_exit_code() -> None:
    """Rule: the exit code says what happened whether or not its line could be written: a user
    error with stderr closed exited 1 (the failed write's traceback, unseen), not 2."""
    r, w = os.pipe()
    os.close(r)
    done = subprocess.run([sys.executable, "-m", "toolkit.cli", "validate", "nonexistent.yaml"], stderr=w,
                          stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    os.close(w)
    assert done.returncode == 2 and b"0 of 1" not in done.stdout


@pytest.mark.parametrize("made", ["now", "before"])
@pytest.mark.parametrize("entry", ["cli", "api"])
def test_eval_from_another_folder_does_not_score_the_run_on_other_data(tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch,
                                                                       entry: str, made: str) -> None:
    """Rule: a run folder means the same wherever it is opened from. Its recipe may name data by
    a path relative to the working directory (docs/tasks.md); `toolkit eval RUN` from another
    folder holding a file of that name scored the run on that file and wrote the score into the
    run folder, exit 0. A run's recipe.yaml now names its files in one form, `$TOOLKIT_DATA/...`
    or absolute (tasks.canonical_data_paths), so from another folder it scores the run's own
    data; a run made before that form (its recipe.yaml as written) is one line there, before
    anything loads, nothing written; from the folder the run was started in, or with the file
    named, it scores."""
    import toolkit
    from toolkit import tasks

    home, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    for folder, flip in ((home, 0), (elsewhere, 1)):
        folder.mkdir()
        (folder / "d.csv").write_text("sentence,label\n" + "".join(f"movie {i},{(i + flip) % 2}\n" for i in range(8 + flip)))
    (home / "r.yaml").write_text(f"extends: {ROOT / 'recipes/demo/sst2/minilm-lora.yaml'}\n"
                                 "task: {name: text_classification, train_file: d.csv, eval_file: d.csv}\n")
    monkeypatch.chdir(home)
    with monkeypatch.context() as then:
        if made == "before":
            then.setattr(tasks, "canonical_data_paths", lambda task: {})
        assert cli("run", "r.yaml", "--smoke", "train.max_steps=1", "--runs-dir", tmp_path / "runs")[0] == 0
    (run,) = [m.parent for m in (tmp_path / "runs").rglob("metrics.json")]
    monkeypatch.chdir(elsewhere)
    said = "task.train_file: d.csv is named relative to the working directory, and the file of that name here"
    if made == "now":
        assert f"train_file: {home / 'd.csv'}" in (run / "recipe.yaml").read_text()
        assert toolkit.evaluate(run)["examples"] == {"": 8}  # the run's own file, found from here
        (run / "eval-eval.json").unlink()
    elif entry == "cli":
        code, _, err = cli("eval", run)
        assert code == 2 and said in err and err.count("\n") == 1, err
    else:
        with pytest.raises(toolkit.UserError, match=re.escape(said)):
            toolkit.evaluate(run)
    assert not (run / "eval-eval.json").exists()
    monkeypatch.chdir(home)
    assert toolkit.evaluate(run)["examples"] == {"": 8}
    # naming the file is the user's choice, however spelled: `task={eval_file: e.csv}` was refused
    # as the run's own data where `task.eval_file=e.csv` scored
    (home / "e.csv").write_text("sentence,label\n" + "".join(f"film {i},{i % 2}\n" for i in range(6)))
    for spelling in (["task.eval_file=e.csv"], ["task={eval_file: e.csv}"], {"task": {"eval_file": "e.csv"}}):
        if entry == "cli" and isinstance(spelling, list):
            code, _, err = cli("eval", run, *spelling)
            assert code == 0, err
            assert json.loads((run / "eval-eval.json").read_text())["examples"] == {"": 6}
        else:
            assert toolkit.evaluate(run, overrides=spelling)["examples"] == {"": 6}, spelling


def test_eval_does_not_score_a_run_on_its_data_edited_since(tmp_path: Path, cli) -> None:
    """Rule: `toolkit eval RUN` on the run's own data scores the data the run was made with,
    whatever path names it. A file named by an absolute path and edited (or removed) after the
    run was scored as the run's data and written into the run folder, exit 0 (only relative
    paths were checked). Now one line at the CLI and the API, nothing written; restored, it
    scores; naming the file on purpose scores the named file."""
    import toolkit

    data = tmp_path / "d.csv"
    rows = lambda flip: "sentence,label\n" + "".join(f"movie {i},{(i + flip) % 2}\n" for i in range(8))  # noqa: E731
    data.write_text(rows(0))
    (tmp_path / "r.yaml").write_text(f"extends: {ROOT / 'recipes/demo/sst2/minilm-lora.yaml'}\n"
                                     f"task: {{name: text_classification, train_file: {data}, eval_file: {data}}}\n")
    assert cli("run", tmp_path / "r.yaml", "--smoke", "train.max_steps=1", "--runs-dir", tmp_path / "runs")[0] == 0
    (run,) = [m.parent for m in (tmp_path / "runs").rglob("metrics.json")]
    for edit, said in ((lambda: data.write_text(rows(1)), "not the data this run was made with"),
                       (data.unlink, f"task.train_file: {data} does not exist")):
        edit()
        code, _, err = cli("eval", run)
        assert code == 2 and said in err and err.count("\n") == 1, err
        with pytest.raises(toolkit.UserError, match=re.escape(said)):
            toolkit.evaluate(run)
        assert not (run / "eval-eval.json").exists()
    data.write_text(rows(0))
    assert toolkit.evaluate(run)["examples"] == {"": 8}
    data.write_text(rows(1))
    assert toolkit.evaluate(run, overrides=[f"task.eval_file={data}"])["examples"] == {"": 8}


@pytest.mark.parametrize("variable, value, lands", [("TOOLKIT_CACHE", "", "home/.cache/toolkit/locks"),
                                                    ("TOOLKIT_CACHE", "~/cache", "home/cache/locks"),
                                                    ("TOOLKIT_RUNS", "~/runs", "home/runs")])
def test_a_toolkit_folder_variable_is_read_as_it_is_checked(tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch,
                                                            variable: str, value: str, lands: str) -> None:
    """Rule: a TOOLKIT_* folder variable is read the way `validate` checks it: empty is unset, `~`
    is expanded. TOOLKIT_CACHE='' put the run locks (and smoke models) in the working directory,
    so launches of one run from two folders did not see each other's lock; '~/cache' and
    TOOLKIT_RUNS='~/runs' (a .env file, a systemd unit: no shell expands them) made a folder
    named `~` in the working directory."""
    (tmp_path / "home").mkdir()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv(variable, value)
    monkeypatch.chdir(cwd)
    if variable == "TOOLKIT_RUNS":
        code, out, err = cli("sweep", "demo/sst2/minilm-lora", "train.lr=1e-4,1e-3", "--dry-run")
        assert code == 0 and out.count(str(tmp_path / lands)) == 2, out + err
    else:
        run = tmp_path / "run"
        run.mkdir()
        (run / "recipe.yaml").write_text("model: {checkpoint: x}\n")
        cli("export", run, tmp_path / "out")  # the export's lock, taken before the (fake) run is read
        assert list((tmp_path / lands).glob("*.lock")), list(tmp_path.rglob("*.lock"))
    assert list(cwd.iterdir()) == []


def _process_state() -> dict:
    """What a library call could change for its caller: the random generators, warning filters,
    the libraries' log levels and progress bars, the plotting backend, the environment."""
    import logging
    import random
    import warnings

    import datasets
    import matplotlib
    import numpy as np
    import torch
    import transformers

    return {"random": random.getstate(), "numpy": repr(np.random.get_state()), "torch": torch.random.get_rng_state(),
            "filters": list(warnings.filters), "backend": matplotlib.get_backend(),
            "levels": {n: logging.getLogger(n).level for n in ("transformers", "datasets", "peft", "accelerate")},
            "bars": (datasets.utils.logging.is_progress_bar_enabled(), transformers.utils.logging.is_progress_bar_enabled()),
            # what the toolkit sets (the libraries' own, such as torch's TORCHINDUCTOR_CACHE_DIR, are theirs)
            "environ": {k: v for k, v in os.environ.items() if k.startswith("TOOLKIT_") or k == "TOKENIZERS_PARALLELISM"}}


def test_the_api_leaves_the_callers_process_as_it_found_it(tmp_path: Path) -> None:
    """Rule: a call of the Python API leaves its caller's process as it found it. After
    `toolkit.run` a notebook's random, numpy and torch generators were reseeded (its own sampling
    repeated the same numbers after every run), transformers' warnings and the progress bars of
    datasets and transformers were off, the libraries' FutureWarnings filtered, and
    `toolkit.report(plots=True)` switched matplotlib to Agg (the notebook's plots stopped showing)."""
    import matplotlib
    import torch

    import toolkit

    backend = matplotlib.get_backend()
    matplotlib.use("svg")  # a backend of the caller's that is not the one the report draws with
    try:
        torch.manual_seed(7)
        before = _process_state()
        run = toolkit.run("demo/sst2/minilm-lora", {"train.max_steps": 1}, smoke=True, runs_dir=tmp_path)
        toolkit.report(tmp_path, plots=True)
        after = _process_state()
    finally:
        matplotlib.use(backend)
    assert run.metrics and list(tmp_path.glob("*.png"))
    changed = [k for k in before if not (torch.equal(before[k], after[k]) if k == "torch" else before[k] == after[k])]
    assert changed == [], {k: (before[k], after[k]) for k in changed if k != "filters"}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished smoke run that eval and predict score (made once for the tests below)."""
    import toolkit

    return toolkit.run("demo/sst2/minilm-lora", {"train.max_steps": 1}, smoke=True,
                       runs_dir=tmp_path_factory.mktemp("runs")).dir


def _accelerate_states() -> dict:
    from accelerate.state import AcceleratorState, GradientState, PartialState

    return {cls.__name__: dict(cls._shared_state) for cls in (PartialState, AcceleratorState, GradientState)}


# call(toolkit, a finished run, a folder of the test's)
API_CALLS = {
    "run": lambda tk, run, tmp: tk.run("demo/sst2/minilm-lora", {"train.max_steps": 1}, smoke=True, runs_dir=tmp),
    "run, failing after its Accelerator": lambda tk, run, tmp: tk.run(
        "demo/sst2/minilm-lora", {"task.max_length": 100000}, smoke=True, runs_dir=tmp),
    "evaluate": lambda tk, run, tmp: tk.evaluate(run),
    "predict": lambda tk, run, tmp: tk.predict(run, ["a fine film"]),
}


@pytest.mark.parametrize("caller", ["none", "bf16"])
@pytest.mark.parametrize("call", list(API_CALLS))
def test_the_api_leaves_accelerates_state_as_found(finished_run: Path, tmp_path: Path, call: str,
                                                   caller: str) -> None:
    """Rule: accelerate's process-wide states (PartialState, AcceleratorState, GradientState) are
    as the call found them. A run, eval or predict left its own Accelerator's state set: a
    notebook's `Accelerator(mixed_precision="bf16")` afterwards raised "AcceleratorState has
    already been initialized and cannot be changed, restart your runtime completely", and an
    Accelerator the notebook had made before the call computed in the run's precision after it
    (mixed_precision "no", not the bf16 it was made with), exit 0."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    import toolkit

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    mine = Accelerator(mixed_precision="bf16", cpu=True) if caller == "bf16" else None
    before = _accelerate_states()
    try:
        API_CALLS[call](toolkit, finished_run, tmp_path)
    except toolkit.UserError:
        assert call.startswith("run, failing")
    assert _accelerate_states() == before
    if mine is not None:
        assert mine.mixed_precision == "bf16" and mine.state.mixed_precision == "bf16"
    else:
        assert Accelerator(mixed_precision="bf16", cpu=True).mixed_precision == "bf16"
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def test_torch_first_imported_by_a_call_draws_from_entropy(tmp_path: Path) -> None:
    """Rule: a generator the call found unmade is left as its making leaves it. torch's import
    seeds its generator from the system's entropy; `import toolkit; toolkit.run(...)` imported torch
    and left it seeded with the recipe's train.seed, so the notebook's `torch.rand` after it drew
    the same numbers in every session (one fresh interpreter: torch is not imported before)."""
    code = ("import sys, toolkit\n"
            "assert 'torch' not in sys.modules\n"
            f"toolkit.run('demo/sst2/minilm-lora', {{'train.max_steps': 1, 'train.seed': 5}}, smoke=True, "
            f"runs_dir={str(tmp_path)!r})\n"
            "import torch\n"
            "print('SEED', torch.initial_seed())\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    seeds = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("SEED ")]
    assert done.returncode == 0 and len(seeds) == 1, done.stderr[-2000:]
    assert int(seeds[0]) != 5


def test_cuda_started_by_a_call_is_seeded_as_its_start_would_have(finished_run: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Rule: CUDA's generators, not yet started when a call begins and started by it (a run on a
    GPU), are left as their start would have seeded them: with torch's seed as the caller set it
    (torch.manual_seed(7) seeds CUDA with 7 when it starts). They were left as the run left them,
    so a notebook's CUDA sampling after each `toolkit.run` drew the run's numbers."""
    import torch

    import toolkit

    asked = iter([False])  # not started when the call begins; started from then on
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: next(asked, True))
    seeded = []
    monkeypatch.setattr(torch.cuda, "manual_seed_all", seeded.append)
    torch.manual_seed(7)
    toolkit.predict(finished_run, ["a fine film"])
    assert seeded[-1:] == [7]


@pytest.mark.parametrize("cache", ["set", "unset"])
def test_no_home_folder_is_one_line_or_nothing_at_all(tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch,
                                                      cache: str) -> None:
    """Rule: a process with no home folder (HOME unset under a user id with no passwd entry: a
    container run as an arbitrary uid; pathlib raises RuntimeError) runs when TOOLKIT_CACHE says
    where the cache goes, and is one line naming both variables when it does not. The home was
    looked up first: a RuntimeError traceback either way."""
    import pathlib

    def no_home(cls: Any) -> Path:
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(pathlib.Path, "home", classmethod(no_home))
    monkeypatch.delenv("HOME", raising=False)
    if cache == "unset":
        monkeypatch.delenv("TOOLKIT_CACHE")
    code, _, err = cli("run", "demo/sst2/minilm-lora", "--smoke", "train.max_steps=1", "--runs-dir", tmp_path / "runs")
    if cache == "set":
        assert code == 0 and len(list((tmp_path / "runs").rglob("metrics.json"))) == 1, err
    else:
        assert code == 2 and err.count("\n") == 1 and "TOOLKIT_CACHE is not set and this process has no home folder" in err
        assert not (tmp_path / "runs").exists()


LEFTOVERS = {"ACCELERATE_DYNAMO_BACKEND": ("INDUCTOR", "accelerate would compile the model"),
             "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": ("4", "accelerate would scale each loss by 1/4"),
             "ACCELERATE_MIXED_PRECISION": ("bf16", "ACCELERATE_MIXED_PRECISION=bf16: ")}


@pytest.mark.parametrize("entry", ["validate", "run", "sweep", "eval", "predict", "api run", "api sweep",
                                   "api evaluate", "api predict"])
@pytest.mark.parametrize("variable", list(LEFTOVERS))
def test_accelerate_settings_left_in_the_environment_do_not_change_what_runs(
        tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch, variable: str, entry: str) -> None:
    """Rule: what the recipe decides, the environment does not change in silence. accelerate reads
    ACCELERATE_DYNAMO_BACKEND, _GRADIENT_ACCUMULATION_STEPS and _MIXED_PRECISION when an
    Accelerator is made: one left by another launch compiled a recipe saying compile: false (137 s
    instead of 12, another loss, the same run folder), and bf16 made eval score a float32 run in
    bf16, exit 0. A value other than the neutral one `accelerate launch` exports is one line
    before anything loads; the neutral ones pass."""
    import toolkit

    value, said = LEFTOVERS[variable]
    run = tmp_path / "run"
    run.mkdir()
    (run / "recipe.yaml").write_text("model: {checkpoint: x}\n")
    (tmp_path / "in.txt").write_text("a fine film\n")
    recipe = "demo/sst2/minilm-lora"
    calls = {"validate": lambda: cli("validate", recipe), "run": lambda: cli("run", recipe, "--runs-dir", tmp_path / "runs"),
             "sweep": lambda: cli("sweep", recipe, "train.lr=1e-4,1e-3", "--runs-dir", tmp_path / "runs"),
             "eval": lambda: cli("eval", run), "predict": lambda: cli("predict", run, "--input", tmp_path / "in.txt"),
             "api run": lambda: toolkit.run(recipe, runs_dir=tmp_path / "runs"),
             "api sweep": lambda: toolkit.sweep([recipe], ["train.lr=1e-4,1e-3"], runs_dir=tmp_path / "runs"),
             "api evaluate": lambda: toolkit.evaluate(run), "api predict": lambda: toolkit.predict(run, ["a"])}
    monkeypatch.setenv(variable, value)
    if entry.startswith("api"):
        with pytest.raises(toolkit.UserError, match=re.escape(said)):
            calls[entry]()
    else:
        code, _, err = calls[entry]()
        assert code == 2 and said in err and "Traceback" not in err, err
    assert not (tmp_path / "runs").exists()


def test_the_values_accelerate_launch_exports_pass(tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """The other side of the rule above: what `accelerate launch` exports with this repository's
    configs (dynamo NO, precision 'no' under a bf16 recipe, accumulation 1) is not refused."""
    for variable, value in {"ACCELERATE_DYNAMO_BACKEND": "NO", "ACCELERATE_MIXED_PRECISION": "no",
                            "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "1"}.items():
        monkeypatch.setenv(variable, value)
    code, out, err = cli("sweep", "demo/sst2/minilm-lora", "train.mixed_precision=no,bf16", "--dry-run",
                         "--runs-dir", tmp_path / "runs")
    assert code == 0 and "2 runs (dry run" in out, err


@pytest.mark.parametrize("seeds", ["", " , ", "api ''", "api []"])
def test_seeds_given_empty_are_one_line(tmp_path: Path, cli, seeds: str) -> None:
    """Rule: seeds given but empty (`make glue SEEDS=`, an unset variable; `seeds=[]`) are a
    mistake: the sweep ran each point once with the recipe's seed, where several were asked."""
    import toolkit

    if seeds.startswith("api"):
        with pytest.raises(toolkit.UserError, match="no seed given"):
            toolkit.sweep(["demo/sst2/minilm-lora"], seeds="" if seeds == "api ''" else [], runs_dir=tmp_path)
        return
    code, _, err = cli("sweep", "demo/sst2/minilm-lora", "--seeds", seeds, "--dry-run", "--runs-dir", tmp_path)
    assert code == 2 and err.count("\n") == 1 and "no seed given" in err, err


@pytest.mark.parametrize("link, entry", [("loop", "run"), ("dangling", "run"), ("dangling", "sweep"), ("loop", "api")])
def test_a_runs_folder_that_is_a_broken_link_is_one_line(tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch,
                                                         link: str, entry: str) -> None:
    """Rule: a runs folder (or a folder on its way) that is a symbolic link to nowhere, or to
    itself, is said as such before anything runs: a loop was a RuntimeError traceback from the run
    lock (`Symlink loop from ...`), a link to a missing folder `error: runs: file exists`."""
    import toolkit

    monkeypatch.chdir(tmp_path)
    Path("runs").symlink_to("runs" if link == "loop" else str(tmp_path / "gone" / "runs"))
    said = "--runs-dir: runs is a symbolic link to " + ("runs, which leads back to itself" if link == "loop"
                                                        else f"{tmp_path / 'gone' / 'runs'}, which does not exist")
    if entry == "api":
        with pytest.raises(toolkit.UserError, match=re.escape(said)):
            toolkit.run("demo/sst2/minilm-lora", smoke=True, runs_dir="runs/mine")
        return
    args = ["run", "demo/sst2/minilm-lora", "--smoke"] if entry == "run" else ["sweep", "demo/sst2/minilm-lora", "--dry-run"]
    code, _, err = cli(*args, "--runs-dir", "runs" if entry == "run" else "runs/mine")
    assert code == 2 and err.count("\n") == 1 and said in err, err
    assert not (tmp_path / "gone").exists()


@pytest.mark.parametrize("words", [[], ["train.epochs=1", "task.max_train_samples=100"],
                                   ["train.epochs=1", "method={name: lora, merge: true}",
                                    "method.target_modules=[query,value]", "train.seed=7"],
                                   ["train.lr=1e-4", "task.max_length=64", "name=it's mine"]])
def test_make_chain_fine_tunes_from_the_run_it_pretrained(tmp_path: Path, words: list[str]) -> None:
    """`make chain PRETRAIN_ARGS=...` pretrains with those overrides, then fine-tunes from the run
    they make. The second command rebuilt them by joining on spaces, so a value holding a space
    (`'method={name: lora, merge: true}'`) or a comma (`[query,value]`) came out as other YAML:
    a refusal after the whole pretraining, or another run. Each word reaches the reference as
    the pretraining got it, and the reference plans that same run."""
    import json
    import shlex

    from toolkit import recipe as recipes, runs

    fake = tmp_path / "venv" / "bin"
    fake.mkdir(parents=True)
    (fake / "toolkit").write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    (fake / "toolkit").chmod(0o755)
    done = _make("-s", "chain", f"VENV={tmp_path / 'venv'}", f"PRETRAIN_ARGS={shlex.join(words)}", f"RUNS={tmp_path}")
    assert done.returncode == 0, done.stderr
    pretrain, finetune, _ = [json.loads(line) for line in done.stdout.splitlines()]
    assert pretrain[2:2 + len(words)] == words
    (reference,) = [a for a in finetune if a.startswith("model.checkpoint=")]
    ref = recipes.safe_yaml(reference.partition("=")[2], "reference")
    assert ref == {"run": pretrain[1], "overrides": words}
    if "name=it's mine" not in words:  # the chained recipe plans the very run the first command makes
        planned = recipes.plan(ROOT / finetune[1], [reference])
        assert runs.run_id(planned.upstream.recipe) == runs.run_id(recipes.load(ROOT / pretrain[1], words))


def test_make_chain_args_reach_the_reference_as_they_reached_the_pretraining(tmp_path: Path) -> None:
    """`make chain ARGS=...` gives ARGS to both commands, so the pretraining ran with its overrides,
    and the fine-tuning's reference left them out: `ARGS=train.epochs=1` fine-tuned from the
    pretraining without it (an earlier run of it, exit 0, or a refusal after the whole pretraining).
    Its override words are in the reference as the pretraining got them; its flags are not."""
    import json

    from toolkit import recipe as recipes

    fake, log = tmp_path / "venv" / "bin", tmp_path / "calls.jsonl"
    fake.mkdir(parents=True)
    (fake / "toolkit").write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n"
                                  f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
                                  "sys.exit(2 if sys.argv[1] == 'validate' and any('refuse=1' in a for a in sys.argv) else 0)\n")
    (fake / "toolkit").chmod(0o755)
    args = "ARGS=--smoke train.epochs=1 --stop-after 3 'task={max_train_samples: 100}'"
    done = _make("-s", "chain", f"VENV={tmp_path / 'venv'}", "PRETRAIN_ARGS=train.lr=1e-4", args, f"RUNS={tmp_path}")
    assert done.returncode == 0, done.stderr
    pretrain, finetune, _ = [json.loads(line) for line in done.stdout.splitlines()]
    assert {"train.lr=1e-4", "train.epochs=1", "task={max_train_samples: 100}", "--smoke"} <= set(pretrain)
    (reference,) = [a for a in finetune if a.startswith("model.checkpoint=")]
    ref = recipes.safe_yaml(reference.partition("=")[2], "reference")
    assert ref["overrides"] == ["train.lr=1e-4", "train.epochs=1", "task={max_train_samples: 100}"]
    # the fine-tuning, as it will run (its overrides and --smoke, not the run's flags), is validated
    # before the pretraining: refused at its own start, it was refused after the whole pretraining
    validate = json.loads(log.read_text().splitlines()[0])
    assert validate == ["validate", finetune[1], reference, "--smoke", "train.epochs=1", "task={max_train_samples: 100}"]
    log.unlink()
    done = _make("-s", "chain", f"VENV={tmp_path / 'venv'}", "PRETRAIN_ARGS=refuse=1", args, f"RUNS={tmp_path}")
    assert done.returncode != 0 and done.stdout == "" and [json.loads(x)[0] for x in log.read_text().splitlines()] == ["validate"]


@pytest.mark.parametrize("command", [["run", "demo/sst2/minilm-lora", "--runs-dir", "a", "--runs-dir", "b"],
                                     ["sweep", "demo/sst2/minilm-lora", "--seeds", "3", "--dry-run", "--seeds=5"],
                                     ["eval", "RUN", "--split", "eval", "--split", "train"],
                                     ["predict", "RUN", "--output", "a.jsonl", "--output", "b.jsonl"],
                                     ["report", "RUN", "--out", "a", "--out", "b"]])
def test_an_option_given_twice_is_one_line_not_the_last_one_winning(tmp_path: Path, cli, command: list[str],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """argparse lets the last of a repeated option win: `make glue ARGS="--runs-dir x"` (the target
    gives its own --runs-dir) ran the sweep into x, then reported on runs/glue, whatever was there,
    exit 0; `make glue SEEDS=3 ARGS="--seeds 5"` ran 5 seeds. Every option with a value is given once."""
    monkeypatch.chdir(tmp_path)
    code, out, err = cli(*[str(tmp_path) if word == "RUN" else word for word in command])
    option = next(w for w in command[::-1] if w.startswith("--") and w not in ("--dry-run",)).split("=")[0]
    said = f"error: toolkit {command[0]}: {option} is given twice ("
    assert code == 2 and out == "" and err.startswith(said) and err.count("\n") == 1, err


def test_make_glue_with_its_own_runs_dir_in_args_is_one_line(tmp_path: Path) -> None:
    done = _make("-s", "glue", "MODEL=minilm", "METHOD=lora", "ARGS=--dry-run --runs-dir elsewhere", f"RUNS={tmp_path}")
    assert done.returncode != 0 and "error: toolkit sweep: --runs-dir is given twice" in done.stderr and done.stdout == "", done
    assert not (ROOT / "elsewhere").exists()


def test_a_user_error_under_make_run_nproc_2_is_its_line_and_exit_2_with_no_launcher_traceback() -> None:
    """`make run NPROC=2` with a recipe error: each process says its `error:` line and exits 2;
    the launcher (torch elastic inside `accelerate launch`) then printed a ChildFailedError
    traceback and report box after it and ended the launch with exit 1, a user error read as a
    crash. toolkit.launch ends it with the processes' own exit code and nothing more."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    done = subprocess.run(["make", "run", "NPROC=2", "RECIPE=demo/sst2/minilm-lora", "ARGS=--smoke train.bogus=1",
                           f"VENV={Path(sys.executable).parent.parent}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=env)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2, done.stderr[-2000:]
    assert errors and all("train.bogus" in line for line in errors), done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "ChildFailedError" not in done.stderr, done.stderr[-3000:]
    # nor torch elastic's log lines (`Sending process N closing signal SIGTERM`, `failed (exitcode: 2) ...`)
    assert not [line for line in done.stderr.splitlines() if "torch/distributed/elastic" in line], done.stderr[-3000:]


def test_python_dash_m_toolkit_is_the_toolkit_command() -> None:
    """`python -m toolkit` was "No module named toolkit.__main__"; it is the `toolkit` command: the
    same output and exit code, a user error included."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    ok = subprocess.run([sys.executable, "-m", "toolkit", "validate", "demo/sst2/minilm-lora"], cwd=ROOT,
                        capture_output=True, text=True, timeout=120, env=env)
    assert ok.returncode == 0 and "1 of 1 recipes valid" in ok.stdout, ok.stderr
    bad = subprocess.run([sys.executable, "-m", "toolkit", "validate", "demo/sst2/minilm-lora", "train.bogus=1"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and "train.bogus: unknown key" in bad.stderr, bad.stderr


# every path argument of the CLI: (argv with P where the path goes, the parsed attribute)
PATH_ARGS = {"run --runs-dir": (["run", "r", "--runs-dir", "P"], "runs_dir"),
             "sweep --runs-dir": (["sweep", "r", "--runs-dir", "P"], "runs_dir"),
             "eval RUN": (["eval", "P"], "run"), "eval --task-from": (["eval", "x", "--task-from", "P"], "task_from"),
             "predict RUN": (["predict", "P"], "run"), "predict --input": (["predict", "x", "--input", "P"], "input"),
             "predict --output": (["predict", "x", "--output", "P"], "output"),
             "export RUN": (["export", "P", "o"], "run"), "export OUT": (["export", "x", "P"], "out"),
             "report RUNS_DIR": (["report", "P"], "runs_dir"), "report --out": (["report", "x", "--out", "P"], "out"),
             "cp DEST": (["cp", "r", "P"], "dest")}
WRITTEN = ["~/d/x.csv", "$RDR_PLACE/d/x.csv", "${RDR_PLACE}/d/x.csv"]


@pytest.mark.parametrize("written", WRITTEN)
@pytest.mark.parametrize("entry", sorted(PATH_ARGS))
def test_every_path_a_user_gives_is_expanded_as_a_recipes_are(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               entry: str, written: str) -> None:
    """Rule: a path is read alike wherever it is given: `~` and variables expanded, as a recipe's
    `task.train_file` is. `toolkit predict RUN --input "~/x.csv"` (quoted, or `--input=~/x.csv`,
    which no shell expands) was 'no such file', `--runs-dir '$SCRATCH/runs'` made a folder named
    `$SCRATCH`, while the recipe's own paths were expanded."""
    from toolkit.cli import parser

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("RDR_PLACE", str(tmp_path))
    argv, attribute = PATH_ARGS[entry]
    got = getattr(parser().parse_args([written if a == "P" else a for a in argv]), attribute)
    assert (got[0] if isinstance(got, list) else got) == str(tmp_path / "d" / "x.csv")


@pytest.mark.parametrize("written", WRITTEN)
def test_the_api_recipe_names_and_runs_dir_expand_paths_alike(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              written: str) -> None:
    """The same rule for the Python API's path arguments (@typed: RUN, OUT, runs_dir, a list of
    RUNS_DIR), a recipe given by path (`toolkit run "~/r.yaml"`, the API's recipe), --runs-dir's
    folder (runs_root) and a path given in eval's or run's overrides."""
    from toolkit import arguments, runs
    from toolkit.api import PathArg
    from toolkit.recipe import find_recipe, load, named_files

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("RDR_PLACE", str(tmp_path))
    want = tmp_path / "d" / "x.csv"
    assert arguments.check(written, PathArg, "w") == str(want)
    assert arguments.check(Path(written), PathArg, "w") == want
    assert arguments.check([written], typing.Iterable[PathArg], "w") == [str(want)]
    assert runs.runs_root(written) == want
    want.parent.mkdir()
    recipe = (ROOT / "recipes" / "demo" / "own-data" / "minilm-full.yaml").read_text()
    write_recipe(want.with_suffix(".yaml"), recipe.replace("extends: ", f"extends: {ROOT}/recipes/demo/own-data/"))
    assert find_recipe(written.replace(".csv", ".yaml")) == want.with_suffix(".yaml")
    want.write_text("text,label\na,b\n")
    task = load(want.with_suffix(".yaml"), [f"task.eval_file={written}"]).task
    assert dict(named_files(task))["task.eval_file"] == want


def test_a_model_folder_in_a_recipe_expands_as_every_path_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """model.checkpoint naming a folder expanded `~` alone: `$MODELS/bert` was taken for a Hub id
    (off-line: 'not in the Hub cache'). It follows errors.user_path as every other path."""
    from toolkit import models

    folder = tmp_path / "bert"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    monkeypatch.setenv("MODELS", str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path))
    for given in ("$MODELS/bert", "${MODELS}/bert", "~/bert"):
        assert models.local_dir(given) == folder and models.resolve(given) == str(folder)
