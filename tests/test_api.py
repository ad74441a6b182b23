"""The Python API (toolkit/api.py): the CLI's work as functions that return results and raise
UserError, on a user's own `text,label` CSV with string labels."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

import toolkit
from conftest import PYTHON, write_recipe

REVIEWS = [("a wonderful, moving film", "pos"), ("dull and far too long", "neg"), ("I loved every minute", "pos"),
           ("a waste of an evening", "neg"), ("brilliant acting", "pos"), ("boring plot", "neg")] * 4


def _own_data(tmp_path: Path) -> Path:
    data = tmp_path / "reviews.csv"
    data.write_text("text,label\n" + "".join(f'"{t}",{l}\n' for t, l in REVIEWS))
    return write_recipe(tmp_path / "mine.yaml", f"""model: {{checkpoint: bert-base-uncased}}
task: {{name: text_classification, train_file: {data}, eval_file: {data}, max_length: 32}}
method: {{name: lora, r: 4}}
train: {{epochs: 1, lr: 1.0e-3, batch_size: 8}}
""")


def test_run_evaluate_predict_export_from_python(tmp_path: Path) -> None:
    recipe = _own_data(tmp_path)
    run = toolkit.run(recipe, ["train.epochs=2"], runs_dir=tmp_path / "runs", smoke=True)
    assert isinstance(run, toolkit.Run) and (run.dir / "metrics.json").is_file()
    assert run.metrics["eval"]["accuracy"] == json.loads((run.dir / "metrics.json").read_text())["eval"]["accuracy"]
    again = toolkit.run(recipe, ["train.epochs=2"], runs_dir=tmp_path / "runs", smoke=True)
    assert again.dir == run.dir  # finished: returned as it is
    scored = toolkit.evaluate(run.dir)
    assert scored["eval"]["accuracy"] == pytest.approx(run.metrics["eval"]["accuracy"])
    preds = toolkit.predict(run.dir, ["a wonderful film", {"text": "boring"}])
    assert [set(p) >= {"text", "label", "score", "probabilities"} for p in preds] == [True, True]
    for p in preds:
        assert p["label"] in ("neg", "pos") and p["score"] == max(p["probabilities"].values())
    note = toolkit.export(run.dir, tmp_path / "export", merge=True)
    assert (tmp_path / "export" / "config.json").is_file() and isinstance(note, str)


def test_user_errors_raise_with_the_clis_line(tmp_path: Path, capsys) -> None:
    with pytest.raises(toolkit.UserError, match=r"recipe demo/sst2/minilm-lorra does not exist \(did you mean"):
        toolkit.run("demo/sst2/minilm-lorra", runs_dir=tmp_path / "runs")
    with pytest.raises(toolkit.UserError, match=r"train.learning_rate: unknown key \(transformers' learning_rate is train.lr\)"):
        toolkit.run("demo/sst2/minilm-lora", ["train.learning_rate=1e-4"], runs_dir=tmp_path / "runs")
    with pytest.raises(toolkit.UserError, match="no recipe.yaml here"):
        toolkit.evaluate(tmp_path)
    assert capsys.readouterr().err == ""  # nothing printed, no traceback
    assert not (tmp_path / "runs").exists()


def test_import_toolkit_stays_light() -> None:
    code = ("import sys, toolkit; print(sorted(m for m in ('torch', 'transformers', 'datasets', 'peft', "
            "'accelerate') if m in sys.modules)); print(callable(toolkit.report), callable(toolkit.sweep))")
    out = subprocess.run([PYTHON, "-c", code + "; import toolkit.cli; print(callable(toolkit.report))"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["[]", "True", "True", "True"]


def test_own_files_in_two_arguments(tmp_path: Path) -> None:
    """The shipped own-data recipe on a user's `text,label` CSV: nothing but the two files."""
    data = tmp_path / "reviews.csv"
    data.write_text("text,label\n" + "".join(f'"{t}",{l}\n' for t, l in REVIEWS))
    run = toolkit.run("demo/own-data/minilm-lora", [f"task.train_file={data}", f"task.eval_file={data}"],
                      runs_dir=tmp_path / "runs", smoke=True)
    assert run.metrics["label_names"] == ["neg", "pos"] and run.metrics["text_columns"] == ["text"]
    (pred,) = toolkit.predict(run.dir, ["a moving film"])
    assert pred["label"] in ("neg", "pos") and set(pred["probabilities"]) == {"neg", "pos"}
