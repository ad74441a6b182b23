"""The task contract: family from the config, declared metric directions in best-model selection,
what a saved run carries (label names, GPT-2's pad id, a portable base id)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoConfig

from conftest import write_recipe
from toolkit import models
from toolkit.errors import UserError
from toolkit.tasks import CATALOGUE, Metric, declaration


@pytest.mark.parametrize("model_type", ["deberta-v2", "distilbert", "electra", "albert"])
def test_family_comes_from_the_config_not_the_name(tmp_path: Path, model_type: str) -> None:
    folder = tmp_path / "bert-looking-name"  # a name that would fool a guess from the name
    AutoConfig.for_model(model_type).save_pretrained(folder)
    assert models.family_of(str(folder)) == model_type
    assert models.kind_of(model_type) == "encoder"
    models.check_head(str(folder), model_type, "sequence-classification")


def test_unknown_and_headless_families_are_refused(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "not-a-model"}))
    with pytest.raises(UserError, match="model_type 'not-a-model' .* is not one transformers"):
        models.family_of(str(folder))
    (folder / "config.json").write_text("{broken")
    with pytest.raises(UserError, match="config.json is not valid JSON"):
        models.family_of(str(folder))
    with pytest.raises(UserError, match="no sequence-classification head for clip"):
        models.check_head("openai/clip", "clip", "sequence-classification")


def test_smoke_on_distilbert_trains_a_distilbert(tmp_path: Path, cli) -> None:
    recipe = write_recipe(tmp_path / "r.yaml", """model: {checkpoint: distilbert-base-uncased}
task: {name: glue, subset: sst2, max_length: 32}
method: {name: lora, target_modules: [q_lin, v_lin]}
train: {epochs: 1, lr: 1.0e-3, batch_size: 8}
""")
    code, _, err = cli("run", recipe, "method.target_modules=null", "--smoke", "--runs-dir", tmp_path / "runs")
    assert code == 2 and "PEFT has no default LoRA target modules for distilbert" in err
    code, _, err = cli("run", recipe, "--smoke", "--runs-dir", tmp_path / "runs")
    assert code == 0, err
    (config,) = (tmp_path / "runs").rglob("adapter_config.json")
    base = json.loads(config.read_text())["base_model_name_or_path"]
    assert json.loads((Path(base) / "config.json").read_text())["model_type"] == "distilbert"


def test_declarations_say_direction_and_scale() -> None:
    assert declaration("accuracy_mm") == Metric("accuracy_mm", True, 100.0)
    assert not CATALOGUE["perplexity"].higher_is_better and CATALOGUE["bleu"].scale == 1.0
    loss = CATALOGUE["loss"]
    assert loss.better(0.5, 0.7) and not loss.better(0.7, 0.5) and loss.better(3.0, None)


def test_lower_is_better_metric_selects_the_lowest_checkpoint(tmp_path: Path, cli) -> None:
    """train.metric=loss: the kept model is the evaluation with the lowest eval loss."""
    recipe = write_recipe(tmp_path / "r.yaml", """model: {checkpoint: bert-base-uncased}
task: {name: glue, subset: sst2, max_length: 32, max_train_samples: 64, max_eval_samples: 32}
method: {name: full}
train: {max_steps: 8, lr: 0.05, batch_size: 8, eval_every: 1, metric: loss, save_total_limit: 1}
""")
    code, _, err = cli("run", recipe, "--smoke", "task.max_train_samples=64", "train.max_steps=8",
                       "--runs-dir", tmp_path / "runs")
    assert code == 0, err
    (run,) = [p.parent for p in (tmp_path / "runs").rglob("metrics.json")]
    evals = [json.loads(l) for l in (run / "log.jsonl").read_text().splitlines() if '"eval"' in l]
    losses = {e["step"]: e["eval"]["loss"] for e in evals}
    assert len(set(losses.values())) > 2, losses  # the loss moved: the choice means something
    best = min(losses, key=losses.get)
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["best_step"] == best
    assert metrics["kept"] == {"step": best, "on": "loss", "value": pytest.approx(losses[best], rel=1e-5),
                               "eval_loss": pytest.approx(losses[best], rel=1e-5), "ties": "lower eval loss"}
    assert metrics["eval"]["loss"] == pytest.approx(losses[best], rel=1e-5)


def test_gpt2_run_saves_its_pad_id_and_label_names(tmp_path: Path, cli) -> None:
    recipe = write_recipe(tmp_path / "r.yaml", """model: {checkpoint: gpt2}
task: {name: glue, subset: mrpc, max_length: 32}
method: {name: full}
train: {epochs: 1, lr: 1.0e-3, batch_size: 8}
""")
    assert cli("run", recipe, "--smoke", "--runs-dir", tmp_path / "runs")[0] == 0
    (config,) = (tmp_path / "runs").rglob("model/config.json")
    saved = json.loads(config.read_text())
    assert saved["pad_token_id"] == saved["eos_token_id"] == 50256
    assert saved["id2label"] == {"0": "not_equivalent", "1": "equivalent"}


def test_adapter_config_names_the_hub_id_not_a_package_path(tmp_path: Path, cli) -> None:
    recipe = write_recipe(tmp_path / "r.yaml", """model: {checkpoint: sentence-transformers/all-MiniLM-L6-v2}
task: {name: glue, subset: sst2, max_length: 32, max_train_samples: 16, max_eval_samples: 16}
method: {name: lora}
train: {max_steps: 1, batch_size: 8}
""")
    assert cli("run", recipe, "--runs-dir", tmp_path / "runs")[0] == 0
    (config,) = (tmp_path / "runs").rglob("adapter_config.json")
    assert json.loads(config.read_text())["base_model_name_or_path"] == "sentence-transformers/all-MiniLM-L6-v2"


def test_report_shows_each_metric_at_its_declared_scale_and_direction(tmp_path: Path) -> None:
    from toolkit import reports as report

    for name, seed, evals in (("a", 1, {"accuracy": 0.8, "loss": 0.41}), ("a", 2, {"accuracy": 0.9, "loss": 0.39}),
                              ("b", 1, {"bleu": 27.5, "perplexity": 12.0})):
        run = tmp_path / name / str(seed)
        run.mkdir(parents=True)
        (run / "recipe.yaml").write_text(f"task: {{name: {name}}}\ntrain: {{seed: {seed}}}\n")  # two recipes
        decl = {"perplexity": {"higher_is_better": False, "scale": 1.0}}
        (run / "metrics.json").write_text(json.dumps({
            "eval": evals, "metric_declarations": decl, "method": "lora", "trainable_percent": 1.0,
            "trainable_params": 10, "train_runtime_s": 1.0, "train_samples_per_second": 2.0,
            "peak_memory_mb": 3.0}))
    header, table = report.rows(report.collect(tmp_path))
    assert header[3:7] == ["accuracy (%) ↑", "bleu ↑", "perplexity ↓", "loss ↓"]
    by_run = {row[0]: row for row in table}
    assert by_run["a"][2] == "2" and by_run["a"][3] == "85.00 ± 7.07"  # mean ± sample std over 2 seeds
    assert by_run["b"][4:6] == ["27.50", "12.00"]  # BLEU and perplexity are not percentages


def test_keep_best_breaks_a_tie_on_the_metric_with_the_lower_eval_loss() -> None:
    from toolkit.train import improves

    accuracy = CATALOGUE["accuracy"]
    assert improves(accuracy, 1.0, 0.64, None, None)  # the first evaluation
    assert improves(accuracy, 1.0, 0.20, 1.0, 0.64)  # same accuracy, trained further: kept
    assert not improves(accuracy, 1.0, 0.70, 1.0, 0.64)  # same accuracy, worse loss
    assert not improves(accuracy, 0.9, 0.01, 1.0, 0.64)  # the metric comes first
    assert improves(accuracy, 1.0, 0.50, 1.0, None)  # an older run's state has no loss yet


def _tasks_with_own_files() -> list[str]:
    import dataclasses

    from toolkit.tasks import TASKS

    return sorted(n for n in TASKS.names() if {"train_file", "eval_file"} <= {f.name for f in dataclasses.fields(TASKS.get(n))})


@pytest.mark.parametrize("name", _tasks_with_own_files())
def test_an_eval_file_that_is_the_train_file_is_said(tmp_path: Path, name: str) -> None:
    """One file (or a copy of it) as both task.train_file and task.eval_file: the scores are of
    training examples. Said once as a warning for every task that reads its own files."""
    import shutil

    from toolkit.tasks import TASKS

    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "a b c"}\n')
    shutil.copy(data, tmp_path / "copy.jsonl")
    other = tmp_path / "other.jsonl"
    other.write_text('{"text": "d e f"}\n')
    cls = TASKS.get(name)
    for eval_file, said in ((data, True), (tmp_path / "copy.jsonl", True), (other, False)):
        task = cls(train_file=str(data), eval_file=str(eval_file))
        task._note_eval_is_train()
        assert ("eval is train" in task.notices()) == said, eval_file


@pytest.mark.parametrize("family", ["bert-base-uncased", "roberta-base", "gpt2", "bart-base", "t5"])
def test_a_tokenizer_read_again_is_the_folders_whatever_earlier_callers_did(tmp_path: Path, family: str) -> None:
    """models.load_tokenizer keeps the folders it read (a read is a tenth to half a second, and a
    run, its evaluation, predict and export read the same folder): every load is what a fresh
    read of the folder gives, whatever an earlier caller set on its copy or added to it, and a
    folder whose files changed is read again. Finding: the copies shared one Rust backend, so a
    caller adding a token changed its live siblings' vocabulary and truncation set by one was the
    others'; each copy's backend is now its own (models.own_backend)."""
    import shutil

    folder = tmp_path / family
    shutil.copytree(models.tokenizer_dir() / family, folder)
    text = ["Zürich's tokenizer, read twice.", "a b"]

    def same_as_fresh(tok, fresh) -> None:
        assert (type(tok), len(tok), tok.pad_token, tok.padding_side, tok.truncation_side, tok.model_max_length) == (
            type(fresh), len(fresh), fresh.pad_token, fresh.padding_side, fresh.truncation_side, fresh.model_max_length)
        for kwargs in ({"padding": True}, {"padding": "max_length", "truncation": True, "max_length": 6}):
            assert tok(text, **kwargs)["input_ids"] == fresh(text, **kwargs)["input_ids"]

    fresh = models._read_tokenizer(str(folder), False)
    first = models.load_tokenizer(str(folder))
    first.padding_side, first.truncation_side = "left", "left"  # what callers set on their copy
    first.pad_token = first.unk_token or first.eos_token
    first(text, padding="max_length", truncation=True, max_length=3)  # the backend's settings of one call
    sibling = models.load_tokenizer(str(folder))  # lent while `first` is alive
    same_as_fresh(sibling, fresh)
    assert sibling.backend_tokenizer.to_str() == fresh.backend_tokenizer.to_str()  # the same tokenizer, whole
    first.add_tokens(["<added-by-a-caller>"])  # into first's own backend: not its live sibling's
    first.backend_tokenizer.enable_truncation(2)
    first.backend_tokenizer.enable_padding(length=9)
    assert len(first) == len(fresh) + 1 and len(sibling) == len(fresh)
    assert sibling("<added-by-a-caller>")["input_ids"] == fresh("<added-by-a-caller>")["input_ids"]
    assert (sibling.backend_tokenizer.truncation, sibling.backend_tokenizer.padding) == (None, None)
    same_as_fresh(sibling, fresh)
    same_as_fresh(models.load_tokenizer(str(folder)), fresh)
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**settings, "model_max_length": 77}))
    changed = models.load_tokenizer(str(folder))
    assert changed.model_max_length == 77
    same_as_fresh(changed, models._read_tokenizer(str(folder), False))


def _metric_variants() -> list[tuple[str, dict, dict]]:
    """(task, settings, attributes the model sets) for every registered task, and the variants
    whose declared metrics differ: every GLUE subset, SQuAD v2 extractive (best_* and thresholds)."""
    from toolkit.tasks import TASKS
    from toolkit.tasks.glue import SPECS

    out = [(n, {}, {}) for n in sorted(TASKS.names()) if n != "glue"]
    out += [("glue", {"subset": s}, {}) for s in sorted(SPECS)]
    out += [("squad", {"version": "v2"}, {"_extractive": e}) for e in (False, True)]
    out += [("text_classification", {"problem": "regression"}, {})]
    return out


@pytest.mark.parametrize("name, settings, attributes", _metric_variants(),
                         ids=[f"{n}-{'-'.join(map(str, {**s, **a}.values()))}" for n, s, a in _metric_variants()])
def test_every_declared_metric_is_reported_with_its_own_declaration(name: str, settings: dict, attributes: dict) -> None:
    """metrics.json's metric_declarations (and so every report's scale and direction) come from
    `Task.declaration(name)`: for each metric a task declares, on each of its eval splits, that is
    the declaration itself, never a shorter declared name it starts with (SQuAD v2's
    best_f1_thresh, a logit threshold, was declared as best_f1's percentage: 100 times its value)."""
    from toolkit.tasks import TASKS

    task = TASKS.get(name)(**settings)
    task.__dict__.update(attributes)
    for metric in task.declared_metrics():
        for suffix in task.suffixes():
            got = task.declaration(metric.name + suffix)
            assert (got.higher_is_better, got.scale, got.score) == (metric.higher_is_better, metric.scale,
                                                                    metric.score), (metric, suffix, got)


# Each task's field settings, one field named twice: a scored field as an input (the model reads its
# own answer: accuracy 1.0, ROUGE 100, exit 0), or two inputs one field.
ONE_FIELD_TWICE = [
    ("glue/sst2/minilm-full", "task.name=text_classification task.eval_file=x.csv task.text_columns=[t] task.label_column=t",
     "task.label_column: 't' is also in task.text_columns: the model would read what it is scored on"),
    ("ner/conll2003/minilm-lora", "task.tokens_field=w task.tags_field=w",
     "task.tags_field: 'w' is also in task.tokens_field: the model would read what it is scored on"),
    ("squad/v1.1/minilm-full", "task.question_field=q task.answers_field=q",
     "task.answers_field: 'q' is also in task.question_field: the model would read what it is scored on"),
    ("squad/v1.1/minilm-full", "task.context_field=c task.answers_field=c",
     "task.answers_field: 'c' is also in task.context_field: the model would read what it is scored on"),
    ("squad/v1.1/minilm-full", "task.question_field=q task.context_field=q",
     "task.context_field: 'q' is also in task.question_field: a field holds one thing"),
    ("squad/v1.1/minilm-full", "task.id_field=q task.question_field=q",
     "task.question_field: 'q' is also in task.id_field: a field holds one thing"),
    ("summarization/samsum/t5-base-lora", "task.source_field=x task.target_field=x",
     "task.target_field: 'x' is also in task.source_field: the model would read what it is scored on"),
    # the preset's source field (SAMSum: dialogue) named as the target
    ("summarization/samsum/t5-base-lora", "task.target_field=dialogue",
     "task.target_field: 'dialogue' is also in task.source_field: the model would read what it is scored on"),
    ("translation/multi30k/t5-base-lora", "task.source_field=x task.target_field=x",
     "task.target_field: 'x' is also in task.source_field: the model would read what it is scored on"),
]


def test_every_task_with_field_settings_is_checked_for_one_field_twice() -> None:
    from toolkit.tasks import TASKS
    named = {TASKS.get(n).__name__ for n in TASKS.names() if TASKS.get(n).field_keys or TASKS.get(n).scored_keys}
    assert named == {"TextClassification", "Ner", "Squad", "Summarization", "Translation"}, named


@pytest.mark.parametrize("entry", ["validate", "run", "api"])
@pytest.mark.parametrize("recipe, overrides, message", ONE_FIELD_TWICE)
def test_one_field_in_two_roles_is_refused_at_validate(tmp_path: Path, cli, entry: str, recipe: str,
                                                       overrides: str, message: str) -> None:
    (tmp_path / "x.csv").write_text("t,label\na,b\n")
    args = [o.replace("x.csv", str(tmp_path / "x.csv")) for o in overrides.split(" ")]
    if entry == "api":
        import toolkit
        with pytest.raises(UserError, match=message):
            toolkit.validate(recipe, args)
        return
    code, out, err = cli(entry, recipe, *args, *(["--runs-dir", tmp_path / "runs"] if entry == "run" else []))
    assert code == 2 and message in err, err
    assert not (tmp_path / "runs").exists()
