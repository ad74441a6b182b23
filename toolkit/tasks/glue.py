"""GLUE: the nine tasks with their official metrics, from a local GLUE download or the Hub.

The local reader parses the TSVs of the original GLUE distribution by hand (tab-separated, no
quoting: csv's quote handling corrupts rows of SST-2, MRPC and QNLI), names any missing file,
column or unknown label with its file and line, and yields the same columns as the Hub's
`nyu-mll/glue` so the rest of the pipeline does not care where data came from.
"""

from __future__ import annotations

import csv
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from toolkit import readers, runs
from toolkit.errors import UserError
from toolkit.tasks import TASKS, data_root, hub_dataset, hub_offline, subset
from toolkit.tasks._classification import Classification, classification_metrics


@dataclass(frozen=True)
class Spec:
    folder: str  # local folder under glue/
    columns: tuple[str, ...]  # local TSV column(s) holding the text (one or two)
    hub_columns: tuple[str, ...]  # the Hub's names for the same
    label_column: str | int  # a header name, or a position for header-less files
    labels: tuple[str, ...] | None  # raw label strings in id order; None = regression
    metrics: tuple[str, ...]
    main: str
    instruction: str
    verbalizers: tuple[str, ...] = ()  # one word per label, for in-context prompting
    header: bool = True
    width: int = 0  # fields per row of a header-less file (CoLA's source, label, original label, sentence)
    dev_files: dict[str, str] = field(default_factory=lambda: {"": "dev.tsv"})
    hub_dev_splits: dict[str, str] = field(default_factory=lambda: {"": "validation"})
    names: tuple[str, ...] | None = None  # label names as the Hub's ClassLabel has them; None: `labels`
    test_columns: tuple[str, ...] = ()  # test.tsv's text columns when not `columns` (CoLA)
    submissions: dict[str, str] = field(default_factory=dict)  # test file -> GLUE server file name

    @property
    def label_names(self) -> tuple[str, ...]:
        return self.names or self.labels or ()


NLI3 = ("entailment", "neutral", "contradiction")
# GLUE's diagnostic set (download_glue_data.py --tasks diagnostic: glue/diagnostic/diagnostic.tsv):
# the server reads its AX.tsv, predicted by the MNLI model, with every submission
DIAGNOSTIC = "../diagnostic/diagnostic.tsv"
NLI2 = ("entailment", "not_entailment")
SPECS: dict[str, Spec] = {
    "cola": Spec("CoLA", (3,), ("sentence",), 1, ("0", "1"), ("matthews_correlation",),
                 "matthews_correlation", "Is this sentence grammatical?", ("no", "yes"),
                 header=False, width=4, names=("unacceptable", "acceptable"), test_columns=("sentence",),
                 submissions={"test.tsv": "CoLA.tsv"}),
    "sst2": Spec("SST-2", ("sentence",), ("sentence",), "label", ("0", "1"), ("accuracy",),
                 "accuracy", "Is the sentiment of this review positive or negative?",
                 ("negative", "positive"), names=("negative", "positive"),
                 submissions={"test.tsv": "SST-2.tsv"}),
    "mrpc": Spec("MRPC", ("#1 String", "#2 String"), ("sentence1", "sentence2"), "Quality",
                 ("0", "1"), ("accuracy", "f1"), "f1",
                 "Do these two sentences mean the same thing?", ("no", "yes"),
                 names=("not_equivalent", "equivalent"), submissions={"test.tsv": "MRPC.tsv"}),
    "qqp": Spec("QQP", ("question1", "question2"), ("question1", "question2"), "is_duplicate",
                ("0", "1"), ("accuracy", "f1"), "f1", "Do these two questions ask the same thing?",
                ("no", "yes"), names=("not_duplicate", "duplicate"), submissions={"test.tsv": "QQP.tsv"}),
    "stsb": Spec("STS-B", ("sentence1", "sentence2"), ("sentence1", "sentence2"), "score", None,
                 ("pearson", "spearmanr"), "pearson",
                 "How similar are these two sentences, from 0 to 5?", submissions={"test.tsv": "STS-B.tsv"}),
    "mnli": Spec("MNLI", ("sentence1", "sentence2"), ("premise", "hypothesis"), "gold_label", NLI3,
                 ("accuracy",), "accuracy", "Does the premise entail the hypothesis?",
                 ("yes", "maybe", "no"),
                 dev_files={"": "dev_matched.tsv", "_mm": "dev_mismatched.tsv"},
                 hub_dev_splits={"": "validation_matched", "_mm": "validation_mismatched"},
                 submissions={"test_matched.tsv": "MNLI-m.tsv", "test_mismatched.tsv": "MNLI-mm.tsv",
                              DIAGNOSTIC: "AX.tsv"}),
    "qnli": Spec("QNLI", ("question", "sentence"), ("question", "sentence"), "label", NLI2,
                 ("accuracy",), "accuracy", "Does the sentence answer the question?", ("yes", "no"),
                 submissions={"test.tsv": "QNLI.tsv"}),
    "rte": Spec("RTE", ("sentence1", "sentence2"), ("sentence1", "sentence2"), "label", NLI2,
                ("accuracy",), "accuracy", "Does the first sentence entail the second?", ("yes", "no"),
                submissions={"test.tsv": "RTE.tsv"}),
    "wnli": Spec("WNLI", ("sentence1", "sentence2"), ("sentence1", "sentence2"), "label", ("0", "1"),
                 ("accuracy",), "accuracy", "Does the first sentence entail the second?", ("no", "yes"),
                 names=("not_entailment", "entailment"), submissions={"test.tsv": "WNLI.tsv"}),
}
CARVE_SEED = 0  # fixed so that every training seed is evaluated on the same examples


# GLUE files read in this process: (file, its content's hash, subset) -> columns. SST-2's 67,349
# training rows take a third of a second to read and check, and every run, however few examples
# it takes, reads the whole file; a sweep's points and the suite's runs read the same files.
_READ: dict[tuple, dict[str, list]] = {}
READ_KEPT = 4


def read_tsv(path: Path, spec: Spec) -> dict[str, list]:
    """One GLUE TSV -> {'text_a', ['text_b'], 'label'}; errors name the file and line. A file
    read before in this process, its content unchanged, is not parsed again (`_READ`); each
    caller gets its own lists."""
    if not path.is_file():
        raise UserError(f"GLUE file {path} is not there (expected the GLUE download layout: "
                        f"<data>/glue/{spec.folder}/{path.name})")
    import hashlib

    key = (str(path.resolve()), hashlib.sha1(path.read_bytes()).hexdigest(), repr(spec))
    if key not in _READ:
        _READ[key] = _read_tsv(path, spec)
        while len(_READ) > READ_KEPT:
            _READ.pop(next(iter(_READ)))
    return {column: list(values) for column, values in _READ[key].items()}


def _read_tsv(path: Path, spec: Spec) -> dict[str, list]:
    rows = _tsv_rows(path, spec.header)  # UTF-8, no NUL byte, line breaks: checked streaming, before rows are read
    if spec.header:
        header, rows, first = rows[0], rows[1:], 2
        wanted = list(spec.columns) + [spec.label_column]
        for col in wanted:
            if col not in header:
                raise UserError(f"{path}: column '{col}' is missing (header has: {', '.join(header)})")
        index, width = [header.index(c) for c in wanted], len(header)
    else:
        index, first, width = list(spec.columns) + [spec.label_column], 1, spec.width
    if not [r for r in rows if r]:
        raise UserError(f"{path}: has no rows")
    out: dict[str, list] = {"text_a": [], "label": []}
    if len(spec.columns) == 2:
        out["text_b"] = []
    for lineno, row in enumerate(rows, start=first):
        if not row:
            continue
        if len(row) <= max(index):
            raise UserError(f"{path}:{lineno}: expected at least {max(index) + 1} columns, got {len(row)}")
        no_extra_fields(path, lineno, row, width)
        out["text_a"].append(row[index[0]])
        if len(spec.columns) == 2:
            out["text_b"].append(row[index[1]])
        out["label"].append(_label(row[index[-1]], spec, f"{path}:{lineno}"))
    return out


def read_test(task: "Glue") -> dict[str, tuple[list[str], list[dict]]]:
    """{submission file name: (index column, rows with the task's text columns)} from the
    test file(s) of the GLUE download (unlabelled: what the GLUE server scores); MNLI's include
    the diagnostic set (AX.tsv). A row short of a column is one error at its line."""
    spec, folder = task.spec, data_root(task.data_dir) / "glue" / task.spec.folder
    columns = spec.test_columns or spec.columns
    out = {}
    for test_file, submission in spec.submissions.items():
        path = Path(os.path.normpath(folder / test_file))
        if not path.is_file():
            what = ("the diagnostic set, whose AX.tsv the GLUE server reads predicted by the MNLI model "
                    "(download_glue_data.py --tasks diagnostic)" if test_file == DIAGNOSTIC
                    else f"GLUE's {spec.folder} test file")
            raise UserError(f"--glue-test: {path} is not there ({what})")
        rows = _tsv_rows(path)
        header, body = rows[0], [(n, r) for n, r in enumerate(rows[1:], start=2) if r]
        if not body:  # a header alone (a cut download) wrote a submission of no predictions, exit 0
            raise UserError(f"{path}: has no rows (a header alone); GLUE's {spec.folder} test file holds the "
                            "examples the server scores")
        first = "index" if "index" in header else "id"
        for col in (first, *columns):
            if col not in header:
                raise UserError(f"{path}: column '{col}' is missing (header has: {', '.join(header)})")
        at = [header.index(c) for c in (first, *columns)]
        for lineno, r in body:
            if len(r) <= max(at):
                raise UserError(f"{path}:{lineno}: expected at least {max(at) + 1} columns, got {len(r)}")
            no_extra_fields(path, lineno, r, len(header))
        out[submission] = ([r[at[0]] for _, r in body],
                           [dict(zip(task.text_columns, (r[i] for i in at[1:]))) for _, r in body])
    return out


def no_extra_fields(path: Path, lineno: int, row: list[str], width: int) -> None:
    """A row with more tab-separated fields than its file's header (CoLA's header-less files: 4)
    holds a tab inside a text: every column after it is read from the next field (MRPC's
    "#2 String" was the second half of "#1 String" and the real second sentence dropped; CoLA's
    sentence cut at the tab; MNLI's gold_label read from another label column), exit 0. Empty
    fields past the last column (a trailing tab) shift nothing and pass."""
    if width and len(row) > width and any(row[width:]):
        raise UserError(f"{path}:{lineno}: {len(row)} tab-separated fields where the file's layout has {width}: "
                        "a text holding a tab shifts every column after it; replace the tab inside the text "
                        "with a space")


def _tsv_rows(path: Path, header: bool = True) -> list[list[str]]:
    """A GLUE TSV's rows (tab-separated, no quoting), checked as the training files are and as
    users' TSVs are for a CSV writer's quoting (a header in quotes, a cell quoted with its quotes
    doubled: a GLUE file re-saved by pandas or R)."""
    readers.scan(path, plain=True)  # a lone \r: the csv module ends a row there (the rows after it shift)
    csv.field_size_limit(sys.maxsize)
    try:
        with path.open(encoding="utf-8-sig", newline="") as handle:
            rows = list(csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text (byte {exc.start}); GLUE files are UTF-8") from None
    except csv.Error as exc:
        raise UserError(f"{path}: not a readable TSV ({exc})") from None
    if not rows:
        raise UserError(f"{path}: the file is empty")
    if header:
        readers.tsv_quoted_header(path, rows[0])
    readers.no_csv_quoting_rows(path, rows[1:] if header else rows, rows[0] if header else None, 2 if header else 1)
    return rows


def _label(raw: str, spec: Spec, where: str) -> int | float:
    if spec.labels is None:
        try:
            value = float(raw)
        except ValueError:
            raise UserError(f"{where}: score '{raw}' is not a number") from None
        if not 0.0 <= value <= 5.0:
            raise UserError(f"{where}: score {value} is outside STS-B's range 0..5")
        return value
    if raw not in spec.labels:
        raise UserError(f"{where}: label '{raw}' is not one of {', '.join(spec.labels)}")
    return spec.labels.index(raw)


@TASKS.register("glue")
@dataclass(kw_only=True)
class Glue(Classification):

    subset: Literal["cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli"]
    train_from_dev: float | None = field(default=None, metadata={"min": 0.01, "max": 0.99})

    @property
    def spec(self) -> Spec:
        return SPECS[self.subset]

    # --- what the model and methods need to know -------------------------------------------
    @property
    def label_names(self) -> list[str] | None:
        return None if self.spec.labels is None else list(self.spec.label_names)

    @property
    def instruction(self) -> str:
        return self.spec.instruction

    @property
    def verbalizers(self) -> tuple[str, ...]:
        return self.spec.verbalizers

    @property
    def text_columns(self) -> list[str]:
        return ["text_a", "text_b"][: len(self.spec.columns)]

    @property
    def input_columns(self) -> list[str]:
        """The names users give the text fields (the Hub's: sentence, question1, ...)."""
        return list(self.spec.hub_columns)

    def metric_list(self) -> list[str]:
        return list(self.spec.metrics)

    def submission(self, load: Any, out_dir: Path) -> list[Path]:
        """`index<TAB>prediction` per test example, in the file names the GLUE server reads. The
        test files are read (and refused) before the model loads or anything is written."""
        tests = read_test(self)
        for name in tests:  # a folder at a file's name failed the write once every test set was predicted
            runs.check_file_place(out_dir / name)
        model, tok = load()
        predicted = {}  # every file's predictions before any is written: MNLI's three, all or none
        for file_name, (index, rows) in tests.items():
            preds = self.classify(model, tok, rows)
            if self.spec.labels is None:  # STS-B: a similarity score, clipped to the task's range
                values = [f"{min(max(p['score'], 0.0), 5.0):.3f}" for p in preds]
            else:
                values = [self.spec.labels[self.label_names.index(p["label"])] for p in preds]
            predicted[file_name] = (index, values)
        out_dir.mkdir(parents=True, exist_ok=True)
        # whole or not at all, each call under names of its own (runs.write_all_whole): the folder may
        # gather other tasks' files for one submission; a full disk at MNLI's second file left the
        # first new beside an older submission's second, and two calls at once shared one
        # `.SST-2.tsv.partial` (one truncated it while the other renamed it)
        files = {out_dir / name: "index\tprediction\n" + "".join(f"{i}\t{v}\n" for i, v in zip(index, values))
                 for name, (index, values) in predicted.items()}
        runs.write_all_whole(files)
        return list(files)

    def main_metric(self) -> str:
        return self.spec.main

    def suffixes(self) -> tuple[str, ...]:
        return tuple(self.spec.dev_files)

    # --- data --------------------------------------------------------------------------------
    def data_files(self) -> list[Path]:
        folder = data_root(self.data_dir) / "glue" / self.spec.folder
        names = ["train.tsv", *self.spec.dev_files.values()]
        return [folder / n for n in names if (folder / n).is_file()]

    def load(self) -> dict[str, Any]:
        from datasets import Dataset

        folder = data_root(self.data_dir) / "glue" / self.spec.folder
        if folder.is_dir():
            evals = {sfx: Dataset.from_dict(read_tsv(folder / f, self.spec))
                     for sfx, f in self.spec.dev_files.items()}
            train_file = folder / "train.tsv"
            if self.train_from_dev is None and not train_file.is_file():
                raise UserError(f"GLUE file {train_file} is not there; set task.train_from_dev "
                                "(e.g. 0.5) to carve a seeded train split off dev")
            train = None if self.train_from_dev else Dataset.from_dict(read_tsv(train_file, self.spec))
        else:
            train, evals = self._load_hub(folder)
        if self.train_from_dev:
            parts = evals[""].train_test_split(train_size=self.train_from_dev, seed=CARVE_SEED)
            train, evals[""] = parts["train"], parts["test"]
        return {"train": subset(train, self.max_train_samples, CARVE_SEED),
                "eval": {k: subset(v, self.max_eval_samples, CARVE_SEED) for k, v in evals.items()}}

    def _load_hub(self, folder: Path) -> tuple[Any, dict[str, Any]]:
        if hub_offline():
            raise UserError(f"GLUE {self.subset}: no local copy at {folder} and the Hub is "
                            "off-line; set TOOLKIT_DATA (or task.data_dir) to a folder holding "
                            f"glue/{self.spec.folder}/")
        try:
            ds = hub_dataset(self, "nyu-mll/glue", self.subset, rows=self._hub_rows)
        except Exception as exc:  # network, missing config: one line for the user
            raise UserError(f"GLUE {self.subset}: could not load nyu-mll/glue from the Hub "
                            f"({type(exc).__name__}); set TOOLKIT_DATA to a local GLUE copy") from None
        return ds["train"], {s: ds[name] for s, name in self.spec.hub_dev_splits.items()}

    def _hub_rows(self, split: Any, name: str) -> Any:
        """A Hub split as `read_tsv` gives a file: its text columns, text in every record (a null
        was the text "None"), and its labels the ids of the task's labels: the ClassLabel's names
        must be the task's, in its order (other names or another order scored every example
        against another class, exit 0), every id one of them (GLUE's test splits' -1: no label)."""
        from datasets import ClassLabel

        rename = dict(zip(self.spec.hub_columns, self.text_columns))
        for column in rename:
            readers.check_text(split, column, Path(name), "hub", what=f"'{column}'", blank_ok=True)
        readers.check_scalar(split, "label", Path(name), "hub", "'label'")
        missing = [i for i, value in enumerate(split["label"]) if value is None][:1]
        if missing:
            raise UserError(f"{readers.where(Path(name), 'hub', missing[0])}: 'label' is missing; every record needs it")
        feature = split.features["label"]
        if self.spec.labels is not None:
            names = tuple(self.spec.label_names)
            if isinstance(feature, ClassLabel) and tuple(feature.names) != names:
                raise UserError(f"{name}: 'label' names the classes {', '.join(feature.names)} in that order; "
                                f"GLUE {self.subset} reads ids as {', '.join(names)}")
            ids = np.asarray(split["label"])
            bad = np.flatnonzero((ids < 0) | (ids >= len(names)) | (ids != np.floor(ids)))
            if len(bad):
                raise UserError(f"{readers.where(Path(name), 'hub', int(bad[0]))}: 'label' is {ids[bad[0]]}, "
                                f"expected a class id 0 to {len(names) - 1} ({', '.join(names)})")
        return split.select_columns(list(rename) + ["label"]).rename_columns(rename)


def glue_metrics(names: tuple[str, ...] | list[str], preds: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """The GLUE metrics by their Hugging Face names (F1 of the positive class, as GLUE scores it)."""
    return classification_metrics(names, preds, labels, num_labels=2)
