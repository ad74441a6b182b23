"""`ner`: named-entity recognition as token classification (CoNLL-2003 by default).

Files hold one `token TAG` per line (BIO tags), a blank line between sentences (`-DOCSTART-`
lines are skipped). As transformers' run_ner does, each word's tag is learnt on its first
sub-token and the other sub-tokens are left out of loss and scoring (-100). Scores are entity-level
precision, recall and F1 as seqeval computes them (an entity counts when its type and span both
match; the default, conlleval-compatible mode), plus token accuracy.

The task declares its own head (`token-classification`) and its prediction path (tags per word),
so neither the model loader nor `toolkit predict` knows it by name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from toolkit import heads, readers
from toolkit.errors import UserError
from toolkit.lazy import lazy
from toolkit.tasks import TASKS, Metric, Task, fingerprint, subset

torch = lazy("torch", globals())
F = lazy("torch.nn.functional", globals())

TOKEN_CLASSIFICATION = heads.declare("token-classification", heads.Head(
    "AutoModelForTokenClassification", "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES", "TOKEN_CLS"))
# CoNLL-2003's tags in the order of the Hub's conll2003 data set (its ClassLabel ids)
CONLL_TAGS = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]
IGNORE = -100


def read_conll(path: Path, labels: list[str]) -> dict[str, list]:
    """{'tokens': [[word, ...]], 'tags': [[id, ...]]}: one entry per sentence of a `token TAG` file.
    The shared reader's byte scan checks it first (there, size limit, gzip, UTF-8 by line)."""
    readers.scan(path)
    tokens: list[list[str]] = []
    tags: list[list[int]] = []
    words: list[str] = []
    ids: list[int] = []
    index = {tag: i for i, tag in enumerate(labels)}
    with readers.open_text(path) as handle:
        lines = list(handle)  # the sentences are kept anyway: the text is no larger
    for number, line in enumerate(lines + [""], start=1):
        parts = line.split()
        if not parts or parts[0] == "-DOCSTART-":
            if words:
                tokens.append(words)
                tags.append(ids)
            words, ids = [], []
            continue
        if len(parts) < 2:
            raise UserError(f"{path}:{number}: expected 'token TAG', got {line.strip()!r}")
        if parts[-1] not in index:
            raise UserError(f"{path}:{number}: tag '{parts[-1]}' is not one of task.labels ({', '.join(labels)})")
        words.append(parts[0])
        ids.append(index[parts[-1]])
    if not tokens:
        raise UserError(f"{path}: holds no sentences")
    return {"tokens": tokens, "tags": tags}


def align_labels(word_ids: list[int | None], tags: list[int]) -> list[int]:
    """Each word's tag on its first sub-token; -100 on the rest and on special tokens (run_ner's
    default, `label_all_tokens` off)."""
    out, previous = [], None
    for word in word_ids:
        out.append(IGNORE if word is None or word == previous else tags[word])
        previous = word
    return out


def entity_scores(true: list[list[str]], pred: list[list[str]]) -> dict[str, float]:
    """seqeval's entity-level precision, recall and F1 (default mode) and token accuracy."""
    from seqeval.metrics import accuracy_score, f1_score, precision_score, recall_score

    return {"f1": float(f1_score(true, pred, zero_division=0)),
            "precision": float(precision_score(true, pred, zero_division=0)),
            "recall": float(recall_score(true, pred, zero_division=0)),
            "accuracy": float(accuracy_score(true, pred))}


@TASKS.register("ner")
@dataclass(kw_only=True)
class Ner(Task):
    head = TOKEN_CLASSIFICATION

    train_file: str | None = "$TOOLKIT_DATA/ner/conll2003/train.txt"
    eval_file: str = "$TOOLKIT_DATA/ner/conll2003/valid.txt"
    labels: list[str] = field(default_factory=lambda: list(CONLL_TAGS))  # BIO tags, in id order

    def check(self) -> None:
        if len(set(self.labels)) != len(self.labels) or "O" not in self.labels:
            raise UserError(f"task.labels: BIO tags, each once and 'O' among them (got {', '.join(self.labels)})")

    @property
    def label_names(self) -> list[str]:
        return list(self.labels)

    def declared_metrics(self) -> list[Metric]:
        return [Metric("f1", True, 100.0), Metric("precision", True, 100.0), Metric("recall", True, 100.0),
                Metric("accuracy", True, 100.0)]

    def head_kwargs(self) -> dict[str, Any]:
        return {"num_labels": len(self.labels), "id2label": dict(enumerate(self.labels)),
                "label2id": {n: i for i, n in enumerate(self.labels)}}

    # --- data ----------------------------------------------------------------------------------
    def data_files(self) -> list[Path]:
        return [Path(self.expand(f)) for f in (self.train_file, self.eval_file) if f]

    def load(self) -> dict[str, Any]:
        from datasets import Dataset

        def read(file: str | None, n: int | None) -> Any:
            return None if file is None else subset(Dataset.from_dict(read_conll(Path(self.expand(file)), self.labels)), n)

        return {"train": read(self.train_file, self.max_train_samples),
                "eval": {"": read(self.eval_file, self.max_eval_samples)}}

    def encode(self, dataset: Any, tokenizer: Any) -> Any:
        if not getattr(tokenizer, "is_fast", False):
            raise UserError("task.name: ner needs a fast tokenizer (word ids map tags to sub-tokens)")

        def tok(batch: dict) -> dict:
            out = self.tokenize(tokenizer, batch["tokens"], limit=self.max_length, is_split_into_words=True)
            out["labels"] = [align_labels(out.word_ids(i), tags) for i, tags in enumerate(batch["tags"])]
            return out

        encoded = dataset.map(tok, batched=True, remove_columns=dataset.column_names,
                              new_fingerprint=fingerprint(dataset, tokenizer, self, "encode, cut counted"))
        self.note_cut("sentences", "task.max_length", self.max_length, encoded["cut"])
        return encoded.remove_columns("cut")

    def collator(self, tokenizer: Any, model: Any = None) -> Any:
        from transformers import DataCollatorForTokenClassification

        return DataCollatorForTokenClassification(tokenizer, return_tensors="pt")

    # --- loss and evaluation -------------------------------------------------------------------
    def units(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """(b,) tagged words: the loss is a mean over words, as Trainer's is over the batch."""
        return (batch["labels"] != IGNORE).sum(-1)

    def loss(self, outputs: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        logits, labels = outputs.logits.float(), batch["labels"]  # (b, t, c), (b, t)
        per_token = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=IGNORE, reduction="none")
        return per_token.sum(-1)  # (b,)

    def outputs(self, outputs: Any, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"preds": outputs.logits.argmax(-1), "labels": batch["labels"]}

    def score(self, outputs: dict[str, np.ndarray], raw: Any) -> dict[str, float]:
        true, pred = [], []
        for p_row, l_row in zip(outputs["preds"], outputs["labels"]):
            keep = l_row != IGNORE
            true.append([self.labels[i] for i in l_row[keep]])
            pred.append([self.labels[i] for i in p_row[keep]])
        return entity_scores(true, pred)

    # --- prediction ----------------------------------------------------------------------------
    predicts = True

    def predict_fields(self, model: Any) -> list[str]:
        self.labels = [model.config.id2label[i] for i in range(model.config.num_labels)]
        return ["tokens"]

    def predict(self, model: Any, tokenizer: Any, rows: list[dict]) -> list[dict]:
        """Per row its words (`tokens`: a list, or a string split at white space) and one tag per
        word. Words past task.max_length sub-tokens are not seen by the model: `tagged` says how
        many were, and the rest are left untagged (None)."""
        self.predict_fields(model)
        out = []
        device = next(model.parameters()).device
        for row in rows:
            words = row["tokens"].split() if isinstance(row["tokens"], str) else [str(w) for w in row["tokens"]]
            enc = tokenizer(words, is_split_into_words=True, truncation=True, max_length=self.max_length,
                            return_tensors="pt")
            with torch.no_grad():
                ids = model(**{k: v.to(device) for k, v in enc.items()}).logits[0].argmax(-1).tolist()
            tags: list[str | None] = [None] * len(words)
            for position, word in enumerate(enc.word_ids(0)):
                if word is not None and tags[word] is None:
                    tags[word] = self.labels[ids[position]]
            seen = sum(t is not None for t in tags)
            out.append({"tokens": words, "tags": tags, **({"tagged": seen} if seen < len(words) else {})})
        return out
