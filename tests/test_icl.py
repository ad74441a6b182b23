"""In-context prompting: batched label scores equal a one-at-a-time reference, calibration divides
by the content-free prior, demonstrations are seeded, and a run writes an untrained metrics.json."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from datasets import Dataset
from transformers import AutoTokenizer

import toolkit
from conftest import shared_tokenizer, write_recipe
from toolkit import models
from toolkit.errors import UserError
from toolkit.methods import count_params
from toolkit.methods.icl import (CHOICE_RULES, ICL, Prompter, calibrated, cut_prompts, default_template,
                                 demonstration_sets, encode_pairs, fill, harness_picks, label_scores, per_rule, template_problem)

from toolkit.tasks.glue import Glue

TRAIN = Dataset.from_dict({
    "text_a": [f"train sentence number {i} " + "word " * (i % 5) for i in range(12)],
    "label": [i % 2 for i in range(12)],
})
ROWS = [{"text_a": "short", "label": 0},
        {"text_a": "a much longer sentence that needs many more tokens than the first " * 3, "label": 1},
        {"text_a": "middle length text here", "label": 1}]


FAMILIES = ["gpt2", "t5", "bart"]
TEMPLATE = "Review: {text_a}\nSentiment: {label}"


def _load(tiny_checkpoint, family: str):
    model, tok = models.load(tiny_checkpoint(family), "seq2seq-lm" if family in ("t5", "bart") else "causal-lm", {})
    return model.eval(), tok


@pytest.fixture(scope="module")
def padding_reader(tmp_path_factory, tiny_checkpoint) -> str:
    """A small random TrOCR decoder with GPT-2's tokenizer: a decoder whose forward takes no
    logits_to_keep (it returns every position) and counts positions from the left whatever the
    mask (no position_ids), so left padding moves its positions."""
    from transformers import AutoModelForCausalLM, TrOCRConfig

    folder = tmp_path_factory.mktemp("trocr")
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(TrOCRConfig(
        vocab_size=50257, d_model=32, decoder_layers=2, decoder_attention_heads=2, decoder_ffn_dim=64,
        max_position_embeddings=1100)).save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_checkpoint("gpt2")).save_pretrained(folder)
    return str(folder)


@pytest.fixture
def scorer(tiny_checkpoint, padding_reader):
    """family -> (model, tokenizer): the conftest's small models, and "trocr" (`padding_reader`)."""
    def get(family: str):
        if family != "trocr":
            return _load(tiny_checkpoint, family)
        model, tok = models.load(padding_reader, "causal-lm", {})
        return model.eval(), tok
    return get


SCORERS = [*FAMILIES, "trocr"]  # trocr: a decoder that reads its padding and keeps every position's logits


# --- lm-evaluation-harness's rules, written out here from its source (lm_eval/api/model.py
# loglikelihood and _encode_pair; lm_eval/models/huggingface.py tok_encode, _loglikelihood_tokens;
# lm_eval/api/task.py fewshot_context, construct_requests, process_results; lm_eval/api/samplers.py)
def harness_context(rows_shown: list[dict], row: dict, words: list[str]) -> str:
    """doc_to_text "Review: x\nSentiment:", target_delimiter " ", fewshot_delimiter "\n\n"."""
    shots = "".join(f"Review: {d['text_a']}\nSentiment: {words[d['label']]}\n\n" for d in rows_shown)
    return shots + f"Review: {row['text_a']}\nSentiment:"


def harness_encode(tok, context: str, continuation: str, seq2seq: bool) -> tuple[list[int], list[int]]:
    if context == "":
        cont = tok(continuation, add_special_tokens=False)["input_ids"]
        prefix = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
        return ([prefix], cont) if prefix != cont[0] else (cont[:1], cont[1:])
    n = len(context) - len(context.rstrip())
    if n:
        context, continuation = context[:-n], context[-n:] + continuation
    prefix = tok.decode([tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id])

    def tok_encode(text: str) -> list[int]:  # has_bos_prefix: a text opening with it gets no special tokens
        return tok(text, add_special_tokens=not text.startswith(prefix))["input_ids"]

    if seq2seq:
        return tok_encode(context), tok(continuation, add_special_tokens=False)["input_ids"]
    whole, ctx = tok_encode(context + continuation), tok_encode(context)
    return ctx, whole[len(ctx):]


@torch.no_grad()
def harness_loglikelihood(model, tok, context: str, continuation: str, max_length: int) -> float:
    """One request, no padding: the decoder's input is (ctx + cont)[-(max_length + 1):][:-1] and the
    last len(cont) logits score it; the encoder-decoder's is ctx[-max_length:], cont its labels."""
    seq2seq = model.config.is_encoder_decoder
    ctx, cont = harness_encode(tok, context, continuation, seq2seq)
    if seq2seq:
        logp = model(input_ids=torch.tensor([ctx[-max_length:]]), labels=torch.tensor([cont])).logits[0].log_softmax(-1)
        return float(sum(logp[t, cont[t]] for t in range(len(cont))))
    inp = (ctx + cont)[-(max_length + 1):][:-1]
    logp = model(input_ids=torch.tensor([inp])).logits[0].log_softmax(-1)[len(inp) - len(cont):]
    return float(sum(logp[t, cont[t]] for t in range(len(cont))))


def harness_accuracies(model, tok, train: Dataset, rows: list[dict], words: list[str], shots: int,
                       seed: int, max_length: int) -> dict[str, float]:
    """acc, acc_norm, acc_bytes: the default sampler (one Random(seed), rnd.sample(docs, shots) per
    eval doc in order), " " + choice as continuation, argmax of lls, lls / len(choice),
    lls / len(choice.encode())."""
    import random

    import numpy as np

    rnd, docs = random.Random(seed), list(train)
    hits = {"acc": [], "acc_norm": [], "acc_bytes": []}
    for row in rows:
        context = harness_context(rnd.sample(docs, shots), row, words)
        lls = np.array([harness_loglikelihood(model, tok, context, f" {w}", max_length) for w in words])
        for rule, by in (("acc", 1.0), ("acc_norm", np.array([len(w) for w in words], dtype=float)),
                         ("acc_bytes", np.array([len(w.encode()) for w in words], dtype=float))):
            hits[rule].append(float(np.argmax(lls / by) == row["label"]))
    return {rule: float(np.mean(h)) for rule, h in hits.items()}


@pytest.mark.parametrize("family", FAMILIES)
def test_scored_tokens_are_the_harness_ones(tiny_checkpoint, family: str) -> None:
    """Tokenizer level, the real tokenizers: the (context, continuation) ids of every query and
    label word equal the harness's. T5 and BART score the word alone: no EOS, no BOS, with the
    space before it (BART's ' positive' is another token than 'positive'); GPT-2 the tokens the
    whole text has beyond the prompt's. Gaps ' ', '\n', none; a prompt opening with the prefix
    token's text gets no special tokens added; an empty context is the prefix token."""
    from toolkit.methods.icl import encode_pairs

    # the real tokenizer of the family, as the method reads prompts with it (special-token strings
    # are the tokens, models.as_harness_reads), against the harness's plain transformers one
    tok = models.as_harness_reads(models.load_tokenizer(tiny_checkpoint(family)))
    harness = shared_tokenizer(tiny_checkpoint(family))
    seq2seq = family != "gpt2"
    words = ["positive", "absolutely yes indeed", "née"]
    opening = tok.decode([tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id])  # "<s>" ...
    for template in (TEMPLATE, "Review: {text_a}\nSentiment:\n{label}", "Review: {text_a} =>{label}",
                     opening + TEMPLATE, "{text_a} {label}"):
        prompter = Prompter(template, words, ["text_a"])
        demos = demonstration_sets(TRAIN, 2, 0, 1)[0]
        rows = [*ROWS, {"text_a": "", "label": 0}] if template.startswith("{") else ROWS
        queries = [prompter.query(r, demos if r["text_a"] else ()) for r in rows]
        if template.startswith("{"):  # and no context at all (a template "{text_a}{label}", text "")
            queries.append(("", ""))
        got = encode_pairs(tok, queries, words, seq2seq)
        want = [harness_encode(harness, prompt + gap, w, seq2seq) for prompt, gap in queries for w in words]
        prefix = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
        # a context of whitespace alone encodes to no token, where the harness stops (assert
        # len(context_enc) > 0); the toolkit conditions on the prefix token, as for an empty one
        want = [(ctx or [prefix], cont) for ctx, cont in want]
        assert got == want, template
    gaps = [gap for _, gap in queries for _ in words]
    for (_, cont), word, gap in zip(got, words * len(queries), gaps):
        if seq2seq:
            assert tok.eos_token_id not in cont and tok.bos_token_id not in cont
            assert cont == tok(gap + word, add_special_tokens=False)["input_ids"]
    if family == "bart":
        assert tok(" positive", add_special_tokens=False)["input_ids"] != tok("positive", add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("family", SCORERS)
def test_batched_scores_equal_the_harness_loglikelihood(scorer, family: str) -> None:
    """label_scores (batched, padded) = the harness's loglikelihood of each request computed one at
    a time, whole and cut from the left (max_length 40: the harness's window of max_length + 1).
    Finding (trocr): a forward without logits_to_keep returned every position and the first k
    were scored, at any batch size."""
    model, tok = scorer(family)
    words = ["no", "absolutely yes indeed"]  # label words of different token lengths
    demos = demonstration_sets(TRAIN, 2, 0, 1)[0]
    prompter = Prompter(TEMPLATE, words, ["text_a"])
    queries = [prompter.query(r, demos) for r in ROWS] + [prompter.content_free(demos)]
    contexts = [harness_context(demos, r, words) for r in ROWS] + [harness_context(demos, {"text_a": "N/A"}, words)]
    for max_length in (1024, 40):  # 40: the long prompts are cut from the left
        fast = label_scores(model, tok, queries, words, max_length, batch_size=3)
        slow = torch.tensor([[harness_loglikelihood(model, tok, c, f" {w}", max_length) for w in words] for c in contexts])
        assert fast.shape == (len(queries), 2)
        torch.testing.assert_close(fast, slow, atol=1e-5, rtol=0)


def _label_word_tasks() -> list:
    """Every task icl scores label words for: each GLUE subset that is no regression, and own
    data of one text and of a pair (label names as its verbalizers)."""
    from toolkit.tasks.glue import SPECS
    from toolkit.tasks.text_classification import TextClassification

    glue = [Glue(subset=s) for s in SPECS if SPECS[s].labels is not None]
    own = [TextClassification(train_file="t.csv", eval_file="e.csv", text_columns=cols, labels=["bad", "good"])
           for cols in (["text"], ["premise", "hypothesis"])]
    return [*glue, *own]


@pytest.mark.parametrize("family", SCORERS)
def test_padded_batches_score_every_task_as_one_at_a_time(scorer, family: str) -> None:
    """The rule over every label-word task and family: each example's label-word scores in a
    padded batch (prompts of other lengths beside it, 2 shots) are those it gets alone, and
    evaluate's metrics and loss do not move with method.batch_size (MNLI and own data). Finding (trocr): a model that reads its
    padding scored a prompt otherwise beside a longer one (0.15 nats), exit 0."""
    from accelerate import Accelerator

    model, tok = scorer(family)
    for task in _label_word_tasks():
        cols = list(task.text_columns)
        rows = [{**{c: f"{c} {i} " + "very " * (3 * i + j) + "long" for j, c in enumerate(cols)}, "label": i % 2}
                for i in range(4)]
        train = Dataset.from_list([{**{c: f"shot {i} " + "x " * i for c in cols}, "label": i % 2} for i in range(6)])
        method = ICL(shots=2, batch_size=5)
        prompter = method.prompter(task)
        queries = [prompter.query(r, d) for r, d in zip(rows, demonstration_sets(train, 2, 1, len(rows)))]
        batched = label_scores(model, tok, queries, prompter.verbalizers, 1024, batch_size=5)
        alone = label_scores(model, tok, queries, prompter.verbalizers, 1024, batch_size=1)
        torch.testing.assert_close(batched, alone, atol=1e-5, rtol=0, msg=lambda m: f"{task.name} {m}")
        if task.name == "glue" and task.subset != "mnli":  # evaluate: one text (own data), a pair, 3 labels
            continue
        setup = SimpleNamespace(task=task, tokenizer=tok, train=train, evals={"": Dataset.from_list(rows)}, seed=1)
        got = [ICL(shots=2, batch_size=n).evaluate(model, setup, Accelerator(cpu=True)) for n in (1, 5)]
        assert got[0] == pytest.approx(got[1], abs=1e-6), task.name


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


@pytest.mark.parametrize("choose_by", CHOICE_RULES)
def test_calibration_holds_label_words_far_apart(choose_by: str) -> None:
    """Finding: calibration divided probabilities, so label words ~100 nats apart (long words
    under acc) underflowed to 0: the gold label's loss was -log 0 = inf, a prior's 0/0 NaN, and
    the run stopped as "not finite ... the weights have diverged", exit 2, on a working model.
    In log space the pick and the loss are Zhao et al.'s, finite."""
    words = ["no", "ok"]  # the same length: every rule divides both alike
    scores = torch.tensor([[0.0, -240.0], [0.0, -20.0]])
    prior = torch.tensor([[0.0, 0.0], [0.0, -240.0]])
    rows = ICL(calibrate=True, choose_by=choose_by)._choices(scores, prior, words, torch.tensor([1, 0]))
    scale = {"acc": 1.0, "acc_norm": 2.0, "acc_bytes": 2.0}[choose_by]
    assert [r[0] for r in rows] == [0, 1]  # the second: 220 nats more for "ok" than its prior says
    assert [r[1] for r in rows] == pytest.approx([240.0 / scale, 220.0 / scale], rel=1e-5)


def test_demonstrations_are_seeded_and_verbalized() -> None:
    """Each eval example its own draw, as the harness's sampler: the sets of one split follow one
    Random(seed) in order (the harness's rnd.sample(docs, k) per doc), and a seed repeats them."""
    import random

    task = Glue(subset="sst2")
    first, again = demonstration_sets(TRAIN, 4, 1, 5), demonstration_sets(TRAIN, 4, 1, 5)
    assert first == again and first != demonstration_sets(TRAIN, 4, 2, 5)
    rnd = random.Random(1)
    assert first == [rnd.sample(list(TRAIN), 4) for _ in range(5)]
    assert len({tuple(d["text_a"] for d in demos) for demos in first}) > 1  # not one set for all
    prompter = ICL(shots=4).prompter(task)
    prompt, gap = prompter.query({"text_a": "a test review", "label": 0}, first[0])
    parts = prompt.split("\n\n")
    assert len(parts) == 5 and gap == " "
    for demo, text in zip(first[0], parts[:4]):
        assert text.startswith(f"Sentence: {demo['text_a']}\nQuestion: {task.instruction}")
        assert text.endswith(f"Answer: {task.verbalizers[demo['label']]}")
    assert parts[4] == default_template(task).format(text_a="a test review", label="").rstrip()
    assert prompter.query(ROWS[0])[0].startswith("Sentence: short")
    assert demonstration_sets(None, 0, 1, 3) == [[], [], []]
    for shots, message in ((2, "need a train split"), (13, "13 is more than the 12 train examples")):
        with pytest.raises(UserError, match=message):
            demonstration_sets(None if shots == 2 else TRAIN, shots, 0, 3)


def _evals(rows: list[dict]) -> Dataset:
    return Dataset.from_dict({"text_a": [r["text_a"] for r in rows], "label": [r["label"] for r in rows]})


def _queries(method: ICL, task, evals: Dataset, seed: int) -> tuple[list, list]:
    prompter = method.prompter(task)
    demos = demonstration_sets(TRAIN, method.shots, seed, len(evals))
    return [prompter.query(r, d) for r, d in zip(evals, demos)], [prompter.content_free(d) for d in demos]


def test_evaluate_uses_calibrated_scores(tiny_checkpoint) -> None:
    """evaluate() = argmax of the batched scores, calibrated by each example's content-free prior
    (its own demonstrations, then "N/A")."""
    from accelerate import Accelerator

    model, tok = _load(tiny_checkpoint, "gpt2")
    task = Glue(subset="sst2")
    evals = Dataset.from_dict({"text_a": [r["text_a"] for r in ROWS] * 3, "label": [0, 1, 1] * 3})
    setup = SimpleNamespace(task=task, tokenizer=tok, train=TRAIN, evals={"": evals}, seed=3)
    for calibrate in (False, True):
        method = ICL(shots=2, calibrate=calibrate)
        method.apply(model, None)
        got = method.evaluate(model, setup, Accelerator(cpu=True))
        queries, free = _queries(method, task, evals, 3)
        scores = label_scores(model, tok, queries, task.verbalizers, 1024, 8)
        if calibrate:
            prior = label_scores(model, tok, free, task.verbalizers, 1024, 8)  # (n, L): one per example
            assert not torch.allclose(prior[0], prior[1])  # other demonstrations, another prior
            scores = calibrated(scores, prior)
        loss = got.pop("loss")
        harness = {rule: got.pop(rule) for rule in ("acc", "acc_norm", "acc_bytes")}
        assert got == task.compute_metrics(scores.argmax(-1).numpy(), evals["label"])
        if not calibrate:  # the default rule is the harness's acc: the summed log-probability
            assert harness["acc"] == got["accuracy"]
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
    assert {"acc", "acc_norm", "acc_bytes"} <= set(metrics["eval"])  # the harness's, beside
    assert metrics["metric_declarations"]["acc_norm"] == {"higher_is_better": True, "scale": 100.0}
    assert metrics["trainable_params"] == 0 and metrics["total_params"] > 0
    assert metrics["method"] == "icl" and metrics["train_steps"] == 0
    # no training rate (it was 0.0, which a report's runs table showed as the slowest run's samples/s)
    assert metrics["train_samples_per_second"] is None
    # its evaluation is timed: it said 0.0 s and 0.0 examples/s (the slowest run in a report)
    assert metrics["eval_runtime_s"] > 0
    assert metrics["eval_samples_per_second"] == pytest.approx(8 / metrics["eval_runtime_s"])
    code, out, err = cli("report", runs_dir, "--no-plots")
    row = next(line for line in out.splitlines() if line.startswith("| icl"))
    assert code == 0 and row.split(" | ")[-2] == "–", out  # samples/s (then peak MB)
    # predict: one line that says why (it read "predict handles trained runs of the tasks glue, ...
    # (this is glue with icl)": glue among them) and what scores other data, CLI and API alike
    run = metrics_file.parent
    (tmp_path / "new.jsonl").write_text('{"sentence1": "a", "sentence2": "b"}\n')
    code, out, err = cli("predict", run, "--input", tmp_path / "new.jsonl")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "method icl trains nothing" in err and f"toolkit eval {run} task.KEY=VALUE" in err
    with pytest.raises(UserError, match="method icl trains nothing") as caught:
        toolkit.predict(run, [("a", "b")])
    assert str(caught.value) in err


@pytest.mark.parametrize("checkpoint, subset, method, message", [
    ("bert-base-uncased", "sst2", "{name: icl}", "'bert' is encoder-only and cannot score a continuation"),
    ("gpt2", "stsb", "{name: icl}", "this task is a regression"),
    ("gpt2", "sst2", "{name: icl, shots: -1}", "method.shots: -1 is below the minimum 0"),
    ("t5-base", "sst2", "{name: icl, verbalizers: [good]}", "method.verbalizers: need 2 distinct"),
    # a blank word shows no label; words that differ by the whitespace around them are one word
    # (the model's preference between spaces picked the label, exit 0)
    ("gpt2", "sst2", "{name: icl, verbalizers: [' ', good]}", "got [' ', 'good'] (' ' shows nothing)"),
    ("facebook/bart-base", "sst2", "{name: icl, verbalizers: [bad, \"\\u200b\"]}", "shows nothing)"),
    ("gpt2", "rte", "{name: icl, verbalizers: ['yes ', 'yes  ']}",
     "('yes  ' is 'yes ' but for the whitespace around it)"),
    ("t5-base", "mnli", "{name: icl, verbalizers: [yes, maybe, \"yes\\t\"]}",
     "('yes\\t' is 'yes' but for the whitespace around it)"),
    ("gpt2", "rte", "{name: icl, template: 'Q: {text_c} A: {label}'}", "unknown field '{text_c}'"),
    ("gpt2", "rte", "{name: icl, template: 'Q: {text_a}'}", "needs '{label}' exactly once"),
    # the query is the template up to {label}: a field after it is never shown for the example
    ("gpt2", "rte", "{name: icl, template: 'P: {text_a} A: {label} H: {text_b}'}",
     "method.template: '{text_b}' comes after '{label}'"),
    ("t5-base", "sst2", "{name: icl, template: '{label}: {text_a}'}", "'{text_a}' comes after '{label}'"),
    ("gpt2", "sst2", "{name: icl, choose_by: acc_nrom}", "did you mean 'acc_norm'"),
    ("gpt2", "sst2", "{name: icl, template: 'S: {text_a:{width}} A: {label}'}",
     "method.template: '{text_a:{width}}' has a field inside its format spec"),
    # every text of a pair task is shown (an SST-2 template on RTE labelled from the premise alone)
    ("gpt2", "rte", "{name: icl, template: 'Sentence: {text_a} Answer: {label}'}",
     "method.template: does not show '{text_b}', a text of every example of this task"),
    ("t5-base", "mnli", "{name: icl, template: 'H: {text_b} Answer: {label}'}", "does not show '{text_a}'"),
])
def test_validate_refuses_what_cannot_run(tmp_path: Path, cli, checkpoint: str, subset: str,
                                          method: str, message: str) -> None:
    path = write_recipe(tmp_path / "r.yaml", f"model: {{checkpoint: {checkpoint}}}\n"
                        f"task: {{name: glue, subset: {subset}}}\nmethod: {method}\n")
    code, out, err = cli("validate", path)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1


GENERATING = ["{name: squad, version: v1}", "{name: summarization, subset: samsum}",
              "{name: translation, subset: multi30k}"]


@pytest.mark.parametrize("task, method, message", [
    # a text-to-text task generates its answers: a rule for comparing label words would be ignored
    ("{name: squad, version: v1}", "{name: icl, choose_by: acc_norm}",
     "method.choose_by: acc_norm compares label words, and this task generates its answers"),
    # a decoder's prompt is cut to max_length less the tokens it generates: none would be left
    ("{name: squad, version: v1}", "{name: icl, max_length: 32}",
     "method.max_length: 32 tokens leave no room for a prompt before the 32"),
    # settings only label words use were ignored by a task that generates (a run of something
    # else than asked, exit 0): refused for every text-to-text task
    *[(task, method, message) for task in GENERATING for method, message in (
        ("{name: icl, template: 'Q: {source} A: {label}'}", "method.template: this task generates its answers"),
        ("{name: icl, verbalizers: [yes, no]}", "method.verbalizers: this task generates its answers"),
        ("{name: icl, calibrate: true}", "method.calibrate: calibration divides label-word probabilities"))],
])
def test_what_a_generation_task_cannot_do_is_refused_in_one_line(tmp_path: Path, cli, task: str, method: str,
                                                                   message: str) -> None:
    path = write_recipe(tmp_path / "r.yaml", "model: {checkpoint: gpt2}\n"
                        f"task: {task}\nmethod: {method}\n")
    code, _, err = cli("validate", path)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert message in err


@pytest.mark.parametrize("checkpoint", ["gpt2", "t5-base", "facebook/bart-base"])
def test_icl_on_extractive_qa_is_refused_in_one_line(tmp_path: Path, cli, checkpoint: str) -> None:
    """Finding: `task.mode: extractive` SQuAD under icl passed validate, loaded the LM and stopped
    at evaluation with an AttributeError traceback (the task read start/end logits off an LM's
    output). icl writes answers; a span head's task is refused at validate and at run."""
    path = write_recipe(tmp_path / "r.yaml", f"model: {{checkpoint: {checkpoint}}}\n"
                        "task: {name: squad, version: v1, mode: extractive, max_eval_samples: 4}\n"
                        "method: {name: icl}\n")
    for command in (("validate", path), ("run", path, "--smoke", "--runs-dir", tmp_path / "runs")):
        code, _, err = cli(*command)
        (line,) = [line for line in err.splitlines() if "error:" in line]
        assert code == 2 and "question-answering head" in line and "task.mode: generative" in line, err
    assert not (tmp_path / "runs").exists()


def test_harness_rules_worked_by_hand() -> None:
    """lm-evaluation-harness's multiple-choice accuracies: acc is the argmax of the summed
    log-probabilities, acc_norm of the sums per character of the choice, acc_bytes per UTF-8
    byte. 'no' (2 chars) at -3.0 beats 'absolutely' (10 chars) at -5.0 by the sum; per character
    -1.5 against -0.5, the long word wins; 'née' is 3 characters but 4 bytes."""
    words = ["no", "absolutely", "née"]
    scores = torch.tensor([[-3.0, -5.0, -4.0],    # acc: no; acc_norm: absolutely (-0.5); bytes: absolutely
                           [-3.0, -20.0, -1.6],   # acc: née; acc_norm: née (-0.53 vs -1.5); bytes: née (-0.4)
                           [-1.0, -20.0, -1.65]])  # acc: no; acc_norm: no (-0.5 vs -0.55); bytes: née (-0.41)
    torch.testing.assert_close(per_rule(scores, words, "acc_norm")[0], torch.tensor([-1.5, -0.5, -4.0 / 3]))
    torch.testing.assert_close(per_rule(scores, words, "acc_bytes")[0], torch.tensor([-1.5, -0.5, -1.0]))
    assert CHOICE_RULES == ("acc", "acc_norm", "acc_bytes")
    assert harness_picks(scores, words).tolist() == [[0, 1, 1], [2, 2, 2], [0, 0, 2]]


@pytest.mark.parametrize("family", FAMILIES)
def test_the_chosen_rule_makes_the_task_metrics_and_every_rule_is_recorded(tiny_checkpoint, family: str) -> None:
    """Every family x choose_by, with and without calibration: acc, acc_norm and acc_bytes in
    metrics are the harness's, computed here request by request by its rules (its sampler, its
    encoding, its window at max_length 48, which cuts the long prompts); the task's metrics and
    loss are made of the chosen rule's scores (calibrated by the same rule's per-example
    content-free prior when asked)."""
    from accelerate import Accelerator

    model, tok = _load(tiny_checkpoint, family)
    task = Glue(subset="sst2")
    words = ["no", "absolutely yes indeed"]
    rows = [{"text_a": r["text_a"], "label": g} for r, g in zip(ROWS * 2, [0, 1, 1, 1, 0, 0])]
    evals = _evals(rows)
    setup = SimpleNamespace(task=task, tokenizer=tok, train=TRAIN, evals={"": evals}, seed=3)
    base = ICL(shots=2, verbalizers=words, template=TEMPLATE, max_length=48)
    want = harness_accuracies(model, tok, TRAIN, rows, words, shots=2, seed=3, max_length=48)
    queries, free = _queries(base, task, evals, 3)
    raw, prior = (label_scores(model, tok, q, words, 48, 8) for q in (queries, free))
    gold = torch.tensor(evals["label"])
    for choose_by in CHOICE_RULES:
        for calibrate in (False, True):
            method = ICL(shots=2, verbalizers=words, template=TEMPLATE, max_length=48, choose_by=choose_by,
                         calibrate=calibrate)
            got = method.evaluate(method.apply(model, None), setup, Accelerator(cpu=True))
            assert {rule: got[rule] for rule in CHOICE_RULES} == pytest.approx(want)
            chosen = per_rule(raw, words, choose_by)
            logp = (calibrated(chosen, per_rule(prior, words, choose_by)).log() if calibrate
                    else chosen.log_softmax(-1))
            assert got["accuracy"] == pytest.approx(float((logp.argmax(-1) == gold).float().mean()))
            assert got["loss"] == pytest.approx(float(-logp.gather(-1, gold.view(-1, 1)).mean()), rel=1e-5)
            if not calibrate:
                assert got["accuracy"] == got[choose_by]


@pytest.mark.parametrize("family", FAMILIES)
def test_the_space_before_a_word_is_the_delimiter_wherever_it_is_written(tiny_checkpoint, family: str) -> None:
    """`Sentiment: {label}` with [no, absolutely] and `Sentiment:{label}` with [' no', ' absolutely']
    are the same prompts and tokens: every rule's picks and the chosen rule's loss are the same, and
    the harness's (its choices without their target delimiter: len('no') = 2). The space written
    in the verbalizer was counted as a character of the word (acc_norm / acc_bytes otherwise)."""
    from accelerate import Accelerator

    model, tok = _load(tiny_checkpoint, family)
    task, words = Glue(subset="sst2"), ["no", "absolutely"]
    rows = [{"text_a": r["text_a"], "label": g} for r, g in zip(ROWS * 2, [0, 1, 1, 1, 0, 0])]
    setup = SimpleNamespace(task=task, tokenizer=tok, train=TRAIN, evals={"": _evals(rows)}, seed=3)
    want = harness_accuracies(model, tok, TRAIN, rows, words, shots=2, seed=3, max_length=1024)
    for choose_by in ("acc_norm", "acc_bytes"):
        got = [ICL(shots=2, verbalizers=spelled, template=template, choose_by=choose_by).evaluate(
                   model, setup, Accelerator(cpu=True))
               for spelled, template in ((words, TEMPLATE), ([" " + w for w in words], TEMPLATE.replace(": {label}", ":{label}")))]
        assert got[1] == pytest.approx(got[0], rel=1e-6)
        assert {rule: got[1][rule] for rule in CHOICE_RULES} == pytest.approx(want)


@pytest.mark.parametrize("verbalizers, said", [("[bad, good, fine]", ""), ("[bad, ' bad']", "but for the whitespace"),
                                               ("[' ', good]", "shows nothing")])
def test_own_data_with_the_wrong_number_of_verbalizers_is_one_line(tmp_path: Path, cli, verbalizers: str,
                                                                   said: str) -> None:
    data = tmp_path / "d.csv"
    data.write_text("text,label\ngreat,pos\nawful,neg\n")
    path = write_recipe(tmp_path / "r.yaml", "model: {checkpoint: gpt2}\n"
                        f"task: {{name: text_classification, eval_file: {data}, labels: [neg, pos], text_columns: [text]}}\n"
                        f"method: {{name: icl, verbalizers: {verbalizers}}}\n")
    code, _, err = cli("validate", path)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "method.verbalizers: need 2 distinct non-empty words, one per label (neg, pos)" in err and said in err


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
    prompter = Prompter(TEMPLATE, words, ["text_a"])
    queries = [prompter.query(r, demonstration_sets(TRAIN, 2, 0, 1)[0]) for r in ROWS]
    whole, cut = (label_scores(model, tok, queries, words, n, batch_size=1) for n in (1024, 50))  # no padding
    changed = sum(not torch.equal(a, b) for a, b in zip(whole, cut))
    assert 0 < cut_prompts(tok, queries, words, 50, seq2seq) == changed < len(queries)
    assert cut_prompts(tok, queries, words, 1024, seq2seq) == 0
    setup = SimpleNamespace(task=Glue(subset="sst2"), tokenizer=tok, train=TRAIN,
                            evals={"": Dataset.from_dict({"text_a": [r["text_a"] for r in ROWS], "label": [0, 1, 1]})}, seed=0)
    method = ICL(shots=2, max_length=40)
    method.evaluate(model, setup, Accelerator(cpu=True))
    queries = _queries(method, setup.task, setup.evals[""], 0)[0]
    expected = cut_prompts(tok, queries, setup.task.verbalizers, 40, seq2seq)
    prompter, sets = method.prompter(setup.task), demonstration_sets(TRAIN, 2, 0, 3)
    lost = own = 0
    for row, demos, query in zip(setup.evals[""], sets, queries):
        pairs = encode_pairs(tok, [query], setup.task.verbalizers, seq2seq)
        kept = min(len(c) - max(len(c) - 40 if seq2seq else len(c) + len(w) - 41, 0) for c, w in pairs)
        gone = lost_by_reencoding(tok, prompter.parts(row, demos), prompter.separator, kept)
        lost, own = lost + min(gone, 2), own + (gone > 2)
    assert expected > 0 and own == 1  # ROWS[1] is longer than 40 tokens by itself
    lines = [line for line in capsys.readouterr().err.splitlines() if "prompts cut" in line]
    assert lines == [f"warning: {expected} of 3 prompts cut from the left at 40 tokens (method.max_length or the "
                     f"model's positions): {lost} of their {expected * 2} demonstrations not seen whole (scored with "
                     "fewer than method.shots=2; lower method.shots to keep them); 1 example longer than that by "
                     "itself, its start not seen (shorten the template or the texts, or raise method.max_length)"]


def lost_by_reencoding(tok, parts: list[str], separator: str, kept: int) -> int:
    """The parts (demonstrations, then the example) of a prompt cut to its last `kept` tokens that
    are not seen whole, found without token offsets: the first part seen whole is the first whose
    text from there on encodes within `kept` tokens (the tokenizer's special tokens included)."""
    return next(j for j in range(len(parts) + 1)
                if j == len(parts) or len(tok(separator.join(parts[j:]))["input_ids"]) <= kept)


@pytest.mark.parametrize("shown, relabelled", [(0, False), (2, False), (2, True)])
def test_an_eval_example_among_its_demonstrations_is_left_out_or_said(tiny_checkpoint, shown: int, relabelled: bool,
                                                                      capsys) -> None:
    """An eval example that is a train row (own train and eval files that overlap) is dropped from
    its own drawn demonstrations, as the harness's sampler drops `x == doc` whatever split they
    come from (it was kept, its label in its own prompt): scored with one fewer, said in one line
    over every eval split. Its text with another label is no such row: kept, and said as seen. A
    train row among other examples' demonstrations only is neither."""
    import random

    from accelerate import Accelerator

    model, tok = _load(tiny_checkpoint, "gpt2")
    n = len(ROWS) + shown + 1
    sets = demonstration_sets(TRAIN, 2, 3, n)  # the draws depend on the count alone, not the rows
    others = next(r for r in TRAIN if r["text_a"] not in {d["text_a"] for d in sets[-1]})
    copies = [dict(sets[len(ROWS) + j][0]) for j in range(shown)]
    rows = ROWS + [{**c, "label": 1 - c["label"]} if relabelled else c for c in copies] + [others]
    split = _evals(rows)
    got = demonstration_sets(TRAIN, 2, 3, n, examples=split)
    rnd = random.Random(3)
    assert got == [[x for x in rnd.sample(list(TRAIN), 2) if x != doc][:2] for doc in rows]  # the harness's
    assert [len(d) for d in got] == [2] * len(ROWS) + [2 if relabelled else 1] * shown + [2]
    setup = SimpleNamespace(task=Glue(subset="sst2"), tokenizer=tok, train=TRAIN, evals={"": split, "_2": split}, seed=3)
    ICL(shots=2).evaluate(model, setup, Accelerator(cpu=True))
    err = capsys.readouterr().err.splitlines()
    assert [line for line in err if "eval examples are train examples too" in line] == (
        [f"warning: {2 * shown} of {2 * n} eval examples are train examples too (every field the same) and were "
         "drawn among their own 2 demonstrations: each is left out of them, as lm-evaluation-harness leaves it "
         "out, so it is scored with fewer than method.shots=2"] if shown and not relabelled else [])
    assert [line for line in err if "scores as seen" in line] == (
        [f"warning: {2 * shown} of {2 * n} eval examples are among their own 2 demonstrations (the "
         "same text in train, with another label or other fields): each has its text's label in its prompt, so "
         "it scores as seen; remove them from the eval data, or draw other demonstrations (train.seed)"]
        if relabelled else [])


@pytest.mark.parametrize("name", ["summarization", "squad"])
def test_a_text_to_text_example_that_is_a_train_row_is_left_out_of_its_demonstrations(tiny_checkpoint, name: str,
                                                                                       capsys) -> None:
    """The same rule for generated answers, the eval split another split than train: an eval row
    equal to a train row is dropped from its own drawn demonstrations (the harness's `x != doc`),
    and said; the others keep `shots`."""
    from accelerate import Accelerator

    from toolkit.tasks import TASKS
    from toolkit.tasks._generation import Generation

    model, tok = _load(tiny_checkpoint, "gpt2")
    extra = {"subset": "custom", "eval_file": "x.json"} if name == "summarization" else {"mode": "generative"}
    task = TASKS.get(name)(max_target_length=8, generation=Generation(max_new_tokens=2), **extra)
    train = Dataset.from_list(_text_rows(name, 6, 0))
    rows = Dataset.from_list([dict(d[0]) for d in demonstration_sets(train, 2, 7, 3)])  # each its own first draw
    setup = SimpleNamespace(task=task, tokenizer=tok, train=train, seed=7, raw_evals={"": rows}, predictions={})
    ICL(shots=2, max_length=128).evaluate(model, setup, Accelerator(cpu=True))
    pairs = [(task.source_text(r), task.target_text(r)) for r in rows]
    assert all(pair not in demos and len(demos) == 1 for pair, demos in zip(pairs, task.in_context.demonstrations))
    err = capsys.readouterr().err
    assert "warning: 3 of 3 eval examples are train examples too" in err and "scores as seen" not in err


@pytest.mark.parametrize("family", FAMILIES)
def test_a_label_word_that_cannot_be_scored_is_one_line(tiny_checkpoint, family: str) -> None:
    """Where the harness stops on an assertion (a continuation longer than max_length, or one with
    no token of its own), one line names the word and the setting to change."""
    model, tok = _load(tiny_checkpoint, family)
    long_word = "absolutely yes indeed and many more words after it"
    with pytest.raises(UserError, match=f"^method.max_length: 8 tokens cannot hold the label word '{long_word}' "):
        label_scores(model, tok, [("Review: fine\nSentiment:", " ")], ["no", long_word], 8, batch_size=2)
    if family == "gpt2":  # 'ye' + 's' is the one token 'yes': nothing of the word is left to score
        with pytest.raises(UserError, match="^method.template: the label word 's' joins the token before it"):
            label_scores(model, tok, [("Answer: ye", "")], ["s", "t"], 64, batch_size=2)


# --- text-to-text tasks: lm-evaluation-harness's generate_until (lm_eval/api/task.py
# fewshot_context; lm_eval/models/huggingface.py generate_until, tok_batch_encode, _model_generate;
# lm_eval/models/utils.py postprocess_generated_text), written out one request at a time
def _generating_tasks() -> list[str]:
    from toolkit.tasks import TASKS
    from toolkit.tasks._generation import TextToText

    return [n for n in TASKS.names() if issubclass(TASKS.get(n), TextToText)]


def _text_rows(name: str, n: int, start: int) -> list[dict]:
    words = [f"item {i} is " + "very " * (i % 4 + 2) + "red" for i in range(start, start + n)]
    if name == "squad":
        return [{"id": str(i), "title": "t", "question": f"what is item {i}?", "context": w,
                 "answers": {"text": ["red"], "answer_start": [len(w) - 3]}} for i, w in enumerate(words)]
    return [{"source": w, "target": w.split()[-1]} for w in words]


def harness_generation(model, tok, task, rows: list[dict], train: list[dict], shots: int, seed: int,
                       limit: int, budget: int) -> tuple[list[list[int]], list[str], list[int], int]:
    """Per row the harness's context ids and its answer: one Random(seed) per split, a fresh
    rnd.sample(train, shots) per row, less the row itself where drawn (`x != doc`); the context is the
    demonstrations (doc_to_text, " ", target), "\\n\\n" between, then doc_to_text; encoded with
    the tokenizer's special tokens and cut from the left to limit - max_gen_toks (decoder) or
    limit (encoder-decoder); greedy generation; the text decoded without special tokens and cut
    at the first "\\n\\n" (the until a task without one gets: its fewshot delimiter). Also: how
    many contexts were cut (with the demonstrations they lost, the rows cut themselves and the
    demonstrations they had), and how many rows were left out of their own demonstrations."""
    import random

    seq2seq = model.config.is_encoder_decoder
    prefix, suffix = task.affixes()
    text = lambda r: f"{prefix}{task.source_text(r)}{suffix}"  # noqa: E731  doc_to_text
    rnd, contexts, answers, cut, seen = random.Random(seed), [], [], [0, 0, 0, 0], 0
    for row in rows:
        demos = [x for x in rnd.sample(train, shots) if x != row][:shots]  # the example itself dropped
        seen += len(demos) < shots
        parts = [f"{text(d)} {task.target_text(d)}" for d in demos] + [text(row)]
        whole = tok("\n\n".join(parts))["input_ids"]
        ids = whole[-(limit if seq2seq else limit - budget):]
        gone = lost_by_reencoding(tok, parts, "\n\n", len(ids)) if len(ids) < len(whole) else 0
        cut = [cut[0] + (len(ids) < len(whole)), cut[1] + min(gone, len(demos)), cut[2] + (gone > len(demos)),
               cut[3] + (len(ids) < len(whole)) * len(demos)]
        out = model.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=budget, do_sample=False, pad_token_id=tok.pad_token_id)
        cont = out[0] if seq2seq else out[0, len(ids):]
        contexts.append(ids)
        answers.append(tok.decode(cont, skip_special_tokens=True).split("\n\n")[0].strip())
    return contexts, answers, cut, seen


@pytest.mark.parametrize("name, family", [(n, f) for n in ("squad", "summarization", "translation")
                                          for f in FAMILIES])
def test_text_to_text_prompts_and_answers_are_the_harness_generate_until(tiny_checkpoint, name: str,
                                                                         family: str, capsys) -> None:
    """Every generating task x family: each eval example gets its own demonstrations (the
    label-word path's draw), the prompt is encoded, cut and generated from as the harness's
    generate_until, and the answer ends before the first separator; the prompts cut to fit are
    counted in one line. Finding: one draw served every example, a decoder's prompt had no BOS
    rule, T5/BART put "\\n" before a demonstration's target, and answers ran on into the next
    made-up demonstration (never cut at "\\n\\n")."""
    from accelerate import Accelerator

    from toolkit.tasks import TASKS
    from toolkit.tasks._generation import Generation

    assert set(_generating_tasks()) == {"squad", "summarization", "translation"}  # a new one joins here
    model, tok = _load(tiny_checkpoint, family)
    extra = {"squad": {"mode": "generative"}}.get(name, {"subset": "custom", "eval_file": "x.json"})
    task = TASKS.get(name)(max_target_length=8, generation=Generation(max_new_tokens=6), **extra)
    train = _text_rows(name, 6, 0)
    rows = _text_rows(name, 2, 10) + train[:2]  # two train rows: among their own draws here, left out
    predictions: dict = {}
    setup = SimpleNamespace(task=task, tokenizer=tok, train=Dataset.from_list(train), seed=5,
                            raw_evals={"": Dataset.from_list(rows)}, predictions=predictions)
    method = ICL(shots=3, max_length=32, batch_size=1)  # one row a batch: no padding
    got = method.evaluate(model, setup, Accelerator(cpu=True))
    assert "loss" in got
    contexts, answers, cut, seen = harness_generation(model, tok, task, rows, train, 3, 5, 32, 6)
    encoded = task.encode(Dataset.from_list(rows), tok)  # the last split's demonstrations, as encoded
    key = "input_ids" if model.config.is_encoder_decoder else "prompt_ids"
    assert [encoded[[e["example_index"] for e in encoded].index(i)][key] for i in range(4)] == contexts
    assert [p["prediction"] for p in predictions[""]] == answers
    if family != "t5":  # T5 writes no newline: "\n\n" never comes out of it
        from toolkit.tasks._generation import decode_texts, stop_at

        ids = tok(["yes\n\nQuestion: more", "no stop here"], add_special_tokens=False, padding=True,
                  return_tensors="pt")["input_ids"]
        assert decode_texts(tok, ids, ["\n\n"]) == ["yes", "no stop here"]
        assert stop_at(tok, ["\n\n"], 0)[0](ids, None).tolist() == [True, False]
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    said = [f"{cut[1]} of their {cut[3]} demonstrations not seen whole (scored with fewer than method.shots=3; "
            "lower method.shots to keep them)"] * bool(cut[1])
    said += [f"{cut[2]} example{'s' * (cut[2] > 1)} longer than that by {'themselves' if cut[2] > 1 else 'itself'}, "
             "its start not seen (shorten the template or the texts, or raise method.max_length)"] * bool(cut[2])
    assert cut[1] > 0 and seen == 2 and lines == [
        f"warning: {cut[0]} of 4 prompts cut from the left at 32 tokens (method.max_length or the model's "
        "positions): " + "; ".join(said),
        "warning: 2 of 4 eval examples are train examples too (every field the same) and were drawn among their "
        "own 3 demonstrations: each is left out of them, as lm-evaluation-harness leaves it out, so it is scored "
        "with fewer than method.shots=3"] + [
        # T5 reads "\n\n" as a space: its answers cannot stop at the separator, which is said
        "warning: method.separator '\\n\\n' does not survive this tokenizer (it reads 'a\\n\\nb' back as 'a b'): "
        "the demonstrations run together and no answer can stop at it, so each is written to "
        "generation.max_new_tokens (what follows its answer scored with it); use a separator the tokenizer keeps"
    ] * (family == "t5")


@pytest.mark.parametrize("family", SCORERS)
def test_text_to_text_answers_do_not_move_with_the_batch_size(scorer, family: str) -> None:
    """The batching rule for generation, over every generating task: each example's answer and
    the split's scores and loss are the same at batch_size 1 and 4 (prompts of other lengths
    padded beside it). Finding (trocr): a decoder that reads its left padding wrote other answers
    beside a longer prompt (chrF 5.4 -> 4.9), exit 0."""
    from accelerate import Accelerator

    from toolkit.tasks import TASKS
    from toolkit.tasks._generation import Generation

    model, tok = scorer(family)
    for name in _generating_tasks():
        extra = {"squad": {"mode": "generative"}}.get(name, {"subset": "custom", "eval_file": "x.json"})
        train, rows = _text_rows(name, 6, 0), _text_rows(name, 5, 10)
        got = []
        for size in (1, 4):
            task = TASKS.get(name)(max_target_length=8, generation=Generation(max_new_tokens=6), **extra)
            predictions: dict = {}
            setup = SimpleNamespace(task=task, tokenizer=tok, train=Dataset.from_list(train), seed=5,
                                    raw_evals={"": Dataset.from_list(rows)}, predictions=predictions)
            scores = ICL(shots=2, max_length=64, batch_size=size).evaluate(model, setup, Accelerator(cpu=True))
            got.append((scores, [p["prediction"] for p in predictions[""]]))
        assert got[0][1] == got[1][1], name
        assert got[0][0] == pytest.approx(got[1][0], abs=1e-5), name


# --- a user error leaves no half-made run folder ------------------------------------------------
def _runs_left(runs_dir: Path) -> list[str]:
    return sorted(str(p.relative_to(runs_dir)) for p in runs_dir.rglob("*")) if runs_dir.exists() else []


@pytest.mark.parametrize("entry, method, message", [
    # GPT-2's 'ye' + 's' is the one token 'yes': nothing of the word is left to score
    ("cli", "{name: icl, template: '{text_a} ye{label}', verbalizers: [s, t]}",
     "method.template: the label word 's' joins the token before it"),
    ("api", "{name: icl, max_length: 8, verbalizers: [no, absolutely yes indeed and many more words after it]}",
     "method.max_length: 8 tokens cannot hold the label word 'absolutely yes indeed"),
])
def test_a_label_word_that_cannot_be_scored_stops_the_run_before_its_folder(tmp_path: Path, cli, monkeypatch,
                                                                           method: str, message: str,
                                                                           entry: str) -> None:
    """Finding: the label-word check ran at evaluation, after the run folder was made: exit 2 with
    one line, and a folder holding only recipe.yaml and identity.json was left. It is now checked
    while the run is built (the tokenizer and the model's limit are needed, so not at validate):
    the evaluation never starts."""
    from toolkit import api

    monkeypatch.setattr(ICL, "evaluate", lambda *a, **k: pytest.fail("the run reached its evaluation"))

    path = write_recipe(tmp_path / "r.yaml", "model: {checkpoint: gpt2}\n"
                        f"task: {{name: glue, subset: sst2, max_eval_samples: 8}}\nmethod: {method}\n")
    runs_dir = tmp_path / "runs"
    if entry == "cli":
        code, _, err = cli("run", path, "--smoke", "--runs-dir", runs_dir)
        assert code == 2 and len(err.strip().splitlines()) == 1 and message in err
    else:
        with pytest.raises(UserError, match=message.replace("(", r"\(")):
            api.run(path, runs_dir=runs_dir, smoke=True)
    assert _runs_left(runs_dir) == []


@pytest.mark.parametrize("entry", ["cli", "api", "chained"])
def test_a_user_error_before_the_first_checkpoint_leaves_no_run_folder(tmp_path: Path, cli, monkeypatch,
                                                                       entry: str) -> None:
    """The rule for every user error raised after a run has made its folder and before its first
    checkpoint (here one at evaluation): the folder goes, so no half-made run is left to be
    mistaken for one; one made by an earlier launch is kept. Also for the run a --smoke run
    chained to another runs first (its upstream)."""
    from toolkit import api

    def refuse(*args, **kwargs):
        raise UserError("method: refused at evaluation")

    monkeypatch.setattr(ICL, "evaluate", refuse)
    path = write_recipe(tmp_path / "r.yaml", "model: {checkpoint: gpt2}\n"
                        "task: {name: glue, subset: sst2, max_eval_samples: 8}\nmethod: {name: icl}\n")
    runs_dir = tmp_path / "runs"
    if entry == "chained":  # the upstream is run first, and refused at its evaluation (an icl
        # upstream saves no model to start from: refused at validate, before any folder)
        from toolkit import evaluation

        monkeypatch.setattr(evaluation, "evaluate", refuse)
        up = write_recipe(tmp_path / "up.yaml", "model: {checkpoint: gpt2}\n"
                          "task: {name: glue, subset: sst2, max_eval_samples: 8}\nmethod: {name: full}\n")
        path = write_recipe(tmp_path / "down.yaml", f"model: {{checkpoint: {{run: {up}}}}}\n"
                            "task: {name: glue, subset: sst2}\nmethod: {name: full}\n")
    for existed in (False, True) if entry == "cli" else (False,):
        if existed:
            (runs_dir / "keep").mkdir(parents=True)
        if entry != "api":
            code, _, err = cli("run", path, "--smoke", "--runs-dir", runs_dir)
            said = [line for line in err.splitlines() if "error:" in line or "Traceback" in line]
            assert code == 2 and said == ["error: method: refused at evaluation"], err  # (a trained upstream's bar before it)
        else:
            with pytest.raises(UserError, match="^method: refused at evaluation$"):
                api.run(path, runs_dir=runs_dir, smoke=True)
        assert _runs_left(runs_dir) == (["keep"] if existed else [])


@pytest.mark.parametrize("columns", [["text"], ["premise", "hypothesis"], ["review.text"], ["0", "q[1]"],
                                     ["review: text"], ["wow!", "a!r:b"]])
def test_own_data_without_a_template_gets_one_that_asks_no_question(tmp_path: Path, cli, columns: list[str]) -> None:
    """A user's own classification data has no instruction (none is known for it): icl without
    a `template` crashed at validate (AttributeError on the missing instruction), a traceback
    from validate, run and the API. The default template then shows the example and the answer,
    with no question line; it holds every text field before the label word. A field is its
    column by its whole name (finding: "review.text" was read as attribute `text` of `review`,
    "0" as a positional argument: a KeyError/IndexError traceback from `run`; "review: text" as
    field `review` with format spec " text", "wow!" as a conversion: refused at validate as
    "method.template: unknown field '{review}'", a template the user never wrote, and no template
    could name the column)."""
    import toolkit
    from toolkit.tasks.text_classification import TextClassification

    data = tmp_path / "d.csv"
    data.write_text(",".join([*columns, "label"]) + "\n" + "".join(",".join([f"{c} {i}" for c in columns] + [("neg", "pos")[i % 2]]) + "\n" for i in range(4)))
    path = write_recipe(tmp_path / "r.yaml", "model: {checkpoint: gpt2}\n"
                        f"task: {{name: text_classification, eval_file: {data}, labels: [neg, pos], "
                        f"text_columns: [{', '.join(map(json.dumps, columns))}]}}\nmethod: {{name: icl, verbalizers: [bad, good]}}\n")
    code, out, err = cli("validate", path)
    assert code == 0 and "1 of 1 recipes valid" in out, err
    assert toolkit.recipe.load(path).method.name == "icl"
    task = TextClassification(eval_file=str(data), labels=["neg", "pos"], text_columns=columns)
    template = default_template(task)
    assert "Question" not in template and template_problem(template, columns) is None
    prompt, _ = Prompter(template, ["bad", "good"], columns).query({c: f"<{c}>" for c in columns})
    assert all(f"<{c}>" in prompt for c in columns) and prompt.endswith("Answer:"), prompt
    written = "Says: {" + columns[-1] + "} / " + " ".join("{" + c + "}" for c in columns) + " {label}"
    assert template_problem(written, columns) is None  # a template of the user's names them too
    assert fill(written, {**{c: f"<{c}>" for c in columns}, "label": "good"}).endswith(f"<{columns[-1]}> good")
    if columns in (["review.text"], ["review: text"]):  # the run itself
        path.write_text(path.read_text().replace("eval_file:", f"train_file: {data}, eval_file:")
                        .replace("name: icl,", "name: icl, shots: 1,"))
        code, _, err = cli("run", path, "--smoke", "--runs-dir", tmp_path / "runs")
        assert code == 0, err


def test_own_data_with_its_labels_unset_is_not_called_a_regression(tmp_path: Path, cli) -> None:
    """Own data whose labels are read from the file (task.labels unset) was refused as "a
    regression (STS-B)": its label names are not known at validate, and their absence read as a
    regression. It is asked for what icl needs; a problem: regression task is named as one."""
    data = tmp_path / "d.csv"
    data.write_text("text,label\ngreat,pos\nawful,neg\n")
    for task, said in (("text_columns: [text]", "icl pairs method.verbalizers with task.labels in order"),
                       ("text_columns: [text], problem: regression", "a regression (task.problem: regression)")):
        path = write_recipe(tmp_path / "r.yaml", "model: {checkpoint: gpt2}\n"
                            f"task: {{name: text_classification, eval_file: {data}, {task}}}\n"
                            "method: {name: icl, verbalizers: [bad, good]}\n")
        code, _, err = cli("validate", path)
        assert code == 2 and said in err and "STS-B" not in err and len(err.strip().splitlines()) == 1, err


def test_a_template_holding_the_prefix_token_reads_it_as_the_harness_does(tiny_checkpoint) -> None:
    """The method reads its prompts as lm-evaluation-harness does (models.as_harness_reads): a
    template opening with "<|endoftext|>" puts GPT-2's EOS before every demonstration and the
    example, while the toolkit's own tokenizer elsewhere reads such strings as text."""
    from accelerate import Accelerator

    model, tok = _load(tiny_checkpoint, "gpt2")
    task = Glue(subset="sst2")
    evals = Dataset.from_dict({"text_a": [r["text_a"] for r in ROWS] * 2, "label": [0, 1, 1] * 2})
    setup = SimpleNamespace(task=task, tokenizer=tok, train=TRAIN, evals={"": evals}, seed=3)
    method = ICL(shots=2, template=tok.eos_token + TEMPLATE)
    method.apply(model, None)
    got = method.evaluate(model, setup, Accelerator(cpu=True))
    queries, _ = _queries(method, task, evals, 3)
    harness = models.as_harness_reads(tok)
    assert all(ctx.count(tok.eos_token_id) == 3 for ctx, _ in encode_pairs(harness, queries, task.verbalizers, False))
    scores = label_scores(model, harness, queries, task.verbalizers, 1024, 8)
    assert got["accuracy"] == task.compute_metrics(scores.argmax(-1).numpy(), evals["label"])["accuracy"]
    assert got["loss"] == pytest.approx(float(-scores.log_softmax(-1).gather(-1, torch.tensor(evals["label"]).view(-1, 1)).mean()), rel=1e-5)


# --- scoring the train split: each example left out of its own demonstrations --------------------
def test_the_train_split_scored_draws_its_demonstrations_without_the_example() -> None:
    """When the split scored is the one the demonstrations come from, the harness's sampler draws
    shots + 1 and drops the example itself (`x != doc`), keeping the first `shots` (lm_eval/api/
    samplers.py get_context). Written out here; and the bound counts the example left out."""
    import random

    rows = list(TRAIN)
    got = demonstration_sets(TRAIN, 3, 7, len(rows), scored=TRAIN)
    rnd = random.Random(7)
    assert got == [[x for x in rnd.sample(rows, 4) if x != doc][:3] for doc in rows]
    assert all(len(d) == 3 and doc not in d for doc, d in zip(rows, got))
    assert any(doc in d for doc, d in zip(rows, demonstration_sets(TRAIN, 3, 7, len(rows))))  # another split: kept
    with pytest.raises(UserError, match="method.shots: 12 is more than the 12 train examples less the example scored"):
        demonstration_sets(TRAIN, 12, 0, 3, scored=TRAIN)


@pytest.mark.parametrize("entry", ["cli", "api"])
def test_evaluate_on_the_train_split_leaves_each_example_out_of_its_prompt(tmp_path: Path, cli, capsys,
                                                                           entry: str) -> None:
    """Finding: `toolkit eval RUN --split train` of an icl run drew each example's demonstrations
    from the split it scored, the example among them (its label in its own prompt: half of the 6
    rows here, said only in a warning), exit 0. Scored as the harness scores its fewshot split:
    each example left out of its own draw."""
    import toolkit

    path = write_recipe(tmp_path / "r.yaml", "model: {checkpoint: gpt2}\n"
                        "task: {name: glue, subset: sst2, max_train_samples: 6, max_eval_samples: 2}\n"
                        "method: {name: icl, shots: 3, verbalizers: [bad, good]}\n")
    code, _, err = cli("run", path, "--smoke", "--runs-dir", tmp_path / "runs")
    assert code == 0, err
    (metrics,) = (tmp_path / "runs").rglob("metrics.json")
    if entry == "cli":
        code, _, err = cli("eval", metrics.parent, "--split", "train")
        assert code == 0, err
    else:
        toolkit.evaluate(metrics.parent, split="train")
        err = capsys.readouterr().err
    assert "among their own" not in err
    assert json.loads((metrics.parent / "eval-train.json").read_text())["examples"] == {"": 6}


@pytest.mark.parametrize("family", FAMILIES)
def test_a_text_to_text_train_split_scored_leaves_each_example_out(tiny_checkpoint, family: str, capsys) -> None:
    """The same rule for generated answers: no example of the scored train split among its own
    demonstrations (each has its answer in its prompt otherwise)."""
    from accelerate import Accelerator

    from toolkit.tasks import TASKS
    from toolkit.tasks._generation import Generation

    model, tok = _load(tiny_checkpoint, family)
    task = TASKS.get("summarization")(max_target_length=8, generation=Generation(max_new_tokens=2),
                                      subset="custom", eval_file="x.json")
    train = Dataset.from_list(_text_rows("summarization", 6, 0))
    setup = SimpleNamespace(task=task, tokenizer=tok, train=train, seed=7, raw_evals={"": train},
                            predictions={}, scores_train=True)
    assert any(row in d for row, d in zip(train, demonstration_sets(train, 3, 7, 6)))  # drawn as for another split
    ICL(shots=3, max_length=128).evaluate(model, setup, Accelerator(cpu=True))
    assert all((row["source"], row["target"]) not in demos for row, demos in zip(train, task.in_context.demonstrations))
    assert all(len(demos) == 3 for demos in task.in_context.demonstrations)
    assert "among their own" not in capsys.readouterr().err


@pytest.mark.parametrize("template", ["Say {{label}}: {text_a}\nAnswer: {label}", "{{{text_a}}} {{x}} -> {label} {{y}}",
                                      "Review: {text_a:.40}\nSentiment: {label}"])
def test_a_template_is_cut_at_its_label_field_not_at_the_text_label(tiny_checkpoint, template: str) -> None:
    """Finding: the example's prompt was the template up to the first text "{label}", which an
    escaped "{{label}}" before the field also holds: a "Single '{'" ValueError traceback while the
    run was built. The prompt is now the template parsed up to its field; braces in the data stay
    text; the demonstrations are the template filled whole."""
    from accelerate import Accelerator

    task = Glue(subset="sst2")
    method = ICL(shots=1, template=template)
    assert method.incompatible("gpt2", task) is None
    row = {"text_a": "a {text_a} {label} {0} } {", "label": 1}
    prompt, gap = method.prompter(task).query(row, [TRAIN[0]])
    whole = template.format(text_a=row["text_a"], label="\0")
    assert prompt == template.format(text_a=TRAIN[0]["text_a"], label="negative") + "\n\n" + whole.split("\0")[0].rstrip()
    assert gap == " "
    model, tok = _load(tiny_checkpoint, "gpt2")
    evals = _evals([row, ROWS[0]])
    setup = SimpleNamespace(task=task, tokenizer=tok, train=TRAIN, evals={"": evals}, seed=3)
    assert 0.0 <= method.evaluate(model, setup, Accelerator(cpu=True))["accuracy"] <= 1.0
    head, _, tail = template.rpartition("{label}")  # the field, not the escaped text
    assert "needs '{label}' exactly once" in ICL(template=head + "{label!r}" + tail).incompatible("gpt2", task)


@pytest.mark.parametrize("family", FAMILIES)
def test_label_words_the_tokenizer_cannot_tell_apart_are_one_line(tiny_checkpoint, family: str) -> None:
    """Finding: T5 reads every character it does not know as one <unk> and drops trailing spaces,
    so label words '正面'/'负面' (or 'positive'/'positive ') were the same tokens: tied scores, the
    first label picked for every example (accuracy = that label's share), exit 0. Words that are
    the same tokens after a prompt are one line; byte-level tokenizers (GPT-2, BART) tell any two
    strings apart and score them."""
    model, tok = _load(tiny_checkpoint, family)
    query = [("Review: fine\nSentiment:", " ")]
    for words in (["正面", "负面"], ["positive", "positive "]):
        if family == "t5":
            with pytest.raises(UserError, match=f"^method.verbalizers: '{words[0]}' and '{words[1]}' are the same "
                                                "tokens to this tokenizer") as caught:
                label_scores(model, tok, query, ["other", *words], 64, batch_size=2)
            assert "\n" not in str(caught.value)
        else:
            scores = label_scores(model, tok, query, words, 64, batch_size=2)
            assert scores[0, 0] != scores[0, 1]


def test_a_run_whose_label_words_are_the_same_tokens_stops_before_its_folder(tmp_path: Path, cli) -> None:
    """The same line from `toolkit run`, said while the run is built (no run folder left)."""
    path = write_recipe(tmp_path / "r.yaml", "model: {checkpoint: t5-base}\n"
                        "task: {name: glue, subset: sst2, max_eval_samples: 4}\n"
                        "method: {name: icl, verbalizers: [负面, 正面]}\n")
    code, _, err = cli("run", path, "--smoke", "--runs-dir", tmp_path / "runs")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "method.verbalizers: '负面' and '正面' are the same tokens" in err
    assert _runs_left(tmp_path / "runs") == []


def _encoders_with_a_causal_class() -> list[str]:
    """Families transformers has both a masked-LM and a CausalLM class for, encoder-decoders
    aside: BERT-style encoders whose CausalLM class attends both ways unless configured (and XLM
    and Reformer, encoders to models.kind_of as to the clm task)."""
    from toolkit import hf_tables

    both = set(hf_tables.model_table("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES")) & set(
        hf_tables.model_table("MODEL_FOR_MASKED_LM_MAPPING_NAMES"))
    return sorted(both - set(hf_tables.model_table("MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES")))


@pytest.mark.parametrize("family", _encoders_with_a_causal_class())
def test_every_encoder_family_is_refused_as_the_clm_task_refuses_it(family: str) -> None:
    """Finding: icl kept its own list of encoder-only families, which missed RemBERT, BigBird,
    RoFormer, ERNIE, Megatron-BERT, XLM-R XL, ...: their MLM checkpoints were loaded as CausalLM
    (attending both ways) and scored label words, exit 0, and on a text-to-text task were refused
    as reading "a seq2seq-lm head (a span of the context)". icl now reads a family's kind as the
    rest of the toolkit does (models.kind_of), for label-word and text-to-text tasks alike."""
    from toolkit.tasks import TASKS

    assert {"bert", "roberta", "rembert", "big_bird"} <= set(_encoders_with_a_causal_class())
    for task in (Glue(subset="sst2"), TASKS.get("summarization")()):
        said = ICL().incompatible(family, task)
        assert said is not None and said.startswith(f"'{family}' is encoder-only"), said
    for family, head in (("gpt2", "causal-lm"), ("llama", "causal-lm"), ("t5", "seq2seq-lm"), ("bart", "seq2seq-lm")):
        assert ICL().incompatible(family, Glue(subset="sst2")) is None and ICL().head(None, family) == head


def test_own_data_template_leaving_out_a_text_is_one_line(tmp_path: Path, cli) -> None:
    """The every-text rule for a user's own pair data, as for GLUE's pairs."""
    data = tmp_path / "d.csv"
    data.write_text("premise,hypothesis,label\na,b,yes\nc,d,no\n")
    path = write_recipe(tmp_path / "r.yaml", "model: {checkpoint: gpt2}\n"
                        f"task: {{name: text_classification, eval_file: {data}, labels: [no, yes], "
                        "text_columns: [premise, hypothesis]}\n"
                        "method: {name: icl, template: 'P: {premise} A: {label}'}\n")
    code, _, err = cli("validate", path)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "method.template: does not show '{hypothesis}', a text of every example of this task" in err


@pytest.mark.parametrize("family", FAMILIES)
def test_what_encoding_a_text_to_text_split_finds_is_said(tiny_checkpoint, family: str, capsys) -> None:
    """Finding: icl encodes a text-to-text task's eval splits at evaluation, after the run said
    its notices: references longer than generation.max_new_tokens (outputs stop short of them:
    lower scores) or cut at task.max_target_length were never said, exit 0 (a trained run says
    both). They are said once the splits are encoded."""
    from accelerate import Accelerator

    from toolkit.tasks import TASKS
    from toolkit.tasks._generation import Generation

    model, tok = _load(tiny_checkpoint, family)
    # budget 1: a 3-token T5 or BART target cut at max_target_length holds 2 tokens `generate` writes
    # (T5's text, BART's <s> and text) before its EOS, which 2 would hold whole
    task = TASKS.get("summarization")(max_target_length=3, generation=Generation(max_new_tokens=1),
                                      subset="custom", eval_file="x.json")
    rows = [{"source": f"item {i} is red", "target": "a long summary of many words " * 2} for i in range(3)]
    setup = SimpleNamespace(task=task, tokenizer=tok, train=Dataset.from_list(rows), seed=1,
                            raw_evals={"": Dataset.from_list(rows)}, predictions={})
    ICL(shots=1, max_length=128).evaluate(model, setup, Accelerator(cpu=True))
    err = capsys.readouterr().err
    assert "warning: 3 of 3 summaries are longer than generation.max_new_tokens=1 tokens" in err
    assert "warning: 3 of 3 summaries cut at task.max_target_length=3 tokens" in err


@pytest.mark.parametrize("task", ["{name: glue, subset: sst2}", "{name: summarization, subset: samsum}"])
def test_a_warm_started_encoder_decoder_is_not_scored_untrained(tmp_path: Path, cli, task: str) -> None:
    """Finding: icl on `model.warm_start: encoder-decoder` (BERT as both halves, the decoder's
    cross-attention new and random) passed validate and scored that untrained model, exit 0.
    Refused at validate, from the CLI and the API, for label-word and text-to-text tasks."""
    import toolkit

    path = write_recipe(tmp_path / "r.yaml", "model: {checkpoint: bert-base-uncased, warm_start: encoder-decoder}\n"
                        f"task: {task}\nmethod: {{name: icl}}\n")
    code, _, err = cli("validate", path)
    said = "model.warm_start: encoder-decoder joins copies of the encoder by new, untrained cross-attention"
    assert code == 2 and len(err.strip().splitlines()) == 1 and said in err, err
    with pytest.raises(UserError, match=said):
        toolkit.run(path, runs_dir=tmp_path / "runs")
    assert _runs_left(tmp_path / "runs") == []


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", ["label words", "text-to-text"])
def test_a_max_length_past_the_models_positions_is_one_line(tiny_checkpoint, family: str, kind: str) -> None:
    """Finding: method.max_length above the model's position table let prompts that long into the
    model: an IndexError traceback (a device-side assert on a GPU), label words and generation
    alike. One line now, at evaluation (`toolkit eval`) as while the run is built; T5's relative
    positions have no table and take it."""
    from accelerate import Accelerator

    from toolkit.tasks import TASKS
    from toolkit.tasks._generation import Generation

    model, tok = _load(tiny_checkpoint, family)
    if kind == "label words":
        setup = SimpleNamespace(task=Glue(subset="sst2"), tokenizer=tok, train=TRAIN, evals={"": _evals(ROWS)}, seed=0)
    else:
        task = TASKS.get("summarization")(max_target_length=4, generation=Generation(max_new_tokens=2),
                                          subset="custom", eval_file="x.json")
        rows = _text_rows("summarization", 3, 0)
        setup = SimpleNamespace(task=task, tokenizer=tok, train=Dataset.from_list(rows), seed=1,
                                raw_evals={"": Dataset.from_list(rows)}, predictions={})
    method = ICL(shots=1, max_length=4096)
    if family == "t5":
        assert "loss" in method.evaluate(model, setup, Accelerator(cpu=True))
        return
    with pytest.raises(UserError, match="^method.max_length: 4096 is more than the 1024 positions this "
                                        f"{model.config.model_type} model has; use at most 1024"):
        method.evaluate(model, setup, Accelerator(cpu=True))


def test_a_run_with_a_max_length_past_the_positions_stops_before_its_folder(tmp_path: Path, cli) -> None:
    path = write_recipe(tmp_path / "r.yaml", "model: {checkpoint: gpt2}\n"
                        "task: {name: glue, subset: sst2, max_eval_samples: 4}\nmethod: {name: icl, max_length: 4096}\n")
    code, _, err = cli("run", path, "--smoke", "--runs-dir", tmp_path / "runs")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "method.max_length: 4096 is more than" in err, err
    assert _runs_left(tmp_path / "runs") == []


@pytest.mark.parametrize("name", ["gpt2", "t5", "bart-base", "roberta-base", "bert-base-uncased", "legacy-sp"])
def test_a_decoders_label_word_is_scored_after_a_prompt_without_its_end_of_text(name: str) -> None:
    """Finding: a decoder's context was encoded with every special token the tokenizer adds, and
    one that ends each text with its EOS (T5's </s>, BART's and RoBERTa's </s>, BERT's [SEP],
    Llama's add_eos_token) ended the context with it; the label word's continuation (the tokens
    of the whole text past the context's count) then lost its first token and scored the EOS in
    its place (exit 0). The context keeps what the tokenizer puts before a text (its BOS) and the
    continuation is the word's own tokens after it, as the whole text has them."""
    from test_generation import _text_tokenizer

    from toolkit.methods.icl import encode_pairs
    from toolkit.tasks._lm import leading_special

    tok = models.as_harness_reads(_text_tokenizer(name))
    words = ["positive", "absolutely yes indeed"]
    prompter = Prompter(TEMPLATE, words, ["text_a"])
    queries = [prompter.query(r, demonstration_sets(TRAIN, 2, 0, 1)[0]) for r in ROWS]
    got = encode_pairs(tok, queries, words, seq2seq=False)
    for (ctx, cont), (prompt, gap), word in zip(got, [q for q in queries for _ in words], words * len(queries)):
        whole = leading_special(tok) + tok(prompt + gap + word, add_special_tokens=False)["input_ids"]
        assert ctx + cont == whole and ctx == whole[:len(ctx)], (name, tok.convert_ids_to_tokens(cont))
        assert tok.decode(cont).strip() == (word.lower() if "uncased" in name else word)


@pytest.mark.parametrize("name", ["gpt2", "t5", "bart-base", "roberta-base", "legacy-sp"])
def test_a_decoders_cut_prompt_counts_the_demonstrations_it_lost(name: str) -> None:
    """A decoder's prompt is encoded without what the tokenizer puts after a text (its EOS), so it
    is as long as neither encoding `parts_lost` counted offsets in: with BART's or RoBERTa's
    tokenizer (<s> first, </s> last) it counted without the <s>, each cut one token further on:
    a cut of the <s> alone lost the first demonstration. Counted now on the tokens as encoded."""
    from test_generation import _text_tokenizer

    from toolkit.methods.icl import _encode

    tok = models.as_harness_reads(_text_tokenizer(name))
    parts = ["Review: good film Sentiment: positive", "Review: bad film Sentiment: negative", "Review: fine"]
    ids = _encode(tok, ["\n\n".join(parts)], decoder=True)[0]
    bos = int(tok.bos_token_id is not None and ids[0] == tok.bos_token_id)
    assert models.parts_lost(tok, parts, "\n\n", bos, len(ids)) == 0  # the <s> alone: no text cut
    assert models.parts_lost(tok, parts, "\n\n", bos + 1, len(ids)) == 1  # the first word: its part lost


@pytest.mark.parametrize("task, shots, rows", [
    ("{name: glue, subset: sst2}", 0, 32), ("{name: glue, subset: sst2}", 4, 32),
    ("{name: glue, subset: sst2}", 40, 41), ("{name: glue, subset: sst2, max_train_samples: 36}", 40, 36),
    ("{name: glue, subset: mnli}", 64, 65), ("{name: squad, version: v1}", 40, 41),
    ("{name: summarization, subset: samsum}", 33, 34)])
def test_smoke_keeps_the_train_examples_the_demonstrations_need(tmp_path: Path, task: str, shots: int,
                                                                rows: int) -> None:
    """--smoke caps the train split at 32 examples, and at least shots + 1 under icl (the
    demonstrations, and the example left out where `eval --split train` scores the train split):
    a 40-shot recipe was refused under --smoke as "more than the 32 train examples". Where the
    recipe reads fewer itself, its own cap holds (the full run refuses it too)."""
    from toolkit import recipe

    path = write_recipe(tmp_path / "recipes" / "icl.yaml", (
        f"model: {{checkpoint: gpt2}}\ntask: {task}\nmethod: {{name: icl, shots: {shots}}}\n"))
    assert recipe.plan(path, smoke=True).recipe.task.max_train_samples == rows


def test_a_smoke_run_with_more_shots_than_its_usual_train_cap_runs(tmp_path: Path, cli, runs_dir: Path) -> None:
    """The smoke-sized run itself (run, then eval of its train split): both refused before."""
    path = write_recipe(tmp_path / "recipes" / "icl.yaml", (
        "model: {checkpoint: gpt2}\ntask: {name: glue, subset: rte, max_eval_samples: 2}\n"
        "method: {name: icl, shots: 32, max_length: 64}\n"))
    code, out, err = cli("run", path, "--smoke", "--runs-dir", runs_dir)
    assert code == 0, err
    (run,) = (p.parent for p in runs_dir.rglob("metrics.json"))
    code, out, err = cli("eval", run, "--split", "train", "task.max_eval_samples=2")
    assert code == 0, err


def test_an_own_data_run_scoring_its_train_file_leaves_each_example_out(tmp_path: Path, cli, runs_dir: Path) -> None:
    """The CLI run and `toolkit eval` of own data whose eval file is its train file: every example
    is a train row, left out of its own drawn demonstrations and said (it was kept, its own label
    in its prompt, exit 0)."""
    data = tmp_path / "d.csv"
    data.write_text("text,label\n" + "".join(f"review number {i},{('neg', 'pos')[i % 2]}\n" for i in range(6)))
    path = write_recipe(tmp_path / "r.yaml", "model: {checkpoint: gpt2}\n"
                        f"task: {{name: text_classification, train_file: {data}, eval_file: {data}, "
                        "labels: [neg, pos], text_columns: [text]}\nmethod: {name: icl, shots: 4, verbalizers: [bad, good]}\n")
    code, out, err = cli("run", path, "--smoke", "--runs-dir", runs_dir)
    assert code == 0, err
    left_out = [line for line in err.splitlines() if "eval examples are train examples too" in line]
    assert len(left_out) == 1 and left_out[0].startswith("warning: ") and "scores as seen" not in err
    (run,) = (p.parent for p in runs_dir.rglob("metrics.json"))
    code, out, err = cli("eval", run)
    assert code == 0 and left_out == [line for line in err.splitlines() if "train examples too" in line], err
