"""Rule: every entry point that computes with a finished run's model (`toolkit eval`,
`toolkit predict`, `toolkit.evaluate`, `toolkit.predict`) computes under the precision the run
recorded (train.mixed_precision's autocast; precision_mode bf16_master's bf16 weights), as the
run's own evaluation did, and eval-S.json says what it was computed under. `toolkit eval` of a
bf16 run scored in fp32: another loss and chrF than metrics.json's, other predictions, exit 0.
A precision this machine cannot compute (fp16 without a CUDA GPU) is one line, as `toolkit run`
says it. One bf16 run per task type, shared by every test here (tiny models, a few examples)."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

SHORT = ["task.max_train_samples=8", "task.max_eval_samples=4"]
TRAINS = ["train.max_steps=2"]  # not for an in-context run, which trains nothing
BF16 = "train.mixed_precision=bf16"
QA = {"question": "Where is the Eiffel Tower?", "context": "The Eiffel Tower is a wrought-iron "
      "lattice tower on the Champ de Mars in Paris, France. It is named after Gustave Eiffel."}
# case: recipe, extra overrides, what to predict on (None: the task does not predict)
CASES = {
    "classification": ("demo/sst2/minilm-lora", [BF16], ["a wonderful film", "boring, dull and long"]),
    "classification-bf16_master": ("demo/sst2/minilm-full", [BF16, "train.precision_mode=bf16_master"],
                                   ["a wonderful film", "boring, dull and long"]),
    "classification-fp32": ("demo/sst2/minilm-lora", [], ["a wonderful film", "boring, dull and long"]),
    "ner": ("ner/conll2003/minilm-lora", [BF16], [["EU", "rejects", "German", "call"], ["Peter", "Blackburn"]]),
    "qa": ("squad/v1.1/minilm-full", [BF16], [QA]),
    "generation": ("translation/iwslt14/t5-base-full",
                   [BF16, "task.generation.max_new_tokens=8", "task.generation.num_beams=1"],
                   ["ein hund läuft im park .", "zwei männer ."]),
    "lm": ("pretrain/wikitext-2/gpt2-clm", [BF16], None),
    "in-context": ("glue/sst2/gpt2-icl-0shot", [BF16], None),
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, _smoke_cache: Path, conll_sample, squad_sample) -> dict[str, Path]:
    """case -> a finished run of it, trained once for the module when a test first asks for it (a
    worker that takes only some of these tests trains only theirs). NER and QA read the first
    sentences / articles of CoNLL-2003 and SQuAD (each eval reads the run's data files again)."""
    import toolkit

    root = tmp_path_factory.mktemp("bf16-runs")
    data = {"ner": [f"task.train_file={conll_sample[0]}", f"task.eval_file={conll_sample[1]}"],
            "qa": [f"task.eval_file={squad_sample}"]}

    class Runs(dict):
        def __missing__(self, case: str) -> Path:  # (its output is not the asking test's)
            recipe, extra, _ = CASES[case]
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                self[case] = toolkit.run(recipe, [*SHORT, *(TRAINS if case != "in-context" else []), *extra,
                                                  *data.get(case, [])], runs_dir=root / case, smoke=True).dir
            return self[case]

    return Runs()


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.mark.parametrize("entry", ["cli", "api"])
@pytest.mark.parametrize("case", list(CASES))
def test_eval_scores_a_run_as_the_run_scored_itself(trained, cli, case: str, entry: str) -> None:
    import toolkit

    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    run = trained[case]
    for old in run.glob("*-eval*.json*"):  # the other entry's
        old.unlink()
    metrics = json.loads((run / "metrics.json").read_text())
    # this process computed in the other precision last (a fresh `toolkit eval` process computes
    # in fp32; the API after another run kept that run's accelerate state)
    AcceleratorState._reset_state()
    Accelerator(cpu=True, mixed_precision="no" if metrics["mixed_precision"] == "bf16" else "bf16")
    if entry == "cli":
        code, _, err = cli("eval", run)
        assert code == 0, err
    else:
        toolkit.evaluate(run)
    scored = json.loads((run / "eval-eval.json").read_text())
    assert scored["eval"] == metrics["eval"]  # exactly: the loss too
    mode = "bf16_master" if case.endswith("bf16_master") else "autocast"
    assert (scored["mixed_precision"], scored["precision_mode"], scored["device"]) == (
        metrics["mixed_precision"], mode, metrics["device"])
    for made in run.glob("predictions*.jsonl"):  # QA, generation: what was scored, row for row
        if not made.name.startswith("predictions-"):
            again = run / made.name.replace("predictions", "predictions-eval", 1)
            assert _rows(again) == _rows(made)


def _reference(run: Path, inputs: list[Any]) -> list[dict]:
    """The task's predict on the run's model under torch's own bf16 autocast (bf16 weights where
    the run trained them in bf16), not through the toolkit's precision code."""
    from toolkit import inference

    recipe = inference.run_recipe(run)
    model, tok = inference.load_model(run, recipe)
    device = "cuda" if torch.cuda.is_available() else "cpu"  # where accelerate puts it
    model.to(device)
    if recipe.train.precision_mode == "bf16_master":
        model.to(torch.bfloat16)
    names = recipe.task.predict_fields(model)
    rows = [inference._as_row(i, x, names, recipe.task.predict_word_lists)
            for i, x in enumerate(recipe.task.predict_records(inputs))]
    with torch.autocast(device, dtype=torch.bfloat16, enabled=recipe.train.mixed_precision == "bf16"):
        return recipe.task.predict(model, tok, rows)


@pytest.mark.parametrize("entry", ["cli", "api"])
@pytest.mark.parametrize("case", [c for c, (_, _, inputs) in CASES.items() if inputs])
def test_predict_computes_in_the_precision_the_run_recorded(trained, cli, tmp_path: Path, case: str,
                                                            entry: str) -> None:
    import toolkit

    run, inputs = trained[case], CASES[case][2]
    if entry == "api":
        got = toolkit.predict(run, inputs)
    else:
        source = tmp_path / "in.jsonl"
        field = {"ner": "tokens", "qa": None, "generation": "de"}.get(case, "sentence")
        source.write_text("".join(json.dumps(x if field is None else {field: x}) + "\n" for x in inputs))
        code, _, err = cli("predict", run, "--input", source, "--output", tmp_path / "out.jsonl")
        assert code == 0, err
        got = _rows(tmp_path / "out.jsonl")
    assert got == json.loads(json.dumps(_reference(run, inputs)))


@pytest.mark.parametrize("entry", ["eval", "predict", "api evaluate", "api predict"])
def test_an_fp16_run_on_a_machine_without_a_gpu_is_one_line(trained, cli, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch, entry: str) -> None:
    """No silent fallback: accelerate computes fp16 in fp32 on a CPU, saying nothing."""
    import toolkit
    from toolkit import precision, recipe as recipe_module

    run = tmp_path / "fp16"
    shutil.copytree(trained["classification"], run)
    text = (run / "recipe.yaml").read_text()  # the same run, recorded as an fp16 one
    (run / "recipe.yaml").write_text(text.replace("mixed_precision: bf16", "mixed_precision: fp16"))
    raw = recipe_module.read_yaml(run / "recipe.yaml")
    assert raw["train"]["mixed_precision"] == "fp16"
    metrics = json.loads((run / "metrics.json").read_text())
    metrics["recipe_hash"] = recipe_module.built(raw).hash
    (run / "metrics.json").write_text(json.dumps(metrics))
    (tmp_path / "in.txt").write_text("a fine film\n")
    for old in run.glob("eval-*.json"):
        old.unlink()
    loads: list = []
    monkeypatch.setattr(precision.torch.cuda, "is_available", lambda: False)
    from toolkit import inference

    monkeypatch.setattr(inference, "load_model", lambda *a: loads.append(a))
    said = "the run computed in train.mixed_precision: fp16, which needs a CUDA GPU"
    if entry.startswith("api"):
        with pytest.raises(toolkit.UserError, match=said):
            toolkit.evaluate(run) if entry == "api evaluate" else toolkit.predict(run, ["a fine film"])
    else:
        code, _, err = cli(entry, run, *(["--input", tmp_path / "in.txt"] if entry == "predict" else []))
        assert code == 2 and said in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert not loads and not list(run.glob("eval-*.json"))
