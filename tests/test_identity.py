"""Rule 1 (docs/reliability.md): a run's identity covers every file its task reads.

Walks every registered task: each has rows of settings over small files written here, the files
its `load` opens are recorded (Python's audit hook sees every `open`, whoever calls it: the
shared reader, datasets' builders, pandas, gzip), and a file opened but not in `data_files()` fails.
Then every declared file is edited in place and the run id must change: an edited file is a new
run, never "finished already" with the old metrics.
"""

from __future__ import annotations

import gzip
import json
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Iterator

import pytest

_OPENED: list[str] | None = None  # paths opened while recording
_HOOKED = False


def _audit(event: str, args: tuple) -> None:
    if _OPENED is not None and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        _OPENED.append(os.fsdecode(args[0]))


@contextmanager
def recording() -> Iterator[list[str]]:
    """Every path `open`ed (builtins, io, os, gzip, pandas, datasets) inside the block."""
    global _OPENED, _HOOKED
    if not _HOOKED:  # an audit hook cannot be removed: one for the session, idle outside the block
        sys.addaudithook(_audit)
        _HOOKED = True
    _OPENED = opened = []
    try:
        yield opened
    finally:
        _OPENED = None


def undeclared(task: Any, root: Path) -> tuple[set[Path], set[Path]]:
    """(files under `root` that `task.load()` opened, those of them not in `task.data_files()`)."""
    declared = {Path(p).resolve() for p in task.data_files()}
    with recording() as opened:
        task.load()
    root = root.resolve()
    read = {Path(p).resolve() for p in opened if Path(p).is_file()}
    read = {p for p in read if root in p.parents}
    return read, read - declared


# --- small files of each format ------------------------------------------------------------------
SENTENCES = [f"sentence number {i} is {'good' if i % 2 else 'bad'} ." for i in range(12)]


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def _jsonl(path: Path, rows: list[dict]) -> Path:
    return _write(path, "".join(json.dumps(r) + "\n" for r in rows))


def _glue(root: Path) -> dict:
    for name in ("train.tsv", "dev.tsv"):
        _write(root / "glue/SST-2" / name, "sentence\tlabel\n" + "".join(f"{s}\t{i % 2}\n" for i, s in enumerate(SENTENCES)))
    return {"subset": "sst2", "data_dir": str(root)}


def _classification(root: Path) -> dict:
    _write(root / "train.csv", "sentence,kind\n" + "".join(f"{s},{'ab'[i % 2]}\n" for i, s in enumerate(SENTENCES)))
    _jsonl(root / "dev.jsonl", [{"sentence": s, "kind": "ab"[i % 2]} for i, s in enumerate(SENTENCES)])
    _write(root / "test.tsv", "sentence\n" + "".join(f"{s}\n" for s in SENTENCES))
    return {"train_file": str(root / "train.csv"), "eval_file": str(root / "dev.jsonl"),
            "test_file": str(root / "test.tsv"), "label_column": "kind"}


def _conll(root: Path) -> dict:
    text = "".join(f"EU B-ORG\nrejects O\n{w} B-MISC\n\n" for w in ("German", "British", "French"))
    return {"train_file": str(_write(root / "train.txt", text)), "eval_file": str(_write(root / "valid.txt", text))}


def _squad_file(path: Path) -> Path:
    context = "The cat sat on the mat in Paris."
    qas = [{"id": f"q{i}", "question": "Where did the cat sit?",
            "answers": [{"text": "the mat", "answer_start": context.index("the mat")}]} for i in range(3)]
    return _write(path, json.dumps({"data": [{"title": "t", "paragraphs": [{"context": context, "qas": qas}]}]}))


def _squad(root: Path) -> dict:
    return {"train_file": str(_squad_file(root / "train.json")), "eval_file": str(_squad_file(root / "dev.json"))}


def _summaries_preset(root: Path) -> dict:
    rows = [{"id": str(i), "dialogue": f"A: {s}\nB: ok", "summary": s} for i, s in enumerate(SENTENCES)]
    for name in ("validation.json", "test.json"):
        _write(root / "summarization/samsum" / name, json.dumps(rows))
    return {"subset": "samsum", "data_dir": str(root)}


def _summaries_own(root: Path) -> dict:
    rows = [{"transcript": f"A: {s}\nB: ok", "notes": s} for s in SENTENCES]
    return {"subset": "custom", "train_file": str(_jsonl(root / "train.jsonl", rows)),
            "eval_file": str(_write(root / "dev.csv", "transcript,notes\n" + "".join(f"\"{r['transcript']}\",{r['notes']}\n" for r in rows))),
            "source_field": "transcript", "target_field": "notes"}


def _translations_preset(root: Path) -> dict:
    for lang in ("en", "de"):
        for name in ("train", "test_2016_flickr"):
            _write(root / f"translation/multi30k/{name}.{lang}.gz", "".join(f"{lang} {s}\n" for s in SENTENCES))
    return {"subset": "multi30k", "data_dir": str(root)}


def _translations_parallel(root: Path) -> dict:
    for lang in ("en", "fr"):
        for name in ("train", "dev"):
            _write(root / f"{name}.{lang}", "".join(f"{lang} {s}\n" for s in SENTENCES))
    return {"subset": "custom", "source_lang": "en", "target_lang": "fr",
            "train_file": str(root / "train.{lang}"), "eval_file": str(root / "dev.{lang}")}


def _translations_records(root: Path) -> dict:
    rows = [{"en": s, "de": f"de {s}"} for s in SENTENCES]
    return {"subset": "custom", "train_file": str(_jsonl(root / "train.jsonl", rows)),
            "eval_file": str(_jsonl(root / "dev.jsonl", rows))}


def _text(root: Path) -> dict:
    return {"train_file": str(_write(root / "train.txt", "\n".join(SENTENCES) + "\n")),
            "eval_file": str(_write(root / "eval.txt.gz", "\n".join(SENTENCES) + "\n"))}


def _text_jsonl(root: Path) -> dict:
    return {"train_file": str(_jsonl(root / "train.jsonl", [{"body": s} for s in SENTENCES])), "text_field": "body"}


@dataclass(frozen=True)
class Case:
    task: str
    data: Callable[[Path], dict]
    settings: tuple = ()

    def __str__(self) -> str:
        return f"{self.task}-{self.data.__name__.strip('_')}"


CASES = [Case("glue", _glue), Case("text_classification", _classification), Case("ner", _conll),
         Case("squad", _squad), Case("summarization", _summaries_preset), Case("summarization", _summaries_own),
         Case("translation", _translations_preset), Case("translation", _translations_parallel),
         Case("translation", _translations_records)]
CASES += [Case(name, data) for name in ("mlm", "clm", "denoise", "span_corruption") for data in (_text, _text_jsonl)]


def build(case: Case, root: Path) -> Any:
    from toolkit.tasks import TASKS

    return TASKS.get(case.task)(**case.data(root), **dict(case.settings))


def test_every_registered_task_has_a_row() -> None:
    from toolkit.tasks import TASKS

    assert sorted(set(TASKS.names()) - {c.task for c in CASES}) == []


@pytest.mark.parametrize("case", CASES, ids=str)
def test_every_file_a_task_reads_is_in_its_identity(case: Case, tmp_path: Path) -> None:
    task = build(case, tmp_path)
    read, missing = undeclared(task, tmp_path)
    assert read, "the task read none of its files"
    assert missing == set(), f"{case.task} reads files its data_files() does not declare"


@pytest.mark.parametrize("case", CASES, ids=str)
def test_editing_any_data_file_changes_the_run_id(case: Case, tmp_path: Path) -> None:
    from toolkit import runs

    task = build(case, tmp_path)
    recipe = SimpleNamespace(hash="same recipe", task=task)
    files = task.data_files()
    assert files
    seen = {runs.run_id(recipe, processes=1)}
    for path in files:
        path.write_bytes(path.read_bytes() + b"\n")  # one more byte, in place, as an editor saves
        seen.add(runs.run_id(recipe, processes=1))
    assert len(seen) == len(files) + 1


def test_the_check_finds_a_file_read_but_not_declared(tmp_path: Path) -> None:
    """The rule's test can fail: a task that also reads a file it does not declare is caught."""
    from toolkit.tasks import TASKS

    extra = _write(tmp_path / "stopwords.txt", "the\na\n")

    class Sneaky(TASKS.get("text_classification")):
        def load(self) -> dict:
            extra.read_text()
            return super().load()

    task = Sneaky(**_classification(tmp_path))
    assert undeclared(task, tmp_path)[1] == {extra.resolve()}
