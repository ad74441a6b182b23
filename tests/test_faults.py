"""Faults: SIGKILL at random moments, corrupt checkpoints, a non-finite loss, the same run twice
at once, and what a run's identity covers. Every interrupted run must end exactly where an
uninterrupted one does."""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import write_recipe
from test_train import nan_loss_at_forward, weights

RECIPE = """model: {{checkpoint: {checkpoint}}}
task: {{name: glue, subset: sst2, max_length: 32, max_train_samples: 96, max_eval_samples: 24}}
method: {method}
train: {{max_steps: 12, lr: 1.0e-3, batch_size: 8, eval_every: 3, log_every: 1, save_total_limit: 2, seed: 5}}
"""


@pytest.fixture
def bert(tiny_checkpoint) -> str:
    """The small random BERT's folder: a real checkpoint path, so no --smoke caps apply."""
    return tiny_checkpoint("bert")


def the_run(root: Path) -> Path:
    (metrics,) = root.rglob("metrics.json")
    return metrics.parent


def same_result(a: Path, b: Path) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    ma, mb = (json.loads((p / "metrics.json").read_text()) for p in (a, b))
    assert ma["eval"] == mb["eval"] and ma["train_steps"] == mb["train_steps"]
    assert ma["train_loss"] == mb["train_loss"] is not None  # over the steps before the kill too
    clock = ("samples_per_second", "eval_runtime_s")  # the log: one run's, nothing of a killed attempt
    logs = [[{k: v for k, v in json.loads(line).items() if k not in clock}
             for line in (r / "log.jsonl").read_text().splitlines()] for r in (a, b)]
    assert logs[0] == logs[1]


def _forked_run(args: list[str]) -> int:
    """`toolkit run ARGS` in a child process forked from this one, its output thrown away: a
    process of its own to SIGKILL, which finds torch, transformers and the run's tokenizer and
    data already read here (a fresh interpreter spent most of an attempt importing them). The
    child's pid."""
    import threading

    from tqdm import std

    pid = os.fork()
    if pid == 0:  # the child: never back into pytest; no exit handlers, no buffers of this process flushed
        code = 1
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)
            os.dup2(null, 2)
            sys.stdout = sys.stderr = open(os.devnull, "w")
            # tqdm's write lock holds a multiprocessing RLock, a semaphore in memory shared with this
            # process: a child killed inside a bar's write left it taken, and this process's next bar
            # waited on it for ever. The child's bars take a lock of its own.
            own = threading.RLock()
            for bar in [std.tqdm, *_subclasses(std.tqdm)]:
                if "_lock" in vars(bar):
                    bar._lock = own
            std.tqdm._lock = own
            from toolkit.cli import main

            code = main(args)
        finally:
            os._exit(code)
    return pid


def _subclasses(cls: type) -> list[type]:
    return [sub for direct in cls.__subclasses__() for sub in (direct, *_subclasses(direct))]


@pytest.fixture
def one_thread():
    """torch on one intra-op thread for the test: a child forked from a process whose OpenMP pool
    ran 2 threads (pytest without OMP_NUM_THREADS=1 on 2 cores) hung in its first parallel region
    (GNU OpenMP is not fork-safe), and "the killed attempt never started training"; on one thread
    torch enters no parallel region. The clean run, the killed attempt and the rerun all sum alike."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("method, kills", [("{name: full}", 2), ("{name: lora, r: 4}", 1),
                                           ("{name: adapters, config: pfeiffer}", 1),
                                           ("{name: prompt_tuning, num_virtual_tokens: 4}", 1)])
def test_sigkill_at_random_moments_resumes_to_the_same_result(tmp_path: Path, cli, bert: str, method: str,
                                                               kills: int) -> None:
    recipe = write_recipe(tmp_path / "r.yaml", RECIPE.format(checkpoint=bert, method=method))
    args = ["model.dropout=0.1"]
    assert cli("run", recipe, *args, "--runs-dir", tmp_path / "clean")[0] == 0
    # the killed attempt sums in as many chunks as this process, which runs the clean run and the rerun
    # (forked from it, it has its threads: under 1 thread in a fresh process and 2 here, pytest
    # without OMP_NUM_THREADS=1 on 2 cores, a kill that left a checkpoint gave other weights, a
    # resume on other compute, which the rerun now notes)
    rng = random.Random(method)
    for attempt in range(kills):
        root = tmp_path / f"killed{attempt}"
        pid = _forked_run(["run", str(recipe), *args, "--runs-dir", str(root)])
        deadline = time.time() + 120
        while not list(root.rglob("log.jsonl")) and os.waitpid(pid, os.WNOHANG) == (0, 0) and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 1.5))  # somewhere in a step, an evaluation or a save
        with contextlib.suppress(ProcessLookupError, ChildProcessError):  # (ended already: reaped above)
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        assert list(root.rglob("log.jsonl")), "the killed attempt never started training"
        code, _, err = cli("run", recipe, *args, "--runs-dir", root)
        assert code == 0 and "other compute" not in err, err
        same_result(the_run(tmp_path / "clean"), the_run(root))


@pytest.fixture(scope="module")
def clean_full(tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint) -> tuple[Path, Path]:
    """(recipe, run folder) of one uninterrupted full fine-tuning run, shared by the damage cases."""
    from toolkit.cli import main

    tmp = tmp_path_factory.mktemp("clean")
    recipe = write_recipe(tmp / "r.yaml", RECIPE.format(checkpoint=tiny_checkpoint("bert"), method="{name: full}"))
    assert main(["run", str(recipe), "--runs-dir", str(tmp / "runs")]) == 0
    return recipe, the_run(tmp / "runs")


@pytest.fixture(scope="module")
def stopped_at_7(tmp_path_factory: pytest.TempPathFactory, clean_full):
    """(root, cli) -> root: a runs folder of clean_full's recipe stopped after step 7 (a copy of
    one trained once for the module, through the test's `cli`, which takes its output)."""
    import shutil

    made: list[Path] = []

    def copy(root: Path, cli) -> Path:
        if not made:
            made.append(tmp_path_factory.mktemp("stopped") / "runs")
            assert cli("run", clean_full[0], "--runs-dir", made[0], "--stop-after", "7")[0] == 0
        return Path(shutil.copytree(made[0], root))

    return copy


@pytest.mark.parametrize("damage", ["model.safetensors", "optimizer.bin", "scheduler.bin",
                                    "random_states_0.pkl", "trainer_state.json"])
def test_corrupt_latest_checkpoint_falls_back_to_the_previous(tmp_path: Path, cli, clean_full, stopped_at_7,
                                                              damage: str) -> None:
    recipe, clean = clean_full
    root = stopped_at_7(tmp_path / "hurt", cli)
    latest = sorted(root.rglob("step-*"))[-1]
    assert latest.name == "step-000007"
    target = latest / damage
    if damage == "trainer_state.json":
        target.unlink()
    else:
        target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])  # truncated
    code, out, err = cli("run", recipe, "--runs-dir", root)
    assert code == 0, err
    assert "step-000007 is unusable" in out + err  # a step folder without its state file too
    same_result(clean, the_run(root))


@pytest.mark.parametrize("edit", ["step", "best_metric", "another_run", "manifest dropped", "manifest a list"])
def test_an_edited_or_foreign_checkpoint_state_is_not_resumed_from(tmp_path: Path, cli, clean_full, stopped_at_7,
                                                                   edit: str) -> None:
    """The manifest covered every file but trainer_state.json itself, and nothing said which run a
    checkpoint is of: a hand-edited state (the step, the best metric) or a checkpoint copied in from
    another run (another seed) was resumed from as written, exit 0, and the result under this run's
    id was not this recipe's. Now either is unusable, said, and the one before is used. The state's
    digest does not cover the manifest: one dropped from a checkpoint whose digest says it was
    written with one passed its files unchecked (a weight changed in place was trained on, exit 0),
    and one of another shape was an AttributeError traceback."""
    import shutil

    recipe, clean = clean_full
    root = stopped_at_7(tmp_path / "hurt", cli)
    latest = sorted(root.rglob("step-*"))[-1]
    if edit == "another_run":
        assert cli("run", recipe, "train.seed=6", "--runs-dir", tmp_path / "other", "--stop-after", "7")[0] == 0
        shutil.rmtree(latest)
        shutil.copytree(sorted((tmp_path / "other").rglob("step-000007"))[-1], latest)
        said = f"written by run {the_other(tmp_path / 'other').name}, not this one"
    elif edit.startswith("manifest"):
        state = json.loads((latest / "trainer_state.json").read_text())
        if edit == "manifest dropped":
            del state["manifest"]
            weights = latest / "model.safetensors"  # a byte of the last weight changed, the size kept
            data = bytearray(weights.read_bytes())
            data[-2] ^= 0x40
            weights.write_bytes(bytes(data))
        else:
            state["manifest"] = list(state["manifest"])
        (latest / "trainer_state.json").write_text(json.dumps(state))
        said = "trainer_state.json's manifest is missing or not as written"
    else:
        state = json.loads((latest / "trainer_state.json").read_text())
        state[edit] = 3 if edit == "step" else 0.99
        (latest / "trainer_state.json").write_text(json.dumps(state))
        said = "trainer_state.json changed since it was written"
    code, out, err = cli("run", recipe, "--runs-dir", root)
    assert code == 0 and f"step-000007 is unusable ({said}" in out + err, out + err
    same_result(clean, the_run(root))


def the_other(root: Path) -> Path:
    (state,) = root.rglob("recipe.yaml")
    return state.parent


def test_a_state_field_this_toolkit_does_not_know_is_one_line(tmp_path: Path, cli, clean_full) -> None:
    """A checkpoint written by another version of the toolkit, whose state holds a field this one
    lacks: a TypeError traceback from State(**saved). Now one line naming the field."""
    from toolkit import runs

    recipe, _ = clean_full
    root = tmp_path / "newer"
    assert cli("run", recipe, "--runs-dir", root, "--stop-after", "7", "train.save_total_limit=1",
               "train.keep_best=false")[0] == 0
    (state_file,) = root.rglob("trainer_state.json")
    state = json.loads(state_file.read_text())
    state["new_counter"] = 1
    state["state_sha256"] = runs.state_digest({k: v for k, v in state.items() if k not in ("manifest", "state_sha256")})
    state_file.write_text(json.dumps(state))
    code, _, err = cli("run", recipe, "--runs-dir", root, "train.save_total_limit=1", "train.keep_best=false")
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, err
    assert "holds new_counter, which this version of the toolkit does not know" in errors[0], err


def test_stop_after_a_step_the_run_is_at_or_past_trains_no_further(tmp_path: Path, cli, clean_full) -> None:
    """`--stop-after N` stops at step N; run again (the same command, or a smaller N) on a run
    already there, it took one more step each time (4, then 5, then 6) and checkpointed it. Now
    it trains nothing, and the run still ends as the uninterrupted one."""
    from toolkit import runs

    recipe, clean = clean_full
    root = tmp_path / "stopped"
    for stop in (4, 4, 2):
        code, out, err = cli("run", recipe, "--runs-dir", root, "--stop-after", stop)
        assert code == 0, err
        (run,) = [p.parent for p in root.rglob("recipe.yaml")]
        assert runs.last_step(run) == 4, out + err
        assert max(json.loads(line)["step"] for line in (run / "log.jsonl").read_text().splitlines()) == 4
    assert cli("run", recipe, "--runs-dir", root)[0] == 0
    same_result(clean, the_run(root))


def test_the_api_stops_after_n_steps_as_the_cli_does(tmp_path: Path, clean_full) -> None:
    """docs/cli.md: the Python API takes the CLI's arguments; `toolkit.run` had no `stop_after`
    (`--stop-after N`). It stops at step N, checkpointed and unfinished, and the same call without
    it ends as the uninterrupted run; 0 (falsy: the whole run trained, exit 0) and True are refused,
    nothing written."""
    import toolkit
    from toolkit import runs

    recipe, clean = clean_full
    root = tmp_path / "stopped"
    for bad, said in ((0, "stop_after: must be at least 1"), (True, "stop_after: expected")):
        with pytest.raises(toolkit.UserError, match=said):
            toolkit.run(recipe, runs_dir=root, stop_after=bad)
        assert not root.exists()
    stopped = toolkit.run(recipe, runs_dir=root, stop_after=4)
    assert runs.last_step(stopped.dir) == 4 and not runs.is_finished(stopped.dir)
    toolkit.run(recipe, runs_dir=root)
    same_result(clean, the_run(root))


@pytest.mark.parametrize("entry", ["cli", "api"])
def test_checkpoints_there_but_none_usable_is_one_line_not_a_restart(tmp_path: Path, cli, clean_full,
                                                                      entry: str) -> None:
    """train.save_total_limit 1 (the default) and no best kept: one checkpoint. Cut short after
    the stop, the rerun said "no usable checkpoint: starting from the beginning" on stdout and
    trained from step 0, exit 0, where the user asked to go on. Now one line, exit 2 (the API
    raises it), and the folder is left as it was for a copy to be put back."""
    from toolkit import api
    from toolkit.errors import UserError

    recipe, _ = clean_full
    args = ["train.save_total_limit=1", "train.keep_best=false"]
    root = tmp_path / "hurt"
    assert cli("run", recipe, *args, "--runs-dir", root, "--stop-after", "4")[0] == 0
    (only,) = root.rglob("step-*")
    target = only / "optimizer.bin"
    target.write_bytes(target.read_bytes()[:100])
    log = (only.parent.parent / "log.jsonl").read_text()
    if entry == "cli":
        code, _, err = cli("run", recipe, *args, "--runs-dir", root)
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert code == 2 and len(errors) == 1 and "Traceback" not in err, err
    else:
        with pytest.raises(UserError) as caught:
            api.run(recipe, args, runs_dir=root)
        err = str(caught.value)
    assert "none of its 1 checkpoint(s) is usable" in err and "optimizer.bin has 100 bytes" in err, err
    assert "--force" in err
    assert list(root.rglob("step-*")) == [only] and target.stat().st_size == 100
    assert not list(root.rglob("metrics.json")) and (only.parent.parent / "log.jsonl").read_text() == log


def test_rotation_keeps_the_checkpoint_just_written_not_a_stale_newer_one(tmp_path: Path) -> None:
    """The newest checkpoint (step 7) was unusable, the resume went back to the best (step 3) and
    wrote step 6. Counted as the newest, the stale step 7 made rotation (save_total_limit 1)
    delete step 6 the moment it was written, leaving the damaged one."""
    from toolkit import runs

    for step in (3, 6, 7):
        folder = tmp_path / "checkpoints" / runs.step_name(step)
        folder.mkdir(parents=True)
        (folder / "trainer_state.json").write_text("{}")
    runs.prune(tmp_path, 1, protect=3, upto=6)
    assert [p.name for p in runs.checkpoints(tmp_path)] == ["step-000003", "step-000006"]
    runs.prune(tmp_path, 1, protect=None, upto=6)
    assert [p.name for p in runs.checkpoints(tmp_path)] == ["step-000006"]


class Killed(BaseException):
    """SIGKILL in-process: nothing in the toolkit catches it (only `finally` blocks run)."""


@pytest.mark.parametrize("where, nth", [
    ("toolkit.runs.manifest", 1),  # mid the first checkpoint's write: nothing to resume from
    ("toolkit.evaluation.evaluate", 2),  # mid the second evaluation
    ("toolkit.runs.manifest", 3),  # mid the third checkpoint's write (save_total_limit 2)
    ("toolkit.attention.save", 1),  # mid the export of model/, after the weights
])
def test_killed_anywhere_then_rerun_ends_as_the_uninterrupted_run(tmp_path: Path, cli, clean_full,
                                                                  monkeypatch: pytest.MonkeyPatch,
                                                                  where: str, nth: int) -> None:
    """Whatever a kill leaves half-written is not taken as good, and nothing of the killed attempt
    stays in the result: the log is one run's (a run killed before its first checkpoint and run
    again appended a second copy of every step to log.jsonl), the weights and metrics equal."""
    import importlib

    recipe, clean = clean_full
    module, name = where.rsplit(".", 1)
    real, calls = getattr(importlib.import_module(module), name), []

    def kill(*args, **kwargs):
        calls.append(1)
        if len(calls) == nth:
            raise Killed
        return real(*args, **kwargs)

    root = tmp_path / "killed"
    with monkeypatch.context() as m:
        m.setattr(importlib.import_module(module), name, kill)
        with pytest.raises(Killed):
            cli("run", recipe, "--runs-dir", root)
    code, _, err = cli("run", recipe, "--runs-dir", root)
    assert code == 0, err
    run = the_run(root)
    same_result(clean, run)
    assert sorted(p.name for p in run.iterdir()) == sorted(p.name for p in clean.iterdir())


@pytest.mark.parametrize("settings, saves_before", [
    # 96 examples in batches of 8 for 2 epochs of 12 steps, evaluated at each epoch's end: step 12
    # is saved by save_every, then evaluated (the epoch is whole) and saved again
    (["train.max_steps=null", "train.epochs=2", "train.eval_every=0", "train.save_every=6"], 2),
    # the last step (12) is saved by save_every, then evaluated as the last step and saved again
    (["train.eval_every=5", "train.save_every=4"], 5)])
def test_killed_between_an_evaluation_and_its_save_logs_the_evaluation_once(
        tmp_path: Path, cli, bert: str, monkeypatch: pytest.MonkeyPatch, settings: list, saves_before: int) -> None:
    """A step saved before it is evaluated (save_every at an epoch's end, or at the last step),
    killed after its evaluation was logged and before the checkpoint that follows was whole: the
    resume goes on from the first checkpoint of that step, evaluates it again and logged the
    evaluation a second time (exit 0). The log keeps an evaluation of the checkpoint's own step
    only where the checkpoint's state holds it."""
    from toolkit import runs

    recipe = write_recipe(tmp_path / "r.yaml", RECIPE.format(checkpoint=bert, method="{name: full}"))
    assert cli("run", recipe, *settings, "--runs-dir", tmp_path / "whole")[0] == 0
    real, calls = runs.manifest, []

    def kill(*args, **kwargs):
        calls.append(1)
        if len(calls) == saves_before + 1:  # the checkpoint written after the evaluation
            raise Killed
        return real(*args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(runs, "manifest", kill)
        with pytest.raises(Killed):
            cli("run", recipe, *settings, "--runs-dir", tmp_path / "killed")
    killed = next((tmp_path / "killed").rglob("log.jsonl")).parent
    assert [json.loads(line)["step"] for line in (killed / "log.jsonl").read_text().splitlines()
            if "eval" in line][-1] == 12  # the evaluation was logged before the kill
    code, out, err = cli("run", recipe, *settings, "--runs-dir", tmp_path / "killed")
    assert code == 0 and "resuming from" in out and "(step 12 of" in out, out + err
    same_result(the_run(tmp_path / "whole"), the_run(tmp_path / "killed"))


def test_killed_mid_the_metrics_write_leaves_no_partial_file(tmp_path: Path, cli, clean_full,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Killed after metrics.json's temporary file was written, before its rename: the run is not
    finished (no metrics.json), the rerun finishes it, and the partial file is gone."""
    from toolkit import runs

    recipe, clean = clean_full
    real = runs.write_json

    def cut(path: Path, data: object) -> None:
        if path.name == "metrics.json":
            path.with_suffix(".json.999.tmp").write_text(json.dumps(data)[:40])
            raise Killed
        real(path, data)

    with monkeypatch.context() as m:
        m.setattr(runs, "write_json", cut)
        with pytest.raises(Killed):
            cli("run", recipe, "--runs-dir", tmp_path / "killed")
    assert not list((tmp_path / "killed").rglob("metrics.json"))
    assert cli("run", recipe, "--runs-dir", tmp_path / "killed")[0] == 0
    run = the_run(tmp_path / "killed")
    same_result(clean, run)
    assert sorted(p.name for p in run.iterdir()) == sorted(p.name for p in clean.iterdir())


# step 12 is saved by save_every, then evaluated as the last step and saved again over itself; with
# one checkpoint kept and no best step, step-000012 is the run's only checkpoint when it is replaced
AGAIN = ["train.eval_every=5", "train.save_every=4", "train.keep_best=false", "train.save_total_limit=1"]


@pytest.fixture(scope="module")
def saved_twice(tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint) -> tuple[Path, Path]:
    """(recipe, run folder) of one uninterrupted run whose last step is saved twice (AGAIN)."""
    from toolkit.cli import main

    tmp = tmp_path_factory.mktemp("again")
    recipe = write_recipe(tmp / "r.yaml", RECIPE.format(checkpoint=tiny_checkpoint("bert"), method="{name: full}"))
    assert main(["run", str(recipe), *AGAIN, "--runs-dir", str(tmp / "runs")]) == 0
    return recipe, the_run(tmp / "runs")


@pytest.mark.parametrize("stop", [Killed, KeyboardInterrupt])
@pytest.mark.parametrize("removed", ["part", "all"])
def test_killed_while_a_step_is_saved_over_itself_goes_on_from_that_step(
        tmp_path: Path, cli, saved_twice, monkeypatch: pytest.MonkeyPatch, stop: type, removed: str) -> None:
    """Saving a step again (save_every, then its evaluation) removes the older step-N just before
    the whole new one is renamed from tmp-step-N. Killed in between, the only whole copy of the
    step was under the temporary name and was deleted as partial: the rerun said none of the
    checkpoints was usable, exit 2 and --force (the old one half removed), or trained again from
    step 0 without a word (all of it removed); Ctrl-C's line said nothing was kept. The whole one
    takes its step's place: the run goes on from step 12 and ends as the uninterrupted run."""
    import shutil

    from toolkit import runs

    recipe, whole = saved_twice
    real, calls = shutil.rmtree, []

    def cut(path, *args, **kwargs):
        path = Path(path)
        if path.name == "step-000012" and (path.parent / "tmp-step-000012").is_dir() and not calls:
            calls.append(path)
            if removed == "part":
                sorted(path.iterdir())[0].unlink()
            else:
                real(path, *args, **kwargs)
            raise stop
        return real(path, *args, **kwargs)

    root = tmp_path / "killed"
    with monkeypatch.context() as m:
        m.setattr(runs.shutil, "rmtree", cut)  # the module checkpoints.save calls too
        if stop is Killed:
            with pytest.raises(Killed):
                cli("run", recipe, *AGAIN, "--runs-dir", root)
        else:
            code, _, err = cli("run", recipe, *AGAIN, "--runs-dir", root)
            assert code == 130 and "keeps the checkpoint of step 12" in err, err
    code, out, err = cli("run", recipe, *AGAIN, "--runs-dir", root)
    assert code == 0 and "(step 12 of 12)" in out, out + err
    run = the_run(root)
    same_result(whole, run)
    assert sorted(p.name for p in run.iterdir()) == sorted(p.name for p in whole.iterdir())


def test_killed_while_a_resume_rewrites_the_log_keeps_it(tmp_path: Path, cli, clean_full, stopped_at_7,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A resume drops the log lines written after its checkpoint by rewriting log.jsonl; rewritten
    in place, a kill mid-write left it cut, and the finished run's log lacked its first steps
    (exit 0). The kept lines now replace the log whole, or not at all."""
    recipe, clean = clean_full
    root = stopped_at_7(tmp_path / "killed", cli)
    real_text, real_bytes = Path.write_text, Path.write_bytes

    def cut(real):
        def write(self: Path, data, *args, **kwargs):
            if self.name.startswith("log.jsonl"):
                real(self, data[: len(data) // 2], *args, **kwargs)
                raise Killed
            return real(self, data, *args, **kwargs)
        return write

    with monkeypatch.context() as m:
        m.setattr(Path, "write_text", cut(real_text))
        m.setattr(Path, "write_bytes", cut(real_bytes))
        with pytest.raises(Killed):
            cli("run", recipe, "--runs-dir", root)
    code, out, err = cli("run", recipe, "--runs-dir", root)
    assert code == 0 and "(step 7 of 12)" in out, out + err
    same_result(clean, the_run(root))


@pytest.mark.parametrize("where", ["weights", "state", "log"])
def test_a_full_disk_mid_run_is_one_line_keeps_the_last_checkpoint_and_goes_on(
        tmp_path: Path, cli, clean_full, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """No space left while the third checkpoint's weights or its state file are written, or while
    a log line is appended: one line naming the run folder, exit 2, nothing half-written left in
    checkpoints/, the checkpoint before kept; with room again the same command ends as the
    uninterrupted run."""
    import errno

    import accelerate

    from toolkit import runs

    recipe, clean = clean_full
    calls: list[int] = []

    def full(real, nth: int, match=lambda *a: True):
        def write(*args, **kwargs):
            if match(*args):
                calls.append(1)
                if len(calls) == nth:
                    raise OSError(errno.ENOSPC, "No space left on device")
            return real(*args, **kwargs)
        return write

    real_save = accelerate.Accelerator.save_state

    def cut(acc, folder, *args, **kwargs):  # the third checkpoint's weights file begun, then no room
        calls.append(1)
        if len(calls) < 3:
            return real_save(acc, folder, *args, **kwargs)
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / "model.safetensors").write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as m:
        if where == "weights":
            m.setattr(accelerate.Accelerator, "save_state", cut)
        elif where == "state":
            m.setattr(runs, "write_json", full(runs.write_json, 3, lambda path, *a: path.name == "trainer_state.json"))
        else:
            m.setattr(runs, "append_log", full(runs.append_log, 8))
        code, _, err = cli("run", recipe, "--runs-dir", tmp_path / "full")
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "no space left on the device while writing" in errors[0], err
    (checkpoints,) = (tmp_path / "full").rglob("checkpoints")
    assert [p.name for p in checkpoints.iterdir()] != [] and not list(checkpoints.glob("tmp-*"))
    code, out, err = cli("run", recipe, "--runs-dir", tmp_path / "full")
    assert code == 0 and "resuming from" in out, out + err
    same_result(clean, the_run(tmp_path / "full"))


@pytest.mark.parametrize("removed", ["part", "all"])
def test_ctrl_c_after_the_run_finished_keeps_it_and_says_so(tmp_path: Path, cli, clean_full,
                                                             monkeypatch: pytest.MonkeyPatch, removed: str) -> None:
    """Ctrl-C after metrics.json was written, while the step checkpoints were removed (or a tracker
    closed): the line said "nothing was kept" and the finished run's new folder was deleted whole
    (all checkpoints gone already), or it said a half-removed checkpoint was kept to resume from.
    Now the finished run stays, the line says it finished, and the next launch says "finished
    already" and removes the checkpoints left."""
    import shutil

    recipe, clean = clean_full
    real = shutil.rmtree

    def stopped(path, *args, **kwargs):
        if Path(path).name == "checkpoints":
            if removed == "part":
                real(sorted(Path(path).iterdir())[0])
            else:
                real(path, *args, **kwargs)
            raise KeyboardInterrupt
        return real(path, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(shutil, "rmtree", stopped)
        code, _, err = cli("run", recipe, "--runs-dir", tmp_path / "runs")
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 130 and len(errors) == 1 and "interrupted after the run finished" in errors[0], err
    run = the_run(tmp_path / "runs")
    code, out, err = cli("run", recipe, "--runs-dir", tmp_path / "runs")
    assert code == 0 and "finished already" in out, out + err
    same_result(clean, run)
    assert sorted(p.name for p in run.iterdir()) == sorted(p.name for p in clean.iterdir())


def test_killed_after_early_stopping_stays_stopped(tmp_path: Path, cli, bert: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Early stopping fired at step 4 (lr 0: the second evaluation ties the first, loss
    included), the run was killed while finishing; the rerun trained on past the stop (5 steps,
    another evaluation) and reported it, exit 0. The stop is part of the state it resumes."""
    from toolkit import run_metrics

    recipe = write_recipe(tmp_path / "r.yaml", RECIPE.format(checkpoint=bert, method="{name: full}"))
    args = ["train.lr=0.0", "train.eval_every=2", "train.early_stopping_patience=1", "train.keep_best=false"]
    assert cli("run", recipe, *args, "--runs-dir", tmp_path / "whole")[0] == 0
    with monkeypatch.context() as m:
        m.setattr(run_metrics, "build", lambda *a, **k: (_ for _ in ()).throw(Killed()))
        with pytest.raises(Killed):
            cli("run", recipe, *args, "--runs-dir", tmp_path / "killed")
    code, out, err = cli("run", recipe, *args, "--runs-dir", tmp_path / "killed")
    assert code == 0 and "step 4 of 12" in out, out + err
    whole, killed = the_run(tmp_path / "whole"), the_run(tmp_path / "killed")
    assert json.loads((whole / "metrics.json").read_text())["train_steps"] == 4
    same_result(whole, killed)


@pytest.mark.parametrize("skip, said", [
    ("0", r"step \d+: the loss is not finite .*train\.skip_nonfinite"),
    # every step after the first skipped, the weights diverged: the evaluation refuses to score them
    ("100", r"step 3: the model's outputs on the eval split are not finite \(the loss of 24 of 24 examples\)")])
def test_a_diverged_run_stops_with_one_line_and_leaves_nothing(tmp_path: Path, cli, skip: str, said: str) -> None:
    """Finding: with train.skip_nonfinite=100 a run whose weights diverged at step 1 went on to
    score accuracy 0.5417 from NaN outputs and finished with exit 0."""
    recipe = write_recipe(tmp_path / "r.yaml", RECIPE.format(checkpoint="bert-base-uncased", method="{name: full}"))
    code, _, err = cli("run", recipe, "--smoke", "train.lr=1.0e+12", "train.max_grad_norm=null",
                       f"train.skip_nonfinite={skip}", "--runs-dir", tmp_path / "runs")
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and re.search(said, errors[0]), err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("*.json*"))  # nothing before a checkpoint


def test_a_skipped_batch_is_logged_as_null_and_the_run_finishes(tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """A non-finite batch within train.skip_nonfinite: log.jsonl stays strict JSON (null, never a
    bare NaN) and metrics.json counts the skip."""
    nan_loss_at_forward(monkeypatch, 2)
    recipe = write_recipe(tmp_path / "r.yaml", RECIPE.format(checkpoint="bert-base-uncased", method="{name: full}"))
    code, _, err = cli("run", recipe, "--smoke", "train.max_steps=4", "train.skip_nonfinite=1", "--runs-dir", tmp_path / "runs")
    assert code == 0, err
    run = the_run(tmp_path / "runs")
    entries = [json.loads(line, parse_constant=lambda c: pytest.fail(f"bare {c} in log.jsonl"))
               for line in (run / "log.jsonl").read_text().splitlines()]
    assert [e["loss"] for e in entries if "loss" in e and e["step"] == 2] == [None]
    assert json.loads((run / "metrics.json").read_text())["skipped_nonfinite"] == 1


def test_the_same_run_twice_at_once_refuses_the_second(tmp_path: Path, cli) -> None:
    from toolkit import recipe as recipes, runs

    recipe = write_recipe(tmp_path / "r.yaml", RECIPE.format(checkpoint="bert-base-uncased", method="{name: full}"))
    out = runs.run_dir(recipes.load(recipe, smoke=True), tmp_path / "runs")
    with runs.locked(out):
        code, _, err = cli("run", recipe, "--smoke", "--runs-dir", tmp_path / "runs")
    assert code == 2 and "is being run by process" in err
    assert cli("run", recipe, "--smoke", "--runs-dir", tmp_path / "runs")[0] == 0  # released


def test_the_same_run_from_another_cache_is_refused_too(tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch,
                                                       bert: str) -> None:
    """The lock in $TOOLKIT_CACHE binds only launches that share it: two users (or two machines
    on one shared runs folder) with their own caches trained into one run folder at once."""
    from toolkit import recipe as recipes, runs

    recipe = write_recipe(tmp_path / "r.yaml", RECIPE.format(checkpoint=bert, method="{name: full}"))
    out = runs.run_dir(recipes.load(recipe), tmp_path / "runs")
    with runs.locked(out, folder=True):
        with monkeypatch.context() as m:
            m.setenv("TOOLKIT_CACHE", str(tmp_path / "another-cache"))
            code, _, err = cli("run", recipe, "--runs-dir", tmp_path / "runs")
        assert code == 2 and "is being run by another process" in err and len(err.splitlines()) == 1, err
        assert list(out.iterdir()) == []  # the refused launch wrote nothing there
    assert not out.exists() and not (tmp_path / "runs").exists()  # an empty lock leaves no folder
    code, _, err = cli("run", recipe, "--runs-dir", tmp_path / "runs", "train.max_steps=1")
    assert code == 0, err


def test_identity_covers_processes_and_data(tmp_path: Path) -> None:
    from toolkit import recipe as recipes, runs

    rows = "sentence,label\n" + "".join(f"text {i},{i % 2}\n" for i in range(8))
    data = tmp_path / "d.csv"
    data.write_text(rows)
    recipe = write_recipe(tmp_path / "r.yaml", f"""model: {{checkpoint: bert-base-uncased}}
task: {{name: text_classification, train_file: {data}, eval_file: {data}, text_columns: [sentence]}}
method: {{name: full}}
""")
    r = recipes.load(recipe)
    one, two = runs.run_id(r, processes=1), runs.run_id(r, processes=2)
    assert one != two
    data.write_text(rows.replace("text 3", "text three"))
    assert runs.run_id(r, processes=1) != one


def test_lean_checkpoints_hold_what_trains(tmp_path: Path, cli, bert: str) -> None:
    """A LoRA checkpoint holds the adapter and head, not the frozen base; finished runs keep
    model/ only unless train.keep_checkpoints."""
    from safetensors.torch import load_file

    sizes = {}
    for name, method in (("full", "{name: full}"), ("lora", "{name: lora, r: 4}")):
        recipe = write_recipe(tmp_path / f"{name}.yaml", RECIPE.format(checkpoint=bert, method=method))
        root = tmp_path / name
        assert cli("run", recipe, "--runs-dir", root, "--stop-after", "3")[0] == 0
        (weights_file,) = root.rglob("step-000003/model.safetensors")
        sizes[name] = weights_file.stat().st_size
        keys = load_file(weights_file).keys()
        if name == "lora":
            assert keys and all("lora_" in k or "modules_to_save" in k for k in keys), sorted(keys)[:5]
    assert sizes["lora"] * 10 < sizes["full"], sizes
    recipe = tmp_path / "lora.yaml"
    assert cli("run", recipe, "--runs-dir", tmp_path / "keep", "train.keep_checkpoints=true")[0] == 0
    assert list((tmp_path / "keep").rglob("step-*"))


@pytest.mark.parametrize("damage", ["changed", "another_run"])
def test_a_damaged_best_checkpoint_is_one_line_not_the_result(tmp_path: Path, cli, bert: str, damage: str) -> None:
    """lr 0: every evaluation ties, so the best step stays 3 and is kept beside the newest. Its
    weights changed on disk (same size, so only the manifest's hash tells), or the folder copied in
    from another run, were loaded as the run's final model, scored and exported, exit 0; resume
    checked the newest checkpoint only."""
    import shutil

    recipe = write_recipe(tmp_path / "r.yaml", RECIPE.format(checkpoint=bert, method="{name: full}"))
    args = ["train.lr=0.0", "--runs-dir", tmp_path / "runs"]
    assert cli("run", recipe, *args, "--stop-after", "7")[0] == 0
    (best,) = (tmp_path / "runs").rglob("step-000003/model.safetensors")
    if damage == "changed":
        data = bytearray(best.read_bytes())
        data[-8:] = bytes(8)  # the last weight's bytes, the header intact: it loads
        best.write_bytes(bytes(data))
        said = "model.safetensors changed since it was written"
    else:
        other = tmp_path / "other"
        assert cli("run", recipe, "train.lr=0.0", "train.seed=6", "--runs-dir", other, "--stop-after", "4")[0] == 0
        shutil.rmtree(best.parent)
        shutil.copytree(next(other.rglob("step-000003")), best.parent)
        said = "a checkpoint of another run"
    code, _, err = cli("run", recipe, *args)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "best step" in errors[0], err
    assert said in errors[0]
    assert not list((tmp_path / "runs").rglob("metrics.json")) and not list((tmp_path / "runs").rglob("model"))


@pytest.mark.parametrize("entry", ["cli", "api"])
def test_a_force_rerun_stopped_while_clearing_leaves_no_finished_run(tmp_path: Path, cli, bert: str,
                                                                     monkeypatch: pytest.MonkeyPatch, entry: str) -> None:
    """`run --force` empties the run folder before training again; stopped half-way (Ctrl-C, a
    kill) after model/ went and before metrics.json did, the next plain run said "finished
    already" (exit 0) over a run with no model, and eval/predict/export failed on it. The mark of a
    finished run goes first now: the rerun trains again."""
    import shutil

    import toolkit
    from toolkit import runs

    recipe = write_recipe(tmp_path / "r.yaml", RECIPE.format(checkpoint=bert, method="{name: full}"))
    args = ["train.max_steps=1", "train.eval_every=0", "task.max_eval_samples=8"]
    assert cli("run", recipe, *args, "--runs-dir", tmp_path / "runs")[0] == 0
    run = the_run(tmp_path / "runs")
    real = shutil.rmtree

    def stopped(path, *a, **k):  # the first folder removed, then the Ctrl-C
        real(path, *a, **k)
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(runs.shutil, "rmtree", stopped)
        if entry == "cli":
            assert cli("run", recipe, *args, "--force", "--runs-dir", tmp_path / "runs")[0] == 130
        else:
            with pytest.raises(KeyboardInterrupt):
                toolkit.run(recipe, args, runs_dir=tmp_path / "runs", force=True)
    assert not runs.is_finished(run)
    code, out, err = cli("run", recipe, *args, "--runs-dir", tmp_path / "runs")
    assert code == 0 and "finished already" not in out and (run / "model").is_dir() and runs.is_finished(run), out + err


@pytest.mark.parametrize("writer", ["write_json", "write_predictions"])
def test_writers_at_once_each_leave_a_whole_file_and_no_partial_one(tmp_path: Path, writer: str) -> None:
    """Two `toolkit eval` of one run at once (or two threads of the API) write the same
    predictions-<split>.jsonl and eval-<split>.json. The temporary file they shared (`.tmp`,
    `.<pid>.tmp`) was truncated by one writer while the other renamed it: a cut file or a
    FileNotFoundError. Each writer now writes its own temporary file: the result is one
    writer's whole file, and none is left."""
    import threading

    from toolkit import runs

    target = tmp_path / ("eval-eval.json" if writer == "write_json" else "predictions-eval.jsonl")
    bodies = {i: [{"id": i, "text": "x" * 20000, "row": r} for r in range(20)] for i in range(6)}
    errors: list[BaseException] = []

    def write(i: int) -> None:
        try:
            for _ in range(15):
                if writer == "write_json":
                    runs.write_json(target, {"rows": bodies[i]})
                else:
                    runs.write_predictions(target, bodies[i], {})
        except BaseException as exc:  # collected: a thread's exception would be lost
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in bodies]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    text = target.read_text(encoding="utf-8")
    rows = json.loads(text)["rows"] if writer == "write_json" else [json.loads(line) for line in text.splitlines()]
    assert rows in bodies.values()
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name]
