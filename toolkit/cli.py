"""Command line: argument parsing only; the work happens in the modules it calls."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from toolkit import (devices, hf_tables, methods, quiet, recipe as recipes, reports as report, runs, sharding,
                     sweeps as sweep, tasks)
from toolkit.api import (_check_runs_root, _data_of_the_run, _disk_error as disk_error, _finished, _one_export,
                         _run_folder, _run_precision, _scored_here, _checked, _unwritable, run_one)
from toolkit.attention import ATTENTION
from toolkit.arguments import ArgumentsError, Parser
from toolkit.errors import STOPPED_WITH_THE_LAUNCH, Interrupted, PeerStopped, UserError, user_path
from toolkit.recipe import find_recipe, read_yaml, recipe_files, recipes_root
from toolkit.recipe_data import SECTION_NAMES, dump_yaml
from toolkit.versions import warn_if_untested


def cmd_run(args: argparse.Namespace) -> int:
    if not args.recipe.strip():  # `make run RECIPE=`: said as validate, sweep and cp say it, where it was
        find_recipe(args.recipe)  # "run_one: path: an empty path", naming a function of the toolkit's
    warn_if_untested()
    run_one(args.recipe, args.overrides, args.smoke, args.runs_dir, args.force, args.resume, args.stop_after)
    return 0


def is_override(word: str) -> bool:
    """`key=value` beside recipes (sweep, validate) is an override or axis; a recipe file whose path
    holds '=' (`runs/lr=1e-4/r.yaml`) is a recipe: it was taken for an override, so `sweep` said
    "no recipe given" and `validate` checked every shipped recipe against a section 'runs/lr'.
    A word no file can be named by (a name part past the file system's 255 bytes: an axis of many
    values, a long `task.labels=[...]`) is an override: it was refused as 'file name too long'."""
    if "=" not in word:
        return False
    try:
        return not Path(word).expanduser().is_file()
    except OSError:  # ENAMETOOLONG: no file has this name
        return True


def cmd_sweep(args: argparse.Namespace) -> int:
    paths = [find_recipe(a) for a in args.overrides if not is_override(a)]
    root = runs.runs_root(args.runs_dir)
    _check_runs_root(root)  # said once here, not once per point
    points, folders = sweep.plan(paths, [a for a in args.overrides if is_override(a)], args.seeds, root, args.smoke)
    reporting = None if args.report is None else _report_options(args.report, root)  # refused before any run
    for point, out in zip(points, folders):  # every point's data files' heads, before the first run starts
        _checked(point.recipe, point.overrides, args.smoke)
        runs.check_run_place(out)  # a file where the run's folder (or one above it) goes
        if not args.force and not _finished(out):  # and a damaged metrics.json, a finished run's recipe.yaml edited since
            runs.check_checkpoints_folder(out)  # a file where a folder goes, a folder where a file: before the first run
    if args.estimate and runs.world_size() > 1:
        raise UserError(f"sweep --estimate: measures one process on this machine, and this launch has "
                        f"{runs.world_size()}; run it as plain `toolkit sweep ... --estimate`")
    if args.dry_run or args.estimate:
        sweep.finished_current(points, folders, root, args.smoke, args.force)  # the sweep's refusal, said here too
        if runs.rank() == 0:  # one plan for the launch, not one per process
            print_plan(points, folders, args.estimate, args.smoke, args.force)
        return 0
    if args.keep_going and runs.world_size() > 1:
        raise UserError(f"sweep --keep-going: this launch has {runs.world_size()} processes, each running the sweep, "
                        "and a run that fails on one of them leaves the others' run waiting in its collectives; "
                        "run it as plain `toolkit sweep ... --keep-going` (each point's own launch is set by its recipe), "
                        "or without --keep-going")
    sweep.upstreams_ready(points, folders, root, args.smoke, args.force)  # each chained point's upstream, before the first
    say = print if runs.rank() == 0 else (lambda *_, **__: None)  # the launch's progress, said once
    left: list[Path] = []
    failed: list[str] = []  # --keep-going: the points that failed, said at the end
    for i, (point, out) in enumerate(zip(points, folders), 1):
        say(f"[{i}/{len(points)}] {point}", flush=True)
        if not args.force and runs.is_finished(out):
            say(f"{out} is finished already (metrics.json); --force runs it again", flush=True)
            continue
        if (holder := runs.run_elsewhere(out)) is not None:
            runs.left_to_another(holder, "sweep")
            print(f"{holder} right now: left to it; the sweep goes on with the next point", flush=True)
            left.append(out)
            continue
        sweep.as_planned(point, out, root, args.smoke, f"run {i} of {len(points)}")
        # One process per point: peak memory (CPU: the process's max RSS) and library state
        # belong to that run alone. The child is `toolkit run`: same skip/resume/force path.
        flags = ["--smoke"] * args.smoke + ["--force"] * args.force + ["--runs-dir", str(root)]
        # SWEEP_CHILD names the point's folder: one another process takes before the child's lock
        # (it imports torch first) is left to that process too (LEFT_TO_ANOTHER)
        child = subprocess.Popen([sys.executable, "-m", "toolkit.cli", "run", str(point.recipe),
                                  *point.overrides, *flags],
                                 env={**os.environ, SWEEP_CHILD: str(out), **sharding.point_launch(i)})
        try:
            code = child.wait()
        except KeyboardInterrupt:  # Ctrl-C reached the run too: it stops and keeps its checkpoint
            if _STOPPED_BY:  # a SIGTERM / SIGHUP sent to the sweep alone: passed on, the run stops as well
                child.send_signal(_STOPPED_BY[0])
            code = child.wait()
        if code in _STOP_CODES:  # one line for both: where the sweep is, what the run kept
            raise Interrupted(f"sweep stopped at run {i} of {len(points)} ({point}): "
                              f"{_kept(out)}; the same command skips the finished runs and goes on "
                              "from there", signal=code - 128 if code > 0 else -code)
        if code == LEFT_TO_ANOTHER:  # taken by another process since the check above: left to it as well
            holder = runs.run_elsewhere(out) or f"{out} is being run by another process"  # (or was, a moment ago)
            runs.left_to_another(holder, "sweep")
            print(f"{holder} right now: left to it; the sweep goes on with the next point", flush=True)
            left.append(out)
            continue
        if code == STOPPED_WITH_THE_LAUNCH:  # under a launch, another process stopped: no point goes on without it
            raise PeerStopped(f"sweep: run {i} of {len(points)} ({point}) stopped with the launch: another of its "
                              "processes stopped first; finished runs are kept: the same command continues from there")
        if code != 0:
            what = f"run {i} of {len(points)} ({point}) failed (exit {code})"
            if not args.keep_going:
                raise UserError(f"sweep: {what}; finished runs are kept: the same command continues from there")
            failed.append(what)
            say(f"sweep: {what}; --keep-going: on with the next point", flush=True)
    say(f"sweep: {len(points) - len(left) - len(failed)} runs done" + (f"; {len(left)} left to the processes running them "
          f"right now ({', '.join(map(str, left))}): the same command later skips them once finished" if left else ""))
    if reporting is not None and runs.rank() == 0:  # --keep-going: the failed seeds counted in their cells
        try:
            _report_of_the_sweep(reporting, root, points, folders, args)
        except UserError as exc:  # no point finished, say: the failed points' line first, then why no report
            if not failed:
                raise
            raise UserError(f"{sweep.kept_going(failed, len(points))}; no report: {exc}") from None
    if failed:
        raise UserError(sweep.kept_going(failed, len(points)))
    return 0


def _report_options(text: str, root: Path) -> argparse.Namespace:
    """`sweep --report '--rows task --cols method'`: toolkit report's options, parsed (and the pivot
    axes checked) before the first run, so a typo is said now and not after hours of training."""
    whole = parser()
    try:
        words = shlex.split(text)
        rep = _subparsers(whole)["report"]
        given, extra = rep.parse_known_args([str(root), *words])
        if extra:  # said as `toolkit report` says them: a near name (--glu: --glue?)
            raise ArgumentsError(rep.prog, f"unrecognized arguments: {' '.join(extra)}", extra)
    except UserError as exc:  # argparse's refusal (ArgumentsError: a near name said), an option given twice
        said = arguments_error(whole, exc).split(": ", 1)[1].split(" (")[0] if isinstance(exc, ArgumentsError) else exc
        raise UserError(f"sweep --report '{text}': {said} (it takes toolkit report's options: --rows, --cols, "
                        "--metric, --glue, --no-plots; toolkit report --help)") from None
    except ValueError as exc:  # shlex: an unclosed quote
        raise UserError(f"sweep --report '{text}': {exc} (quote as a shell does)") from None
    if given.runs_dir != [str(root)] or given.out is not None:
        raise UserError(f"sweep --report '{text}': give report options alone; the report is of this sweep's runs, "
                        f"written into its runs folder ({root})")
    try:
        for key, where in ((given.rows, "--rows"), (given.cols, "--cols")):
            if key is not None:
                report.check_axis(key, where)
    except UserError as exc:
        raise UserError(f"sweep --report '{text}': {exc}") from None
    return given


def _report_of_the_sweep(given: argparse.Namespace, root: Path, points: list, folders: list[Path],
                         args: argparse.Namespace) -> None:
    """report.md of the sweep's own points into its runs folder, printed as `toolkit report` prints it;
    a point not finished with no recipe.yaml yet (left to another process starting it) is counted
    in its cell by its planned recipe."""
    if not any(runs.is_finished(f) for f in folders):
        raise UserError(f"report: none of the sweep's {len(folders)} runs finished")
    metrics = [m for item in given.metric or [] for m in item.split(",")]
    command = shlex.join(["toolkit", "sweep", *args.overrides, *(["--seeds", args.seeds] if args.seeds is not None else []),
                          *["--smoke"] * args.smoke, "--runs-dir", str(root)])
    planned = {out: "" if runs.is_finished(out) or (out / "recipe.yaml").is_file()
               else recipes.dump(recipes.load(point.recipe, point.overrides, smoke=args.smoke))
               for point, out in zip(points, folders)}
    print(report.render([root], plots=not given.no_plots, row_key=given.rows, col_key=given.cols,
                        metrics=metrics or None, glue=given.glue, sweep=(planned, command)))


def print_plan(points: list, folders: list[Path], with_estimate: bool, smoke: bool, force: bool = False) -> None:
    """--dry-run: each point, its state and its cost; --estimate: and the measured wall time of
    each point still to run."""
    # the launch's processes: under torchrun each step takes batch x grad_accum on every one
    point_costs = sweep.costs(points, smoke, runs.world_size())
    todo = [i for i, f in enumerate(folders) if force or not runs.is_finished(f)]
    times: dict[int, float] = {}
    if with_estimate and todo:
        times = dict(zip(todo, sweep.estimate([points[i] for i in todo], [point_costs[i] for i in todo], smoke)))
    for i, (line, c) in enumerate(zip(sweep.describe(points, folders, force), point_costs)):
        when = f"; about {sweep.duration(times[i])}" if i in times else ""
        print(f"{line}\n       {sweep.cost_line(c)}{when}")
    steps, seen = sum(c.steps for c in point_costs), sum(c.examples_seen for c in point_costs)
    print(f"{len(points)} runs (dry run: nothing was started): {steps:,} optimizer steps reading "
          f"{seen:,} training examples in all; {len(todo)} still to run")
    if with_estimate:
        print(f"estimate: about {sweep.duration(sum(times.values()))} for the {len(todo)} runs still to run, one "
              f"after another on this machine. Measured here: {sweep.MEASURED_STEPS} optimizer steps (after one "
              "to warm up) and one small evaluation of each distinct recipe shape (model, method, task, batch), "
              "extrapolated linearly to each run's steps and evaluations; tokenizing the full data is not "
              f"counted. Load average while measuring: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores "
              "(others' work slows what is measured)")


SWEEP_CHILD = "TOOLKIT_SWEEP_CHILD"  # a sweep's run (its folder): it leaves the Ctrl-C line to the sweep
# a sweep's run whose folder another process took between the sweep's check and the run's own lock:
# the child says "left to it" and exits so, and the sweep goes on (EX_TEMPFAIL of sysexits.h)
LEFT_TO_ANOTHER = 75
# What `kill`, schedulers (SLURM, Kubernetes, systemd) and a closed terminal send: a command stops
# on them as on Ctrl-C, and exits 128 + the signal's number as shells expect.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
# a run stopped by one exits 128 + its number; killed by a repeat of it while the interpreter shuts
# down (Python's finalization puts the default handlers back), by the signal: -number. SIGPIPE: its
# standard output was closed (`toolkit sweep ... | head`).
_STOP_CODES = {sign * (base + s) for s in (signal.SIGINT, signal.SIGPIPE, *STOP_SIGNALS)
               for sign, base in ((1, 128), (-1, 0))}
_SAID_AS = {signal.SIGTERM: "SIGTERM: ", signal.SIGHUP: "SIGHUP: ",
            signal.SIGPIPE: "standard output was closed (its reader left): "}
_STOPPED_BY: list[int] = []  # the stop signal received, if any (Ctrl-C itself is not recorded)


def _stop(signum: int, frame: object) -> None:
    """A stop signal raises KeyboardInterrupt, once: every Ctrl-C path then applies (the run keeps
    its last checkpoint and says how to go on; a folder with no checkpoint goes). Python's default
    for SIGTERM ends the process on the spot: no line, a run folder before its first checkpoint
    left behind, and a sweep's current run training on, orphaned. A second signal while the first
    is handled is ignored, so the clean-up is not cut short."""
    if not _STOPPED_BY:
        _STOPPED_BY.append(signum)
        raise KeyboardInterrupt


@contextmanager
def _stops_like_ctrl_c() -> Iterator[None]:
    """STOP_SIGNALS handled by _stop while a command runs, the earlier handlers back after (main()
    is called in-process by tests and notebooks). A sweep's run may get a signal twice (from the
    process group, or the scheduler signalling every process, and passed on by the sweep): a
    repeat while the first is handled is ignored, and one after main() returned ends the process
    with the signal (exit -15), which the sweep reads as stopped too (_STOP_CODES). Off the main
    thread signals cannot be handled."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _STOPPED_BY.clear()
    before = {s: signal.signal(s, _stop) for s in STOP_SIGNALS}
    # a blocked mask is inherited across exec (a launcher or test runner that blocked SIGTERM in
    # the thread that started us): the signal would stay pending, and the command run on
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for s, handler in before.items():
            signal.signal(s, handler)


def _kept(out: Path) -> str:
    if runs.is_finished(out):  # stopped after its metrics.json: the point is done
        return f"{out} finished (metrics.json)"
    step = runs.last_step(out)
    return f"{out} keeps the checkpoint of step {step}" if step is not None else "it had no checkpoint yet"


def cmd_validate(args: argparse.Namespace) -> int:
    """Each recipe with the overrides given, as `run` would check it before loading anything:
    the recipe, the overrides, each data file there and its header or first record holding the
    columns / fields the recipe reads."""
    names = [a for a in args.recipes if not is_override(a)]
    overrides = [a for a in args.recipes if is_override(a)]
    files = [find_recipe(r) for r in names] if names else recipe_files([])
    recipes.check_environment()  # said once, not once per recipe
    failed = 0
    for path in files:
        try:
            _checked(path, overrides, args.smoke)  # what `run` checks before loading anything (api._checked)
        except UserError as exc:  # the prefix `run` gives, and the file once
            text = str(exc)
            _say(f"error: {text}" if str(path) in text else f"error: {path}: {text}")
            failed += 1
    print(f"{len(files) - failed} of {len(files)} recipes valid")
    return 2 if failed else 0


def cmd_ls(args: argparse.Namespace) -> int:
    if args.what in ("methods", None):
        print("methods:", " ".join(methods.METHODS.names()))
    if args.what in ("tasks", None):
        print("tasks:", " ".join(tasks.TASKS.names()))
    if args.what in ("attention", None):

        # plain `ls`: the names transformers' source registers (read, not imported: seconds);
        # `ls attention` imports transformers and lists every name registered, other packages' too
        ours = ATTENTION.names()
        names = hf_tables.attention_names(registered=args.what == "attention")
        print("attention:", " ".join(k for k in names if k not in ours))
        print("attention modules (toolkit):", " ".join(ours))
    if args.what in ("recipes", None):
        root = recipes_root()
        for path in recipe_files([]):
            print(path.relative_to(root).with_suffix(""))
    return 0


def cmd_cp(args: argparse.Namespace) -> int:
    """Copy a shipped recipe to edit, with its `extends` bases merged in (it stands alone)."""
    source = find_recipe(args.name)
    _folder_there(args.dest, "cp")
    dest = Path(args.dest)
    if dest.is_dir():
        dest = dest / source.name
    if dest.exists() and not args.force:
        raise UserError(f"{dest} exists; --force overwrites it")
    blocker = runs.file_in_the_way(dest.parent)
    if blocker is not None:  # it said "does not exist" of a file that `ls` shows
        raise UserError(f"cp: {blocker} is a file, not a folder, so {dest} cannot be written under it; give a "
                        "path under a folder")
    if not dest.parent.is_dir():
        raise UserError(f"cp: {dest.parent} does not exist; create it first")
    merged = read_yaml(source)
    # whole or not at all (runs.write_whole): written in place, a full disk (or a kill) cut the copy
    # short, and with --force the user's own file it replaced was gone; a cut recipe can still read
    if dest.is_symlink() and dest.is_file():  # written through the link, as cp(1) does (and the copy in place did)
        dest = dest.resolve()
    runs.write_whole(dest, f"# copied from {args.name} (bases merged in); edit freely\n" + dump_yaml(merged))
    print(dest)
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    _scored_here(_run_folder(args.run), args.split)
    devices.check_accelerate_env(_run_precision(Path(args.run)), scoring=True)
    quiet.libraries()
    from toolkit import inference

    with runs.reading(Path(args.run), "evaluate"):  # not the old model into a folder a --force rerun clears
        _data_of_the_run(Path(args.run), args.overrides, args.task_from)
        result = inference.evaluate_run(Path(args.run), args.split, args.overrides, args.task_from)
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"{args.run} [{args.split}]: " + ", ".join(f"{k}={v:.4f}" for k, v in result["eval"].items()))
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    run = _run_folder(args.run)
    if not args.glue_test and args.input is None:
        raise UserError("predict: give --input FILE (or - for standard input), or --glue-test")
    if args.glue_test and args.input is not None:  # --input was not read: GLUE's test files were predicted
        raise UserError(f"predict: --glue-test predicts GLUE's test files, and --input {args.input} names "
                        "inputs of your own; give one of them (two calls for both)")
    if args.glue_test and args.output == "-":
        raise UserError("predict: --glue-test writes a folder of files (one per test set); --output - (standard "
                        "output) cannot hold them: give a folder")
    if args.output == "-" and not args.glue_test:  # standard output, as --input - is standard input
        args.output = None
    if not args.glue_test:  # --glue-test's --output is a folder
        _folder_there(args.output, "--output")
    devices.check_accelerate_env(_run_precision(run), scoring=True)
    quiet.libraries()
    from toolkit import inference

    if args.glue_test:
        out = Path(args.output) if args.output else run / "glue-test"
        for path in inference.glue_test(run, out):
            print(path)
        return 0
    if args.input is None:
        raise UserError("predict: give --input FILE (or - for standard input), or --glue-test")
    n = inference.predict_run(run, args.input, args.output)
    if args.output:
        print(f"{n} predictions -> {args.output}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    run = _run_folder(args.run)
    with _one_export(Path(args.out)) as target:
        quiet.libraries()
        from toolkit import inference

        note = inference.export_run(run, target, args.merge, args.push_to_hub)
    print(f"{args.out}: {note}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    # an empty name (`--metric ''`, `--metric f1,`) reaches the check of the names: dropped, an empty
    # --metric made no pivot and said nothing, exit 0
    metrics = [m for item in args.metric or [] for m in item.split(",")]
    text = report.render([Path(r) for r in args.runs_dir], plots=not args.no_plots, row_key=args.rows,
                         col_key=args.cols, metrics=metrics or None, glue=args.glue,
                         out=Path(args.out) if args.out else None)
    print(text)
    return 0


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got '{text}'") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _folder_there(given: str | None, what: str) -> None:
    """A file's destination written with a trailing '/' names a folder, as cp(1) reads it: into
    that folder where it is one, else one line. `toolkit cp R sub/` wrote a file `sub` and
    `predict --output preds/` a file `preds`, exit 0 (a path's reading dropped the '/')."""
    if given and given.endswith("/") and not Path(given).is_dir():
        raise UserError(f"{what}: {given} ends with '/', so it names a folder, and there is no folder "
                        f"{given.rstrip('/')}; create it first, or give a file name")


def _given(name: str, folder_slash: bool = False):
    """The type of a path argument: not empty. `--runs-dir "$OUT"` with OUT unset put the runs in
    the default folder, `--output ''` wrote to standard output, `export RUN ''` was an OSError
    traceback (rmdir '.'), each without a word. A UserError, not argparse's error: one line, not
    the command's usage first. `~` and variables are expanded as a recipe's paths are (user_path)."""
    def path(text: str) -> str:
        if not text.strip():
            raise UserError(f"{name}: an empty path; give a file or a folder")
        if _OVERRIDE.match(text) and not os.path.lexists(user_path(text)):
            raise UserError(f"{name}: '{text}' is a recipe setting (key=value), not a path: {name}'s own value is "
                            f"missing (an unset variable?); give {name} a path, the settings after it")
        given = str(user_path(text))
        # a file's destination keeps a trailing '/' (_folder_there), which Path drops
        return given + "/" if folder_slash and text.endswith("/") and not given.endswith("/") else given
    return path


# `section.key=value`: a recipe setting. As a path option's value it is what an unset variable left
# (`--runs-dir $RUNS train.lr=1e-4`): the run went to a folder `train.lr=1e-4` at the default lr, exit 0
_OVERRIDE = re.compile(rf"^(?:(?:{'|'.join(SECTION_NAMES)})\.[^=/]+|name|smoke)=")


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="toolkit", description="Fine-tune Hugging Face models from YAML "
                                           "recipes: one loop for every family and method.")
    p.add_argument("--version", action="version", version=f"toolkit {_version()}")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="show the libraries' own warnings, load reports and progress bars")
    verbose = Parser(add_help=False)  # -v after the command too
    verbose.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                         help="show the libraries' own warnings, load reports and progress bars")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", parents=[verbose], help="train and evaluate one recipe")
    run.add_argument("recipe", help="a recipe file, or a shipped recipe's name (toolkit ls recipes)")
    run.add_argument("overrides", nargs="*", default=[], help="key=value, e.g. train.lr=3e-4 method.r=16")
    run.add_argument("--smoke", action="store_true", help="small random model, a handful of examples")
    run.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    run.add_argument("--force", action="store_true", help="run again even if finished")
    run.add_argument("--runs-dir", default=None, type=_given("--runs-dir"), help="where runs/ goes (default $TOOLKIT_RUNS or ./runs)")
    run.add_argument("--stop-after", type=_positive, default=None,
                     help="stop (checkpointed, unfinished) after N optimizer steps: an interruption on purpose")
    run.set_defaults(func=cmd_run)
    sw = sub.add_parser("sweep", parents=[verbose], help="a grid of runs: recipes x key=v1,v2 axes x seeds, finished ones skipped")
    sw.add_argument("overrides", nargs="+", metavar="RECIPE|key=v1,v2",
                    help="recipe files, then axes: train.lr=1e-4,3e-4 (x0.3,x1,x3 scales the recipe's value)")
    sw.add_argument("--seeds", default=None, help="42,43,44 (or '42 43 44'); one number N <= 10 means N seeds from 42")
    sw.add_argument("--dry-run", action="store_true",
                    help="list the grid, each run's state, optimizer steps and examples; run nothing")
    sw.add_argument("--estimate", action="store_true",
                    help="--dry-run plus a wall-time estimate from a few steps of each recipe shape, measured here")
    sw.add_argument("--smoke", action="store_true", help="small random model, a handful of examples")
    sw.add_argument("--force", action="store_true", help="run every point again even if finished")
    sw.add_argument("--keep-going", action="store_true",
                    help="a point that fails does not stop the sweep: the others run, the failed ones are named "
                         "at the end (exit 2)")
    sw.add_argument("--runs-dir", default=None, type=_given("--runs-dir"), help="where runs/ goes (default $TOOLKIT_RUNS or ./runs)")
    sw.add_argument("--report", nargs="?", const="", default=None, metavar="'REPORT OPTIONS'",
                    help="then report.md of this sweep's own runs into the runs folder, with toolkit report's options "
                         "('--rows task --cols method', '--glue', '' for none); the folder's other runs are left out")
    sw.set_defaults(func=cmd_sweep)
    val = sub.add_parser("validate", parents=[verbose], help="check recipes, overrides and the data files' heads, in well "
                         "under a second: no library or weights load")
    val.add_argument("recipes", nargs="*", metavar="RECIPE|key=value",
                     help="recipes (default: every shipped one), then overrides as for run: train.lr=3e-4")
    val.add_argument("--smoke", action="store_true", help="check the recipes as `run --smoke` runs them")
    val.set_defaults(func=cmd_validate)
    ls = sub.add_parser("ls", parents=[verbose], help="list registered names or recipes")
    ls.add_argument("what", nargs="?", choices=["methods", "tasks", "attention", "recipes"])
    ls.set_defaults(func=cmd_ls)
    cp = sub.add_parser("cp", parents=[verbose], help="copy a shipped recipe to edit")
    cp.add_argument("name", help="a recipe name from `toolkit ls recipes`, or a path")
    cp.add_argument("dest", type=_given("dest", folder_slash=True))
    cp.add_argument("--force", action="store_true", help="overwrite DEST")
    cp.set_defaults(func=cmd_cp)
    ev = sub.add_parser("eval", parents=[verbose], help="score a finished run on a split (writes eval-<split>.json)")
    ev.add_argument("run", type=_given("run"), help="a finished run's folder (runs/<recipe>/<id>)")
    ev.add_argument("overrides", nargs="*", default=[], help="task.* settings, e.g. task.max_eval_samples=100")
    ev.add_argument("--split", default="eval", help="eval (default), train, or a labelled test split")
    ev.add_argument("--task-from", default=None, type=_given("--task-from"), help="score on the task of another recipe")
    ev.set_defaults(func=cmd_eval)
    pr = sub.add_parser("predict", parents=[verbose], help="predictions of a finished run on new inputs (JSON lines; CSV or a JSON list by --output's name)")
    pr.add_argument("run", type=_given("run"), help="a finished run's folder (runs/<recipe>/<id>)")
    pr.add_argument("--input", default=None, type=_given("--input"), help="JSONL, JSON, CSV or TSV with the task's fields, "
                    "plain text (one example a line) or CoNLL (NER); - for standard input")
    pr.add_argument("--output", default=None, type=_given("--output", folder_slash=True), help="a .jsonl, .csv or .json file, .gz too (default, or -: standard output); with --glue-test a folder "
                    "(default RUN/glue-test)")
    pr.add_argument("--glue-test", action="store_true", help="GLUE server submission files from test.tsv")
    pr.set_defaults(func=cmd_predict)
    ex = sub.add_parser("export", parents=[verbose], help="a plain transformers folder from a finished run")
    ex.add_argument("run", type=_given("run"), help="a finished run's folder (runs/<recipe>/<id>)")
    ex.add_argument("out", type=_given("out"), help="a new or empty folder")
    ex.add_argument("--merge", action="store_true", help="merge LoRA / IA3 into the base weights")
    ex.add_argument("--push-to-hub", default=None, metavar="REPO", help="also upload it to this Hub repo (online only)")
    ex.set_defaults(func=cmd_export)
    rep = sub.add_parser("report", parents=[verbose], help="report.md (pivot tables, mean ± std, notes) and PNG plots from finished runs")
    rep.add_argument("runs_dir", nargs="+", type=_given("runs_dir"), help="folders of run folders (read only; nothing is re-run)")
    rep.add_argument("--rows", default=None, help="pivot rows: task, method, model, run or a recipe field (train.lr)")
    rep.add_argument("--cols", default=None, help="pivot columns (default method when --rows is given)")
    rep.add_argument("--metric", action="append", help="metric(s) to pivot (default: each task's main metric)")
    rep.add_argument("--glue", action="store_true", help="the GLUE table: official metrics, GLUE average, published numbers")
    rep.add_argument("--out", default=None, type=_given("--out"), help="where report.md and the PNGs go (default: the first runs folder)")
    rep.add_argument("--no-plots", action="store_true", help="report.md alone, no PNGs")
    rep.set_defaults(func=cmd_report)
    for action in (a for command in sub.choices.values() for a in command._actions):
        if action.option_strings and type(action) is argparse._StoreAction:
            action.__class__ = _Once  # every option with a value: given once
    return p


class _Once(argparse._StoreAction):
    """An option with a value given twice is one line, not the last one winning: `make glue
    ARGS="--runs-dir x"` (the target gives its own) ran the sweep into x and then reported on
    runs/glue, whatever was there, exit 0; `--seeds 3 ... --seeds 5` ran 5."""

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[override]
        given = namespace.__dict__.setdefault("_given_once", {})
        if self.dest in given:
            raise UserError(f"{parser.prog}: {option_string or self.option_strings[-1]} is given twice "
                            f"({given[self.dest]!r} and "
                            f"{values!r}); give it once (a make target gives its own: set its variable, e.g. RUNS=)")
        given[self.dest] = values
        super().__call__(parser, namespace, values, option_string)


def printable(line: str) -> str:
    """A line as any stream can write it: a path's bytes that are not UTF-8 (lone surrogates) as
    backslash escapes, as Python's own stderr writes them."""
    return line.encode("utf-8", "backslashreplace").decode("utf-8")


def _streams_never_fail() -> None:
    """Standard output is UTF-8 whatever the locale, as every file the toolkit writes is: `predict`
    to standard output gives the bytes `--output` would, and `report`'s mean ± std printed under
    LC_ALL=C or PYTHONIOENCODING=ascii was a UnicodeEncodeError traceback after the work was done.
    Standard error, for a person, keeps the terminal's encoding and writes a character it cannot
    show as a backslash escape rather than failing on it."""
    import codecs

    for stream, utf8 in ((sys.stdout, True), (sys.stderr, False)):
        if not hasattr(stream, "reconfigure") or not getattr(stream, "encoding", None):
            continue
        if codecs.lookup(stream.encoding).name == "utf-8":
            continue
        stream.reconfigure(**({"encoding": "utf-8"} if utf8 else {}), errors="backslashreplace")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("toolkit")
    except PackageNotFoundError:
        return "unknown (not installed)"


def main(argv: list[str] | None = None) -> int:
    """`toolkit ...`: the command's exit code. Under torch elastic (a bare `accelerate launch` or
    `torchrun`) a process that failed leaves its `error: ...` line in the error file elastic names
    (TORCHELASTIC_ERROR_FILE, `record`'s format), so the launcher's report of the failure names it as the
    root cause, where it said `To enable traceback see: https://pytorch.org/docs/...`. The report
    itself, and the traceback before it, are the launcher's own (docs/distributed.md)."""
    _SAID.clear()
    code = _command(argv)
    if code and _SAID and os.environ.get("TORCHELASTIC_ERROR_FILE"):
        _elastic_error_file(os.environ["TORCHELASTIC_ERROR_FILE"], _SAID[-1])
    return code


def _elastic_error_file(path: str, line: str) -> None:
    """`line` as torch elastic's error file (ErrorHandler.record_exception's layout, the line in
    place of a traceback); a file that cannot be written leaves the report as it was."""
    import json
    import time

    data = {"message": {"message": line, "extraInfo": {"py_callstack": line, "timestamp": str(int(time.time()))}}}
    try:
        Path(path).write_text(json.dumps(data), encoding="utf-8")
    except OSError:
        pass


_SAID: list[str] = []  # the `error: ...` lines this command said (or, rank > 0 of a launch, would have)


def _command(argv: list[str] | None = None) -> int:
    p = parser()
    try:
        args, extra = p.parse_known_args(argv)  # key=value overrides may sit between the flags
        # a word after a flag: sweep's and validate's recipes and overrides, report's folders, run's and
        # eval's overrides; after an unknown option, that option's value, said with it
        stray = [e for before, e in zip([None, *extra], extra) if e.startswith("-")
                 or before is not None and before.startswith("-")
                 or not (args.command in MORE_WORDS or args.command in OVERRIDES_BESIDE and "=" in e)]
        if stray:
            raise ArgumentsError(_subparsers(p)[args.command].prog, f"unrecognized arguments: {' '.join(stray)}", stray)
    except ArgumentsError as exc:  # argparse's refusal: one line, not the usage block first
        # the same words in every process of a launch: said once (read as text: this is no place for
        # a ValueError of a damaged variable, said by the command itself)
        line = f"error: {arguments_error(p, exc)}"
        if os.environ.get("WORLD_SIZE", "1").strip() in ("", "1") or os.environ.get("RANK", "0").strip() in ("", "0"):
            _say(line)
        _SAID.append(line)  # the launcher's report of this process names it too
        return 2
    except UserError as exc:  # a type or action of ours refused a value (_given, _Once)
        _say(f"error: {exc}")
        return 2
    if extra:
        dest, check = MORE_WORDS.get(args.command, ("overrides", str))
        try:
            setattr(args, dest, list(getattr(args, dest)) + [check(e) for e in extra])
        except UserError as exc:  # `report a --no-plots ''`: as the same word before the flags
            _say(f"error: {_subparsers(p)[args.command].prog}: {exc}")
            return 2
    if args.verbose:
        os.environ[quiet.VERBOSE] = "1"
    _streams_never_fail()
    quiet.warnings_off()  # the libraries' own chatter goes once they load (quiet.libraries)
    with _stops_like_ctrl_c():
        return _outcome(args)


OVERRIDES_BESIDE = {"run": "train.lr=3e-4", "eval": "task.max_eval_samples=100", "sweep": "train.lr=1e-4,3e-4",
                    "validate": "train.lr=3e-4"}  # the commands that take key=value words, and an example
# the commands whose last positional takes any number of words, given before or after the flags
# (it was an "unrecognized argument" after one), with the type of those words
MORE_WORDS = {"sweep": ("overrides", str), "validate": ("recipes", str), "report": ("runs_dir", _given("runs_dir"))}


def _subparsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def _options(p: argparse.ArgumentParser) -> list[str]:
    return [o for a in p._actions for o in a.option_strings if o.startswith("--")]


def arguments_error(p: argparse.ArgumentParser, exc: ArgumentsError) -> str:
    """argparse's refusal as one line: the command, the problem, and where to look. An unknown
    option says a near name of this command (`report --output`: --out) and the commands that take
    it as given (`sweep --resume`: toolkit run); a word that is no option beside overrides says
    what an override looks like; an unknown command says the near command."""
    import difflib

    commands = _subparsers(p)
    message, help_line = exc.message, f"{exc.prog} --help lists its arguments and options"
    if exc.prog == p.prog:  # the command itself: missing or unknown
        names = ", ".join(commands)
        if message.startswith("the following arguments are required"):
            return f"{p.prog}: give a command: {names} ({p.prog} --help says what each does)"
        if (bad := re.match(r"argument command: invalid choice: '(.*?)'", message)) is not None:
            near = difflib.get_close_matches(bad.group(1), list(commands), n=1)
            return (f"{p.prog}: unknown command '{bad.group(1)}'" + (f"; did you mean {near[0]}?" if near else "")
                    + f" (the commands: {names}; {p.prog} --help says what each does)")
        return f"{p.prog}: {message} ({p.prog} --help lists the options)"
    command = exc.prog.split()[-1]
    near_names, elsewhere = [], []
    if exc.unknown:
        own = _options(commands[command])
        for before, word, after in zip(["", *exc.unknown], exc.unknown, [*exc.unknown[1:], "-"]):
            option = word.split("=", 1)[0]
            if not option.startswith("--"):  # a word after an unknown option is taken for its value
                if command in OVERRIDES_BESIDE and not word.startswith("-") and not before.startswith("-"):
                    near_names.append(f"'{word}' is no override (key=value, e.g. {OVERRIDES_BESIDE[command]})")
                continue
            if command in OVERRIDES_BESIDE and "." in option:  # `--train.lr=3e-4`, `--train.lr 3e-4`
                value = word.split("=", 1)[1] if "=" in word else after if not after.startswith("-") else "VALUE"
                near_names.append(f"an override goes without the dashes: {option[2:]}={value}")
                continue
            score = {o: max(difflib.SequenceMatcher(None, option, o).ratio(),
                            difflib.SequenceMatcher(None, o, option).ratio()) for o in own}
            if score and max(score.values()) >= 0.75:
                near_names.append(f"did you mean {max(score, key=score.get)}?")
            takers = [f"toolkit {name}" for name, sub in commands.items() if name != command and option in _options(sub)]
            takers += [f"{p.prog} itself ({p.prog} {option})"] * (option in _options(p) and option not in own)
            if takers:
                elsewhere.append(f"{option} is an option of {', '.join(takers)}")
    return (f"{exc.prog}: {message}" + "".join(f"; {h}" for h in near_names)
            + f" ({'; '.join([*elsewhere, help_line])})")


def _outcome(args: argparse.Namespace) -> int:
    """The command run, each way it can end as one line on stderr and its exit code."""
    try:
        sharding.check_command(args.command)  # predict, export ... under a launch: once per process
        return args.func(args)
    except runs.Busy as exc:
        if args.command == "run" and os.environ.get(SWEEP_CHILD) and runs.took_over(exc, Path(os.environ[SWEEP_CHILD])):
            return LEFT_TO_ANOTHER  # the sweep says it, and goes on
        _say(f"error: {exc}")
        return 2
    except UserError as exc:  # another process of the launch stopped first: the launch's code is its
        _say(f"error: {exc}")
        return STOPPED_WITH_THE_LAUNCH if isinstance(exc, PeerStopped) else 2
    except BrokenPipeError:  # `toolkit report runs | head`: the reader left; end quietly, as SIGPIPE would
        _to_devnull(sys.stdout)
        return 128 + signal.SIGPIPE
    except KeyboardInterrupt as exc:  # Ctrl-C: one line, exit 130 (128 + SIGINT) as shells expect
        signum = getattr(exc, "signal", None) or (_STOPPED_BY[0] if _STOPPED_BY else signal.SIGINT)
        if signum == signal.SIGPIPE:
            _to_devnull(sys.stdout)
        line = f"error: {_SAID_AS.get(signum, '')}{getattr(exc, 'message', None) or 'interrupted; nothing more was written'}"
        if os.environ.get(SWEEP_CHILD) and args.command == "run" or int(os.environ.get("RANK", "0")) != 0:
            # said once: by the sweep that started this run, by rank 0 of a launch; the launcher's
            # report of this process names it too (the launcher's own SIGTERM, after another process
            # stopped first, was reported as `To enable traceback see: https://pytorch.org/...`)
            _SAID.append(line)
            return 128 + signum
        _say(line)
        return 128 + signum  # SIGTERM: 143, SIGHUP: 129, SIGPIPE: 141
    except Exception as exc:  # a full disk or an unwritable place anywhere: said as such
        if (gone := sharding.peer_stopped(exc)) is not None:  # under a launch: another process's error
            _say(f"error: {gone}")
            return STOPPED_WITH_THE_LAUNCH
        if not _unwritable(exc):
            raise
        _say(f"error: {disk_error(exc)}")
        return 2


def _say(line: str) -> None:
    """One line on stderr. A closed stderr (its reader left too) loses the line, not the exit
    code: the failed write turned exit 2 into a traceback nobody saw and exit 1."""
    if line.startswith("error: "):
        _SAID.append(line)
    try:
        print(printable(line), file=sys.stderr, flush=True)
    except (OSError, ValueError):
        _to_devnull(sys.stderr)


def _to_devnull(stream: object) -> None:
    """A closed stream's later writes, and the interpreter's flush at exit, go nowhere, quietly."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())  # type: ignore[attr-defined]
    except (OSError, ValueError, AttributeError):  # no file behind it (a test's capture)
        pass


if __name__ == "__main__":
    sys.exit(main())
