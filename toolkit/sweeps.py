"""Sweeps: a grid of (recipe, overrides) points, each run as `toolkit run` runs it.

`toolkit sweep R1 R2 train.lr=1e-4,3e-4 method.r=4,8 --seeds 42,43` is the product of the
recipes, every axis and the seeds, in that order (recipe outermost, seed innermost). A point is
an ordinary run: its folder is `runs/<recipe>/<hash of the resolved recipe>/`, so re-running a
sweep skips finished points, resumes interrupted ones and `--force` reruns them: the result store
is the run folders themselves, and a report reads them back without re-running anything.

A value `x<k>` on a numeric field scales the recipe's own value by k (`train.lr=x0.3,x1,x3`):
one learning-rate grid then fits methods whose learning rates differ by orders of magnitude.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path

from toolkit import chain, models, recipe as recipe_module, runs
from toolkit.recipe_data import layered, override_leaves
from toolkit.errors import UserError
from toolkit.schema import DECIMAL, decimal_float


@dataclass
class Point:
    """One run of the grid: a recipe file and its overrides (axes first, then the seed)."""

    recipe: Path
    overrides: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return " ".join([str(self.recipe), *self.overrides])


def split_values(text: str) -> list[str]:
    """`1e-4,3e-4` -> two values; commas inside [...], {...} or quotes belong to one YAML value."""
    out, depth, start, quote = [], 0, 0, ""
    for i, char in enumerate(text):
        if quote:  # inside '...' or "...": nothing splits
            quote = "" if char == quote else quote
            continue
        quote = char if char in "'\"" and depth == 0 and not text[start:i].strip() else ""  # a value's first char
        depth += char in "[{"
        depth -= char in "]}"
        if char == "," and depth == 0:
            out.append(text[start:i])
            start = i + 1
    out.append(text[start:])
    return [v.strip() for v in out]


def parse_axes(items: list[str]) -> list[tuple[str, list[str]]]:
    """`key=v1,v2` strings -> (key, values); a key given twice is a user error."""
    axes: list[tuple[str, list[str]]] = []
    for item in items:
        key, _, value = item.partition("=")
        if not key or not _:
            raise UserError(f"sweep axis '{item}': expected key=v1,v2,..., e.g. train.lr=1e-4,3e-4")
        if key in (k for k, _ in axes):
            raise UserError(f"sweep axis '{key}' is given twice; list its values once, comma-separated")
        values = split_values(value)
        if "" in values:
            raise UserError(f"sweep axis '{item}': an empty value (stray comma?)")
        if len(set(values)) != len(values):
            twice = next(v for v in values if values.count(v) > 1)
            raise UserError(f"sweep axis '{key}': the value {twice} is listed twice")
        axes.append((key, values))
    return axes


SEED_BASE = 42
MAX_SEED_COUNT = 10


def parse_seeds(text: str | None) -> list[int]:
    """`42,43,44` or `42 43 44`: those seeds; one number up to 10 alone (`3`) is a count from 42,
    and with a comma (`3,`) it is a list: the seed 3 (it was read as the count, 42, 43, 44). None
    (not given): the recipe's own train.seed. Given but empty (`make glue SEEDS=`, an unset
    variable) is a mistake: it ran each point once, with the recipe's seed, where seeds were asked."""
    if text is None:
        return []
    try:
        seeds = [int(s) for s in text.replace(",", " ").split()]
    except ValueError:
        raise UserError(f"--seeds '{text}': expected integers, e.g. --seeds 42,43,44 or --seeds 3") from None
    if not seeds:
        raise UserError(f"--seeds '{text}': no seed given; e.g. --seeds 42,43,44 or --seeds 3 (leave --seeds "
                        "out for the recipe's own train.seed)")
    if len(seeds) == 1 and "," not in text and 0 < seeds[0] <= MAX_SEED_COUNT:
        return list(range(SEED_BASE, SEED_BASE + seeds[0]))
    if seeds == [0] and "," not in text:
        raise UserError(f"--seeds '{text}': a count of seeds is 1 to {MAX_SEED_COUNT}; for the seed 0 itself "
                        "write --seeds 0, (a list of one)")
    if len(set(seeds)) != len(seeds):
        raise UserError(f"--seeds '{text}': a seed is listed twice")
    return seeds


def grid(recipes: list[Path], axes: list[tuple[str, list[str]]], seeds: list[int]) -> list[Point]:
    """Every combination, recipe outermost and seed innermost (seeds of one setting run together)."""
    # however the axis spells it: `train={seed: 1},{seed: 2}` beside --seeds was refused as the
    # point's own `train.seed=42` "already set", a setting the user never wrote
    if seeds and any(("train", "seed") in override_leaves([f"{key}={v}" for v in values]) for key, values in axes):
        raise UserError("sweep: give seeds either as --seeds or as train.seed=..., not both")
    names = [key for key, _ in axes]
    combos = list(itertools.product(*[values for _, values in axes]))
    seed_items = [[f"train.seed={s}"] for s in seeds] or [[]]
    return [Point(path, [f"{k}={v}" for k, v in zip(names, combo)] + seed)
            for path in recipes for combo in combos for seed in seed_items]


def resolve_scaled(raw: dict, overrides: list[str], where: str) -> list[str]:
    """Turn `key=x<k>` into `key=<k * the recipe's value>` (the recipe's value must be a number)."""
    out = []
    for item in overrides:
        key, _, value = item.partition("=")
        if value.startswith("x") and _is_number(value[1:]):
            base, factor = raw, None
            for part in key.split("."):
                base = base.get(part) if isinstance(base, dict) else None
            try:  # `x1e-400` was the factor 0 (float's reading): the point ran with lr 0, exit 0
                factor = decimal_float(value[1:])
                base = decimal_float(base) if isinstance(base, str) and _is_number(base) else base
            except ValueError as exc:
                raise UserError(f"{where}: '{item}': {value[1:] if factor is None else base} {exc}") from None
            if not isinstance(base, (int, float)) or isinstance(base, bool):
                raise UserError(f"{where}: '{item}' scales {key}, but the recipe has no number there (the text "
                                f"{value} itself is written quoted: {key}='{value}')")
            if factor * base == 0 and factor and base:
                raise UserError(f"{where}: '{item}': {value[1:]} x {base!r} is too small for a float (it reads as 0)")
            # x1 is the recipe's own value, exactly; another factor is the product to 12 significant
            # digits (a float's noise dropped: 3e-4 x0.3 is 9e-05). `.6g` rounded every product, so
            # lr 1.23456789e-4 x1 ran with 0.000123457, another run than the recipe's own
            scaled = base if factor == 1 else float(format(factor * base, ".12g"))
            # an int setting scaled to a whole number stays that int, whatever its size (`.6g` wrote
            # max_steps 1234567 x1 as 1.23457e+06, a float the int field refused)
            whole = isinstance(base, int) and float(scaled).is_integer()
            item = f"{key}={int(scaled) if whole else repr(float(scaled))}"
        out.append(item)
    return out


def _is_number(text: str) -> bool:
    """A decimal number as a float field reads one from a string (schema.DECIMAL): `x1_0` or a
    recipe's `lr: "1_000"` is no number there, so no scale of one either."""
    return re.fullmatch(DECIMAL, text) is not None


def resolve(point: Point) -> Point:
    """The point with scaled values made absolute against its recipe file (extends merged)."""
    if not any(o.partition("=")[2].startswith("x") for o in point.overrides):
        return point
    raw = recipe_module.read_yaml(point.recipe)
    return Point(point.recipe, resolve_scaled(raw, point.overrides, str(point.recipe)))


def listed_seeds(seeds: list[int]) -> list[int]:
    """Seeds given as a list (the Python API): each one is a seed, never a count (`[3]` is the
    seed 3, where `--seeds 3` is three seeds); a seed listed twice is refused as in `--seeds`."""
    if not seeds:
        raise UserError("seeds []: no seed given; e.g. seeds=[42, 43, 44] or seeds=3 (leave it out for 42)")
    if len(set(seeds)) != len(seeds):
        raise UserError(f"seeds {seeds}: a seed is listed twice")
    return list(seeds)


def plan(recipes: list[Path], axis_items: list[str], seeds: str | list[int] | None, root: Path,
         smoke: bool) -> tuple[list[Point], list[Path]]:
    """Every point of the grid and its run folder; every point is checked (its recipe loads) and
    no two are the same run, before the first one runs."""
    if not recipes:  # `toolkit.sweep([])` returned [] as if a grid had run: the CLI's refusal, for both
        raise UserError("sweep: no recipe given, e.g. toolkit sweep recipes/demo/sst2/minilm-lora.yaml train.lr=1e-4,1e-3")
    seed_list = listed_seeds(seeds) if isinstance(seeds, list) else parse_seeds(seeds)
    points = [resolve(p) for p in grid(recipes, parse_axes(axis_items), seed_list)]
    folders = [runs.run_dir(recipe_module.load(p.recipe, p.overrides, smoke=smoke), root) for p in points]
    same_runs(folders, points)
    return points, folders


def same_runs(folders: list[Path], points: list[Point]) -> None:
    """Two points of one grid that resolve to the same recipe (x1 next to the recipe's own value,
    an override equal to the default) would be one run done twice: refused before anything runs."""
    seen: dict[Path, int] = {}
    for i, folder in enumerate(folders):
        if folder in seen:
            j = seen[folder]
            raise UserError(f"sweep: points {j + 1} ({points[j]}) and {i + 1} ({points[i]}) are the same run "
                            f"({folder}); drop one of the values")
        seen[folder] = i


def as_planned(point: Point, folder: Path, root: Path, smoke: bool, where: str) -> None:
    """A point is run as it was planned and checked: its recipe file, a base it extends or its
    data edited while the sweep ran made the point another run than the one listed and checked
    (the grid's later points silently of another recipe than its first). Said before it starts."""
    now = runs.run_dir(recipe_module.load(point.recipe, point.overrides, smoke=smoke), root)
    if now != folder:
        raise UserError(f"sweep: {where} ({point}) is now another run than planned ({now}, not {folder}): its "
                        "recipe, a base it extends or its data changed since the sweep started; the finished "
                        "runs are kept, and the same command plans the grid again")


def upstreams_ready(points: list[Point], folders: list[Path], root: Path, smoke: bool, force: bool) -> None:
    """A chained point (`model.checkpoint: {run: ...}`) is checked as `toolkit run` checks it, before
    the first point runs: its upstream is finished, or made by an earlier point (the points before
    it ran for hours, then the sweep stopped there; under --smoke a chained run makes its upstream
    smoke run itself); and a finished one started from its upstream's model/ as that is now
    (`chain.check_current`: the sweep skipped it as finished, its metrics of weights an upstream
    rerun with --force had replaced, where `toolkit run` refuses it)."""
    _upstreams(points, folders, root, smoke, force, resolve=True)


def finished_current(points: list[Point], folders: list[Path], root: Path, smoke: bool, force: bool) -> None:
    """--dry-run's part of upstreams_ready: a finished chained point whose upstream changed since
    is refused with the sweep's own line (the dry run listed it `[finished]`, exit 0, where the
    sweep refuses it). An upstream not run yet stays a point `[to run]` (--estimate measures it)."""
    _upstreams(points, folders, root, smoke, force, resolve=False)


def _upstreams(points: list[Point], folders: list[Path], root: Path, smoke: bool, force: bool,
               resolve: bool) -> None:
    for i, point in enumerate(points):
        plan = recipe_module.plan(point.recipe, point.overrides, smoke=smoke)
        try:
            if not force:
                chain.check_current(plan, root)  # a plain point too: on its base as that is now
            if plan.upstream is None:
                continue
            if resolve and not plan.recipe.smoke and runs.run_dir(plan.upstream.recipe, root) not in folders[:i]:
                chain.resolve(plan, root)
        except UserError as exc:
            raise UserError(f"sweep: run {i + 1} of {len(points)} ({point}): {exc}; no point was started") from None


def describe(points: list[Point], folders: list[Path], force: bool = False) -> list[str]:
    """One line per point for --dry-run: its run folder and what the sweep does with it (a
    finished one under --force runs again: it was listed `[finished]`)."""
    lines = []
    for i, (point, out) in enumerate(zip(points, folders), 1):
        state = ("runs again: --force" if force else "finished") if runs.is_finished(out) else \
            "resumes" if runs.checkpoints(out) and not force else "to run"
        lines.append(f"{i:>3}. {point}  ->  {out}  [{state}]")
    return lines


# --- cost before commitment: --dry-run's steps and examples, --estimate's measured wall time --------
@dataclass
class Cost:
    """What one point will train: its training set, optimizer steps, the examples those steps
    read, and its evaluations (on the launch's processes: the loop's schedule,
    TrainConfig.optimizer_steps)."""

    train_examples: int
    steps: int
    examples_seen: int
    evals: int
    eval_examples: int


def sizes(recipe, base=None) -> tuple[int | None, int]:
    """(training rows or None, evaluation examples) as a run loads them, caps applied. The
    training rows are what the loop batches (`setup.build`'s encoded split): one per example for
    most tasks, but blocks of packed documents (clm, mlm, denoise, span_corruption) and windows
    of a context (extractive QA) where `Task.rows_are_examples` says not; those are encoded with
    the tokenizer the run reads (that of `base`, the recipe at the bottom of a `{run: ...}`
    chain), never the weights. The raw count made a CLM dry run of 40 lines say 10 optimizer
    steps where the run took 8 of its 31 blocks (and --estimate multiplied the wrong count)."""
    data = recipe.task.load()
    train = data.get("train")
    n_eval = sum(len(ds) for ds in (data.get("eval") or {}).values())
    if train is None:
        return None, n_eval
    if recipe.method.trains and not recipe.task.rows_are_examples():
        checkpoint = (base or recipe).model.checkpoint
        folder = models.tokenizer_folder(checkpoint, recipe.smoke) if isinstance(checkpoint, str) else None
        try:
            source = str(folder) if folder is not None else models.resolve(checkpoint)
        except UserError as error:  # offline and not here: the count cannot be made without it
            raise UserError(f"{error} (the plan counts the {recipe.task.name} training rows, its blocks or "
                            "windows, with the checkpoint's tokenizer; --smoke counts them with the small "
                            "model's)") from None
        tok = models.load_tokenizer(source, words=recipe.task.words_given)
        recipe.task.adapt_tokenizer(tok)
        train = recipe.method.encoder(recipe.task, tok)(train)
    return len(train), n_eval


def cost(recipe, n_train: int | None, n_eval: int, processes: int = 1) -> Cost:
    """The point's optimizer steps, examples read and evaluations, from its data's sizes, on
    `processes` processes (a step takes batch x grad_accum examples on each)."""
    import math

    if n_train is None or not recipe.method.trains:  # in-context: one evaluation, no step
        return Cost(0, 0, 0, 1, n_eval)
    tr = recipe.train
    per_epoch, steps = tr.optimizer_steps(n_train, processes)
    per_epoch = max(1, per_epoch)
    whole, rest = divmod(steps, per_epoch)  # an epoch's last step may be short
    seen = whole * n_train + min(rest * tr.batch_size * tr.grad_accum * processes, n_train)
    n_evals = math.ceil(steps / tr.eval_every) if tr.eval_every else math.ceil(steps / per_epoch)
    return Cost(n_train, steps, seen, n_evals, n_eval)


def costs(points: list[Point], smoke: bool, processes: int = 1) -> list[Cost]:
    """Each point's cost on `processes` processes (a launch's: `runs.world_size()`); data is
    loaded once per distinct task (a sweep repeats its tasks)."""
    import json

    loaded: dict[str, tuple[int | None, int]] = {}
    out = []
    for point in points:
        plan = recipe_module.plan(point.recipe, point.overrides, smoke=smoke)
        recipe = plan.recipe
        # the rows a packing task encodes depend on the tokenizer, so on the base checkpoint too
        key = json.dumps([recipe.to_dict()["task"], recipe.method.trains and not recipe.task.rows_are_examples()
                          and str(plan.base.model.checkpoint)], sort_keys=True, default=str)
        if key not in loaded:
            loaded[key] = sizes(recipe, plan.base)
        out.append(cost(recipe, *loaded[key], processes))
    return out


def cost_line(c: Cost) -> str:
    if not c.steps:
        return f"no training; 1 evaluation of {c.eval_examples:,} examples"
    return (f"{c.train_examples:,} train examples, {c.steps:,} optimizer steps reading {c.examples_seen:,} "
            f"examples; {c.evals:,} evaluation{'s' * (c.evals != 1)} of {c.eval_examples:,}")


# What decides the time of a step: everything but the schedule, the data caps and the seed.
_SCHEDULE = {"train": {"epochs", "max_steps", "lr", "seed", "warmup_ratio", "warmup_steps", "eval_every",
                       "log_every", "keep_best", "metric", "early_stopping_patience", "save_total_limit",
                       "save_every", "keep_checkpoints", "weight_decay", "report_to", "skip_nonfinite"},
             "task": {"max_train_samples", "max_eval_samples", "split_seed"}}
MEASURED_STEPS = 8  # after a warm-up step: with the warm-up, one epoch of a random slice


def shape(recipe) -> str:
    """Points of one shape (model, method, task, batch, precision) take the same time per step."""
    import json

    data = recipe.to_dict()
    kept = {part: {k: v for k, v in data[part].items() if k not in _SCHEDULE.get(part, ())}
            for part in ("model", "method", "task", "train")}
    return json.dumps([kept, recipe.smoke], sort_keys=True, default=str)


@dataclass
class Timing:
    """Measured on this machine for one shape: seconds per optimizer step, per evaluated example,
    and the rest of a run (start-up, loading the model, saving)."""

    step_s: float
    eval_example_s: float
    overhead_s: float


def measure(point: Point, recipe, smoke: bool) -> Timing:
    """A real run of the point cut to 1 + MEASURED_STEPS optimizer steps (a slice of its data,
    one evaluation of a few examples) in a throw-away folder. The loop's own clocks give the
    times: the steps after the first (which pays for warming up) from log.jsonl's running
    samples/s, the evaluation from metrics.json; the rest of the wall time is start-up."""
    import json
    import subprocess
    import sys
    import tempfile
    import time

    tr, n = recipe.train, MEASURED_STEPS + 1
    per_step = tr.batch_size * tr.grad_accum
    # a method that trains nothing reads no train.* cap (refused where set: recipe.refuse_ignored)
    steps = [f"train.max_steps={n}", "train.eval_every=0", "train.log_every=1", "train.early_stopping_patience=0"]
    caps = [*(steps if recipe.method.trains else []),
            f"task.max_train_samples={n * per_step}", f"task.max_eval_samples={2 * tr.batch_size}"]
    # a chained point measures on the model its chain starts from (the same shape): its upstream is
    # in the runs folder, not in the throw-away one, so every chained point's estimate failed with
    # "run it first: ... --runs-dir /tmp/toolkit-estimate-..." (a folder gone), finished upstream or not
    plan = recipe_module.plan(point.recipe, point.overrides, smoke=smoke)
    while plan.upstream is not None:
        plan = plan.upstream
    if isinstance(recipe.model.checkpoint, dict):
        caps.append(f"model.checkpoint={json.dumps(plan.recipe.model.checkpoint)}")
    with tempfile.TemporaryDirectory(prefix="toolkit-estimate-") as tmp:
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "toolkit.cli", "run", str(point.recipe),  # caps replace the point's own
                               *layered(point.overrides, caps), *(["--smoke"] if smoke else []), "--runs-dir", tmp],
                              capture_output=True, text=True)
        wall = time.perf_counter() - start
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise UserError(f"--estimate: the measuring run of {point} failed: {last}")
        run = next(Path(tmp).rglob("metrics.json")).parent
        metrics = json.loads((run / "metrics.json").read_text())
        log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines() if line.strip()]
    clock = {e["step"]: e["step"] * per_step / e["samples_per_second"] for e in log
             if "loss" in e and e.get("samples_per_second")}  # train seconds after each step
    last = max(clock, default=0)
    step_s = ((clock[last] - clock[1]) / (last - 1) if last > 1 and 1 in clock
              else metrics.get("train_runtime_s", 0.0) / max(1, metrics.get("train_steps") or 1))
    eval_s = metrics.get("eval_runtime_s", 0.0)
    eval_n = max(1, round(eval_s * (metrics.get("eval_samples_per_second") or 0.0)))
    return Timing(step_s, eval_s / eval_n, max(0.0, wall - metrics.get("train_runtime_s", 0.0) - eval_s))


def estimate(points: list[Point], point_costs: list[Cost], smoke: bool) -> list[float]:
    """Seconds per point: measured step and evaluation times of its shape, times its counts."""
    timings: dict[str, Timing] = {}
    out = []
    for point, c in zip(points, point_costs):
        recipe = recipe_module.load(point.recipe, point.overrides, smoke=smoke)
        key = shape(recipe)
        if key not in timings:
            timings[key] = measure(point, recipe, smoke)
        t = timings[key]
        out.append(c.steps * t.step_s + c.evals * c.eval_examples * t.eval_example_s + t.overhead_s)
    return out


def duration(seconds: float) -> str:
    """`3 d 4 h`, `2 h 05 min`, `7 min`, `40 s`: as precise as an estimate deserves."""
    s = round(seconds)
    if s >= 86400:
        return f"{s // 86400} d {s % 86400 // 3600} h"
    if s >= 3600:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return f"{s // 60} min" if s >= 60 else f"{s} s"


def kept_going(failed: list[str], total: int) -> str:
    """`sweep --keep-going`'s last line: every point that failed (each said as it failed, its own
    error line above), the others run; the same command runs the failed ones again."""
    return (f"sweep: {len(failed)} of {total} runs failed ({'; '.join(failed)}); the others ran and are kept: "
            "the same command runs the failed ones again")
