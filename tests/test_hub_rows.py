"""Every task's Hub path checks the rows it reads as a file's are (tasks.hub_dataset's `rows`):
a fault is one line naming split, record and field, exit 2; a layout the task reads (a ClassLabel
column, translation's {lang: text} objects) is read right."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import write_recipe
from toolkit.errors import UserError


def _rows(task: str) -> list[dict]:
    """Eight good rows of each task's Hub layout."""
    if task == "squad":
        return [{"id": f"q{i}", "title": "t", "context": f"the answer is good {i}.", "question": f"what is {i}?",
                 "answers": {"text": ["good"], "answer_start": [14]}} for i in range(8)]
    if task == "summarization":
        return [{"id": str(i), "document": f"a long document {i} of words", "summary": f"summary {i}"} for i in range(8)]
    if task == "translation":
        return [{"translation": {"de": f"ein Satz {i}", "en": f"a sentence {i}"}} for i in range(8)]
    if task == "glue":
        return [{"sentence": f"sentence {i} is good", "label": i % 2, "idx": i} for i in range(8)]
    return [{"text": f"sentence {i} is good", "label": i % 2} for i in range(8)]


def _fake_hub(monkeypatch: pytest.MonkeyPatch, root: Path, splits: dict[str, list[dict]],
              features: object = None) -> None:
    """`datasets.load_dataset(<hub id>, ...)` gives `splits`, each written to a JSON Lines file
    under `root` and read by datasets' json builder (as a Hub data set of JSON files is read; no
    network)."""
    import datasets

    real = datasets.load_dataset
    root.mkdir(parents=True, exist_ok=True)
    files = {}
    for part, records in splits.items():
        files[part] = str(root / f"{part}.jsonl")
        Path(files[part]).write_text("".join(json.dumps(r) + "\n" for r in records))

    def load(path, name=None, split=None, **kwargs):
        if Path(str(path)).exists() or path in ("json", "csv", "text", "parquet"):
            return real(path, name, split=split, **kwargs)
        # each split read alone: read together, the first split's types are cast onto the next
        # one's (a text column of lists became their JSON text, its texts quoted)
        made = datasets.DatasetDict({part: real("json", data_files={part: file}, split=part, features=features,
                                                cache_dir=str(root / "cache" / part)) for part, file in files.items()})
        return made[split] if split is not None else made

    monkeypatch.setattr(datasets, "load_dataset", load)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")


# task, its settings (a recipe's task: block), the Hub id, a bad record 2 (index 1), the fault's words
CASES = [
    ("text_classification", {"dataset": "org/reviews"}, "org/reviews", {"text": ["a", "list"]},
     "column 'text' is a list, expected text"),
    ("clm", {"dataset": "org/wiki"}, "org/wiki", {"text": ["a", "list", "of", "words"]},
     "'text' is a list, expected text"),
    ("mlm", {"dataset": "org/wiki"}, "org/wiki", {"text": None}, "'text' is missing; every record needs it"),
    ("glue", {"subset": "cola"}, "nyu-mll/glue", {"sentence": None}, "'sentence' is missing; every record needs it"),
    ("glue", {"subset": "cola"}, "nyu-mll/glue", {"label": 2},
     "'label' is 2, expected a class id 0 to 1 (unacceptable, acceptable)"),
    ("squad", {"version": "v1"}, "rajpurkar/squad", {"answers": {"text": ["good"], "answer_start": [3]}},
     "question q1: answer 'good' at answer_start 3 does not match the context there (' ans'); the context holds "
     "it at answer_start 14: fix answer_start"),
    ("squad", {"version": "v1"}, "rajpurkar/squad", {"question": None},
     "question q1: 'question' (the question) is missing"),
    ("summarization", {"subset": "xsum"}, "EdinburghNLP/xsum", {"summary": None},
     "'summary' is missing; every record needs it"),
    ("summarization", {"subset": "xsum"}, "EdinburghNLP/xsum", {"document": ["a", "list"]},
     "'document' is a list, expected text"),
    ("translation", {"subset": "wmt16", "source_lang": "de", "target_lang": "en"}, "wmt/wmt16",
     {"translation": {"de": "ein Satz", "en": None}}, "'translation.en' is missing; every record needs it"),
]


def _settings(task: str, settings: dict, tmp_path: Path) -> dict:
    return {**settings, "data_dir": str(tmp_path / "no-local-copy")} if task == "glue" else settings


@pytest.mark.parametrize("split", ["train", "validation"])
@pytest.mark.parametrize("task,settings,hub_id,bad,words", CASES,
                         ids=[f"{c[0]}-{'-'.join(c[3])}" for c in CASES])
def test_a_hub_split_is_checked_as_a_file_is(task: str, settings: dict, hub_id: str, bad: dict, words: str,
                                             split: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding: only text_classification checked a Hub split's rows: a pretraining text of word
    lists, a null text, summary or translation, a GLUE label out of range or an answer that does
    not match its context were trained and scored as their Python text ("None", "['a', 'list']")
    or at the wrong place, exit 0. Now one line naming `<hub id>[<split>]: record N` and the
    field, at load (every entry point), for the train and the eval split."""
    from toolkit.tasks import TASKS

    good = _rows(task)
    broken = [dict(r) for r in good]
    broken[1].update(bad)
    _fake_hub(monkeypatch, tmp_path / "bad", {"train": broken if split == "train" else good,
                            "validation": broken if split == "validation" else good})
    if task == "glue":
        settings = _settings(task, settings, tmp_path)
    with pytest.raises(UserError) as info:
        made = TASKS.get(task)(**settings)
        made.load()
    # GLUE's validation is the train split's carve where train is absent: here both are read
    assert str(info.value) == f"{hub_id}[{split}]: record 2: {words}"
    _fake_hub(monkeypatch, tmp_path / "good", {"train": good, "validation": good})  # the same rows, right: read
    TASKS.get(task)(**settings).load()


@pytest.mark.parametrize("task,settings,hub_id,bad,words", [CASES[1], CASES[7], CASES[9]],
                         ids=["clm", "summarization", "translation"])
def test_a_bad_hub_row_is_one_line_from_run_and_the_api(task: str, settings: dict, hub_id: str, bad: dict,
                                                        words: str, tmp_path: Path, cli, tiny_checkpoint,
                                                        capsys: pytest.CaptureFixture,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The same fault from `toolkit run` (exit 2, one line, no run folder left behind) and
    toolkit.run (a UserError)."""
    import toolkit

    good = _rows(task)
    broken = [dict(r) for r in good]
    broken[1].update(bad)
    _fake_hub(monkeypatch, tmp_path / "bad", {"train": broken, "validation": good})
    family = "gpt2" if task == "clm" else "t5"
    block = ", ".join(f"{k}: {v}" for k, v in {"name": task, **settings}.items())
    recipe = write_recipe(tmp_path / "r.yaml", f"""model: {{checkpoint: {tiny_checkpoint(family)}}}
task: {{{block}}}
method: {{name: full}}
train: {{max_steps: 1, batch_size: 2}}
""")
    expected = f"{hub_id}[train]: record 2: {words}"
    capsys.readouterr()  # the tiny checkpoint's making, not the run's
    code, _, err = cli("run", recipe, "--runs-dir", tmp_path / "runs")
    assert code == 2 and err == f"error: {expected}\n", err
    assert not list((tmp_path / "runs").rglob("metrics.json"))
    with pytest.raises(UserError, match=expected.replace("[", r"\[").replace("]", r"\]")):
        toolkit.run(recipe, runs_dir=tmp_path / "runs")


def test_a_glue_hub_label_of_other_class_names_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Hub's ClassLabel ids are read as the task's labels in its order; a ClassLabel naming
    other classes, or the same in another order, scored every example against another class
    (exit 0). The Hub's own order is read as is."""
    import datasets

    from toolkit.tasks import TASKS

    def features(names: list[str]) -> datasets.Features:
        return datasets.Features({"sentence": datasets.Value("string"), "label": datasets.ClassLabel(names=names),
                                  "idx": datasets.Value("int32")})

    rows = _rows("glue")
    _fake_hub(monkeypatch, tmp_path / "other", {"train": rows, "validation": rows},
              features(["acceptable", "unacceptable"]))
    with pytest.raises(UserError) as info:
        TASKS.get("glue")(subset="cola", data_dir=str(tmp_path)).load()
    assert str(info.value) == ("nyu-mll/glue[train]: 'label' names the classes acceptable, unacceptable in that "
                               "order; GLUE cola reads ids as unacceptable, acceptable")
    _fake_hub(monkeypatch, tmp_path / "hub", {"train": rows, "validation": rows},
              features(["unacceptable", "acceptable"]))
    data = TASKS.get("glue")(subset="cola", data_dir=str(tmp_path)).load()
    assert data["eval"][""]["label"] == [r["label"] for r in rows]


def test_hub_rows_read_as_before(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The layouts the tasks read come through checked and unchanged: translation's objects as
    source/target, squad's answers and titles, summarization's ids."""
    from toolkit.tasks import TASKS

    _fake_hub(monkeypatch, tmp_path / "translation", {"train": _rows("translation"), "validation": _rows("translation")})
    data = TASKS.get("translation")(subset="wmt16", source_lang="de", target_lang="en").load()
    assert data["eval"][""][1] == {"source": "ein Satz 1", "target": "a sentence 1", "id": "1"}
    _fake_hub(monkeypatch, tmp_path / "squad", {"train": _rows("squad"), "validation": _rows("squad")})
    row = TASKS.get("squad")(version="v1").load()["eval"][""][2]
    assert (row["id"], row["title"], row["answers"]) == ("q2", "t", {"text": ["good"], "answer_start": [14]})
    _fake_hub(monkeypatch, tmp_path / "summarization", {"train": _rows("summarization"), "validation": _rows("summarization")})
    row = TASKS.get("summarization")(subset="xsum").load()["eval"][""][3]
    assert row == {"source": "a long document 3 of words", "target": "summary 3", "id": "3"}


@pytest.mark.parametrize("task,kwargs,blank", [
    ("summarization", {"subset": "xsum"}, {"document": "  "}),
    ("translation", {"subset": "wmt16", "source_lang": "de", "target_lang": "en"},
     {"translation": {"de": "ein Satz", "en": ""}}),
])
def test_a_hub_presets_blank_pairs_are_skipped_and_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        task: str, kwargs: dict, blank: dict) -> None:
    """A Hub preset's pair with a blank side (xsum holds articles with no text) is skipped as the
    example scripts skip it, and said once with its count and first record: the data set is not
    the user's to fix, where a file's blank text is one error line."""
    from toolkit.tasks import TASKS

    rows = _rows(task)
    rows[2] = {**rows[2], **blank}
    _fake_hub(monkeypatch, tmp_path / task, {"train": rows, "validation": _rows(task)})
    made = TASKS.get(task)(**kwargs)
    data = made.load()
    assert len(data["train"]) == len(rows) - 1 and len(data["eval"][""]) == len(rows)
    assert "2" not in data["train"]["id"]
    (line,) = made._notes.values()
    assert "1 of 8 records have a blank" in line and "(first: record 3)" in line and "[train]" in line


def test_toolkit_eval_of_a_hub_run_reads_its_splits_checked(tmp_path: Path, cli, tiny_checkpoint,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """`toolkit eval --split train` of a Hub run reads the splits through the same checked load:
    the run's rows score; the split holding a bad record since (another revision) is one line."""
    good = _rows("clm")
    _fake_hub(monkeypatch, tmp_path / "hub", {"train": good, "validation": good[:4]})
    recipe = write_recipe(tmp_path / "r.yaml", f"""model: {{checkpoint: {tiny_checkpoint("gpt2")}}}
task: {{name: clm, dataset: org/wiki, max_length: 16}}
method: {{name: full}}
train: {{max_steps: 1, batch_size: 2}}
""")
    code, out, err = cli("run", recipe, "--runs-dir", tmp_path / "runs")
    assert code == 0, out + err
    run = Path(out.strip().splitlines()[-1].split(":")[0])
    code, out, err = cli("eval", run, "--split", "train")
    assert code == 0 and (run / "eval-train.json").is_file(), out + err
    broken = [dict(r) for r in good]
    broken[1]["text"] = None
    _fake_hub(monkeypatch, tmp_path / "later", {"train": broken, "validation": good[:4]})
    code, _, err = cli("eval", run, "--split", "train")
    assert code == 2 and err == "error: org/wiki[train]: record 2: 'text' is missing; every record needs it\n", err
