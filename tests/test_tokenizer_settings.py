"""A score never depends on settings a checkpoint's tokenizer happens to be saved with: the
padding and truncation sides, its model_max_length. Every task is held to it: the same weights
score the same with a tokenizer saved with the unusual setting as with the default, at every eval
batch size (batches pad as the family needs; texts are cut where the task documents it)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

# (recipe, family of its small model, overrides): a regression head on an encoder with learnt
# absolute positions (BERT) and on a decoder (GPT-2 reads the last real token), tags per
# sub-token, extractive QA windows (which side the question goes), generation by an
# encoder-decoder (its sources cut at task.max_length) and by a decoder, the generic classifier
CASES = {
    "glue-bert": ("glue/stsb/bert-base-uncased-full", "bert", ["task.max_length=12"]),
    "glue-gpt2": ("glue/stsb/gpt2-full", "gpt2", ["task.max_length=12"]),
    "text_classification-bert": ("demo/own-data/minilm-full", "bert", ["task.max_length=10"]),
    "ner-bert": ("ner/conll2003/minilm-full", "bert", ["task.max_length=10"]),
    "squad-bert": ("squad/v1.1/minilm-full", "bert", ["task.max_length=48", "task.doc_stride=16"]),
    "summarization-bart": ("summarization/samsum/bart-base-full", "bart",
                           ["task.max_length=16", "task.generation.max_new_tokens=4"]),
    "summarization-gpt2": ("summarization/samsum/gpt2-full", "gpt2",
                           ["task.max_length=16", "task.generation.max_new_tokens=4"]),
    "translation-t5": ("translation/multi30k/t5-base-full", "t5",
                       ["task.max_length=10", "task.max_target_length=8", "task.generation.max_new_tokens=4"]),
    # pretraining objectives pack blocks of their own (a small text file of their own: WikiText-2
    # takes seconds to pack); the last block is shorter, so batches do pad
    "clm-gpt2": ("pretrain/wikitext-2/gpt2-clm", "gpt2", ["task.max_length=48", "task.eval_stride=24"]),
    "mlm-roberta": ("pretrain/wikitext-2/roberta-base-mlm", "roberta", ["task.max_length=48"]),
    "denoise-bart": ("pretrain/wikitext-2/bart-base-denoise", "bart", ["task.max_length=48"]),
    "span_corruption-t5": ("pretrain/wikitext-2/t5-base-span_corruption", "t5", ["task.max_length=48"]),
}
ODD = {"padding_side": "left", "truncation_side": "left"}


def _with_tokenizer(source: str, folder: Path, **settings) -> str:
    """A copy of the checkpoint folder whose tokenizer is saved with `settings`."""
    from transformers import AutoTokenizer

    shutil.copytree(source, folder)
    tok = AutoTokenizer.from_pretrained(source)
    for key, value in settings.items():
        setattr(tok, key, value)
        tok.init_kwargs[key] = value  # what save_pretrained writes
    tok.save_pretrained(folder)
    saved = json.loads((folder / "tokenizer_config.json").read_text())
    assert all(saved.get(k) == v for k, v in settings.items()), saved
    return str(folder)


def test_every_task_is_held_to_it() -> None:
    from toolkit.tasks import TASKS

    assert {case.split("-")[0] for case in CASES} == set(TASKS.names())


@pytest.fixture(scope="module")
def text_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    words = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex many bold jocks".split()
    path = tmp_path_factory.mktemp("text") / "docs.txt"
    path.write_text("".join(" ".join(words[(i + j) % len(words)] for j in range(9 + i % 7)) + " .\n" for i in range(40)))
    return path


def _scores(recipe: str, checkpoint: str, overrides: list[str], sizes: tuple[int, ...], weights=None):
    from accelerate import Accelerator
    from test_evaluation import _distinct

    from toolkit import evaluation, recipe as recipes
    from toolkit.batching import eval_loaders
    from toolkit.setup import build

    plan = recipes.plan(f"recipes/{recipe}.yaml", [f"model.checkpoint={checkpoint}", "task.max_eval_samples=6",
                                                   "task.max_train_samples=2", *overrides])
    setup = build(plan)
    if weights is None:
        _distinct(setup.model)
    else:
        setup.model.load_state_dict(weights)
    out = []
    for size in sizes:
        plan.recipe.train.eval_batch_size = size
        loaders, orders = eval_loaders(plan.recipe, setup)
        sink: dict = {}
        scores = evaluation.evaluate(setup.model, loaders, setup.task, Accelerator(cpu=True), setup.raw_evals,
                                     sink=sink, orders=orders)
        out.append((scores, [row.get("prediction") for row in sink.get("", [])]))
    return setup, out


@pytest.mark.parametrize("case", sorted(CASES))
def test_scores_do_not_depend_on_the_tokenizers_saved_sides(case: str, tiny_checkpoint, tmp_path: Path,
                                                            text_file: Path) -> None:
    """Finding: STS-B on a tiny BERT whose tokenizer was saved with `padding_side: left` scored
    Pearson -0.26, 0.03 and -0.04 at eval batch 1, 3 and 6 on the same weights, exit 0: transformers'
    collators pad on the tokenizer's side and BERT's absolute positions moved with each batch's
    padding; a tokenizer saved with `truncation_side: left` kept the end of every text where the
    task documents its start kept; QA put the context before the question. Every tokenizer the
    toolkit loads pads and cuts on the right (a decoder's generation prompts are left-padded by the
    task itself), whatever the checkpoint says, and the run's exported tokenizer says so."""
    recipe, family, overrides = CASES[case]
    if recipe.startswith("pretrain/"):
        overrides = [*overrides, f"task.train_file={text_file}", f"task.eval_file={text_file}"]
    base = tiny_checkpoint(family)
    plain = _with_tokenizer(base, tmp_path / "plain")
    odd = _with_tokenizer(base, tmp_path / "odd", **ODD)
    setup, ((scores, texts),) = _scores(recipe, plain, overrides, (3,))
    weights = setup.model.state_dict()
    odd_setup, seen = _scores(recipe, odd, overrides, (1, 6), weights)
    assert "loss" in scores
    for other_scores, other_texts in seen:
        assert other_scores == pytest.approx(scores, rel=1e-5, nan_ok=True)
        assert other_texts == texts
    tok = odd_setup.tokenizer
    assert (tok.padding_side, tok.truncation_side) == ("right", "right")
    tok.save_pretrained(tmp_path / "export")  # what a run's export writes beside the model
    saved = json.loads((tmp_path / "export" / "tokenizer_config.json").read_text())
    assert (saved.get("padding_side", "right"), saved.get("truncation_side", "right")) == ("right", "right")


@pytest.mark.parametrize("family", ["gpt2", "t5"])
def test_in_context_scores_do_not_depend_on_the_tokenizers_saved_sides(family: str, tiny_checkpoint,
                                                                       tmp_path: Path) -> None:
    """In-context prompting pads and cuts its prompts itself (from the left, as
    lm-evaluation-harness does), on ids: the tokenizer's saved sides change nothing."""
    from accelerate import Accelerator
    from test_evaluation import _distinct

    from toolkit import recipe as recipes
    from toolkit.setup import build

    base = tiny_checkpoint(family)
    seen = []
    for name, settings in (("plain", {}), ("odd", ODD)):
        folder = _with_tokenizer(base, tmp_path / name, **settings)
        for size in (1, 6):
            plan = recipes.plan(f"recipes/glue/sst2/{family if family == 'gpt2' else 't5-base'}-icl-4shot.yaml",
                                [f"model.checkpoint={folder}", "task.max_eval_samples=4",
                                 "method.max_length=40", f"method.batch_size={size}"])
            setup = build(plan)
            _distinct(setup.model)
            seen.append(plan.recipe.method.evaluate(setup.model, setup, Accelerator(cpu=True)))
    assert all(s == pytest.approx(seen[0], rel=1e-5, nan_ok=True) for s in seen[1:])
