"""A user's own labelled text: classification or regression from CSV, TSV, JSON or JSONL files
(`.gz` too) or a Hub data set, with no code.

Files are read by the shared reader (`toolkit.readers`: datasets' own `csv` and `json` builders,
checked on the Arrow table), which names file and line for every malformed record.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Literal

from toolkit import readers
from toolkit.errors import UserError
from toolkit.tasks import TASKS, _fields, data_path, hub_dataset, hub_offline, subset
from toolkit.tasks._classification import (CLASSIFICATION_METRICS, REGRESSION_METRICS,
                                           Classification)

SAMPLE_SEED = 0  # max_*_samples pick the same examples for every training seed


def file_format(path: Path) -> str:
    return readers.file_format(path, ("csv", "tsv", "json", "jsonl"))


def read_file(path: Path) -> Any:
    """One data file -> a datasets.Dataset, through the shared reader (toolkit.readers)."""
    return readers.read(path, file_format(path))


def _where(path: str, index: int, fmt: str) -> str:
    """file:line of the index-th record (a Hub split: its record number)."""
    return readers.where(Path(path), fmt, index)


@TASKS.register("text_classification")
@dataclass(kw_only=True)
class TextClassification(Classification):
    """Labelled text of the user's own, from files or the Hub."""

    field_keys: ClassVar[tuple[str, ...]] = ("text_columns",)
    scored_keys: ClassVar[tuple[str, ...]] = ("label_column",)

    train_file: str | None = None
    eval_file: str | None = None
    test_file: str | None = None
    dataset: str | None = None  # a Hub data set id (owner/name) instead of files
    subset: str | None = None  # the Hub data set's configuration
    # None: from the files' header, as run_glue picks them (`pick_text_columns`)
    text_columns: list[str] | None = field(default=None, metadata={"min_items": 1})
    label_column: str | None = None  # None: `label` or the like, else the column beside the text
    labels: list[Any] | None = field(default=None, metadata={"min_items": 2})  # names, in id order
    problem: Literal["classification", "regression"] = "classification"
    # default: accuracy (classification), pearson + spearmanr; `[]` is refused, not read as the default
    metrics: list[str] | None = field(default=None, metadata={"min_items": 1})

    def __post_init__(self) -> None:
        self._found_labels: list[str] | None = None  # label names read from the data at load
        # a name is text or a number: null, a list, true/false or "" would be a class named "None",
        # "[1]", "True" or "", refused only once data loads (or never); `check` names it
        self._bad_label = next((f"{json.dumps(v, default=str)} (item {i + 1})" for i, v in enumerate(self.labels or [])
                                if not label_value(v)), None)
        if self.labels is not None:  # `labels: [0, 1]` and `labels: ["0", "1"]` mean the same
            self.labels = [label_text(v) for v in self.labels]

    # --- validation (no data read) -----------------------------------------------------------
    def ignores(self) -> dict[str, str]:
        if self.dataset is not None:
            return super().ignores()
        return {**super().ignores(), "task.subset": "it names a configuration of a Hub data set, and this task reads its files; "
                               "set task.dataset to use it"}

    def check(self) -> None:
        if self.text_columns is not None and len(self.text_columns) > 2:
            raise UserError(f"task.text_columns: at most two (a text or a text pair), got "
                            f"{len(self.text_columns)}")
        if self.dataset is None and self.eval_file is None:
            raise UserError("task.eval_file: required (or task.dataset for a Hub data set)")
        if self.dataset is not None and (self.train_file or self.eval_file or self.test_file):
            raise UserError("task.dataset: give either a Hub data set or files, not both")
        reserved_text_column(self.text_columns)
        if self._bad_label is not None:
            raise UserError(f"task.labels: each name is non-empty text or a number, not {self._bad_label}; "
                            "quote a name that YAML reads otherwise")
        if self.labels is not None and len(set(self.labels)) != len(self.labels):
            raise UserError(f"task.labels: names repeat ({', '.join(self.labels)})")
        if self.problem == "regression" and self.labels is not None:
            raise UserError("task.labels: a regression has no label names; remove it")
        allowed = REGRESSION_METRICS if self.problem == "regression" else CLASSIFICATION_METRICS
        for name in self.metrics or []:
            if name not in allowed:
                raise UserError(f"task.metrics: '{name}' is not a {self.problem} metric "
                                f"(choose from: {', '.join(allowed)})")
        for key in ("train_file", "eval_file", "test_file"):
            value = getattr(self, key)
            if value is not None:
                path = data_path(value, self.data_dir)
                if not path.is_file():
                    raise UserError(readers.stream_refused(f"task.{key}", path) or f"task.{key}: {path} "
                                    + ("is a folder, not a file" if path.is_dir() else "does not exist"))
                file_format(path)

    def head_fields(self) -> list[tuple[str, Path, list[tuple[str, str]]]]:
        """Columns a recipe names (unnamed ones are picked from the header at load)."""
        text = [(c, "task.text_columns") for c in self.text_columns or []]
        label = [(self.label_column, "task.label_column")] if self.label_column else []
        return [(f"task.{key}", data_path(value, self.data_dir), text + (label if key != "test_file" else []))
                for key, value in (("train_file", self.train_file), ("eval_file", self.eval_file),
                                   ("test_file", self.test_file)) if value is not None]

    # --- what the model and methods need to know ---------------------------------------------
    @property
    def label_names(self) -> list[str] | None:
        if self.problem == "regression":
            return None
        return list(self.labels) if self.labels is not None else self._found_labels

    def adopt_labels(self, names: list[str]) -> None:
        if self.label_names is None and self.problem == "classification":
            self._found_labels = list(names)

    @property
    def verbalizers(self) -> tuple[str, ...]:
        return tuple(self.label_names or ())

    instruction = None  # no natural-language instruction is known for a user's data

    def metric_list(self) -> list[str]:
        if self.metrics:
            return list(self.metrics)
        return list(REGRESSION_METRICS) if self.problem == "regression" else ["accuracy"]

    # --- data --------------------------------------------------------------------------------
    def load(self) -> dict[str, Any]:
        splits = self._load_hub() if self.dataset else self._load_files()
        if self.text_columns is None or self.label_column is None:
            ds, path, _ = splits.get("train") or splits["eval"]
            self.text_columns, self.label_column = pick_columns(
                ds, path, self.text_columns, self.label_column, self.problem)
            reserved_text_column(self.text_columns)
        if self.dataset:
            self._class_names(splits)
        for ds, path, _ in (s for s in splits.values() if s is not None):
            _fields.note_spaced(self, list(ds.column_names), path)
        test = splits.get("test")
        if test is not None and self.label_column in test[0].column_names and _unlabelled(test[0], self.label_column):
            splits["test"] = (test[0].remove_columns(self.label_column), *test[1:])  # a column left blank: no labels
        labelled = [(k, s) for k, s in splits.items() if k != "test" and s is not None]
        for key, (ds, path, fmt) in labelled:
            self._check_columns(ds, path, labels=True)
            # a Hub split's as a file's: a list (a multi-label data set's Sequence column) or an
            # object was a class named by its Python text ("[0, 3]"), exit 0
            what = f"label column '{self.label_column}'"
            readers.check_scalar(ds, self.label_column, Path(path), fmt, what)
            if self.problem == "classification":  # a class is named by its number: held exactly
                readers.check_exact(ds, self.label_column, Path(path), fmt, what)
        if self.problem == "classification" and self.labels is None and self._found_labels is None:
            self._found_labels = self._label_set(splits)
        out = {k: (self._normalise(*s) if s is not None else None) for k, s in splits.items()}
        if self.problem == "classification" and out.get("train") is not None:
            self._check_trained_classes(set(out["train"]["label"]), splits["train"][1])
        return {"train": subset(out.get("train"), self.max_train_samples, SAMPLE_SEED),
                "eval": {"": subset(out["eval"], self.max_eval_samples, SAMPLE_SEED)},
                "test": out.get("test")}

    def _load_files(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in (("train", self.train_file), ("eval", self.eval_file), ("test", self.test_file)):
            if value is not None:
                path = data_path(value, self.data_dir)
                out[key] = (read_file(path), str(path), file_format(path))
        return out

    def _load_hub(self) -> dict[str, Any]:
        if hub_offline():
            raise UserError(f"task.dataset: '{self.dataset}' needs the Hub and it is off-line; "
                            "download it and use task.train_file / task.eval_file")
        try:
            # every split taken is checked in `load`, by the code that checks a file's (its
            # columns are picked from the train split first): the rows pass through as they are
            ds = hub_dataset(self, self.dataset, self.subset, rows=lambda split, name: split)
        except Exception as exc:
            raise UserError(f"task.dataset: could not load '{self.dataset}' from the Hub "
                            f"({type(exc).__name__})") from None
        eval_split = next((s for s in ("validation", "dev", "test") if s in ds), None)
        if eval_split is None:
            raise UserError(f"task.dataset: '{self.dataset}' has no validation split "
                            f"(splits: {', '.join(ds)})")
        if eval_split == "test":  # imdb's, ag_news': the best checkpoint is chosen on the split it is scored on
            self.note("hub test split", f"task.dataset: '{self.dataset}' has no validation split; its test split is the "
                                        "eval split, on which train.keep_best chooses the checkpoint (and a sweep "
                                        "its settings): its scores are not held out from those choices")
        out = {"eval": (ds[eval_split], f"{self.dataset}[{eval_split}]", "hub")}
        if "train" in ds:
            out["train"] = (ds["train"], f"{self.dataset}[train]", "hub")
        return out

    def _class_names(self, splits: dict[str, Any]) -> None:
        """A Hub split's ClassLabel label column: its ids become its names, so labels read like
        files' and the model carries the names. Read once the label column is known: looked up
        under `label` before it was picked, a ClassLabel column of another name (clinc_oos'
        `intent`) trained and predicted the ids as names ("42"), unless the recipe named it."""
        col = self.label_column
        names = getattr(splits["eval"][0].features.get(col), "names", None)
        if not names:
            return
        from datasets import Value

        for key, (ds, path, fmt) in list(splits.items()):
            if col in ds.column_names:  # the column's type given: kept a ClassLabel, the names were read back as ids
                features = ds.features.copy()
                features[col] = Value("string")
                ds = ds.map(lambda b: {col: [names[i] if i is not None and i >= 0 else None for i in b[col]]},
                            batched=True, features=features)
            splits[key] = (ds, path, fmt)
        self._found_labels = list(names)

    def _check_columns(self, ds: Any, path: str, labels: bool) -> None:
        wanted = list(self.text_columns) + ([self.label_column] if labels else [])
        for col in wanted:
            if col not in ds.column_names:
                raise UserError(f"{path}: column '{col}' is missing (it has: "
                                f"{_fields.quoted(ds.column_names)}); set task.text_columns / "
                                "task.label_column" + readers.near_name(col, ds.column_names))

    def _label_set(self, splits: dict[str, Any]) -> list[str]:
        """Label names from the training data (else the eval data), sorted; numbers numerically."""
        ds, path, fmt = splits.get("train") or splits["eval"]
        values = {label_text(v) for v in ds[self.label_column] if v is not None and str(v).strip() != ""}
        if len(values) < 2:
            raise UserError(f"{path}: column '{self.label_column}' has {len(values)} distinct "
                            "label(s); classification needs at least 2")
        self._note_case(values, path)
        self._note_spaced(values, path)
        self._note_joined(values, path)
        self._note_missing(values, ds, path)
        if all(_is_int(v) for v in values):
            return sorted(values, key=lambda v: (int(v), v))  # exact, past 2^53 too
        if all(DECIMAL.fullmatch(v.strip()) for v in values):  # 2.5 before 10.5, as run_glue sorts them
            self._note_scores(values, path)
            return sorted(values, key=lambda v: (float(v), v))
        names = sorted(values)
        self._note_positive(names)
        return names

    def _note_joined(self, values: set[str], path: str) -> None:
        """Labels that are other labels joined by `,`, `;` or `|` (`sports,politics` beside `sports`
        and `politics`): a multi-label file written as text, each set of labels trained as a class
        of its own (the sets a model never saw in training are classes it cannot answer), exit 0.
        Said, naming them: text_classification reads one label per example."""
        joined = sorted(v for v in values if any(
            len(parts := [p.strip() for p in v.split(mark)]) > 1 and all(p in values for p in parts)
            for mark in JOINS))
        if joined:
            shown = ", ".join(repr(v) for v in joined[:3]) + (", ..." if len(joined) > 3 else "")
            self.note("label sets", f"{path}: {len(joined)} label(s) are other labels joined ({shown}): a multi-label "
                                    "file? each set is trained as a class of its own; text_classification reads one "
                                    "label per example")

    def _note_positive(self, names: list[str]) -> None:
        """F1 over two labels is label id 1's, the second as sorted: for names (not numbers, whose
        larger is the positive one by convention) the alphabet chose the class F1 is of, and
        `not_entailment`, `not_equivalent`, `not_duplicate` sort after the class they negate (an
        F1 of the negative class, exit 0, said in metrics.json's metric_info alone). Said once
        where F1 is asked for, naming the setting that chooses."""
        if len(names) == 2 and "f1" in self.metric_list():
            self.note("f1 positive", f"task.metrics: f1 is the F1 of '{names[1]}' alone (label id 1: the labels "
                                     f"{names[0]!r}, {names[1]!r} as sorted); for the F1 of {names[0]!r}, list it "
                                     f"second: task.labels=[{names[1]}, {names[0]}]")

    def _check_trained_classes(self, ids: set[int], path: str) -> None:
        """The training data holds at least two classes, wherever the names come from: with
        `task.labels` (or a Hub data set's label names) given, a file of one class trained a
        classifier that can answer nothing else, exit 0 (names read from the data are refused
        so in `_label_set`)."""
        if len(ids) < 2:
            held = ", ".join(repr(self.label_names[i]) for i in sorted(ids))
            raise UserError(f"{path}: column '{self.label_column}' has {len(ids)} distinct label(s) ({held}) of the "
                            f"{len(self.label_names or [])} named; classification needs at least 2 in the training data")

    def _note_scores(self, values: set[str], path: str) -> None:
        """Labels that are all numbers, some with a fraction (STS-B's 0.0 .. 5.0 scores), read as
        classes: each value its own class, a score the model is told is no nearer its neighbour
        than any other, exit 0 where the eval split held no value training lacked. Said, naming
        task.problem: whole numbers (star ratings) as classes are common and meant."""
        fractions = sorted((v for v in values if not float(v).is_integer()), key=lambda v: (float(v), v))
        if fractions:
            shown = ", ".join(fractions[:3]) + (", ..." if len(fractions) > 3 else "")
            self.note("label scores", f"{path}: the {len(values)} labels are numbers, {len(fractions)} with a fraction "
                                      f"({shown}); each is its own class (task.problem: classification): set "
                                      "task.problem=regression if they are scores")

    def _note_missing(self, values: set[str], ds: Any, path: str) -> None:
        """Labels written as a missing value is (`NA` from R's write.csv, `NaN`, `null`, `None`):
        read as written, each was a class trained on and scored, without a word, where pandas
        (and run_glue through it) reads such a cell as no label. Said with how many rows hold
        them; a recipe that names such a class in `task.labels` means it, and is not told."""
        marks = _fields.missing_marks(values)
        if marks:
            rows = sum(1 for v in ds[self.label_column] if v is not None and label_text(v) in marks)
            self.note("label missing", f"{path}: {rows} row(s) have the label {' or '.join(repr(m) for m in marks)}, "
                                       "which pandas and R write for a missing value; each is a class here (cells "
                                       "are read as written): take out rows that have no label")

    def _note_case(self, values: set[str], path: str) -> None:
        """Labels that differ only in case, spaces at an end, Unicode form (`café` written with
        one code point or two: they look alike), characters that show nothing (a BOM that two
        joined files left at a row's start, a zero-width space: `pos` and a BOM then `pos` were two
        classes that look one, without a word) or how a number is written (`1`, `1.0`, `01`,
        `+1`: CSV cells and JSON strings are names as written) are separate classes: said once,
        naming them (escaped where they would look the same)."""
        count, shown = _fields.alike_names(values, DECIMAL)
        if count:
            self.note("label case", f"{path}: {count} group(s) of labels differ only in case, spaces, Unicode "
                                    f"form, invisible characters or how a number is written ({shown}); each is "
                                    "its own class: write them alike if they are one")

    def _note_spaced(self, values: set[str], path: str) -> None:
        """Labels with a space at an end that no other spelling stands beside (a CSV written
        `text, label`, each cell after `, `): each is a class named as written, `' pos'` and
        `' 1'`, and `_note_case` has no group to say. The model's label names, its predictions and
        every later file were to hold the space (an eval file's `pos` was refused), exit 0 at the
        run, where pandas (and run_glue through it) reads ` 1` as the number 1. Said once, naming
        them, as field names with a space at an end are (`_fields.note_spaced`)."""
        keys = Counter(v.strip().casefold() for v in values)
        spaced = sorted(v for v in values if v != v.strip() and keys[v.strip().casefold()] == 1)  # else said alike
        if spaced:
            shown = _fields.quoted(spaced[:3]) + (", ..." if len(spaced) > 3 else "")
            self.note("label spaces", f"{path}: {len(spaced)} label(s) with a space at an end ({shown}); each is a "
                                      "class named as written, spaces included (a file written with ', ' between "
                                      "its fields?): remove the spaces if they are no part of the names")

    def _normalise(self, ds: Any, path: str, fmt: str) -> Any:
        """Text columns kept; the label column becomes `label` (an id, or a float)."""
        has_label = self.label_column in ds.column_names
        self._check_columns(ds, path, labels=False)
        for col in self.text_columns:  # a Hub split's too: a list of tokens was read as its Python text
            readers.check_text(ds, col, Path(path), fmt, note=self.note)
        keep = list(self.text_columns)
        if not has_label:
            return ds.select_columns(keep)
        ids = {name: i for i, name in enumerate(self.label_names or [])}
        # the record's file:line only when it is reported (finding it reads the file up to there)
        labels = [self._label_id(v, ids, lambda i=i: _where(path, i, fmt)) for i, v in enumerate(ds[self.label_column])]
        return ds.select_columns(keep).add_column("label", labels)

    def _label_id(self, value: Any, ids: dict[str, int], where: Callable[[], str]) -> int | float:
        if value is None or str(value).strip() == "":
            raise UserError(f"{where()}: label column '{self.label_column}' is empty; every row needs "
                            + ("a number (problem: regression)" if self.problem == "regression" else
                               f"a label (one of {_listed(ids)})"))
        if self.problem == "regression":
            if isinstance(value, bool):  # float(True) is 1.0: a JSON true/false is not a score
                raise UserError(f"{where()}: label {str(value).lower()} is true/false, not a number "
                                "(problem: regression)")
            # a number as CSV and JSON write one: float() alone also takes 1_0 (10.0) and other
            # scripts' digits, which no file means as a score
            if isinstance(value, str) and not DECIMAL.fullmatch(value.strip()) \
                    and value.strip().lower().lstrip("+-") not in ("inf", "infinity", "nan"):  # said below
                raise UserError(f"{where()}: label '{value}' is not a number (problem: regression)")
            try:
                number = float(value)
            except (TypeError, ValueError):
                raise UserError(f"{where()}: label '{value}' is not a number (problem: regression)") from None
            if not math.isfinite(number):
                raise UserError(f"{where()}: label '{value}' is not a finite number")
            return number
        text = label_text(value)
        if text not in ids:
            raise UserError(f"{where()}: label '{text}' is not one of {_listed(ids)}"
                            + ("" if self.labels is None else " (task.labels)"))
        return ids[text]


def _unlabelled(ds: Any, column: str) -> bool:
    """Whether every value of `column` is empty (a test file whose label column is there and left
    blank, as test sets are handed out): the split then has no labels, where each empty label was
    refused and the run with it, train and eval files valid."""
    import pyarrow as pa
    import pyarrow.compute as pc

    for chunk in ds.data.column(column).chunks:
        if pa.types.is_null(chunk.type):
            continue
        if not (pa.types.is_string(chunk.type) or pa.types.is_large_string(chunk.type)):
            return False
        if not pc.all(pc.fill_null(pc.equal(pc.utf8_trim_whitespace(chunk), ""), True)).as_py():
            return False
    return True


def _listed(names: Any, shown: int = 20) -> str:
    """Label names for a message: the first `shown`, then how many there are (STS-B's scores read as
    classes listed 161 names in one line)."""
    names = list(names)
    return ", ".join(names[:shown]) + (f", ... ({len(names)} in all)" if len(names) > shown else "")


def reserved_text_column(text_columns: list[str] | None) -> None:
    """A text column may not be named `label`: the examples carry their label (an id) under that
    name, in the encoded data, predict's rows and an ICL template's {label}, and a text column of
    that name crashed the load (a table with two `label` columns)."""
    if text_columns and "label" in text_columns:
        raise UserError("task.text_columns: a text column named 'label' is the name every example's label "
                        "(its id) is kept under; rename that column in the files (and task.text_columns)")


def label_value(value: Any) -> bool:
    """Whether `value` can name a class: non-empty text, or a finite number (not true/false)."""
    if isinstance(value, str):
        return bool(value.strip())
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def label_text(value: Any) -> str:
    """A label's name (`readers.number_name`: 1 and 1.0 are the class "1")."""
    return readers.number_name(value)


DECIMAL = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", re.ASCII)


def pick_columns(ds: Any, where: str, text_columns: list[str] | None, label_column: str | None,
                 problem: str) -> tuple[list[str], str]:
    """(text columns, label column) of a file whose recipe leaves either out, as run_glue finds
    them: a `label`-like column (toolkit.tasks._fields), the text by run_glue's names; a two-column
    file of unknown names by content: the label is the column of few distinct values (regression:
    the short one, a number beside a sentence). Else one line naming both keys."""
    columns = list(ds.column_names)
    for given in (text_columns or []) + ([label_column] if label_column else []):  # named, so not found by others
        if given not in columns:  # (`Sentence` for `sentence` was "cannot tell which columns ...")
            raise UserError(f"{where}: column '{given}' is missing (it has: {_fields.quoted(columns)}); set "
                            "task.text_columns / task.label_column" + readers.near_name(given, columns))
    _fields.no_record_as_header(ds, where)  # fields to be found: not among a record's values
    if label_column is None and len(columns) == 1:
        raise UserError(f"{where}: column 'label' is missing (it has: {columns[0]!r}); a text and a label "
                        "column are needed: is the delimiter right? (.csv: commas, .tsv: tabs)")
    if label_column is None:
        label_column = _fields.named(columns, _fields.LABEL_OUTPUTS, skip=tuple(text_columns or ()), where=where)
    if label_column is None and text_columns is None:
        text_columns = _run_glue_names(columns)
    if label_column is None:
        rest = _fields.candidates(columns, taken=tuple(text_columns or ()))
        if text_columns is not None and len(rest) == 1:
            label_column = rest[0]
        elif text_columns is None and len(rest) == 2:
            pair = _fields.by_likeness(ds, rest[0], rest[1], 0 if problem == "regression" else 1)
            text_columns, label_column = ([pair[0]], pair[1]) if pair else (None, None)
        if label_column is None:
            texts = text_columns or [_fields.likeliest_text(ds, rest or columns)]
            label = _fields.likeliest_label(ds, [c for c in rest or columns if c not in texts])
            raise UserError(f"{where}: cannot tell which columns hold the text and which the label "
                            f"(columns: {', '.join(repr(c) for c in columns)}); set task.text_columns and "
                            "task.label_column" + _fields.example(
                                ("task.text_columns", f"[{', '.join(texts)}]" if texts[0] else None),
                                ("task.label_column", label)))
    if text_columns is None:
        text_columns = pick_text_columns(ds, label_column, where)
    return list(text_columns), label_column


def _run_glue_names(columns: list[str]) -> list[str] | None:
    for names in (["sentence1", "sentence2"], ["sentence"], ["text"]):
        if all(n in columns for n in names):
            return names
    return None


def pick_text_columns(ds: Any, label_column: str, where: str) -> list[str]:
    """The text column(s) of a file whose recipe names none, by run_glue's names: `sentence1`
    and `sentence2`, else `sentence`, else `text`, else the one column beside the label (id-like
    columns, `idx` and the like, are not text). More than one candidate is one line listing
    them (run_glue would take the first two silently), and so is a single text picked by its
    name beside another column as text-like as it (`_pair_unread`)."""
    columns = list(ds.column_names)
    named = _run_glue_names([c for c in columns if c != label_column])
    rest = _fields.candidates(columns, taken=(label_column,))
    if named:
        if len(named) == 1:
            _pair_unread(ds, named[0], [c for c in rest if c != named[0]], where)
        return named
    if len(rest) == 1:
        return rest
    if not rest:
        raise UserError(f"{where}: has no column besides '{label_column}' to read text from")
    return _ambiguous(ds, rest, label_column, columns, where)


def _pair_unread(ds: Any, picked: str, others: list[str], where: str) -> None:
    """A single text found by its name (`sentence`, `text`) beside another column that reads as
    text as much as it, distinct in about as many rows and not far shorter (QNLI's file:
    `question`, `sentence`, `label`): that column is a pair's first half as likely as metadata,
    and read as `sentence` alone the question was never seen (exit 0). One line asks which;
    columns that are not text-like (a `source` of few values, dates and numbers, far shorter
    than the text, JSON values that are not strings) are left unread as before."""
    head = ds.select(range(min(_fields.SAMPLE, len(ds))))
    length, share = _fields.text_likeness(head[picked])
    alike = []
    for other in others:
        values = [v for v in head[other] if v is not None]
        if not values or not all(isinstance(v, str) for v in values) or all(DECIMAL.fullmatch(v.strip()) for v in values):
            continue  # JSON numbers, lists and objects (a record's metadata), or numbers written as text
        other_length, other_share = _fields.text_likeness(values)
        if other_share * _fields.MARGIN >= share and other_length * TEXT_LENGTH_RATIO >= length:
            alike.append(other)
    if alike:
        pair = [c for c in ds.column_names if c in (alike[0], picked)]
        raise UserError(f"{where}: cannot tell whether the text is {picked!r} alone or a pair with "
                        f"{_fields.quoted(alike)}, which reads as text as much as it; set task.text_columns, "
                        f"e.g. task.text_columns=[{', '.join(pair)}] or task.text_columns=[{picked}]")


JOINS = (",", ";", "|")  # what joins the labels of a multi-label file written as text (`_note_joined`)
TEXT_LENGTH_RATIO = 4  # a column this many times shorter than the text (a title, a date) is not its pair


def _ambiguous(ds: Any, rest: list[str], label_column: str, columns: list[str], where: str) -> list[str]:
    hint = "" if label_column in columns else f" and task.label_column (no '{label_column}' column)"
    text = _fields.likeliest_text(ds, rest) if label_column in columns else None
    raise UserError(f"{where}: cannot tell which columns hold the text ({_fields.quoted(rest)}); set "
                    f"task.text_columns{hint}" + _fields.example(("task.text_columns", text and f"[{text}]")))


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True
