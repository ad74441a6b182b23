"""Rule 8 (docs/reliability.md): say what is cut, and what may be misread.

Every registered task has a row: a task that truncates is given rows of which a known number run
past its limits and must count them in one `warning:` line per kind (sources, targets, texts,
sentences), summed over the splits and said once per run; a task that cuts nothing (pretraining
packs documents into blocks, extractive QA reads the context in overlapping windows) must say
nothing. Labels differing only in case and field names with a space at an end get a line too.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from conftest import shared_tokenizer
from toolkit.errors import UserError

LONG = " ".join(f"word{i}" for i in range(60))  # far beyond every limit below
SHORT = "a few words"
N = 9  # rows per split; rows 0, 3, 6 are long
LONG_ROWS = (0, 3, 6)


def text(i: int) -> str:
    return LONG if i in LONG_ROWS else SHORT


def tokenizer(family: str):
    return shared_tokenizer(Path(os.environ["TOOLKIT_TOKENIZERS"]) / family)


def _write(path: Path, content: str) -> str:
    path.write_text(content)
    return str(path)


def _glue(tmp: Path) -> dict:
    (tmp / "glue/SST-2").mkdir(parents=True)
    for name in ("train.tsv", "dev.tsv"):
        _write(tmp / "glue/SST-2" / name, "sentence\tlabel\n" + "".join(f"{text(i)}\t{i % 2}\n" for i in range(N)))
    return {"subset": "sst2", "data_dir": str(tmp), "max_length": 16}


def _classification(tmp: Path) -> dict:
    path = _write(tmp / "d.csv", "text,label\n" + "".join(f"{text(i)},{i % 2}\n" for i in range(N)))
    return {"train_file": path, "eval_file": path, "max_length": 16}


def _ner(tmp: Path) -> dict:
    sentence = lambda i: "".join(f"{w} O\n" for w in text(i).split()) + "\n"
    path = _write(tmp / "d.txt", "".join(sentence(i) for i in range(N)))
    return {"train_file": path, "eval_file": path, "max_length": 16}


def _pairs(tmp: Path) -> str:
    # sources long in rows 0, 3, 6; targets long in rows 0 and 1
    rows = [{"source": text(i), "target": LONG if i < 2 else SHORT} for i in range(N)]
    return _write(tmp / "d.jsonl", "".join(json.dumps(r) + "\n" for r in rows))


def _summarization(tmp: Path) -> dict:
    path = _pairs(tmp)
    return {"subset": "custom", "train_file": path, "eval_file": path, "max_length": 16, "max_target_length": 8}


def _translation(tmp: Path) -> dict:
    return {**_summarization(tmp), "source_field": "source", "target_field": "target"}


def _squad(tmp: Path) -> dict:
    context = f"{LONG} The cat sat on the mat."
    qas = [{"id": f"q{i}", "question": "Where did the cat sit?",
            "answers": [{"text": "the mat", "answer_start": context.index("the mat")}]} for i in range(N)]
    path = _write(tmp / "d.json", json.dumps({"data": [{"title": "t", "paragraphs": [{"context": context, "qas": qas}]}]}))
    return {"train_file": path, "eval_file": path, "max_length": 32, "doc_stride": 8}


def _documents(tmp: Path) -> dict:
    path = _write(tmp / "d.txt", "".join(text(i) + "\n" for i in range(N)))
    return {"train_file": path, "eval_file": path, "max_length": 16}


@dataclass(frozen=True)
class Row:
    task: str
    data: Callable[[Path], dict]
    family: str  # the tokenizer's folder, and the model family the task is set up for
    cuts: tuple[str, ...] = ()  # the lines expected; () = nothing may be cut

    def __str__(self) -> str:
        return f"{self.task}-{self.family}"


SEQ2SEQ_CUTS = ("6 of 18 {0} cut at task.max_length=16 tokens", "4 of 18 {1} cut at task.max_target_length=8 tokens")
ROWS = [
    Row("glue", _glue, "bert-base-uncased", ("6 of 18 texts cut at task.max_length=16 tokens",)),
    Row("text_classification", _classification, "bert-base-uncased", ("6 of 18 texts cut at task.max_length=16 tokens",)),
    Row("ner", _ner, "bert-base-uncased", ("6 of 18 sentences cut at task.max_length=16 tokens",)),
    Row("summarization", _summarization, "bart-base", tuple(c.format("documents", "summaries") for c in SEQ2SEQ_CUTS)),
    Row("summarization", _summarization, "gpt2", tuple(c.format("documents", "summaries") for c in SEQ2SEQ_CUTS)),
    Row("translation", _translation, "t5",
        tuple(c.format("source sentences", "target sentences") for c in SEQ2SEQ_CUTS)),
    Row("squad", _squad, "gpt2", ("18 of 18 sources cut at task.max_length=32 tokens",)),  # generative
    Row("squad", _squad, "bert-base-uncased"),  # extractive: windows over the whole context
    Row("mlm", _documents, "bert-base-uncased"), Row("clm", _documents, "gpt2"),
    Row("denoise", _documents, "bart-base"), Row("span_corruption", _documents, "t5"),
]
FAMILY = {"bert-base-uncased": "bert", "gpt2": "gpt2", "bart-base": "bart", "t5": "t5"}


def test_every_registered_task_has_a_row() -> None:
    from toolkit.tasks import TASKS

    assert sorted(set(TASKS.names()) - {r.task for r in ROWS}) == []


@pytest.mark.parametrize("row", ROWS, ids=str)
def test_what_is_cut_is_counted_in_one_line_per_kind_once(row: Row, tmp_path: Path, capsys) -> None:
    from toolkit.tasks import TASKS

    task = TASKS.get(row.task)(**row.data(tmp_path))
    task.model_head(FAMILY[row.family])
    raw, tok = task.load(), tokenizer(row.family)
    task.encode(raw["train"], tok)
    for split in raw["eval"].values():
        task.encode(split, tok)
    lines = [line for key, line in task.notices().items() if key.startswith("cut ")]
    assert sorted(line.split(" (")[0] for line in lines) == sorted(row.cuts)
    task.say_notices()
    task.say_notices()  # said already: nothing more
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert said == [f"warning: {line}" for line in task.notices().values()]


def test_labels_differing_only_in_case_are_said(tmp_path: Path) -> None:
    from toolkit.tasks import TASKS

    labels = ["Positive", "positive", "negative", "NEGATIVE ", "neutral"]
    path = _write(tmp_path / "d.csv", "text,label\n" + "".join(f"t{i},{labels[i % 5]}\n" for i in range(10)))
    task = TASKS.get("text_classification")(train_file=path, eval_file=path)
    task.load()
    assert task.label_names == sorted(labels)  # five classes, as written
    assert list(task.notices().values()) == [
        f"{path}: 2 group(s) of labels differ only in case, spaces, Unicode form, invisible characters or how a number is written "
        "('NEGATIVE ' / 'negative'; "
        "'Positive' / 'positive'); each is its own class: write them alike if they are one"]


@pytest.mark.parametrize("name, settings", [
    ("text_classification", {}),
    ("summarization", {"subset": "custom"}),
    ("translation", {"subset": "custom"}),
    ("mlm", {}),
])
def test_a_field_name_with_a_space_at_its_end_is_said_and_quoted(name: str, settings: dict, tmp_path: Path) -> None:
    from toolkit.tasks import TASKS

    header = {"text_classification": "text ,label", "summarization": "source ,target",
              "translation": "en ,de", "mlm": "text "}[name]
    if name == "mlm":  # documents: JSONL, the one field holds the text
        path = _write(tmp_path / "d.jsonl", "".join(json.dumps({"text ": f"{LONG[:30 + i]}"}) + "\n" for i in range(6)))
    else:
        path = _write(tmp_path / "d.csv", header + "\n" + "".join(f"{LONG[:30 + i]},{i % 2}\n" for i in range(6)))
    task = TASKS.get(name)(train_file=path, eval_file=path, **settings)
    task.load()
    spaced = header.split(",")[0]
    assert f"{path}: 1 field name(s) with a space at an end ('{spaced}'); they are read as written" \
        in " ".join(task.notices().values())


def test_a_missing_column_is_named_with_the_spaces_it_has(tmp_path: Path) -> None:
    from toolkit.tasks import TASKS

    path = _write(tmp_path / "d.csv", "text ,label\na,0\nb,1\n")
    task = TASKS.get("text_classification")(train_file=path, eval_file=path, text_columns=["text"])
    with pytest.raises(UserError, match=r"column 'text' is missing \(it has: 'text ', 'label'\)"):
        task.load()


UNREADABLE = "😂🤣😊 😜👍 ok"  # emoji: T5's and BERT's unknown token, bytes to GPT-2 and BART


@pytest.mark.parametrize("row", ROWS, ids=str)
def test_input_text_the_tokenizer_cannot_read_is_said_per_split(row: Row, tmp_path: Path, monkeypatch,
                                                                  capsys) -> None:
    """Finding: an input of characters the tokenizer reads as its unknown token (emoji, CJK or
    `{`, `~` under T5's SentencePiece; emoji under BERT's WordPiece) was trained and scored as a
    row of <unk>, exit 0. Now every task's input text (texts, words, questions and contexts,
    sources, documents) is counted per split, and a split over `tasks.UNREADABLE_SHARE` of such
    characters gets one line naming its file; nothing for a byte-level tokenizer, nothing for
    plain text."""
    import sys

    from toolkit.tasks import TASKS

    (tmp_path / "plain").mkdir()
    raw_plain = TASKS.get(row.task)(**row.data(tmp_path / "plain")).load()
    module = sys.modules[__name__]
    monkeypatch.setattr(module, "text", lambda i: UNREADABLE)
    monkeypatch.setattr(module, "LONG", UNREADABLE)
    settings = row.data(tmp_path)
    task = TASKS.get(row.task)(**settings)
    raw, tok = task.load(), tokenizer(row.family)
    task.note_unreadable_splits(tok, raw_plain)
    assert task.notices() == {}  # plain English: nothing
    task.note_unreadable_splits(tok, raw)
    task.say_notices(run=False)
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    if row.family in ("gpt2", "bart-base"):  # every byte is read
        assert said == []
        return
    where = ([f"task.{s}_file {settings[s + '_file']}" for s in ("train", "eval")] if "train_file" in settings
             else ["the train split", "the eval split"])
    unk = tok.unk_token
    assert [line.split(": ")[1] for line in said] == where, said
    for line in said:
        assert "% of the input text's characters (" in line and f"reads as its unknown token {unk!r} ('" in line, line
        assert "'😂'" in line and "'o'" not in line, line
