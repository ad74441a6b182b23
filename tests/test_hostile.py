"""The hostile suite: what a careless or hostile user hands the toolkit, one table row each.

Every bad input is one `error:` line naming what is wrong (the file and line for data), exit code
2, no traceback and no run folder left; valid odd input gives the right result. Reader errors
come before any weight loads, so the data rows run in-process through `toolkit.cli.main` in well
under a second each. KINDS counts the rows by kind (printed by `test_suite_size`).
"""

from __future__ import annotations

import errno
import gzip
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import pytest

from conftest import write_recipe

Make = Callable[[Path], list]


# --- recipes around one data file -------------------------------------------------------------
def _file(tmp: Path, name: str, content: bytes | str) -> Path:
    path = tmp / name
    if name.endswith(".gz") and not isinstance(content, bytes):
        path.write_bytes(gzip.compress(content.encode()))
    else:
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


def classify(content: bytes | str, name: str = "d.csv", extra: str = "") -> Make:
    def make(tmp: Path) -> list:
        path = _file(tmp, name, content)
        return ["run", write_recipe(tmp / "r.yaml", f"""model: {{checkpoint: bert-base-uncased}}
task: {{name: text_classification, train_file: {path}, eval_file: {path}{extra}}}
method: {{name: full}}
"""), "--smoke"]
    return make


def squad(content: Any, name: str = "s.json") -> Make:
    def make(tmp: Path) -> list:
        text = content if isinstance(content, (str, bytes)) else json.dumps(content, indent=1)
        path = _file(tmp, name, text)
        return ["run", write_recipe(tmp / "r.yaml", f"""model: {{checkpoint: bert-base-uncased}}
task: {{name: squad, eval_file: {path}, split_articles: 0.5}}
method: {{name: full}}
"""), "--smoke"]
    return make


def summarize(content: bytes | str, name: str = "d.jsonl") -> Make:
    def make(tmp: Path) -> list:
        path = _file(tmp, name, content)
        return ["run", write_recipe(tmp / "r.yaml", f"""model: {{checkpoint: t5-base}}
task: {{name: summarization, subset: custom, train_file: {path}, eval_file: {path}}}
method: {{name: full}}
"""), "--smoke"]
    return make


def translate(files: dict[str, bytes | str], pattern: str = "p.{lang}") -> Make:
    def make(tmp: Path) -> list:
        for name, content in files.items():
            _file(tmp, name, content)
        path = tmp / pattern
        return ["run", write_recipe(tmp / "r.yaml", f"""model: {{checkpoint: t5-base}}
task: {{name: translation, subset: custom, source_lang: en, target_lang: de, train_file: '{path}', eval_file: '{path}'}}
method: {{name: full}}
"""), "--smoke"]
    return make


def pretrain(content: bytes | str, name: str = "t.txt", objective: str = "mlm", extra: str = "") -> Make:
    checkpoint = {"mlm": "bert-base-uncased", "clm": "gpt2"}[objective]

    def make(tmp: Path) -> list:
        path = _file(tmp, name, content)
        return ["run", write_recipe(tmp / "r.yaml", f"""model: {{checkpoint: {checkpoint}}}
task: {{name: {objective}, train_file: {path}{extra}}}
method: {{name: full}}
"""), "--smoke"]
    return make


def validate(text: str | bytes, base: dict[str, str | bytes] | None = None) -> Make:
    def make(tmp: Path) -> list:
        for name, content in (base or {}).items():
            _file(tmp, name, content)
        return ["validate", _file(tmp, "r.yaml", text)]
    return make


def with_env(make: Make, **env: str) -> Make:
    """A row run with environment settings (the reader's size limits)."""
    make.env = env  # type: ignore[attr-defined]
    return make


# --- data ---------------------------------------------------------------------------------------
CSV = "text,label\ngood movie,pos\nbad movie,neg\nfine film,pos\nawful film,neg\n"
JSONL = "".join(json.dumps({"text": t, "label": l}) + "\n" for t, l in
                [("good movie", 1), ("bad movie", 0), ("fine film", 1), ("awful film", 0)])
PAIRS = "".join(json.dumps({"source": f"document number {i} about things", "target": f"summary {i}"}) + "\n"
                for i in range(4))


QUESTION_IDS = itertools.count(1)


def qa(question: Any = "Where?", answers: Any = None, context: Any = "Paris is in France.", **extra: Any) -> dict:
    q = {"id": f"q{next(QUESTION_IDS)}", "question": question,  # ids unique, as the official scripts need
         "answers": [{"text": "Paris", "answer_start": 0}] if answers is None else answers, **extra}
    if question is ...:
        del q["question"]
    if answers is ...:
        del q["answers"]
    return {"title": "T", "paragraphs": [{"context": context, "qas": [q]}]}


def articles(*bad: Any) -> dict:
    """Two good articles, then the bad ones; every question id distinct (a repeated id is an
    error of its own)."""
    data = [qa(), qa(), *bad]
    for i, article in enumerate(data):
        for paragraph in article.get("paragraphs", []) if isinstance(article, dict) else []:
            for q in paragraph.get("qas", []) if isinstance(paragraph, dict) else []:
                if isinstance(q, dict) and q.get("id") == "q1":
                    q["id"] = f"q{i + 1}"
    return {"data": data}


def jsonl(*rows: Any) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)


GOOD = {"text": "good movie", "label": 1}
BAD_GZ = b"\x1f\x8b\x08\x00" + b"not really gzip" * 10
CUT_GZ = gzip.compress(CSV.encode() * 50)[:-40]

DATA: dict[str, tuple[str, Make, str]] = {
    # --- text classification: CSV / TSV / JSON / JSONL / gz ---
    "csv empty": ("classification", classify(""), "the file is empty"),
    "csv whitespace only": ("classification", classify("  \n\n\t\n"), "the file is empty (only whitespace)"),
    "csv header only": ("classification", classify("text,label\n"), "has a header and no rows"),
    "csv latin-1 byte": ("classification", classify(b"text,label\ngood,1\nb\xe4d,0\n"), "d.csv:3: not UTF-8 text (byte 0xe4)"),
    "csv latin-1 header": ("classification", classify(b"t\xe9xt,label\ngood,1\n"), "d.csv:1: not UTF-8"),
    "csv binary": ("classification", classify(bytes(range(256)) * 4), "not UTF-8 text"),
    "csv ragged row": ("classification", classify("text,label\ngood,1\nbad,0,0\n"), "d.csv:3: expected 2 fields like the header"),
    "csv second label column": ("classification", classify("text,label,label\ngood,1,0\nbad,0,1\n"),
                                "d.csv:1: the header names column 'label' twice (columns 2 and 3)"),
    "csv empty text cell": ("classification", classify("text,label\ngood,1\n   ,0\n"), "d.csv:3: column 'text' is empty"),
    "csv empty cell after a quoted newline": ("classification", classify('text,label\n"two\nlines",1\n"",0\n'),
                                              "d.csv:4: column 'text' is empty"),
    "csv no label column": ("classification", classify("text,stars\ngood,1\nbad,0\n", extra=", text_columns: [text], label_column: label"),
                            "column 'label' is missing"),
    "csv one label": ("classification", classify("text,label\ngood,1\nfine,1\n"), "has 1 distinct label(s)"),
    "csv label outside labels": ("classification", classify("text,label\ngood,1\nbad,2\n", extra=", labels: [0, 1]"),
                                 "d.csv:3: label '2' is not one of 0, 1"),
    "csv regression word": ("classification", classify("text,label\na,1.5\nb,high\n", extra=", problem: regression"),
                            "d.csv:3: label 'high' is not a number"),
    "csv regression 1_0": ("classification", classify("text,label\na,1.5\nb,1_0\n", extra=", problem: regression"),
                           "d.csv:3: label '1_0' is not a number"),
    "csv regression inf": ("classification", classify("text,label\na,1.5\nb,inf\n", extra=", problem: regression"),
                           "d.csv:3: label 'inf' is not a finite number"),
    "csv header of blanks": ("classification", classify(",\na,1\n"), "d.csv:1: the first line should be a header"),
    # a first row with more fields than the header: pandas would take the first for an index, silently
    "csv first row with an unquoted comma": ("classification", classify("text,label\nLoved it, truly,pos\nHated it, sadly,neg\n"),
                                             "d.csv:2: expected 2 fields like the header (comma-separated), got 3"),
    "csv trailing comma on every row": ("classification", classify("text,label\ngood,pos,\nbad,neg,\n"),
                                        "d.csv:2: expected 2 fields like the header"),
    "tsv first row with an extra tab": ("classification", classify("sentence\tlabel\ngood\tfilm\t1\nbad\tfilm\t0\n", "d.tsv"),
                                        "d.tsv:2: expected 2 fields like the header (tab-separated), got 3"),
    "csv label and Label columns": ("classification", classify("text,label,Label \ngood,pos,neg\nbad,neg,pos\n"),
                                    "d.csv: the fields 'label' and 'Label ' are one name once case and spaces are ignored"),
    "summary summary and Summary fields": ("summarization", summarize('{"dialogue": "a b", "summary": "a", "Summary": "b"}\n'),
                                           "d.jsonl: the fields 'summary' and 'Summary' are one name"),
    "csv empty label cell": ("classification", classify("text,label\ngood,pos\nbad,\nfine,neg\n"),
                             "d.csv:3: label column 'label' is empty; every row needs a label (one of neg, pos)"),
    "jsonl label a string beside numbers": ("classification", classify(jsonl(GOOD, {"text": "b", "label": "1"}, {"text": "c", "label": 0}), "d.jsonl"),
                                            "d.jsonl:2: 'label' is a string here but a number at line 1; one type per field"),
    "json label true beside numbers": ("classification", classify(json.dumps([GOOD, {"text": "b", "label": True}, {"text": "c", "label": 0}], indent=1), "d.json"),
                                       "d.json:8: record 2: 'label' is true/false here but a number at record 1"),
    "jsonl regression labels true/false": ("classification", classify(jsonl({"text": "a", "label": True}, {"text": "b", "label": False}),
                                                                      "d.jsonl", extra=", problem: regression"),
                                           "d.jsonl:1: label true is true/false, not a number (problem: regression)"),
    "tsv ragged row": ("classification", classify("sentence\tlabel\ngood\t1\nbad\t0\t0\n", "d.tsv"),
                       "d.tsv:3: expected 2 fields like the header (tab-separated)"),
    "gz not gzip": ("classification", classify(BAD_GZ, "d.csv.gz"), "not a readable gzip file"),
    "gz cut short": ("classification", classify(CUT_GZ, "d.csv.gz"), "not a readable gzip file"),
    "gz holding latin-1": ("classification", classify(gzip.compress(b"text,label\nb\xe4d,0\n"), "d.csv.gz"),
                           "d.csv.gz:2: not UTF-8"),
    "unknown extension": ("classification", classify(CSV, "d.xlsx"), "unknown data format"),
    "jsonl bad syntax": ("classification", classify(jsonl(GOOD, '{"text": '), "d.jsonl"), "d.jsonl:2: not valid JSON"),
    "jsonl array line": ("classification", classify(jsonl(GOOD, "[1, 2]"), "d.jsonl"),
                         "d.jsonl:2: expected a JSON object per line, got a list"),
    "jsonl text is a list": ("classification", classify(jsonl({"text": ["a", "b"], "label": 1}, {"text": ["c"], "label": 0}), "d.jsonl"),
                             "d.jsonl:1: column 'text' is a list, expected text"),
    "jsonl one text is a list": ("classification", classify(jsonl(GOOD, {"text": ["c"], "label": 0}), "d.jsonl"),
                                 "d.jsonl:2: column 'text' is a list, expected text"),
    "jsonl one text is a number": ("classification", classify(jsonl(GOOD, {"text": 5, "label": 0}), "d.jsonl"),
                                   "d.jsonl:2: column 'text' is a number, expected text"),
    "jsonl texts are numbers": ("classification", classify(jsonl({"text": 4, "label": 1}, {"text": 5, "label": 0}), "d.jsonl"),
                                "d.jsonl:1: column 'text' is a number (4), expected text"),
    "jsonl text is an object": ("classification", classify(jsonl(GOOD, {"text": {"a": 1}, "label": 0}), "d.jsonl"),
                                "d.jsonl:2: column 'text' is an object, expected text"),
    "jsonl text missing": ("classification", classify(jsonl(GOOD, {"label": 0}), "d.jsonl"),
                           "d.jsonl:2: column 'text' is missing"),
    "jsonl text null": ("classification", classify(jsonl(GOOD, {"text": None, "label": 0}), "d.jsonl"),
                        "d.jsonl:2: column 'text' is missing"),
    "jsonl labels lists": ("classification", classify(jsonl({"text": "a", "label": [1]}, {"text": "b", "label": [0]}), "d.jsonl"),
                           "d.jsonl:1: label column 'label' is a list, expected text or a number"),
    "jsonl one label an object": ("classification", classify(jsonl(GOOD, {"text": "b", "label": {"y": 1}}), "d.jsonl"),
                                  "d.jsonl:2: label column 'label' is an object, expected text or a number"),
    "jsonl key twice": ("classification", classify(jsonl('{"text": "a", "label": 1, "label": 0}', GOOD), "d.jsonl"),
                        "d.jsonl:1: the key 'label' appears twice in one object"),
    "jsonl line counted past blanks": ("classification", classify(jsonl(GOOD, "", "", {"text": 7, "label": 0}), "d.jsonl"),
                                       "d.jsonl:4: 'text' is a number here but a string at line 1; one type per field"),
    "jsonl only blank lines": ("classification", classify("\n\n\n", "d.jsonl"), "the file is empty"),
    "json an object": ("classification", classify(json.dumps(GOOD), "d.json"), "expected a JSON list of objects"),
    "json bad syntax": ("classification", classify('[\n{"text": "a", "label": 1},\n{"text": }\n]', "d.json"),
                        "d.json:3: not valid JSON"),
    "json list of strings": ("classification", classify('[\n"a",\n"b"\n]', "d.json"), "d.json:2: expected a JSON object, got a string"),
    "file too large": ("classification", with_env(classify(CSV * 100), TOOLKIT_MAX_INPUT_MB="0.001"),
                       "holds more than 0.001 MiB of data; the limit is TOOLKIT_MAX_INPUT_MB"),
    "gzip bomb": ("classification", with_env(classify(gzip.compress(b"text,label\n" + b"a,1\n" * 2_000_000), "d.csv.gz"),
                                             TOOLKIT_MAX_INPUT_MB="1"), "holds more than 1 MiB of data once decompressed"),
    "json document too large": ("classification", with_env(classify(json.dumps([GOOD] * 2000), "d.json"),
                                                           TOOLKIT_MAX_JSON_MB="0.01"), "write it as JSONL"),
    "bad size limit": ("classification", with_env(classify(CSV), TOOLKIT_MAX_INPUT_MB="lots"),
                       "TOOLKIT_MAX_INPUT_MB: expected a positive number of MiB, got 'lots'"),
    # a {"data": [...]} document whose field mixes JSON types inside a list or object (pandas reads
    # it): pyarrow's own line naming no record, where the same records as JSONL read or name a line
    "json document eval references mixing text and number": ("summarization", summarize(json.dumps({"data": [
        {"dialogue": "a b", "summary": ["a", "b"]}, {"dialogue": "c d", "summary": ["c", 2]}]}), "d.json"),
        "d.json:1: record 2: 'summary[]' is a number here but a string at record 1"),
    "json document pretraining meta list then object": ("clm", pretrain(json.dumps({"data": [
        {"text": "a b", "meta": {"k": [1]}}, {"text": "c d", "meta": {"k": ["x"]}}]}), "t.json", "clm"),
        "t.json:1: record 2: 'meta.k[]' is a string here but a number at record 1"),
    "json document translation references mixing": ("translation", translate({"t.json": json.dumps({"data": [
        {"translation": {"en": "a b", "de": ["a", "b"]}}, {"translation": {"en": "c d", "de": [["c"], "d"]}}]})}, "t.json"),
        "t.json:1: record 2: 'translation.de[]' is a list here but a string at record 1"),
    # --- SQuAD ---
    "squad article is a string": ("squad", squad(articles("oops")), "s.json:"),
    "squad answers a string": ("squad", squad(articles(qa(answers="Paris"))), "'answers' is a string, expected a list"),
    "squad question missing": ("squad", squad(articles(qa(question=...))), "'question' is missing"),
    "squad question a number": ("squad", squad(articles(qa(question=5))), "'question' is a number, expected text"),
    "squad contexts numbers": ("squad", squad({"data": [qa(context=7), qa(context=8)]}), "'context' is a number, expected text"),
    "squad paragraphs missing": ("squad", squad({"data": [qa(), {"title": "U"}]}), "'paragraphs' is missing"),
    "squad qas an object": ("squad", squad({"data": [qa(), {"title": "U", "paragraphs": [{"context": "c", "qas": {"id": 1}}]}]}),
                            "'qas' is an object, expected a list"),
    "squad answer_start a string": ("squad", squad(articles(qa(answers=[{"text": "Paris", "answer_start": "0"}]))),
                                    "'answer_start' is a string, expected a whole number"),
    "squad negative answer_start": ("squad", squad(articles(qa(answers=[{"text": "France", "answer_start": -7}]))),
                                    "answer 'France' at answer_start -7 does not match the context there"),
    "squad offset mismatch": ("squad", squad(articles(qa(answers=[{"text": "Paris", "answer_start": 3}]))),
                              "does not match the context there"),
    "squad is_impossible a string": ("squad", squad(articles(qa(is_impossible="no"))), "'is_impossible' is a string"),
    # a question without the field was read as unanswerable (v2.0 scored "" right on it)
    "squad answers missing": ("squad", squad(articles(qa(answers=...))),
                              "'answers' is missing; list the question's answers"),
    "squad answer_start a fraction": ("squad", squad(articles(qa(answers=[{"text": "France", "answer_start": 12.5}]))),
                                      "article 2 ('T'), question"),  # not article 0's whole 0
    "squad blank answer": ("squad", squad(articles(qa(answers=[{"text": " ", "answer_start": 5}]))),
                           "answer ' ' at answer_start 5 is blank"),
    "squad id missing": ("squad", squad({"data": [{"title": "T", "paragraphs": [{"context": "c d", "qas": [
        {"question": "q?", "answers": []}]}]}] * 2}), "'id' is missing"),
    "squad blank question": ("squad", squad(articles(qa(question="   "))), "empty context or question"),
    "squad a list at the top": ("squad", squad([qa()]), "expected a JSON object with a 'data' list"),
    "squad data not a list": ("squad", squad({"data": 5}), "s.json"),
    "squad bad syntax": ("squad", squad('{"data": [\n{"title": }\n]}'), "s.json:2: not valid JSON"),
    "squad latin-1": ("squad", squad(b'{"data": [{"title": "caf\xe9"}]}'), "s.json:1: not UTF-8"),
    "squad empty": ("squad", squad(""), "the file is empty"),
    "squad no questions": ("squad", squad({"data": [{"title": "T", "paragraphs": []}, {"title": "U", "paragraphs": []}]}),
                           "no questions found"),
    "squad not json": ("squad", squad("{}", "s.csv"), "unknown data format"),
    # --- summarization ---
    "summary target a list": ("summarization", summarize(jsonl({"source": "a b", "target": ["x"]}, {"source": "c", "target": "y"})),
                              "d.jsonl:1: 'target' is a list (1 text), and a train file's target is one text"),
    "summary source missing": ("summarization", summarize(jsonl({"source": "a b", "target": "x"}, {"target": "y"})),
                               "d.jsonl:2: 'source' is missing"),
    "summary csv empty source": ("summarization", summarize("source,target\na b,x\n ,y\n", "d.csv"), "d.csv:3: 'source' is empty"),
    "summary data a number": ("summarization", summarize(json.dumps({"data": [{"source": "a", "target": "x"},
                                                                              {"source": "b", "target": 3}]}, indent=1), "d.json"),
                              "d.json:9: record 2: 'target' is a number here but a string at record 1"),
    "summary list with a string": ("summarization", summarize('[{"source": "a", "target": "x"},\n "b"]', "d.json"),
                                   "d.json:2: expected a JSON object, got a string"),
    "summary latin-1": ("summarization", summarize(PAIRS.encode() + b'{"source": "\xe9"}\n'), "d.jsonl:5: not UTF-8"),
    "summary broken gz": ("summarization", summarize(BAD_GZ, "d.jsonl.gz"), "not a readable gzip file"),
    "summary no target column": ("summarization", summarize("source\na\nc\n", "d.csv"),
                                 "cannot tell which field is the input and which the output (fields: 'source')"),
    "summary text file": ("summarization", summarize("a\n", "d.txt"), "unknown format '.txt'"),
    "summary whitespace": ("summarization", summarize("\n \n"), "the file is empty"),
    "summary csv ragged": ("summarization", summarize("source,target\na,b\nc,d,e\n", "d.csv"), "d.csv:3: expected 2 fields"),
    "summary csv first row with an unquoted comma": ("summarization", summarize("source,target\na long, long text,short\nmore, text,x\n", "d.csv"),
                                                     "d.csv:2: expected 2 fields like the header"),
    "summary key twice": ("summarization", summarize('{"source": "a", "source": "b", "target": "c"}\n'),
                          "d.jsonl:1: the key 'source' appears twice"),
    "summary missing file": ("summarization", summarize(PAIRS, "d.jsonl"), ""),  # replaced below
    # --- translation ---
    "parallel lengths differ": ("translation", translate({"p.en": "a\nb\nc\n", "p.de": "x\ny\n"}),
                                "3 lines but"),
    "parallel empty target line": ("translation", translate({"p.en": "a\nb\n", "p.de": "x\n  \n"}),
                                   "p.de:2: the target line is empty"),
    "parallel latin-1": ("translation", translate({"p.en": "a\nb\n", "p.de": b"x\n\xfc\n"}), "p.de:2: not UTF-8"),
    "parallel missing side": ("translation", translate({"p.en": "a\nb\n"}), "p.de: no such file"),
    "parallel broken gz": ("translation", translate({"p.en.gz": "a\nb\n", "p.de.gz": BAD_GZ}, "p.{lang}.gz"),
                           "p.de.gz: not a readable gzip file"),
    "parallel whitespace source": ("translation", translate({"p.en": " \n\n", "p.de": "x\ny\n"}), "p.en: the file is empty"),
    # a carriage return inside a line: datasets' text reader breaks the line there, shifting the pairs
    "parallel carriage return inside a line": ("translation", translate({"p.en": "a dog\ntwo\rcats\nsun\n", "p.de": "ein hund\nzwei\nrote\rsonne\n"}),
                                               "p.en:2: a carriage return (\\r) inside a line"),
    "records a number": ("translation", translate({"t.jsonl": jsonl({"en": "a", "de": "b"}, {"en": 4, "de": "c"})}, "t.jsonl"),
                         "t.jsonl:2: 'en' is a number, expected text"),
    "records field missing": ("translation", translate({"t.jsonl": jsonl({"en": "a", "de": "b"}, {"en": "c"})}, "t.jsonl"),
                              "t.jsonl:2: 'de' is missing"),
    # --- pretraining text ---
    "mlm whitespace only": ("pretraining", pretrain(" \n\n  \n\t\n"), "t.txt: the file is empty (only whitespace)"),
    "mlm empty": ("pretraining", pretrain(""), "t.txt: the file is empty"),
    "mlm latin-1": ("pretraining", pretrain(b"one line\ntwo \xe9\n"), "t.txt:2: not UTF-8"),
    "mlm broken gz": ("pretraining", pretrain(BAD_GZ, "t.txt.gz"), "not a readable gzip file"),
    "mlm jsonl text a list": ("pretraining", pretrain(jsonl({"text": "a b"}, {"text": ["c", "d"]}), "t.jsonl"),
                              "t.jsonl:2: 'text' is a list, expected text"),
    "mlm jsonl texts lists": ("pretraining", pretrain(jsonl({"text": ["a"]}, {"text": ["c", "d"]}), "t.jsonl"),
                              "t.jsonl:1: 'text' is a list, expected text"),
    "mlm jsonl text a number": ("pretraining", pretrain(jsonl({"text": "a b"}, {"text": 3}), "t.jsonl"),
                                "t.jsonl:2: 'text' is a number"),
    "mlm jsonl no text field": ("pretraining", pretrain(jsonl({"title": "a", "note": "a b"}), "t.jsonl"),
                                "cannot tell which field holds the text (fields: 'title', 'note'); set task.text_field"),
    "mlm jsonl named text field missing": ("pretraining", pretrain(jsonl({"body": "a b"}), "t.jsonl", extra=", text_field: text"),
                                           "has no field 'text'"),
    "mlm jsonl empty texts": ("pretraining", pretrain(jsonl({"text": ""}, {"text": " "}), "t.jsonl"),
                              "has no document with any text"),
    "mlm carriage return inside a line": ("pretraining", pretrain("one line\r\ntwo\rparts\n"), "t.txt:2: a carriage return (\\r) inside a line"),
    "clm one document": ("pretraining", pretrain("just one line of text\n", objective="clm"), "needs at least 2"),
    "clm a device as eval file": ("pretraining", pretrain("a b\nc d\n", objective="clm", extra=", eval_file: /dev/null"),
                                  "/dev/null: is a device, not a file"),
}


def _missing_summary(tmp: Path) -> list:
    return summarize(PAIRS)(tmp)[:0] + ["run", write_recipe(tmp / "r.yaml", f"""model: {{checkpoint: t5-base}}
task: {{name: summarization, subset: custom, eval_file: {tmp / 'nope.jsonl'}}}
method: {{name: full}}
"""), "--smoke"]


DATA["summary missing file"] = ("summarization", _missing_summary, "nope.jsonl: no such file")


def ner(content: bytes | str, name: str = "n.txt") -> Make:
    def make(tmp: Path) -> list:
        path = _file(tmp, name, content)
        return ["run", write_recipe(tmp / "r.yaml", f"""model: {{checkpoint: bert-base-uncased}}
task: {{name: ner, train_file: {path}, eval_file: {path}}}
method: {{name: full}}
"""), "--smoke"]
    return make


DATA.update({
    "ner latin-1": ("ner", ner(b"EU B-ORG\nrejects O\n\nM\xfcller B-PER\n"), "n.txt:4: not UTF-8"),
    "ner whitespace only": ("ner", ner(" \n\n\t\n"), "n.txt: the file is empty (only whitespace)"),
    "ner token without tag": ("ner", ner("EU B-ORG\nrejects\n"), "n.txt:2: expected 'token TAG'"),
    "ner unknown tag": ("ner", ner("EU B-ORG\nrejects B-VERB\n"), "n.txt:2: tag 'B-VERB' is not one of task.labels"),
    "ner only docstart": ("ner", ner("-DOCSTART- O\n\n"), "n.txt: holds no sentences"),
    "ner carriage return inside a line": ("ner", ner("EU B-ORG\nrejects\rO\n"), "n.txt:2: a carriage return (\\r) inside a line"),
    "ner broken gzip": ("ner", ner(b"\x1f\x8b\x08\x00garbage", name="n.txt.gz"), "not a readable gzip file"),
    "ner invisible word": ("ner", ner("EU B-ORG\n\u200b O\n"), "n.txt:2: the token '\\u200b' is blank"),
    "ner jsonl invisible word": ("ner", ner(jsonl({"tokens": ["EU", "\u200b"], "ner_tags": ["B-ORG", "O"]}), "n.jsonl"),
                                 "n.jsonl:1: 'tokens' should be a non-empty list of words"),
})

# A text of nothing but whitespace, control and format characters (zero-width space, BOM, soft
# hyphen) is as empty as a blank one: BERT's and T5's tokenizers drop every character of it, and
# the model was trained on, or predicted a label for, [CLS] [SEP] alone (exit 0).
DATA.update({
    "jsonl text invisible": ("classification", classify(jsonl(GOOD, {"text": "\u200b\ufeff", "label": 0}), "d.jsonl"),
                             "d.jsonl:2: column 'text' is empty (only U+200B ZERO WIDTH SPACE, U+FEFF ZERO WIDTH "
                             "NO-BREAK SPACE); every record needs some text"),
    "csv text control characters": ("classification", classify("text,label\ngood,1\n\x01 \x02,0\n"),
                                    "d.csv:3: column 'text' is empty (only U+0001 "),
    "summary source control characters": ("summarization", summarize(jsonl({"source": "a b", "target": "x"},
                                                                           {"source": "\x07\u00ad", "target": "y"})),
                                          "d.jsonl:2: 'source' is empty (only U+0007"),
    "parallel invisible target line": ("translation", translate({"p.en": "a\nb\n", "p.de": "x\n\u200b\u200d\n"}),
                                       "p.de:2: the target line is empty"),
    "squad invisible question": ("squad", squad(articles(qa(question="\u200b\u2060"))), "empty context or question"),
    "mlm jsonl invisible texts": ("pretraining", pretrain(jsonl({"text": "\u200b"}, {"text": "\x01\ufeff"}), "t.jsonl"),
                                  "has no document with any text"),
})

SECRET = "hunter2-secret"
RECIPES: dict[str, tuple[str, Make, str]] = {
    "extends a key-value file": ("recipe", validate("extends: creds.yaml\n", {"creds.yaml": f"password: {SECRET}\nuser: root\n"}),
                                 "creds.yaml: is not a recipe"),
    "extends a shadow-like file": ("recipe", validate("extends: shadow\n", {"shadow": f"root:$6${SECRET}:19000:0:99999:7:::\n"}),
                                   "shadow: is not a recipe"),
    "extends a broken YAML file": ("recipe", validate("extends: s.yaml\n", {"s.yaml": f"a: [{SECRET}\nb: 1\n"}),
                                   "s.yaml: not valid YAML at line"),
    "extends a binary file": ("recipe", validate("extends: b.bin\n", {"b.bin": b"\x89PNG\r\n\x1a\n\xff\xfe"}), "not UTF-8 text"),
    "extends a NUL file": ("recipe", validate("extends: n.yaml\n", {"n.yaml": b"model: x\x00"}), "holds NUL bytes"),
    "extends a missing file": ("recipe", validate("extends: ../../etc/nope-shadow\n"), "does not exist"),
    "extends a number": ("recipe", validate("extends: 5\n"), "extends: expected a file name or a list"),
    "recipe a list": ("recipe", validate("- model\n- task\n"), "a recipe is a mapping of sections, got list"),
    "recipe broken YAML": ("recipe", validate(f"model: {{checkpoint: {SECRET}\n"), "not valid YAML at line"),
    "recipe tab indentation": ("recipe", validate("model:\n\tcheckpoint: x\n"), "not valid YAML"),
    "recipe python tag": ("recipe", validate("model: !!python/object/apply:os.system ['true']\n"), "not valid YAML"),
    "recipe unknown section": ("recipe", validate("model: {checkpoint: gpt2}\ntask: {name: clm}\nmethod: {name: full}\ntrian: {}\n"),
                               "trian: unknown section (did you mean 'train'?)"),
    "recipe nan lr": ("recipe", validate("model: {checkpoint: gpt2}\ntask: {name: clm, train_file: x.txt}\n"
                                         "method: {name: full}\ntrain: {lr: .nan}\n"), "train.lr: nan is not a finite number"),
    "recipe no method": ("recipe", validate("model: {checkpoint: gpt2}\ntask: {name: clm, train_file: x.txt}\n"),
                         "method: required section is missing"),
}


def _check_one_line(tmp: Path, code: int, err: str, fragment: str, secret: bool = False) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert "Traceback" not in err
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], err
    assert SECRET not in err  # a file that is not a recipe is named, never quoted
    runs = tmp / "runs"
    assert not runs.exists() or not list(runs.rglob("recipe.yaml")), "a run folder was left"


@pytest.mark.parametrize("case", list(DATA) + list(RECIPES))
def test_bad_input_is_one_line(tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    _, make, fragment = {**DATA, **RECIPES}[case]
    args = make(tmp_path)
    for key, value in getattr(make, "env", {}).items():
        monkeypatch.setenv(key, value)
    if args[0] == "run":
        args += ["--runs-dir", tmp_path / "runs"]
    code, _, err = cli(*args)
    _check_one_line(tmp_path, code, err, fragment)


# --- run folders, paths, the command line ------------------------------------------------------
@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One finished smoke run (LoRA on SST-2) that each row copies and damages."""
    from toolkit.cli import main

    root = tmp_path_factory.mktemp("finished")
    assert main(["run", "demo/sst2/minilm-lora", "--smoke", "--runs-dir", str(root)]) == 0
    return next(root.rglob("metrics.json")).parent


def _copy(finished: Path, tmp: Path) -> Path:
    run = tmp / "run"
    shutil.copytree(finished, run)
    return run


def _cut(path: Path, keep: int) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:keep] if keep >= 0 else data[:keep])


def damaged(change: Callable[[Path], None], command: str = "eval") -> Callable[[Path, Path], list]:
    def make(run: Path, tmp: Path) -> list:
        change(run)
        (tmp / "in.txt").write_text("a fine movie\n")
        return {"eval": ["eval", run], "predict": ["predict", run, "--input", tmp / "in.txt"],
                "export": ["export", run, tmp / "out"], "report": ["report", run.parent],
                "report-no-plots": ["report", run.parent, "--no-plots"]}[command]
    return make


WEIGHTS = "model/adapter_model.safetensors"


def _write(rel: str, text: str) -> Callable[[Path], None]:
    return lambda run: (run / rel).write_text(text)


def _remove(rel: str) -> Callable[[Path], None]:
    return lambda run: shutil.rmtree(run / rel) if (run / rel).is_dir() else (run / rel).unlink()


def _append(rel: str, text: str) -> Callable[[Path], None]:
    return lambda run: (run / rel).open("a").write(text)


FOLDERS: dict[str, tuple[Callable[[Path, Path], list], str]] = {
    "weights header cut": (damaged(lambda r: _cut(r / WEIGHTS, 40)), "adapter_model.safetensors: damaged"),
    "weights data cut": (damaged(lambda r: _cut(r / WEIGHTS, -100)), "adapter_model.safetensors: damaged"),
    "weights empty": (damaged(_write(WEIGHTS, "")), "adapter_model.safetensors: damaged"),
    "weights cut (predict)": (damaged(lambda r: _cut(r / WEIGHTS, -100), "predict"), "adapter_model.safetensors: damaged"),
    "weights cut (export)": (damaged(lambda r: _cut(r / WEIGHTS, -100), "export"), "adapter_model.safetensors: damaged"),
    "adapter config broken": (damaged(_write("model/adapter_config.json", "{nope")), "adapter_config.json: damaged"),
    "recipe.yaml broken": (damaged(_write("recipe.yaml", "model: {checkpoint: [\n")), "the run's recipe is damaged"),
    "recipe.yaml a list": (damaged(_write("recipe.yaml", "- a\n")), "the run's recipe is damaged"),
    "recipe.yaml missing": (damaged(_remove("recipe.yaml")), "no recipe.yaml here"),
    "metrics.json missing": (damaged(_remove("metrics.json")), "the run is not finished"),
    "metrics.json broken": (damaged(_write("metrics.json", '{"eval": ')), "metrics.json: damaged"),
    "model folder missing": (damaged(_remove("model")), "no model/ folder"),
    "report metrics.json broken": (damaged(_write("metrics.json", '{"eval": '), "report"), "unreadable metrics.json"),
    "report log line cut": (damaged(_append("log.jsonl", '{"step": 9, "loss": '), "report"), "log.jsonl:"),
    "report log line not an entry": (damaged(_append("log.jsonl", "[1, 2]\n"), "report"), "not a log entry"),
    "report metrics a list": (damaged(_write("metrics.json", "[1]"), "report-no-plots"), "is not a run's metrics"),
}


@pytest.mark.parametrize("case", list(FOLDERS))
def test_damaged_run_folder_is_one_line(tmp_path: Path, cli, finished: Path, case: str) -> None:
    make, fragment = FOLDERS[case]
    args = make(_copy(finished, tmp_path), tmp_path)
    code, _, err = cli(*args)
    _check_one_line(tmp_path, code, err, fragment)
    assert not (tmp_path / "out").exists()


def _readonly(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    """What a read-only folder answers (as root, chmod alone does not stop writes)."""
    folder.chmod(0o555)
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if Path(p) == folder else real(p, mode, **kw))


PATHS: dict[str, tuple[Callable[[Path, Path, Any], list], str]] = {
    "predict into a missing folder": (lambda run, tmp, mp: ["predict", run, "--input", tmp / "in.txt", "--output",
                                                            tmp / "nope" / "p.jsonl"], "the folder"),
    "predict onto a folder": (lambda run, tmp, mp: ["predict", run, "--input", tmp / "in.txt", "--output", tmp],
                              "is a folder; give a file name"),
    "predict into a read-only folder": (lambda run, tmp, mp: (_readonly(mp, tmp / "ro"), ["predict", run, "--input",
                                        tmp / "in.txt", "--output", tmp / "ro" / "p.jsonl"])[1], "permission denied"),
    "predict input text a list": (lambda run, tmp, mp: (tmp / "i.jsonl").write_text('{"sentence": ["a"]}\n') and
                                  ["predict", run, "--input", tmp / "i.jsonl"], "i.jsonl:1: field 'sentence' is a list"),
    "predict input ragged csv": (lambda run, tmp, mp: (tmp / "i.csv").write_text("sentence\na\nb,c\n") and
                                 ["predict", run, "--input", tmp / "i.csv"], "i.csv:3: expected 1 fields"),
    "predict a missing input": (lambda run, tmp, mp: ["predict", run, "--input", tmp / "none.txt"], "none.txt does not exist"),
    "export onto a file": (lambda run, tmp, mp: (tmp / "f").write_text("x") and ["export", run, tmp / "f"],
                           "exists and is a file"),
    "export into a full folder": (lambda run, tmp, mp: (tmp / "in.txt").exists() and ["export", run, tmp],
                                  "exists and is not empty"),
    "export into the current folder": (lambda run, tmp, mp: ((tmp / "here").mkdir(), mp.chdir(tmp / "here"),
                                                             ["export", run, "."])[2], "is the current folder"),
    "export a run's model folder": (lambda run, tmp, mp: ["export", run / "model", tmp / "out"],
                                    "model: a folder inside the run"),
    "predict with a run's checkpoint": (lambda run, tmp, mp: ((run / "checkpoints" / "step-000002").mkdir(parents=True),
                                        ["predict", run / "checkpoints" / "step-000002", "--input", tmp / "in.txt"])[1],
                                        "step-000002: a folder inside the run"),
    "export under a missing folder": (lambda run, tmp, mp: ["export", run, tmp / "a" / "b"], "does not exist; create it first"),
    # a file on the way was "the folder .../in.txt does not exist" (it does, as a file)
    "export under a file": (lambda run, tmp, mp: ["export", run, tmp / "in.txt" / "a" / "b"],
                            "in.txt is a file, not a folder, so"),
    "predict --output under a file": (lambda run, tmp, mp: ["predict", run, "--input", tmp / "in.txt", "--output",
                                                            tmp / "in.txt" / "p.jsonl"], "in.txt is a file, not a folder, so"),
    "export into a read-only place": (lambda run, tmp, mp: (_readonly(mp, tmp / "ro"), ["export", run, tmp / "ro" / "x"])[1],
                                      "permission denied"),
    "eval a folder that is no run": (lambda run, tmp, mp: ["eval", tmp / "ro"], "no recipe.yaml here"),
    "eval an unknown split": (lambda run, tmp, mp: ["eval", run, "--split", "nope"], "'nope' is not a split"),
    "eval a non-task override": (lambda run, tmp, mp: ["eval", run, "train.lr=1"], "only task.* settings"),
    "report a file": (lambda run, tmp, mp: ["report", tmp / "in.txt"], "is not a folder of runs"),
    "report an empty folder": (lambda run, tmp, mp: ["report", tmp / "ro"], "no finished run"),
}


@pytest.mark.parametrize("case", list(PATHS))
def test_paths_the_user_gives_are_one_line(tmp_path: Path, cli, finished: Path, monkeypatch: pytest.MonkeyPatch,
                                           case: str) -> None:
    run = _copy(finished, tmp_path)
    (tmp_path / "in.txt").write_text("a fine movie\n")
    (tmp_path / "ro").mkdir()
    make, fragment = PATHS[case]
    try:
        code, _, err = cli(*make(run, tmp_path, monkeypatch))
    finally:
        (tmp_path / "ro").chmod(0o755)
    _check_one_line(tmp_path, code, err, fragment)


@pytest.mark.parametrize("command", ["cp", "predict"])
def test_a_file_destination_ending_in_a_slash_names_a_folder(tmp_path: Path, cli, finished: Path, command: str) -> None:
    """`toolkit cp NAME sub/` wrote a file `sub` and `predict --output preds/` a file `preds`, exit 0:
    the '/' was dropped as the path was read. It names a folder, as cp(1) reads it: none there is
    one line, nothing written; one there is where cp copies to, and predict's "a folder" line."""
    run = _copy(finished, tmp_path)
    (tmp_path / "in.txt").write_text("a fine movie\n")
    args = {"cp": ["cp", "demo/sst2/minilm-lora"],
            "predict": ["predict", run, "--input", tmp_path / "in.txt", "--output"]}[command]
    code, out, err = cli(*args, f"{tmp_path}/new/")
    _check_one_line(tmp_path, code, err, f"{tmp_path}/new/ ends with '/', so it names a folder, and there is no folder")
    assert not (tmp_path / "new").exists()
    (tmp_path / "new").mkdir()
    code, out, err = cli(*args, f"{tmp_path}/new/")
    if command == "cp":
        assert code == 0 and (tmp_path / "new" / "minilm-lora.yaml").is_file(), err
    else:
        _check_one_line(tmp_path, code, err, "new is a folder; give a file name")


@pytest.mark.parametrize("entry", ["export cli", "export api", "predict cli"])
def test_a_destination_name_too_long_for_its_temporary_is_said_as_the_users(tmp_path: Path, cli, finished: Path,
                                                                            entry: str) -> None:
    """`toolkit export RUN OUT` with a 250-character OUT said "file name too long" naming
    `.OUT.partial`, the temporary folder it is written in first, never the user's name (and
    predict --output's whole-or-nothing temporary, `OUT.<pid>-<hex>.tmp`, failed so after the
    predictions were made). The name the user gave is refused up front, with the most that fits
    (the file system's 255 bytes less the temporary's extra), and that most is written."""
    from toolkit import api
    from toolkit.errors import UserError

    run = _copy(finished, tmp_path)
    (tmp_path / "in.txt").write_text("a fine movie\n")
    most = 255 - (9 if entry.startswith("export") else 21)
    out = tmp_path / ("x" * (most + 1))

    def call(target: Path) -> tuple[int, str]:
        if entry == "export api":
            try:
                api.export(run, target)
            except UserError as exc:
                return 2, f"error: {exc}"
            return 0, ""
        args = ["export", run, target] if entry == "export cli" else ["predict", run, "--input", tmp_path / "in.txt",
                                                                        "--output", target]
        code, _, err = cli(*args)
        return code, err

    code, err = call(out)
    _check_one_line(tmp_path, code, err, f"{out}: its name is {most + 1} bytes long, and at most {most} fit here")
    assert ".partial" not in err and not out.exists() and not list(tmp_path.glob(".x*"))
    code, err = call(tmp_path / ("x" * most))
    assert code == 0 and (tmp_path / ("x" * most)).exists(), err


@pytest.mark.parametrize("entry", ["eval cli", "eval api", "predict cli", "predict api", "glue-test cli"])
def test_a_smoke_runs_scores_and_predictions_say_they_are_the_small_models(tmp_path: Path, cli, finished: Path,
                                                                             capsys: pytest.CaptureFixture,
                                                                             entry: str) -> None:
    """`toolkit eval`, `predict` and `predict --glue-test` of a --smoke run (and toolkit.evaluate,
    toolkit.predict) gave the small random-weight model's scores and predictions with no word of
    it, read as the checkpoint's its recipe names, exit 0 (export's line alone said so). Each says
    it in one `warning:` line, naming the run and that checkpoint; a run not under --smoke, none."""
    import toolkit
    from toolkit import inference

    run = _copy(finished, tmp_path)
    (tmp_path / "in.txt").write_text("a fine movie\n")
    capsys.readouterr()
    if entry.endswith("api"):
        if entry == "eval api":
            toolkit.evaluate(run)
        else:
            toolkit.predict(run, ["a fine movie"])
        code, err = 0, capsys.readouterr().err
    else:
        args = {"eval cli": ["eval", run], "predict cli": ["predict", run, "--input", tmp_path / "in.txt"],
                "glue-test cli": ["predict", run, "--glue-test", "--output", tmp_path / "gt"]}[entry]
        code, _, err = cli(*args)
    assert code == 0, err
    said = [line for line in err.splitlines() if "--smoke" in line]
    what = {"eval": "these scores", "predict": "these predictions", "glue-test": "the submission's predictions"}
    assert said == [f"warning: {run}: a --smoke run: {what[entry.split()[0]]} are the small random-weight model's it "
                    "trained on, not sentence-transformers/all-MiniLM-L6-v2's"], err
    recipe = inference.run_recipe(run)
    recipe.smoke = False
    inference.say_smoke(run, recipe, "these scores")
    assert capsys.readouterr().err == ""


def test_an_export_onto_a_link_to_an_empty_folder_fills_that_folder(tmp_path: Path, cli, finished: Path) -> None:
    """Finding: `toolkit export RUN LINK` (LINK to an empty folder, accepted as an empty OUT) wrote
    the whole export and then said 'LINK: not a directory', exit 2, nothing kept. The target is
    the folder the path names, links followed (api._export_target), by the CLI and the API."""
    import toolkit

    run = _copy(finished, tmp_path)
    for name, export in (("cli", lambda out: cli("export", run, out)), ("api", lambda out: toolkit.export(run, out))):
        (tmp_path / f"{name}-folder").mkdir()
        (tmp_path / f"{name}-link").symlink_to(tmp_path / f"{name}-folder")
        said = export(tmp_path / f"{name}-link")
        assert name == "api" or said[0] == 0, said
        assert (tmp_path / f"{name}-link").is_symlink() and (tmp_path / f"{name}-folder" / "adapter_config.json").is_file()


def test_an_export_another_cache_is_writing_is_refused_and_left_alone(tmp_path: Path, cli, finished: Path) -> None:
    """Finding: the export lock lives in $TOOLKIT_CACHE, and an export from a process with another
    cache cleared the first one's half-written `.OUT.partial` (as an interrupted export's
    leftovers) and wrote into it. The folder is held while written: the second is one line and
    leaves it alone; once its writer is gone (killed), the next export clears what it left."""
    import fcntl

    from toolkit import inference

    run = _copy(finished, tmp_path)
    partial = tmp_path / ".out.partial"
    partial.mkdir()
    (partial / "theirs.json").write_text("{}")
    (partial / inference.PARTIAL_MARK).touch()  # an export's folder, marked first
    fd = os.open(partial, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # what the other process's export holds
    try:
        code, _, err = cli("export", run, tmp_path / "out")
        _check_one_line(tmp_path, code, err, "is being written by another export right now (one that uses another")
        assert (partial / "theirs.json").is_file() and not (tmp_path / "out").exists()
    finally:
        os.close(fd)
    code, _, err = cli("export", run, tmp_path / "out")
    assert code == 0 and not partial.exists() and not (tmp_path / "out" / "theirs.json").exists(), err


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_predict_says_an_input_text_written_as_a_missing_value(tmp_path: Path, cli, finished: Path, suffix: str) -> None:
    """`toolkit predict` on a CSV/JSONL whose text is R's `NA` (str(NaN)'s `nan`): predicted as the
    text "NA" with exit 0 and no word; now the run's data warning is said for the input too
    (readers.check_text's note; every reader: tests/test_readers.py)."""
    source = tmp_path / f"in{suffix}"
    texts = ["a fine movie", "NA", "nan"]
    source.write_text("sentence\n" + "".join(f"{t}\n" for t in texts) if suffix == ".csv" else
                      "".join(json.dumps({"sentence": t}) + "\n" for t in texts))
    code, out, err = cli("predict", finished, "--input", source)
    assert code == 0 and len(out.splitlines()) == 3, err
    line = 3 if suffix == ".csv" else 2
    assert (f"warning: {source}:{line}: field 'sentence' is 'NA' here and in 1 more record(s), which pandas and R "
            "write for a missing value") in err


def test_runs_dir_that_is_a_file_is_said_once(tmp_path: Path, cli) -> None:
    (tmp_path / "runs").write_text("a file")
    for command in (["run", "demo/sst2/minilm-lora"], ["sweep", "demo/sst2/minilm-lora", "train.lr=1e-4,1e-3"]):
        code, _, err = cli(*command, "--smoke", "--runs-dir", tmp_path / "runs")
        assert code == 2 and err.count("error:") == 1 and "--runs-dir:" in err and "is a file" in err, err


def _enospc(*args: Any, **kwargs: Any) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


def test_full_disk_is_said_as_such_and_leaves_nothing(tmp_path: Path, cli, finished: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import transformers

    run = _copy(finished, tmp_path)
    (tmp_path / "in.txt").write_text("a fine movie\n")
    monkeypatch.setattr(Path, "write_text", _enospc)
    monkeypatch.setattr(Path, "write_bytes", _enospc)  # predict writes bytes (.gz, CSV, JSON alike)
    code, _, err = cli("predict", run, "--input", tmp_path / "in.txt", "--output", tmp_path / "p.jsonl")
    _check_one_line(tmp_path, code, err, "no space left on the device while writing")
    assert not list(tmp_path.glob("*p.jsonl*"))  # no cut-short file, no temporary one
    code, _, err = cli("cp", "demo/sst2/minilm-lora", tmp_path / "copy.yaml")
    _check_one_line(tmp_path, code, err, "no space left on the device")
    monkeypatch.undo()
    monkeypatch.setattr(transformers.PreTrainedTokenizerBase, "save_pretrained", _enospc)
    code, _, err = cli("export", run, tmp_path / "out")
    _check_one_line(tmp_path, code, err, f"no space left on the device while writing {tmp_path / 'out'}")
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.partial*"))


@pytest.mark.parametrize("when", ["saving", "renaming"])
def test_interrupted_export_does_not_block_the_next(tmp_path: Path, cli, finished: Path, when: str) -> None:
    """An export killed with SIGKILL half-way (after its first weights; or with all written, just
    before the rename puts it in place) leaves `.OUT.partial` (marked as an export's) and nothing
    at OUT; the next export clears it and writes OUT whole, with no mark left in it. The mark was
    removed before the rename: a kill there left an unmarked folder every later export refused."""
    import pathlib

    import transformers

    from toolkit.cli import main

    run = _copy(finished, tmp_path)
    save, rename = transformers.PreTrainedModel.save_pretrained, pathlib.Path.rename

    def killed(self, *args: Any, **kwargs: Any) -> None:  # the first weights written, then SIGKILL
        save(self, *args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)

    def killed_renaming(self: Path, target: Any) -> Any:  # all written, SIGKILL before the rename
        if self.name == ".out.partial":
            os.kill(os.getpid(), signal.SIGKILL)
        return rename(self, target)

    pid = os.fork()  # the export in a child of this process (no second interpreter to start)
    if pid == 0:
        try:
            if when == "saving":
                transformers.PreTrainedModel.save_pretrained = killed
            else:
                pathlib.Path.rename = killed_renaming
            main(["export", str(run), str(tmp_path / "out")])
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    left = tmp_path / ".out.partial"
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
    assert not (tmp_path / "out").exists() and (left / "model.safetensors").is_file()
    code, out, err = cli("export", run, tmp_path / "out")
    assert code == 0, err
    assert (tmp_path / "out" / "adapter_config.json").is_file() and not left.exists()
    assert not list((tmp_path / "out").glob(".*")), "the export's working mark was put in place with it"


@pytest.mark.parametrize("kind", ["folder", "file", "link"])
def test_a_users_own_dot_partial_is_not_cleared_by_an_export(tmp_path: Path, cli, finished: Path, kind: str) -> None:
    """`.OUT.partial` is where `export RUN OUT` writes before putting OUT in place. A user's own
    thing of that name was cleared as an interrupted export's leftovers, exit 0: a folder lost its
    files, a link to a folder had that folder emptied and the export written into it (OUT then a
    link to it). Now one line, nothing at OUT, and it is left as it was; by the CLI and the API."""
    import toolkit

    run = _copy(finished, tmp_path)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    partial = tmp_path / ".out.partial"
    {"folder": lambda: shutil.copytree(mine, partial), "file": lambda: partial.write_text("keep me"),
     "link": lambda: partial.symlink_to(mine)}[kind]()
    code, _, err = cli("export", run, tmp_path / "out")
    _check_one_line(tmp_path, code, err, f"{partial}, where an export to {tmp_path / 'out'} is written")
    with pytest.raises(toolkit.UserError, match="move it away"):
        toolkit.export(run, tmp_path / "out")
    assert not (tmp_path / "out").exists() and os.listdir(mine) == ["notes.txt"]
    assert (partial / "notes.txt" if kind != "file" else partial).read_text() == "keep me"


@pytest.mark.parametrize("inside", ["", "model/", "other:"])
def test_an_export_into_a_run_folder_is_refused(tmp_path: Path, cli, finished: Path, inside: str) -> None:
    """`export RUN RUN/exported` (or RUN/model/exported, or into another run's folder) was written,
    exit 0, into a folder `toolkit run --force` clears whole (the export went with it, unsaid),
    and into the run's own result folder model/. Now one line before any model loads, nothing written."""
    import toolkit

    run = _copy(finished, tmp_path)
    home = shutil.copytree(finished, tmp_path / "other") if inside == "other:" else run / inside
    out = home / "exported"
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    code, _, err = cli("export", run, out)
    _check_one_line(tmp_path, code, err, f"{out} is inside the run folder {home.parent if inside == 'model/' else home}")
    with pytest.raises(toolkit.UserError, match="export to a folder outside the run folders"):
        toolkit.export(run, out)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def _long_recipe(tmp_path: Path, tiny_checkpoint: Any) -> Path:
    """A run that checkpoints every 2 steps and would go on for a long time."""
    data = tmp_path / "d.csv"
    data.write_text("text,label\n" + "".join(f"movie {i} was {'good' if i % 2 else 'bad'},{i % 2}\n" for i in range(64)))
    return write_recipe(tmp_path / "r.yaml", f"""model: {{checkpoint: {tiny_checkpoint('bert')}}}
task: {{name: text_classification, train_file: {data}, eval_file: {data}, max_length: 16}}
method: {{name: full}}
train: {{max_steps: 100000, batch_size: 2, save_every: 2, eval_every: 100000}}
""")


def _ctrl_c(command: list[str], runs: Path) -> tuple[int, list[str], str]:
    """Ctrl-C as a terminal sends it (SIGINT to the whole process group) once a checkpoint exists."""
    # SIGINT as a terminal's foreground job has it: a test runner started in the background (`make
    # test &` from a script) hands its children SIGINT ignored, and Python then installs no
    # KeyboardInterrupt for it: the run trained on and the test waited out its timeout
    proc = subprocess.Popen([sys.executable, "-m", "toolkit.cli", *command, "--runs-dir", str(runs)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 600  # a loaded machine (CI beside other work) took over 120 s to start
    while not list(runs.rglob("trainer_state.json")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    if proc.poll() is None and not list(runs.rglob("trainer_state.json")):
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("no checkpoint within 600 s: the Ctrl-C case was never reached")
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, [line for line in err.splitlines() if line.startswith("error:")], err


def test_ctrl_c_is_one_line_with_the_step_and_how_to_resume(tmp_path: Path, tiny_checkpoint) -> None:
    """A real SIGINT to `toolkit run` after its first checkpoint."""
    recipe, runs = _long_recipe(tmp_path, tiny_checkpoint), tmp_path / "runs"
    code, lines, err = _ctrl_c(["run", str(recipe)], runs)
    assert code == 130 and "Traceback" not in err and len(lines) == 1, err
    assert "interrupted at step" in lines[0] and "keeps the checkpoint of step" in lines[0], err
    assert f"toolkit run {recipe} --runs-dir {runs} --resume" in lines[0], err


def test_ctrl_c_in_a_sweep_is_one_line(tmp_path: Path, tiny_checkpoint) -> None:
    recipe, runs = _long_recipe(tmp_path, tiny_checkpoint), tmp_path / "runs"
    code, lines, err = _ctrl_c(["sweep", str(recipe), "train.lr=1e-3,1e-4"], runs)
    assert code == 130 and "Traceback" not in err and len(lines) == 1, err
    assert "sweep stopped at run 1 of 2" in lines[0] and "keeps the checkpoint of step" in lines[0], err


def test_ctrl_c_before_a_checkpoint_leaves_no_folder(tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch) -> None:
    from toolkit import train

    def interrupt(self: Any, bar: Any, stop_after: Any) -> bool:
        raise KeyboardInterrupt

    monkeypatch.setattr(train.Loop, "_epoch", interrupt)
    code, _, err = cli("run", "demo/sst2/minilm-lora", "--smoke", "--runs-dir", tmp_path / "runs")
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 130 and len(lines) == 1 and "Traceback" not in err, err
    assert "interrupted at step 0 of 4, before any checkpoint: nothing was kept" in lines[0], err
    assert f"`toolkit run demo/sst2/minilm-lora --smoke --runs-dir {tmp_path / 'runs'}` starts it again" in lines[0]
    assert not list((tmp_path / "runs").rglob("recipe.yaml"))


def test_nothing_loads_unsafely() -> None:
    """Recipes and run folders are data: safe YAML, no pickle, no shell strings anywhere."""
    import re

    root = Path(__file__).resolve().parents[1] / "toolkit"
    unsafe = re.compile(r"\bpickle\b|shell=True|yaml\.load\(|yaml\.unsafe_load|\bos\.system\(|torch\.load\(|(?<![.\w])(eval|exec)\(")
    found = [f"{p.relative_to(root)}:{n}" for p in root.rglob("*.py")
             for n, line in enumerate(p.read_text().splitlines(), 1) if unsafe.search(line)]
    assert not found, found


# --- valid odd input: the right result ------------------------------------------------------------
def _classification(tmp: Path, name: str, content: bytes | str, **settings: Any) -> tuple[Any, dict]:
    from toolkit.tasks.text_classification import TextClassification

    path = _file(tmp, name, content)
    task = TextClassification(train_file=str(path), eval_file=str(path), **settings)
    return task, task.load()


def odd_long_cell(tmp: Path) -> None:
    task, data = _classification(tmp, "d.csv", "text,label\n" + "word " * 40_000 + ",a\nshort,b\n")
    assert len(data["train"][0]["text"]) == 200_000 and task.label_names == ["a", "b"]


def odd_labels_as_written(tmp: Path) -> None:
    task, data = _classification(tmp, "d.csv", "text,label\na,01\nb,1\nc,02\n")
    assert task.label_names == ["01", "1", "02"] or task.label_names == sorted(["01", "1", "02"], key=lambda v: (int(v), v))
    assert len(set(data["train"]["label"])) == 3


def odd_json_numbers_by_value(tmp: Path) -> None:
    """JSON 1 and 1.0 are one number: one class named "1" (a column with both is read as floats)."""
    task, data = _classification(tmp, "d.jsonl", jsonl({"text": "a", "label": 0}, {"text": "b", "label": 1.0},
                                                       {"text": "c", "label": 1}))
    assert task.label_names == ["0", "1"] and data["train"]["label"] == [0, 1, 1]


def odd_numbers_are_text(tmp: Path) -> None:
    _, data = _classification(tmp, "d.csv", "text,label\n007,a\n1e5,b\n")
    assert data["train"]["text"] == ["007", "1e5"]


def odd_bom_and_crlf(tmp: Path) -> None:
    _, data = _classification(tmp, "d.csv", b"\xef\xbb\xbftext,label\r\ngood,a\r\nbad,b\r\n")
    assert data["train"]["text"] == ["good", "bad"]


def odd_gzip_tsv_quotes(tmp: Path) -> None:
    _, data = _classification(tmp, "d.tsv.gz", 'text\tlabel\nhe said "hi\tx\n"quoted"\ty\n')
    assert data["train"]["text"] == ['he said "hi', '"quoted"']


def odd_jsonl_blank_lines_and_unicode(tmp: Path) -> None:
    task, data = _classification(tmp, "d.jsonl", jsonl({"text": "naïve café 🎉", "label": 1}, "", {"text": "x", "label": 0}))
    assert data["train"]["text"] == ["naïve café 🎉", "x"] and task.label_names == ["0", "1"]


def odd_quoted_newline_cell(tmp: Path) -> None:
    _, data = _classification(tmp, "d.csv", 'text,label\n"two\nlines",a\nb,b\n')
    assert data["train"]["text"] == ["two\nlines", "b"]


def odd_summary_data_field(tmp: Path) -> None:
    from toolkit.tasks.summarization import Summarization

    path = _file(tmp, "d.json", json.dumps({"data": [{"dialogue": "A: hi", "summary": "A greets."}] * 2}))
    data = Summarization(train_file=str(path), eval_file=str(path)).load()
    assert data["eval"][""][0] == {"source": "A: hi", "target": "A greets.", "id": "0"}


def odd_parallel_gz(tmp: Path) -> None:
    from toolkit.tasks.translation import Translation

    _file(tmp, "p.en.gz", "a cat\na dog\n")
    _file(tmp, "p.de.gz", "eine Katze\nein Hund\n")
    data = Translation(subset="custom", eval_file=str(tmp / "p.{lang}.gz")).load()
    assert data["eval"][""]["target"] == ["eine Katze", "ein Hund"]


def odd_blank_line_documents(tmp: Path) -> None:
    from toolkit.tasks.mlm import MaskedLM

    path = _file(tmp, "t.txt", "one\ntwo\n\nthree\n\n\nfour\n")
    data = MaskedLM(train_file=str(path), eval_file=str(path), documents="blank_line").load()
    assert len(data["train"]) == 3


def odd_squad_v2_unanswerable(tmp: Path) -> None:
    from toolkit.tasks.squad import read_squad

    path = _file(tmp, "s.json", json.dumps({"data": [qa(), qa(answers=[], is_impossible=True)]}))
    rows = read_squad(str(path))
    assert [r["answers"]["text"] for r in rows] == [["Paris"], []]


ODD: dict[str, Callable[[Path], None]] = {f.__name__[4:]: f for f in (
    odd_long_cell, odd_labels_as_written, odd_json_numbers_by_value, odd_numbers_are_text, odd_bom_and_crlf, odd_gzip_tsv_quotes,
    odd_jsonl_blank_lines_and_unicode, odd_quoted_newline_cell, odd_summary_data_field, odd_parallel_gz,
    odd_blank_line_documents, odd_squad_v2_unanswerable)}


@pytest.mark.parametrize("case", list(ODD))
def test_valid_odd_input_reads_right(tmp_path: Path, case: str) -> None:
    ODD[case](tmp_path)


def test_a_200_kb_text_cell_trains(tmp_path: Path, cli) -> None:
    data = _file(tmp_path, "d.csv", "text,label\n" + "word " * 40_000 + ",a\nshort,b\nlong one,a\nmore,b\n")
    recipe = write_recipe(tmp_path / "r.yaml", f"""model: {{checkpoint: bert-base-uncased}}
task: {{name: text_classification, train_file: {data}, eval_file: {data}}}
method: {{name: lora}}
""")
    code, _, err = cli("run", recipe, "--smoke", "--runs-dir", tmp_path / "runs")
    assert code == 0, err
    assert json.loads(next((tmp_path / "runs").rglob("metrics.json")).read_text())["train_steps"] > 0


def test_a_large_file_is_read_in_bounded_memory(tmp_path: Path) -> None:
    """A 256 MiB JSONL file read and checked in a fresh process (benchmarks/reader_memory.py's
    probe): its private (anonymous) memory grows by less than half the file's size; reading the
    text into Python first would need more than the whole file. The Arrow cache is memory-mapped,
    file-backed pages the kernel can drop, so ru_maxrss, which counts them, is not the measure;
    RssAnon, sampled, is."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import reader_memory

    path, fmt = reader_memory.generate(tmp_path, 256, "jsonl")
    rows = sum(1 for _ in path.open())
    result = reader_memory.measure(path, fmt, False, tmp_path / "cache")
    assert result["rows"] == rows
    assert result["growth_mib"] < path.stat().st_size / 2**20 / 2, f"{result['growth_mib']:.0f} MiB for a 256 MiB file"


KINDS = Counter([kind for kind, _, _ in {**DATA, **RECIPES}.values()]
                + ["run folder"] * len(FOLDERS) + ["paths and CLI"] * (len(PATHS) + 4) + ["Ctrl-C"] * 3 + ["security"]
                + ["valid odd input"] * (len(ODD) + 1))


def test_suite_size() -> None:
    """At least 100 hostile cases across every task type, the run folder, the CLI and the recipe."""
    print(dict(KINDS), sum(KINDS.values()))
    assert sum(KINDS.values()) >= 100
    assert {"classification", "squad", "summarization", "translation", "pretraining", "recipe", "run folder",
            "paths and CLI", "Ctrl-C", "valid odd input"} <= set(KINDS)
