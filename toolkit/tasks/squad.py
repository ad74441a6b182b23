"""SQuAD v1.1 and v2.0: extractive QA (any model with a QA head) or generative QA (text-to-text).

`mode: auto` picks extractive for encoders (BERT, RoBERTa, MiniLM) and generative for decoders
and encoder-decoders (`question: ... context: ...` -> answer text). Both are scored with the
official exact match and F1; v2.0 adds HasAns/NoAns breakdowns. Extractive v2.0 answers "" when
the null score beats the best span (null-score gap > 0.0, transformers' run_qa default):
`exact_match` and `f1` are at that fixed threshold. The official script's `best_exact`, `best_f1`
and their `*_thresh` are reported beside them: thresholds tuned on the eval split itself, so an
upper bound, never a held-out score.

Data: the Hub (`rajpurkar/squad`, `rajpurkar/squad_v2`) or local SQuAD-format JSON. With only a
dev file (as here), `split_articles` trains on that fraction of its articles (seeded shuffle) and
scores on the rest: no article, hence no context, is on both sides.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from toolkit import readers
from toolkit.errors import UserError
from toolkit.lazy import lazy
from toolkit.tasks import TASKS, Metric, data_path, declaration, hub_offline, subset
from toolkit.tasks._generation import Generation, TextToText
from toolkit.tasks._qa import WindowCollator, best_spans, window_features
from toolkit.tasks._text_metrics import (best_null_threshold, best_over, exact_match, squad_scores,
                                         token_f1, v2_golds)
from toolkit.models import kind_of

torch = lazy("torch", globals())

NULL_THRESHOLD = 0.0  # answer "" when null score - best span score > this (run_qa's default)
F = lazy("torch.nn.functional", globals())

NO_ANSWER = "unanswerable"  # a generative model's target for a v2.0 question without an answer
QA_KEYS = ("offsets", "start_positions", "end_positions", "example_index", "labels")
HUB_IDS = {"v1": "rajpurkar/squad", "v2": "rajpurkar/squad_v2"}


def read_squad(path_text: str) -> list[dict]:
    """A SQuAD-format JSON file -> rows in the Hub's schema plus `article` (its index), read by
    the shared reader (datasets' json builder, `field: data`). A wrong type, a missing field or
    an answer whose offset does not match its context is one error naming file and line."""
    path = data_path(path_text)
    if not path.is_file():
        raise UserError(f"{path}: no such file (a SQuAD-format JSON file)")
    readers.file_format(path, ("json",))
    try:
        articles = readers.read(path, "json", field="data")
    except readers.Unreadable:  # mixed types the builder cannot type: find the record in Python
        data = json.loads(readers.read_small_text(path))["data"]
        _rows(data, _Where(path))
        raise
    return _rows(articles, _Where(path))


class _Where:
    """FILE:LINE of a place in the file, found (by re-reading it) only when there is an error."""

    def __init__(self, path: Any) -> None:
        self.path = path

    def __call__(self, *keys: Any) -> str:
        try:
            return f"{self.path}:{readers.json_line(readers.read_small_text(self.path), ['data', *keys])}"
        except Exception:  # a position is a courtesy: the message still names the record
            return f"{self.path}: data/{'/'.join(map(str, keys))}"


def _need(value: Any, kind: type, where: Any, what: str) -> Any:
    if value is None:
        raise UserError(f"{where()}: {what} is missing")
    if not isinstance(value, kind) or isinstance(value, bool) != (kind is bool):
        names = {str: "text", list: "a list", dict: "an object", int: "a whole number", bool: "true/false"}
        raise UserError(f"{where()}: {what} is {readers.json_type(value)}, expected {names[kind]}")
    return value


def _rows(articles: Any, at: _Where) -> list[dict]:
    rows = []
    for a, article in enumerate(articles):
        _need(article, dict, lambda: at(a), f"article {a}")
        title = article.get("title") or ""
        for p, paragraph in enumerate(_need(article.get("paragraphs"), list, lambda: at(a), "'paragraphs'")):
            place = lambda *k: (lambda: at(a, "paragraphs", p, *k))
            _need(paragraph, dict, place(), "a paragraph")
            context = _need(paragraph.get("context"), str, place(), "'context'")
            for q, qa in enumerate(_need(paragraph.get("qas"), list, place(), "'qas'")):
                _need(qa, dict, place("qas", q), "a question")
                named = lambda: f"{at(a, 'paragraphs', p, 'qas', q)}: article {a} ('{title}'), question {qa.get('id')}"
                rows.append(_row(qa, context, str(title), a, named))
    if not rows:
        raise UserError(f"{at.path}: no questions found")
    return rows


def _row(qa: dict, context: str, title: str, article: int, where: Any) -> dict:
    question = _need(qa.get("question"), str, where, "'question'")
    if qa.get("id") is None:
        raise UserError(f"{where()}: 'id' is missing")
    if not context.strip() or not question.strip():
        raise UserError(f"{where()}: empty context or question")
    impossible = qa.get("is_impossible")
    if impossible is not None:
        _need(impossible, bool, where, "'is_impossible'")
    texts, starts = [], []
    for ans in [] if impossible else _need(qa.get("answers", []), list, where, "'answers'"):
        _need(ans, dict, where, "an answer")
        text = _need(ans.get("text"), str, where, "an answer's 'text'")
        start = _need(ans.get("answer_start"), int, where, "an answer's 'answer_start'")
        if not text or context[start:start + len(text)] != text:
            raise UserError(f"{where()}: answer {text!r} at answer_start {start} does not match the "
                            f"context there ({context[max(start, 0):max(start, 0) + len(text)]!r}); "
                            "fix answer_start")
        texts.append(text)
        starts.append(start)
    return {"id": str(qa["id"]), "title": title, "context": context, "question": question,
            "answers": {"text": texts, "answer_start": starts}, "article": article}


def split_by_article(rows: list[dict], fraction: float, seed: int) -> tuple[list[dict], list[dict]]:
    """round(fraction * articles) articles train, the rest evaluate (seeded shuffle of articles)."""
    articles = sorted({r["article"] for r in rows})
    random.Random(seed).shuffle(articles)
    n = round(fraction * len(articles))
    if n < 1 or n >= len(articles):
        raise UserError(f"task.split_articles: {fraction} of {len(articles)} articles leaves no "
                        "article on one side")
    train = set(articles[:n])
    return [r for r in rows if r["article"] in train], [r for r in rows if r["article"] not in train]


@TASKS.register("squad")
@dataclass(kw_only=True)
class Squad(TextToText):

    version: Literal["v1", "v2"] = "v1"
    mode: Literal["auto", "extractive", "generative"] = "auto"
    max_length: int = field(default=384, metadata={"min": 32})
    doc_stride: int = field(default=128, metadata={"min": 0})
    max_answer_length: int = field(default=30, metadata={"min": 1})
    n_best: int = field(default=20, metadata={"min": 1})
    max_target_length: int = field(default=32, metadata={"min": 1})
    train_file: str | None = None  # SQuAD-format JSON; None: the Hub
    eval_file: str | None = None
    split_articles: float | None = field(default=None, metadata={"min": 0.0, "max": 1.0})
    split_seed: int = 0
    generation: Generation = field(default_factory=lambda: Generation(max_new_tokens=32))

    def check(self) -> None:
        if self.doc_stride >= self.max_length // 2:
            raise UserError(f"task.doc_stride: {self.doc_stride} must be below half of task.max_length "
                            f"({self.max_length}) so windows move forward")
        if self.split_articles is not None and (self.train_file or not self.eval_file):
            raise UserError("task.split_articles: splits task.eval_file by article; set eval_file "
                            "and leave train_file unset")

    def declared_metrics(self) -> list[Metric]:
        names = ["f1", "exact_match"]
        if self.version == "v2":
            names += ["HasAns_exact_match", "HasAns_f1", "NoAns_exact_match", "NoAns_f1"]
        out = [Metric(n, True, 100.0) if n.startswith(("HasAns", "NoAns")) else declaration(n) for n in names]
        if self.version == "v2":  # extractive runs only (generative v2 answers "" or not by itself)
            out += [Metric("best_exact", True, 100.0), Metric("best_f1", True, 100.0),
                    Metric("best_exact_thresh", True, 1.0), Metric("best_f1_thresh", True, 1.0)]
        return out

    def model_head(self, family: str | None) -> str:
        kind = kind_of(family) if family and family != "encoder-decoder" else family
        self._extractive = self.mode == "extractive" or (self.mode == "auto" and kind == "encoder")
        return "question-answering" if self._extractive else super().model_head(family)

    @property
    def extractive(self) -> bool:
        return getattr(self, "_extractive", False)

    # --- data --------------------------------------------------------------------------------
    def load(self) -> dict[str, Any]:
        from datasets import Dataset

        if self.eval_file:
            evaluation = read_squad(self.expand(self.eval_file))
            train = read_squad(self.expand(self.train_file)) if self.train_file else None
            if self.split_articles is not None:
                train, evaluation = split_by_article(evaluation, self.split_articles, self.split_seed)
            train, evaluation = (Dataset.from_list(train) if train else None), Dataset.from_list(evaluation)
        else:
            train, evaluation = self._hub()
        return {"train": subset(train, self.max_train_samples),
                "eval": {"": subset(evaluation, self.max_eval_samples)}}

    def _hub(self) -> tuple[Any, Any]:
        if hub_offline():
            raise UserError(f"task.eval_file: {HUB_IDS[self.version]} comes from the Hub, which is "
                            "off-line (HF_HUB_OFFLINE=1); set task.eval_file (and train_file or "
                            "split_articles) to a local SQuAD JSON file")
        from datasets import load_dataset

        ds = load_dataset(HUB_IDS[self.version])
        return ds["train"], ds["validation"]

    # --- generative: what the text-to-text base needs -------------------------------------------
    def source_text(self, row: dict) -> str:
        return f"question: {row['question']} context: {row['context']}"

    def target_text(self, row: dict) -> str:
        return row["answers"]["text"][0] if row["answers"]["text"] else NO_ANSWER

    def default_affixes(self, family: str | None, decoder_only: bool) -> tuple[str, str]:
        return ("", "\nanswer:") if decoder_only else ("", "")

    def references(self, raw: Any) -> list[list[str]]:
        return [list(a["text"]) or [""] for a in raw["answers"]]

    # --- extractive: windows, span loss, post-processing ----------------------------------------
    def encode(self, dataset: Any, tokenizer: Any) -> Any:
        if not self.extractive:
            return super().encode(dataset, tokenizer)
        from datasets import Dataset

        self._tokenizer = tokenizer
        feats = window_features(tokenizer, list(dataset["question"]), list(dataset["context"]), list(dataset["answers"]),
                                self.max_length, self.doc_stride)
        return Dataset.from_dict(feats)

    def collator(self, tokenizer: Any, model: Any = None) -> Any:
        return WindowCollator(tokenizer) if self.extractive else super().collator(tokenizer, model)

    def model_inputs(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if not self.extractive:
            return super().model_inputs(batch)
        return {k: v for k, v in batch.items() if k not in QA_KEYS}

    def units(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if not self.extractive:
            return super().units(batch)
        return torch.ones(batch["input_ids"].shape[0], device=batch["input_ids"].device)

    def _logits(self, outputs: Any, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        t = batch["input_ids"].shape[1]  # PEFT soft prompts prepend virtual positions: keep the last t
        return outputs.start_logits[:, -t:].float(), outputs.end_logits[:, -t:].float()

    def loss(self, outputs: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """(b,) mean of the start and end cross-entropies of each window (run_qa.py's loss)."""
        if not self.extractive:
            return super().loss(outputs, batch)
        start, end = self._logits(outputs, batch)
        return (F.cross_entropy(start, batch["start_positions"], reduction="none")
                + F.cross_entropy(end, batch["end_positions"], reduction="none")) / 2

    def eval_step(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if not self.extractive:
            return super().eval_step(model, batch)
        outputs = model(**self.model_inputs(batch))
        start, end = self._logits(outputs, batch)
        return {"loss": self.loss(outputs, batch), "units": self.units(batch), "start_logits": start,
                "end_logits": end, "offsets": batch["offsets"], "example_index": batch["example_index"]}

    def eval_pad(self, key: str) -> float:
        return -1 if key == "offsets" else -100

    def answers(self, outputs: dict[str, np.ndarray], raw: Any) -> tuple[list[str], dict[str, float]]:
        """Predicted answer texts in raw order, and the extra metrics (v2.0's threshold)."""
        if not self.extractive:
            preds = ["" if p == NO_ANSWER else p for p in self.decoded(outputs)]
            return preds, {}
        bests = best_spans(outputs["start_logits"], outputs["end_logits"], outputs["offsets"],
                           outputs["example_index"], list(raw["context"]), self.n_best, self.max_answer_length)
        if self.version == "v1":
            return [b.text for b in bests], {}
        gaps = [b.null_score - b.score for b in bests]
        preds = ["" if gap > NULL_THRESHOLD else b.text for b, gap in zip(bests, gaps)]
        listed = [[] if g == [""] else g for g in self.references(raw)]
        golds = [v2_golds(g) for g in listed]
        extra = {}
        for name, metric in (("exact", exact_match), ("f1", token_f1)):
            scores = [best_over(metric, b.text, g) for b, g in zip(bests, golds)]
            # answerable as the file lists it (the official script's qid_to_has_ans), see squad_scores
            best, threshold = best_null_threshold(scores, gaps, [bool(g) for g in listed], [bool(b.text) for b in bests])
            extra[f"best_{name}"], extra[f"best_{name}_thresh"] = best, threshold
        return preds, extra

    def score(self, outputs: dict[str, np.ndarray], raw: Any) -> dict[str, float]:
        preds, extra = self.answers(outputs, raw)
        golds = [[] if g == [""] else g for g in self.references(raw)]
        return {**squad_scores(preds, golds, self.version), **extra}

    def predictions(self, outputs: dict[str, np.ndarray], raw: Any) -> list[dict] | None:
        preds, _ = self.answers(outputs, raw)
        return [{"id": r["id"], "source": r["question"], "references": list(r["answers"]["text"]),
                 "prediction": p} for r, p in zip(raw.to_list(), preds)]

    # --- prediction on new inputs (`toolkit predict`, the API's predict) -------------------------
    def predict_fields(self, model: Any) -> list[str]:
        """A question and the context to answer it from, in either mode."""
        return ["question", "context"]

    def raw_input(self, row: dict) -> dict:
        return {"question": str(row["question"]), "context": str(row["context"]),
                "answers": {"text": [], "answer_start": []}}

    def predict(self, model: Any, tokenizer: Any, rows: list[dict]) -> list[dict]:
        """Per row its question and context and the answer (`prediction`), as evaluation finds it:
        the best span over the context's windows, or generated text. v2.0 extractive runs add
        `no_answer_probability` and answer "" where it is above 1/2 (the null score beats the
        best span: the threshold the scores use); a generative v2.0 model answers "" itself."""
        if not self.extractive:
            out = super().predict(model, tokenizer, rows)
            return [{**r, "prediction": "" if r["prediction"] == NO_ANSWER else r["prediction"]} for r in out]
        raw = [self.raw_input(r) for r in rows]
        bests = self.best_answers(model, tokenizer, raw)
        out = []
        for r, b in zip(raw, bests):
            row = {"question": r["question"], "context": r["context"], "prediction": b.text}
            if self.version == "v2":
                row["no_answer_probability"] = no_answer_probability(b)
                row["prediction"] = "" if b.null_score - b.score > NULL_THRESHOLD else b.text
            out.append(row)
        return out

    def best_answers(self, model: Any, tokenizer: Any, raw: list[dict], batch_size: int = 32) -> list[Any]:
        """The best span of each raw row over its windows (windowed and searched as in evaluation)."""
        feats = window_features(tokenizer, [r["question"] for r in raw], [r["context"] for r in raw],
                                [r["answers"] for r in raw], self.max_length, self.doc_stride)
        batch = WindowCollator(tokenizer)([{k: feats[k][i] for k in feats} for i in range(len(feats["input_ids"]))])
        device, starts, ends = next(model.parameters()).device, [], []
        for first in range(0, len(batch["input_ids"]), batch_size):
            part = {k: v[first:first + batch_size].to(device) for k, v in batch.items()}
            with torch.no_grad():
                start, end = self._logits(model(**self.model_inputs(part)), part)  # (b, t) each
            starts.append(start.cpu().numpy())
            ends.append(end.cpu().numpy())
        return best_spans(np.concatenate(starts), np.concatenate(ends), batch["offsets"].numpy(),
                          batch["example_index"].numpy(), [r["context"] for r in raw], self.n_best,
                          self.max_answer_length)


def no_answer_probability(best: Any) -> float:
    """P(no answer) from the two scores the v2.0 decision compares: a softmax over the null
    score and the best span's score, sigmoid(null - span), so above 1/2 exactly where the
    null-score gap passes NULL_THRESHOLD (0). The field name is the one Hugging Face `evaluate`'s
    squad_v2 reads."""
    gap = best.null_score - best.score
    return 1.0 if gap == np.inf else float(1.0 / (1.0 + np.exp(-np.clip(gap, -50.0, 50.0))))
