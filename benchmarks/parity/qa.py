"""Extractive QA's reference (run_qa's recipe) and the official SQuAD v1.1 / v2.0 scoring,
written out; the v2.0-format file made from the v1.1 dev set."""

from __future__ import annotations

import collections
import json
import math
import os
import re
import string
from pathlib import Path
from typing import Any

from parity.common import (batched, bert_dropout, distinct, in_order, raw_splits, reference_attention, timed,
                           training_arguments)


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
    model = AutoModelForQuestionAnswering.from_pretrained(path, **bert_dropout(recipe), **reference_attention(recipe))
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
