"""The prediction path a task declares (`Task.predict_fields` / `predict`): `toolkit.predict` and
`toolkit predict` reach every predicting task through it, with no per-task code in inference."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import toolkit

SHORT = ["task.max_train_samples=16", "task.max_eval_samples=16", "train.max_steps=2"]
CASES = [
    ("glue", "demo/sst2/minilm-lora", ["a wonderful film", {"sentence": "boring"}]),
    ("text_classification", "demo/own-data/minilm-lora", [("A man sleeps.", "A person rests.")]),
    ("ner", "ner/conll2003/minilm-lora", ["EU rejects German call", {"tokens": ["Peter", "Blackburn"]}]),
]


def check_row(task: str, given: object, row: dict, labels: list[str]) -> None:
    if task == "ner":
        words = given.split() if isinstance(given, str) else given["tokens"]
        assert row["tokens"] == words and len(row["tags"]) == len(words)
        assert set(row["tags"]) <= set(labels)
        return
    assert row["label"] in labels and row["score"] == row["probabilities"][row["label"]]
    assert math.isclose(sum(row["probabilities"].values()), 1.0, rel_tol=1e-5)


@pytest.mark.parametrize("task, recipe, inputs", CASES)
def test_predict_goes_through_the_tasks_own_path(tmp_path: Path, task: str, recipe: str, inputs: list) -> None:
    from toolkit.inference import run_recipe

    run = toolkit.run(recipe, SHORT, runs_dir=tmp_path, smoke=True)
    settings = run_recipe(run.dir).task
    assert settings.name == task
    labels = run.metrics.get("label_names") or list(settings.label_names)
    preds = toolkit.predict(run.dir, inputs)
    assert len(preds) == len(inputs)
    for given, row in zip(inputs, preds):
        check_row(task, given, row, labels)


def test_a_task_without_a_prediction_path_is_one_line(tmp_path: Path, cli) -> None:
    run = toolkit.run("pretrain/wikitext-2/minilm-mlm", ["train.max_steps=1", "task.max_train_samples=8",
                                                         "task.max_eval_samples=8"], runs_dir=tmp_path, smoke=True)
    code, _, err = cli("predict", run.dir, "--input", "-")
    assert code == 2 and "predict handles trained runs of the tasks" in err and "(this is mlm with" in err
