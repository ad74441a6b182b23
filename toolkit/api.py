"""The Python API: what the command line does, as functions that return results.

    import toolkit
    run = toolkit.run("demo/sst2/minilm-lora", ["train.epochs=1"])
    run.dir, run.metrics["eval"]
    toolkit.evaluate(run.dir)                      # {"eval": {...}, ...}
    toolkit.predict(run.dir, ["a great movie"])    # [{"label": ..., "score": ..., "probabilities": {...}}]
    toolkit.export(run.dir, "out", merge=True)

User errors raise `toolkit.UserError` with the one line the CLI prints; nothing here prints a
traceback or exits. Ctrl-C during `run` raises `toolkit.errors.Interrupted` (a KeyboardInterrupt)
whose message says the step reached and how to resume. `toolkit.cli` is a thin layer over these functions. Importing this module
imports no torch, transformers or datasets: each function imports what it uses.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from toolkit import chain, recipe as recipe_module, reports, runs, sweeps
from toolkit.errors import Interrupted, UserError, writing
from toolkit.recipe import RunPlan, find_recipe


@dataclass(frozen=True)
class Run:
    """A run folder (runs/<recipe>/<hash>) and what it wrote."""

    dir: Path

    @property
    def metrics(self) -> dict[str, Any]:
        """metrics.json of a finished run ({} while it is not finished)."""
        file = self.dir / "metrics.json"
        return json.loads(file.read_text()) if file.is_file() else {}


def run(recipe: str | os.PathLike, overrides: Iterable[str] | None = None, *, runs_dir: str | os.PathLike | None = None,
        smoke: bool = False, force: bool = False) -> Run:
    """Train and evaluate one recipe (a path or a shipped name) into its run folder; a finished
    run is returned as it is unless `force`."""
    out = run_one(str(recipe), list(overrides or []), smoke=smoke,
                  runs_dir=None if runs_dir is None else str(runs_dir), force=force)
    return Run(Path(out))


def evaluate(run_dir: str | os.PathLike, split: str = "eval", overrides: Iterable[str] | None = None) -> dict:
    """Score a finished run on a split with its task's metrics (also writes eval-<split>.json)."""
    from toolkit import inference

    return inference.evaluate_run(Path(run_dir), split, list(overrides or []), None)


def predict(run_dir: str | os.PathLike, texts: Iterable[str | tuple[str, str] | dict]) -> list[dict]:
    """One dict per input of a trained classification run: `label` and its `score` (probability),
    and every label's `probabilities`; a regression gives `score` alone. An input is a text, a
    (text, text) pair, or a dict with the task's text fields."""
    from toolkit import inference

    return inference.predict_rows(Path(run_dir), list(texts))


def export(run_dir: str | os.PathLike, out: str | os.PathLike, merge: bool = False) -> str:
    """A plain transformers (or PEFT) folder at `out`; returns the line saying what was written."""
    from toolkit import inference

    return inference.export_run(Path(run_dir), Path(out), merge, None)


def sweep(recipes: Iterable[str | os.PathLike], axes: Iterable[str] | None = None, *, seeds: str = "42",
          runs_dir: str | os.PathLike | None = None, smoke: bool = False, force: bool = False) -> list[Run]:
    """Every recipe x every combination of `axes` (`train.lr=1e-4,3e-4`) x seeds, run one after
    another in this process; every point is checked before the first one runs."""
    root = runs.runs_root(None if runs_dir is None else str(runs_dir))
    _check_runs_root(root)
    points, _ = sweeps.plan([find_recipe(str(r)) for r in recipes], list(axes or []), seeds, root, smoke)
    return [run(p.recipe, p.overrides, runs_dir=root, smoke=smoke, force=force) for p in points]


def report(runs_dir: str | os.PathLike, **options: Any) -> str:
    """The Markdown report of a folder of runs (the options of `toolkit report`: row_key,
    col_key, metrics, glue, plots, out)."""
    return reports.render([Path(runs_dir)], **{"plots": False, **options})


def run_one(path: str | Path, overrides: list[str], smoke: bool = False, runs_dir: str | None = None,
            force: bool = False, resume: bool = False, stop_after: int | None = None) -> Path:
    """One recipe into its run folder: skipped when finished (unless forced), resumed when
    interrupted, refused while another process runs it. `run` and every point of `sweep` go
    through here. Returns the run folder."""
    from toolkit import train  # torch: imported on the first run

    plan = recipe_module.plan(find_recipe(str(path)), overrides, smoke=smoke)
    root = runs.runs_root(runs_dir)
    _check_runs_root(root)
    if plan.recipe.smoke:
        _smoke_upstream(plan, root)
    chain.resolve(plan, root)  # model.checkpoint: {run: ...}
    out = runs.run_dir(plan.recipe, root)
    rank0 = int(os.environ.get("RANK", "0")) == 0
    if runs.is_finished(out) and not force:
        if rank0:
            print(f"{out} is finished already (metrics.json); --force runs it again")
        return out
    with runs.locked(out):  # a second launch of the same run refuses here
        if force and out.exists() and rank0:
            shutil.rmtree(out)
        existed = out.exists()
        resume = resume or (existed and bool(runs.checkpoints(out)))
        if resume and not runs.checkpoints(out) and rank0:
            print(f"no checkpoint in {out}: starting from the beginning")
        try:
            with writing(out, "free some space (or use another --runs-dir): the same command goes on "
                         "from the last checkpoint", ask_the_disk=True):
                metrics = train.run(plan, out, resume=resume, stop_after=stop_after)
        except KeyboardInterrupt as exc:
            again = ["toolkit", "run", str(path), *overrides] + ["--smoke"] * smoke + \
                (["--runs-dir", runs_dir] if runs_dir else [])
            raise interrupted(exc, out, existed and rank0, again) from None
    if metrics is not None and rank0:
        evals = ", ".join(f"{k}={v:.4f}" for k, v in metrics["eval"].items())
        print(f"{out}: {evals}")
    return out


def interrupted(exc: KeyboardInterrupt, out: Path, existed: bool, again: list[str]) -> Interrupted:
    """Ctrl-C during a run: one line saying the step reached, what was kept and the command that
    goes on from there. A folder this launch created and that holds no checkpoint is removed."""
    import shlex

    step, total = getattr(exc, "step", None), getattr(exc, "total", None)
    reached = f"at step {step} of {total}" if step is not None else "outside the training steps"
    kept = runs.last_step(out)
    if kept is not None:
        return Interrupted(f"interrupted {reached}; {out} keeps the checkpoint of step {kept}: "
                           f"`{shlex.join(again + ['--resume'])}` goes on from there", step, total)
    if not existed and out.exists():
        shutil.rmtree(out, ignore_errors=True)
    return Interrupted(f"interrupted {reached}, before any checkpoint: nothing was kept; "
                       f"`{shlex.join(again)}` starts it again", step, total)


def _smoke_upstream(plan: RunPlan, root: Path) -> None:
    """--smoke runs every recipe end to end: a chained one first runs the smoke run it starts from."""
    from toolkit import train  # torch: imported on the first run

    up = plan.upstream
    if up is None or runs.is_finished(runs.run_dir(up.recipe, root)):
        return
    _smoke_upstream(up, root)
    chain.resolve(up, root)
    out = runs.run_dir(up.recipe, root)
    train.run(up, out, resume=bool(runs.checkpoints(out)))


def _check_runs_root(root: Path) -> None:
    """A runs folder that cannot take a run is said before any model loads."""
    if root.exists() and not root.is_dir():
        raise UserError(f"--runs-dir: {root} is a file, not a folder")
    existing = next((p for p in [root, *root.parents] if p.exists()), Path("."))
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"--runs-dir: {existing} is not writable")


