"""Issue 37 rule 6: readers read text as written. Every reader (each format `readers.read` takes,
predict's plain-text lines from a file and from standard input, NER's line reader, GLUE's TSVs) refuses a
binary file, a file of NUL bytes, bytes that are not UTF-8 and a file without line breaks up
front, in bounded memory and in one line; plain text splits at \\n and \\r\\n only, and a carriage
return inside a line is refused by every plain-text reader. What a file holds, not its path and
mtime, decides what is read, and a CSV/TSV row is never shifted under its header."""

from __future__ import annotations

import codecs
import io
import json
import os
import re
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import pytest

from conftest import ROOT
from toolkit import readers
from toolkit.errors import UserError


def _stdin(monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(path.read_bytes())))


def _read(fmt: str) -> Callable:
    return lambda path, monkeypatch: readers.read(path, fmt)


def _lines_from_stdin(path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    _stdin(monkeypatch, path)
    return readers.read_lines("-")[0]


READERS: dict[str, tuple[str, Callable]] = {  # name -> (file suffix, read it)
    **{fmt: (suffix, _read(fmt)) for suffix, fmt in readers.FORMATS.items()},
    "predict lines": (".txt", lambda path, monkeypatch: readers.read_lines(str(path))[0]),
    "predict stdin": (".txt", _lines_from_stdin),
    "ner lines": (".txt", lambda path, monkeypatch: _conll(path)),
    "glue tsv": (".tsv", lambda path, monkeypatch: _glue_tsv(path)),
}


def _conll(path: Path) -> list:
    from toolkit.tasks.ner import read_conll

    return read_conll(path).tokens


def _glue_tsv(path: Path) -> dict:
    from toolkit.tasks.glue import SPECS, read_tsv

    return read_tsv(path, SPECS["sst2"])
BAD = {  # name -> (bytes, what the one line says)
    "nul bytes": (b"\x00" * 4096, r":1: holds a NUL byte"),
    "binary": (b"text,label\n\x89PNG\r\n\x1a\n\x00\x00", r":2: (holds a NUL byte|not UTF-8 text)"),
    "latin-1": ("text,label\ncaf\xe9,1\n".encode("latin-1"), r":2: not UTF-8 text \(byte 0xe9\)"),
    "no line break": (b"a" * (3 << 20), r":1: no line break within 1 MiB"),
    "gzip not named .gz": (__import__("gzip").compress(b"text,label\ngood,1\n"),
                           r": holds gzip-compressed data, not text; (name it data\.\w+\.gz|decompress it first)"),
    "bzip2": (__import__("bz2").compress(b"text,label\ngood,1\n"), r": holds bzip2-compressed data, not text"),
    "xz": (__import__("lzma").compress(b"text,label\ngood,1\n"), r": holds xz-compressed data, not text"),
    # Excel's "Unicode Text" and Windows' tools: said as what it is, not as a byte 0xff
    "utf-16": ("text\tlabel\ngood\t1\n".encode("utf-16"), r": holds UTF-16 text \(it begins with UTF-16's byte order mark\)"),
    "utf-16-be": (b"\xfe\xff" + "text,label\n".encode("utf-16-be"), r": holds UTF-16 text"),
    "utf-32": ("text,label\ngood,1\n".encode("utf-32"), r": holds UTF-32 text"),
}


@pytest.mark.parametrize("bad", sorted(BAD))
@pytest.mark.parametrize("reader", sorted(READERS))
def test_every_reader_refuses_what_is_not_text_up_front(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        reader: str, bad: str) -> None:
    monkeypatch.setenv("TOOLKIT_MAX_LINE_MB", "1")
    suffix, read = READERS[reader]
    content, message = BAD[bad]
    if reader == "json" and bad == "no line break":  # one JSON document may be one line
        content, message = b"[" + b'{"a": 1},' * 130_000 + b'{"a": 1}]', None
    path = tmp_path / f"data{suffix}"
    path.write_bytes(content)
    if message is None:
        assert len(read(path, monkeypatch)) == 130_001
        return
    with pytest.raises(UserError, match=message) as caught:
        read(path, monkeypatch)
    assert "\n" not in str(caught.value)
    assert str(caught.value).startswith("<stdin>:" if reader == "predict stdin" else str(path))


def test_plain_text_splits_at_line_breaks_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """U+2028, U+0085, form feed and friends are text inside a line (str.splitlines would split);
    \\r\\n is one break; a .txt whose first line starts with `{` is text (the extension decides)."""
    path = tmp_path / "in.txt"
    path.write_bytes("one\u2028still one\r\ntwo\x0cand\x85more\n\n{\"text\": \"three\"}\n".encode())
    expected = ["one\u2028still one", "two\x0cand\x85more", '{"text": "three"}']
    assert readers.read_lines(str(path)) == (expected, str(path), [3])  # the blank line 3 is counted
    _stdin(monkeypatch, path)
    assert readers.read_lines("-") == (expected, "<stdin>", [3])


def test_the_head_check_reads_a_bounded_head(tmp_path: Path) -> None:
    """head_names reads one MiB at most: a CSV whose first line is longer says nothing (the full
    read refuses it), and a JSON list's first record is read without parsing the rest."""
    path = tmp_path / "d.csv"
    path.write_bytes(b"a" * (2 << 20))
    assert readers.head_names(path) is None
    path = tmp_path / "d.json"
    path.write_text('[{"source": "x", "target": "y"},' + '{"source": "x", "target": "y"},' * 100 + "{}]")
    assert readers.head_names(path) == ["source", "target"]
    path = tmp_path / "d.jsonl"
    path.write_text('\n{"transcript": "a", "notes": "b"}\nnot json\n')
    assert readers.head_names(path) == ["transcript", "notes"]


PLAIN = ["text", "predict lines", "predict stdin", "ner lines"]  # the readers of plain text, line by line


@pytest.mark.parametrize("at_chunk_end", [False, True])
@pytest.mark.parametrize("reader", PLAIN)
def test_a_carriage_return_inside_a_line_is_refused_by_every_plain_text_reader(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reader: str, at_chunk_end: bool) -> None:
    """datasets' text builder (pretraining, parallel translation files) and Python's text files
    (CoNLL) break a line at a lone \\r, which the other readers keep inside it: parallel files
    shifted silently. Every plain-text reader refuses it at its line, a \\r at the end of a 1 MiB
    chunk included; \\r\\n stays one line end."""
    suffix, read = READERS[reader]
    head = b"EU B-ORG\r\n" + (b"x" * (readers.CHUNK - 17) + b" O\n" if at_chunk_end else b"")
    path = tmp_path / f"data{suffix}"
    path.write_bytes(head + b"two\rthree O\n")
    assert at_chunk_end == (len(head + b"two\r") == readers.CHUNK)  # the \\r is a chunk's last byte
    with pytest.raises(UserError, match=r":%d: a carriage return \(\\r\) inside a line" % (3 if at_chunk_end else 2)):
        read(path, monkeypatch)
    path.write_bytes(head + b"two-three O\r\n")
    assert len(read(path, monkeypatch)) in (1, 2 + at_chunk_end)


@pytest.mark.parametrize("fmt", sorted(set(readers.FORMATS.values())))
def test_a_file_replaced_with_its_mtime_kept_is_read_anew(tmp_path: Path, fmt: str) -> None:
    """datasets keys its cache on a file's path and mtime: a file replaced by one of the same
    mtime (cp -p, rsync -t, unzip) was read as it was before, under a run id of the new bytes."""
    rows = {"csv": "text,label\n{0},{1}\n{1},{0}\n", "tsv": "text\tlabel\n{0}\t{1}\n{1}\t{0}\n",
            "json": '[{{"text": "{0}", "label": "{1}"}}, {{"text": "{1}", "label": "{0}"}}]',
            "jsonl": '{{"text": "{0}", "label": "{1}"}}\n{{"text": "{1}", "label": "{0}"}}\n', "text": "{0} {1}\n{1} {0}\n"}
    path = tmp_path / ("data" + next(k for k, v in readers.FORMATS.items() if v == fmt))
    path.write_text(rows[fmt].format("aa", "bb"))
    before = readers.read(path, fmt)["text"]
    mtime = path.stat().st_mtime_ns
    path.write_text(rows[fmt].format("bb", "aa"))
    os.utime(path, ns=(mtime, mtime))
    assert readers.read(path, fmt)["text"] == list(reversed(before))


@pytest.mark.parametrize("fmt, header, row", [("csv", "text,label", "Loved it, truly,pos"),
                                              ("csv", "text,label", "good,pos,"),
                                              ("tsv", "sentence\tlabel", "good\tfilm\t1")])
def test_a_first_row_with_more_fields_than_the_header_is_refused(tmp_path: Path, fmt: str, header: str, row: str) -> None:
    """pandas takes the extra first fields of such a file for an index and shifts every column:
    'Loved it, truly,pos' was read as text ' truly', label 'pos', with no word said."""
    path = tmp_path / f"d.{fmt}"
    path.write_text(f"{header}\n\n{row}\n{row}\n")
    with pytest.raises(UserError, match=r"d\.%s:3: expected 2 fields like the header \(%s-separated\), got 3"
                       % (fmt, "tab" if fmt == "tsv" else "comma")):
        readers.read(path, fmt)
    path.write_text(f'{header}\n"Loved it, truly",pos\n' if fmt == "csv" else f"{header}\ngood film\t1\n")
    assert len(readers.read(path, fmt).column_names) == 2


def test_conll_columns_split_at_spaces_and_tabs_only(tmp_path: Path) -> None:
    """A no-break space (or U+2028) is part of a CoNLL word, as CoNLL's readers split at spaces:
    str.split cut 'New\\u00a0York' to 'New', silently."""
    from toolkit.tasks.ner import read_conll

    path = tmp_path / "n.txt"
    path.write_text("New\u00a0York NNP\tB-LOC\nis  VBZ O\nbig\u2028one JJ O\n \t \nParis NNP B-LOC\n")
    read = read_conll(path)
    assert read.tokens == [["New\u00a0York", "is", "big\u2028one"], ["Paris"]]
    assert read.tags == [["B-LOC", "O", "O"], ["B-LOC"]]


@pytest.mark.parametrize("split", ["train", "eval"])
@pytest.mark.parametrize("name", ["n.txt", "n.conll.gz"])
@pytest.mark.parametrize("line", ["New York B-LOC", "New\tYork\tB-LOC", "York"])
def test_every_conll_word_line_holds_the_same_columns(tmp_path: Path, split: str, name: str, line: str) -> None:
    """Finding: a word line with more columns than the file's others (a word holding a space,
    `New York B-LOC` among `word TAG` lines) was read as its first and last column: the word
    'New' tagged B-LOC, 'York' lost, exit 0. Every word line of a CoNLL file, train or eval,
    plain or gzip, holds as many columns as the first; else one line naming both lines."""
    import gzip

    from toolkit.tasks import TASKS

    text = f"-DOCSTART- -X- O\n\nPeter B-PER\nlives O\nin O\n\n{line}\nis O\n"
    bad = tmp_path / name
    bad.write_bytes(gzip.compress(text.encode()) if name.endswith(".gz") else text.encode())
    good = tmp_path / "good.txt"
    good.write_text("Peter B-PER\nlives O\n\nParis B-LOC\n")
    files = {"train_file": str(bad if split == "train" else good), "eval_file": str(bad if split == "eval" else good)}
    task = TASKS.get("ner")(**files)
    said = r":7: expected 'token TAG'" if line == "York" else r":7: 3 columns where line 3 has 2; .*a word cannot hold a space"
    with pytest.raises(UserError, match=re.escape(str(bad)) + said):
        task.load()
    bad.write_bytes(gzip.compress(text.replace(line, "York B-LOC").encode()) if name.endswith(".gz")
                    else text.replace(line, "York B-LOC").encode())
    loaded = TASKS.get("ner")(**files).load()
    read = loaded["train"] if split == "train" else loaded["eval"][""]
    assert read["tokens"] == [["Peter", "lives", "in"], ["York", "is"]]


RECORD_FILES = {  # name -> (its bytes, the field of the text): each holds the documents 'one, two' and 'three'
    "docs.csv": (b'id,text\n1,"one, two"\n2,three\n', None),
    "docs.TSV": (b'text\tid\none, two\t1\nthree\t2\n', None),
    "docs.csv.gz": (b'body\n"one, two"\nthree\n', "body"),
    "docs.json": (b'{"version": 1, "data": [{"text": "one, two"}, {"text": "three"}]}', None),
    "list.json": (b'[{"text": "one, two", "n": 1}, {"text": "three", "n": 2}]', None),
    "docs.jsonl": (b'{"text": "one, two"}\n{"text": "three"}\n', None),
}


@pytest.mark.parametrize("task", ["mlm", "clm", "denoise", "span_corruption"])
@pytest.mark.parametrize("name", sorted(RECORD_FILES))
@pytest.mark.parametrize("key", ["train_file", "eval_file"])
def test_a_pretraining_task_reads_csv_tsv_and_json_documents_as_records(tmp_path: Path, task: str, name: str,
                                                                         key: str) -> None:
    """Finding: the pretraining objectives read a CSV as plain text (its header line a document, its
    quotes text, exit 0), then refused it, and refused a `{"data": [...]}` JSON in one line, where
    run_clm.py and run_mlm.py read CSV (a `text` column) and JSON. Each is read as records by the
    shared reader, as summarization reads them: the text field's values, one document each, from
    a train or an eval file beside plain text or records; any other name is still plain text
    (WikiText's .tokens)."""
    import gzip

    from toolkit.tasks import TASKS

    body, field = RECORD_FILES[name]
    records = tmp_path / name
    records.write_bytes(gzip.compress(body) if name.endswith(".gz") else body)
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps({(field or "text"): t}) + "\n" for t in ("four five", "six", "seven")))
    files = {"train_file": str(other), "eval_file": str(other), key: str(records)}
    made = TASKS.get(task)(**files, **({"text_field": field} if field else {}))
    made.check()
    loaded = made.load()
    read = loaded["train"] if key == "train_file" else loaded["eval"][""]
    assert sorted(read["text"]) == ["one, two", "three"]
    plain = tmp_path / "docs.tokens"
    plain.write_text("one two\nthree four\nfive six\n")
    assert TASKS.get(task)(train_file=str(plain), eval_file=str(plain)).load()["train"]["text"] == \
        ["one two", "three four", "five six"]
    with pytest.raises(UserError, match="task.eval_file: must have the same format as task.train_file"):
        TASKS.get(task)(**{**files, ("eval_file" if key == "train_file" else "train_file"): str(plain)}).load()


def test_a_pretraining_records_text_that_is_not_text_is_one_line_at_its_record(tmp_path: Path) -> None:
    """A `{"data": [...]}` record whose text is a number is named by its place in the document."""
    from toolkit.tasks import TASKS

    bad = tmp_path / "docs.json"
    bad.write_text('{"data": [{"text": "one"}, {"text": 2}]}')
    with pytest.raises(UserError, match=re.escape(str(bad))):
        TASKS.get("clm")(train_file=str(bad), eval_file=str(bad)).load()


@pytest.mark.parametrize("split", ["train_file", "eval_file"])
@pytest.mark.parametrize("problem", ["classification", "regression"])
@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_a_json_label_that_is_not_a_json_number_is_refused(tmp_path: Path, split: str, problem: str, value: str) -> None:
    """Finding: a JSONL label NaN (what Python's json.dumps writes for a missing float; not JSON)
    was read by the json builder as a float and became the class "nan", trained on, exit 0. NaN
    and +-Infinity are one line naming the record, in a train or an eval file, for either problem."""
    from toolkit.tasks import TASKS

    rows = "".join(f'{{"text": "text {i}", "label": {i % 2}}}\n' for i in range(4))
    bad, good = tmp_path / "bad.jsonl", tmp_path / "good.jsonl"
    good.write_text(rows)
    bad.write_text(rows + f'{{"text": "text 4", "label": {value}}}\n')
    files = {"train_file": str(good), "eval_file": str(good), split: str(bad)}
    task = TASKS.get("text_classification")(**files, problem=problem)
    with pytest.raises(UserError, match=re.escape(f"{bad}:5: label column 'label' is {value}, which JSON has no number")):
        task.load()


HEADERS = {  # a valid file's bytes -> (format, the columns its full read names)
    "cr line ends": (b"text,label\rgood,a\rbad,b\r", "csv", ["text", "label"]),
    "cr line ends tsv": (b"text\tlabel\rgood\ta\rbad\tb\r", "tsv", ["text", "label"]),
    "crlf and a bom": (b"\xef\xbb\xbftext,label\r\ngood,a\r\nbad,b\r\n", "csv", ["text", "label"]),
    "a line break in a quoted name": (b'"review\ntext",label\ngood,a\nbad,b\n', "csv", ["review\ntext", "label"]),
    "a comma in a quoted name": (b'"text, raw",label\ngood,a\nbad,b\n', "csv", ["text, raw", "label"]),
}


@pytest.mark.parametrize("case", sorted(HEADERS))
def test_the_head_check_reads_the_header_the_full_read_reads(tmp_path: Path, case: str) -> None:
    """Finding: the validate-time head check cut the header at the first \\n: a file with \\r line
    ends (which the full read takes) was a csv.Error traceback at `toolkit validate` / run, and a
    quoted name holding a line break made a valid file's 'label' column "missing". The head check
    names the columns the full read names, for a recipe that names them (check_data); a header
    it cannot parse says nothing there (the full read says what is wrong)."""
    from types import SimpleNamespace

    from toolkit.recipe import check_data
    from toolkit.tasks import TASKS

    data, fmt, columns = HEADERS[case]
    path = tmp_path / f"d.{fmt}"
    path.write_bytes(data)
    assert readers.head_names(path) == readers.read(path, fmt).column_names == columns
    task = TASKS.get("text_classification")(train_file=str(path), eval_file=str(path), text_columns=[columns[0]],
                                            label_column="label")
    check_data(SimpleNamespace(task=task))
    assert task.load()["train"]["text" if columns[0] == "text" else columns[0]] == ["good", "bad"]
    for broken in (b'"text,label\ngood,a\n', b'text,"label"x\ngood,a\n') if fmt == "csv" else ():  # the full read says
        path.write_bytes(broken)
        assert readers.head_names(path) is None


def _classified(split: str) -> Callable:
    def read(path: Path) -> None:
        from toolkit.tasks import TASKS

        good = path.with_name("good.csv")
        good.write_text("text,label\ngood,a\nbad,b\n")
        files = {"train_file": str(good), "eval_file": str(good), split: str(path)}
        TASKS.get("text_classification")(**files).load()
    return read


def _summarized(path: Path) -> None:
    from toolkit.tasks._generation import read_records

    read_records(path, ("text", "label"))


def _predicted(path: Path) -> None:
    from toolkit.inference import read_inputs

    read_inputs(str(path), ["text"])


LONG_ROW_READERS = {"reader": lambda path: readers.read(path, "csv"), "classification train": _classified("train_file"),
                    "classification eval": _classified("eval_file"), "classification test": _classified("test_file"),
                    "summarization": _summarized, "predict input": _predicted}


@pytest.mark.parametrize("name", ["d.csv", "d.csv.gz"])
@pytest.mark.parametrize("reader", sorted(LONG_ROW_READERS))
def test_a_row_with_too_many_fields_is_named_by_its_line(tmp_path: Path, reader: str, name: str) -> None:
    """Finding: pandas counts a record with a quoted line break as one line, and a row with a
    field too many after such a record was said at the wrong line (line 4 for line 6). The line
    is the file's, for every reader of CSV files."""
    import gzip

    body = b'text,label\n"two\nline",a\r\n"three\r\nline\r\nreview",b\nbad,b,extra\n'
    path = tmp_path / name
    path.write_bytes(gzip.compress(body) if name.endswith(".gz") else body)
    with pytest.raises(UserError, match=re.escape(f"{path}:7: expected 2 fields like the header (comma-separated), got 3")):
        LONG_ROW_READERS[reader](path)


LATE = {  # the last record of a JSONL file longer than one builder chunk -> what reading it gives
    "a fraction after whole numbers": ({"label": 1.5}, ("label", 1.5)),
    "a field null, then text": ({"label": 1, "note": "late"}, ("note", "late")),
    "a field first seen late": ({"label": 1, "extra": "late"}, ("extra", "late")),
    "a string label after numbers": ({"label": "1"}, r":401: 'label' is a string here but a number at line 1"),
    "a number text after strings": ({"text": 5, "label": 1}, r":401: 'text' is a number here but a string at line 1"),
    "a number word after words": ({"label": 1, "words": [5]}, r":401: 'words\[\]' is a number here but a string at line 1"),
    "a string start after numbers": ({"label": 1, "span": {"start": ["3"]}},
                                     r":401: 'span.start\[\]' is a string here but a number at line 1"),
}


NESTED_LATE = {"a number word after words", "a string start after numbers"}


@pytest.mark.parametrize("name", ["d.jsonl", "d.jsonl.gz"])
@pytest.mark.parametrize("case", sorted(LATE))
def test_a_jsonl_file_is_typed_by_all_its_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str,
                                                  name: str) -> None:
    """Finding: datasets' json builder types each field by a JSONL file's first 10 MiB and casts
    the rest to it: a later label "1" beside numbers was read as 1 and a later text 5 as "5",
    exit 0 (a smaller file is refused at that line), and a later 1.5 beside whole numbers, or a
    field null or absent at first, was a traceback-worded refusal of a valid file. Every record
    counts, as in a file of one chunk: a type change is said at its line, the rest is read."""
    import gzip
    import json

    from toolkit.tasks import TASKS

    monkeypatch.setattr(readers, "JSONL_CHUNK", 16 << 10)
    late, expected = LATE[case]
    rows = [{"text": f"{'padding ' * 10}{i}", "label": i % 2, **({"note": None} if "null" in case else {}),
             **({"words": ["a", "b"], "span": {"start": [1]}} if case in NESTED_LATE else {})}
            for i in range(400)]
    body = ("".join(json.dumps(r) + "\n" for r in rows) + json.dumps({"text": "late", **late}) + "\n").encode()
    assert len(body) > 2 * readers.JSONL_CHUNK
    path = tmp_path / name
    path.write_bytes(gzip.compress(body) if name.endswith(".gz") else body)
    good = tmp_path / "good.jsonl"
    good.write_text("".join(json.dumps(r) + "\n" for r in rows[:4]))
    if isinstance(expected, str):
        with pytest.raises(UserError, match=re.escape(str(path)) + expected):
            readers.read(path, "jsonl")
        for split in ("train_file", "eval_file"):
            with pytest.raises(UserError, match=re.escape(str(path)) + expected):
                TASKS.get("text_classification")(**{"train_file": str(good), "eval_file": str(good), split: str(path)}).load()
        return
    column, value = expected
    assert readers.read(path, "jsonl")[-1][column] == value
    task = TASKS.get("text_classification")(train_file=str(path), eval_file=str(good),
                                            problem="regression" if column == "label" else "classification")
    assert task.load()["train"]["text"][-1] == "late"


def _ner_jsonl(path: Path) -> None:
    from toolkit.tasks.ner import read_jsonl

    read_jsonl(path)


def _qa_jsonl(path: Path) -> None:
    from toolkit.tasks.squad import read_squad

    read_squad(str(path), "v1")


JOINED = {  # reader -> (a good record, the same record with a fault, read the file)
    "classification": ({"text": "good", "label": "a"}, {"text": "", "label": "b"}, _classified("train_file")),
    "summarization": ({"text": "a dialogue", "label": "its summary"}, {"text": "a dialogue", "label": ""}, _summarized),
    "predict input": ({"text": "good"}, {"text": " "}, _predicted),
    "ner": ({"tokens": ["Paris"], "ner_tags": ["B-LOC"]}, {"tokens": ["Paris"], "ner_tags": ["B-LOC", "O"]}, _ner_jsonl),
    "qa": ({"question": "Where?", "context": "In Paris.", "answers": {"text": ["Paris"], "answer_start": [3]}},
           {"question": "Where?", "context": "In Paris.", "answers": {"text": ["Paris"], "answer_start": [4]}}, _qa_jsonl),
}


@pytest.mark.parametrize("reader", sorted(JOINED))
def test_records_joined_on_one_jsonl_line_keep_later_lines_right(tmp_path: Path, reader: str) -> None:
    """Finding: two records on one line (`{...}{...}`: a file that ended without a line break,
    another appended) are two records to the json builder, and every later record was said one
    line too far down (here line 3 for line 2, or a line past the end). A line counts the JSON
    values it holds, for every reader that names a JSONL record's line."""
    import json

    good, bad, read = JOINED[reader]
    path = tmp_path / "d.jsonl"
    second = {**good, **({"label": "b"} if reader == "classification" else {})}
    path.write_text(json.dumps(good) + json.dumps(second) + "\n" + json.dumps(bad) + "\n" + json.dumps(good) + "\n")
    with pytest.raises(UserError, match=re.escape(f"{path}:2:")):
        read(path)


WHITESPACE_LINES = {  # a file with a line of spaces or tabs alone -> the one line said
    "a first record that would shift": (b"text,label\n \t \nLoved it, truly,pos\nHated it, really,neg\n",
                                        ":3: expected 2 fields like the header (comma-separated), got 3"),
    "a later row too long": (b'text,label\n"good",a\n   \r\n\t\nbad,b,extra\n', ":5: expected 2 fields"),
    "a later empty label": (b'text,label\n"good",a\n   \r\n\t\nbad,\nfine,b\n', ":5: label column 'label' is empty"),
}


@pytest.mark.parametrize("case", sorted(WHITESPACE_LINES))
@pytest.mark.parametrize("reader", sorted(LONG_ROW_READERS))
def test_a_line_of_spaces_is_skipped_by_every_csv_reread_as_by_pandas(tmp_path: Path, reader: str, case: str) -> None:
    """Finding: pandas skips a line of nothing but spaces and tabs, where the csv module reads a
    record of one field. After such a line every line named was one too early, and one right after
    the header hid the first record from the check that it has no more fields than the header:
    `Loved it, truly,pos` was read as text ' truly', label 'pos', exit 0. The re-reads skip
    what pandas skips, for every reader of CSV files."""
    body, said = WHITESPACE_LINES[case]
    path = tmp_path / "d.csv"
    path.write_bytes(body)
    if case == "a later empty label" and not reader.startswith("classification"):
        return  # only classification reads labels
    with pytest.raises(UserError, match=re.escape(f"{path}{said}")):
        LONG_ROW_READERS[reader](path)


@pytest.mark.parametrize("task", ["mlm", "clm", "denoise", "span_corruption"])
@pytest.mark.parametrize("separator", [" ", "\t", "\u200b", "  \r"])
@pytest.mark.parametrize("name", ["docs.txt", "docs.txt.gz"])
def test_blank_line_documents_end_at_any_blank_line(tmp_path: Path, task: str, separator: str, name: str) -> None:
    """Finding: `task.documents: blank_line` split documents where datasets' text builder splits
    paragraphs, at an empty line only: a line of spaces (WikiText's separator lines are one space)
    joined the documents around it, and WikiText-2's valid.txt was one document, exit 0; the last
    document kept a line break the others did not. A line that is blank by the readers' rule
    (`readers.blank`) ends a document, in train and eval files, plain or gzip."""
    import gzip

    from toolkit.tasks import TASKS

    text = f"one a\none b\n\ntwo\n{separator}\nthree\n{separator}\n{separator}\nfour\n".replace("\n", "\r\n" if "\r" in separator else "\n")
    text = text.replace("\r\r", "\r")
    path = tmp_path / name
    path.write_bytes(gzip.compress(text.encode()) if name.endswith(".gz") else text.encode())
    loaded = TASKS.get(task)(train_file=str(path), eval_file=str(path), documents="blank_line").load()
    for split in (loaded["train"], loaded["eval"][""]):
        assert sorted(split["text"]) == ["four", "one a\none b", "three", "two"]


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "text", "tsv"])  # a JSON document begins with [ or {
def test_text_beginning_as_a_compressed_file_does_is_one_line(tmp_path: Path, fmt: str) -> None:
    """datasets' readers take a file beginning with bzip2's mark `BZh` (or zip's, lz4's) for such
    an archive whatever its name, and a valid text file so begun was "could not be read (OSError:
    Invalid data stream)". One line names the mark, for every format the reader takes."""
    body = {"csv": "BZh,label\na,b\n", "tsv": "BZh\tlabel\na\tb\n", "jsonl": "BZh\n",
            "text": "BZh is how it begins\n"}[fmt]
    path = tmp_path / f"d.{'txt' if fmt == 'text' else fmt}"
    path.write_text(body)
    with pytest.raises(UserError, match=re.escape(f"{path}:1: begins with 'BZh', the mark of a bzip2 file")):
        readers.read(path, fmt)


@pytest.mark.parametrize("reader", sorted(JOINED))
def test_a_json_list_named_jsonl_is_refused(tmp_path: Path, reader: str) -> None:
    """Finding: a .jsonl file holding a JSON list (`[` on its own line, a record a line) is read
    by the json builder as a list, and a bad record was said at the line before its own. It is
    one line asking to name it .json, for every reader of JSONL files."""
    import json

    good, bad, read = JOINED[reader]
    path = tmp_path / "d.jsonl"
    path.write_text("[\n" + ",\n".join(json.dumps(r) for r in (good, good, bad)) + "\n]\n")
    with pytest.raises(UserError, match=re.escape(f"{path}: holds a JSON list, not JSON lines (one object a line); "
                                                  "name it .json")):
        read(path)


@pytest.mark.parametrize("join", ["plain", "with their BOMs", "gzip"])
@pytest.mark.parametrize("reader", sorted(LONG_ROW_READERS))
def test_a_header_repeated_inside_a_csv_is_refused(tmp_path: Path, reader: str, join: str) -> None:
    """Finding: two CSV files joined with their headers (`cat a.csv b.csv`) were read with the
    second header as a row: text 'text' with a class 'label' of its own, trained on, exit 0. A
    record that repeats the header is one line naming it, for every reader of CSV files."""
    import gzip

    bom = "\ufeff" if join == "with their BOMs" else ""
    body = (f"{bom}text,label\ngood,a\nbad,b\n" * 2).encode()
    path = tmp_path / ("d.csv.gz" if join == "gzip" else "d.csv")
    path.write_bytes(gzip.compress(body) if join == "gzip" else body)
    with pytest.raises(UserError, match=re.escape(f"{path}:4: repeats the header line (text, label)")):
        LONG_ROW_READERS[reader](path)


@pytest.mark.parametrize("key", ["train_file", "eval_file"])
@pytest.mark.parametrize("side", ["en", "de"])
@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_blank_lines_that_end_a_parallel_file_are_not_lines(tmp_path: Path, key: str, side: str, suffix: str) -> None:
    """Finding: a parallel file ending in an extra line break or two (an editor's) was "2 lines
    but ... has 3", the files line-aligned; blank lines after the last text of both files are not
    lines (as predict's plain-text reader counts them), in train and eval files, plain or gzip. A
    blank line facing a text is still refused at its line."""
    import gzip

    from toolkit.tasks.translation import Translation

    texts = {"en": "a cat\na dog\n", "de": "eine Katze\nein Hund\n"}
    texts[side] += "\n \n\t\n"
    for lang, text in texts.items():
        (tmp_path / f"p.{lang}{suffix}").write_bytes(gzip.compress(text.encode()) if suffix else text.encode())
    pattern = str(tmp_path / f"p.{{lang}}{suffix}")
    loaded = Translation(subset="custom", **{key: pattern, "eval_file": pattern}).load()
    read = loaded["train"] if key == "train_file" else loaded["eval"][""]
    assert read["source"] == ["a cat", "a dog"] and read["target"] == ["eine Katze", "ein Hund"]
    other = "de" if side == "en" else "en"
    texts[side] = texts[side].replace("\n", "\n\n", 1)  # line 2 blank, three lines of text around it
    texts[other] += "one more\n"
    for lang, text in texts.items():
        (tmp_path / f"p.{lang}{suffix}").write_bytes(gzip.compress(text.encode()) if suffix else text.encode())
    path = tmp_path / f"p.{side}{suffix}"
    with pytest.raises(UserError, match=re.escape(f"{path}:2: the {'source' if side == 'en' else 'target'} line is empty")):
        Translation(subset="custom", **{key: pattern, "eval_file": pattern}).load()


def _write_records(path: Path, rows: list[dict]) -> Path:
    import json

    text = json.dumps(rows, indent=1) if path.suffix == ".json" else "".join(json.dumps(r) + "\n" for r in rows)
    path.write_text(text)
    return path


def _label_names(path: Path, values: list) -> list[str]:
    from toolkit.tasks import TASKS

    rows = [{"text": f"text {i}", "label": v} for i, v in enumerate(values)]
    task = TASKS.get("text_classification")(train_file=str(_write_records(path, rows)), eval_file=str(path))
    task.load()
    return task.label_names


def _qa_ids(path: Path, values: list) -> list[str]:
    from toolkit.tasks.squad import read_squad

    context = "The tower is in Paris."
    rows = [{"id": v, "question": "Where?", "context": context,
             "answers": {"text": ["Paris"], "answer_start": [context.index("Paris")]}} for v in values]
    return [r["id"] for r in read_squad(str(_write_records(path, rows)), "v1")]


NAMED_BY_NUMBERS = {"label": _label_names, "qa id": _qa_ids}  # every reader that names things by a JSON number


@pytest.mark.parametrize("fmt", ["json", "jsonl"])
@pytest.mark.parametrize("reader", sorted(NAMED_BY_NUMBERS))
def test_numbers_that_name_something_are_held_as_written(tmp_path: Path, reader: str, fmt: str) -> None:
    """Finding: JSON labels 9007199254740993, 9007199254740992 and 12345678901234567890 were read
    as doubles (one value past int64 makes the column float) and became two classes, the first two
    one class, exit 0; a QA id 7 beside 7.5 was named "7.0". A number that names something is
    named by its value (7 and 7.0 are "7"), and one a double cannot hold exactly is one line."""
    read = NAMED_BY_NUMBERS[reader]
    names = read(tmp_path / f"a.{fmt}", [7, 7.5, 8])
    assert sorted(set(names)) == ["7", "7.5", "8"]
    assert read(tmp_path / f"b.{fmt}", [9007199254740993, 9007199254740992, 3]) == (
        ["3", "9007199254740992", "9007199254740993"] if reader == "label" else ["9007199254740993", "9007199254740992", "3"])
    with pytest.raises(UserError, match=rf"c\.{fmt}:\d+: .* is a whole number of 2\^53 or more in a JSON column "
                                        r"read as doubles .* write them as strings"):
        read(tmp_path / f"c.{fmt}", [9007199254740993, 9007199254740992, 12345678901234567890])


def _classification_rows(path: Path) -> list:
    from toolkit.tasks import TASKS

    task = TASKS.get("text_classification")(train_file=str(path), eval_file=str(path), text_columns=["text"],
                                            label_column="label")
    return task.load()["train"]["text"]


def _pairs_rows(path: Path) -> list:
    from toolkit.tasks._generation import read_records

    return read_records(path, ("text", "label"))["text"]


def _predict_rows(path: Path) -> list:
    from toolkit.inference import read_inputs

    return [r["text"] for r in read_inputs(str(path), ["text"])]


CSV_READERS = {"read": lambda p: readers.read(p, "csv")["text"], "text_classification": _classification_rows,
               "summarization/translation": _pairs_rows, "predict": _predict_rows}


@pytest.mark.parametrize("reader", sorted(CSV_READERS))
@pytest.mark.parametrize("body, line", [
    ('"Best phone ever,pos\nbad one,neg\ngreat,pos\nawful "quoted" thing,neg\nfine,pos\n', 3),
    ('"Best phone ever,pos\nbad one,neg\n', 3),
    ('"Best" phone ever,pos\nbad one,neg\n', 3)], ids=["closed by a later quote", "never closed", "text after"])
def test_a_quoted_csv_field_closes_where_it_ends(tmp_path: Path, reader: str, body: str, line: int) -> None:
    """Finding: a review opening with an unclosed quote ran on over the next rows, up to a later
    quote, and was read as one text (three examples lost, exit 0); text after a closing quote was
    joined silently. Every CSV reader refuses both in one line naming the line the field starts
    on, and reads a quoted line break and a doubled quote as written."""
    path = tmp_path / "d.csv"
    path.write_text("text,label\ngood,pos\n" + body)
    with pytest.raises(UserError, match=rf"d\.csv:{line}: a quoted field does not close where the field ends"):
        CSV_READERS[reader](path)
    path.write_text('text,label\ngood,pos\n"two\nlines, and a ""quote""",neg\n')
    assert list(CSV_READERS[reader](path)) == ["good", 'two\nlines, and a "quote"']


def _tsv_rows(path: Path) -> list:
    return readers.read(path, "tsv")["text"]


def _glue_rows(path: Path) -> list:
    from toolkit.tasks.glue import SPECS, read_tsv

    path.write_text(path.read_text().replace("text\tlabel", "sentence\tlabel").replace("pos", "1").replace("neg", "0"))
    return read_tsv(path, SPECS["sst2"])["text_a"]


@pytest.mark.parametrize("reader", sorted(CSV_READERS) + ["tsv", "glue tsv"])
@pytest.mark.parametrize("after", [" ", "\t", "  \t"])
def test_whitespace_after_a_closing_quote_is_read_as_the_csv_module_reads_it(tmp_path: Path, reader: str,
                                                                             after: str) -> None:
    """Finding: the strict quote pass refused `"abc" ,pos`, which the csv module and pandas read
    (as `abc `): spaces and tabs between a closing quote and the comma or line end are no
    swallowed row. Every CSV reader reads them as the csv module does; text after the quote is
    still refused (above). TSV readers take quotes as text and read the line as written."""
    import csv

    tsv = reader in ("tsv", "glue tsv")
    sep, after = ("\t", after.replace("\t", " ")) if tsv else (",", after)  # a tab is TSV's separator
    body = f'text{sep}label\n"abc"{after}{sep}pos\n"two ""x"""{after}{sep}neg\r\n'
    path = tmp_path / ("d.tsv" if tsv else "d.csv")
    path.write_bytes(body.encode())
    read = {"tsv": _tsv_rows, "glue tsv": _glue_rows}.get(reader) or CSV_READERS[reader]
    quoting = csv.QUOTE_NONE if tsv else csv.QUOTE_MINIMAL
    expected = [row[0] for row in csv.reader(io.StringIO(body, newline=""), delimiter=sep, quoting=quoting)][1:]
    assert expected[0] == ('"abc"' + after if tsv else "abc" + after)
    assert list(read(path)) == expected


def _squad_layout(path: Path, text: str) -> None:
    from toolkit.tasks.squad import read_squad

    context = "The tower is in Paris."
    qa = '{"id": "1", "question": "Where?", "question": "Which?", "answers": [{"text": "Paris", "answer_start": 16}]}'
    path.write_text('{"data": [{"title": "t", "paragraphs": [{"context": "%s", "qas": [%s]}]}]}' % (context, qa))
    read_squad(str(path), "v1")


def _json_entry(read: Callable) -> Callable:
    def run(path: Path, text: str) -> None:
        path.write_text(text)
        read(path)
    return run


def _ner_json(path: Path, text: str) -> None:
    from toolkit.tasks.ner import read_jsonl

    path.write_text('[{"tokens": ["EU", "rejects"], "tokens": ["x"], "ner_tags": ["B-ORG", "O"]}]')
    read_jsonl(path)


def _text_json(path: Path, text: str) -> None:
    from toolkit.tasks._text import _read_files

    path.write_text(text)
    _read_files({"train": str(path)}, "records", "line", None, SimpleNamespace(note=lambda *a: None))


JSON_DOCUMENT_READERS = {
    "read": _json_entry(lambda p: readers.read(p, "json")),
    "text_classification": _json_entry(lambda p: _classification_rows(p)),
    "summarization/translation": _json_entry(lambda p: _pairs_rows(p)),
    "predict": _json_entry(lambda p: _predict_rows(p)),
    "squad": _squad_layout, "ner": _ner_json, "pretraining text": _text_json}


@pytest.mark.parametrize("reader", sorted(JSON_DOCUMENT_READERS))
def test_a_key_twice_in_a_json_object_is_one_line(tmp_path: Path, reader: str) -> None:
    """Finding: `{"text": "first", "text": "second", ...}` in a JSON document was read as "second"
    without a word (the builder keeps the last), where the same record in JSONL is refused. Every
    reader of JSON documents refuses it, naming the key."""
    path = tmp_path / "d.json"
    with pytest.raises(UserError, match=r"d\.json: the key '\w+' appears twice in one object"):
        JSON_DOCUMENT_READERS[reader](path, '[{"text": "good", "label": "pos"},\n'
                                            ' {"text": "first", "text": "second", "label": "neg"}]')


def _summaries_of(path: Path) -> None:
    from toolkit.tasks._generation import read_records

    read_records(path, ("dialogue", "summary"))


def _squad_of(path: Path) -> None:
    from toolkit.tasks.squad import read_squad

    read_squad(str(path), "v1")


DATA_FIELD_READERS = {  # the readers of {"data": [...]} documents -> one good record of theirs
    "summarization": (_summaries_of, {"dialogue": "A: hi", "summary": "A greets."}),
    "squad": (_squad_of, {"title": "t", "paragraphs": [{"context": "In Paris.", "qas": [
        {"id": "a", "question": "Where?", "answers": [{"text": "Paris", "answer_start": 3}]}]}]}),
}


@pytest.mark.parametrize("reader", sorted(DATA_FIELD_READERS))
def test_a_data_list_given_twice_is_said_as_a_key_twice(tmp_path: Path, reader: str) -> None:
    """Finding: `{"data": [...], "data": []}` was "holds no records": the builder kept the last,
    empty list and failed before the key check ran. The key check comes first."""
    import json

    read, record = DATA_FIELD_READERS[reader]
    path = tmp_path / "d.json"
    path.write_text('{"data": ' + json.dumps([record]) + ', "data": []}')
    with pytest.raises(UserError, match=re.escape(f"{path}: the key 'data' appears twice in one object")):
        read(path)


PIPED = {  # name -> (file name, bytes); each holds the two rows below
    "plain text": ("in.txt", b"good film\nbad film\n"),
    "csv": ("in.csv", b"text,x\ngood film,1\nbad film,2\n"),
    "tsv": ("in.tsv", b"text\tx\ngood film\t1\nbad film\t2\n"),
    "jsonl": ("in.jsonl", b'{"text": "good film"}\n{"text": "bad film"}\n'),
    "json": ("in.json", b'[{"text": "good film"}, {"text": "bad film"}]'),
    "csv.gz": ("in.csv.gz", __import__("gzip").compress(b"text\ngood film\nbad film\n")),
    "no extension, jsonl": ("in", b'{"text": "good film"}\n{"text": "bad film"}\n'),  # told by its look
    "no extension, text": ("in", b"good film\nbad film\n"),
}


def _fifo(tmp_path: Path, name: str, data: bytes) -> Path:
    """A named FIFO that gives `data` once, to the first reader (a daemon writer: a test that
    never opens it leaves no hung process)."""
    import threading

    path = tmp_path / "fifo" / name
    path.parent.mkdir()
    os.mkfifo(path)

    def write() -> None:
        with path.open("wb") as out:
            out.write(data)
    threading.Thread(target=write, daemon=True).start()
    return path


@pytest.mark.parametrize("case, how", [(c, "named fifo") for c in sorted(PIPED)]
                         + [(c, "/dev/fd/N") for c in sorted(PIPED) if PIPED[c][0] == "in"])  # <(...): no extension
def test_predict_reads_a_pipe_once_as_it_reads_a_file(tmp_path: Path, case: str, how: str) -> None:
    """`toolkit predict --input <(printf ...)` said "/dev/fd/63 does not exist" (only a regular
    file or `-` was an input). Every readable path the OS opens is one: a pipe is read once, in
    full, and then read as the file of its name would be (no extension: JSONL or text by its look,
    as standard input is)."""
    import threading

    from toolkit.inference import read_inputs

    name, data = PIPED[case]
    if how == "/dev/fd/N":
        r, w = os.pipe()
        threading.Thread(target=lambda: (os.write(w, data), os.close(w)), daemon=True).start()
        source = f"/dev/fd/{r}"
    else:
        source = str(_fifo(tmp_path, name, data))
    try:
        assert [row["text"] for row in read_inputs(source, ["text"])] == ["good film", "bad film"]
    finally:
        if how == "/dev/fd/N":
            os.close(r)


@pytest.mark.parametrize("name, data, said", [
    ("in.csv", b'text\n"good film\nbad film\n', ":2: a quoted field does not close"),
    ("in.jsonl", b'{"text": "good film"}\n{"text": 5}\n', ":2: field 'text' is a number"),
    ("in.txt", b"good film\n\x00\n", ":2: holds a NUL byte"),
])
def test_a_bad_record_in_a_pipe_is_named_by_the_pipe(tmp_path: Path, name: str, data: bytes, said: str) -> None:
    """What is wrong in a pipe's bytes is said with the path the user gave, never the temporary
    copy's."""
    from toolkit.inference import read_inputs

    source = _fifo(tmp_path, name, data)
    with pytest.raises(UserError) as caught:
        read_inputs(str(source), ["text"])
    assert str(caught.value).startswith(f"{source}{said}"), str(caught.value)


def _null_record_readers() -> dict:
    from toolkit.inference import read_inputs
    from toolkit.tasks import _generation, ner, squad, text_classification
    return {
        "text_classification": (lambda p: text_classification.read_file(p), {"text": "a b", "label": "x"}),
        "ner": (lambda p: ner.read_sentences(p), {"tokens": ["EU"], "ner_tags": ["B-ORG"]}),
        "squad": (lambda p: squad.read_squad(str(p)),
                  {"question": "q?", "context": "a b", "answers": {"text": ["a"], "answer_start": [0]}}),
        "summarization": (lambda p: _generation.read_records(p, ("dialogue", "summary")), {"dialogue": "a b", "summary": "a"}),
        "predict": (lambda p: read_inputs(str(p), ["dialogue"]), {"dialogue": "a b"}),
        "predict-words": (lambda p: read_inputs(str(p), ["tokens"], ("tokens",)), {"tokens": ["EU"]}),
    }


@pytest.mark.parametrize("reader, fmt", [(r, f) for r in ("text_classification", "ner", "squad", "summarization",
                                                            "predict", "predict-words")
                                          for f in ("jsonl", "json", "stdin") if f != "stdin" or r.startswith("predict")])
def test_a_null_record_is_said_to_be_no_object(tmp_path: Path, monkeypatch, reader: str, fmt: str) -> None:
    """A `null` line (or list item) was read as a record of nulls and said as "column 'text' is
    missing" (or a field null, words not a list); every reader now names the record: line 2 is
    null, not a JSON object."""
    from toolkit.inference import read_inputs

    read, record = _null_record_readers()[reader]
    if fmt == "stdin":  # standard input is predict's
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(f"{json.dumps(record)}\nnull\n".encode())))
        path = "-"
        names = list(record)
        read = lambda p: read_inputs(p, names, ("tokens",))  # noqa: E731
    else:
        path = tmp_path / f"x.{fmt}"
        path.write_text(f"{json.dumps(record)}\nnull\n" if fmt == "jsonl" else f"[{json.dumps(record)},\nnull]\n")
    with pytest.raises(UserError) as caught:
        read(path)
    assert ":2: expected a JSON object" in str(caught.value) and "got null" in str(caught.value), str(caught.value)


@pytest.mark.parametrize("constant", ["-Infinity", "Infinity", "NaN"])
@pytest.mark.parametrize("reader, layout", [
    ("text_classification", "list"), ("summarization", "list"), ("summarization", "data"), ("squad", "data"),
    ("predict", "list"), ("predict", "data")])
def test_a_json_document_value_json_has_no_number_for_is_named(tmp_path: Path, reader: str, layout: str,
                                                                 constant: str) -> None:
    """A JSON list's label `-Infinity` reached the table as null and was called an empty label;
    every JSON document reader now names the value and its line."""
    from toolkit.inference import read_inputs
    from toolkit.tasks import _generation, squad, text_classification

    if reader == "squad":
        text = ('{"data": [{"title": "t", "paragraphs": [{"context": "a b", "qas": [\n'
                f'{{"id": "1", "question": "q?", "answers": [{{"text": "a", "answer_start": 0}}], "score": {constant}}}]}}]}}]}}\n')
    else:
        records = f'[{{"text": "a b", "dialogue": "x -Infinity y", "summary": "s", "label": 1}},\n{{"text": "c d", "dialogue": "d", "summary": "s", "label": {constant}}}]'
        text = records if layout == "list" else f'{{"data": {records}}}'
    path = tmp_path / "x.json"
    path.write_text(text)
    task = SimpleNamespace(json_field="data", predict_file=lambda path: None,  # a task of flat records
                           input_fields=lambda names, kinds, where: names)  # read by the run's names
    read = {"text_classification": lambda: text_classification.read_file(path),
            "summarization": lambda: _generation.read_records(path, ("dialogue", "summary")),
            "squad": lambda: squad.read_squad(str(path)),
            "predict": lambda: read_inputs(str(path), ["dialogue"], (), task)}[reader]
    with pytest.raises(UserError) as caught:
        read()
    assert f"x.json:2: a value is {constant}, which JSON has no number for" in str(caught.value), str(caught.value)


def _tsv_validated(path: Path) -> None:
    from toolkit.recipe import check_data
    from toolkit.tasks import TASKS

    check_data(SimpleNamespace(task=TASKS.get("text_classification")(train_file=str(path), eval_file=str(path))))
    readers.read(path, "tsv")  # validate reads the head only: a cell further down is the run's to say


TSV_READERS = {"read": _tsv_rows, "predict": _predict_rows, "validate then run": _tsv_validated,
               **{f"classification {split}": _classified(f"{split}_file") for split in ("train", "eval", "test")}}


@pytest.mark.parametrize("name", ["d.tsv", "d.tsv.gz"])
@pytest.mark.parametrize("reader", sorted(TSV_READERS))
@pytest.mark.parametrize("body, said", [
    ('"text"\t"label"\n"good"\t"pos"\n"bad"\t"neg"\n', r'd\.tsv(\.gz)?:1: the header\'s names are in quotes \("text", "label"\)'),
    ('text\tlabel\ngood\tpos\n"He said ""hi"" twice"\tneg\n',
     r'd\.tsv(\.gz)?:3: column \'text\' is written with CSV quoting \(\'"He said ""hi"" twice"\'')],
    ids=["quoted header (R, QUOTE_ALL)", "a quoted text (pandas, csv module)"])
def test_a_tsv_written_with_csv_quoting_is_one_line(tmp_path: Path, reader: str, name: str, body: str,
                                                    said: str) -> None:
    """Finding: a TSV is read with its quotes as text (GLUE's files hold quoted sentences), and a
    TSV a CSV writer quoted was read so: R's write.table(sep="\\t") named the columns `"text"` and
    `"label"`, every text kept its quotes and the classes were `"neg"` and `"pos"`; pandas'
    to_csv(sep="\\t") wrote a text holding a quote as `"He said ""hi"" twice"`, trained on with
    its quotes doubled; exit 0 both. Every TSV reader says it in one line; quotes that are text
    (a quoted sentence, a quote inside a text) are read as written, as GLUE's own are."""
    import gzip

    path = tmp_path / name
    pack = gzip.compress if name.endswith(".gz") else (lambda b: b)
    path.write_bytes(pack(body.encode()))
    with pytest.raises(UserError, match=said + r".*a \.tsv is read with its quotes as text"):
        TSV_READERS[reader](path)
    path.write_bytes(pack(b'text\tlabel\n"Would you?"\ta\nHe said "hi" twice\tb\n"x""\tb\n'))
    if reader.startswith("classification") or reader == "validate then run":
        TSV_READERS[reader](path)
    else:
        assert list(TSV_READERS[reader](path)) == ['"Would you?"', 'He said "hi" twice', '"x""']


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("reader", sorted(set(READERS) - {"predict stdin"}))  # standard input is no file
def test_a_file_that_cannot_be_opened_is_said_so_not_called_a_bad_gzip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      reader: str, gz: bool) -> None:
    """Finding: any OSError of the byte scan was said as `not a readable gzip file`, for a
    `train.csv` the user may not read (permission denied) or a disk error too. Every reader says
    what the OS said; a damaged gzip is still said as one."""
    import gzip

    suffix, read = READERS[reader]
    path = tmp_path / f"data{suffix}{'.gz' if gz else ''}"
    path.write_bytes(gzip.compress(b"text\tlabel\n") if gz else b"text\tlabel\n")

    def denied(p: Path) -> None:
        raise PermissionError(13, "Permission denied", str(p))

    monkeypatch.setattr(readers, "_open_bytes", denied)
    with pytest.raises(UserError, match=rf"data{re.escape(suffix)}(\.gz)?: cannot be read \(Permission denied\)$"):
        read(path, monkeypatch)


BOOLEAN_LABELS = {"csv": "text,label\ngood,true\nbad,false\n",
                  "jsonl": '{"text": "good", "label": true}\n{"text": "bad", "label": false}\n',
                  "json": '[{"text": "good", "label": true}, {"text": "bad", "label": false}]\n'}


@pytest.mark.parametrize("eval_fmt", sorted(BOOLEAN_LABELS))
@pytest.mark.parametrize("train_fmt", sorted(BOOLEAN_LABELS))
def test_a_json_boolean_label_is_named_as_json_writes_it(tmp_path: Path, train_fmt: str, eval_fmt: str) -> None:
    """Finding: a JSON/JSONL label true/false was the class "True"/"False" (Python's str()), where
    the same data as CSV is "true"/"false": a CSV train file beside a JSONL eval file was refused
    (label 'False' is not one of ...), exit 2, and `labels: [false, true]` could not name them. A
    JSON boolean reads as the text JSON writes, in every format pair."""
    from toolkit.tasks import TASKS

    train, dev = tmp_path / f"train.{train_fmt}", tmp_path / f"dev.{eval_fmt}"
    train.write_text(BOOLEAN_LABELS[train_fmt])
    dev.write_text(BOOLEAN_LABELS[eval_fmt])
    task = TASKS.get("text_classification")(train_file=str(train), eval_file=str(dev))
    loaded = task.load()
    assert task.label_names == ["false", "true"]
    assert loaded["eval"][""]["label"] == [1, 0]
    named = TASKS.get("text_classification")(train_file=str(train), eval_file=str(dev), labels=["true", "false"])
    assert named.load()["train"]["label"] == [0, 1]


SHORT_ROWS = {  # body -> what is said
    "a row cut short": (b"text,label\ngood,a\nshort\nbad,b\n", r":3: this row has 1 field, the header has 2; give every"),
    "a lone carriage return": (b"text,label\ngood,a\ncut\rshort,b\nbad,b\n",
                               r":3: this row has 1 field, the header has 2; the line ends in a lone carriage return"),
}


@pytest.mark.parametrize("case", sorted(SHORT_ROWS))
@pytest.mark.parametrize("reader", sorted(LONG_ROW_READERS) + ["tsv"])
def test_a_row_with_fewer_fields_than_the_header_is_said_as_such(tmp_path: Path, reader: str, case: str) -> None:
    """Finding: pandas fills the fields a short row lacks with "", and a row cut short, or split
    in two by a lone carriage return (which pandas ends a row at), was said as "label is empty"
    (or ran, where the field was not needed). Every CSV/TSV reader names the row and both counts;
    an empty cell in a full row is still the task's to say."""
    body, said = SHORT_ROWS[case]
    path = tmp_path / ("d.tsv" if reader == "tsv" else "d.csv")
    if reader == "tsv":
        body = body.replace(b",", b"\t")
    path.write_bytes(body)
    read = (lambda p: readers.read(p, "tsv")) if reader == "tsv" else LONG_ROW_READERS[reader]
    with pytest.raises(UserError, match=re.escape(str(path)) + said):
        read(path)
    path.write_bytes(body.replace(b"short\n", b"short,b\n").replace(b"\r", b" ").replace(b",", b"\t" if reader == "tsv" else b","))
    readers.read(path, "tsv" if reader == "tsv" else "csv")  # full rows are read
    path.write_bytes(b"text,label\ngood,a\nempty,\n".replace(b",", b"\t" if reader == "tsv" else b","))
    assert readers.read(path, "tsv" if reader == "tsv" else "csv")["label"] == ["a", ""]


@pytest.mark.parametrize("line", ["sep=,", "sep=;", "SEP=\t"])
@pytest.mark.parametrize("reader", sorted(LONG_ROW_READERS) + ["tsv", "head names"])
def test_an_excel_separator_line_is_named(tmp_path: Path, reader: str, line: str) -> None:
    """Finding: Excel's `sep=,` first line was said as "column 2 of the header has no name" (and
    `sep=;` read as a column named so, each later column then missing). Every CSV/TSV reader, and
    the head check validate runs, names it as Excel's separator line."""
    tsv = reader == "tsv" or line.endswith("\t") and reader == "head names"
    path = tmp_path / ("d.tsv" if tsv else "d.csv")
    path.write_text(line + "\n" + "text,label\ngood,a\nbad,b\n".replace(",", "\t" if tsv else ","))
    read = {"tsv": lambda p: readers.read(p, "tsv"), "head names": readers.head_names}.get(reader) \
        or LONG_ROW_READERS[reader]
    with pytest.raises(UserError, match=re.escape(f"{path}:1: the first line is Excel's separator line")):
        read(path)


@pytest.mark.parametrize("reader", sorted(JOINED))
def test_a_pretty_printed_jsonl_file_is_said_as_such(tmp_path: Path, reader: str) -> None:
    """Finding: a .jsonl file written with json.dump(..., indent=2) was read by the json builder,
    but every record's line named after was wrong, and a later fault was said as "not valid JSON"
    at line 1. Every JSONL reader says it holds one JSON value over several lines; a record spread
    over lines later in the file is said so at its line where the file is re-read."""
    import json

    good, _, read = JOINED[reader]
    second = {**good, **({"label": "b"} if reader == "classification" else {})}
    path = tmp_path / "d.jsonl"
    path.write_text("\n" + json.dumps(good, indent=2) + "\n" + json.dumps(second, indent=2) + "\n")
    with pytest.raises(UserError, match=re.escape(f"{path}:2: one JSON value runs over") + r" \d+ lines"):
        read(path)
    path.write_text(json.dumps(good) + "\n" + json.dumps(second, indent=2) + "\n")
    assert readers._jsonl_problem(path).startswith(f"{path}:2: one JSON value runs over")


def _glue_read(task: str, split: str) -> Callable:
    def read(folder: Path) -> None:
        from toolkit.tasks import TASKS
        from toolkit.tasks.glue import read_test

        glue = TASKS.get("glue")(subset=task, data_dir=str(folder))
        read_test(glue) if split == "test" else glue.load()
    return read


GLUE_FILES = {  # (task, split) -> (file, its lines with a CSV writer's quoting, what is said)
    ("sst2", "train"): ("train.tsv", ['sentence\tlabel', 'good\t1', '"He said ""hi"" twice"\t0'],
                        r"train\.tsv:3: column 'sentence' is written with CSV quoting"),
    ("sst2", "dev"): ("dev.tsv", ['"sentence"\t"label"', 'good\t1', 'bad\t0'],
                      r"dev\.tsv:1: the header's names are in quotes \(\"sentence\", \"label\"\)"),
    ("cola", "train"): ("train.tsv", ['gj04\t1\t\tgood', 'gj04\t0\t*\t"He said ""hi"" twice"'],
                        r"train\.tsv:2: column 4 is written with CSV quoting"),
    ("sst2", "test"): ("test.tsv", ['index\tsentence', '0\t"He said ""hi"" twice"'],
                       r"test\.tsv:2: column 'sentence' is written with CSV quoting"),
}


@pytest.mark.parametrize("case", sorted(GLUE_FILES), ids=lambda c: "-".join(c))
def test_a_glue_file_written_with_csv_quoting_is_one_line(tmp_path: Path, case: tuple) -> None:
    """Finding: GLUE's own TSV reader took a file re-saved by pandas (`to_csv(sep="\\t")`: a
    sentence holding a quote written in quotes, each quote doubled) or by R (a quoted header)
    as written, trained on with the quotes, exit 0, where a user's TSV was refused. GLUE's
    train/dev reader (with and without a header) and its test reader say it as users' TSVs do;
    GLUE's quoted sentences (no doubled quote) read as written."""
    task, split = case
    name, lines, said = GLUE_FILES[case]
    folder = tmp_path / "glue" / {"sst2": "SST-2", "cola": "CoLA"}[task]
    folder.mkdir(parents=True)
    good = ["sentence\tlabel", '"Would you?"\t1', 'He said "hi" twice\t0'] if task == "sst2" else \
        ['gj04\t1\t\t"Would you?"', 'gj04\t0\t*\tHe said "hi" twice']
    for other in ("train.tsv", "dev.tsv"):
        (folder / other).write_text("\n".join(good) + "\n")
    (folder / "test.tsv").write_text("index\tsentence\n0\tgood\n")
    _glue_read(task, split)(tmp_path)  # GLUE's own quotes are text
    (folder / name).write_text("\n".join(lines) + "\n")
    with pytest.raises(UserError, match=said + r".*a \.tsv is read with its quotes as text"):
        _glue_read(task, split)(tmp_path)


def _texts_file(path: Path, tag: str) -> Path:
    """Four records whose texts begin with `tag`, in the format the name says."""
    rows = [{"text": f"{tag} text {i}", "label": "ab"[i % 2]} for i in range(4)]
    if path.suffix in (".csv", ".tsv"):
        sep = "," if path.suffix == ".csv" else "\t"
        path.write_text(f"text{sep}label\n" + "".join(f"{r['text']}{sep}{r['label']}\n" for r in rows))
    elif path.suffix == ".txt":
        path.write_text("".join(r["text"] + "\n" for r in rows))
    else:
        _write_records(path, rows)
    return path


# a file's name holding what a glob reads as a pattern, and the other file the pattern matches
GLOB_NAMES = {"brackets": ("data[1]", "data1"), "star": ("data*", "dataX"), "question mark": ("data?", "dataY")}
NAMED_READERS = {  # every entry a run, eval, sweep, the API or predict reads a data file through
    **{f"read {s}": (s, lambda p: readers.read(p, readers.FORMATS[p.suffix])["text"]) for s in readers.FORMATS},
    "text_classification": (".csv", _classification_rows), "summarization/translation": (".jsonl", _pairs_rows),
    "predict": (".json", _predict_rows)}


@pytest.mark.parametrize("name", sorted(GLOB_NAMES))
@pytest.mark.parametrize("reader", sorted(NAMED_READERS))
def test_a_file_is_read_by_its_name_never_as_a_pattern(tmp_path: Path, reader: str, name: str) -> None:
    """Finding: datasets' builders take `data_files` for a glob pattern. A file named
    `train[1].csv` was read as `train1.csv` beside it, `train*.csv` as every file its name
    matches, joined, `data?.csv` as `data?.csv` and `dataY.csv` (exit 0, the run named by the
    named file's bytes), and `only[2].csv` alone as 'has a header and no rows'. Every reader reads
    the one file the path names."""
    suffix, read = NAMED_READERS[reader]
    named, decoy = GLOB_NAMES[name]
    path = _texts_file(tmp_path / f"{named}{suffix}", "named")
    assert list(read(path)) == [f"named text {i}" for i in range(4)]  # alone: not 'no such file' or no rows
    _texts_file(tmp_path / f"{decoy}{suffix}", "decoy")
    assert list(read(path)) == [f"named text {i}" for i in range(4)]


def test_a_path_datasets_cannot_name_is_one_line(tmp_path: Path) -> None:
    """`::` in a path is a chain of URLs to datasets' builders, whatever comes before it: the line
    says so (it was 'could not be read as csv (FileNotFoundError: Unable to find ...)')."""
    path = _texts_file(tmp_path / "a::b.csv", "named")
    with pytest.raises(UserError, match=re.escape(f"{path}: datasets' readers take '::' in a path")):
        readers.read(path)


def _mixed_readers() -> dict:
    from toolkit.inference import read_inputs
    from toolkit.tasks import TASKS
    from toolkit.tasks._generation import read_records

    def classify(path: Path) -> Any:
        return TASKS.get("text_classification")(train_file=str(path), eval_file=str(path), text_columns=["text"],
                                                label_column="label").load()
    return {"text_classification text": ("text", classify), "text_classification label": ("label", classify),
            "summarization/translation": ("text", lambda p: read_records(p, ("text", "label"))),
            "predict": ("text", lambda p: read_inputs(str(p), ["text"]))}


MIXED = {  # strings datasets keeps as they are in a column of mixed JSON types, then the value at fault
    "leading zeros": (["007", "a b"], {"x": 1}, "an object"),
    "a number, NaN": (["123", "NaN"], ["a"], "a list"),
    "true, null, a list": (["true", "null", "[1]"], {"y": 2}, "an object"),
}


@pytest.mark.parametrize("layout", ["jsonl", "json"])  # ({"data": [...]}: the builder refuses a type change itself)
@pytest.mark.parametrize("case", sorted(MIXED))
@pytest.mark.parametrize("reader", sorted(_mixed_readers()))
def test_a_field_of_mixed_json_types_is_named_at_the_record_at_fault(tmp_path: Path, reader: str, case: str,
                                                                     layout: str) -> None:
    """Finding: a column of mixed JSON types reaches the table as datasets' `Json` text, where a
    string that parses as JSON is kept as it is ("007", "NaN", "null", "[1]"): a text "007" before a
    record whose text was an object was a JSONDecodeError traceback (json.loads("007")), and a text
    "123" was named as the number at fault, the record holding the list left unnamed (a label "[1]"
    as a list). The record at fault is now found in the file: its line, its type, every reader."""
    column, read = _mixed_readers()[reader]
    strings, bad, kind = MIXED[case]
    rows = [{"text": f"text {i}", "label": "ab"[i % 2], column: s} for i, s in enumerate(strings)]
    rows.append({"text": "last", "label": "a", column: bad})
    path = _write_records(tmp_path / f"d.{layout}", rows)
    lines = path.read_text().splitlines()  # the last record's line (JSON: its opening brace's)
    line = len(rows) if layout == "jsonl" else max(i + 1 for i, text in enumerate(lines) if text.strip() == "{")
    with pytest.raises(UserError, match=rf"^{re.escape(str(path))}:{line}: .*'{column}' is {kind}, expected text"):
        read(path)


@pytest.mark.parametrize("reader, fmt", [(r, f) for r in ("text_classification", "ner", "squad", "summarization",
                                                            "predict", "predict-words")
                                          for f in ("jsonl", "stdin") if f != "stdin" or r.startswith("predict")])
def test_a_comma_after_a_jsonl_record_is_said_as_such(tmp_path: Path, monkeypatch, reader: str, fmt: str) -> None:
    """A JSON list's items written a line each with their commas (`{...},`) was "not valid JSON
    (Extra data)"; every JSONL reader and predict's standard input name the comma."""
    from toolkit.inference import read_inputs

    read, record = _null_record_readers()[reader]
    text = f"{json.dumps(record)},\n{json.dumps(record)}\n"
    if fmt == "stdin":
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode())))
        path, names = "-", list(record)
        read = lambda p: read_inputs(p, names, ("tokens",))  # noqa: E731
    else:
        path = tmp_path / "x.jsonl"
        path.write_text(text)
    with pytest.raises(UserError, match=r":1: a comma after the record; a JSON lines file holds one JSON object a line"):
        read(path)


def _predict_document_rows(path: Path) -> list:
    from toolkit.inference import read_inputs

    task = SimpleNamespace(json_field="data", predict_file=lambda path: None,  # a task of flat records
                           input_fields=lambda names, kinds, where: names)  # read by the run's names
    return [r["text"] for r in read_inputs(str(path), ["text"], (), task)]


BOM_READERS = {  # layout -> (suffix, read the texts)
    **{s: (s, lambda p: list(readers.read(p, readers.FORMATS[p.suffix])["text"])) for s in readers.FORMATS},
    "summarization/translation {data}": (".json", lambda p: list(_pairs_rows(p))),
    "predict {data}": (".json", _predict_document_rows),
}


@pytest.mark.parametrize("layout", sorted(BOM_READERS))
def test_a_utf8_byte_order_mark_is_read_by_every_reader(tmp_path: Path, layout: str) -> None:
    """Finding: a JSON document with its list under a field (`{"data": [...]}`, what summarization,
    translation and their predict read) that begins with a UTF-8 BOM (Notepad's, PowerShell's) was
    "could not be read as json (ValueError: Expected object or value)", where every other layout
    read it. Every reader reads a file with a BOM as the same file without one."""
    suffix, read = BOM_READERS[layout]
    plain = _texts_file(tmp_path / f"plain{suffix}", "t")
    if "{data}" in layout:
        plain.write_text(json.dumps({"data": json.loads(plain.read_text())}))
    marked = tmp_path / f"marked{suffix}"
    marked.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    assert read(marked) == read(plain) == [f"t text {i}" for i in range(4)]


def _shifted_rows(path: Path) -> list:
    from toolkit.tasks import TASKS

    task = TASKS.get("text_classification")(train_file=str(path), eval_file=str(path), text_columns=["text"],
                                            label_column="label")
    return task.load()["train"]["text"]


LINE_END_READERS = {"read": lambda p: readers.read(p)["text"], "text_classification": _shifted_rows,
                    "summarization/translation": _pairs_rows, "predict": _predict_rows}


@pytest.mark.parametrize("reader, suffix", [(r, s) for r in sorted(LINE_END_READERS) for s in (".csv", ".tsv")])
def test_a_row_ending_at_a_lone_carriage_return_is_refused(tmp_path: Path, reader: str, suffix: str) -> None:
    """Finding: a row ending at a lone carriage return (classic Mac's line end) in a file of \\n
    line ends made pandas read the next row shifted when its first field was empty: `\\r,great,pos,neg`
    under `id,text,label,note` was the text 'pos' with the label 'neg', exit 0. Such a file is one
    line naming the row; a file whose rows all end at \\r, and \\r inside a quoted field, read as written."""
    sep = "," if suffix == ".csv" else "\t"
    row = lambda *cells: sep.join(cells)  # noqa: E731
    path = tmp_path / f"d{suffix}"
    body = [row("id", "text", "label", "note"), row("1", "good", "pos", "x"), row("2", "bad", "neg", "y")]
    path.write_bytes(("\n".join(body) + "\n\r" + row("", "great", "pos", "neg") + "\n").encode())
    with pytest.raises(UserError, match=rf"{re.escape(str(path))}:4: this row ends at a lone carriage return"):
        LINE_END_READERS[reader](path)
    path.write_bytes(("\r".join(body + [row("3", "great", "pos", "z")]) + "\r").encode())
    assert list(LINE_END_READERS[reader](path)) == ["good", "bad", "great"]
    if suffix == ".csv":
        path.write_bytes(("\n".join(body[:2]) + '\n2,"b\rad",neg,y\n').encode())
        assert list(LINE_END_READERS[reader](path)) == ["good", "b\rad"]


BOMS_IN = {  # format -> (own-data recipe, file text, predict's input fields)
    "csv": ("minilm-full", "text,label\nhello there,a\nbye now,b\nhello again,a\nbye again,b\n", ["text"]),
    "tsv": ("minilm-full", "text\tlabel\nhello there\ta\nbye now\tb\nhello again\ta\nbye again\tb\n", ["text"]),
    "jsonl": ("minilm-full", "".join(json.dumps({"text": t, "label": "ab"[i % 2]}) + "\n"
                                     for i, t in enumerate(["hello there", "bye now", "hi", "bye"])), ["text"]),
    "json": ("minilm-full", json.dumps([{"text": t, "label": "ab"[i % 2]}
                                        for i, t in enumerate(["hello there", "bye now", "hi", "bye"])]), ["text"]),
    "conll": ("minilm-lora-ner", "EU B-ORG\nrejects O\n\nPeter B-PER\nsaid O\n", ["tokens"]),
    "txt": ("gpt2-clm", "hello there\nbye now\nhello again\n", ["text"]),
}


@pytest.mark.parametrize("marks", [2, 3])
@pytest.mark.parametrize("fmt", sorted(BOMS_IN))
def test_a_file_beginning_with_several_boms_is_one_line(tmp_path: Path, fmt: str, marks: int) -> None:
    """Rule: a file begins with one UTF-8 BOM at most. Two (a file re-saved as UTF-8 by a tool that
    read its BOM as text) named the first column '\\ufefftext' (conventional-name inference missed
    `text`, validate said 'text' was missing), began the first CoNLL word and the first line of
    text with U+FEFF (exit 0), and were a builder's error for CSV and JSON. One line naming the
    file, at validate (check_data), at a run's read (task.load) and for predict's --input."""
    from toolkit import recipe as recipes
    from toolkit.inference import read_inputs

    name, text, fields = BOMS_IN[fmt]
    path = tmp_path / f"d.{fmt}"
    path.write_bytes(codecs.BOM_UTF8 * marks + text.encode())
    said = f"{path}: begins with {marks} UTF-8 byte order marks (U+FEFF)"
    recipe = recipes.load(ROOT / "recipes" / "demo" / "own-data" / f"{name}.yaml",
                          [f"task.train_file={path}", f"task.eval_file={path}"])
    steps = [lambda: recipes.check_data(recipe), recipe.task.load]
    if fmt != "conll":
        steps.append(lambda: read_inputs(str(path), fields))
    for step in steps:
        with pytest.raises(UserError) as caught:
            step()
        assert str(caught.value).startswith(said), caught.value
    path.write_bytes(codecs.BOM_UTF8 + text.encode())  # one is read as none
    recipes.check_data(recipe)
    assert len(recipe.task.load()["train"]) > 0


BOM_CELLS = {  # name -> (suffix, the file's bytes: line 3's text begins with U+FEFF)
    "csv": (".csv", "text,label\ngood,a\n\ufeffbad,b\n".encode()),
    "csv quoted": (".csv", 'label,text\na,good\nb,"\ufeffbad"\n'.encode()),
    "tsv": (".tsv", "text\tlabel\ngood\ta\n\ufeffbad\tb\n".encode()),
    "jsonl": (".jsonl", '{"text": "good", "label": "a"}\n{"text": "\ufeffbad", "label": "b"}\n'.encode()),
    "jsonl escaped": (".jsonl", b'{"text": "good", "label": "a"}\n{"text": "\\ufeffbad", "label": "b"}\n'),
}


@pytest.mark.parametrize("reader, case", [(r, c) for r in ("classification train", "classification eval", "summarization",
                                                             "predict input") for c in sorted(BOM_CELLS)])
def test_a_text_cell_beginning_with_a_byte_order_mark_is_refused_at_its_line(tmp_path: Path, case: str,
                                                                            reader: str) -> None:
    """Finding: `scan` allows one BOM at a file's start (every reader strips it), but a text cell
    beginning with U+FEFF further down (a file joined after another, a cell pasted from one) was
    trained as text with an invisible first character, exit 0. One line naming file, line and
    column, for CSV, TSV and JSONL (escaped or not), for every reader of records with text; the
    file's own leading BOM is still read."""
    suffix, body = BOM_CELLS[case]
    path = tmp_path / f"d{suffix}"
    path.write_bytes(body)
    line = 2 if case.startswith("jsonl") else 3
    with pytest.raises(UserError, match=rf"^{re.escape(str(path))}:{line}: .*'?text'? begins with a byte order "
                                        r"mark \(U\+FEFF\)") as caught:
        LONG_ROW_READERS[reader](path)
    assert "\n" not in str(caught.value)
    path.write_bytes(codecs.BOM_UTF8 + body.replace("\ufeff".encode(), b"").replace(b"\\ufeff", b""))
    LONG_ROW_READERS[reader](path)


def _pretraining_json(path: Path) -> None:
    from toolkit.tasks._text import _read_files

    _read_files({"train": str(path)}, "records", "line", None, SimpleNamespace(note=lambda *a: None))


def _squad_predict(path: Path) -> None:
    from toolkit.tasks.squad import document_questions

    document_questions(path)


JSON_LINES_READERS = {  # reader -> (a good record of its own, read the file)
    **{name: (JOINED[name][0], JOINED[name][2]) for name in JOINED},
    "pretraining text": ({"text": "a document"}, _pretraining_json),
    "squad predict": (JOINED["qa"][0], _squad_predict),
}


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("reader", sorted(JSON_LINES_READERS) + ["validate"])
def test_json_lines_named_json_is_said_as_such(tmp_path: Path, cli, reader: str, gz: bool) -> None:
    """Finding: a .json file holding JSON lines (a record a line, as transformers' example scripts
    write under .json and datasets reads) was `x.json:2: not valid JSON (Extra data)` for the
    readers that take a {"data": [...]} document (summarization, translation, SQuAD, its predict)
    and "expected a JSON list of objects" for the others, neither saying what the file is; now
    one line asking for .jsonl from every reader of a .json file (predict's inputs too), and at validate."""
    import gzip

    record, read = JSON_LINES_READERS.get(reader, JSON_LINES_READERS["classification"])
    path = tmp_path / ("d.json.gz" if gz else "d.json")
    body = "".join(json.dumps({**record, **({"label": label} if reader in ("classification", "validate") else {})})
                   + "\n" for label in ("a", "b", "a")).encode()
    path.write_bytes(gzip.compress(body) if gz else body)
    said = f"{path}: holds JSON lines (one object a line), not one JSON document; "
    fix = "name it .jsonl.gz" if gz else "name it .jsonl"
    if reader == "validate":
        code, _, err = cli("validate", ROOT / "recipes/demo/own-data/minilm-full.yaml",
                           f"task.train_file={path}", f"task.eval_file={path}")
        assert code == 2 and said in err and fix in err
        return
    with pytest.raises(UserError) as caught:
        read(path)
    assert said in str(caught.value) and str(caught.value).endswith(fix)


def _noted_classification(split: str, column: str) -> Callable:
    def read(path: Path) -> dict:
        from toolkit.tasks import TASKS

        good = path.with_name("good.csv")
        good.write_text("text,label\ngood,a\nbad,b\n")
        task = TASKS.get("text_classification")(**{"train_file": str(good), "eval_file": str(good), split: str(path)})
        task.load()
        return task.notices()
    return read


def _noted_pairs(task_name: str) -> Callable:
    def read(path: Path) -> dict:
        from toolkit.tasks import TASKS

        fields = {"source_field": "text", "target_field": "label"}
        langs = {"source_lang": "en", "target_lang": "de"} if task_name == "translation" else {}
        task = TASKS.get(task_name)(train_file=str(path), eval_file=str(path), **fields, **langs)
        task.load()
        return task.notices()
    return read


def _noted_pretraining(path: Path) -> dict:
    from toolkit.tasks import TASKS

    task = TASKS.get("mlm")(train_file=str(path), eval_file=str(path), text_field="text")
    task.load()
    return task.notices()


def _noted_predict(path: Path) -> dict:
    from toolkit.inference import read_inputs
    from toolkit.tasks import TASKS

    task = TASKS.get("text_classification")(eval_file=str(path), text_columns=["text"], label_column="label")
    read_inputs(str(path), ["text"], task=task)
    return task.notices()


MARKED_TEXT_READERS = {  # reader -> (the column whose text is a mark, read the file -> the task's notices)
    "classification train": ("text", _noted_classification("train_file", "text")),
    "classification eval": ("text", _noted_classification("eval_file", "text")),
    "classification test": ("text", _noted_classification("test_file", "text")),
    "summarization source": ("text", _noted_pairs("summarization")),
    "summarization target": ("label", _noted_pairs("summarization")),
    "translation target": ("label", _noted_pairs("translation")),
    "pretraining text": ("text", _noted_pretraining),
    "predict input": ("text", _noted_predict),
}


@pytest.mark.parametrize("reader, fmt, mark", [  # pretraining reads CSV and JSONL records too
    (reader, fmt, mark) for reader in sorted(MARKED_TEXT_READERS) for fmt, mark in (("csv", "NA"), ("jsonl", " nan"))
    ] + [("classification train", "csv", "None")])
def test_a_text_written_as_a_missing_value_is_said(tmp_path: Path, reader: str, fmt: str, mark: str) -> None:
    """Finding: a text cell holding what R's write.csv, str(NaN) or str(None) write for a missing
    value (`NA`, `nan`, `None`) was trained and scored as that text, exit 0 (a summary 'nan'
    learnt as the target), where pandas, and run_glue / run_summarization through it, read the
    cell as no text; labels so were already said. One warning per file and field, naming the
    first record's line and how many more, in every reader of records with text."""
    column, read = MARKED_TEXT_READERS[reader]
    rows = [{"text": f"a sentence {i}", "label": "ab"[i % 2]} for i in range(6)]
    for i in (2, 4):
        rows[i][column] = mark
    path = tmp_path / f"d.{fmt}"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) if fmt == "jsonl" else
                    "text,label\n" + "".join(f"{r['text']},{r['label']}\n" for r in rows))
    said = [line for key, line in read(path).items() if key.startswith("missing text")]
    what = f"column '{column}'" if reader.startswith("classification") else \
        f"field '{column}'" if reader == "predict input" else f"'{column}'"
    assert said == [f"{path}:{4 if fmt == 'csv' else 3}: {what} is {mark.strip()!r} here and in 1 more record(s), which pandas and R write "
                    "for a missing value; each is read as that text (cells are read as written): take out the "
                    "records that have no text"]
    path.write_text(path.read_text().replace(mark, "NA-1"))  # a text that holds a mark is a text
    assert not [key for key in read(path) if key.startswith("missing text")]


def _surrogate_classified(split: str) -> Callable:
    def read(path: Path, text: Callable[[int], str], monkeypatch: Any) -> list:
        from toolkit.tasks import TASKS

        good = path.with_name("good.jsonl")
        good.write_text("".join(json.dumps({"text": f"plain {i}", "label": "ab"[i % 2]}) + "\n" for i in range(3)))
        path.write_text("".join(json.dumps({"text": text(i), "label": "ab"[i % 2]}) + "\n" for i in range(3)))
        files = {"train_file": str(good), "eval_file": str(good), split: str(path)}
        loaded = TASKS.get("text_classification")(**files).load()
        return loaded["train" if split == "train_file" else "eval"][""]["text"] if split == "eval_file" else \
            loaded["train"]["text"]
    return read


def _surrogate_records(layout: str) -> Callable:
    def read(path: Path, text: Callable[[int], str], monkeypatch: Any) -> list:
        from toolkit.tasks._generation import read_records

        rows = [{"document": text(i), "summary": f"s {i}"} for i in range(3)]
        path.write_text(json.dumps({"data": rows}, indent=1) if layout == "data" else json.dumps(rows, indent=1)
                        if layout == "list" else "".join(json.dumps(r) + "\n" for r in rows))
        return read_records(path, ("document", "summary"))["document"]
    return read


def _surrogate_ner(path: Path, text: Callable[[int], str], monkeypatch: Any) -> list:
    from toolkit.tasks.ner import read_jsonl

    path.write_text("".join(json.dumps({"tokens": ["w", text(i)], "ner_tags": ["O", "O"]}) + "\n" for i in range(3)))
    return [words[1] for words in read_jsonl(path).tokens]


def _surrogate_squad(path: Path, text: Callable[[int], str], monkeypatch: Any) -> list:
    from toolkit.tasks.squad import read_squad

    path.write_text("".join(json.dumps({"id": f"q{i}", "question": text(i), "context": "Paris is here.",
                                        "answers": {"text": ["Paris"], "answer_start": [0]}}) + "\n" for i in range(3)))
    return [r["question"] for r in read_squad(str(path))]


def _surrogate_pretraining(path: Path, text: Callable[[int], str], monkeypatch: Any) -> list:
    from toolkit.tasks._text import _read_files

    path.write_text("".join(json.dumps({"text": text(i)}) + "\n" for i in range(3)))
    ds, _ = _read_files({"train": str(path)}, "records", "line", None, SimpleNamespace(note=lambda *a: None))
    return ds["train"]["text"]


def _surrogate_predict(stdin: bool) -> Callable:
    def read(path: Path, text: Callable[[int], str], monkeypatch: Any) -> list:
        from toolkit.inference import read_inputs

        path.write_text("".join(json.dumps({"text": text(i)}) + "\n" for i in range(3)))
        if stdin:
            _stdin(monkeypatch, path)
        return [r["text"] for r in read_inputs("-" if stdin else str(path), ["text"])]
    return read


SURROGATE_READERS = {  # reader -> (suffix, write the records of text(i) and read their texts back)
    "classification train": (".jsonl", _surrogate_classified("train_file")),
    "classification eval": (".jsonl", _surrogate_classified("eval_file")),
    "summarization jsonl": (".jsonl", _surrogate_records("lines")),
    "summarization json list": (".json", _surrogate_records("list")),
    "summarization json {data}": (".json", _surrogate_records("data")),
    "ner jsonl": (".jsonl", _surrogate_ner),
    "squad flat jsonl": (".jsonl", _surrogate_squad),
    "pretraining jsonl": (".jsonl", _surrogate_pretraining),
    "predict file": (".jsonl", _surrogate_predict(False)),
    "predict stdin": (".jsonl", _surrogate_predict(True)),
}


@pytest.mark.parametrize("half", ["\ud83d", "\ude00"])
@pytest.mark.parametrize("reader", sorted(SURROGATE_READERS))
def test_half_a_surrogate_pair_in_a_json_string_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           reader: str, half: str) -> None:
    """Finding: a JSON string holding an escaped half of a UTF-16 surrogate pair alone
    (`"\\ud83d"`, what json.dumps writes for a text a UTF-16 tool cut inside an emoji) was dropped
    from the text without a word where datasets' json builder read a JSON list (ujson), exit 0,
    and JSON lines with one were "could not be read as jsonl (ValueError: Trailing data at
    position N)", no line named; standard input's reached the tokenizer (a TypeError). One line
    naming the file's line (stdin's example) for every reader of JSON, in every layout; the
    whole pair is the character it encodes, and an escaped backslash before `u` is text."""
    suffix, read = SURROGATE_READERS[reader]
    path = tmp_path / f"d{suffix}"
    whole = read(path, lambda i: f"emoji \ud83d\ude00 {i}" if i != 2 else "text \\ud83d 2", monkeypatch)
    assert list(whole) == ["emoji \U0001f600 0", "emoji \U0001f600 1", "text \\ud83d 2"]
    with pytest.raises(UserError) as caught:
        read(path, lambda i: f"cut {half} {i}" if i == 1 else f"fine {i}", monkeypatch)
    line = str(caught.value)
    cut = next(n for n, text in enumerate(path.read_text().splitlines(), start=1) if "cut" in text)
    place = "<stdin>: example 2:" if reader == "predict stdin" else f"{path}:{cut}:"
    assert line.startswith(place) and f"holds {ascii(half)[1:-1]}, one half of a UTF-16 surrogate pair" in line, line
    assert "\n" not in line


# A JSON document's list ({"data": [...]}) goes through pandas, which refused a field mixing JSON
# types inside a list or object with pyarrow's own line ("could not be read as json (ArrowTypeError
# ...)"), naming no record; a JSON list of the same records, or JSONL, reads (datasets' Json type).
MIXED_DOCUMENTS = {
    "text beside a number in a list": ([{"source": "a", "target": ["x"]}, {"source": "b", "target": ["y", 2]}],
                                       "record 2: 'target[]' is a number here but a string at record 1"),
    "list beside a text in a list": ([{"source": "a", "target": [["x"], "y"]}],
                                     "record 1: 'target[]' is a string here but a list at record 1"),
    "number beside a text in an object": ([{"source": "a", "meta": {"k": [1]}}, {"source": "b", "meta": {"k": ["z"]}}],
                                          "record 2: 'meta.k[]' is a string here but a number at record 1"),
}
MIXED_READERS: dict[str, Callable[[Path], Any]] = {
    "read": lambda path: readers.read(path, "json", field="data"),
    "generation read_records (run, eval)": lambda path: __import__("toolkit.tasks._generation", fromlist=["x"]).read_records(
        path, ("source",), role="eval"),
    "predict --input": lambda path: __import__("toolkit.inference", fromlist=["x"])._read_structured(
        path, ["source"], (), SimpleNamespace(json_field="data")),
}


@pytest.mark.parametrize("reader", list(MIXED_READERS))
@pytest.mark.parametrize("case", list(MIXED_DOCUMENTS))
def test_a_json_document_mixing_types_inside_a_field_names_the_record(tmp_path: Path, reader: str, case: str) -> None:
    records, said = MIXED_DOCUMENTS[case]
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"data": records}, indent=1))
    with pytest.raises(UserError) as info:
        MIXED_READERS[reader](path)
    assert re.match(rf"{re.escape(str(path))}:\d+: {re.escape(said)}", str(info.value)), str(info.value)
    assert "could not be read" not in str(info.value)
    listed = tmp_path / "l.json"  # the records as a JSON list read, as JSONL does: no cost where the file reads
    listed.write_text(json.dumps(records))
    assert len(readers.read(listed, "json")) == len(records)


# Texts pyarrow's JSON reader (datasets' json builder) reads as timestamps where a field holds
# nothing else, and pandas' (a {"data": [...]} document) in a field named `date`, `*_at`, ...:
# four texts, two timestamps once read so (the first two; the last two, one instant in two zones)
DATES = ["2020-01-01", "2020-01-01 00:00:00", "2021-03-04T10:00:00+02:00", "2021-03-04T08:00:00Z"]


def _dated_classification(column: str) -> Callable[[Path], list]:
    def read(path: Path) -> list:
        from toolkit.tasks import TASKS

        rows = [{"text": d if column == "text" else f"text {i}", "label": d if column == "label" else "ab"[i % 2]}
                for i, d in enumerate(DATES)]
        task = TASKS.get("text_classification")(train_file=str(_write_records(path, rows)), eval_file=str(path),
                                                text_columns=["text"], label_column="label")
        loaded = task.load()["train"]
        return loaded["text"] if column == "text" else [task.label_names[i] for i in loaded["label"]]
    return read


def _dated_records(layout: str) -> Callable[[Path], list]:
    def read(path: Path) -> list:
        from toolkit.tasks._generation import read_records

        rows = [{"date": d, "summary": f"summary {i}"} for i, d in enumerate(DATES)]
        if layout == "data":  # pandas reads dates of one zone only: the first two, one timestamp
            path = path.with_suffix(".json")
            path.write_text(json.dumps({"data": rows[:2] * 2}))
        else:
            _write_records(path, rows)
        return read_records(path, ("date", "summary"))["date"]
    return read


def _dated_ner(path: Path) -> list:
    from toolkit.tasks.ner import read_jsonl

    _write_records(path, [{"tokens": [d, d], "ner_tags": ["B-DATE", "I-DATE"]} for d in DATES])
    return [words[0] for words in read_jsonl(path).tokens]


def _dated_squad(path: Path) -> list:
    from toolkit.tasks.squad import read_squad

    _write_records(path, [{"id": f"q{i}", "question": "When?", "context": f"On {d}.",
                           "answers": {"text": [d], "answer_start": [3]}} for i, d in enumerate(DATES)])
    return [r["answers"]["text"][0] for r in read_squad(str(path))]


def _dated_pretraining(path: Path) -> list:
    from toolkit.tasks._text import _read_files

    _write_records(path, [{"text": d} for d in DATES])
    ds, _ = _read_files({"train": str(path)}, "records", "line", None, SimpleNamespace(note=lambda *a: None))
    return ds["train"]["text"]


def _dated_predict(path: Path) -> list:
    from toolkit.inference import read_inputs

    _write_records(path, [{"id": d, "text": f"text {i}"} for i, d in enumerate(DATES)])
    return [r["id"] for r in read_inputs(str(path), ["text"])]


DATED_READERS = {  # reader -> read back the texts of DATES it was given in one field of every record
    "classification text": _dated_classification("text"),
    "classification label": _dated_classification("label"),
    "summarization records": _dated_records("records"),
    "summarization json {data}, a field named date": _dated_records("data"),
    "ner tokens": _dated_ner,
    "squad answers": _dated_squad,
    "pretraining jsonl": _dated_pretraining,
    "predict ids": _dated_predict,
}


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
@pytest.mark.parametrize("reader", sorted(DATED_READERS))
def test_a_field_of_dates_is_read_as_written(tmp_path: Path, reader: str, suffix: str) -> None:
    """Finding: a JSON(L) field whose every value is an ISO 8601 date or time reached the table as
    timestamps (pyarrow's JSON reader infers them; pandas' does for a field named `date`): labels
    "2021-03-04T08:00:00Z" were the class "2021-03-04 08:00:00", "2020-01-01" and "2020-01-01
    00:00:00" (and one instant in two zones) one class, exit 0; a text, a word or a SQuAD answer
    of dates was refused as "a number, expected text"; a predict id came out re-written. Every
    reader keeps each value as the file writes it."""
    got = DATED_READERS[reader](tmp_path / f"d{suffix}")
    written = DATES[:2] * 2 if reader.endswith("named date") else DATES
    assert sorted(got) == sorted(written) and all(isinstance(value, str) for value in got), got


SMALL = [1e-12, 3e-12, 2e-12, 3.4567e-8, 0.12345678901234, 9.876543210987654e16]  # past pandas' ujson's 10 decimals


@pytest.mark.parametrize("reader, layout", [(r, layout) for r in ("read", "regression", "classification")
                                             for layout in ("jsonl", "json list", "json {data}")
                                             if r == "read" or layout != "json {data}"])  # a list of records
def test_a_json_number_is_read_as_written(tmp_path: Path, reader: str, layout: str) -> None:
    """Finding: datasets' json builder writes a JSON document's records again with pandas' ujson,
    which keeps 10 decimals: regression targets 1e-12, 3e-12, 2e-12 read from a .json list were
    all 0.0 (a constant target), 3.4567e-8 was 3.46e-8, 9.876543210987654e16 lost 6 digits, and
    classification labels differing past the 10th decimal were one class, exit 0, where JSONL
    read them as written. Every layout reads each number as json.loads does."""
    from toolkit.tasks import TASKS

    rows = [{"text": f"text {i}", "label": value} for i, value in enumerate(SMALL)]
    if reader == "classification":  # two labels that differ past the 10th decimal
        rows = [{"text": f"text {i}", "label": 0.12345678901234 if i % 2 else 0.12345678901111} for i in range(4)]
    path = tmp_path / ("d.jsonl" if layout == "jsonl" else "d.json")
    if layout == "json {data}":
        path.write_text(json.dumps({"data": rows}))
    else:
        _write_records(path, rows)
    written = [row["label"] for row in rows]
    if reader == "read":
        assert readers.read(path, readers.file_format(path), field="data" if "{data}" in layout else None)["label"] == written
        return
    task = TASKS.get("text_classification")(train_file=str(path), eval_file=str(path), text_columns=["text"],
                                            label_column="label", problem=reader if reader == "regression" else "classification")
    labels = task.load()["train"]["label"]
    if reader == "regression":
        assert [float(value) for value in labels] == written
    else:
        assert task.label_names == ["0.12345678901111", "0.12345678901234"] and labels == [0, 1, 0, 1]


@pytest.mark.parametrize("digits", ["123456789012345678901234567", "-9223372036854775809"])
@pytest.mark.parametrize("layout", ["json list", "json {data}"])
def test_a_whole_number_past_the_json_readers_range_is_named_at_its_line(tmp_path: Path, layout: str,
                                                                         digits: str) -> None:
    """Finding: a JSON document holding a whole number past -2^63 .. 2^64 - 1 (an id, a label
    written as a long number) was "could not be read as json (ValueError: Value is too big! at
    position 25)" from datasets' ujson, naming no line; said at its line, with the fix."""
    rows = "[\n" + '{"text": "a", "label": 1},\n' + f'{{"text": "b", "label": {digits}}}\n]'
    path = tmp_path / "d.json"
    path.write_text('{"data": ' + rows + "}" if "{data}" in layout else rows)
    with pytest.raises(UserError, match=rf"^{re.escape(str(path))}:3: a whole number of {len(digits.lstrip('-'))} "
                                        rf"digits \({re.escape(digits[:24])}.*write it as a string"):
        readers.read(path, "json", field="data" if "{data}" in layout else None)


@pytest.mark.parametrize("layout, number", [(layout, n) for layout in ("jsonl", "json list", "json {data}")
                                            for n in ("1e400", "-2.5E+309")  # JSONL's -2.5E+309 pyarrow reads
                                            if (layout, n) != ("jsonl", "-2.5E+309")])  # as -inf: the label check's
def test_a_number_past_a_double_is_named_at_its_line(tmp_path: Path, layout: str, number: str) -> None:
    """Finding: a JSON number no double holds (`1e400`) was "could not be read as jsonl
    (ValueError: Trailing data at position 33)" in JSON lines, no line named, and in a JSON
    document "label column 'label' is Infinity, which JSON has no number for", a word the file
    does not hold. Both say the number, at its line."""
    rows = ['{"text": "a", "label": 1.5}', f'{{"text": "b", "label": {number}}}']
    path = tmp_path / ("d.jsonl" if layout == "jsonl" else "d.json")
    line = 2 if layout == "jsonl" else 3
    text = "\n".join(rows) + "\n" if layout == "jsonl" else "[\n" + ",\n".join(rows) + "\n]"
    path.write_text('{"data": ' + text + "}" if "{data}" in layout else text)
    with pytest.raises(UserError, match=rf"^{re.escape(str(path))}:{line}: the number {re.escape(number)} is past what "
                                        "a double holds"):
        readers.read(path, readers.file_format(path), field="data" if "{data}" in layout else None)
