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
def overrides(task: str, smoke: bool, checkpoint: str, seed: int, full: bool = False,
              sets: list[str] | None = None) -> list[str]:
    """The spec's overrides of its recipe; `full`: none but the checkpoint and seed (the shipped
    recipe's own protocol, sized for a GPU); then `sets` (None: --set's)."""
    spec = SPECS[task]
    budget = () if full else spec.smoke if smoke else spec.real
    files = {"squad_v2": squad_v2_file} if any("{squad_v2}" in o for o in spec.extra) else {}
    extra = [o.format(**{k: make() for k, make in files.items()}) for o in spec.extra]
    from toolkit.recipe_data import layered

    return layered(COMMON, extra, budget, SET if sets is None else sets, [f"model.checkpoint={checkpoint}", f"train.seed={seed}"])


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
            "eval_examples": m["eval_samples"][""], "eval_sha256": m["eval_sha256"],  # the eval rows scored
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
        return {"source copied": bleu_scores(list(rows["source"]), list(rows["target"]), recipe.task.bleu_tokenize)}
    lead = ["\n".join(s.splitlines()[:3]) for s in rows["source"]]
    return {"Lead-3 (first three utterances)": rouge_scores(lead, list(rows["target"]))}


# --- which side each recipe setting reaches -----------------------------------------------------
# Every recipe setting a `--set` can change, by what the reference does with it. Finding: the
# harness passed every `--set` to both sides' recipe, but the references read only some of it:
# `--set task.prefix=...` (summarization, translation), `train.gradient_checkpointing=true`,
# `task.mask_ratio` / `task.random_ratio` (mlm), `task.bleu_tokenize` (translation) and, before
# them, `model.attention` changed the toolkit's side alone, and `method.name=lora`,
# `task.line_by_line=true`, `train.length_buckets`, `train.keep_best=true`, ... still did: the
# table compared two protocols as one, exit 0. The rule: a setting reaches both sides the same
# (`both`: the reference reads it; `data`: the task's own load(), which both sides call, reads
# it), changes neither side's numbers (`neutral`), or is refused in one line before any side runs
# (the reason the reference cannot take it). tests/test_parity.py walks every field of every
# task's recipe through this table: a new recipe field must be classified here.
BOTH = "both"
DATA = "data"
NEUTRAL = "neutral"
_NO_SUCH = "the reference (transformers' Trainer) has no such setting"
REACH: dict[str, str] = {
    "model.checkpoint": BOTH,  # the harness's, one folder for both sides (a --set of it is refused by the parser)
    "model.attention": BOTH,  # reference_attention (the toolkit refuses it with model.warm_start)
    "model.dropout": BOTH,  # bert_dropout / causal_lm
    "model.warm_start": "the reference's model is fixed by the task type (BERT2BERT for summarization and "
                        "translation, the checkpoint's own head otherwise)",
    "task.max_length": BOTH, "task.max_target_length": BOTH, "task.doc_stride": BOTH,
    "task.max_answer_length": BOTH, "task.n_best": BOTH, "task.version": BOTH, "task.mlm_probability": BOTH,
    "task.mask_ratio": BOTH, "task.random_ratio": BOTH,  # DataCollatorForLanguageModeling's replace probabilities
    "task.prefix": BOTH,  # run_summarization's source_prefix; gpt2: the prompt's affixes
    "task.suffix": BOTH,  # gpt2's prompt (refused for the encoder-decoders: ONLY_SOME)
    "task.bleu_tokenize": BOTH,  # sacreBLEU's tokenize
    "task.generation": BOTH,  # generation_kwargs: every decoding setting the recipe sets
    "task.eval_stride": BOTH,  # checked against the reference's non-overlapping blocks (`requirements`)
    "task.documents": BOTH,  # load() and the reference's line breaks (task.line_breaks)
    **dict.fromkeys(("task.max_train_samples", "task.max_eval_samples", "task.data_dir", "task.train_file",
                     "task.eval_file", "task.dataset", "task.dataset_config", "task.train_split", "task.eval_split",
                     "task.text_field", "task.eval_fraction", "task.split_seed", "task.split_articles", "task.subset",
                     "task.source_lang", "task.target_lang", "task.source_field", "task.target_field",
                     "task.question_field", "task.context_field", "task.answers_field", "task.id_field"), DATA),
    "task.name": "the task type is the harness's first argument, each with its own reference",
    "task.mode": "the reference is run_qa's extractive head, which `auto` already picks for MiniLM",
    "task.line_by_line": "the reference groups documents into blocks as run_mlm does without --line_by_line",
    "task.whole_word_mask": "the reference masks tokens (DataCollatorForLanguageModeling); the toolkit's "
                            "whole-word masking has its own word boundaries",
    "task.corruption_seed": "the reference draws its evaluation masks from Trainer's seed",
    "task.source_code": "the reference's BERT2BERT tokenizer has no language codes",
    "task.target_code": "the reference's BERT2BERT tokenizer has no language codes",
    "method": "the reference trains every weight (full fine-tuning), as the example scripts do",
    **dict.fromkeys(("train.epochs", "train.max_steps", "train.lr", "train.batch_size", "train.eval_batch_size",
                     "train.grad_accum", "train.weight_decay", "train.warmup_ratio", "train.warmup_steps",
                     "train.max_grad_norm", "train.seed", "train.mixed_precision", "train.group_by_length",
                     "train.gradient_checkpointing"), BOTH),  # training_arguments
    **dict.fromkeys(("train.log_every", "train.report_to", "train.save_total_limit", "train.keep_checkpoints",
                     "train.metric"), NEUTRAL),  # logging and checkpoint files (metric: keep_best is off)
    "train.precision_mode": f"{_NO_SUCH} (Trainer's mixed precision keeps fp32 weights)",
    "train.pad_multiple": f"{_NO_SUCH} (its collators pad to the batch's longest)",
    "train.length_buckets": f"{_NO_SUCH} (its sampler groups by length or shuffles)",
    "train.compile": f"{_NO_SUCH} (the reference runs eagerly)",
    "train.compile_optimizer": f"{_NO_SUCH} (the reference runs eagerly)",
    "train.fast_dropout": f"{_NO_SUCH} (the reference runs transformers' own dropout)",
    "train.skip_nonfinite": _NO_SUCH,
    "train.eval_every": "the reference evaluates once, after the last step",
    "train.save_every": "the reference saves no checkpoints (their time would count on one side only)",
    "train.keep_best": "the reference keeps its last model",
    "train.early_stopping_patience": "the reference trains every step",
}
# settings the reference of some task types does not take (task type -> setting -> why)
ONLY_SOME: dict[str, dict[str, str]] = {
    **dict.fromkeys(("summarization", "translation"), {
        "task.suffix": "run_summarization / run_translation take a source prefix only"}),
    **dict.fromkeys(("qa", "qa2"), {
        key: "extractive QA reads it on neither side" for key in
        ("task.max_target_length", "task.prefix", "task.suffix", "task.generation")}),
}


def reach(task: str, key: str) -> str:
    """BOTH, DATA, NEUTRAL, or why the reference of `task` cannot take setting `key`
    (task.generation.num_beams is task.generation's; method.* is the method's)."""
    parts = key.split(".")
    for name in (key, ".".join(parts[:2]), parts[0]):
        if name in ONLY_SOME.get(task, {}):
            return ONLY_SOME[task][name]
        if name in REACH:
            return REACH[name]
    return "not known to the harness (benchmarks/parity/specs.py REACH)"


def settings(recipe: Any) -> dict[str, Any]:
    """Every setting of the recipe's model, task, method and train sections, by dotted key
    (nested settings such as task.generation spelled out), with task.name and method.name."""
    import dataclasses

    flat: dict[str, Any] = {"task.name": recipe.task.name, "method.name": recipe.method.name}

    def walk(prefix: str, obj: Any) -> None:
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if dataclasses.is_dataclass(value):
                walk(f"{prefix}.{f.name}", value)
            else:
                flat[f"{prefix}.{f.name}"] = value

    for section in ("model", "task", "method", "train"):
        walk(section, getattr(recipe, section))
    return flat


def one_sided(task: str, recipe: Any, budget: Any) -> None:
    """A ValueError, one line, when the recipe both sides resolve (`recipe`: the budget's with
    --set after it) differs from the budget's own (`budget`) in a setting the reference cannot
    take, or when the recipe asks what the reference cannot do (`requirements`)."""
    set_keys = [key.split("=", 1)[0] for key in SET]
    ours, base = settings(recipe), settings(budget)
    for key in sorted(set(ours) | set(base), key=lambda k: (not any(k.startswith(s) for s in set_keys), k)):
        if ours.get(key) != base.get(key) and reach(task, key) not in (BOTH, DATA, NEUTRAL):
            raise ValueError(f"--set: {key} ({ours.get(key)!r}) would reach the toolkit's side only: "
                             f"{reach(task, key)}; the table would compare two protocols as one "
                             f"(compare it with `toolkit sweep` instead)")
    requirements(task, recipe)


def requirements(task: str, recipe: Any) -> None:
    """What the resolved recipe must be for the reference to run the same protocol."""
    from toolkit.schema import value_of

    if task == "clm" and value_of(recipe.task, "eval_stride") != recipe.task.max_length:
        raise ValueError(f"task.eval_stride: {value_of(recipe.task, 'eval_stride')} scores each window with "
                         f"{recipe.task.max_length - value_of(recipe.task, 'eval_stride')} tokens of context, and "
                         "the reference (run_clm) scores non-overlapping blocks; set "
                         f"--set task.eval_stride={recipe.task.max_length}")
