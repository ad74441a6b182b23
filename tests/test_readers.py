"""Issue 37 rule 6: readers read text as written. Every reader (each format `readers.read` takes,
predict's plain-text lines from a file and from standard input, NER's line reader, GLUE's TSVs) refuses a
binary file, a file of NUL bytes, bytes that are not UTF-8 and a file without line breaks up
front, in bounded memory and in one line; plain text splits at \\n and \\r\\n only."""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Callable

import pytest

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
    "ner lines": (".txt", lambda path, monkeypatch: readers.scan(path)),  # NER scans, then reads lines
    "glue tsv": (".tsv", lambda path, monkeypatch: _glue_tsv(path)),
}


def _glue_tsv(path: Path) -> dict:
    from toolkit.tasks.glue import SPECS, read_tsv

    return read_tsv(path, SPECS["sst2"])
BAD = {  # name -> (bytes, what the one line says)
    "nul bytes": (b"\x00" * 4096, r":1: holds a NUL byte"),
    "binary": (b"text,label\n\x89PNG\r\n\x1a\n\x00\x00", r":2: (holds a NUL byte|not UTF-8 text)"),
    "latin-1": ("text,label\ncaf\xe9,1\n".encode("latin-1"), r":2: not UTF-8 text \(byte 0xe9\)"),
    "no line break": (b"a" * (3 << 20), r":1: no line break within 1 MiB"),
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
    assert readers.read_lines(str(path)) == (expected, str(path))
    _stdin(monkeypatch, path)
    assert readers.read_lines("-") == (expected, "<stdin>")


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
