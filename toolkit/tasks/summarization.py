"""Summarization: SAMSum here, CNN/DailyMail and XSum from the Hub, or a user's own files.

A preset (`subset`) names where data comes from and which fields hold the document and the
summary; `train_file` / `eval_file` (JSON, JSONL, CSV or TSV, `.gz` too) replace it with local files.
Scores are ROUGE-1/2/L/Lsum F-measures (rouge-score, stemming; rougeLsum on one sentence per line).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np

from toolkit import readers
from toolkit.errors import UserError
from toolkit.tasks import TASKS, Metric, _fields, declaration, hub_dataset, hub_offline, subset
from toolkit.tasks._generation import TextToText, read_pairs
from toolkit.tasks._text_metrics import ROUGE_KEYS, rouge, rouge_dropped, rouge_reads, rouge_unread

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
        train = task.read(train_file, "train") if train_file else None
        evaluation = task.read(eval_file, "eval")  # its JSON(L) targets may be lists of references
        with_ids = lambda ds: ds.add_column("id", [str(i) for i in range(len(ds))])
        train, evaluation = (with_ids(train) if train is not None else None), with_ids(evaluation)
    else:
        train, evaluation = task.from_hub(hub_id, hub_config, hub_eval_split)
    return {"train": subset(train, task.max_train_samples),
            "eval": {"": subset(evaluation, task.max_eval_samples)}}


def hub_pairs(task: Any, hub_id: str, config: str | None, split: str, source: str, target: str) -> Any:
    """One Hub split as rows {id, source, target}; off-line: one line saying to use local files.
    `source` / `target` name the fields, a field inside an object by a dot (translation's
    `translation.de`). Each is checked as a file's field is (`read_records`): a null or a list is
    one line naming split, record and field, where it was read as "None" or as a list's Python
    text, exit 0; a pair with a blank side is skipped and said (`skip_blank`)."""
    if hub_offline():
        raise UserError(f"task.subset: '{hub_id}' comes from the Hub, which is off-line "
                        "(HF_HUB_OFFLINE=1); set task.train_file and task.eval_file to local copies")

    def rows(ds: Any, name: str) -> Any:
        ids = [str(i) for i in ds["id"]] if "id" in ds.column_names else [str(i) for i in range(len(ds))]
        flat = ds.flatten() if "." in source + target else ds
        for field in (source, target):
            readers.check_text(flat, field, Path(name), "hub", what=f"'{field}'", blank_ok=True)
        pairs = flat.select_columns([source, target]).rename_columns({source: "source", target: "target"})
        pairs = pairs.add_column("id", ids)
        return skip_blank(task, pairs, name, source, target)

    return hub_dataset(task, hub_id, config, split=split, rows=rows)


def skip_blank(task: Any, pairs: Any, name: str, source: str, target: str) -> Any:
    """A Hub preset's pairs with a blank side dropped, as run_summarization / run_translation
    drop them (`if examples[text][i] and examples[summary][i]`), and said in one warning line
    with their count and first record. A file's blank text stays one error line (the file is the
    user's to fix; a Hub data set is not): xsum, for one, holds articles with no text."""
    import pyarrow.compute as pc

    blank = None
    for column in ("source", "target"):
        hit = pc.match_substring_regex(pairs.data.column(column), readers.BLANK_PATTERN)
        blank = hit if blank is None else pc.or_(blank, hit)
    dropped = [i for i, b in enumerate(blank.to_pylist()) if b]
    if not dropped:
        return pairs
    task.note(f"blank {name}", f"{name}: {len(dropped)} of {len(pairs)} records have a blank '{source}' "
              f"or '{target}' and are skipped, as transformers' example scripts skip them "
              f"(first: record {dropped[0] + 1})")
    kept = sorted(set(range(len(pairs))) - set(dropped))
    return pairs.select(kept)


@TASKS.register("summarization")
@dataclass(kw_only=True)
class Summarization(TextToText):

    names = ("documents", "summaries")  # what a cut is counted in

    subset: Literal["samsum", "cnn_dailymail", "xsum", "custom"] = "samsum"
    train_file: str | None = None  # JSON / JSONL / CSV / TSV; overrides the preset's
    eval_file: str | None = None
    field_keys: ClassVar[tuple[str, ...]] = ("source_field",)
    scored_keys: ClassVar[tuple[str, ...]] = ("target_field",)
    case_sensitive: ClassVar[str] = ""  # ROUGE (rouge-score) lower-cases both sides before it counts
    source_field: str | None = None  # default: the preset's (SAMSum: dialogue)
    target_field: str | None = None  # default: the preset's (SAMSum: summary)

    def check(self) -> None:
        super().check()
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

    def read(self, pattern: str, role: Literal["train", "eval"] | None = None) -> Any:
        return read_pairs(self.expand(pattern), *self.fields(), pick=self.pick_fields, note=self.note, role=role)

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
        return self.checked(load_pairs(self))

    def split_file(self, split: str) -> str:
        train, evaluation, _, _ = self.sources()
        return (evaluation if split == "eval" else train) or self.subset

    def scored_character(self, ch: str) -> bool:
        """ROUGE reads a-z and 0-9 alone (rouge-score's tokenizer, lower-cased)."""
        return rouge_reads(ch)

    def check_references(self, references: list[list[str]], split: str) -> None:
        """ROUGE is scored on rouge-score's tokens, which are a-z and 0-9 (`rouge_dropped`):
        summaries written mostly in other letters would score near 0 whatever the model writes
        (a summary equal to its reference: 0, exit 0). Refused before training, as translation
        refuses a BLEU tokenizer that does not split its target language. Fewer, each summary
        in which it finds no token at all (`rouge_unread`) is said: it scores 0 whatever the
        model writes. `references`: each example's; with several, an example is scored on its
        best (`rouge`), so the share dropped is of each example's most readable reference, an
        example scores 0 whatever the model writes where every reference of it is unread (said by
        its row), and an unread one beside readable ones is said apart (by row and reference: it
        is never the best, so its example is scored on the others)."""
        where = self.split_file(split)
        summaries = [r for refs in references for r in refs]
        dropped = rouge_dropped([min(refs, key=lambda r: rouge_dropped([r])) for refs in references])
        if dropped > ROUGE_DROPPED_MAX:
            raise UserError(f"task.{split}_file: {dropped:.0%} of the letters in the reference summaries of "
                            f"{where} are outside a-z and 0-9, which ROUGE's tokenizer (rouge-score, as "
                            "transformers' summarization example scores) drops: every summary would score "
                            "near 0 whatever the model writes; summarization here scores Latin-script text")
        place = [(i, j) for i, refs in enumerate(references) for j in range(len(refs))]
        unread_in: dict[int, list[int]] = {}  # example -> its references ROUGE reads nothing of
        for n in rouge_unread(summaries):
            unread_in.setdefault(place[n][0], []).append(place[n][1])
        unread = [i for i, js in unread_in.items() if len(js) == len(references[i])]  # scored 0 whatever
        beside = [(i, js[0]) for i, js in unread_in.items() if len(js) < len(references[i])]
        if beside:
            i, j = beside[0]
            self.note(f"rouge unread beside {split}", f"{len(beside)} examples in {where} have a reference summary "
                      f"that holds no letter or digit ROUGE's tokenizer reads beside ones it reads (the first, row "
                      f"{i + 1}, reference {j + 1}: {_excerpt(references[i][j])}): it is never the best reference, "
                      "so those examples are scored on their others; remove it or write it in Latin letters")
        if unread:
            first = references[unread[0]][0]
            what = "examples" if len(summaries) > len(references) else "reference summaries"
            self.note(f"rouge unread {split}", f"{len(unread)} of {len(references)} {what} in {where} "
                      f"hold no letter or digit ROUGE's tokenizer reads (rouge-score keeps a-z and 0-9; the first, "
                      f"row {unread[0] + 1}: {_excerpt(first)}): each scores 0 whatever the model writes, its own "
                      f"text included, lowering every ROUGE by its share; remove them from the {split} file or "
                      "write them in Latin letters")

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

    def metric_info(self) -> dict[str, str]:
        """With several references per example (an eval file's lists), each ROUGE is the best
        F-measure over them (rouge-score's score_multi), another number than one reference's:
        `rouge_references` says their count (`nrefs:N`, `nrefs:var` where it varies), as
        sacreBLEU's signature says translation's. A one-reference split records nothing new."""
        counts = self.reference_counts()
        own = {} if counts == (1,) else \
            {"rouge_references": f"nrefs:{counts[0] if len(counts) == 1 else 'var'}|best F-measure"}
        return {**super().metric_info(), **own}

    def score(self, outputs: dict[str, np.ndarray], raw: Any) -> dict[str, float]:
        predictions = self.decoded(outputs)
        unread = [i for i in rouge_unread(predictions) if _LETTERS.search(predictions[i])]
        if unread:  # text the model wrote that ROUGE reads as nothing (an empty output is no text)
            self.note("rouge unread predictions", f"{len(unread)} of {len(predictions)} generated summaries are "
                      f"written in letters ROUGE's tokenizer drops (rouge-score keeps a-z and 0-9; the first: "
                      f"{_excerpt(predictions[unread[0]])}): each scores 0 whatever it says")
            self.say_notices(run=False)
        return rouge(predictions, self.counted_references(raw))


_LETTERS = re.compile(r"[^\W_]")  # a letter or digit of any script


def _excerpt(text: str, size: int = 40) -> str:
    return json.dumps(text if len(text) <= size else text[:size] + "...", ensure_ascii=False)
