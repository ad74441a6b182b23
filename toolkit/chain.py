"""Chaining runs: `model.checkpoint: {run: recipes/....yaml, overrides: [...]}` names an earlier
run by its recipe, not by its hash folder, so continued pretraining feeds fine-tuning.

The reference is validated with the recipe (the named recipe is loaded and checked too, its model
family is this run's), and resolved when the run starts: the named recipe with its overrides is
hashed into its run folder under the same runs root (`--runs-dir`), which must be finished and
hold a plain transformers model. Under `--smoke` the named recipe is taken at smoke size too, so
a chain's smoke run starts from the smoke run of its pretraining (whose small model it is), and a
run that is not a smoke run never starts from one (`check_smoke`).
The upstream's model is its weights, tokenizer and attention module: `check` has the recipe name
that module, and a finished chained run records the upstream files it started from, which
`check_current` compares before the run is called finished again.
"""

from __future__ import annotations

from pathlib import Path

from toolkit import attention, runs
from toolkit.errors import UserError, user_path
from toolkit.recipe_data import Recipe, RunPlan, recipes_root

KEYS = ("run", "overrides")


def recipe_file(run: str, origin: Path | None) -> Path:
    """`run` as given (from the working directory), else from the folder holding `recipes/`, else,
    for `recipes/...`, the shipped recipe of that path (recipe_data.recipes_root): `toolkit cp` of a
    chained recipe keeps its `run: recipes/pretrain/...`, and the copy ("it stands alone"), run
    outside the checkout, said its upstream recipe does not exist."""
    path = user_path(run)
    if path.is_file() or path.is_absolute() or origin is None:
        return path
    for parent in origin.resolve().parents:
        if parent.name == "recipes" and (parent.parent / path).is_file():
            return parent.parent / path
    if path.parts[:1] == ("recipes",) and len(path.parts) > 1:
        try:
            shipped = recipes_root() / Path(*path.parts[1:])
        except UserError:  # no recipes shipped with the package
            return path
        if shipped.is_file():
            return shipped
    return path


def canonical(ref: dict, origin: Path | None) -> dict:
    """A `{run: ..., overrides: [...]}` checkpoint in one form, whatever the spelling that names
    the recipe file (relative to the working directory or to the recipes tree, absolute, `./`,
    `~`, a variable, a symbolic link) and with no `overrides` where there are none: it is hashed,
    and two spellings of one upstream gave the fine-tuning two run ids. A recipe of the recipes
    tree (recipe_data.recipes_root: the checkout's, or those shipped with the package) is
    `recipes/<path in it>`, as shipped recipes write it and recipe_file finds it from anywhere;
    any other is its absolute path (a `recipes/...` of another tree would name a shipped recipe
    where one has the same path). A reference that names no file is left as written (the
    upstream's own check says it)."""
    run, overrides = ref.get("run"), ref.get("overrides")
    out = {k: v for k, v in ref.items() if k not in KEYS}
    if isinstance(run, str):
        path = recipe_file(run, origin)
        if path.is_file():
            path = path.resolve()
            try:
                tree: Path | None = recipes_root().resolve()
            except UserError:  # no recipes tree here nor shipped
                tree = None
            run = f"recipes/{path.relative_to(tree).as_posix()}" if tree and path.is_relative_to(tree) else str(path)
    out["run"] = run
    if overrides:
        out["overrides"] = overrides
    return out


def check(recipe: Recipe, upstream: Recipe) -> None:
    """The model a `{run: ...}` checkpoint names is its weights with the attention module they were
    trained under (its settings and parameters, saved beside them): a fine-tuning recipe that says
    no `model.attention` ran the pretrained body with transformers' default attention and left
    the module's parameters behind, exit 0. It names the module (its parameters come with it) or,
    to leave it, another attention."""
    if not upstream.method.saves_model():
        raise UserError(not_a_model(recipe.model.checkpoint, upstream.method))
    theirs = upstream.model.attention
    reason = attention.left_behind(theirs, recipe.model.attention, bool(recipe.model.warm_start))
    if reason:
        raise UserError(f"model.attention: the run model.checkpoint names ({recipe.model.checkpoint['run']}) was "
                        f"trained with attention module '{theirs.name}', {reason}")


def resolve(plan: RunPlan, root: Path) -> None:
    """Point `plan.checkpoint_path` at the final model of the run its checkpoint names: a runs
    root is known only at launch, so this is the plan's, never the recipe's (nor its hash's)."""
    if plan.upstream is None:
        return
    recipe = plan.recipe
    folder = runs.run_dir(plan.upstream.recipe, root)
    ref = recipe.model.checkpoint
    if not runs.is_finished(folder):
        state = "is unfinished" if folder.exists() else "has not been run"
        rest = [*(ref.get("overrides") or []), *(["--smoke"] if recipe.smoke else []), "--runs-dir", str(root)]
        n, way = runs.world_size(), runs.strategy()
        sharded = way not in runs.NEUTRAL_STRATEGIES
        # a run id counts its processes and a sharded strategy: under a launch of n, the plain
        # command makes a 1-process run (and `make run` without it a DDP run), another run, and the
        # launch would say the same again however often it was followed
        again = runs.run_command(ref['run'], rest)
        elsewhere = finished_on_other_counts(plan.upstream.recipe, folder)
        if elsewhere:  # what this launch asks is a run of that recipe on its own process count
            done = ", ".join(f"on {k} process(es){_under(w)} ({path})" for k, w, path in elsewhere)
            counts = " or ".join(f"NPROC={k}{_under(w, ' STRATEGY=')}" for k, w, _ in elsewhere)
            raise UserError(f"model.checkpoint: run {ref['run']} {state} on {n} process(es){_under(way)}, the "
                            f"count of this launch ({folder} has no metrics.json); it finished {done}, another "
                            f"run (the process count sets the global batch): launch this one as that one was "
                            f"({counts}), or run it on {n} first: {again}")
        if n > 1 or sharded:
            raise UserError(f"model.checkpoint: run {ref['run']} {state} on {n} process(es){_under(way)}, the "
                            f"count of this launch ({folder} has no metrics.json); run it first under the same launch: "
                            f"{again}")
        raise UserError(f"model.checkpoint: run {ref['run']} {state} ({folder} has no metrics.json); "
                        f"run it first: {again}")
    model = folder / "model"
    again = runs.run_command(ref['run'], [*(ref.get("overrides") or []), *(["--smoke"] if recipe.smoke else []),
                                          "--runs-dir", str(root), "--force"])
    if not (model / "config.json").is_file():  # its method saves a model (check said so at validate)
        raise UserError(f"model.checkpoint: run {ref['run']} is finished, but {model_gone(model)}, so there is "
                        f"no model to start from; put it back as the run wrote it, or run that run again: {again}")
    changed = runs.result_changed(folder)  # else this run starts from weights that are not that run's result
    if changed is not None:
        raise UserError(f"model.checkpoint: run {ref['run']} is finished, but {changed} (its metrics.json "
                        f"model_files), so its model is not that run's result; put it back as the run wrote it, "
                        f"or run that run again: {again}")
    plan.checkpoint_path = str(model)


def model_gone(model: Path) -> str:
    """How a finished run's model/ that holds no model is said. Its run's method saves a whole
    model (check refuses the others), so the folder was removed or emptied after the run: it was
    said as "saves full's own parameters, not a model; full has no method.merge", the wrong cause."""
    return f"its {model} is gone" if not model.is_dir() else f"its {model} holds no config.json (emptied since)"


def _under(way: str, said: str = " under STRATEGY=") -> str:
    """A sharded strategy named after a process count ('' for one process and DDP)."""
    return "" if way in runs.NEUTRAL_STRATEGIES else f"{said}{way}"


def finished_on_other_counts(upstream: Recipe, folder: Path) -> list[tuple[int, str, Path]]:
    """(process count, strategy, folder) of each finished run of `upstream` beside `folder` (the
    run of this launch's process count and strategy) under another count or strategy: its
    identity.json names them (no strategy there: one process or DDP, the runs before it), and the
    run id of the recipe under them is the folder's name. A chain looks for the upstream run of its
    own launch's count; one pretrained on 2 processes and fine-tuned on 1 was said "has not been
    run", naming a command that would pretrain again."""
    found = []
    for other in sorted(folder.parent.iterdir()) if folder.parent.is_dir() else []:
        try:
            said = runs.read_json(other / "identity.json")
            count, way = said["processes"], said.get("strategy") or ("ddp" if int(said["processes"]) > 1 else "none")
            if other != folder and other.name in runs.run_ids(upstream, int(count), way) and runs.is_finished(other):
                found.append((int(count), way, other))
        except (OSError, ValueError, KeyError, TypeError, UserError):  # not such a run, or damaged: not named
            continue
    return found


def not_a_model(ref: dict, method: object) -> str:
    """The line for a chain whose upstream run saves its method's own parameters (an adapter,
    soft prompts) or nothing (in-context prompting), not a model another run can start from."""
    fix = ("set method.merge: true in that recipe so its result is a plain transformers folder"
           if hasattr(method, "merge") else f"{method.name} has no method.merge: chain from "
           "a run that saves a whole model (full, freeze, bitfit, or lora with method.merge: true)")
    what = "saves nothing to start from" if not getattr(method, "trains", True) else \
        f"saves {method.name}'s own parameters, not a model"
    return f"model.checkpoint: run {ref['run']} {what}; {fix}"


def check_smoke(plan: RunPlan) -> None:
    """A run that is not a smoke run, and each run above it in its chain, starts from no smoke run
    (smoke_upstream). Said of the run launched, whose whole chain is known by then: an upstream's
    plan is made first as written, not smoke, where --smoke on the run launched makes it one."""
    where = ""
    while plan.upstream is not None and not plan.recipe.smoke:
        ref = plan.recipe.model.checkpoint
        if plan.upstream.recipe.smoke:
            raise UserError(where + smoke_upstream(ref))
        where, plan = f"{where}model.checkpoint.run ({ref['run']}): ", plan.upstream


def smoke_upstream(ref: dict) -> str:
    """The line for a run that is not a smoke run chained to one (`smoke=true` in the reference's
    overrides or `smoke: true` in its recipe): its base is the small random-weight model --smoke
    builds, and the fine-tuning from it ran as a real run, reported without the smoke mark (its
    own recipe says no smoke), exit 0. A chain is smoke from its first run to its last: --smoke
    on the last makes every run above it a smoke run."""
    said = "its overrides say smoke=true" if any(str(o).replace(" ", "").startswith("smoke=")
                                                for o in ref.get("overrides") or []) else "its recipe says smoke: true"
    return (f"model.checkpoint: run {ref['run']} is a smoke run ({said}): its model is the small random-weight "
            "one --smoke builds, and this run is not a smoke run, so its result would stand as a real one; run "
            "this recipe with --smoke too, or drop smoke from that run")


# what a run records of the base model folder it started from (metrics.json `base_weights`):
# the weights (the attention module's too), config and tokenizer
MODEL_FILES = runs.BASE_WEIGHTS + runs.BASE_READ + ("attention.json",)


def rebuilt_base(recipe: Recipe) -> bool:
    """Whether a run's base is built again alike from its recipe, so that no record of its files
    is kept: a smoke run's small random model. A chained smoke run's base is its upstream smoke
    run's model/, which a rerun with --force may leave other (recorded like any base folder)."""
    return recipe.smoke and not isinstance(recipe.model.checkpoint, dict)


def check_current(plan: RunPlan | None, root: Path) -> None:
    """A finished chained run (and every finished run under it in the chain) started from its
    upstream's model/ as that is now. The run id names the upstream by its recipe, data and
    processes, not by the weights its run left: an upstream run again with --force (another GPU
    draw, other library versions) left other weights under the same folder, and the finished
    fine-tuning run below it still said "finished already", its metrics of the earlier weights,
    exit 0. Recorded in metrics.json (`base_weights`; `base_run_files` before 2026-11-28); a run that
    recorded none is not checked."""
    what = "this recipe"
    while plan is not None and plan.upstream is not None:
        out, ref = runs.run_dir(plan.recipe, root), plan.recipe.model.checkpoint
        if runs.is_finished(out):
            metrics = runs.read_json(out / "metrics.json")
            saved = metrics.get("base_weights") or metrics.get("base_run_files")  # the latter before 2026-11-28
            model = runs.run_dir(plan.upstream.recipe, root) / "model"
            changed = runs.base_changed(saved, str(model)) if saved else None
            if changed is not None:
                raise UserError(f"{out}: this finished run started from {model} as it was then, and "
                                f"{changed.name} there changed since (the run {ref['run']} was run again): its "
                                f"result is of the earlier weights; run {what} again with --force, or put that "
                                "model back")
        plan, what = plan.upstream, ref["run"]
    if plan is not None:
        base_current(plan, root, what)


def base_current(plan: RunPlan, root: Path, what: str = "this recipe") -> None:
    """A finished run that starts from a checkpoint as written (a local folder, a Hub id's cached
    snapshot) trained on that base as it is now. The run id names the base, not its files: a
    base folder trained or edited again (other weights, a tokenizer with other ids, a config with
    another dropout) and the same recipe launched was "finished already", its metrics of the
    earlier base, exit 0, where a chained run's changed upstream was one line. Recorded in
    metrics.json (`base_weights`, run_metrics.start_weights); a run that recorded none, a smoke run (its small model is
    built again: eval and predict check it) and a base that is gone (a cleared Hub cache: nothing
    says it changed, and a whole result does not need it) are not judged."""
    if plan.upstream is not None or rebuilt_base(plan.recipe):
        return
    out = runs.run_dir(plan.recipe, root)
    try:
        saved = runs.read_json(out / "metrics.json").get("base_weights") if runs.is_finished(out) else None
    except (OSError, ValueError, AttributeError):  # damaged: said by the finished-run check in its own name
        return
    source = plan.recipe.model.checkpoint
    if not saved or runs.base_folder(source) is None:
        return
    changed = runs.base_changed(saved, source)
    if changed is not None:
        how = {"gone": "was removed", "changed": "changed", "added": "was added"}[runs.change_kind(changed, saved)]
        raise UserError(f"{out}: this finished run trained on model.checkpoint {source} as it was then, and "
                        f"{changed} {how} since: its result is of the earlier base; run {what} again with "
                        "--force to train on the base as it is, or put the base back as it was")


def source(plan: RunPlan) -> str:
    """What models.load is given: the resolved run folder, or the checkpoint as written."""
    if plan.upstream is None:
        return plan.recipe.model.checkpoint
    if plan.checkpoint_path is None:
        raise RuntimeError("chain.resolve(plan, runs_root) must run before the model is built")
    return plan.checkpoint_path
