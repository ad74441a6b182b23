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
from dataclasses import dataclass, field
from pathlib import Path

from toolkit import recipe as recipe_module, runs
from toolkit.errors import UserError


@dataclass
class Point:
    """One run of the grid: a recipe file and its overrides (axes first, then the seed)."""

    recipe: Path
    overrides: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return " ".join([str(self.recipe), *self.overrides])


def split_values(text: str) -> list[str]:
    """`1e-4,3e-4` -> two values; commas inside [...] or {...} belong to one YAML value."""
    out, depth, start = [], 0, 0
    for i, char in enumerate(text):
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
    """`42,43,44` or `42 43 44`: those seeds; one number up to 10 (`3`) is a count from 42."""
    if not text or not text.strip():
        return []
    try:
        seeds = [int(s) for s in text.replace(",", " ").split()]
    except ValueError:
        raise UserError(f"--seeds '{text}': expected integers, e.g. --seeds 42,43,44 or --seeds 3") from None
    if len(seeds) == 1 and 0 < seeds[0] <= MAX_SEED_COUNT:
        return list(range(SEED_BASE, SEED_BASE + seeds[0]))
    if seeds == [0]:
        raise UserError(f"--seeds '{text}': a count of seeds is 1 to {MAX_SEED_COUNT}; for the seed 0 itself "
                        "write train.seed=0")
    if len(set(seeds)) != len(seeds):
        raise UserError(f"--seeds '{text}': a seed is listed twice")
    return seeds


def grid(recipes: list[Path], axes: list[tuple[str, list[str]]], seeds: list[int]) -> list[Point]:
    """Every combination, recipe outermost and seed innermost (seeds of one setting run together)."""
    if any(key == "train.seed" for key, _ in axes) and seeds:
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
            base = raw
            for part in key.split("."):
                base = base.get(part) if isinstance(base, dict) else None
            if isinstance(base, str) and _is_number(base):
                base = float(base)
            if not isinstance(base, (int, float)) or isinstance(base, bool):
                raise UserError(f"{where}: '{item}' scales {key}, but the recipe has no number there")
            item = f"{key}={float(value[1:]) * base:.6g}"
        out.append(item)
    return out


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def resolve(point: Point) -> Point:
    """The point with scaled values made absolute against its recipe file (extends merged)."""
    if not any(o.partition("=")[2].startswith("x") for o in point.overrides):
        return point
    raw = recipe_module.read_yaml(point.recipe)
    return Point(point.recipe, resolve_scaled(raw, point.overrides, str(point.recipe)))


def plan(recipes: list[Path], axis_items: list[str], seeds: str | None, root: Path,
         smoke: bool) -> tuple[list[Point], list[Path]]:
    """Every point of the grid and its run folder; every point is checked (its recipe loads) and
    no two are the same run, before the first one runs."""
    points = [resolve(p) for p in grid(recipes, parse_axes(axis_items), parse_seeds(seeds))]
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


def describe(points: list[Point], folders: list[Path]) -> list[str]:
    """One line per point for --dry-run: its run folder and whether it is finished."""
    lines = []
    for i, (point, out) in enumerate(zip(points, folders), 1):
        state = "finished" if runs.is_finished(out) else "resumes" if runs.checkpoints(out) else "to run"
        lines.append(f"{i:>3}. {point}  ->  {out}  [{state}]")
    return lines
