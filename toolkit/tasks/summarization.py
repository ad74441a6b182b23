"""Summarization: SAMSum here, CNN/DailyMail and XSum from the Hub, or a user's own files.

A preset (`subset`) names where data comes from and which fields hold the document and the
summary; `train_file` / `eval_file` (JSON, JSONL or CSV, `.gz` too) replace it with local files.
Scores are ROUGE-1/2/L/Lsum F-measures (rouge-score, stemming; rougeLsum on one sentence per line).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np

from toolkit.errors import UserError
from toolkit.tasks import TASKS, Metric, _fields, declaration, hub_dataset, hub_offline, subset
from toolkit.tasks._generation import TextToText, read_pairs
from toolkit.tasks._text_metrics import ROUGE_KEYS, rouge, rouge_dropped

ROUGE_DROPPED_MAX = 0.5  # more of the summaries' letters outside a-z/0-9: ROUGE cannot score them

# subset -> (local train file, local eval file, Hub id, Hub config, source field, target field)
PRESETS: dict[str, tuple[str | None, str | None, str | None, str | None, str, str]] = {
    # no SAMSum train file here: its validation split trains and its test split scores
    "samsum": ("$TOOLKIT_DATA/summarization/samsum/validation.json",
               "$TOOLKIT_DATA/summarization/samsum/test.json", None, None, "dialogue", "summary"),
    "cnn_dailymail": (None, None, "abisee/cnn_dailymail", "3.0.0", "article", "highlights"),
    "xsum": (None, None, "EdinburghNLP/xsum", None, "document", "summary"),
    "custom": (None, None, None, None, "source", "target"),
}


def load_pairs(task: Any, hub_eval_split: str = "validation") -> dict[str, Any]:
    """{'train', 'eval': {'': ...}} of rows {id, source, target} from local files or the Hub."""
    train_file, eval_file, hub_id, hub_config = task.sources()
    if eval_file is None and hub_id is None:
        raise UserError(f"task.eval_file: subset '{task.subset}' needs task.train_file and task.eval_file")
    if eval_file is not None:
        train = task.read(train_file) if train_file else None
        evaluation = task.read(eval_file)
        with_ids = lambda ds: ds.add_column("id", [str(i) for i in range(len(ds))])
        train, evaluation = (with_ids(train) if train is not None else None), with_ids(evaluation)
    else:
        train, evaluation = task.from_hub(hub_id, hub_config, hub_eval_split)
    return {"train": subset(train, task.max_train_samples),
            "eval": {"": subset(evaluation, task.max_eval_samples)}}


def hub_pairs(task: Any, hub_id: str, config: str | None, split: str, source: str, target: str,
              convert: Any = None) -> Any:
    """One Hub split as rows {id, source, target}; off-line: one line saying to use local files."""
    if hub_offline():
        raise UserError(f"task.subset: '{hub_id}' comes from the Hub, which is off-line "
                        "(HF_HUB_OFFLINE=1); set task.train_file and task.eval_file to local copies")
    ds = hub_dataset(task, hub_id, config, split=split)
    convert = convert or (lambda row, i: {"source": row[source], "target": row[target]})
    return ds.map(lambda row, i: {"id": str(row.get("id", i)), **convert(row, i)}, with_indices=True,
                  remove_columns=ds.column_names)


@TASKS.register("summarization")
@dataclass(kw_only=True)
class Summarization(TextToText):

    names = ("documents", "summaries")  # what a cut is counted in

    subset: Literal["samsum", "cnn_dailymail", "xsum", "custom"] = "samsum"
    train_file: str | None = None  # JSON / JSONL / CSV; overrides the preset's
    eval_file: str | None = None
    field_keys: ClassVar[tuple[str, ...]] = ("source_field",)
    scored_keys: ClassVar[tuple[str, ...]] = ("target_field",)
    case_sensitive: ClassVar[str] = ""  # ROUGE (rouge-score) lower-cases both sides before it counts
    source_field: str | None = None  # default: the preset's (SAMSum: dialogue)
    target_field: str | None = None  # default: the preset's (SAMSum: summary)

    def check(self) -> None:
        if self.subset == "custom" and not self.eval_file:
            raise UserError("task.eval_file: subset 'custom' reads local files; set task.eval_file "
                            "(and task.train_file to train)")

    def named_fields(self) -> dict[str, list[str]]:
        """A preset's own files hold the preset's fields: a setting is checked against the other's default."""
        if self.train_file or self.eval_file:
            return super().named_fields()
        return {"source_field": [self.fields()[0]], "target_field": [self.fields()[1]]}

    def declared_metrics(self) -> list[Metric]:
        return [declaration(k) for k in ROUGE_KEYS]

    def main_metric(self) -> str:
        return "rougeL"

    def default_affixes(self, family: str | None, decoder_only: bool) -> tuple[str, str]:
        if family == "t5":
            return "summarize: ", ""
        return ("", "\nTL;DR:") if decoder_only else ("", "")

    def fields(self) -> tuple[str, str]:
        preset = PRESETS[self.subset]
        return self.source_field or preset[4], self.target_field or preset[5]

    def data_patterns(self) -> list[str]:
        """The files `load` reads: the recipe's or the preset's (`sources`)."""
        return [p for p in self.sources()[:2] if p]

    def head_fields(self) -> list[tuple[str, Path, list[tuple[str, str]]]]:
        """Fields a recipe names for its own files (unnamed ones are found in the file at load,
        `pick_fields`); a preset's files hold the preset's fields."""
        own = bool(self.train_file or self.eval_file)
        given = (self.source_field, self.target_field) if own else self.fields()
        named = [(f, k) for f, k in zip(given, ("task.source_field", "task.target_field")) if f]
        return [(f"task.{key}", Path(self.expand(value)), named)
                for key, value in (("train_file", self.train_file), ("eval_file", self.eval_file)) if value]

    def sources(self) -> tuple[str | None, str | None, str | None, str | None]:
        train, evaluation, hub_id, config, _, _ = PRESETS[self.subset]
        if self.eval_file or self.train_file:
            return self.train_file, self.eval_file or evaluation, None, None
        return train, evaluation, hub_id, config

    def read(self, pattern: str) -> Any:
        return read_pairs(self.expand(pattern), *self.fields(), pick=self.pick_fields)

    def pick_fields(self, ds: Any, where: str) -> tuple[str, str]:
        """The document and summary fields: the recipe's; for your own files the preset's names
        come first among the conventional ones, then the longer texts are the documents. The
        first file's choice holds for the next, so both splits read the same fields."""
        _fields.note_spaced(self, list(ds.column_names), where)
        preset = PRESETS[self.subset]
        own = bool(self.train_file or self.eval_file)
        source, target = self.__dict__.get("_found_fields") or \
            ((self.source_field, self.target_field) if own else self.fields())
        found = _fields.pick_pair(ds, where, source, target, _fields.Keys("task.source_field", "task.target_field"),
                                  (preset[4], *_fields.TEXT_INPUTS), (preset[5], *_fields.TEXT_OUTPUTS))
        self._found_fields = found  # not the settings: the recipe's hash stays as written
        return found

    def from_hub(self, hub_id: str, config: str | None, eval_split: str) -> tuple[Any, Any]:
        src, tgt = self.fields()
        return (hub_pairs(self, hub_id, config, "train", src, tgt), hub_pairs(self, hub_id, config, eval_split, src, tgt))

    def load(self) -> dict[str, Any]:
        data = load_pairs(self)
        self.check_rouge(data["eval"][""]["target"])
        return data

    def check_rouge(self, summaries: list[str]) -> None:
        """ROUGE is scored on rouge-score's tokens, which are a-z and 0-9 (`rouge_dropped`):
        summaries written mostly in other letters would score near 0 whatever the model writes
        (a summary equal to its reference: 0, exit 0). Refused before training, as translation
        refuses a BLEU tokenizer that does not split its target language."""
        dropped = rouge_dropped(summaries)
        if dropped > ROUGE_DROPPED_MAX:
            where = self.eval_file or PRESETS[self.subset][1] or self.subset
            raise UserError(f"task.eval_file: {dropped:.0%} of the letters in the reference summaries of "
                            f"{where} are outside a-z and 0-9, which ROUGE's tokenizer (rouge-score, as "
                            "transformers' summarization example scores) drops: every summary would score "
                            "near 0 whatever the model writes; summarization here scores Latin-script text")

    def source_name(self) -> str:
        if (self.train_file or self.eval_file) and not self.source_field:
            return self.found_source() or self.fields()[0]
        return self.fields()[0]

    def input_fields(self, names: list[str], kinds: dict[str, str], where: str) -> list[str]:
        """A run on its own files reads every file by the fields found in the first (or set), and
        its predict inputs so (`names`); a preset's run (SAMSum, CNN/DailyMail) finds a file's
        fields anew, as `toolkit eval RUN task.eval_file=NEW` does (the preset's name, then the
        conventional ones, then the one field there is), and its inputs alike: predict demanded
        `dialogue` of a SAMSum run where eval read NEW's `document`."""
        if self.source_field or self.train_file or self.eval_file:
            return names
        return [_fields.one_text(list(kinds), where, (PRESETS[self.subset][4], *_fields.TEXT_INPUTS),
                                 lambda first: f"name it {names[0]} in the input")]

    def score(self, outputs: dict[str, np.ndarray], raw: Any) -> dict[str, float]:
        return rouge(self.decoded(outputs), [refs[0] for refs in self.references(raw)])
