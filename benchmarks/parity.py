"""Every task type against transformers' own pipeline: the toolkit's recipe beside a reference
run built on transformers' machinery (Trainer / Seq2SeqTrainer, the example scripts' recipes),
on the same checkpoint, data subset, tokenisation limits, hyper-parameters, schedule and seeds.

    python benchmarks/parity.py qa                      # the real budget, seeds 42,43,44
    python benchmarks/parity.py summarization --seeds 42
    python benchmarks/parity.py qa --smoke              # tiny random models, seconds: the harness
    make parity TASK=qa PARITY_ARGS="--seeds 42"

Tasks: qa (SQuAD v1.1, MiniLM, extractive), qa2 (the same on a SQuAD v2.0-format file made from
the v1.1 dev set: unanswerable questions, run_qa's null answer, the official v2.0 scorer), summarization (SAMSum, MiniLM2MiniLM), translation
(Multi30k en-de, MiniLM2MiniLM), mlm (WikiText-2, MiniLM), clm (WikiText-2, a random-weight
GPT-2), gpt2 (decoder-only summarization of SAMSum, the same GPT-2, prompt masked from the loss),
objectives (T5 span corruption and BART denoising measured against their papers' definitions on
10k blocks, no training), icl (in-context prompting on a generation task: the toolkit's batched
scoring and generation against one example at a time).

Each side of each seed runs in a fresh process (this script again with --side) and returns one
ROW line: its metrics, training and evaluation samples/s, and the process's peak resident memory.
The parent prints per task the metric on both sides (mean +- std over the seeds), the paired
difference (mean, std and a paired t statistic), the speeds, peak memory and the data-driven
baselines (QA: first sentence of the context, and for v2.0 no answer anywhere; summarization: Lead-3 utterances; translation:
the source copied).

What is shared between the sides on purpose: the raw examples (each task's own `load()`, so the
subset is the same rows) and the hyper-parameters (read from the one resolved recipe). What each
reference writes itself, after transformers' example scripts (run_qa, run_summarization,
run_translation, run_mlm, run_clm), not taken from the toolkit: tokenisation and windowing,
labels, the collator, Trainer's loop, n-best span post-processing, generation, and scoring (the
official SQuAD v1.1 and v2.0 definitions written out below; rouge-score and sacreBLEU called directly).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import re
import resource
import statistics
import string
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
MINILM = "sentence-transformers/all-MiniLM-L6-v2"
GPT2 = "gpt2-random"  # a random-weight GPT-2 built from a config with the real tokenizer (below)


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
COMMON = (f"train.eval_every={10**9}", "train.keep_best=false")
GREEDY_SHORT = ("task.generation.num_beams=1", "task.generation.max_new_tokens=8")
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
                        smoke=("task.max_train_samples=16", "task.max_eval_samples=8", "train.epochs=1",
                               "task.max_length=32", "task.max_target_length=32", *GREEDY_SHORT),
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
SEED_LIST = "42,43,44"
SET: list[str] = []  # --set KEY=VALUE: recipe overrides after the budget's, for both sides
BATCHES = ["trainer"]  # --reference-batches: whose batches the reference's Trainer trains on


def overrides(task: str, smoke: bool, checkpoint: str, seed: int, full: bool = False) -> list[str]:
    """The spec's overrides of its recipe; `full`: none but the checkpoint and seed (the shipped
    recipe's own protocol, sized for a GPU)."""
    spec = SPECS[task]
    budget = () if full else spec.smoke if smoke else spec.real
    files = {"squad_v2": squad_v2_file} if any("{squad_v2}" in o for o in spec.extra) else {}
    extra = [o.format(**{k: make() for k, make in files.items()}) for o in spec.extra]
    return [*COMMON, *extra, *budget, *SET, f"model.checkpoint={checkpoint}", f"train.seed={seed}"]


def checkpoint_path(name: str, smoke: bool) -> str:
    """A local folder for the spec's checkpoint: the real MiniLM (or its tiny random twin under
    --smoke), or the random GPT-2 built once into the toolkit's cache."""
    from toolkit import models

    if name == MINILM:
        return models.smoke_checkpoint(MINILM) if smoke else models.resolve(MINILM)
    return random_gpt2(smoke)


def random_gpt2(smoke: bool) -> str:
    """GPT-2's architecture at 4 layers x 256 (2 x 32 under --smoke), weights from seed 0, and the
    real GPT-2 tokenizer: only random-weight GPT-2s exist here, so both sides start from this one."""
    import torch
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    from toolkit import models

    layers, width = (2, 32) if smoke else (4, 256)
    cache = Path(os.environ.get("TOOLKIT_CACHE", Path.home() / ".cache" / "toolkit")) / "parity"
    folder = cache / f"gpt2-random-{layers}x{width}"
    if (folder / "config.json").is_file():
        return str(folder)
    tok = AutoTokenizer.from_pretrained(str(models.tokenizer_dir() / "gpt2"))
    config = GPT2Config(vocab_size=len(tok), n_positions=1024, n_embd=width, n_layer=layers, n_head=4 if width > 32 else 2,
                        bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    tmp = Path(tempfile.mkdtemp(dir=cache.mkdir(parents=True, exist_ok=True) or cache, prefix=".gpt2-"))
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    try:
        tmp.rename(folder)
    except OSError:  # another process built it first
        pass
    return str(folder)


def resolved_recipe(task: str, over: list[str]) -> Any:
    from toolkit.recipe import find_recipe, load

    return load(find_recipe(str(ROOT / SPECS[task].recipe)), over)


def peak_rss_mb() -> float:
    """This process's peak resident memory (Linux reports KiB), the same measure for both sides."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


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


def distinct(predictions: list) -> str:
    """'k/n, w words': how many different outputs n inputs got (one summary for every input is a
    failure) and their mean length in words (generation time grows with it)."""
    texts = [p if isinstance(p, str) else json.dumps(p) for p in predictions if p is not None]
    if not texts:
        return ""
    return f"{len(set(texts))}/{len(texts)}, {statistics.mean(len(t.split()) for t in texts):.1f} words"


# --- reference: shared pieces -------------------------------------------------------------------
def training_arguments(recipe: Any, out: Path, seq2seq: bool = False, **extra: Any) -> Any:
    """Trainer's arguments from the recipe's train section: the same epochs, batch, lr, weight
    decay, warm-up, clipping and seed; no checkpoints, no evaluation during training. The same
    batching too: where the recipe groups batches by length (`train.group_by_length`, the
    toolkit's default), Trainer's own LengthGroupedSampler (mega-batches of 50 batches, each
    sorted by length); else its random sampler. Grouping changes what a step averages over (the
    loss is a mean over the batch's tokens), so the sides must share it."""
    import torch
    from transformers import Seq2SeqTrainingArguments, TrainingArguments

    t = recipe.train
    cls = Seq2SeqTrainingArguments if seq2seq else TrainingArguments
    return cls(output_dir=str(out), per_device_train_batch_size=t.batch_size,
               per_device_eval_batch_size=t.eval_batch_size or 2 * t.batch_size, num_train_epochs=t.epochs,
               learning_rate=t.lr, weight_decay=t.weight_decay, warmup_steps=t.warmup_steps or t.warmup_ratio,
               max_grad_norm=t.max_grad_norm or 0.0, lr_scheduler_type="linear", seed=t.seed,
               save_strategy="no", eval_strategy="no", report_to=[], logging_strategy="no",
               train_sampling_strategy="group_by_length" if t.group_by_length else "random",
               use_cpu=not torch.cuda.is_available(), dataloader_num_workers=0, **extra)


class ToolkitBatches:
    """A Trainer sampler serving the toolkit's own training batches for the recipe and seed, in
    its order: `toolkit.batching.EpochBatches` over the toolkit's encoded training features,
    each mapped to the reference's feature with the same tokens (the toolkit keeps its features
    longest first, the reference in raw order; identical features are interchangeable).
    Flattened: Trainer's DataLoader cuts them back into the same batches, since every batch but
    an epoch's last is full. Trainer calls `set_epoch` before each epoch, as the toolkit's loop
    calls `use_epoch`. For `--reference-batches toolkit`: the two sides then train on the same
    batches in the same order, and what is left to differ is the random draws (initialisation,
    dropout)."""

    def __init__(self, lengths: list[int], rows: list[int], recipe: Any) -> None:
        from toolkit.batching import EpochBatches

        t = recipe.train
        self.rows = rows  # toolkit position -> reference feature
        self.batches = EpochBatches(lengths, t.batch_size, t.seed, t.group_by_length, t.batch_size * t.grad_accum)

    def set_epoch(self, epoch: int) -> None:
        self.batches.use_epoch(epoch)

    def __iter__(self) -> Any:
        return (self.rows[i] for batch in self.batches for i in batch)

    def __len__(self) -> int:
        return len(self.rows)


def batched(trainer: Any, recipe: Any, tok: Any, train_rows: Any) -> Any:
    """`trainer`, training on the toolkit's batches under `--reference-batches toolkit` (else
    Trainer's own sampler, as `training_arguments` set it). The toolkit's features are encoded
    here by its own encoder, for their order alone; every one must be one of the reference's."""
    if BATCHES[0] != "toolkit":
        return trainer
    ours = recipe.method.encoder(recipe.task, tok)(train_rows)["input_ids"]
    where: dict[tuple, list[int]] = collections.defaultdict(list)
    for i, ids in enumerate(trainer.train_dataset["input_ids"]):
        where[tuple(ids)].append(i)
    try:
        rows = [where[tuple(ids)].pop() for ids in ours]
    except IndexError:
        raise RuntimeError("--reference-batches toolkit: a toolkit training feature is none of the reference's") from None
    if len(rows) != len(trainer.train_dataset):
        raise RuntimeError("--reference-batches toolkit: the reference has training features the toolkit has not")
    trainer._get_train_sampler = lambda dataset=None: ToolkitBatches([len(ids) for ids in ours], rows, recipe)
    return trainer


def in_order(trainer: Any) -> Any:
    """`trainer` with evaluation and prediction in the dataset's order. Finding: under
    `train_sampling_strategy="group_by_length"` transformers (since PR #33514) also groups the
    evaluation batches by length, and `predict()` returns its predictions in that permuted order,
    so they no longer line up with the dataset's rows (QA features, references). Training keeps
    its length grouping; evaluation goes back to Trainer's single-process sequential sampler."""
    from torch.utils.data import SequentialSampler

    trainer._get_eval_sampler = lambda dataset: SequentialSampler(dataset)
    return trainer


def raw_splits(recipe: Any) -> tuple[Any, Any]:
    """The rows both sides train and score on: the task's own load() (the same subset)."""
    raw = recipe.task.load()
    return raw["train"], raw["eval"][""]


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


# --- reference: extractive QA (run_qa's recipe) -------------------------------------------------
def qa_train_features(tok: Any, rows: Any, max_length: int, stride: int) -> dict:
    """Windows of (question, context) labelled as run_qa labels them: the tokens holding the first
    answer's first and last characters, or [CLS] when the window does not hold the whole answer."""
    enc = tok([q.lstrip() for q in rows["question"]], rows["context"], truncation="only_second",
              max_length=max_length, stride=stride, return_overflowing_tokens=True, return_offsets_mapping=True)
    starts, ends = [], []
    for i, offsets in enumerate(enc["offset_mapping"]):
        answer = rows["answers"][enc["overflow_to_sample_mapping"][i]]
        cls = enc["input_ids"][i].index(tok.cls_token_id)
        seq = enc.sequence_ids(i)
        first, last = seq.index(1), len(seq) - 1 - seq[::-1].index(1)  # the context's tokens
        if not answer["answer_start"]:  # a v2.0 question without an answer: [CLS]
            starts.append(cls), ends.append(cls)
            continue
        a = answer["answer_start"][0]
        b = a + len(answer["text"][0])
        if offsets[first][0] > a or offsets[last][1] < b:
            starts.append(cls), ends.append(cls)
            continue
        s = first
        while s <= last and offsets[s][0] <= a:
            s += 1
        e = last
        while e >= first and offsets[e][1] >= b:
            e -= 1
        starts.append(s - 1), ends.append(e + 1)
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
            **({"token_type_ids": enc["token_type_ids"]} if "token_type_ids" in enc else {}),
            "start_positions": starts, "end_positions": ends}


def qa_eval_features(tok: Any, rows: Any, max_length: int, stride: int) -> tuple[dict, list, list]:
    """Eval windows, each window's example and its offsets (None outside the context)."""
    enc = tok([q.lstrip() for q in rows["question"]], rows["context"], truncation="only_second",
              max_length=max_length, stride=stride, return_overflowing_tokens=True, return_offsets_mapping=True)
    offsets = [[o if s == 1 else None for o, s in zip(offs, enc.sequence_ids(i))]
               for i, offs in enumerate(enc["offset_mapping"])]
    feats = {k: enc[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in enc}
    return feats, list(enc["overflow_to_sample_mapping"]), offsets


def qa_postprocess(start: Any, end: Any, example_of: list, offsets: list, contexts: list[str],
                   n_best: int, max_answer: int, with_negative: bool = False, null_threshold: float = 0.0) -> list[str]:
    """run_qa's n-best search: the n_best highest start and end logits of each window paired,
    spans outside the context, reversed or longer than max_answer dropped, best start+end wins.
    `with_negative` (SQuAD v2.0, run_qa's version_2_with_negative): the null answer scores the
    first token's start+end, the lowest over the example's windows, and the answer is "" when
    that null score minus the best span's score is above `null_threshold` (run_qa's default 0)."""
    import numpy as np

    best: dict[int, tuple[float, str]] = {}
    null: dict[int, float] = {}
    for f, ex in enumerate(example_of):
        offs = offsets[f]
        s_log, e_log = start[f][:len(offs)], end[f][:len(offs)]
        null[ex] = min(null.get(ex, math.inf), float(s_log[0] + e_log[0]))
        for s in np.argsort(s_log)[::-1][:n_best]:
            for e in np.argsort(e_log)[::-1][:n_best]:
                if offs[s] is None or offs[e] is None or e < s or e - s + 1 > max_answer:
                    continue
                score = float(s_log[s] + e_log[e])
                if ex not in best or score > best[ex][0]:
                    best[ex] = (score, contexts[ex][offs[s][0]:offs[e][1]])
    if with_negative:
        return ["" if i not in best or null[i] - best[i][0] > null_threshold else best[i][1]
                for i in range(len(contexts))]
    return [best.get(i, (0.0, ""))[1] for i in range(len(contexts))]


def reference_qa(recipe: Any, path: str, out: Path) -> dict:
    from datasets import Dataset
    from transformers import (AutoModelForQuestionAnswering, AutoTokenizer, DataCollatorWithPadding, Trainer,
                              set_seed)

    task = recipe.task
    train_rows, eval_rows = raw_splits(recipe)
    tok = AutoTokenizer.from_pretrained(path)
    set_seed(recipe.train.seed)
    model = AutoModelForQuestionAnswering.from_pretrained(path, **bert_dropout(recipe))
    train_set = Dataset.from_dict(qa_train_features(tok, train_rows[:], task.max_length, task.doc_stride))
    feats, example_of, offsets = qa_eval_features(tok, eval_rows[:], task.max_length, task.doc_stride)
    trainer = batched(in_order(Trainer(model=model, args=training_arguments(recipe, out), train_dataset=train_set,
                                       data_collator=DataCollatorWithPadding(tok))), recipe, tok, train_rows)
    result = trainer.train()

    def evaluate() -> tuple[list[str], dict[str, float]]:  # timed with its scorer, as the toolkit's is
        logits = trainer.predict(Dataset.from_dict(feats)).predictions
        preds = qa_postprocess(logits[0], logits[1], example_of, offsets, list(eval_rows["context"]),
                               task.n_best, task.max_answer_length, with_negative=task.version == "v2")
        golds = [list(a["text"]) for a in eval_rows["answers"]]
        return preds, squad_v2(preds, golds) if task.version == "v2" else squad_v1(preds, golds)

    (preds, scores), seconds = timed(evaluate)
    return {"metrics": scores, "train_samples_per_s": result.metrics["train_samples_per_second"],
            "eval_samples_per_s": len(preds) / seconds, "train_s": result.metrics["train_runtime"],
            "distinct_predictions": distinct(preds)}


# --- the official SQuAD v1.1 scoring, written out ---------------------------------------------
def normalize_answer(text: str) -> str:
    """The v1.1 script's order: lower case, drop punctuation, drop a/an/the, collapse spaces."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def squad_f1(prediction: str, gold: str) -> float:
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    same = sum((collections.Counter(pred) & collections.Counter(ref)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


def squad_v1(predictions: list[str], golds: list[list[str]]) -> dict[str, float]:
    """Mean over questions of the best EM and F1 over the gold answers (fractions, as the
    toolkit's metrics.json holds them; the tables show percent)."""
    em = [max(float(normalize_answer(p) == normalize_answer(g)) for g in gs) for p, gs in zip(predictions, golds)]
    f1 = [max(squad_f1(p, g) for g in gs) for p, gs in zip(predictions, golds)]
    n = max(len(predictions), 1)
    return {"exact_match": sum(em) / n, "f1": sum(f1) / n}


def squad_v2(predictions: list[str], golds: list[list[str]]) -> dict[str, float]:
    """The official v2.0 script's raw scores (no na_prob file, so no threshold applied): golds
    that normalise to nothing are dropped and a question left with none has "" as its one gold;
    F1 of an empty prediction or gold is 1 only when both are empty. HasAns / NoAns split the
    questions by whether the *file* lists answers (the script's qid_to_has_ans), not by what is
    left after normalising. Fractions, under the toolkit's key names."""
    def f1(prediction: str, gold: str) -> float:
        pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
        return float(pred == ref) if not pred or not ref else squad_f1(prediction, gold)

    em, f = [], []
    for p, gs in zip(predictions, golds):
        kept = [g for g in gs if normalize_answer(g)] or [""]
        em.append(max(float(normalize_answer(p) == normalize_answer(g)) for g in kept))
        f.append(max(f1(p, g) for g in kept))
    n = max(len(em), 1)
    out = {"exact_match": sum(em) / n, "f1": sum(f) / n}
    for name, rows in (("HasAns", [i for i, g in enumerate(golds) if g]),
                       ("NoAns", [i for i, g in enumerate(golds) if not g])):
        if rows:
            out[f"{name}_exact_match"] = sum(em[i] for i in rows) / len(rows)
            out[f"{name}_f1"] = sum(f[i] for i in rows) / len(rows)
    return out


def squad_v2_file() -> str:
    """A SQuAD v2.0-format file made from the v1.1 dev file (v2.0 itself is not on this machine):
    every third question of a paragraph is swapped for the question at the same place in the next
    article and marked unanswerable (`is_impossible`, no answers). Easier to reject than v2.0's
    written adversarial questions, but the same format, labels, null-answer search and scoring:
    what the two pipelines are compared on. Built once into the toolkit's cache."""
    from toolkit.tasks import data_path

    source = json.loads(data_path("$TOOLKIT_DATA/squad/v1.1/dev-v1.1.json").read_text(encoding="utf-8"))
    cache = Path(os.environ.get("TOOLKIT_CACHE", Path.home() / ".cache" / "toolkit")) / "parity"
    target = cache / "squad-v2-from-dev-v1.1.json"
    if target.is_file():
        return str(target)
    articles = source["data"]
    for a, article in enumerate(articles):
        donor = [qa["question"] for p in articles[(a + 1) % len(articles)]["paragraphs"] for qa in p["qas"]]
        k = 0
        for paragraph in article["paragraphs"]:
            for j, qa in enumerate(paragraph["qas"]):
                if j % 3 == 2:
                    qa.update(question=donor[k % len(donor)], answers=[], is_impossible=True, id=qa["id"] + "-na")
                    k += 1
                else:
                    qa["is_impossible"] = False
    cache.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(f".{os.getpid()}.partial")
    tmp.write_text(json.dumps({"version": "v2.0", "data": articles}), encoding="utf-8")
    tmp.replace(target)
    return str(target)


def first_sentence(context: str) -> str:
    return re.split(r"(?<=[.!?])\s+", context.strip(), maxsplit=1)[0]


# --- reference: summarization and translation (run_summarization / run_translation) -----------
def bert_dropout(recipe: Any) -> dict:
    """The recipe's `model.dropout` as BERT's config names it (none: the checkpoint's own)."""
    p = recipe.model.dropout
    return {} if p is None else {"hidden_dropout_prob": p, "attention_probs_dropout_prob": p}


def encoder_decoder(path: str, tok: Any, **config: Any) -> Any:
    """BERT2BERT as transformers documents it: both halves from the encoder checkpoint, [CLS]
    starts decoding, [SEP] ends it. `config`: encoder_/decoder_-prefixed config values."""
    from transformers import EncoderDecoderModel

    model = EncoderDecoderModel.from_encoder_decoder_pretrained(path, path, **config)
    model.config.decoder_start_token_id = tok.cls_token_id
    model.config.eos_token_id, model.config.pad_token_id = tok.sep_token_id, tok.pad_token_id
    model.generation_config.decoder_start_token_id = tok.cls_token_id
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = tok.sep_token_id, tok.pad_token_id
    return model


def generation_kwargs(task: Any) -> dict:
    g = task.generation
    return {"num_beams": g.num_beams, "max_new_tokens": g.max_new_tokens, "length_penalty": g.length_penalty,
            "no_repeat_ngram_size": g.no_repeat_ngram_size, "do_sample": False, "early_stopping": g.num_beams > 1}


def seq2seq_trainer(recipe: Any, path: str, out: Path) -> tuple[Any, Any, Callable[[Any], Any], Any]:
    """(Seq2SeqTrainer ready to train, tokenizer, features(rows), the eval rows): sources
    truncated to max_length, targets to max_target_length, DataCollatorForSeq2Seq (labels -100)."""
    from datasets import Dataset
    from transformers import AutoTokenizer, DataCollatorForSeq2Seq, Seq2SeqTrainer, set_seed

    task = recipe.task
    train_rows, eval_rows = raw_splits(recipe)
    tok = AutoTokenizer.from_pretrained(path)
    set_seed(recipe.train.seed)
    model = encoder_decoder(path, tok, **{f"{half}_{k}": v for half in ("encoder", "decoder")
                                          for k, v in bert_dropout(recipe).items()})

    def features(rows: Any) -> Any:
        enc = tok(list(rows["source"]), truncation=True, max_length=task.max_length)
        labels = tok(text_target=list(rows["target"]), truncation=True, max_length=task.max_target_length)
        return Dataset.from_dict({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
                                  "labels": labels["input_ids"]})

    trainer = batched(in_order(Seq2SeqTrainer(
        model=model, args=training_arguments(recipe, out, seq2seq=True, predict_with_generate=True),
        train_dataset=features(train_rows), data_collator=DataCollatorForSeq2Seq(tok, model=model, label_pad_token_id=-100))),
        recipe, tok, train_rows)
    return trainer, tok, features, eval_rows


def reference_seq2seq(recipe: Any, path: str, out: Path) -> dict:
    """Seq2SeqTrainer with predict_with_generate (`seq2seq_trainer`), the recipe's generation
    settings, the teacher-forced loss per target token."""
    task = recipe.task
    trainer, tok, features, eval_rows = seq2seq_trainer(recipe, path, out)
    model = trainer.model
    result = trainer.train()
    test = features(eval_rows)

    def evaluate() -> tuple[list[str], dict[str, float]]:
        """Generation, the scorer and the teacher-forced loss: what the toolkit's evaluation
        timer covers (it computes the loss in the same pass as generation)."""
        ids = trainer.predict(test, **generation_kwargs(task)).predictions
        ids[ids < 0] = tok.pad_token_id
        preds = decode(tok, ids)
        refs = list(eval_rows["target"])
        scores = rouge_scores(preds, refs) if recipe.task.name == "summarization" else bleu_scores(preds, refs)
        scores["loss"] = seq2seq_loss(model, test, trainer.data_collator, trainer.args.per_device_eval_batch_size)
        return preds, scores

    (preds, metrics), seconds = timed(evaluate)
    return {"metrics": metrics, "train_samples_per_s": result.metrics["train_samples_per_second"],
            "eval_samples_per_s": len(preds) / seconds, "train_s": result.metrics["train_runtime"],
            "distinct_predictions": distinct(preds)}


def decode(tok: Any, ids: Any) -> list[str]:
    """Generated ids -> texts, as the toolkit decodes them: special tokens dropped and the
    tokenizer's spaces before punctuation and inside contractions cleaned up ("he's", not
    "he ' s"). Finding: transformers 5 leaves `clean_up_tokenization_spaces` off for MiniLM's
    tokenizer, so the reference's texts had a space around every mark and the table's word
    counts read longer on its side for the same tokens (10.6 against 8.8 words on one trained
    MiniLM2MiniLM's SAMSum summaries). ROUGE scores both spellings the same (rouge-score keeps
    letters and digits only); sacreBLEU's 13a tokenizer keeps an apostrophe inside a word, so
    BLEU could differ where outputs hold contractions."""
    return [t.strip() for t in tok.batch_decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=True)]


def summed_loss(model: Any, batch: dict, shifted: bool) -> tuple[float, int]:
    """(the batch's summed loss, its labelled tokens): the model's mean over the labelled tokens
    (after the causal shift when `shifted`) times their count. Summed over batches and divided by
    the total count, this is the loss per token the toolkit reports; Trainer's eval_loss averages
    the batches' means instead."""
    batch = {k: v.to(model.device) for k, v in batch.items()}  # the collator's CPU tensors, a GPU's model
    labels = batch["labels"][:, 1:] if shifted else batch["labels"]
    n = int((labels != -100).sum())
    return float(model(**batch).loss) * n, n


def seq2seq_loss(model: Any, test: Any, collate: Callable, size: int) -> float:
    """Teacher-forced loss per target token over the test set (the toolkit's eval loss)."""
    import torch

    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(test), size):
            loss, n = summed_loss(model, collate([test[j] for j in range(i, min(i + size, len(test)))]), shifted=False)
            total, count = total + loss, count + n
    return total / max(count, 1)


def rouge_scores(predictions: list[str], references: list[str]) -> dict[str, float]:
    """rouge-score F-measures with the Porter stemmer, averaged over examples; rougeLsum on one
    sentence per line (pysbd's segmentation: NLTK's punkt cannot be downloaded here)."""
    import pysbd
    from rouge_score import rouge_scorer

    seg = pysbd.Segmenter(language="en", clean=False)
    lines = lambda text: "\n".join(s.strip() for s in seg.segment(text) if s.strip())
    keys = ["rouge1", "rouge2", "rougeL", "rougeLsum"]
    scorer = rouge_scorer.RougeScorer(keys, use_stemmer=True)
    total = dict.fromkeys(keys, 0.0)
    for p, r in zip(predictions, references):
        plain = scorer.score(r, p)
        split = scorer.score(lines(r), lines(p))
        for k in keys:
            total[k] += (split if k == "rougeLsum" else plain)[k].fmeasure
    return {k: v / max(len(predictions), 1) for k, v in total.items()}


def bleu_scores(predictions: list[str], references: list[str]) -> dict[str, float]:
    import sacrebleu

    return {"bleu": sacrebleu.corpus_bleu(predictions, [references]).score,
            "chrf": sacrebleu.corpus_chrf(predictions, [references]).score}


# --- reference: language modelling (run_mlm / run_clm) -----------------------------------------
def grouped(tok: Any, texts: list[str], size: int, special: bool, end: list[int]) -> dict:
    """run_mlm / run_clm's group_texts: documents tokenised, concatenated, cut into blocks of
    `size` (the remainder dropped; a corpus shorter than one block is one shorter block)."""
    enc = tok(texts, add_special_tokens=special, return_special_tokens_mask=special)
    keys = ["input_ids"] + (["special_tokens_mask"] if special else [])
    flat = {k: [v for row in enc[k] for v in row + (end if k == "input_ids" else [0] * len(end))] for k in keys}
    total = len(flat["input_ids"])
    usable = (total // size) * size if total >= size else total
    return {k: [v[i:i + size] for i in range(0, usable, size)] for k, v in flat.items()}


def reference_lm(recipe: Any, path: str, out: Path) -> dict:
    """MLM: DataCollatorForLanguageModeling(mlm_probability) on blocks with [CLS]/[SEP] per
    document; CLM: blocks with <|endoftext|> after each document, labels = inputs. Perplexity
    = exp(Trainer.evaluate's eval_loss)."""
    from datasets import Dataset
    from transformers import (AutoModelForMaskedLM, AutoTokenizer, DataCollatorForLanguageModeling, Trainer,
                              default_data_collator, set_seed)

    task = recipe.task
    train_rows, eval_rows = raw_splits(recipe)
    tok = AutoTokenizer.from_pretrained(path)
    mlm = task.name == "mlm"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    set_seed(recipe.train.seed)
    model = AutoModelForMaskedLM.from_pretrained(path, **bert_dropout(recipe)) if mlm else causal_lm(path, recipe.model.dropout)
    end = [] if mlm else [tok.eos_token_id]
    size = task.block_length(tok)

    def blocks(rows: Any) -> Any:
        data = grouped(tok, list(rows["text"]), size, mlm, end)
        return Dataset.from_dict(data if mlm else {**data, "labels": data["input_ids"]})  # run_clm: labels = inputs

    # run_clm batches with default_data_collator: DataCollatorForLanguageModeling(mlm=False)
    # would drop the loss on <|endoftext|>, which is GPT-2's pad token here
    collator = DataCollatorForLanguageModeling(tok, mlm_probability=task.mlm_probability) if mlm else default_data_collator
    trainer = in_order(Trainer(model=model, args=training_arguments(recipe, out), train_dataset=blocks(train_rows),
                               data_collator=collator))
    result = trainer.train()
    if mlm:
        trainer.save_model(str(out / "model"))  # scored again on one mask set (side())
    heldout = blocks(eval_rows)
    evaluated, seconds = timed(lambda: trainer.evaluate(heldout))
    loss = evaluated["eval_loss"]
    return {"metrics": {"perplexity": math.exp(loss), "loss": loss},
            "train_samples_per_s": result.metrics["train_samples_per_second"],
            "eval_samples_per_s": len(eval_rows) / seconds, "train_s": result.metrics["train_runtime"]}


def one_mask_set_loss(model_dir: str, tokenizer: str, recipe: Any) -> float:
    """A trained masked LM's loss per masked token on the held-out blocks, under one mask set:
    run_mlm's blocks and DataCollatorForLanguageModeling's 80/10/10 masking, drawn from torch's
    generator seeded 0 whichever side trained the model. The two sides' own evaluations differ
    (the toolkit scores fixed masks per token, Trainer fresh masks and a mean of batch means), so
    this is the one number on which their models compare directly."""
    import torch
    from transformers import AutoModelForMaskedLM, AutoTokenizer, DataCollatorForLanguageModeling

    tok = AutoTokenizer.from_pretrained(tokenizer)
    model, info = AutoModelForMaskedLM.from_pretrained(model_dir, output_loading_info=True)
    if info["missing_keys"]:  # a head drawn at random here would score noise
        raise RuntimeError(f"{model_dir}: no trained weights for {sorted(info['missing_keys'])[:3]}")
    model.eval()
    blocks = grouped(tok, list(raw_splits(recipe)[1]["text"]), recipe.task.block_length(tok), True, [])
    rows = [{"input_ids": ids, "special_tokens_mask": sp} for ids, sp in zip(blocks["input_ids"], blocks["special_tokens_mask"])]
    collate = DataCollatorForLanguageModeling(tok, mlm_probability=recipe.task.mlm_probability)
    torch.manual_seed(0)
    batches = [collate(rows[i:i + 32]) for i in range(0, len(rows), 32)]  # the masks, drawn before any model runs
    total, count = 0.0, 0
    with torch.no_grad():
        for batch in batches:
            loss, n = summed_loss(model, batch, shifted=False)  # the collator took special_tokens_mask out
            total, count = total + loss, count + n
    return total / max(count, 1)


def causal_lm(path: str, dropout: float | None) -> Any:
    """GPT-2 for Trainer with `loss_type` named. Finding (transformers 5.24): a checkpoint whose
    config leaves loss_type unset (GPT-2's) makes Trainer count every label when it normalises
    the causal loss (`num_items_in_batch`), not the labels after the shift, so its eval loss is
    the true per-token loss x (L-1)/L: 10.48 for 10.82 at blocks of 32 (tests/test_parity.py)."""
    from transformers import AutoModelForCausalLM

    # GPT-2's config names for the recipe's model.dropout (None: the checkpoint's own)
    config = {} if dropout is None else dict.fromkeys(("resid_pdrop", "embd_pdrop", "attn_pdrop"), dropout)
    model = AutoModelForCausalLM.from_pretrained(path, **config)
    model.loss_type = "ForCausalLM"
    return model


# --- reference: decoder-only summarization (causal LM, prompt masked from the loss) ------------
def reference_gpt2(recipe: Any, path: str, out: Path) -> dict:
    """GPT-2 on prompt + ' ' + summary + <|endoftext|>, the prompt's labels -100 (the examples'
    instruction-tuning recipe); loss per target token over the test set; greedy generation from
    the prompt alone, left-padded."""
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, Trainer, set_seed

    task = recipe.task
    train_rows, eval_rows = raw_splits(recipe)
    tok = AutoTokenizer.from_pretrained(path)
    tok.pad_token = tok.eos_token
    set_seed(recipe.train.seed)
    model = causal_lm(path, recipe.model.dropout)
    prefix, suffix = task.affixes()

    def examples(rows: Any) -> list[dict]:
        out = []
        for r in rows.to_list():
            src = tok(prefix + task.source_text(r), truncation=True, max_length=task.max_length)["input_ids"]
            prompt = src + tok(suffix)["input_ids"]
            answer = tok(" " + task.target_text(r), truncation=True, max_length=task.max_target_length)["input_ids"]
            answer = answer + [tok.eos_token_id]
            out.append({"input_ids": prompt + answer, "labels": [-100] * len(prompt) + answer, "prompt": prompt})
        return out

    def collate(batch: list[dict]) -> dict:
        width = max(len(b["input_ids"]) for b in batch)
        pad = lambda xs, v: [x + [v] * (width - len(x)) for x in xs]
        return {"input_ids": torch.tensor(pad([b["input_ids"] for b in batch], tok.pad_token_id)),
                "attention_mask": torch.tensor(pad([[1] * len(b["input_ids"]) for b in batch], 0)),
                "labels": torch.tensor(pad([b["labels"] for b in batch], -100))}

    train_set = Dataset.from_list([{k: v for k, v in e.items() if k != "prompt"} for e in examples(train_rows)])
    trainer = Trainer(model=model, args=training_arguments(recipe, out, remove_unused_columns=False),
                      train_dataset=train_set, data_collator=collate)
    result = trainer.train()
    test = examples(eval_rows)
    def evaluate() -> tuple[float, list[str], dict[str, float]]:  # timed with its scorer, as the toolkit's is
        loss, preds = gpt2_evaluate(model, tok, test, collate, task, recipe)
        return loss, preds, rouge_scores(preds, list(eval_rows["target"]))

    (loss, preds, scores), seconds = timed(evaluate)
    return {"metrics": {"loss": loss, **scores},
            "train_samples_per_s": result.metrics["train_samples_per_second"],
            "eval_samples_per_s": len(test) / seconds, "train_s": result.metrics["train_runtime"],
            "distinct_predictions": distinct(preds)}


def gpt2_evaluate(model: Any, tok: Any, test: list[dict], collate: Callable, task: Any, recipe: Any) -> tuple[float, list[str]]:
    """(mean loss per target token, generated summaries) in batches of the eval batch size."""
    import torch

    model.eval()
    size = recipe.train.eval_batch_size or 2 * recipe.train.batch_size
    total, count, preds = 0.0, 0, []
    with torch.no_grad():
        for i in range(0, len(test), size):
            part = test[i:i + size]
            loss, n = summed_loss(model, collate(part), shifted=True)
            total, count = total + loss, count + n
            width = max(len(p["prompt"]) for p in part)
            ids = torch.tensor([[tok.pad_token_id] * (width - len(p["prompt"])) + p["prompt"] for p in part])
            mask = torch.tensor([[0] * (width - len(p["prompt"])) + [1] * len(p["prompt"]) for p in part])
            gen = model.generate(input_ids=ids.to(model.device), attention_mask=mask.to(model.device),
                                 pad_token_id=tok.pad_token_id,
                                 **generation_kwargs(task))
            preds += decode(tok, gen[:, width:])
    return total / max(count, 1), preds


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


# --- one side in this (fresh) process -----------------------------------------------------------
def side(args: argparse.Namespace) -> dict:
    path = checkpoint_path(SPECS[args.task].checkpoint, args.smoke)
    over = overrides(args.task, args.smoke, path, args.seed, args.full)
    cpu, wall = time.process_time(), time.perf_counter()
    spec, recipe = SPECS[args.task], resolved_recipe(args.task, over)
    with tempfile.TemporaryDirectory() as tmp:
        if args.side == "toolkit":
            row = toolkit_side(args.task, over, Path(tmp))
        else:
            row = REFERENCES[args.task](recipe, path, Path(tmp))
        if spec.rescore:  # both trained models, one scorer (each side saved its model under tmp)
            trained = next(Path(tmp).rglob("model/config.json")).parent
            row["metrics"].update(spec.rescore(str(trained), path, recipe))
    # CPU seconds of the whole side (loading, tokenising, training, evaluating): unlike samples/s,
    # barely moved by other processes sharing the cores
    if args.side == "reference":
        row["batches"] = BATCHES[0]
    return {"side": args.side, "seed": args.seed, **row, "peak_rss_mb": peak_rss_mb(),
            "cpu_s": time.process_time() - cpu, "wall_s": time.perf_counter() - wall, **gpu_memory()}


def gpu_memory() -> dict:
    """On a CUDA GPU: its name and the peak memory torch's allocator handed out in this process
    (both sides allocate through it); nothing on a CPU."""
    import torch

    if not torch.cuda.is_available():
        return {}
    return {"gpu": torch.cuda.get_device_name(), "peak_gpu_mb": torch.cuda.max_memory_allocated() / 2**20}


def run_side(task: str, which: str, seed: int, smoke: bool, full: bool = False) -> dict:
    """This script again, in a new process, for one side of one seed."""
    return finish_side(start_side(task, which, seed, smoke, full, threads=None), task, which, seed)


def start_side(task: str, which: str, seed: int, smoke: bool, full: bool, threads: int | None) -> subprocess.Popen:
    """Start one side of one seed in its own process; `threads` sets its OMP_NUM_THREADS (None:
    inherited), so that sides run at once share the cores evenly."""
    cmd = [sys.executable, __file__, task, "--side", which, "--seed", str(seed)]
    cmd += (["--smoke"] if smoke else []) + (["--full"] if full else []) + [f"--set={o}" for o in SET]
    cmd += [f"--reference-batches={BATCHES[0]}"]
    env = dict(os.environ, **({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)} if threads else {}))
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)


def finish_side(proc: subprocess.Popen, task: str, which: str, seed: int) -> dict:
    stdout, stderr = proc.communicate()
    found = [line for line in stdout.splitlines() if line.startswith("ROW ")]
    if proc.returncode or not found:
        raise RuntimeError(f"{task} {which} seed {seed} failed ({proc.returncode}):\n{stderr[-3000:]}")
    return json.loads(found[-1][4:])


# --- objectives: T5 span corruption and BART denoising against their papers' definitions ------
def objective_blocks(recipe_path: str, tokenizer: str, max_length: int) -> tuple[Any, Any, Any]:
    """(task, tokenizer, blocks) of WikiText-2 valid packed as the toolkit packs them."""
    from transformers import AutoTokenizer

    from toolkit import models
    from toolkit.recipe import find_recipe, load

    recipe = load(find_recipe(str(ROOT / recipe_path)), [f"task.max_length={max_length}", "train.seed=42"])
    tok = AutoTokenizer.from_pretrained(str(models.tokenizer_dir() / tokenizer))
    raw = recipe.task.load()["train"]
    return recipe.task, tok, recipe.task.pack(raw, tok)


def span_corruption_stats(examples: int, max_length: int = 128) -> dict:
    """Raffel et al. 2020 (T5), section 3.1.4: noise density 0.15, mean span length 3; each span
    -> one sentinel in the input, the target = the sentinels each followed by their span, </s>.
    Measured over `examples` corruptions (blocks reused with fresh generators)."""
    import numpy as np

    task, tok, blocks = objective_blocks("recipes/pretrain/wikitext-2/t5-base-span_corruption.yaml", "t5", max_length)
    sentinels = [tok.convert_tokens_to_ids(f"<extra_id_{i}>") for i in range(100)]
    noise = spans = tokens = 0
    layout_ok = reconstructs = longest_input = 0
    for i in range(examples):
        ids = blocks[i % len(blocks)]["input_ids"]
        out = task.corrupt({"input_ids": ids}, np.random.default_rng(i), tok)
        inp, tgt = out["input_ids"], out["labels"]
        in_sent = [t for t in inp if t in sentinels]
        tgt_sent = [t for t in tgt if t in sentinels]
        layout_ok += in_sent == sentinels[:len(in_sent)] and tgt_sent == in_sent and tgt[0] == sentinels[0] \
            and inp[-1] == tok.eos_token_id and tgt[-1] == tok.eos_token_id
        reconstructs += rebuild_span_corruption(inp[:-1], tgt[:-1], sentinels) == list(ids)
        tokens += len(ids)
        noise += len(tgt) - 1 - len(tgt_sent)
        spans += len(tgt_sent)
        longest_input = max(longest_input, len(inp))
    length = len(blocks[0]["input_ids"])
    expected_noise = min(max(round(length * 0.15), 1), length - 1)  # T5's rounding of 15% of a block
    return {"blocks": examples, "block_tokens": length, "noise_density (paper 0.15)": noise / tokens,
            "noise_density of T5's rounding": expected_noise / length,
            "mean_noise_span_length (paper 3)": noise / spans,
            "mean span length of T5's rounding": expected_noise / max(round(expected_noise / 3.0), 1), "sentinel_layout_ok": layout_ok / examples,
            "input_and_target_rebuild_block": reconstructs / examples, "longest_input": longest_input,
            "max_length": max_length}


def rebuild_span_corruption(inp: list[int], tgt: list[int], sentinels: list[int]) -> list[int]:
    """The original block from T5's input and target: each sentinel in the input replaced by the
    tokens that follow the same sentinel in the target."""
    spans: dict[int, list[int]] = {}
    current = None
    for t in tgt:
        if t in sentinels:
            current = spans.setdefault(t, [])
        elif current is not None:
            current.append(t)
    return [x for t in inp for x in (spans.get(t, []) if t in sentinels else [t])]


def denoise_stats(examples: int, max_length: int = 128) -> dict:
    """Lewis et al. 2020 (BART), section 2.2 / 5.1: 30% of the words masked in spans of
    Poisson(3) length, each span one <mask> (a 0-length span inserts one), sentences permuted;
    the target is the original block. Measured: the fraction of tokens the input lost to masks,
    <mask>s per masked token, and the target equal to <s> block </s>."""
    import numpy as np

    from toolkit.tasks.denoise import span_lengths

    task, tok, blocks = objective_blocks("recipes/pretrain/wikitext-2/bart-base-denoise.yaml", "bart-base", max_length)
    lost = tokens = masks = target_ok = same_multiset = 0
    for i in range(examples):
        block = blocks[i % len(blocks)]
        ids = block["input_ids"]
        out = task.corrupt({"input_ids": ids, "word_start": block["word_start"]}, np.random.default_rng(i), tok)
        inp = out["input_ids"][1:-1]
        kept = [t for t in inp if t != tok.mask_token_id]
        masks += len(inp) - len(kept)
        lost += len(ids) - len(kept)
        tokens += len(ids)
        target_ok += out["labels"] == [tok.bos_token_id, *ids, tok.eos_token_id]
        same_multiset += not (collections.Counter(kept) - collections.Counter(ids))
    lengths = np.concatenate([span_lengths(1000, np.random.default_rng(s)) for s in range(100)])
    return {"blocks": examples, "block_tokens": len(blocks[0]["input_ids"]),
            "masked_token_ratio (paper: 30% of words, spans may overlap)": lost / tokens,
            "masks_per_masked_token": masks / max(lost, 1), "target_is_original": target_ok / examples,
            "input_tokens_from_block": same_multiset / examples,
            "span_length_mean (paper: Poisson lambda 3)": float(lengths[:-1].mean()),
            "span_length_zero_share (Poisson(3): e^-3 = 0.0498)": float((lengths[:-1] == 0).mean())}


# --- in-context prompting on a generation task: batched against one at a time -----------------
def icl_check(path: str, examples: int = 8, shots: int = 2, batch_size: int = 4, smoke: bool = True) -> dict:
    """The toolkit's batched evaluation step of a decoder-only generation task with k
    demonstrations in every prompt (what method icl runs), against each example alone through
    the plain model: the same summed target loss and the same greedy continuation."""
    import torch
    from transformers import AutoModelForCausalLM

    from toolkit import models

    recipe = resolved_recipe("gpt2", overrides("gpt2", smoke, path, 42))
    task = recipe.task
    task.model_head("gpt2")
    train, rows = raw_splits(recipe)
    task.demonstrations = [(task.source_text(r), task.target_text(r)) for r in train.select(range(shots)).to_list()]
    tok = models.load_tokenizer(path)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    encoded = task.encode(rows.select(range(min(examples, len(rows)))), tok)
    collate = task.collator(tok, model)
    batched_loss, batched_gen, single_loss, single_gen = {}, {}, {}, {}
    with torch.no_grad():
        for i in range(0, len(encoded), batch_size):
            feats = [encoded[j] for j in range(i, min(i + batch_size, len(encoded)))]
            out = task.eval_step(model, collate(feats))
            for f, loss, gen in zip(feats, out["loss"].tolist(), out["generated"].tolist()):
                batched_loss[f["example_index"]] = loss
                batched_gen[f["example_index"]] = [t for t in gen if t != tok.pad_token_id]
        for f in (encoded[j] for j in range(len(encoded))):
            labels = torch.tensor([f["labels"]])
            n = int((labels[:, 1:] != -100).sum())
            single_loss[f["example_index"]] = float(model(input_ids=torch.tensor([f["input_ids"]]), labels=labels).loss) * n
            prompt = torch.tensor([f["prompt_ids"]])
            gen = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), pad_token_id=tok.pad_token_id,
                                 **generation_kwargs(task))[0, prompt.shape[1]:].tolist()
            single_gen[f["example_index"]] = [t for t in gen if t != tok.pad_token_id]
    keys = sorted(single_loss)
    rel = max(abs(batched_loss[k] - single_loss[k]) / max(abs(single_loss[k]), 1e-9) for k in keys)
    return {"examples": len(keys), "shots": shots, "batch_size": batch_size, "max_relative_loss_difference": rel,
            "same_generation": sum(batched_gen[k] == single_gen[k] for k in keys),
            "prompt_tokens_mean": statistics.mean(len(encoded[j]["prompt_ids"]) for j in range(len(encoded)))}


# --- tables -------------------------------------------------------------------------------------
def mean_std(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def paired(ours: list[float], theirs: list[float]) -> str:
    """Mean of the per-seed differences (toolkit - reference) ± their std, and the paired t."""
    diffs = [a - b for a, b in zip(ours, theirs)]
    if len(diffs) < 2:
        return f"{diffs[0]:+.2f} (1 seed)"
    sd, mean = statistics.stdev(diffs), statistics.mean(diffs)
    if not sd:  # no spread: t is undefined (0/0) or infinite, neither worth printing as a number
        same = "equal on every seed" if not mean else "the same difference on every seed"
        return f"{mean:+.2f} ± 0.00 ({same}, n = {len(diffs)})"
    t = mean / (sd / math.sqrt(len(diffs)))
    return f"{mean:+.2f} ± {sd:.2f} (t = {t:+.2f}, n = {len(diffs)})"


def table(columns: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows])


def render(task: str, result: dict) -> str:
    """The Markdown table of one task type: both sides, the paired difference, the baselines."""
    if task in ("objectives", "icl"):
        parts = result.items() if task == "objectives" else [("icl: batched against one at a time", result)]
        return "\n\n".join(f"**{name}**\n\n" + table(["measure", "value"], [[k, f"{v:.4g}" if isinstance(v, float) else v]
                                                                         for k, v in part.items()])
                           for name, part in parts)
    spec, rows = SPECS[task], result["rows"]
    seeds = sorted({r["seed"] for r in rows})
    by = {s: {r["seed"]: r for r in rows if r["side"] == s} for s in ("toolkit", "reference")}
    # on a GPU the CPU seconds say little: the whole side's wall time and the GPU's peak instead
    gpu = all("peak_gpu_mb" in r for r in rows)
    cols = ["side", *spec.metrics, "train samples/s", "eval samples/s",
            "wall s (whole side)" if gpu else "CPU s (whole side)", "peak GPU MB" if gpu else "peak RSS MB",
            "distinct outputs"]
    body = []
    for s, name in (("toolkit", "toolkit"), ("reference", "transformers (reference)")):
        got = [by[s][seed] for seed in seeds]
        body.append([name, *[mean_std([g["metrics"][m] * scale(m) for g in got]) for m in spec.metrics],
                     mean_std([g["train_samples_per_s"] for g in got]), mean_std([g["eval_samples_per_s"] for g in got]),
                     mean_std([g["wall_s"] for g in got]) if gpu else cpu_seconds(got, seeds),
                     f"{max(g['peak_gpu_mb' if gpu else 'peak_rss_mb'] for g in got):.0f}",
                     " ".join(g.get("distinct_predictions") or "" for g in got)])
    body.append(["paired difference", *[paired([by["toolkit"][x]["metrics"][m] * scale(m) for x in seeds],
                                               [by["reference"][x]["metrics"][m] * scale(m) for x in seeds])
                                        for m in spec.metrics], "", "", "", "", ""])
    for name, scores in result.get("baselines", {}).items():
        body.append([f"baseline: {name}", *[f"{scores[m] * scale(m):.2f}" if m in scores else "" for m in spec.metrics],
                     "", "", "", "", ""])
    budget = "smoke" if result["smoke"] else "the recipe's own protocol" if result.get("full") else spec.budget
    if result.get("set"):
        budget += "; then --set " + ", ".join(result["set"])  # overrides what the budget says
    if result.get("reference_batches") == "toolkit":
        budget += "; the reference trained on the toolkit's batches, in its order"
    if gpu:
        budget += f", on one {rows[0]['gpu']}"
    head = f"**{task}** ({budget}; seeds {', '.join(map(str, seeds))})"
    return head + "\n\n" + table(cols, body)


def cpu_seconds(got: list[dict], seeds: list[int]) -> str:
    """Mean ± std of the CPU seconds of the seeds that recorded them (rows measured before the
    column existed have none; those measured say which seeds they are)."""
    have = [(s, g["cpu_s"]) for s, g in zip(seeds, got) if "cpu_s" in g]
    if not have:
        return ""
    text = mean_std([c for _, c in have])
    return text if len(have) == len(got) else f"{text} (seed {', '.join(str(s) for s, _ in have)})"


def scale(metric: str) -> float:
    """ROUGE and SQuAD's EM / F1 are fractions on both sides; shown in percent like BLEU."""
    return 100.0 if metric.startswith("rouge") or metric.endswith(("f1", "exact_match")) else 1.0


def compare(task: str, seeds: list[int], smoke: bool, full: bool = False, together: bool = False,
            sides: tuple[str, ...] = ("toolkit", "reference")) -> dict:
    """Both sides for every seed (toolkit first, each in its own process; `together`: the two
    sides of a seed at once, each on half the cores) and the baselines; `sides`: only those
    (`--only`, to pair with another run's other side by `--merge SIDE:FILE`)."""
    if task == "objectives":
        n = 200 if smoke else 10_000
        return {"span_corruption (T5)": span_corruption_stats(n), "denoise (BART)": denoise_stats(n)}
    if task == "icl":
        return icl_check(checkpoint_path(GPT2, smoke), examples=8 if smoke else 32, smoke=smoke)
    # the recipe both sides will resolve, checked here: a bad --set is one line, not two tracebacks
    recipe = resolved_recipe(task, overrides(task, smoke, checkpoint_path(SPECS[task].checkpoint, smoke), seeds[0], full))
    rows = []
    for seed in seeds:
        if together and len(sides) == 2:  # both sides of the seed at once, each on half the cores: the same load for both
            threads = max(1, (os.cpu_count() or 2) // 2)
            procs = {w: start_side(task, w, seed, smoke, full, threads) for w in ("toolkit", "reference")}
            got = [(w, finish_side(p, task, w, seed)) for w, p in procs.items()]
        else:  # one after the other, each with every core
            got = [(w, run_side(task, w, seed, smoke, full)) for w in sides]
        for which, row in got:
            row["together"] = together
            rows.append(row)
            print(f"{task} seed {seed} {which}: {row['metrics']}", file=sys.stderr, flush=True)
    return {"smoke": smoke, "full": full, "set": list(SET), "reference_batches": BATCHES[0], "rows": rows,
            "baselines": baselines(task, recipe)}


def merge(task: str, files: list[str]) -> dict:
    """One result from several runs' --json files of `task`: their rows together (each seed once),
    the first file's baselines. The runs must share the budget (smoke, real or full, --set). A
    file named `SIDE:FILE` gives only that side's rows (`--only` runs, or one side of a run paired
    with the other side of another); the reference rows must share their batches
    (`--reference-batches`)."""
    parts = []
    for name in files:
        only, _, rest = name.partition(":")
        only, f = (only, Path(rest)) if only in ("toolkit", "reference") and rest else (None, Path(name))
        try:
            part = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"--merge: {f}: not a readable --json result ({type(err).__name__})") from None
        if not isinstance(part, dict) or not isinstance(part.get("rows"), list) or not part["rows"]:
            raise ValueError(f"--merge: {f}: no 'rows' (is it the --json of a `{task}` run?)")
        missing = [m for m in SPECS[task].metrics if m not in part["rows"][0].get("metrics", {})]
        if missing:
            raise ValueError(f"--merge: {f}: its rows lack {', '.join(missing)}: not a `{task}` result")
        rows = [r for r in part["rows"] if only in (None, r.get("side"))]
        if not rows:
            raise ValueError(f"--merge: {f}: no {only} rows")
        parts.append((f, part, rows))
    budget = {(bool(p.get("smoke")), bool(p.get("full")), tuple(p.get("set", []))) for _, p, _ in parts}
    if len(budget) > 1:
        raise ValueError("--merge: the files ran different budgets (smoke, real, full, --set); merge runs of one budget")
    batches = {p.get("reference_batches", "trainer") for _, p, rows in parts if any(r["side"] == "reference" for r in rows)}
    if len(batches) > 1:
        raise ValueError("--merge: the reference rows trained on different batches (--reference-batches); "
                         "merge reference rows of one kind")
    seen: dict[tuple, Path] = {}
    for f, _, rows in parts:
        for row in rows:
            key = (row["side"], row["seed"])
            if key in seen:
                raise ValueError(f"--merge: seed {row['seed']} ({row['side']}) is in both {seen[key]} and {f}")
            seen[key] = f
    unpaired = sorted({seed for side, seed in seen if (("reference" if side == "toolkit" else "toolkit"), seed) not in seen})
    if unpaired:
        raise ValueError(f"--merge: seed {unpaired[0]} has one side only; give each seed both sides")
    first = parts[0][1]
    return {"smoke": first.get("smoke", False), "full": first.get("full", False), "set": first.get("set", []),
            "reference_batches": batches.pop() if batches else "trainer",
            "rows": [row for _, _, rows in parts for row in rows], "baselines": first.get("baselines", {})}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("task", choices=[*SPECS, "objectives", "icl"])
    parser.add_argument("--seeds", default=SEED_LIST, help="comma-separated training seeds")
    parser.add_argument("--smoke", action="store_true", help="tiny random models and a few examples: seconds")
    parser.add_argument("--full", action="store_true",
                        help="the shipped recipe's own protocol, no budget overrides (for a GPU)")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--together", action="store_true",
                        help="run a seed's two sides at once, each on half the cores (same load on both)")
    parser.add_argument("--merge", nargs="+", metavar="JSON",
                        help="run nothing: one table from the --json files of earlier runs of this task "
                             "(seeds run in separate calls or on separate machines); SIDE:JSON takes one side's rows")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a recipe override for both sides after the budget's (e.g. train.epochs=2); repeatable")
    parser.add_argument("--reference-batches", choices=["trainer", "toolkit"], default="trainer",
                        help="trainer: the reference trains on Trainer's own sampler (the recipe's grouping); "
                             f"toolkit: on the toolkit's very batches, in its order ({', '.join(BATCHABLE)})")
    parser.add_argument("--only", choices=["toolkit", "reference"],
                        help="run this side alone (pair it with another run's other side: --merge SIDE:FILE)")
    parser.add_argument("--side", choices=["toolkit", "reference"], help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=42, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    bad = [o for o in args.set if "=" not in o or o.startswith(("model.checkpoint=", "train.seed="))]
    if bad:
        print(f"error: --set: '{bad[0]}' is not a KEY=VALUE recipe override (the checkpoint and the "
              "seed are the harness's: use --seeds)", file=sys.stderr)
        return 2
    if args.set and (args.merge or args.task not in SPECS):
        print(f"error: --set: {'--merge runs nothing' if args.merge else f'{args.task} trains nothing'}, "
              "so there is no recipe to override", file=sys.stderr)
        return 2
    if args.reference_batches == "toolkit" and args.task not in BATCHABLE:
        print(f"error: --reference-batches toolkit: {args.task}'s reference is not wired to the toolkit's batches; "
              f"use it with {', '.join(BATCHABLE)}", file=sys.stderr)
        return 2
    if args.reference_batches == "toolkit" and (args.merge or args.only == "toolkit"):
        print("error: --reference-batches toolkit: " + ("--merge trains nothing (its files say whose batches)"
                                                        if args.merge else "--only toolkit trains no reference"),
              file=sys.stderr)
        return 2
    if args.only and (args.merge or args.together):
        print(f"error: --only: {'--merge runs nothing' if args.merge else '--together runs both sides at once'}; "
              "drop one of the two", file=sys.stderr)
        return 2
    SET[:], BATCHES[:] = args.set, [args.reference_batches]
    if args.side:
        print("ROW " + json.dumps(side(args)), flush=True)
        return 0
    from toolkit.errors import UserError

    try:
        result = merge(args.task, args.merge) if args.merge else \
            compare(args.task, parse_seeds(args.seeds), args.smoke, args.full, args.together,
                    (args.only,) if args.only else ("toolkit", "reference"))
    except (ValueError, UserError) as err:  # a bad --merge / --seeds, or a recipe --set makes invalid
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    if args.only:
        print("\n".join(f"{args.task} seed {r['seed']} {r['side']}: {r['metrics']}" for r in result["rows"]))
        return 0
    print(render(args.task, result))
    return 0


def parse_seeds(text: str) -> list[int]:
    try:
        return [int(s) for s in text.split(",") if s.strip()] or [42]
    except ValueError:
        raise ValueError(f"--seeds: '{text}' is not a comma-separated list of integers") from None


if __name__ == "__main__":
    sys.exit(main())
