"""SQuAD v1.1 and v2.0: extractive QA (any model with a QA head) or generative QA (text-to-text).

`mode: auto` picks extractive for encoders (BERT, RoBERTa, MiniLM) and generative for decoders
and encoder-decoders (`question: ... context: ...` -> answer text). Both are scored with the
official exact match and F1; v2.0 adds HasAns/NoAns breakdowns. Extractive v2.0 answers "" when
the null score beats the best span (null-score gap > 0.0, transformers' run_qa default):
`exact_match` and `f1` are at that fixed threshold. The official script's `best_exact`, `best_f1`
and their `*_thresh` are reported beside them: thresholds tuned on the eval split itself, so an
upper bound, never a held-out score.

Data: the Hub (`rajpurkar/squad`, `rajpurkar/squad_v2`) or local files: SQuAD-format JSON, or
flat records (JSONL / a JSON list of question, context, answers; `read_squad`). With only a dev
file (as here), `split_articles` trains on that fraction of its articles (seeded shuffle) and
scores on the rest: no article, hence no context, is on both sides.

The official rules for unanswerable questions: v1.1 has none, so a v1 run refuses a file with
questions without answers (their count, and `task.version=v2`); an `is_impossible` flag that
contradicts the answers list is refused at its line (the official v2.0 scorer goes by the list,
BERT's run_squad by the flag). Beside predictions.jsonl the run writes what the official
evaluate-v1.1.py / evaluate-v2.0.py read (`prediction_files`).
"""

from __future__ import annotations

import json
import os
import random
import sys
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Literal

import numpy as np

from toolkit import readers
from toolkit.errors import UserError
from toolkit.lazy import lazy
from toolkit.tasks import TASKS, Metric, data_path, declaration, hub_dataset, hub_offline, subset
from toolkit.tasks._generation import Generation, TextToText
from toolkit.tasks._qa import Best, WindowCollator, best_spans, cut_questions, window_features
from toolkit.tasks._text_metrics import (answer_reads, best_null_threshold, best_over, exact_match, spaceless_script,
                                         squad_scores, token_f1, v2_golds)
from toolkit.models import kind_of

torch = lazy("torch", globals())

NULL_THRESHOLD = 0.0  # answer "" when null score - best span score > this (run_qa's default)
F = lazy("torch.nn.functional", globals())

NO_ANSWER = "unanswerable"  # a generative model's target for a v2.0 question without an answer
QA_KEYS = ("offsets", "start_positions", "end_positions", "example_index", "labels")
HUB_IDS = {"v1": "rajpurkar/squad", "v2": "rajpurkar/squad_v2"}
VERSION_FOLDERS = {"v1": "v1.1", "v2": "v2.0"}


def read_squad(path_text: str, version: str = "v2", fields: QaFields | None = None) -> list[dict]:
    """A question-answering file -> rows in the Hub's schema plus `article` (an index: the
    article in SQuAD's layout, the distinct context in a flat file), read by the shared reader.

    Two layouts: SQuAD's JSON (`{"data": [articles]}`), or flat records (JSONL, or a JSON list)
    with a question, a context and answers (`{"text": [...], "answer_start": [...]}` as on the
    Hub, or SQuAD's list of `{"text", "answer_start"}`), their field names inferred (`QaFields`).
    A wrong type, a missing field, an answer whose offset does not match its context, an
    `is_impossible` that contradicts the answers and (`version` v1) questions without an answer
    are each one error naming file and line."""
    path = data_path(path_text)
    if not path.is_file():
        raise UserError(f"{path}: no such file (SQuAD-format JSON, or JSONL with question, context, answers)")
    fmt = readers.file_format(path, ("json", "jsonl"))
    checks = _Checks(path, version)
    if fmt == "json" and readers.first_char(path) == "{":
        return checks.done(_rows(_articles(path), _Where(path), checks))
    return checks.done(_flat_rows(path, fmt, fields or QaFields(), checks))


def hub_squad(split: Any, name: str, version: str) -> Any:
    """A Hub split (the Hub's flat layout: id, title, context, question, answers {text,
    answer_start}) checked as a flat file's records are (`_flat_rows`), each fault one line naming
    `name: record N`: an answer that does not match its context, a null or blank question, an
    id of another type were trained and scored as given, exit 0. The rows as `read_squad` gives
    them; each distinct context an article."""
    from datasets import Dataset

    checks = _Checks(name, version)
    rows = checks.done(_flat_rows(Path(name), "hub", QaFields(), checks, split))
    titles = split["title"] if "title" in split.column_names else None
    if titles is not None:
        for row, title in zip(rows, titles):
            row["title"] = title if isinstance(title, str) else ""
    return Dataset.from_list(rows)


def _articles(path: Any) -> Any:
    """The articles of a SQuAD-format document (`{"data": [...]}`)."""
    try:
        return readers.read(path, "json", field="data")
    except readers.Unreadable:  # types the builder cannot unify in one column (an id 7 beside
        # "a7", a title 5 beside "T"): each question is read and checked as written instead; a
        # value of the wrong kind is said at its place (it was the builder's ArrowInvalid)
        return json.loads(readers.read_small_text(path))["data"]


def document_questions(path: Any, names: tuple[str, str] = ("question", "context")) -> list[dict] | None:
    """The questions of a SQuAD-format document as `toolkit predict` reads them: `id`, `question`,
    `context` (under `names`) of each, in the file's order, checked as `read_squad` checks them (FILE:LINE), their
    answers not read (new questions have none); None for a file of another layout (flat records,
    CSV), which the shared reader reads."""
    if readers.file_format(path) != "json" or readers.first_char(path) != "{":
        return None
    rows = [dict(zip(("id", names[0]), _question(qa, context, named)), **{names[1]: context})
            for qa, context, _, _, named, _ in _questions(_articles(path), _Where(path))]
    if not rows:  # articles without questions: an IndexError traceback deep in predict
        raise UserError(f"{path}: no questions found (its articles' paragraphs hold no 'qas')")
    return rows


def record_questions(items: list[Any], names: tuple[str, str] = ("question", "context")) -> list[Any]:
    """Prediction inputs with SQuAD's nesting taken apart: a document (`{"data": [articles]}`) or
    an article (`{"paragraphs": [...]}`) becomes its questions (`id`, `question`, `context`); any
    other input (one with a question field among them) is kept as given. How the API and
    standard input take the layout files have. The question and context are given under `names`
    (the run's names for them)."""
    out: list[Any] = []
    for i, item in enumerate(items):
        # a record with a question of its own is a question, whatever else it holds ('data')
        if isinstance(item, dict) and names[0] not in item and ("data" in item or "paragraphs" in item):
            articles = [item] if "data" not in item else \
                _need(item.get("data"), list, lambda: f"predict: input {i}", "'data'")
            at = (lambda *keys, i=i: f"predict: input {i}: " + "/".join(map(str, keys))) if "data" in item else \
                (lambda *keys, i=i: f"predict: input {i}: " + "/".join(map(str, keys[1:])))
            found = [dict(zip(("id", names[0]), _question(qa, context, named)), **{names[1]: context})
                     for qa, context, _, _, named, _ in _questions(articles, at)]
            if not found:
                raise UserError(f"predict: input {i}: no questions found in its SQuAD "
                                f"{'document' if 'data' in item else 'article'} (no 'qas' in its paragraphs)")
            out += found
        else:
            out.append(item)
    return out


class _Where:
    """FILE:LINE of a place in the file, found (by re-reading it) only when there is an error."""

    def __init__(self, path: Any) -> None:
        self.path = path

    def __call__(self, *keys: Any) -> str:
        try:
            return f"{self.path}:{readers.json_line(readers.read_small_text(self.path), ['data', *keys])}"
        except Exception:  # a position is a courtesy: the message still names the record
            return f"{self.path}: data/{'/'.join(map(str, keys))}"


class _Checks:
    """What is checked across a file's questions: for v1.1, that every question has an answer
    (v1.1 has no unanswerable questions: its scoring gives them exact 0 by construction)."""

    def __init__(self, path: Any, version: str) -> None:
        self.path, self.version = path, version
        self.unanswered: list[Callable[[], str]] = []

    def add(self, row: dict, position: Callable[[], str]) -> dict:
        if not row["answers"]["text"]:
            self.unanswered.append(position)
        return row

    def done(self, rows: list[dict]) -> list[dict]:
        if not rows:
            raise UserError(f"{self.path}: no questions found")
        if self.version == "v1" and self.unanswered:
            raise UserError(f"{self.path}: {len(self.unanswered)} of {len(rows)} questions have no answer "
                            f"(is_impossible or empty answers; the first at {self.unanswered[0]()}), which "
                            "SQuAD v1.1 trains and scores as answerable (exact 0 by construction): set "
                            "task.version=v2 (recipes/squad/v2.0/, demo/own-data/minilm-full-qa-v2), or remove those questions")
        return rows


def _need(value: Any, kind: type, where: Any, what: str) -> Any:
    if kind is int and isinstance(value, float) and value.is_integer():
        # a whole number: JSON has one number type, and the reader holds a column with a 29.5 in
        # it as doubles, so every 21 there came as 21.0 and the first record was refused
        return int(value)
    if value is None:
        raise UserError(f"{where()}: {what} is missing")
    if not isinstance(value, kind) or isinstance(value, bool) != (kind is bool):
        names = {str: "text", list: "a list", dict: "an object", int: "a whole number", bool: "true/false"}
        raise UserError(f"{where()}: {what} is {readers.json_type(value)}, expected {names[kind]}")
    return value


def _rows(articles: Any, at: Callable[..., str], checks: _Checks) -> list[dict]:
    rows = []
    for qa, context, title, a, named, position in _questions(articles, at):
        rows.append(checks.add(_row(qa, context, title, a, named), position))
    return rows


def _questions(articles: Any, at: Callable[..., str]) -> Any:
    """(question record, context, title, article index, its name, its place) of every question
    of SQuAD's articles, each level checked for its type; `at(*keys)` names a place under them."""
    for a, article in enumerate(articles):
        _need(article, dict, lambda: at(a), f"article {a}")
        title = article.get("title") or ""
        for p, paragraph in enumerate(_need(article.get("paragraphs"), list, lambda: at(a), "'paragraphs'")):
            place = lambda *k: (lambda: at(a, "paragraphs", p, *k))
            _need(paragraph, dict, place(), "a paragraph")
            context = _need(paragraph.get("context"), str, place(), "'context'")
            for q, qa in enumerate(_need(paragraph.get("qas"), list, place(), "'qas'")):
                _need(qa, dict, place("qas", q), "a question")
                position = place("qas", q)
                named = lambda: f"{position()}: article {a} ('{title}'), question {qa.get('id')}"
                yield qa, context, str(title), a, named, position


def _question(qa: dict, context: str, where: Any) -> tuple[str, str]:
    """(id, question) of a question record, checked as every reader checks them."""
    question = _need(qa.get("question"), str, where, "'question'")
    qid = qa.get("id")
    if qid is None:
        raise UserError(f"{where()}: 'id' is missing")
    qid = _need(question_id(qid), str, where, "'id'")
    if readers.blank(context) or readers.blank(question):
        raise UserError(f"{where()}: empty context or question")
    return qid, question


def question_id(value: Any) -> Any:
    """An id as the files name it: a number is its text (7 beside 7.5 in one file: "7", not "7.0")."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return readers.number_name(value)
    return value


def _row(qa: dict, context: str, title: str, article: int, where: Any) -> dict:
    qid, question = _question(qa, context, where)
    impossible = qa.get("is_impossible")
    if impossible is not None:
        _need(impossible, bool, where, "'is_impossible'")
    if qa.get("answers") is None and impossible is not True:
        # absent or null is no list of answers: a record without the field (a misspelt key, a
        # file of questions alone) was read as unanswerable, and a v2.0 run scored "" right on it
        raise UserError(f"{where()}: 'answers' is missing; list the question's answers, or give "
                        "\"answers\": [] (or \"is_impossible\": true) for a question without one (SQuAD v2.0)")
    texts, starts = _answers(qa.get("answers"), context, where)
    if impossible is not None:
        if impossible and texts:  # never dropped: the official scripts disagree on what it means
            raise UserError(f"{where()}: is_impossible is true but it lists {len(texts)} answer(s) "
                            f"({texts[0]!r}); the official v2.0 script would score it as answerable, "
                            "BERT's run_squad trains it as unanswerable: empty its 'answers' (SQuAD 2.0 "
                            "keeps them as 'plausible_answers') or set is_impossible to false")
        if not impossible and not texts:
            raise UserError(f"{where()}: is_impossible is false but it lists no answer; give its "
                            "answers, or set is_impossible to true")
    return {"id": qid, "title": title, "context": context, "question": question,
            "answers": {"text": texts, "answer_start": starts}, "article": article}


def _mismatch_fix(text: str, start: int, context: str) -> str:
    """What would make an answer that is not at its answer_start right: the start of its nearest
    occurrence in the context; where the text is not there as written but is once both are in
    one Unicode form (an answer typed as 'e' + U+0301 against a context's 'é'), that form, which
    no answer_start fixes (the line said 'fix answer_start' of an answer whose start was right)."""
    import unicodedata

    found = [i for i in range(len(context)) if text and context.startswith(text, i)]
    if found:
        best = min(found, key=lambda i: abs(i - start))
        return (f"the context holds it at answer_start {best}"
                + (f", the nearest of {len(found)} places" if len(found) > 1 else "") + ": fix answer_start")
    for form in ("NFC", "NFKC"):
        if text and unicodedata.normalize(form, text) in unicodedata.normalize(form, context):
            return (f"the answer and the context write the same characters in different Unicode forms "
                    f"(equal under {form}: composed or decomposed accents, compatibility characters); "
                    f"write both in one form, such as unicodedata.normalize('{form}', ...) of each")
    return "fix answer_start"


def _answers(value: Any, context: str, where: Any) -> tuple[list[str], list[int]]:
    """SQuAD's list of {"text", "answer_start"} or the Hub's {"text": [...], "answer_start": [...]}
    -> (texts, starts), each checked against the context."""
    if isinstance(value, dict):  # the Hub's layout
        texts = _need(value.get("text"), list, where, "answers' 'text'")
        starts = _need(value.get("answer_start"), list, where, "answers' 'answer_start'")
        if len(texts) != len(starts):
            raise UserError(f"{where()}: answers hold {len(texts)} text(s) and {len(starts)} "
                            "answer_start(s); give one start per text")
        value = [{"text": t, "answer_start": s} for t, s in zip(texts, starts)]
    texts, starts = [], []
    for ans in _need(value if value is not None else [], list, where, "'answers'"):
        _need(ans, dict, where, "an answer")
        text = _need(ans.get("text"), str, where, "an answer's 'text'")
        start = _need(ans.get("answer_start"), int, where, "an answer's 'answer_start'")
        if text and readers.blank(text):  # no token holds it: trained as no answer, scored as ""
            raise UserError(f"{where()}: answer {text!r} at answer_start {start} is blank (whitespace or "
                            "invisible characters alone); give the answer's words, or no answer")
        if not text or start < 0 or context[start:start + len(text)] != text:
            raise UserError(f"{where()}: answer {text!r} at answer_start {start} does not match the "
                            f"context there ({context[max(start, 0):max(start, 0) + len(text)]!r}); "
                            + _mismatch_fix(text, start, context))
        texts.append(text)
        starts.append(start)
    return texts, starts


# Conventional names of a flat file's fields, first match wins (the Hub's names first).
FIELD_NAMES = {"question": ("question", "query", "q"),
               "context": ("context", "passage", "paragraph", "document"),
               "answers": ("answers", "answer", "answer_spans"),
               "id": ("id", "qid", "question_id")}


@dataclass
class QaFields:
    """The fields of a flat file's records the task reads; None: inferred from the file."""

    question: str | None = None
    context: str | None = None
    answers: str | None = None
    id: str | None = None

    def resolve(self, path: Any, columns: dict[str, str], roles: tuple[str, ...] = ("question", "context", "answers"),
                fix: str = "set task.{role}_field") -> dict[str, str | None]:
        """role -> field of `columns` (name -> "text" / "other"): set, else a conventional name,
        else the one field of the right kind no other role takes; several: one line listing them
        (ending in `fix`). Every reader of the task's records goes through here: a file to train or
        evaluate on, and `toolkit predict`'s inputs (`roles` question and context: no answers)."""
        chosen = {role: getattr(self, role) for role in FIELD_NAMES}
        for role, name in chosen.items():
            if name is not None and name not in columns:
                raise UserError(f"task.{role}_field: {path} has no field '{name}' (it has: "
                                f"{', '.join(columns)})" + readers.near_name(name, columns))
        for role, names in FIELD_NAMES.items():
            if chosen[role] is None:
                chosen[role] = next((n for n in names if n in columns), None)
        for role in roles:
            if chosen[role] is not None:
                continue
            kind = "other" if role == "answers" else "text"
            free = [c for c, k in columns.items() if k == kind and c not in chosen.values()]
            if len(free) != 1:
                found = f"candidates: {', '.join(repr(c) for c in free)}" if free else "no candidate field"
                raise UserError(f"task.{role}_field: {path} has no '{FIELD_NAMES[role][0]}' field ({found}; "
                                f"fields: {', '.join(columns)}); {fix.format(role=role)}")
            chosen[role] = free[0]
        return chosen


def flat_fields(path_text: str, fields: QaFields) -> dict[str, str | None] | None:
    """role -> field of a flat file's records as `read_squad` finds them; None for SQuAD's layout
    (its fields have their names)."""
    path = data_path(path_text)
    fmt = readers.file_format(path, ("json", "jsonl"))
    if fmt == "json" and readers.first_char(path) == "{":
        return None
    return _flat_fields(readers.read(path, fmt), path, fields)


def _flat_fields(ds: Any, path: Any, fields: QaFields) -> dict[str, str | None]:
    if "paragraphs" in ds.column_names:
        raise UserError(f"{path}: holds SQuAD articles in a list; expected a JSON object with a 'data' "
                        "list of them ({\"data\": [...]}), or flat records of question, context, answers")
    kinds = {name: "text" if getattr(feature, "dtype", None) in ("string", "large_string") else "other"
             for name, feature in ds.features.items()}
    return fields.resolve(path, kinds)


def _flat_rows(path: Any, fmt: str, fields: QaFields, checks: _Checks, ds: Any = None) -> list[dict]:
    """Flat records (JSONL or a JSON list; `ds`: a table read already, a Hub split whose `path`
    is its name and `fmt` "hub"): one question with its context and answers each."""
    ds = readers.read(path, fmt) if ds is None else ds
    role = _flat_fields(ds, path, fields)
    if role["id"]:
        readers.check_exact(ds, role["id"], path, fmt, f"'{role['id']}' (the id)")
    contexts: dict[str, int] = {}  # a distinct context is an "article": split_articles keeps it on one side
    rows = []
    for i, record in enumerate(ds.to_list()):
        position = lambda i=i: readers.where(path, fmt, i)
        named = lambda i=i, r=record: f"{position(i)}: question {r.get(role['id']) if role['id'] else i}"
        context = _need(record.get(role["context"]), str, named, f"'{role['context']}' (the context)")
        qa = {"id": record.get(role["id"]) if role["id"] else str(i),
              "question": record.get(role["question"]), "answers": record.get(role["answers"]),
              "is_impossible": record.get("is_impossible")}
        qa["id"] = _need(question_id(qa["id"]), str, named, f"'{role['id']}' (the id)")
        _need(qa["question"], str, named, f"'{role['question']}' (the question)")
        article = contexts.setdefault(context, len(contexts))
        rows.append(checks.add(_row(qa, context, "", article, named), position))
    return rows


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
    train_file: str | None = None  # SQuAD-format JSON or flat JSONL (`read_squad`); None: the Hub
    eval_file: str | None = None
    # with no train_file, this fraction of eval_file's articles trains (a given train_file turns
    # it off: the resolved recipe then says null)
    split_articles: float | None = field(default=None, metadata={"min": 0.0, "max": 1.0})
    split_seed: int = field(default=0, metadata={"min": 0, "max": 2**32 - 1})  # as train.seed
    field_keys: ClassVar[tuple[str, ...]] = ("id_field", "question_field", "context_field")
    scored_keys: ClassVar[tuple[str, ...]] = ("answers_field",)
    question_field: str | None = None  # a flat file's fields; None: inferred (`QaFields`)
    context_field: str | None = None
    answers_field: str | None = None
    id_field: str | None = None
    generation: Generation = field(default_factory=Generation)  # budget: max_target_length

    def __post_init__(self) -> None:
        if self.train_file and self.split_articles is not None:
            self.split_articles = None  # own-data recipes: the user's train file replaces the split

    def check(self) -> None:
        super().check()
        if self.mode == "extractive":  # said before the family is known; `auto` waits for model_head
            self._check_windows()
        if self.split_articles is not None and not self.eval_file:
            raise UserError("task.split_articles: splits task.eval_file by article; set task.eval_file")

    def rescoring(self, made: Any, keys: set[str]) -> None:
        """`toolkit eval RUN task.eval_file=OTHER` on a run that split its eval file by article:
        the split applied to OTHER too, and only its held-out articles (a sixth of them, as
        shipped) were scored, as if the file's score, exit 0. Named with the split (any
        task.split_articles given with it) it is scored so; else one line says how to score it
        whole. And the converse: a task.train_file given there turns the split off, and the run's
        own eval file was scored whole, the articles it trained on included. Another draw of the
        run's own file (task.split_seed, or task.split_articles another fraction) scored articles
        the run trained on as held out: one line too."""
        if not (self.eval_file and made.eval_file):
            return
        same = self.file_named(self.eval_file) == made.file_named(made.eval_file)
        if same and made.split_articles is not None and self.split_articles is not None:
            moved = [k for k in ("split_articles", "split_seed") if getattr(self, k) != getattr(made, k)]
            if moved:  # another draw of the same file's articles: some the run trained on are scored
                raise UserError(f"task.{moved[0]}: the run split {made.eval_file} by article (task.split_articles="
                                f"{made.split_articles}, task.split_seed={made.split_seed}); another draw would score "
                                "articles the run trained on as held out; leave it as the run had it, or set "
                                "task.split_articles=null to score all of the file on purpose")
        if "task.split_articles" in keys:
            return
        if same and made.split_articles is not None and self.split_articles is None:
            raise UserError(f"task.train_file: given, it turns the run's split of {self.eval_file} off "
                            f"(task.split_articles={made.split_articles}), and all of that file would be scored, "
                            "the articles the run trained on included; leave task.train_file out, or set "
                            "task.split_articles=null to score all of it on purpose")
        if self.split_articles is not None and not same:
            raise UserError(f"task.eval_file: the run split its eval file by article (task.split_articles="
                            f"{self.split_articles}), and {self.eval_file} would be split the same way, only its "
                            f"held-out articles scored; set task.split_articles=null to score all of it (or "
                            f"task.split_articles={self.split_articles} to score that part)")

    def run_name(self, name: str) -> str:
        """A recipe's folder names its SQuAD version (`squad/v1.1/...`): the run is filed under
        the version it runs (`task.version=v2` on a v1.1 recipe: `squad/v2.0/...`)."""
        return "/".join(VERSION_FOLDERS[self.version] if part in VERSION_FOLDERS.values() else part
                        for part in name.split("/"))

    @property
    def fields(self) -> QaFields:
        return QaFields(self.question_field, self.context_field, self.answers_field, self.id_field)

    def declared_metrics(self) -> list[Metric]:
        names = ["f1", "exact_match"]
        if self.version == "v2":
            names += ["HasAns_exact_match", "HasAns_f1", "NoAns_exact_match", "NoAns_f1"]
        out = [Metric(n, True, 100.0) if n.startswith(("HasAns", "NoAns")) else declaration(n) for n in names]
        if self.version == "v2" and self.extractive:  # a generative model answers "" or not by itself:
            # no null score to tune a threshold on (so train.metric cannot select best_* there)
            out += [Metric("best_exact", True, 100.0), Metric("best_f1", True, 100.0),
                    declaration("best_exact_thresh"), declaration("best_f1_thresh")]  # no scores (the catalogue's)
        return out

    def model_head(self, family: str | None) -> str:
        kind = kind_of(family) if family and family != "encoder-decoder" else family
        self._extractive = self.mode == "extractive" or (self.mode == "auto" and kind == "encoder")
        if self._extractive:  # validate reaches this through the head check (recipe.check)
            self._check_windows()
        return "question-answering" if self._extractive else super().model_head(family)

    def ignores(self) -> dict[str, str]:
        """An extractive run reads a span off its QA head: nothing it generates; a generative run
        reads question and context as one source: no windows, no spans."""
        if self.extractive:
            why = ("an extractive run (task.mode, or auto on an encoder) reads its answer off a span head "
                   "and generates nothing; set task.mode: generative to use it")
            return {f"task.{name}": why for name in ("max_target_length", "prefix", "suffix", "source_code",
                                                                  "target_code")} | {
                f"task.generation.{f.name}": why for f in dataclasses.fields(Generation)} | self._split_ignored()
        why = ("a generative run (task.mode, or auto on a decoder or encoder-decoder) reads question and "
               "context as one source cut at task.max_length: no windows or spans; set task.mode: "
               "extractive to use it")
        return {**super().ignores(), **{f"task.{name}": why for name in ("doc_stride", "max_answer_length", "n_best")},
                **self._split_ignored()}

    def _split_ignored(self) -> dict[str, str]:
        if self.split_articles is not None:
            return {}
        return {"task.split_seed": "it draws the articles task.split_articles splits off, and none is set "
                                   "(an own train file replaces the split)"}

    def _check_windows(self) -> None:
        """The window rule, where the run makes windows: an extractive run only. A generative
        run reads question and context as one source cut at task.max_length (the cut counted in
        a warning), so doc_stride, n_best and max_answer_length do nothing there, and are not
        checked, as generation settings do nothing in, and are not checked for, an extractive run."""
        if self.doc_stride >= self.max_length // 2:
            raise UserError(f"task.doc_stride: {self.doc_stride} must be below half of task.max_length "
                            f"({self.max_length}) so windows move forward")

    @property
    def extractive(self) -> bool:
        return getattr(self, "_extractive", False)

    # --- data --------------------------------------------------------------------------------
    def load(self) -> dict[str, Any]:
        from datasets import Dataset

        if self.eval_file:
            evaluation = read_squad(self.expand(self.eval_file), self.version, self.fields)
            self._no_answer_named(evaluation, self.eval_file)
            train = read_squad(self.expand(self.train_file), self.version, self.fields) if self.train_file else None
            self._no_answer_named(train, self.train_file)
            if self.split_articles is not None:
                train, evaluation = split_by_article(evaluation, self.split_articles, self.split_seed)
            train, evaluation = (Dataset.from_list(train) if train else None), Dataset.from_list(evaluation)
        else:
            train, evaluation = self._hub()
            self._no_answer_named(train, f"{HUB_IDS[self.version]} train")
            self._no_answer_named(evaluation, f"{HUB_IDS[self.version]} validation")
        evaluation = subset(evaluation, self.max_eval_samples)
        self._note_spaceless(evaluation, self.eval_file or f"{HUB_IDS[self.version]} validation")
        return {"train": subset(train, self.max_train_samples), "eval": {"": evaluation}}

    def _note_spaceless(self, evaluation: Any, where: str) -> None:
        """The official scripts' F1 splits an answer into words at whitespace (`normalize_answer`,
        followed here as written): gold answers mostly in a script written without spaces (CJK,
        Thai) are one word each, so their F1 is exact match (a prediction one character off
        scores 0 where a Latin answer's overlap counts), and punctuation outside ASCII ("。")
        is kept. Said once, with the share, at the run's start and at `toolkit eval`; scored as
        the official scripts score it."""
        golds = [t for a in evaluation["answers"] for t in a["text"]]
        found = spaceless_script(golds)
        if found:
            script, share, _ = found
            self.note("spaceless answers", f"{share:.0%} of the letters of the gold answers in {where} are {script}, "
                      "written without spaces: the official SQuAD F1 splits answers into words at spaces, so each "
                      "such answer is one word and its F1 is its exact match (a partial answer scores 0); scored "
                      "as the official scripts score it")

    def _hub(self) -> tuple[Any, Any]:
        if hub_offline():
            raise UserError(f"task.eval_file: {HUB_IDS[self.version]} comes from the Hub, which is "
                            "off-line (HF_HUB_OFFLINE=1); set task.eval_file (and train_file or "
                            "split_articles) to a local SQuAD JSON file")
        ds = hub_dataset(self, HUB_IDS[self.version], rows=lambda split, name: hub_squad(split, name, self.version))
        return ds["train"], ds["validation"]

    def export_settings(self, tokenizer: Any = None) -> str:
        """An extractive export's line names the answer search the run's scores and `toolkit
        predict` used, under run_qa.py's (utils_qa.py's) flags: the folder holds the head and the
        tokenizer, not the window length and stride, n_best, max_answer_length or the v2.0 null
        threshold, and without them its logits give other answers. A generative run: its decoding
        is in generation_config.json (`decode_as_run`)."""
        if not self.extractive:
            return ""
        said = (f"; answers as the run found them (run_qa.py's flags): windows of --max_seq_length "
                f"{self.max_length} tokens, the question first, overlapping by --doc_stride {self.doc_stride} "
                f"(truncation=\"only_second\", stride={self.doc_stride}, return_overflowing_tokens=True; a "
                f"question leaving no more than {self.doc_stride} context tokens cut to its first tokens), "
                f"the best start+end logit sum over all windows among each window's --n_best_size "
                f"{self.n_best} best starts and ends in the context, spans of at most --max_answer_length "
                f"{self.max_answer_length} tokens")
        if self.version == "v2":
            said += (f", and \"\" where the lowest [CLS] start+end over the windows exceeds that sum by "
                     f"more than --null_score_diff_threshold {NULL_THRESHOLD} (--version_2_with_negative)")
        return said

    # --- generative: what the text-to-text base needs -------------------------------------------
    def reading_limit(self) -> int | None:
        return self.max_length if self.extractive else super().reading_limit()  # windows of max_length

    def positions_problem(self, tokenizer: Any, max_length: int, limit: int) -> str | None:
        return None if self.extractive else super().positions_problem(tokenizer, max_length, limit)

    def source_text(self, row: dict) -> str:
        return f"question: {row['question']} context: {row['context']}"

    def target_text(self, row: dict) -> str:
        return row["answers"]["text"][0] if row["answers"]["text"] else NO_ANSWER

    def abstained(self, texts: list[str]) -> list[str]:
        """Generated answers as scored: under v2.0, NO_ANSWER is the answer "". v1.1 trains no
        question towards it, so there it is text like any other (a gold answer "unanswerable"
        generated right was scored as "", exact 0)."""
        return ["" if self.version == "v2" and t == NO_ANSWER else t for t in texts]

    def _no_answer_named(self, rows: Any, where: str | None) -> None:
        """A generative v2.0 run answers NO_ANSWER for "no answer": a question whose answer is that
        very text would be trained to it and scored as abstaining (exact 0 where it was right)."""
        if self.version != "v2" or self.extractive or rows is None:
            return
        answers = rows["answers"] if not isinstance(rows, list) else [r["answers"] for r in rows]
        hit = next((i for i, a in enumerate(answers) if NO_ANSWER in (t.strip() for t in a["text"])), None)
        if hit is not None:
            raise UserError(f"{where}: question {rows[hit]['id']} has the answer {NO_ANSWER!r}, the text a generative "
                            "SQuAD v2.0 run answers for a question without one (read back as \"\", it would be "
                            "scored wrong where it is right); reword that answer, or use an extractive model "
                            "(task.mode: extractive)")

    def default_affixes(self, family: str | None, decoder_only: bool) -> tuple[str, str]:
        return ("", "\nanswer:") if decoder_only else ("", "")

    def references(self, raw: Any) -> list[list[str]]:
        return [list(a["text"]) or [""] for a in raw["answers"]]

    def scored_character(self, ch: str) -> bool:
        """Exact match and F1 read an answer as the official normalisation leaves it."""
        return answer_reads(ch)

    # --- extractive: windows, span loss, post-processing ----------------------------------------
    def rows_are_examples(self) -> bool:
        return not self.extractive  # an example is as many windows as its context needs

    def read_columns(self) -> list[str]:
        return ["question", "context"]

    def encode(self, dataset: Any, tokenizer: Any) -> Any:
        if not self.extractive:
            return super().encode(dataset, tokenizer)
        from datasets import Dataset

        self._tokenizer = tokenizer
        return Dataset.from_dict(self.windows(tokenizer, list(dataset["question"]), list(dataset["context"]),
                                              list(dataset["answers"])))

    def windows(self, tokenizer: Any, questions: list[str], contexts: list[str], answers: list[dict]) -> dict[str, list]:
        """`window_features` of the task's settings, the one way a run's splits and predict's inputs
        are windowed. Questions too long to leave a window more than task.doc_stride context tokens
        are cut to their first tokens that fit (`cut_questions`): counted over the calls and said
        once (`notices`); predict cut them unsaid, exit 0."""
        _, cut, room = cut_questions(tokenizer, questions, self.max_length, self.doc_stride)
        done, total, _ = self.__dict__.get("_question_cuts", (0, 0, room))
        self.__dict__["_question_cuts"] = (done + cut, total + len(questions), room)
        return window_features(tokenizer, questions, contexts, answers, self.max_length, self.doc_stride)

    def notices(self, run: bool = True) -> dict[str, str]:
        lines = super().notices(run)
        cut, total, room = self.__dict__.get("_question_cuts", (0, 0, 0))
        if cut:
            advice = ("raise task.max_length or lower task.doc_stride to keep them whole" if run else
                      "the run was trained with these windows: shorten the question to keep it whole")
            lines["cut questions"] = (
                f"{cut} of {total} questions cut to their first {room} tokens (the rest is not seen): a window "
                f"of task.max_length={self.max_length} tokens must keep more than task.doc_stride="
                f"{self.doc_stride} for the context; {advice}")
        return lines

    def collator(self, tokenizer: Any, model: Any = None) -> Any:
        return WindowCollator(tokenizer) if self.extractive else super().collator(tokenizer, model)

    def model_inputs(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if not self.extractive:
            return super().model_inputs(batch)
        return {k: v for k, v in batch.items() if k not in QA_KEYS}

    def loss_sees_padding(self) -> bool:
        """Extractive: run_qa's training loss takes the softmax over the padded positions too."""
        return self.extractive

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
        return span_loss(*self._logits(outputs, batch), batch)

    def eval_step(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The eval loss is over each window's own tokens: the padding a batch adds is no place an
        answer can be, and in the softmax it made a window's loss depend on the longest window
        batched with it, so on train.eval_batch_size. Training keeps run_qa's loss as it is."""
        if not self.extractive:
            return super().eval_step(model, batch)
        outputs = model(**self.model_inputs(batch))
        start, end = self._logits(outputs, batch)
        padding = batch["attention_mask"] == 0  # (b, t)
        unpadded = [x.masked_fill(padding, torch.finfo(x.dtype).min) for x in (start, end)]
        return {"loss": span_loss(*unpadded, batch), "units": self.units(batch), "start_logits": start,
                "end_logits": end, "offsets": batch["offsets"], "example_index": batch["example_index"]}

    def eval_pad(self, key: str) -> float:
        return -1 if key == "offsets" else -100

    def spans(self, outputs: dict[str, np.ndarray], raw: Any) -> list[Best] | None:
        """Each question's best non-null span and its null score (extractive runs; None otherwise)."""
        if not self.extractive:
            return None
        return best_spans(outputs["start_logits"], outputs["end_logits"], outputs["offsets"],
                          outputs["example_index"], list(raw["context"]), self.n_best, self.max_answer_length)

    def answers(self, outputs: dict[str, np.ndarray], raw: Any,
                bests: list[Best] | None = None) -> tuple[list[str], dict[str, float]]:
        """Predicted answer texts in raw order, and the extra metrics (v2.0's threshold)."""
        if not self.extractive:
            return self.abstained(self.decoded(outputs)), {}
        bests = bests or self.spans(outputs, raw)
        if self.version == "v1":
            return [b.text for b in bests], {}
        gaps = [b.no_answer_score for b in bests]
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
        """One row per question. Extractive v2.0 adds `best_span` (the best non-empty answer) and
        `no_answer_score` (null score minus that span's score, in logits: above 0.0 the
        prediction is ""), the values the official script's --na-prob-file reads."""
        bests = self.spans(outputs, raw)
        preds, _ = self.answers(outputs, raw, bests)
        rows = [{"id": r["id"], "source": r["question"], "references": list(r["answers"]["text"]),
                 "prediction": p} for r, p in zip(raw.to_list(), preds)]
        if bests is not None and self.version == "v2":
            for row, b in zip(rows, bests):
                row["best_span"], row["no_answer_score"] = b.text, b.no_answer_score
        return rows

    def prediction_files(self, rows: list[dict], raw: Any) -> dict[str, Any]:
        """What the official evaluate-v1.1.py / evaluate-v2.0.py read, beside predictions.jsonl:
        `dataset` (the scored questions in SQuAD's layout, whatever the file's layout or split),
        `answers` (id -> the answer the run scored: v2.0 "" where it abstains), so that the script
        given these two alone gives the run's exact_match, f1 and HasAns/NoAns; and, for
        extractive v2.0, the pair --na-prob-file reads (`answer_files`)."""
        ids = unique_ids([r["id"] for r in rows])
        return {"dataset": squad_layout(raw.to_list(), self.version, ids), **answer_files(ids, rows)}

    # files an older toolkit wrote beside predictions.jsonl, removed where it writes them anew:
    # predictions.na_prob.json, whose answers.json partner held the best spans (now best_spans.json)
    retired_prediction_files: ClassVar[tuple[str, ...]] = ("na_prob",)

    # --- prediction on new inputs (`toolkit predict`, the API's predict) -------------------------
    def predict_fields(self, model: Any) -> list[str]:
        """The names predict's rows carry the question and the context under: the run's
        task.question_field / context_field, else `question` and `context` (SQuAD's layout, the
        Hub). An input's own names for them are found by `input_fields`."""
        return [self.question_field or "question", self.context_field or "context"]

    def input_fields(self, names: list[str], kinds: dict[str, str], where: str) -> list[str]:
        """The question and context fields of a predict input, found as a file to train or
        evaluate on has them found (`QaFields.resolve`): task.question_field / context_field where
        the recipe sets them, else the conventional names (`question`, `query`, `q`; `context`,
        `passage`, ...), else the one text field no other role takes. Predict demanded the names
        the run's own files had (`query` / `passage`) where `toolkit eval RUN task.eval_file=NEW`
        found them in NEW: an input of SQuAD's names was refused for a run trained on an export's."""
        found = self.fields.resolve(where, {k: "text" if v == "text" else "other" for k, v in kinds.items()},
                                    roles=("question", "context"),
                                    fix="name them so in the input (or give JSONL or CSV with those fields)")
        return [str(found["question"]), str(found["context"])]

    def predict_file(self, path: Any) -> list[dict] | None:
        """SQuAD's document layout, which training and evaluation read: predict read only flat
        records, and refused it (field 'question' is missing; it has title, paragraphs)."""
        return document_questions(path, tuple(self.predict_fields(None)))

    def predict_records(self, items: list[Any]) -> list[Any]:
        return record_questions(items, tuple(self.predict_fields(None)))

    def question_ids(self, rows: list[dict]) -> list[str]:
        """Each input's question id, as the readers find it: the run's id field (task.id_field, or
        the one found in the recipe's flat file), else `id`, `qid`, `question_id`, else the input's
        number (0, 1, ...: the id `read_squad` gives a flat record without one). Predict dropped
        the ids, so its answers could not be joined back to their questions."""
        if "_id_names" not in self.__dict__:
            named = self.id_field
            for name in (self.eval_file, self.train_file):
                if named is None and name and data_path(self.expand(name)).is_file():
                    named = (flat_fields(self.expand(name), self.fields) or {}).get("id")
                    break
            self.__dict__["_id_names"] = list(dict.fromkeys([n for n in (named,) if n] + list(FIELD_NAMES["id"])))
        ids = []
        for i, row in enumerate(rows):
            key = next((k for k in self.__dict__["_id_names"] if k in row), None)
            value = question_id(row[key]) if key else str(i)
            if not isinstance(value, str) or not value.strip():
                shown = "blank text" if isinstance(value, str) else readers.json_type(value)
                raise UserError(f"predict: input {i} (counted from 0): its id '{key}' is {shown}; expected text "
                                "or a number, the question's id (or leave the field out: the input's number)")
            ids.append(value)
        return ids

    def predict_files(self, rows: list[dict]) -> dict[str, Any]:
        """What the official evaluate-v1.1.py / evaluate-v2.0.py read as predictions: `answers`,
        question id -> the answer (v2.0: "" where the run abstains), and for extractive v2.0 the
        `best_spans` / `na_probs` pair, as in the run folder (`answer_files`). Repeated ids are
        named id#2, ... as in the run's own files (`unique_ids`)."""
        ids = unique_ids([r["id"] for r in rows], "the answers files beside --output", "the inputs")
        return answer_files(ids, rows)

    def raw_input(self, row: dict) -> dict:
        question, context = self.predict_fields(None)
        return {"question": str(row[question]), "context": str(row[context]),
                "answers": {"text": [], "answer_start": []}}

    def predict(self, model: Any, tokenizer: Any, rows: list[dict]) -> list[dict]:
        """Per row its question and context and the answer (`prediction`), as evaluation finds it:
        the best span over the context's windows, or generated text. Extractive v2.0 adds what
        predictions.jsonl's rows carry: `best_span` (the best non-empty answer) and
        `no_answer_score` (null score minus that span's score, in logits): `prediction` is ""
        where it is above 0.0, the threshold the scores use; the run's `best_f1_thresh` is on the
        same scale. A generative v2.0 model answers "" itself. Every row starts with the question's
        `id` (`question_ids`), the key of the official scripts' files."""
        ids = self.question_ids(rows)
        if not self.extractive:
            out = super().predict(model, tokenizer, rows)
            return [{"id": i, **r, "prediction": p}
                    for i, r, p in zip(ids, out, self.abstained([r["prediction"] for r in out]))]
        raw = [self.raw_input(r) for r in rows]
        question, context = self.predict_fields(model)
        out = []
        for i, r, b in zip(ids, raw, self.best_answers(model, tokenizer, raw)):
            row = {"id": i, question: r["question"], context: r["context"], "prediction": b.text}
            if self.version == "v2":
                gap = b.no_answer_score
                row.update(prediction="" if gap > NULL_THRESHOLD else b.text, best_span=b.text, no_answer_score=gap)
            out.append(row)
        return out

    def best_answers(self, model: Any, tokenizer: Any, raw: list[dict], batch_size: int = 32) -> list[Any]:
        """The best span of each raw row over its windows (windowed and searched as in evaluation)."""
        feats = self.windows(tokenizer, [r["question"] for r in raw], [r["context"] for r in raw],
                             [r["answers"] for r in raw])
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


def span_loss(start: torch.Tensor, end: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """(b,) mean of the start and end cross-entropies of each window, from (b, t) logits."""
    return (F.cross_entropy(start, batch["start_positions"], reduction="none")
            + F.cross_entropy(end, batch["end_positions"], reduction="none")) / 2


def answer_files(ids: list[str], rows: list[dict]) -> dict[str, Any]:
    """The predictions files of the official scripts, keyed by `ids` (`unique_ids`):
    `answers`, id -> the final answer each row was scored on (`prediction`: v2.0 "" where the run
    abstains), so `evaluate-v2.0.py DATASET ANSWERS` alone gives the run's exact_match, f1 and
    HasAns/NoAns, as run_qa.py's predictions.json does. Rows of extractive v2.0 (with `best_span`
    and `no_answer_score`) add the pair --na-prob-file reads: `best_spans` (id -> the best
    non-empty span, abstentions too) and `na_probs` (id -> null score minus that span's score, in
    logits), so that `evaluate-v2.0.py DATASET BEST_SPANS --na-prob-file NA_PROBS
    --na-prob-thresh 0` gives the run's best_exact and best_f1, and its exact_match, f1 and parts
    but in one place, the script's: with that file it scores an abstention on a question whose
    every listed answer normalises to nothing ("the") as wrong, the run (and the script on
    `answers`) as right. `answers` held the best spans beside `na_prob`: given alone to the
    script, as v2.0 predictions are, it scored the run as if it never abstained, exit 0."""
    files: dict[str, Any] = {"answers": {i: r["prediction"] for i, r in zip(ids, rows)}}
    if rows and "no_answer_score" in rows[0]:
        files["best_spans"] = {i: r["best_span"] for i, r in zip(ids, rows)}
        files["na_probs"] = {i: r["no_answer_score"] for i, r in zip(ids, rows)}
    return files


def unique_ids(ids: list[str], files: str = "predictions.dataset/answers/best_spans/na_probs.json",
               among: str = "the scored questions") -> list[str]:
    """The official scripts key answers by id: a question id given twice is written `id#2` (and
    so on) in their files, so that each question is scored on its own answer (said once). A name
    the file itself gives another question is skipped (`a#3` beside `a`, `a`, `a#2`): `a#2`
    twice made the script score one question's answer for both."""
    seen: dict[str, int] = {}
    taken = set(ids)
    out = []
    for i in ids:
        seen[i] = seen.get(i, 0) + 1
        if seen[i] == 1:
            out.append(i)
            continue
        n = seen[i]
        while f"{i}#{n}" in taken:
            n += 1
        seen[i] = n
        taken.add(f"{i}#{n}")
        out.append(f"{i}#{n}")
    repeated = sum(n > 1 for n in seen.values())
    if repeated and os.environ.get("RANK", "0") == "0":
        print(f"warning: {repeated} question id(s) appear more than once among {among}; {files} name the "
              "repeats id#2, id#3, ... so that the official script scores each question", file=sys.stderr)
    return out


def squad_layout(rows: list[dict], version: str, ids: list[str]) -> dict:
    """Rows in the Hub's schema -> a SQuAD-format document (articles, paragraphs, questions) in
    their order, each question under its id in `ids`: the gold file the official scripts read."""
    articles: dict[Any, dict] = {}
    for r, qid in zip(rows, ids):
        article = articles.setdefault(r.get("article", r["title"]), {"title": r["title"], "paragraphs": {}})
        article["paragraphs"].setdefault(r["context"], []).append(
            {"id": qid, "question": r["question"], "answers": [
                {"text": t, "answer_start": int(s)} for t, s in zip(r["answers"]["text"], r["answers"]["answer_start"])]})
    data = [{"title": a["title"], "paragraphs": [{"context": c, "qas": q} for c, q in a["paragraphs"].items()]}
            for a in articles.values()]
    return {"version": VERSION_FOLDERS[version], "data": data}
