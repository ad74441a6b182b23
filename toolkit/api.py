"""The Python API: what the command line does, as functions that return results.

    import toolkit
    run = toolkit.run("demo/sst2/minilm-lora", {"train.epochs": 1})   # or ["train.epochs=1"]
    run.dir, run.metrics["eval"]
    toolkit.evaluate(run)                          # {"eval": {...}, ...}
    toolkit.predict(run, "a great movie")          # [{"label": ..., "score": ..., "probabilities": {...}}]
    toolkit.export(run, "out", merge=True)

Arguments are Python values, checked against each function's annotations before any work
(toolkit/arguments.py): a string where a list goes is one item, overrides are a mapping or
`key=value` strings, and a wrong type is one UserError naming the argument. Everything that needs
no library (recipe, overrides, data files' heads) is checked before torch is imported.

User errors raise `toolkit.UserError` with the one line the CLI prints; nothing here prints a
traceback or exits. Ctrl-C during `run` raises `toolkit.errors.Interrupted` (a KeyboardInterrupt)
whose message says the step reached and how to resume. `toolkit.cli` is a thin layer over these
functions. Importing this module imports no torch, transformers or datasets: each function
imports what it uses.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import shutil
import signal
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Union

from toolkit import chain, devices, hub, quiet, recipe as recipe_module, reports, runs, sharding, sweeps
from toolkit.arguments import check, typed
from toolkit.errors import Interrupted, PeerStopped, UserError, disk_full, no_room, writing
from toolkit.recipe import RunPlan, find_recipe
from toolkit.recipe_data import override_leaves, safe_yaml

__all__ = ["Run", "evaluate", "export", "predict", "report", "run", "run_one", "sweep", "validate"]

# The argument types the functions below declare (and @typed checks): a path is a string or any
# os.PathLike (a Run is one); overrides are a mapping {"train.lr": 3e-4} or `key=value` strings
# (one string is one override); an input to predict is a text, a (text, text) pair (a question
# and its context too), a list of words (NER) or a mapping of the task's fields.
PathArg = Union[str, os.PathLike]
Overrides = Union[Mapping[str, Any], Iterable[str], None]
Text = Union[str, tuple[str, str], list[str], Mapping[str, Any]]


# a full disk, a place that cannot be written, or a file where a folder goes (or a folder where a
# file goes): the user's to fix, said with the path
DISK_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR,
               errno.EISDIR, errno.EEXIST, errno.ENAMETOOLONG}


def _place_refuses(exc: BaseException) -> Path | None:
    """The folder that takes no new file or folder, where `exc` is "no such file or directory"
    from making one in a folder that exists (`--out /proc/x`, a pseudo file system: ENOENT, not
    EACCES); asked of the folder itself by making a file there, so a file that was read and is
    missing stays the error it is (None)."""
    name = getattr(exc, "filename", None)
    if not isinstance(exc, FileNotFoundError) or not name:
        return None
    parent = Path(os.fsdecode(name)).parent
    if not parent.is_dir():
        return None
    try:
        fd, probe = tempfile.mkstemp(dir=parent, prefix=".toolkit-probe-")
    except FileNotFoundError:  # the folder's own answer to anything new
        return parent
    except OSError:  # read-only, full: not what this error was
        return None
    os.close(fd)
    os.unlink(probe)
    return None


def _unwritable(exc: BaseException) -> bool:
    """A full disk, a place that cannot be written, or a file where a folder goes: the user's."""
    return (isinstance(exc, OSError) and exc.errno in DISK_ERRORS) or disk_full(exc) \
        or _place_refuses(exc) is not None


def _disk_error(exc: BaseException) -> str:
    """A full disk or a place that cannot be written, said as such with the path (the user's to fix)."""
    refusing = _place_refuses(exc)
    if refusing is not None:
        return (f"{refusing}: this folder takes no new files or folders (making one there said 'no such file "
                "or directory'); write elsewhere (--runs-dir, --output, --out, export's OUT)")
    where = getattr(exc, "filename", None) or "a file"
    said = no_room(exc)
    if said is not None:
        return f"{said} while writing {where}; free some space or write elsewhere (--runs-dir, --output)"
    reason = getattr(exc, "strerror", None)  # read or written: the system's own words
    return f"{where}: {reason.lower() if reason else 'permission denied'}"


def _one_line(fn):
    """The API says what the CLI says: a full disk, an unwritable place, or a file where a folder
    goes (DISK_ERRORS) is the UserError with the CLI's line, not a bare OSError."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            with quiet.as_found(), hub.as_found(), _generators_as_found(), _compiler_as_found(), \
                    _accelerate_as_found():  # the caller's process as it was
                return fn(*args, **kwargs)
        except OSError as exc:
            if not _unwritable(exc):
                raise
            raise UserError(_disk_error(exc)) from None
    return wrapper


@contextmanager
def _compiler_as_found() -> Iterator[None]:
    """Dynamo's settings a compiled run changed (its recompile limit, failing past it) put back."""
    compiling = sys.modules.get("toolkit.compiling")
    if compiling is not None:
        compiling.keep_from_here()
    try:
        yield
    finally:
        compiling = sys.modules.get("toolkit.compiling")  # imported only by a run that compiles
        if compiling is not None:
            compiling.settings_as_found()


ACCELERATE_STATES = ("PartialState", "AcceleratorState", "GradientState")


@contextmanager
def _accelerate_as_found() -> Iterator[None]:
    """accelerate's process-wide states (PartialState, AcceleratorState, GradientState: one shared
    dict each, which every Accelerator reads) put back as the call found them. A run, eval or
    predict left the state of its own Accelerator set: a notebook's `Accelerator(mixed_precision=
    "bf16")` after `toolkit.run` raised "AcceleratorState has already been initialized ... restart
    your runtime", and an Accelerator the notebook made before the call computed in the run's
    precision afterwards (its fp32, not the bf16 it was made with). A state empty before the call
    (accelerate not imported yet) is empty after it, as in a fresh process."""
    module = sys.modules.get("accelerate.state")
    kept = {name: dict(getattr(module, name)._shared_state) for name in ACCELERATE_STATES} if module else {}
    try:
        yield
    finally:
        module = sys.modules.get("accelerate.state")
        if module is not None:
            for name in ACCELERATE_STATES:
                shared = getattr(module, name)._shared_state  # modified in place: the instances' __dict__
                shared.clear()
                shared.update(kept.get(name, {}))


@contextmanager
def _generators_as_found() -> Iterator[None]:
    """A run seeds the global random generators (random, numpy, torch and CUDA's) with its
    recipe's seed; the caller's states are put back after the call: a notebook's own sampling
    after `toolkit.run` repeated the same numbers after every run. A library first imported during
    the call is seeded from the system's entropy, as its import does (numpy's and torch's both:
    `import toolkit; toolkit.run(...); import torch` drew the run's numbers in every session). CUDA
    not yet initialized before the call is seeded as its initialization would have seeded it: with
    torch's seed as found (torch.manual_seed(7) before the call seeds CUDA with 7 when it starts)."""
    import random
    import sys

    np, torch = sys.modules.get("numpy"), sys.modules.get("torch")
    cuda = torch is not None and torch.cuda.is_initialized()
    kept = {"random": random.getstate(), "numpy": np and np.random.get_state(),
            "torch": torch and torch.random.get_rng_state(), "torch_seed": torch and torch.initial_seed(),
            "cuda": cuda and torch.cuda.get_rng_state_all()}
    try:
        yield
    finally:
        random.setstate(kept["random"])
        np, torch = sys.modules.get("numpy"), sys.modules.get("torch")
        if np is not None:
            np.random.set_state(kept["numpy"]) if kept["numpy"] else np.random.seed()
        if torch is not None and kept["torch"] is None:
            torch.seed()  # first imported here: entropy, for the CPU and every GPU, as its import gives
        elif torch is not None:
            torch.random.set_rng_state(kept["torch"])
            if kept["cuda"]:
                torch.cuda.set_rng_state_all(kept["cuda"])
            elif torch.cuda.is_initialized():  # started during the call: as its start would have seeded it
                torch.cuda.manual_seed_all(kept["torch_seed"])


@dataclass(frozen=True)
class Run:
    """A run folder (runs/<recipe>/<hash>) and what it wrote; a path itself (os.PathLike), so
    `toolkit.predict(run, ...)` takes it as it is. The folder is held as an absolute path, the
    one it named where it was made: with a relative runs_dir, a notebook's `%cd` (os.chdir) after
    `toolkit.run` made `run.metrics` {} (read as "not finished") and predict "no recipe.yaml
    here", exit 0 for the first."""

    dir: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "dir", Path(check(self.dir, PathArg, "Run: dir")).absolute())

    def __fspath__(self) -> str:
        return str(self.dir)

    @property
    def metrics(self) -> dict[str, Any]:
        """metrics.json of a finished run ({} while it is not finished); a damaged one is a
        UserError naming the file."""
        file = self.dir / "metrics.json"
        if not file.is_file():
            return {}
        try:
            value = json.loads(file.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            reason = exc.msg if isinstance(exc, json.JSONDecodeError) else "not UTF-8"
            raise UserError(f"{file}: damaged ({reason}); run the recipe again with force=True") from None
        if not isinstance(value, dict):
            raise UserError(f"{file}: damaged (not a JSON object); run the recipe again with force=True")
        return value


def override_list(overrides: Mapping[str, Any] | list[str] | None) -> list[str]:
    """`key=value` strings from either form; a mapping's values are Python values, written as
    JSON (a YAML subset) so that "no" stays a string and 1e-4 a number."""
    if overrides is None:
        return []
    if not isinstance(overrides, Mapping):
        return list(overrides)
    out = []
    for key, value in overrides.items():
        if not isinstance(key, str) or "=" in key or not key.strip():
            raise UserError(f"overrides[{key!r}]: a key is a dotted setting such as 'train.lr', the value "
                            "its own item: {'train.lr': 3e-4}")
        value = os.fspath(value) if isinstance(value, os.PathLike) else value
        try:
            out.append(f"{key}={json.dumps(value, allow_nan=False)}")
        except ValueError:  # a NaN or an infinity: said as `train.lr=.inf` says it, not as a wrong type
            said = f"{value!r} is" if isinstance(value, float) else f"{value!r} holds a number that is"
            raise UserError(f"overrides[{key!r}]: {said} not a finite number") from None
        except TypeError:
            raise UserError(f"overrides[{key!r}]: expected a string, number, true/false, None or a list "
                            f"or mapping of them, got {type(value).__name__}") from None
    return out


@_one_line
@typed
def run(recipe: PathArg, overrides: Overrides = None, *, runs_dir: PathArg | None = None,
        smoke: bool = False, force: bool = False, resume: bool = False, stop_after: int | None = None) -> Run:
    """Train and evaluate one recipe (a path or a shipped name) into its run folder; a finished
    run is returned as it is unless `force`, an interrupted one goes on from its checkpoint.
    `resume`, as `toolkit run --resume`: a run with no checkpoint to go on from is a UserError.
    `stop_after`, as `toolkit run --stop-after N`: stop (checkpointed, unfinished) after N
    optimizer steps; a run whose training is done by then (early stopping fired) finishes.
    `overrides`: {"train.epochs": 1} or ["train.epochs=1"]."""
    out = run_one(os.fspath(recipe), override_list(overrides), smoke=smoke,
                  runs_dir=None if runs_dir is None else os.fspath(runs_dir), force=force, resume=resume,
                  stop_after=stop_after)
    return Run(Path(out))


@_one_line
@typed
def validate(recipe: PathArg, overrides: Overrides = None, *, smoke: bool = False) -> dict:
    """Check a recipe (a path or a shipped name) with its overrides as `run` checks it before
    anything loads, as `toolkit validate` does: the recipe and overrides, the TOOLKIT_* folders,
    each data file and its head, this environment's accelerate settings. Returns the resolved
    recipe (what the run's recipe.yaml holds); raises the UserError the CLI prints."""
    plan = _checked(os.fspath(recipe), override_list(overrides), smoke)
    return {"name": plan.recipe.name, **plan.recipe.to_dict()}


def _checked(recipe: str | Path, overrides: list[str], smoke: bool = False) -> RunPlan:
    """What `run`, `validate` and every point of `sweep` check before torch is imported, in one
    place, so that `validate` refuses what `run` refuses: the recipe read, overridden and
    checked, the data files' heads, the accelerate settings left in the environment."""
    plan = recipe_module.plan(find_recipe(os.fspath(recipe)), overrides, smoke=smoke)
    recipe_module.check_data(plan.recipe)
    devices.check_accelerate_env(plan.recipe.train.mixed_precision)
    return plan


def _run_folder(run_dir: PathArg) -> Path:
    """A run folder, checked before torch is imported: the line inference would say, at once."""
    folder = Path(run_dir)
    recipe_module.check_environment()
    runs.check_utf8(folder, "run folder")
    if not (folder / "recipe.yaml").is_file():
        owner = next((p for p in list(folder.parents)[:2] if (p / "recipe.yaml").is_file()), None)
        if owner is not None:  # RUN/model, RUN/checkpoints/step-N: was "no recipe.yaml here" alone
            raise UserError(f"{folder}: a folder inside the run {owner}; eval, predict and export take the run "
                            f"folder and read its model/ (the run's result; a step checkpoint is not exported): "
                            f"give {owner}")
        raise UserError(f"{folder}: no recipe.yaml here; point at a run folder (runs/<recipe>/<hash>)")
    runs.is_finished(folder)  # a damaged metrics.json: said here, before torch is imported
    return folder


def _run_precision(folder: Path) -> str:
    """train.mixed_precision as the run's recipe.yaml holds it, read before torch is imported:
    what eval and predict compute in (inference.run_accelerator), and so the one value of
    ACCELERATE_MIXED_PRECISION they let pass. A recipe.yaml that does not read is said by the
    load that follows ("no" here)."""
    try:
        raw = safe_yaml((folder / "recipe.yaml").read_text(encoding="utf-8"), str(folder / "recipe.yaml"))
        value = raw.get("train", {}).get("mixed_precision", "no")
    except (OSError, UnicodeDecodeError, UserError, AttributeError):
        return "no"
    return value if isinstance(value, str) else "no"


def _scored_here(folder: Path, split: str) -> None:
    """eval writes eval-<split>.json (and the predictions) into the run folder: one it cannot
    write (a shared, read-only runs folder) is said before the evaluation runs, not after it,
    when the scores are lost."""
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UserError(f"{folder}: eval writes eval-{split}.json (and the predictions) into the run "
                        "folder, which cannot be written here (permission denied); copy the run folder "
                        "somewhere writable and evaluate the copy")
    runs.check_file_place(folder / f"eval-{split}.json")  # a folder there failed the write after the evaluation


@_one_line
@typed
def evaluate(run_dir: PathArg, split: str = "eval", overrides: Overrides = None, *,
             task_from: PathArg | None = None) -> dict:
    """Score a finished run on a split with its task's metrics (also writes eval-<split>.json, and
    returns what it holds: an undefined score is None, as in `Run.metrics`).
    `task_from`: score on the task of another recipe (a path or a shipped name), as
    `toolkit eval --task-from` does."""
    folder, items = _run_folder(run_dir), override_list(overrides)
    source = None if task_from is None else os.fspath(task_from)
    _scored_here(folder, split)
    devices.check_accelerate_env(_run_precision(folder), scoring=True)
    quiet.libraries()
    from toolkit import inference

    with runs.reading(folder, "evaluate"):  # not the old model into a folder a --force rerun clears
        _data_of_the_run(folder, items, source)
        # what eval-<split>.json holds: a score the data leaves undefined is None, as in run.metrics
        # (it was NaN here and null in the files: `evaluate(run)["eval"] == run.metrics["eval"]` was False)
        return runs.finite(inference.evaluate_run(folder, split, items, source))


def _data_of_the_run(folder: Path, overrides: list[str], task_from: str | None) -> None:
    """`toolkit eval RUN` scores the run on the data its recipe names, and writes the score into
    the run folder as the run's. Those files must be the data the run was made with (metrics.json
    data_sha256), or it is one line: a file named by a relative path is read from the working
    directory (docs/tasks.md), so eval from another folder scored whatever file of that name was
    there; and a file edited (or replaced) since the run, by any path, was scored as the run's
    data, exit 0 (only relative paths were checked). Naming the file (task.eval_file=...) or the
    task (--task-from) is the user's explicit choice and is not checked."""
    if task_from or any(leaf[-1].endswith("_file") or leaf[-1] == "data_dir" for leaf in override_leaves(overrides)):
        return  # `task={eval_file: x}` as `task.eval_file=x`: the mapping was refused as the run's own data
    from toolkit import inference

    recipe = inference.run_recipe(folder, overrides, None)
    named = recipe_module.named_files(recipe.task)
    ran_on = (Run(folder).metrics or {}).get("data_sha256")
    if not named or ran_on is None:
        return
    relative = [(s, p) for s, p in named if not p.is_absolute()]
    missing = next(((s, p) for s, p in named if not p.is_file()), None)
    if missing is None and runs.data_fingerprint(recipe.task.data_files()) == ran_on:
        return
    if not relative:  # (a file gone was said as the recipe was read)
        which = ", ".join(f"{s}={p}" for s, p in named)
        raise UserError(f"{which}: not the data this run was made with (metrics.json data_sha256): a file "
                        f"changed since the run; put it back, or name the data to score on, on purpose: "
                        f"{named[0][0]}=/full/path")
    setting, path = missing or relative[0]
    here = "there is no such file here" if missing else \
        f"the file of that name here ({path.resolve()}) is not the data this run was made with (metrics.json data_sha256)"
    raise UserError(f"{setting}: {path} is named relative to the working directory, and {here}; run this "
                    f"from the folder the run was started in, or name the file: {setting}=/full/path")


@_one_line
@typed
def predict(run_dir: PathArg, texts: Iterable[Text]) -> list[dict]:
    """One dict per input of a trained run: its fields and the task's prediction (classification:
    `label`, its `score` and every label's `probabilities`; regression: `score`; NER: `tags` per
    word, and where the model tagged some words `O` unseen, `tagged` (the words that fit a cut
    sentence) and `no_token` (the indices of words of no sub-token); summarization, translation, QA: `prediction`, the text; docs/tasks.md). An input is a
    text, a (text, text) pair, a list of words, or a mapping with the task's fields (its other
    keys carried through to its row; one named as a predicted field, a gold `label`, as
    `input_label`: inference.carried); one text alone is one input. No inputs are no predictions (the tasks' encoders failed on an empty
    batch with a ValueError about a column)."""
    folder, items = _run_folder(run_dir), list(texts)
    if not items:
        return []
    devices.check_accelerate_env(_run_precision(folder), scoring=True)
    quiet.libraries()
    from toolkit import inference

    return inference.predict_rows(folder, items)


@_one_line
@typed
def export(run_dir: PathArg, out: PathArg, merge: bool = False) -> str:
    """A plain transformers (or PEFT) folder at `out`; returns the line saying what was written.
    One export to a place at a time: a second one at once is refused."""
    sharding.check_api_writer("export", f"the folder {out}")
    folder = _run_folder(run_dir)
    with _one_export(Path(out)) as target:
        quiet.libraries()
        from toolkit import inference

        return inference.export_run(folder, target, merge, None)


@contextmanager
def _one_export(out: Path) -> Iterator[Path]:
    """The lock a run takes (runs.locked), held on an export's target: two exports to one place
    at once would write one folder twice. Gives the target (`_export_target`), which both lock."""
    target = _export_target(out)
    lock = runs.locked(target)
    try:
        lock.__enter__()
    except UserError:
        raise UserError(f"export: {target} is being written by another export right now; wait for it "
                        "to finish, or export elsewhere") from None
    try:
        yield target
    finally:
        lock.__exit__(None, None, None)


def _export_target(out: Path) -> Path:
    """The folder an export puts in place of `out`: the one `out` names, links followed. An export
    is written beside its target and renamed onto it; a link to an empty folder was 'not a
    directory' and `export RUN .` (the current, empty folder) an OSError traceback, each after the
    whole export was written and then thrown away. The current folder is refused first: replaced,
    it would leave the shell in a removed folder, with the export out of its sight."""
    target = Path(os.path.realpath(out))
    if target == Path(os.path.realpath(".")):
        raise UserError(f"export: {out} is the current folder; an export is written as a folder of its own "
                        f"and put in place whole: give a new folder's name (e.g. {Path(out) / 'model'})")
    return target


@_one_line
@typed
def sweep(recipes: Iterable[PathArg], axes: Iterable[str] | None = None, *,
          seeds: Union[int, str, Iterable[int], None] = None,
          runs_dir: PathArg | None = None, smoke: bool = False, force: bool = False,
          keep_going: bool = False) -> list[Run]:
    """Every recipe x every combination of `axes` (`train.lr=1e-4,3e-4`; one string is one axis)
    x seeds (42, "42,43" or [42, 43]; 3 or "3" is a count, as --seeds 3; [3] is the seed 3; None,
    the default, each recipe's own train.seed, as `toolkit sweep` without --seeds), run one after another in this process; every point is checked, its data files' heads included,
    before the first one runs. A point another process is running right now is left to it (its
    Run is returned, not finished), as `toolkit sweep` does. `keep_going` (`--keep-going`): a point
    whose run fails (a UserError) is said and the sweep goes on; the failed points are raised in one
    UserError at the end."""
    root = runs.runs_root(None if runs_dir is None else os.fspath(runs_dir))
    _check_runs_root(root)
    # 3 or "3" is a count, as `--seeds 3` is; [3] is the seed 3 (it ran 42, 43 and 44)
    # None: each recipe's own seed (the default was 42, so a recipe with seed 7 ran 7 from the CLI and 42 here)
    seed_arg = None if seeds is None else str(seeds) if isinstance(seeds, (int, str)) else list(seeds)
    points, folders = sweeps.plan([find_recipe(os.fspath(r)) for r in recipes], list(axes or []), seed_arg, root, smoke)
    for point, out in zip(points, folders):
        _checked(point.recipe, point.overrides, smoke)
        runs.check_run_place(out)  # a file where the run's folder (or one above it) goes
        if not force and not _finished(out):  # a damaged metrics.json, an edited recipe.yaml: said before the first run
            runs.check_checkpoints_folder(out)  # a file where a folder goes, a folder where a file: before the first run
    sweeps.upstreams_ready(points, folders, root, smoke, force)
    done, failed = [], []
    for i, (point, out) in enumerate(zip(points, folders), 1):  # a point another process runs is left to it
        holder = runs.run_elsewhere(out) if force or not runs.is_finished(out) else None
        if holder is not None:
            runs.left_to_another(holder, "sweep")
            print(f"{holder} right now: left to it; the sweep goes on with the next point")
        elif force or not runs.is_finished(out):
            sweeps.as_planned(point, out, root, smoke, f"run {i} of {len(points)}")
        if holder is not None:
            done.append(Run(out))
            continue
        try:
            done.append(run(point.recipe, point.overrides, runs_dir=root, smoke=smoke, force=force))
            continue
        except runs.Busy as exc:  # taken by another process since the check above: left to it as well
            if runs.took_over(exc, out):
                runs.left_to_another(runs.holder_of(exc), "sweep")
                print(f"{runs.holder_of(exc)} right now: left to it; the sweep goes on with the next point")
                done.append(Run(out))
                continue
            error = exc  # another run's lock (an upstream's): this point failed
        except PeerStopped as exc:  # under a launch, another process stopped: no point goes on without it
            raise PeerStopped(f"sweep: run {i} of {len(points)} ({point}): {exc}; finished runs are kept: the same "
                              "call continues from there") from None
        except UserError as exc:  # which point, as `toolkit sweep` says it (the run's own line alone named none)
            error = exc
        if not keep_going:
            raise UserError(f"sweep: run {i} of {len(points)} ({point}) failed: {error}; finished runs are kept: "
                            "the same call continues from there") from None
        failed.append(f"run {i} of {len(points)} ({point}) failed: {error}")
        print(f"sweep: {failed[-1]}; keep_going: on with the next point", file=sys.stderr, flush=True)
    if failed:
        raise UserError(sweeps.kept_going(failed, len(points)))
    return done


@_one_line
@typed
def report(runs_dir: Iterable[PathArg], *, row_key: str | None = None, col_key: str | None = None,
           metrics: Iterable[str] | None = None, glue: bool = False, plots: bool = False,
           out: PathArg | None = None) -> str:
    """The Markdown report of one folder of runs (or a list of them), as `toolkit report` writes
    it (report.md, and PNGs with `plots`, into `out`: default the first folder)."""
    sharding.check_api_writer("report", "report.md")
    folders = [Path(r) for r in runs_dir]
    if not folders:
        raise UserError("report: runs_dir: give at least one folder of runs")
    return reports.render(folders, plots=plots, row_key=row_key, col_key=col_key, metrics=metrics or None,
                          glue=glue, out=None if out is None else Path(out))


@typed
def run_one(path: PathArg, overrides: Iterable[str], smoke: bool = False, runs_dir: PathArg | None = None,
            force: bool = False, resume: bool = False, stop_after: int | None = None) -> Path:
    """One recipe into its run folder: skipped when finished (unless forced), resumed when
    interrupted, refused while another process runs it. `run` and every point of `sweep` go
    through here. Everything that can be checked without torch is checked first (the recipe,
    the overrides, the runs folder, each data file's head); then torch is imported. Returns the
    run folder."""
    path, runs_dir = os.fspath(path), None if runs_dir is None else os.fspath(runs_dir)
    if stop_after is not None and stop_after < 1:  # 0 was falsy: the whole run trained, finished, exit 0
        raise UserError(f"stop_after: must be at least 1 (optimizer steps), got {stop_after}")
    if force and resume:  # --force removed the checkpoints --resume asked to go on from, exit 0
        raise UserError("--force and --resume ask for opposite things: --force starts the run again from step 0 "
                        "and removes its checkpoints, --resume goes on from the newest of them; give one of them "
                        "(a plain run goes on from its checkpoint anyway)")
    plan = _checked(path, list(overrides), smoke)
    root = runs.runs_root(runs_dir)
    _check_runs_root(root)
    out = runs.run_dir(plan.recipe, root)  # a chained run's upstream id is in the plan already (parse_plan)
    runs.check_run_place(out)  # a file where the run's folder (or one above it) goes
    finished = not force and _finished(out)  # a damaged metrics.json, an edited recipe.yaml: said before torch
    if not finished and not force:  # what it resumes from, before anything runs (--force removes it)
        runs.check_checkpoints_folder(out)
    quiet.libraries()
    from toolkit import train  # torch: imported on the first run, after every check above

    if resume and not finished and not runs.has_checkpoint(out):  # before a smoke chain's upstream trains
        raise UserError(_nothing_to_resume(out, out.exists(), plan.recipe, train.checkpoints))
    if plan.recipe.smoke:
        _smoke_upstream(plan, root)
    chain.resolve(plan, root)  # model.checkpoint: {run: ...}
    chain.check_current(plan.upstream if force else plan, root)  # each finished run on its upstream as it is
    rank0 = int(os.environ.get("RANK", "0")) == 0
    if _finished_already(out, force, rank0, plan.recipe):
        return out
    existed = out.exists() and not force
    with runs.locked(out, folder=True):  # a second launch of the same run refuses here
        if _finished_already(out, force, rank0):  # by the launch that held the lock a moment ago
            return out
        if force and rank0:
            runs.clear(out)  # its contents: the folder itself is what the lock holds
        if resume and not runs.has_checkpoint(out):  # every process, before anything is written
            raise UserError(_nothing_to_resume(out, existed, plan.recipe, train.checkpoints))
        if rank0:  # a checkpoint a kill left whole under its temporary name is one to go on from
            for said in runs.settle_checkpoints(out):
                print(f"note: {said}", file=sys.stderr)
        resume = resume or (existed and bool(runs.checkpoints(out)))
        if not runs.checkpoints(out) and rank0 and not os.environ.get("TOOLKIT_SWEEP_CHILD"):
            train.checkpoints.say_other_attempt(out, plan.recipe, runs.world_size())  # what changed
            _say_made_before_the_strategy(plan.recipe, root)
        try:
            with _whole_or_gone(out, made_here=not existed), \
                    writing(out, "make room (or use another --runs-dir): the same command goes on "
                            "from the last checkpoint", ask_the_disk=True):
                metrics = train.run(plan, out, resume=resume, stop_after=stop_after)
        except (KeyboardInterrupt, BrokenPipeError) as exc:  # a closed stdout (`| head`) stops it as Ctrl-C does
            again = [*overrides, *["--smoke"] * smoke, *(["--runs-dir", str(runs_dir)] if runs_dir else [])]
            stopped = _interrupted(exc, out, existed, str(path), again)
            if isinstance(exc, BrokenPipeError):
                stopped.signal = signal.SIGPIPE
            raise stopped from None
    if metrics is not None and rank0:
        evals = ", ".join(f"{k}={v:.4f}" for k, v in metrics["eval"].items())
        print(f"{out}: {evals}")
    return out


def _nothing_to_resume(out: Path, existed: bool, recipe: Any, checkpoints: Any) -> str:
    """--resume asks to go on from a checkpoint; with none it started from step 0 on one stdout line,
    exit 0 (Trainer's resume_from_checkpoint=True raises "No valid checkpoint found"). Said with why
    there is none: a method that trains nothing, a folder stopped before its first checkpoint, or no
    run folder at all, often because a changed recipe, data file, process count or strategy is another run."""
    again = "run it without --resume to start it from step 0"
    if not recipe.method.trains:
        return (f"--resume: {out}: method {recipe.method.name} trains nothing, so its runs keep no checkpoint "
                "to go on from; run it without --resume")
    if existed:
        return (f"--resume: {out} holds no checkpoint to go on from (it was stopped before its first one); "
                f"{again}")
    other = checkpoints.other_interrupted(out, recipe, runs.world_size())
    if other is not None:
        return (f"--resume: {out} was never started, so it has no checkpoint to go on from; {other}, and this "
                f"launch is another run: {again}, or launch that one's settings and data to go on with it")
    return (f"--resume: {out} was never started (no run folder), so it has no checkpoint to go on from (a "
            f"changed recipe, data file, process count or STRATEGY is another run); {again}")


@contextmanager
def _whole_or_gone(out: Path, made_here: bool) -> Iterator[None]:
    """A user error before a run's first checkpoint leaves no half-made run folder (recipe.yaml and
    identity.json alone, which looks like a run): one this launch made (or emptied with --force)
    is emptied, and the folder lock then removes the folders it made. One an earlier launch made,
    or one with a checkpoint to resume from, is kept."""
    try:
        yield
    except (UserError, RuntimeError) as exc:
        # another process of the launch stopped on its own error: this one stops with it, as on
        # a user error (the folder was left half-made where rank 1's error came first)
        gone = sharding.peer_stopped(exc) if not isinstance(exc, UserError) else None
        if not isinstance(exc, UserError) and gone is None:
            raise
        _drop_partial_checkpoint(out)  # a full disk mid-save: the checkpoint before is what resumes
        if made_here and int(os.environ.get("RANK", "0")) == 0 and not runs.checkpoints(out):
            runs.clear(out)
        if gone is not None:
            raise PeerStopped(gone) from None
        raise


def _drop_partial_checkpoint(out: Path) -> None:
    """A checkpoint stopped while being written (checkpoints/tmp-*: Ctrl-C, a full disk) is removed,
    and one stopped while being renamed, whole, is kept under its step's name
    (runs.settle_checkpoints); the newest whole one is what `--resume` goes on from."""
    if int(os.environ.get("RANK", "0")) == 0:
        runs.settle_checkpoints(out)


def _interrupted(exc: BaseException, out: Path, existed: bool, recipe: str, rest: list[str]) -> Interrupted:
    """Ctrl-C during a run: one line saying the step reached, what was kept and the command that
    goes on from there. A folder this launch created and that holds no checkpoint is removed,
    unless the run finished: stopped after metrics.json was written (while its checkpoints were
    removed, or a tracker closed), the finished run of a new folder was deleted whole ("nothing
    was kept"), or said to keep a half-removed checkpoint to resume from. The command named is this
    launch's (`runs.run_command`: `make run NPROC=2 ...` under a launch of 2, whose run the plain
    `toolkit run` is not)."""
    step, total = getattr(exc, "step", None), getattr(exc, "total", None)
    _drop_partial_checkpoint(out)
    if runs.is_finished(out):  # stopped after metrics.json (removing checkpoints/, closing trackers)
        return Interrupted(f"interrupted after the run finished: {out} holds its whole result (metrics.json, "
                           f"model/); `{runs.run_command(recipe, rest)}` says so and removes what it was still "
                           "clearing away", step, total)
    reached = f"at step {step} of {total}" if step is not None else \
        "outside the training steps" if isinstance(exc, KeyboardInterrupt) else "while training"
    kept = runs.last_step(out)
    if kept is not None:
        return Interrupted(f"interrupted {reached}; {out} keeps the checkpoint of step {kept}: "
                           f"`{runs.run_command(recipe, [*rest, '--resume'])}` goes on from there", step, total)
    if not existed and out.exists() and int(os.environ.get("RANK", "0")) == 0:
        # rank 0 alone, as it alone made it: another process holds no lock and may have found the
        # folder of another launch (rank 0 stopped on its lock), training before its first checkpoint
        shutil.rmtree(out, ignore_errors=True)
    return Interrupted(f"interrupted {reached}, before any checkpoint: nothing was kept; "
                       f"`{runs.run_command(recipe, rest)}` starts it again", step, total)


def _finished_already(out: Path, force: bool, rank0: bool, recipe: Any = None) -> bool:
    """A finished run is not repeated (--force runs it again): said once, by rank 0. With `recipe`,
    step checkpoints a stopped launch left in it (stopped while removing them, after metrics.json)
    are removed where `train.keep_checkpoints` says a finished run keeps none."""
    if force or not _finished(out):
        return False
    if rank0:
        print(f"{out} is finished already (metrics.json); --force runs it again")
        changed = recipe_module.without_effect_changed(recipe, out) if recipe is not None else []
        if changed:  # one run id: nothing of these is done by this launch
            print(f"note: {out} was made with {'; '.join(changed)}, which change no result (the same run); "
                  "this launch does nothing of them: --force runs it again with them", file=sys.stderr)
        if recipe is not None and not recipe.train.keep_checkpoints and (out / "checkpoints").is_dir():
            try:
                with runs.locked(out, folder=True):  # not while a --force launch trains it anew
                    shutil.rmtree(out / "checkpoints", ignore_errors=True)
                    print(f"note: removed the step checkpoints a stopped launch left in {out} "
                          "(train.keep_checkpoints: false)", file=sys.stderr)
            except UserError:
                pass
    return True


AGAIN = " (the recipe this command runs held it, resolved; --force trains the run again and writes it)"


def _finished(out: Path) -> bool:
    """A finished run that `run` and `sweep` skip: finished, and its recipe.yaml the recipe the run
    was made with (recipe.finished_as_made), or one line."""
    if not recipe_module.finished_as_made(out, AGAIN):
        return False
    _finished_under_this_launch(out)
    return True


def _finished_under_this_launch(out: Path) -> None:
    """A finished run is finished for the strategy it ran under. One process and DDP are not in
    the run id (runs.run_id), FSDP and ZeRO are; runs made before that under FSDP or ZeRO hold the
    id a DDP launch of the same recipe and process count has now: launched so, it printed
    "finished already" and the sharded run's metrics stood for it, exit 0. One line instead."""
    try:
        metrics = runs.read_json(out / "metrics.json")
    except (OSError, ValueError):
        return  # said by the entry point that reads it
    then, now = runs.recorded_strategy(metrics), runs.strategy()
    # one process and DDP: the process count in the id tells them apart already (a metrics.json
    # without num_processes read as one process is no other computation at this id)
    if then != now and not {then, now} <= set(runs.NEUTRAL_STRATEGIES):
        processes = metrics.get("num_processes", "?")
        raise UserError(f"{out}: finished under STRATEGY={then} on {processes} process(es) (made before the "
                        f"strategy was part of a run id), and this launch is STRATEGY={now}, another computation: "
                        "its metrics are not this launch's; move the folder away to keep it (eval, predict and report "
                        f"read it there), or --force to run it again under STRATEGY={now} (replacing it)")


def _say_made_before_the_strategy(recipe: Any, root: Path) -> None:
    """Before an FSDP or ZeRO run starts from step 0: a note naming the finished run of this recipe
    under the same strategy made before the strategy was part of the run id (at the id the plain
    launch has now), whose result would otherwise go unmentioned while this launch trains again."""
    now = runs.strategy()
    if now in runs.NEUTRAL_STRATEGIES:
        return
    plain = runs.run_dir(recipe, root, way="ddp")  # ddp and none: the id without a strategy
    try:
        metrics = runs.read_json(plain / "metrics.json") if runs.is_finished(plain) else None
    except (OSError, ValueError, UserError):
        return
    if not metrics or "strategy" in metrics:
        return
    then = runs.recorded_strategy(metrics)
    if then == now or (then == "deepspeed" and now.startswith("zero")):
        print(f"note: {plain} is a finished run of this recipe under STRATEGY={then}"
              f"{' (its ZeRO stage not recorded)' if then == 'deepspeed' else ''}, made before the strategy was "
              f"part of a run id (it has the plain launch's id); this launch is a run of its own, from step 0 "
              "(that folder keeps the earlier result: eval, predict and report read it)", file=sys.stderr)


def _smoke_upstream(plan: RunPlan, root: Path) -> None:
    """--smoke runs every recipe end to end: a chained one first runs the smoke run it starts from."""
    from toolkit import train  # torch: imported on the first run

    up = plan.upstream
    if up is None or runs.is_finished(runs.run_dir(up.recipe, root)):
        return
    _smoke_upstream(up, root)
    chain.resolve(up, root)
    out = runs.run_dir(up.recipe, root)
    existed = out.exists()
    with runs.locked(out, folder=True):  # two smoke runs chained to one upstream run train it once
        if not runs.is_finished(out):
            with _whole_or_gone(out, made_here=not existed):
                train.run(up, out, resume=bool(runs.checkpoints(out)))


def _loops(place: Path) -> bool:
    """A symbolic link whose chain never ends (resolving it raises: RuntimeError before Python
    3.13, OSError ELOOP after)."""
    try:
        place.resolve(strict=True)
    except (RuntimeError, OSError) as exc:
        return isinstance(exc, RuntimeError) or getattr(exc, "errno", None) == errno.ELOOP
    return False


def _check_runs_root(root: Path) -> None:
    """A runs folder that cannot take a run is said before any model loads."""
    runs.check_utf8(root, "--runs-dir")
    for place in [root, *root.parents]:  # a link to nowhere: mkdir said "file exists"; a loop: a RuntimeError
        if place.is_symlink() and not place.exists():
            said = "leads back to itself; point it at a folder" if _loops(place) else "does not exist; create it"
            raise UserError(f"--runs-dir: {place} is a symbolic link to {os.readlink(place)}, which {said}, "
                            "or give another folder")
    if root.exists() and not root.is_dir():
        raise UserError(f"--runs-dir: {root} is a file, not a folder")
    existing = next((p for p in [root, *root.parents] if p.exists()), Path("."))
    if not existing.is_dir():  # runs_dir=notes.txt/runs: a file on the way
        raise UserError(f"--runs-dir: {existing} is a file, not a folder (in {root})")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"--runs-dir: {existing} is not writable")


