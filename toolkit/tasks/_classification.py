"""The base of sequence classification and regression tasks (GLUE, a user's own labelled text).

Not a plug-in itself (no registry name): GLUE and text_classification inherit the encoding, the
per-example loss, the argmax evaluation step and the official metric functions from here.
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np

from toolkit import quiet
from toolkit.lazy import lazy
from toolkit.errors import UserError
from toolkit.schema import added
from toolkit.models import UNKNOWN_CHARACTER, kind_of
from toolkit.tasks import Metric, Task, declaration, fingerprint
from toolkit.tasks._fields import row_key

torch = lazy("torch", globals())
F = lazy("torch.nn.functional", globals())

CLASSIFICATION_METRICS = ("accuracy", "f1", "matthews_correlation")
REGRESSION_METRICS = ("pearson", "spearmanr")


def metric_libraries(names: tuple[str, ...] | list[str]) -> tuple[Any, Any]:
    """(scipy.stats, sklearn.metrics), each imported only when these metrics need it (1-2 s
    each; accuracy alone needs neither), else None."""
    stats = importlib.import_module("scipy.stats") if {"pearson", "spearmanr"} & set(names) else None
    skm = importlib.import_module("sklearn.metrics") if {"f1", "matthews_correlation"} & set(names) else None
    return stats, skm


def classification_metrics(names: tuple[str, ...] | list[str], preds: np.ndarray, labels: np.ndarray,
                           num_labels: int = 2) -> dict[str, float]:
    """Metrics by their Hugging Face names. F1 is the positive class's (label 1) for two labels, as
    GLUE scores MRPC and QQP, and the unweighted mean over labels (macro) for more."""
    stats, skm = metric_libraries(names)
    out: dict[str, float] = {}
    for name in names:
        if name == "accuracy":
            out[name] = float((preds == labels).mean())
        elif name == "f1" and num_labels <= 2 and not ((labels == 1).any() or (preds == 1).any()):
            # 2TP / (2TP + FP + FN) is 0/0: scikit-learn's zero_division stand-in (0.0) would read
            # as a model that found none of the positives, and average into a GLUE score as one
            out[name] = undefined(f"warning: f1 is undefined (the positive class, label id 1, is in neither the "
                                  f"labels nor the predictions of {len(preds)} example(s)); recorded as null")
        elif name == "f1":
            average = "binary" if num_labels <= 2 else "macro"
            out[name] = float(skm.f1_score(labels, preds, average=average, pos_label=1, zero_division=0))
        elif name == "matthews_correlation" and len(np.unique(labels)) < 2:
            # the labels' variance is 0, so the correlation is 0/0 whatever the predictions:
            # scikit-learn's stand-in 0.0 scored a model right on every example as chance level
            out[name] = undefined(f"warning: matthews_correlation is undefined (the labels of {len(preds)} "
                                  "example(s) are all one class); recorded as null")
        elif name == "matthews_correlation":
            # constant predictions against labels that vary: 0.0, as scikit-learn and GLUE score
            # a majority-class baseline
            out[name] = float(skm.matthews_corrcoef(labels, preds))
        elif name in REGRESSION_METRICS:
            out[name] = correlation(stats, name, preds, labels)
        else:
            raise ValueError(f"unknown classification metric {name}")
    return out


def correlation(stats: Any, name: str, preds: np.ndarray, labels: np.ndarray) -> float:
    """Pearson or Spearman as scipy (and `evaluate`'s GLUE metric) computes them. Undefined where
    either side does not vary (a model that predicts one value, a split of one example): NaN,
    written null in metrics.json, with a warning saying why; never a 0.0 that reads as "no
    correlation" and averages into a GLUE score."""
    flat = [side for side, values in (("predictions", preds), ("labels", labels))
            if len(values) < 2 or np.ptp(values) == 0]
    if flat:
        return undefined(f"warning: {name} is undefined ({' and '.join(flat)} do not vary over {len(preds)} "
                         "example(s)); recorded as null")
    return float((stats.pearsonr if name == "pearson" else stats.spearmanr)(preds, labels)[0])


def undefined(line: str) -> float:
    """NaN for a score the data leaves undefined, its warning line said once per command or API
    call (not at every evaluation: quiet.once)."""
    if os.environ.get("RANK", "0") == "0" and quiet.once(line):
        print(line, file=sys.stderr)
    return float("nan")


@dataclass(kw_only=True)
class Classification(Task):
    """Text (or a text pair) -> one of `label_names`, or a real number when there are none."""

    # What goes between a pair's two texts where the tokenizer's own pair encoding puts nothing
    # there (GPT-2's: "...its end" + "Start ..." was read as the one word "endStart", no mark where
    # the first text ends): "eos", its end-of-text token, as GPT-2 read one document after another
    # in pretraining; "none", nothing (run_glue's reading). Unset (null), a launch decides it for
    # the model (`settle`): "eos" on a decoder-only model, whose tokenizers may have no pair
    # template; an encoder's or an encoder-decoder's tokenizer marks the pair itself ([SEP], </s>).
    pair_separator: Literal["none", "eos"] | None = added(default=None, neutral=None)
    saved_keys: ClassVar[tuple[str, ...]] = ("pair_separator",)  # in the run's saved tokenizer

    # --- what subclasses say (and `text_columns`: the one or two columns holding the text) -------
    @property
    def label_names(self) -> list[str] | None:
        """Label names in id order; None = regression."""
        raise NotImplementedError

    def metric_list(self) -> list[str]:
        raise NotImplementedError

    def adopt_labels(self, names: list[str]) -> None:
        """Label names a trained model carries, for tasks that read theirs from data (predicting
        without loading the training data); tasks with fixed names keep them."""

    def metric_info(self) -> dict[str, str]:
        """Which F1 `f1` is, in metrics.json: with two labels it is the F1 of label id 1 alone (GLUE's
        positive class: MRPC's equivalent, QQP's duplicate), so the name of that label is said;
        with a user's labels (sorted, or as `labels:` lists them) it need not be the one meant."""
        if "f1" not in self.metric_list() or self.is_regression or not self.label_names:
            return {}
        names = self.label_names
        if len(names) <= 2:
            return {"f1": f"F1 of label '{names[-1]}' (id {len(names) - 1}) as the positive class"}
        # scikit-learn's macro average (evaluate's f1, run_glue): over the labels that occur in the
        # gold labels or the predictions, so a label neither holds is not counted as an F1 of 0
        return {"f1": f"macro F1: the unweighted mean of the F1 of each of the {len(names)} labels that occurs "
                      "in the gold labels or the predictions (scikit-learn's macro average)"}

    def ignores(self) -> dict[str, str]:
        columns = getattr(self, "text_columns", None)
        if columns is not None and len(columns) == 1:
            return {"task.pair_separator": "it goes between a pair's two texts, and this task reads one text"}
        return {}

    def settle(self, family: str, trains: bool) -> None:
        """`pair_separator` left unset, decided at launch for the model family (recorded in the
        run's recipe.yaml and so in its id; a run made before the setting reads as it was made)."""
        columns = getattr(self, "text_columns", None)
        maybe_pairs = columns is None or len(columns) == 2  # own data: the columns are found at load
        if self.pair_separator is None and trains and maybe_pairs and kind_of(family) == "decoder":
            self.pair_separator = "eos"

    def adapt_tokenizer(self, tokenizer: Any) -> None:
        """With `pair_separator: eos`, a tokenizer whose pair encoding puts no token between the
        two texts gets its end-of-text token there, in its own pair template: counted when pairs
        are cut at task.max_length, and saved with the run, so eval, predict and an exported
        folder (plain transformers' pipeline with text_pair) read pairs as training did."""
        if self.pair_separator == "eos":
            separate_pairs(tokenizer)

    # --- derived ---------------------------------------------------------------------------------
    @property
    def is_regression(self) -> bool:
        return self.label_names is None

    @property
    def num_labels(self) -> int:
        return 1 if self.is_regression else len(self.label_names or [])

    def declared_metrics(self) -> list[Metric]:
        return [declaration(name) for name in self.metric_list()]

    def head_kwargs(self) -> dict[str, Any]:
        if self.is_regression:
            return {"num_labels": 1, "problem_type": "regression"}
        names = list(self.label_names or [])
        return {"num_labels": len(names), "problem_type": "single_label_classification",
                "id2label": dict(enumerate(names)), "label2id": {n: i for i, n in enumerate(names)}}

    # --- data ------------------------------------------------------------------------------------
    def read_columns(self) -> list[str]:
        return list(getattr(self, "text_columns", None) or [])

    def encode(self, dataset: Any, tokenizer: Any) -> Any:
        cols = self.text_columns

        def tok(batch: dict) -> dict:
            out = self.tokenize(tokenizer, *[batch[c] for c in cols], limit=self.max_length)
            out["labels"] = batch["label"]
            return out

        encoded = dataset.map(tok, batched=True, remove_columns=dataset.column_names,
                              new_fingerprint=fingerprint(dataset, tokenizer, self, "encode, cut counted"))
        self.note_cut("texts", "task.max_length", self.max_length, encoded["cut"])
        return encoded.remove_columns("cut")

    def collator(self, tokenizer: Any, model: Any = None) -> Any:
        metric_libraries(self.metric_list())  # imported with the data, not in the first eval_runtime_s
        from transformers import DataCollatorWithPadding

        if model is not None:
            problem = last_token_problem(model.config, tokenizer) or eos_token_problem(model.config, tokenizer)
            if problem:
                raise UserError(f"model.checkpoint: {problem}")
        return DataCollatorWithPadding(tokenizer, return_tensors="pt")

    # --- loss, evaluation, metrics ---------------------------------------------------------------
    def loss(self, outputs: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        logits, labels = outputs.logits.float(), batch["labels"]
        if self.is_regression:
            return F.mse_loss(logits.squeeze(-1), labels.float(), reduction="none")
        return F.cross_entropy(logits, labels.long(), reduction="none")

    def outputs(self, outputs: Any, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        logits = outputs.logits.float()
        preds = logits.squeeze(-1) if self.is_regression else logits.argmax(-1)
        return {"preds": preds, "labels": batch["labels"]}

    def score(self, outputs: dict[str, np.ndarray], raw: Any) -> dict[str, float]:
        return self.compute_metrics(outputs["preds"], outputs["labels"])

    def compute_metrics(self, preds: Any, labels: Any) -> dict[str, float]:
        return classification_metrics(self.metric_list(), np.asarray(preds), np.asarray(labels),
                                      self.num_labels)

    # --- prediction ------------------------------------------------------------------------------
    predicts = True

    def predict_fields(self, model: Any) -> list[str]:
        """The text fields by the names users give them; the label names are the model's."""
        self.adopt_labels([model.config.id2label[i] for i in range(model.config.num_labels)])
        return list(getattr(self, "input_columns", self.text_columns))

    def predict(self, model: Any, tokenizer: Any, rows: list[dict]) -> list[dict]:
        """Per row its id field where it has one (`_fields.row_key`), its text fields, the label
        name, its probability (`score`) and every label's `probabilities` (regression: the value
        as `score`)."""
        names = self.predict_fields(model)
        texts = [dict(zip(self.text_columns, (r[n] for n in names))) for r in rows]
        preds = self.classify(model, tokenizer, texts)
        return [{**row_key(r, names), **{n: r[n] for n in names}, **p} for r, p in zip(rows, preds)]

    def classify(self, model: Any, tokenizer: Any, rows: list[dict], batch_size: int = 64) -> list[dict]:
        """Label name and probabilities per row of `text_columns` (regression: the value)."""
        from datasets import Dataset, Value

        columns = list(self.text_columns)
        ds = Dataset.from_dict({c: [str(r[c]) for r in rows] for c in columns} | {"label": [0] * len(rows)})
        if self.is_regression:
            ds = ds.cast_column("label", Value("float32"))
        encoded, collate = self.encode(ds, tokenizer), self.collator(tokenizer, model)
        device, out = next(model.parameters()).device, []
        for start in range(0, len(encoded), batch_size):
            batch = collate([encoded[i] for i in range(start, min(start + batch_size, len(encoded)))])
            with torch.no_grad():
                logits = model(**self.model_inputs({k: v.to(device) for k, v in batch.items()})).logits.float()
            if self.is_regression:
                out += [{"score": float(v)} for v in logits.squeeze(-1).tolist()]
                continue
            for p in logits.softmax(-1).tolist():
                best = max(range(len(p)), key=p.__getitem__)
                out.append({"label": self.label_names[best], "score": p[best],
                            "probabilities": dict(zip(self.label_names, p))})
        return out


def separate_pairs(tokenizer: Any) -> bool:
    """Put the tokenizer's end-of-text token between a pair's texts where its pair encoding puts
    no token between them (GPT-2: "a" + "b" read as "ab"); True where it did. A decoder classifier
    reads each example at its last token that is not the pad id, so the separator (the pad id where
    the end-of-text token pads) is read by the attention and never as the example's end."""
    from tokenizers import processors

    backend = getattr(tokenizer, "_tokenizer", None)
    if backend is None or tokenizer.eos_token_id is None or not joined_pairs(tokenizer):
        return False
    eos = tokenizer.eos_token
    ours = processors.TemplateProcessing(single="$A:0", pair=f"$A:0 {eos}:0 $B:0",
                                         special_tokens=[(eos, tokenizer.eos_token_id)])
    kept = backend.post_processor  # GPT-2's ByteLevel (offsets), or a template of single texts
    backend.post_processor = ours if kept is None else processors.Sequence([ours, kept])
    return True


def joined_pairs(tokenizer: Any) -> bool:
    """Whether the tokenizer's pair encoding puts no token between the first text's last token and
    the second's first (GPT-2 has no pair template; BERT puts [SEP], RoBERTa </s></s>, T5 </s>,
    Llama <s>)."""
    if not getattr(tokenizer, "is_fast", False):  # a Python-only tokenizer: no sequence ids to read
        return False
    ids = tokenizer("a", "b").sequence_ids()
    if 0 not in ids or 1 not in ids:
        return False
    return ids.index(1) == len(ids) - 1 - ids[::-1].index(0) + 1


def last_token_problem(config: Any, tokenizer: Any) -> str | None:
    """Why a decoder's classifier would not read each example at its last token, or None.
    transformers' decoder classifiers (GPT-2's) read an example at its last token whose id is
    not `config.pad_token_id`, not at the attention mask's last position: with batches padded
    by the tokenizer's pad token, a config pad id other than the tokenizer's read the padding
    (a prediction that moved with the batch's padding), and a pad token that text tokenizes to
    (a checkpoint's tokenizer saved with `pad_token: "!"`, or the unknown token where text can
    give it) read "Great!" at "Great". The end-of-text token, which the toolkit reads text
    without ever producing (models.text_is_text), is the pad that works."""
    if kind_of(getattr(config, "model_type", "")) != "decoder":
        return None
    pad, theirs = tokenizer.pad_token_id, getattr(config, "pad_token_id", None)
    if theirs is not None and theirs != pad:
        return (f"the tokenizer pads with {tokenizer.pad_token!r} (id {pad}) and the model's config.pad_token_id "
                f"is {theirs}: a {config.model_type} classifier reads each example at its last token that is "
                "not the config's pad, which would be the padding; save both with the same pad token")
    # text as the toolkit reads it: a special token's string as its characters (text_is_text)
    reads = lambda text: tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    from_text = pad in reads(tokenizer.pad_token) or (pad == tokenizer.unk_token_id and pad in reads(UNKNOWN_CHARACTER))
    if from_text:
        return (f"the tokenizer's pad token {tokenizer.pad_token!r} is one text can tokenize to: a "
                f"{config.model_type} classifier reads each example at its last token that is not the pad, "
                "so a text ending in it would be read before it; set pad_token to the end-of-text token "
                f"{tokenizer.eos_token!r} in its tokenizer_config.json")
    return None


def eos_token_problem(config: Any, tokenizer: Any) -> str | None:
    """Why an encoder-decoder's classifier could not read the examples at their end-of-sequence
    token, or None. transformers' BART and T5 classifiers read each example at its last token whose
    id is `config.eos_token_id` and stop (a ValueError traceback, at the first padded batch) where
    the rows of a batch hold different numbers of it: a tokenizer that pads with that token gives
    each row as many more as its padding, and one that ends texts with another id gives none. Text
    never gives it (models.text_is_text)."""
    if kind_of(getattr(config, "model_type", "")) != "encoder-decoder":
        return None
    eos = getattr(config, "eos_token_id", None)
    if tokenizer.pad_token_id is not None and tokenizer.pad_token_id == eos:
        return (f"the tokenizer pads with {tokenizer.pad_token!r} (id {eos}), the model's end-of-sequence token "
                f"(config.eos_token_id): a {config.model_type} classifier reads each example at its last "
                "end-of-sequence token and needs every row of a batch to hold as many, which padding changes; "
                "set pad_token to the tokenizer's own pad token in its tokenizer_config.json")
    if tokenizer.eos_token_id != eos:
        return (f"the tokenizer ends each text with {tokenizer.eos_token!r} (id {tokenizer.eos_token_id}) and the "
                f"model's config.eos_token_id is {eos}: a {config.model_type} classifier reads each example at "
                "its config's end-of-sequence token, which no example would hold; save the model with its own tokenizer")
    return None
