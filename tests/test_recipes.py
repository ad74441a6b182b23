"""Every shipped recipe validates; one recipe per (family, method, task) runs end to end under
--smoke (a small random model of its family). Running all of them would repeat the same code
path dozens of times: the suite's time stays flat as the recipe tree grows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import ROOT
from toolkit import models
from toolkit import recipe as recipes

RECIPES = sorted(p for p in (ROOT / "recipes").rglob("*.yaml") if not p.name.startswith("_"))


def _name(path: Path) -> str:
    return path.relative_to(ROOT / "recipes").as_posix()


def _representatives() -> list[Path]:
    """The first recipe of each (family, method, task) combination."""
    seen: dict[tuple, Path] = {}
    for path in RECIPES:
        try:
            plan = recipes.plan(path)
        except Exception:  # reported by test_recipe_validates
            continue
        r, base = plan.recipe, plan.base  # a chained recipe's family is its base's
        key = (models.recipe_family(base.model.checkpoint, base.model.warm_start), r.method.name, r.task.name)
        seen.setdefault(key, path)
    return sorted(seen.values())


def test_recipes_cover_every_family_and_the_glue_tasks() -> None:
    names = {_name(p) for p in RECIPES}
    for task in ("sst2", "mrpc", "rte", "stsb", "cola"):
        for model in ("bert-base-uncased", "roberta-base", "gpt2", "bart-base", "t5-base"):
            for method in ("full", "lora"):
                assert f"glue/{task}/{model}-{method}.yaml" in names


@pytest.mark.parametrize("recipe", RECIPES, ids=_name)
def test_recipe_validates(recipe: Path) -> None:
    recipes.load(recipe)


# --smoke's own sizes (32 examples, 4 steps of 8) are tests/test_recipe.py's; here each path runs end
# to end on fewer examples: a 50,000-word output layer scores every token of every batch, 58 recipes.
# Still --smoke's 4 steps: AdaLoRA's rank schedule spans the run (in 2 steps it pruned every rank).
SMALLER = ["task.max_train_samples=8", "task.max_eval_samples=8"]
SMALLER_TRAINING = ["train.batch_size=4"]  # not for a method that trains nothing (it takes no train.*)


@pytest.mark.parametrize("recipe", _representatives(), ids=_name)
def test_recipe_smoke(recipe: Path, cli, runs_dir: Path) -> None:
    from toolkit import methods

    trains = methods.METHODS.get(recipes.plan(recipe).recipe.method.name).trains
    code, _, err = cli("run", recipe, "--smoke", *SMALLER, *(SMALLER_TRAINING if trains else []),
                       "--runs-dir", runs_dir)
    assert code == 0, err
    assert "unknown token" not in err, err  # the shipped data is text its tokenizer reads (Task.note_unreadable)
    from toolkit.recipe import recipe_name

    # a chained recipe's smoke run runs the one it starts from first: take this recipe's own
    (metrics_file,) = (runs_dir / recipe_name(recipe)).rglob("metrics.json")
    metrics = json.loads(metrics_file.read_text())
    assert metrics["eval"], metrics
    assert all(v == v for v in metrics["eval"].values())  # no NaN
