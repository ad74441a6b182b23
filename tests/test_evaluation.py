"""The evaluation loop: a score is the same whatever the eval batch size (so whatever padding a
batch adds and whichever examples share it), for every kind of task. Every registered attention
module is held to the same at module level (tests/test_attention.py,
test_module_on_family, on all five families): a whole run per module would cost minutes."""

from __future__ import annotations

import functools

import pytest
from test_resume_rules import RESUMES

# one shipped recipe per kind of evaluation step: pooled classification on a decoder (GPT-2 reads
# the last real token), tags per sub-token, extractive QA windows, generation by a decoder
# (left-padded prompts), perplexity over sliding windows
RECIPES = ["glue/stsb/gpt2-full", "ner/conll2003/minilm-full", "squad/v1.1/minilm-full",
           "squad/v1.1/gpt2-full", "demo/own-data/gpt2-clm"]


@pytest.mark.parametrize("name", RECIPES)
def test_scores_do_not_depend_on_the_eval_batch_size(name: str, conll_sample, squad_sample) -> None:
    """Finding: extractive QA's eval loss moved with the batch size (4.50, 4.56, 4.75 at 1, 3 and
    7 on the same model): the span softmax ran over the padding the batch added."""
    from accelerate import Accelerator

    from toolkit import evaluation, recipe as recipes
    from toolkit.batching import eval_loaders
    from toolkit.setup import build

    overrides = ["task.max_eval_samples=5"] + (["task.generation.max_new_tokens=4"] if name == "squad/v1.1/gpt2-full" else [])
    if name.startswith("ner/"):  # CoNLL-2003's first sentences, not its whole train file
        overrides += [f"task.train_file={conll_sample[0]}", f"task.eval_file={conll_sample[1]}"]
    if name.startswith("squad/"):  # the dev file's first articles, split by article as the recipe splits it
        overrides += [f"task.eval_file={squad_sample}"]
    plan = recipes.plan(f"recipes/{name}.yaml", overrides, smoke=True)
    setup = build(plan)
    scores = []
    for size in (1, 2, 5):
        plan.recipe.train.eval_batch_size = size
        loaders, orders = eval_loaders(plan.recipe, setup)
        scores.append(evaluation.evaluate(setup.model, loaders, setup.task, Accelerator(cpu=True),
                                          setup.raw_evals, orders=orders))
    assert "loss" in scores[0] and len(scores[0]) > 1
    assert scores[1] == pytest.approx(scores[0], rel=1e-5, nan_ok=True)
    assert scores[2] == pytest.approx(scores[0], rel=1e-5, nan_ok=True)


def _distinct(model) -> None:
    """Weight matrices redrawn at a larger scale (seeded): a smoke model's small random weights
    write one text for every input, which no padding could change."""
    import torch

    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            if param.ndim >= 2:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.3)


# BART (learnt positions), T5 (relative ones), GPT-2 (a decoder: the task pads its prompts itself)
SIDES = ["summarization/samsum/bart-base-full", "translation/multi30k/t5-base-full",
         "summarization/samsum/gpt2-full"]


@pytest.mark.parametrize("name", SIDES)
def test_generated_scores_do_not_depend_on_the_tokenizers_padding_side(name: str) -> None:
    """Finding: an encoder-decoder's batches were padded on the tokenizer's padding_side
    (transformers' DataCollatorForSeq2Seq), so a checkpoint saved padding left had its labels
    left-padded (the decoder read padding before the target) and BART's sources shifted along its
    learnt positions: the same BART weights scored ROUGE-1 0.007 at eval batch 1 and 0.026 at 3,
    T5's loss moved with the batch. Evaluation, `predict`'s generation and the export's tokenizer
    now pad as the task needs (encoder-decoders right, a decoder's prompts left), whatever the
    tokenizer says."""
    from accelerate import Accelerator

    from toolkit import evaluation, inference, recipe as recipes
    from toolkit.batching import eval_loaders
    from toolkit.setup import build

    plan = recipes.plan(f"recipes/{name}.yaml", ["task.max_eval_samples=6", "task.max_train_samples=2",
                                                 "task.generation.max_new_tokens=6"], smoke=True)
    setup = build(plan)
    _distinct(setup.model)
    tok, seen = setup.tokenizer, []
    for side, size in (("right", 1), ("left", 1), ("left", 3), ("left", 6)):
        tok.padding_side, plan.recipe.train.eval_batch_size = side, size
        loaders, orders = eval_loaders(plan.recipe, setup)
        sink: dict = {}
        scores = evaluation.evaluate(setup.model, loaders, setup.task, Accelerator(cpu=True), setup.raw_evals,
                                     sink=sink, orders=orders)
        seen.append((scores, [row["prediction"] for row in sink[""]]))
    (scores, texts), *others = seen
    assert len(set(texts)) > 2  # the weights write a text of each input's own
    for other_scores, other_texts in others:
        assert other_texts == texts
        assert other_scores == pytest.approx(scores, rel=1e-5)
    # predict's path (the task's own batches of 16), the tokenizer padding left
    assert setup.task.generate_texts(setup.model, tok, setup.raw_evals[""].to_list()) == texts
    inference.decode_as_run(setup.task, setup.model, tok)  # the export's tokenizer pads as the run did
    assert tok.padding_side == ("left" if setup.task.decoder_only else "right")


def _broken(model) -> None:
    """Every float weight NaN: the outputs of any task's evaluation step are NaN."""
    import torch

    with torch.no_grad():
        for param in model.parameters():
            if param.is_floating_point():
                param.fill_(float("nan"))


@functools.cache
def _built(task: str) -> tuple:
    """(plan, setup) of a task's small build, shared by the tests of this module that walk every
    task (a build is most of such a test's time; each test leaves what the next one reads as it was)."""
    from toolkit import recipe as recipes
    from toolkit.setup import build

    recipe, _ = RESUMES[task]
    plan = recipes.plan(f"recipes/{recipe}", ["task.max_eval_samples=2", "task.max_train_samples=2"], smoke=True)
    return plan, build(plan)


@pytest.mark.parametrize("task", sorted(RESUMES))
def test_non_finite_outputs_are_never_scored(task: str) -> None:
    """Finding: a run whose weights had diverged (train.lr=1e12, train.skip_nonfinite=100) scored
    accuracy 0.5417 from NaN outputs (an argmax over NaN is class 0) and finished with exit 0.
    Every task's evaluation refuses non-finite outputs in one line instead of scoring them."""
    from accelerate import Accelerator

    from toolkit import evaluation
    from toolkit.batching import eval_loaders

    plan, setup = _built(task)
    _broken(setup.model)
    loaders, orders = eval_loaders(plan.recipe, setup)
    with pytest.raises(evaluation.NotFinite, match=r"outputs on the eval\S* split are not finite \(the loss of (\d+) of \1 examples"):
        evaluation.evaluate(setup.model, loaders, setup.task, Accelerator(cpu=True), setup.raw_evals, orders=orders)


def test_in_context_scoring_refuses_non_finite_outputs_too() -> None:
    """The ICL method evaluates through its own scoring, over the same loop: refused alike."""
    from accelerate import Accelerator

    from toolkit import evaluation, recipe as recipes
    from toolkit.setup import build

    plan = recipes.plan("recipes/glue/sst2/gpt2-icl-0shot.yaml", ["task.max_eval_samples=2"], smoke=True)
    setup = build(plan)
    _broken(setup.model)
    with pytest.raises(evaluation.NotFinite, match="are not finite"):
        plan.recipe.method.evaluate(setup.model, setup, Accelerator(cpu=True))


@pytest.mark.parametrize("task", sorted(RESUMES))
def test_nothing_is_scored_or_trained_from_nothing(task: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Findings: MLM on a held-out file of one-word lines (15% of one token masks none) scored
    perplexity 1.0000, loss 0.0000, exit 0; a span-corruption training file whose text tokenised to
    nothing gave no training block, and the loop evaluated and saved step 0 forever. Every task:
    a split with no example, or none with a loss unit, is one line at setup (train and eval), and
    the evaluation refuses to score outputs with no unit in them."""
    from accelerate import Accelerator

    from toolkit import evaluation
    from toolkit.batching import eval_loaders
    from toolkit.errors import UserError
    from toolkit.setup import check_units

    plan, setup = _built(task)
    task_, collate = setup.task, setup.task.collator(setup.tokenizer, setup.model)
    check_units(task_, collate, setup.train, setup.evals)  # what the build found: something to score
    with pytest.raises(UserError, match=r"^task: the \w+ training split holds no example once encoded"):
        check_units(task_, collate, setup.train.select([]), setup.evals)
    with pytest.raises(evaluation.NothingScored, match=r"the eval split has nothing to score: it holds no example"):
        check_units(task_, collate, setup.train, {"": setup.evals[""].select([])})
    monkeypatch.setattr(task_, "units", lambda batch: torch_zeros(task_.batch_size(batch)))
    with pytest.raises(UserError, match=r"training split holds \d+ example\(s\) and no token the loss is taken on"):
        check_units(task_, collate, setup.train, setup.evals)
    loaders, orders = eval_loaders(plan.recipe, setup)
    with pytest.raises(evaluation.NothingScored, match=r"its (\d+) example\(s\) hold no token the loss is taken on"):
        evaluation.evaluate(setup.model, loaders, task_, Accelerator(cpu=True), setup.raw_evals, orders=orders)


def torch_zeros(n: int):
    import torch

    return torch.zeros(n)
