"""The task types: each one's recipe, checkpoint and budgets, its reference, its baselines,
and the toolkit's side."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from parity.common import COMMON, GPT2, GREEDY_SHORT, MINILM, ROOT, SET, distinct, raw_splits
from parity.qa import first_sentence, reference_qa, squad_v1, squad_v2, squad_v2_file
from parity.seq2seq import bleu_scores, reference_seq2seq, rouge_scores
from parity.lm import one_mask_set_loss, reference_lm
from parity.gpt2 import reference_gpt2


# --- the budgets ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Spec:
    """One task type: the shipped recipe, the checkpoint, and the overrides of each budget."""

    recipe: str
    checkpoint: str
    real: tuple[str, ...]
    smoke: tuple[str, ...]
    metrics: tuple[str, ...]
    budget: str  # the real budget in words, for the table
    extra: tuple[str, ...] = field(default=())  # overrides for both budgets
    # metrics both sides' trained models get from one shared scorer, after each side's own
    # evaluation: (trained model folder, checkpoint folder, recipe) -> {metric: value}
    rescore: Callable[[str, str, Any], dict[str, float]] | None = None
    # the reference passes its Trainer through `batched`: --reference-batches toolkit applies
    toolkit_batches: bool = False


# one evaluation, after the last step (the loop evaluates there when no scheduled evaluation fell
# on it), and the final model: what the reference does; no per-epoch evaluations or checkpoints
SPECS: dict[str, Spec] = {
    "qa": Spec("recipes/squad/v1.1/minilm-full.yaml", MINILM,
               real=("task.max_train_samples=1600", "task.max_eval_samples=400", "train.epochs=1",
                     "task.max_length=192", "task.doc_stride=64", "train.batch_size=16"),
               smoke=("task.max_train_samples=16", "task.max_eval_samples=8", "train.epochs=1",
                      "task.max_length=128", "task.doc_stride=32", "train.batch_size=8"),
               metrics=("f1", "exact_match"),
               budget="1,600 train questions (from 40 articles), 400 eval questions (from the 8 other articles), "
                      "1 epoch, windows 192 / stride 64, lr 1e-4, batch 16, warm-up 10%",
               toolkit_batches=True),
    # the same budget on a v2.0-format file (`squad_v2_file`): null answers, HasAns / NoAns
    "qa2": Spec("recipes/squad/v1.1/minilm-full.yaml", MINILM,
                real=("task.max_train_samples=1600", "task.max_eval_samples=400", "train.epochs=1",
                      "task.max_length=192", "task.doc_stride=64", "train.batch_size=16"),
                smoke=("task.max_train_samples=16", "task.max_eval_samples=8", "train.epochs=1",
                       "task.max_length=128", "task.doc_stride=32", "train.batch_size=8"),
                metrics=("f1", "exact_match", "HasAns_f1", "NoAns_f1"),
                extra=("task.version=v2", "task.eval_file={squad_v2}"),
                budget="SQuAD v1.1 dev made v2.0 (every third question swapped for another article's and "
                       "unanswerable), 1,600 train / 400 eval questions, 1 epoch, windows 192 / stride 64, "
                       "lr 1e-4, batch 16, null answer when its score beats the best span's (threshold 0)",
                toolkit_batches=True),
    "summarization": Spec("recipes/summarization/samsum/minilm2minilm-full.yaml", MINILM,
                          real=("task.max_train_samples=818", "task.max_eval_samples=100", "train.epochs=8",
                                "task.max_length=128", "task.max_target_length=32", "train.batch_size=8",
                                "train.lr=2e-4", "task.generation.num_beams=1", "task.generation.max_new_tokens=32"),
                          smoke=("task.max_train_samples=16", "task.max_eval_samples=8", "train.epochs=1",
                                 "task.max_length=64", "task.max_target_length=16", *GREEDY_SHORT),
                          metrics=("loss", "rouge1", "rouge2", "rougeL", "rougeLsum"),
                          budget="818 train dialogues (SAMSum validation), 100 test dialogues, 8 epochs (824 steps), "
                                 "source 128 / target 32 tokens, lr 2e-4, batch 8, greedy, 32 new tokens",
                          toolkit_batches=True),
    "translation": Spec("recipes/translation/multi30k/t5-base-full.yaml", MINILM,
                        real=("task.max_train_samples=6000", "task.max_eval_samples=200", "train.epochs=3",
                              "train.lr=3e-4", "task.max_length=64", "task.max_target_length=64",
                              "task.generation.num_beams=1", "task.generation.max_new_tokens=48"),
                        # batch 8: 2 steps (at the recipe's 32, one step, which warmup_ratio 0.06 made a
                        # warm-up step at lr 0 on both sides: nothing trained; now refused)
                        smoke=("task.max_train_samples=16", "task.max_eval_samples=8", "train.epochs=1",
                               "task.max_length=32", "task.max_target_length=32", "train.batch_size=8", *GREEDY_SHORT),
                        metrics=("loss", "bleu", "chrf"),
                        extra=("model.warm_start=encoder-decoder",),
                        budget="6,000 train pairs, 200 test_2016_flickr pairs, 3 epochs (564 steps), 64 / 64 tokens, "
                               "lr 3e-4, batch 32, greedy, 48 new tokens",
                        toolkit_batches=True),
    "mlm": Spec("recipes/pretrain/wikitext-2/minilm-mlm.yaml", MINILM,
                real=("task.max_train_samples=500", "task.max_eval_samples=300"),
                smoke=("task.max_train_samples=16", "task.max_eval_samples=8", "task.max_length=32",
                       "train.batch_size=8"),
                metrics=("perplexity", "loss", "loss_one_mask_set"),
                budget="500 WikiText-2 valid paragraphs (blocks of 128), 300 test paragraphs, 1 epoch, "
                       "lr 1e-4, batch 32",
                rescore=lambda trained, path, recipe: {"loss_one_mask_set": one_mask_set_loss(trained, path, recipe)}),
    "clm": Spec("recipes/pretrain/wikitext-2/gpt2-clm.yaml", GPT2,
                real=("task.max_train_samples=500", "task.max_eval_samples=200", "task.max_length=128",
                      "task.eval_stride=128", "train.lr=5e-4", "train.batch_size=16"),
                smoke=("task.max_train_samples=16", "task.max_eval_samples=8", "task.max_length=32",
                       "task.eval_stride=32", "train.batch_size=8"),
                metrics=("perplexity", "loss"),
                budget="random GPT-2 (4 layers, width 256), 500 WikiText-2 paragraphs in blocks of 128, "
                       "200 test paragraphs, 1 epoch, lr 5e-4, batch 16"),
    "gpt2": Spec("recipes/summarization/samsum/gpt2-full.yaml", GPT2,
                 real=("task.max_train_samples=400", "task.max_eval_samples=50", "train.epochs=1",
                       "task.max_length=128", "task.max_target_length=32", "train.lr=5e-4",
                       "train.batch_size=8", "task.generation.num_beams=1", "task.generation.max_new_tokens=24"),
                 smoke=("task.max_train_samples=16", "task.max_eval_samples=8", "train.epochs=1",
                        "task.max_length=48", "task.max_target_length=16", "train.batch_size=8", *GREEDY_SHORT),
                 metrics=("loss", "rouge1", "rougeL"),
                 budget="random GPT-2 (4 layers, width 256), 400 SAMSum dialogues, 50 test, 1 epoch (50 steps), "
                        "prompt 128 / target 32 tokens, lr 5e-4, batch 8, greedy 24 tokens"),
}
BATCHABLE = [task for task, spec in SPECS.items() if spec.toolkit_batches]
def overrides(task: str, smoke: bool, checkpoint: str, seed: int, full: bool = False) -> list[str]:
    """The spec's overrides of its recipe; `full`: none but the checkpoint and seed (the shipped
    recipe's own protocol, sized for a GPU)."""
    spec = SPECS[task]
    budget = () if full else spec.smoke if smoke else spec.real
    files = {"squad_v2": squad_v2_file} if any("{squad_v2}" in o for o in spec.extra) else {}
    extra = [o.format(**{k: make() for k, make in files.items()}) for o in spec.extra]
    from toolkit.recipe_data import layered

    return layered(COMMON, extra, budget, SET, [f"model.checkpoint={checkpoint}", f"train.seed={seed}"])


def resolved_recipe(task: str, over: list[str]) -> Any:
    from toolkit.recipe import find_recipe, load

    return load(find_recipe(str(ROOT / SPECS[task].recipe)), over)


# --- the toolkit side -------------------------------------------------------------------------
def toolkit_side(task: str, over: list[str], out: Path) -> dict:
    """`toolkit.run`, the function `toolkit run` calls, with the spec's overrides."""
    import toolkit

    run = toolkit.run(str(ROOT / SPECS[task].recipe), over, runs_dir=out, force=True)
    m = run.metrics
    preds = [json.loads(line) for line in (run.dir / "predictions.jsonl").read_text().splitlines()] \
        if (run.dir / "predictions.jsonl").is_file() else []
    return {"metrics": dict(m["eval"]), "train_samples_per_s": m["train_samples_per_second"],
            "eval_samples_per_s": m.get("eval_samples_per_second", 0.0), "train_s": m.get("train_runtime_s"),
            "distinct_predictions": distinct([p.get("prediction") for p in preds])}


REFERENCES: dict[str, Callable[[Any, str, Path], dict]] = {
    "qa": reference_qa, "qa2": reference_qa, "summarization": reference_seq2seq, "translation": reference_seq2seq,
    "mlm": reference_lm, "clm": reference_lm, "gpt2": reference_gpt2}


# --- baselines ----------------------------------------------------------------------------------
def baselines(task: str, recipe: Any) -> dict[str, dict[str, float]]:
    """The data-driven baselines beside each number (no model)."""
    if task not in ("qa", "qa2", "summarization", "translation", "gpt2"):
        return {}
    _, rows = raw_splits(recipe)
    if task == "qa":
        golds = [list(a["text"]) for a in rows["answers"]]
        return {"first sentence of the context": squad_v1([first_sentence(c) for c in rows["context"]], golds)}
    if task == "qa2":
        golds = [list(a["text"]) for a in rows["answers"]]
        return {"first sentence of the context": squad_v2([first_sentence(c) for c in rows["context"]], golds),
                "no answer to any question": squad_v2([""] * len(golds), golds)}
    if task == "translation":
        return {"source copied": bleu_scores(list(rows["source"]), list(rows["target"]))}
    lead = ["\n".join(s.splitlines()[:3]) for s in rows["source"]]
    return {"Lead-3 (first three utterances)": rouge_scores(lead, list(rows["target"]))}
