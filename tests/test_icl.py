"""In-context prompting: batched label scores equal a one-at-a-time reference, calibration divides
by the content-free prior, demonstrations are seeded, and a run writes an untrained metrics.json."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from datasets import Dataset

from conftest import write_recipe
from toolkit import models
from toolkit.errors import UserError
from toolkit.methods import count_params
from toolkit.methods.icl import (ICL, Prompter, calibrated, cut_prompts, default_template,
                                 draw_demonstrations, label_scores)

from toolkit.tasks.glue import Glue

TRAIN = Dataset.from_dict({
    "text_a": [f"train sentence number {i} " + "word " * (i % 5) for i in range(12)],
    "label": [i % 2 for i in range(12)],
})
ROWS = [{"text_a": "short", "label": 0},
        {"text_a": "a much longer sentence that needs many more tokens than the first " * 3, "label": 1},
        {"text_a": "middle length text here", "label": 1}]


@torch.no_grad()
def reference_scores(model: torch.nn.Module, tok, queries, words, max_length: int) -> torch.Tensor:
    """One example, one label, no padding: log-probs read straight off the logits."""
    out = torch.zeros(len(queries), len(words))
    for i, (prompt, gap) in enumerate(queries):
        p = tok(prompt)["input_ids"]
        for j, word in enumerate(words):
            if model.config.is_encoder_decoder:
                c = tok(text_target=word)["input_ids"]
                logits = model(input_ids=torch.tensor([p[-max_length:]]), labels=torch.tensor([c])).logits[0]
                out[i, j] = sum(logits.log_softmax(-1)[t, c[t]] for t in range(len(c)))
            else:
                c = tok(gap + word, add_special_tokens=False)["input_ids"]
                ids = p[-(max_length - len(c)):] + c
                logp = model(input_ids=torch.tensor([ids])).logits[0].log_softmax(-1)
                n = len(ids) - len(c)
                out[i, j] = sum(logp[n - 1 + t, c[t]] for t in range(len(c)))
    return out


@pytest.mark.parametrize("family", ["gpt2", "t5", "bart"])
def test_batched_scores_equal_one_at_a_time_reference(tiny_checkpoint, family: str) -> None:
    head = "seq2seq-lm" if family in ("t5", "bart") else "causal-lm"
    model, tok = models.load(tiny_checkpoint(family), head, {})
    model.eval()
    words = ["no", "absolutely yes indeed"]  # label words of different token lengths
    prompter = Prompter("Review: {text_a}\nSentiment: {label}", words, ["text_a"],
                        draw_demonstrations(TRAIN, 2, seed=0))
    queries = [prompter.query(r) for r in ROWS] + [prompter.content_free()]
    for max_length in (1024, 40):  # 40: the long prompts are cut from the left
        fast = label_scores(model, tok, queries, words, max_length, batch_size=3)
        slow = reference_scores(model, tok, queries, words, max_length)
        assert fast.shape == (len(queries), 2)
        torch.testing.assert_close(fast, slow, atol=1e-5, rtol=0)


def test_calibration_divides_by_the_content_free_prior() -> None:
    # The model prefers label 0 everywhere; the content-free input shows that preference is prior.
    probs = torch.tensor([[0.90, 0.10], [0.80, 0.20], [0.95, 0.05], [0.60, 0.40]])
    prior = torch.tensor([0.85, 0.15])
    out = calibrated(probs.log(), prior.log())
    expected = probs / prior
    torch.testing.assert_close(out, expected / expected.sum(-1, keepdim=True))
    torch.testing.assert_close(out.sum(-1), torch.ones(4))
    assert probs.argmax(-1).tolist() == [0, 0, 0, 0]
    assert out.argmax(-1).tolist() == [0, 1, 0, 1]  # more label-1 evidence than the prior holds
    uniform = calibrated(probs.log(), torch.zeros(2))  # a flat prior changes nothing
    torch.testing.assert_close(uniform, probs)


def test_demonstrations_are_seeded_and_verbalized() -> None:
    task = Glue(subset="sst2")
    first, again = draw_demonstrations(TRAIN, 4, seed=1), draw_demonstrations(TRAIN, 4, seed=1)
    assert first == again and first != draw_demonstrations(TRAIN, 4, seed=2)
    prompter = ICL(shots=4).prompter(task, TRAIN, seed=1)
    prompt, gap = prompter.query({"text_a": "a test review", "label": 0})
    parts = prompt.split("\n\n")
    assert len(parts) == 5 and gap == " "
    for demo, text in zip(first, parts[:4]):
        assert demo["text_a"] in TRAIN["text_a"]
        assert text.startswith(f"Sentence: {demo['text_a']}\nQuestion: {task.instruction}")
        assert text.endswith(f"Answer: {task.verbalizers[demo['label']]}")
    assert parts[4] == default_template(task).format(text_a="a test review", label="").rstrip()
    assert ICL(shots=0).prompter(task, None, seed=1).query(ROWS[0])[0].startswith("Sentence: short")
    with pytest.raises(UserError, match="need a train split"):
        draw_demonstrations(None, 2, seed=0)


def test_evaluate_uses_calibrated_scores(tiny_checkpoint) -> None:
    """evaluate() = argmax of the batched scores, calibrated by the content-free prior."""
    from accelerate import Accelerator

    model, tok = models.load(tiny_checkpoint("gpt2"), "causal-lm", {})
    task = Glue(subset="sst2")
    evals = Dataset.from_dict({"text_a": [r["text_a"] for r in ROWS] * 3, "label": [0, 1, 1] * 3})
    setup = SimpleNamespace(task=task, tokenizer=tok, train=TRAIN, evals={"": evals}, seed=3)
    for calibrate in (False, True):
        method = ICL(shots=2, calibrate=calibrate)
        method.apply(model, None)
        got = method.evaluate(model, setup, Accelerator(cpu=True))
        prompter = method.prompter(task, TRAIN, seed=3)
        scores = label_scores(model, tok, [prompter.query(r) for r in evals], task.verbalizers, 1024, 8)
        if calibrate:
            prior = label_scores(model, tok, [prompter.content_free()], task.verbalizers, 1024, 8)[0]
            scores = calibrated(scores, prior)
        loss = got.pop("loss")
        assert got == task.compute_metrics(scores.argmax(-1).numpy(), evals["label"])
        logp = scores.log() if calibrate else scores.log_softmax(-1)  # over the label words
        gold = torch.tensor(evals["label"])
        assert loss == pytest.approx(float(-logp.gather(-1, gold.view(-1, 1)).mean()), rel=1e-5)
    assert count_params(model)[0] == 0


def test_cli_run_writes_untrained_metrics(tmp_path: Path, cli, runs_dir: Path) -> None:
    path = write_recipe(tmp_path / "recipes" / "icl.yaml", (
        "model: {checkpoint: gpt2}\n"
        "task: {name: glue, subset: rte, max_eval_samples: 8}\n"
        "method: {name: icl, shots: 2, calibrate: true}\n"))
    code, out, err = cli("run", path, "--smoke", "--runs-dir", runs_dir)
    assert code == 0, err
    (metrics_file,) = runs_dir.rglob("metrics.json")
    metrics = json.loads(metrics_file.read_text())
    assert 0.0 <= metrics["eval"]["accuracy"] <= 1.0
    assert metrics["trainable_params"] == 0 and metrics["total_params"] > 0
    assert metrics["method"] == "icl" and metrics["train_steps"] == 0


@pytest.mark.parametrize("checkpoint, subset, method, message", [
    ("bert-base-uncased", "sst2", "{name: icl}", "'bert' is encoder-only and cannot score a continuation"),
    ("gpt2", "stsb", "{name: icl}", "this task is a regression"),
    ("gpt2", "sst2", "{name: icl, shots: -1}", "method.shots: -1 is below the minimum 0"),
    ("t5-base", "sst2", "{name: icl, verbalizers: [good]}", "method.verbalizers: need 2 distinct"),
    ("gpt2", "rte", "{name: icl, template: 'Q: {text_c} A: {label}'}", "unknown field '{text_c}'"),
    ("gpt2", "rte", "{name: icl, template: 'Q: {text_a}'}", "needs '{label}' exactly once"),
    # the query is the template up to {label}: a field after it is never shown for the example
    ("gpt2", "rte", "{name: icl, template: 'P: {text_a} A: {label} H: {text_b}'}",
     "method.template: '{text_b}' comes after '{label}'"),
    ("t5-base", "sst2", "{name: icl, template: '{label}: {text_a}'}", "'{text_a}' comes after '{label}'"),
])
def test_validate_refuses_what_cannot_run(tmp_path: Path, cli, checkpoint: str, subset: str,
                                          method: str, message: str) -> None:
    path = write_recipe(tmp_path / "r.yaml", f"model: {{checkpoint: {checkpoint}}}\n"
                        f"task: {{name: glue, subset: {subset}}}\nmethod: {method}\n")
    code, out, err = cli("validate", path)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1


def test_own_data_with_the_wrong_number_of_verbalizers_is_one_line(tmp_path: Path, cli) -> None:
    data = tmp_path / "d.csv"
    data.write_text("text,label\ngreat,pos\nawful,neg\n")
    path = write_recipe(tmp_path / "r.yaml", "model: {checkpoint: gpt2}\n"
                        f"task: {{name: text_classification, eval_file: {data}, labels: [neg, pos], text_columns: [text]}}\n"
                        "method: {name: icl, verbalizers: [bad, good, fine]}\n")
    code, _, err = cli("validate", path)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "method.verbalizers: need 2 distinct non-empty words, one per label (neg, pos)" in err


def test_every_default_template_shows_the_example_before_its_label() -> None:
    """The rule above, over every GLUE task icl can run: the query (the template up to the label
    word) holds each of the task's text fields."""
    from toolkit.methods.icl import template_problem
    from toolkit.tasks.glue import SPECS

    for subset in SPECS:
        task = Glue(subset=subset)
        if task.is_regression:
            continue
        template = default_template(task)
        assert template_problem(template, task.text_columns) is None, subset
        row = {c: f"<{c}>" for c in task.text_columns}
        prompt, _ = Prompter(template, list(task.verbalizers), list(task.text_columns)).query(row)
        assert all(f"<{c}>" in prompt for c in task.text_columns), subset


@pytest.mark.parametrize("family", ["gpt2", "t5", "bart"])
def test_prompts_cut_to_fit_are_counted_and_said(tiny_checkpoint, family: str, capsys) -> None:
    """A k-shot prompt longer than the limit is cut from the left (its first demonstrations go):
    the count is exactly the prompts whose scores the cut changes, and evaluate says it in one line."""
    from accelerate import Accelerator

    seq2seq = family in ("t5", "bart")
    model, tok = models.load(tiny_checkpoint(family), "seq2seq-lm" if seq2seq else "causal-lm", {})
    model.eval()
    words = ["no", "absolutely yes indeed"]
    prompter = Prompter("Review: {text_a}\nSentiment: {label}", words, ["text_a"], draw_demonstrations(TRAIN, 2, 0))
    queries = [prompter.query(r) for r in ROWS]
    whole, cut = (label_scores(model, tok, queries, words, n, batch_size=1) for n in (1024, 50))  # no padding
    changed = sum(not torch.equal(a, b) for a, b in zip(whole, cut))
    assert 0 < cut_prompts(tok, queries, words, 50, seq2seq) == changed < len(queries)
    assert cut_prompts(tok, queries, words, 1024, seq2seq) == 0
    setup = SimpleNamespace(task=Glue(subset="sst2"), tokenizer=tok, train=TRAIN,
                            evals={"": Dataset.from_dict({"text_a": [r["text_a"] for r in ROWS], "label": [0, 1, 1]})}, seed=0)
    method = ICL(shots=2, max_length=40)
    method.evaluate(model, setup, Accelerator(cpu=True))
    expected = cut_prompts(tok, [method.prompter(setup.task, TRAIN, 0).query(r) for r in ROWS],
                           setup.task.verbalizers, 40, seq2seq)
    lines = [line for line in capsys.readouterr().err.splitlines() if "prompts cut" in line]
    assert lines == [f"warning: {expected} of 3 prompts cut from the left at 40 tokens (method.max_length or the "
                     "model's positions): their first demonstrations are not seen, so they are scored with fewer "
                     "than method.shots=2; lower method.shots to keep them whole"]


@pytest.mark.parametrize("shown", [0, 2])
def test_an_eval_example_among_the_demonstrations_is_said(tiny_checkpoint, shown: int, capsys) -> None:
    """An eval example that is one of the drawn demonstrations (own train and eval files that
    overlap) has its label in its own prompt: counted over every eval split, in one line."""
    from accelerate import Accelerator

    model, tok = models.load(tiny_checkpoint("gpt2"), "causal-lm", {})
    demos = draw_demonstrations(TRAIN, 2, seed=3)
    rows = ROWS + [{"text_a": d["text_a"], "label": d["label"]} for d in demos[:shown]]
    split = Dataset.from_dict({"text_a": [r["text_a"] for r in rows], "label": [r["label"] for r in rows]})
    setup = SimpleNamespace(task=Glue(subset="sst2"), tokenizer=tok, train=TRAIN, evals={"": split, "_2": split}, seed=3)
    ICL(shots=2).evaluate(model, setup, Accelerator(cpu=True))
    lines = [line for line in capsys.readouterr().err.splitlines() if "among the" in line]
    assert lines == ([f"warning: {2 * shown} of {2 * len(rows)} eval examples are among the 2 demonstrations (the "
                      "same text in train): each has its own label in its prompt, so it scores as seen; remove "
                      "them from the eval data, or draw other demonstrations (train.seed)"] if shown else [])
