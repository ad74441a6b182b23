"""The generic task on a user's own files: every format, string and integer labels, regression,
label names in the saved model, and one clear line for each kind of bad file."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

from conftest import write_recipe
from toolkit.errors import UserError
from toolkit.tasks.text_classification import TextClassification

ROWS = [("a great movie", "pos"), ("boring and far too long", "neg"), ("I loved it", "pos"),
        ("a waste of time", "neg"), ("wonderful acting", "pos"), ("dull", "neg")]


def write(path: Path, rows: list[tuple], fmt: str, cols: tuple[str, str] = ("text", "label")) -> Path:
    """rows in one of the formats users have; .gz compresses whatever the inner format is."""
    inner = fmt.removesuffix(".gz")
    if inner in ("csv", "tsv"):
        sep = "," if inner == "csv" else "\t"
        text = sep.join(cols) + "\n" + "".join(sep.join(f'"{v}"' if inner == "csv" else str(v) for v in r) + "\n"
                                                for r in rows)
    elif inner == "jsonl":
        text = "".join(json.dumps(dict(zip(cols, r))) + "\n" for r in rows)
    else:
        text = json.dumps([dict(zip(cols, r)) for r in rows])
    data = text.encode()
    path.write_bytes(gzip.compress(data) if fmt.endswith(".gz") else data)
    return path


@pytest.mark.parametrize("fmt", ["csv", "tsv", "json", "jsonl", "csv.gz", "jsonl.gz"])
def test_every_format_loads_with_string_labels(tmp_path: Path, fmt: str) -> None:
    train = write(tmp_path / f"train.{fmt}", ROWS, fmt)
    dev = write(tmp_path / f"dev.{fmt}", ROWS[:2], fmt)
    task = TextClassification(train_file=str(train), eval_file=str(dev))
    task.check()
    data = task.load()
    assert task.label_names == ["neg", "pos"]  # sorted names from the data
    assert data["train"]["label"] == [1, 0, 1, 0, 1, 0]
    assert data["eval"][""]["text"] == ["a great movie", "boring and far too long"]
    assert task.head_kwargs()["id2label"] == {0: "neg", 1: "pos"}


def test_integer_labels_sort_numerically_and_given_labels_fix_the_order(tmp_path: Path) -> None:
    rows = [(f"t{i}", i % 11) for i in range(22)]  # 0..10: "10" sorts after "9", not after "1"
    train = write(tmp_path / "t.csv", rows, "csv")
    task = TextClassification(train_file=str(train), eval_file=str(train))
    task.load()
    assert task.label_names == [str(i) for i in range(11)]
    # decimals too: "10.5" sorted before "2.5" as text made 2.5 F1's positive class (id 1) of two labels
    decimals = TextClassification(train_file=str(write(tmp_path / "d.csv", [("a", "10.5"), ("b", "2.5")], "csv")),
                                  eval_file=str(tmp_path / "d.csv"))
    decimals.load()
    assert decimals.label_names == ["2.5", "10.5"]
    given = TextClassification(train_file=str(write(tmp_path / "s.csv", ROWS, "csv")),
                               eval_file=str(tmp_path / "s.csv"), labels=["pos", "neg"])
    assert given.load()["train"]["label"][:2] == [0, 1]


@pytest.mark.parametrize("fmt", ["csv", "tsv"])
def test_cells_are_read_as_written(tmp_path: Path, fmt: str) -> None:
    """Labels 01, 1 and 02 are three labels spelt as written; a text column of numbers is text."""
    rows = [("7", "01"), ("0.50", "1"), ("007", "02"), ("12", "01")]
    train = write(tmp_path / f"t.{fmt}", rows, fmt)
    task = TextClassification(train_file=str(train), eval_file=str(train))
    data = task.load()
    assert task.label_names == ["01", "1", "02"]
    assert data["train"]["label"] == [0, 1, 2, 0]
    assert data["train"]["text"] == ["7", "0.50", "007", "12"]


@pytest.mark.parametrize("header, picked", [
    ("sentence1,sentence2,label,idx", ["sentence1", "sentence2"]), ("idx,sentence,label", ["sentence"]),
    ("text,label,source", ["text"]), ("label,review", ["review"])])
def test_text_columns_come_from_the_header_as_run_glue_reads_them(tmp_path: Path, header: str, picked: list) -> None:
    cells = {"label": ["pos", "neg"], "idx": ["1", "2"], "source": ["web", "web"]}
    rows = [",".join(cells.get(c, [f"{c} one", f"{c} two"])[i] for c in header.split(",")) for i in range(2)]
    train = tmp_path / "t.csv"
    train.write_text(header + "\n" + "\n".join(rows) + "\n")
    task = TextClassification(train_file=str(train), eval_file=str(train))
    data = task.load()
    assert task.text_columns == picked and task.label_names == ["neg", "pos"]
    assert data["train"][picked[0]] == [f"{picked[0]} one", f"{picked[0]} two"]


def test_a_header_naming_a_column_twice_is_one_line(tmp_path: Path) -> None:
    train = tmp_path / "t.csv"
    train.write_text("text,label,label\ngreat,pos,neg\nawful,neg,pos\n")
    with pytest.raises(UserError, match=r"t.csv:1: the header names column 'label' twice \(columns 2 and 3\)"):
        TextClassification(train_file=str(train), eval_file=str(train)).load()


def test_text_pair_and_regression(tmp_path: Path) -> None:
    rows = [("a", "b", "0.5"), ("c", "d", "4.0"), ("e", "f", "2")]
    path = write(tmp_path / "p.jsonl", rows, "jsonl", ("q1", "q2", "score"))  # type: ignore[arg-type]
    task = TextClassification(train_file=str(path), eval_file=str(path), text_columns=["q1", "q2"],
                              label_column="score", problem="regression")
    data = task.load()
    assert data["train"]["label"] == [0.5, 4.0, 2.0] and task.num_labels == 1
    assert [m.name for m in task.declared_metrics()] == ["pearson", "spearmanr"]


@pytest.mark.parametrize("content, fmt, message", [
    (b"", "csv", "the file is empty"),
    (b"text,label\n", "csv", "has a header and no rows"),
    (b"text,label\nfine,pos\nbad \xff byte,neg\n", "csv", ":3: not UTF-8 text"),
    (b"text,label\na,pos\nb,neg,extra\n", "csv", ":3: expected 2 fields"),
    (b'{"text": "a", "label": "pos"}\n{"text": "b", "label"\n', "jsonl", ":2: not valid JSON"),
    (b"review,stars\na,pos\nb,neg\n", "csv", "cannot tell which columns hold the text and which the label "
     "(columns: 'review', 'stars'); set task.text_columns and task.label_column, e.g. task.text_columns=[review]"),
    (b"text,label\na,pos\nb,\n", "csv", ":3: label column 'label' is empty; every row needs a label (one of neg, pos)"),
    (b"text\tlabel\na\tpos\nb\tneg\n", "csv", "column 'label' is missing"),  # a TSV named .csv
])
def test_bad_files_are_one_line_naming_file_and_row(tmp_path: Path, content: bytes, fmt: str, message: str) -> None:
    bad = tmp_path / f"bad.{fmt}"
    bad.write_bytes(content)
    task = TextClassification(train_file=str(bad), eval_file=str(bad), labels=["neg", "pos"])
    with pytest.raises(UserError) as info:
        task.load()
    assert message in str(info.value) and str(bad) in str(info.value)
    assert "\n" not in str(info.value)


def test_label_outside_the_data_is_named_with_its_row(tmp_path: Path) -> None:
    train = write(tmp_path / "train.csv", ROWS, "csv")
    dev = write(tmp_path / "dev.csv", [("x", "pos"), ("y", "meh")], "csv")
    with pytest.raises(UserError, match=r"dev.csv:3: label 'meh' is not one of neg, pos"):
        TextClassification(train_file=str(train), eval_file=str(dev)).load()


@pytest.mark.parametrize("given", [{"text_columns": ["label"], "label_column": "y"}, {"label_column": "y"}])
def test_a_text_column_named_label_is_one_line_given_or_picked(tmp_path: Path, given: dict) -> None:
    """Finding: a text column named `label` (the label in `y`) crashed the load with a traceback
    (a table with two `label` columns): the examples keep their label id under that name. Named
    in the recipe or picked from the header, it is one line."""
    train = write(tmp_path / "train.csv", ROWS, "csv", cols=("label", "y"))
    with pytest.raises(UserError, match=r"^task.text_columns: a text column named 'label'"):
        task = TextClassification(train_file=str(train), eval_file=str(train), **given)
        task.check()
        task.load()


@pytest.mark.parametrize("override, message", [
    ("task.metrics=[pearson]", "task.metrics: 'pearson' is not a classification metric"),
    ("task.metrics=[]", "task.metrics: needs at least 1 item(s)"),  # was the default, accuracy, silently
    ("task.text_columns=[a,b,c]", "task.text_columns: at most two"),
    ("task.eval_file=nope.csv", "task.eval_file: nope.csv does not exist"),
    ("task.eval_file=null", "task.eval_file: required"),
    ("task.label_colum=x", "task.label_colum: unknown key (did you mean 'label_column'?)"),
    ("task.problem=regresion", "task.problem: 'regresion' is not allowed (did you mean 'regression'?)"),
    ("task.text_columns=[label]", "task.text_columns: a text column named 'label' is the name every example's label"),
    # the label read as the text: every class learned from its own name, accuracy 1.0, exit 0
    ("task.text_columns=[text] task.label_column=text", "task.label_column: 'text' is also in task.text_columns"),
    ("task.text_columns=[text,label] task.label_column=label", "task.label_column: 'label' is also in task.text_columns"),
    # a class named "None" / "[1]" / "True" / "", refused only once data loaded (or trained on)
    ("task.labels=[null,pos]", "task.labels: each name is non-empty text or a number, not null (item 1)"),
    ("task.labels=[[1],[2]]", "task.labels: each name is non-empty text or a number, not [1] (item 1)"),
    ("task.labels=[neg,true]", "task.labels: each name is non-empty text or a number, not true (item 2)"),
    ('task.labels=["",pos]', 'task.labels: each name is non-empty text or a number, not "" (item 1)'),
])
def test_recipe_mistakes_are_refused_at_validate(tmp_path: Path, cli, override: str, message: str) -> None:
    train = write(tmp_path / "train.csv", ROWS, "csv")
    recipe = write_recipe(tmp_path / "r.yaml", f"""model: {{checkpoint: bert-base-uncased}}
task: {{name: text_classification, train_file: {train}, eval_file: {train}}}
method: {{name: lora}}
""")
    code, _, err = cli("run", recipe, *override.split(" "), "--runs-dir", tmp_path / "runs")
    assert code == 2 and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "runs").exists()


def test_trained_model_carries_label_names_into_a_pipeline(tmp_path: Path, cli) -> None:
    """A full fine-tuning run on a CSV; transformers' pipeline then prints the data's labels."""
    from transformers import pipeline

    train = write(tmp_path / "train.csv", ROWS * 4, "csv")
    recipe = write_recipe(tmp_path / "r.yaml", f"""model: {{checkpoint: roberta-base}}
task: {{name: text_classification, train_file: {train}, eval_file: {train}, metrics: [accuracy, f1]}}
method: {{name: full}}
train: {{epochs: 2, lr: 1.0e-3, batch_size: 8}}
""")
    code, out, err = cli("run", recipe, "--smoke", "--runs-dir", tmp_path / "runs")
    assert code == 0, err
    (metrics_file,) = (tmp_path / "runs").rglob("metrics.json")
    metrics = json.loads(metrics_file.read_text())
    assert set(metrics["eval"]) == {"accuracy", "f1", "loss"}
    assert metrics["metric_declarations"]["loss"] == {"higher_is_better": False, "scale": 1.0}
    clf = pipeline("text-classification", model=str(metrics_file.parent / "model"))
    assert clf("a great movie")[0]["label"] in {"neg", "pos"}


SPELLED = ["1", "1.0", "0", "00", "+1", "0"]  # two numbers, each written more than one way


@pytest.mark.parametrize("fmt", ["csv", "tsv", "jsonl", "json"])  # JSON: the labels as strings, as written
def test_a_number_written_two_ways_is_two_classes_and_said(tmp_path: Path, fmt: str) -> None:
    """CSV cells and JSON strings are label names as written, so `1`, `1.0` and `+1` are three
    classes: that was silent (a run trained 5 classes for 2, exit 0); it is now said, naming them,
    as labels that differ only in case are."""
    rows = [(f"text {i}", SPELLED[i % 6]) for i in range(12)]
    train = write(tmp_path / f"train.{fmt}", rows, fmt)
    task = TextClassification(train_file=str(train), eval_file=str(train))
    task.load()
    assert task.label_names == ["0", "00", "+1", "1", "1.0"]  # as written: 5 classes, by value
    assert list(task.notices().values()) == [
        f"{train}: 2 group(s) of labels differ only in case, spaces, Unicode form, invisible characters or how a number is written "
        "('+1' / '1' / '1.0'; '0' / '00'); each is its own class: write them alike if they are one"]
    # trained on one way of writing them, an eval file's other way is refused, not mapped to a class
    one_way = write(tmp_path / f"t.{fmt}", [(f"text {i}", str(i % 2)) for i in range(4)], fmt)
    with pytest.raises(UserError, match=r"label '1\.0' is not one of 0, 1$"):
        TextClassification(train_file=str(one_way), eval_file=str(train)).load()


@pytest.mark.parametrize("split", ["train_file", "eval_file"])  # names found in the train file, else the eval file's
@pytest.mark.parametrize("fmt", ["csv", "tsv", "jsonl", "json"])
def test_labels_with_a_space_at_an_end_are_said(tmp_path: Path, fmt: str, split: str) -> None:
    """Finding: a file written with `, ` between its fields (`great movie, 1`) has every label
    with a space at its start: each was a class named so (' 0', ' 1': the model's label names,
    its predictions), with no other spelling beside it for the alike-labels warning, exit 0 and
    no word, where pandas reads ` 1` as 1 and an eval file's `1` was then refused. Said once,
    naming them, from a CSV, TSV or JSON file alike; labels that are alike are said as such
    alone, and labels without spaces are not said."""
    rows = [(f"text {i}", f" {i % 2}") for i in range(6)]
    data = write(tmp_path / f"d.{fmt}", rows, fmt)
    files = {"train_file": None, "eval_file": str(data), split: str(data)}
    task = TextClassification(**files)
    task.load()
    assert task.label_names == [" 0", " 1"]
    assert list(task.notices().values()) == [
        f"{data}: 2 label(s) with a space at an end (' 0', ' 1'); each is a class named as written, spaces included "
        "(a file written with ', ' between its fields?): remove the spaces if they are no part of the names"]
    alike = write(tmp_path / f"a.{fmt}", [*rows, ("text 7", "0")], fmt)
    task = TextClassification(train_file=str(alike), eval_file=str(alike))
    task.load()
    spaced = [n for n in task.notices().values() if "space at an end" in n]  # ' 0' said as alike to '0' alone
    assert len(spaced) == 1 and "1 label(s) with a space at an end (' 1')" in spaced[0]
    plain = write(tmp_path / f"p.{fmt}", [(t, v.strip()) for t, v in rows], fmt)
    task = TextClassification(train_file=str(plain), eval_file=str(plain))
    task.load()
    assert task.notices() == {}


def test_a_number_written_two_ways_is_said_by_a_run(tmp_path: Path, cli, tiny_checkpoint) -> None:
    rows = [(f"text {i}", SPELLED[i % 6]) for i in range(12)]
    train = write(tmp_path / "train.csv", rows, "csv")
    recipe = write_recipe(tmp_path / "r.yaml", f"""model: {{checkpoint: {tiny_checkpoint('bert')}}}
task: {{name: text_classification, train_file: {train}, eval_file: {train}}}
method: {{name: full}}
train: {{epochs: 1, batch_size: 12}}
""")
    code, out, err = cli("run", recipe, "--runs-dir", tmp_path / "runs")
    assert code == 0, err
    assert "differ only in case, spaces, Unicode form, invisible characters or how a number is written ('+1' / '1' / '1.0'; '0' / '00')" in err
    (config,) = (tmp_path / "runs").rglob("model/config.json")
    assert json.loads(config.read_text())["id2label"] == {"0": "0", "1": "00", "2": "+1", "3": "1", "4": "1.0"}


@pytest.mark.parametrize("fmt,blank", [("csv", ""), ("tsv", ""), ("json", ""), ("jsonl.gz", None)])
def test_a_test_file_with_its_label_column_left_blank_is_unlabelled(tmp_path: Path, fmt: str, blank) -> None:
    """Finding: a test file whose label column is there and left blank (as test sets are handed
    out) had each empty label refused, and with it the whole run, train and eval files valid. A
    label column blank in every row of the test file means no labels; one filled in part is
    still refused at the first empty one."""
    train = write(tmp_path / f"train.{fmt}", ROWS, fmt)
    test = write(tmp_path / f"test.{fmt}", [(text, blank) for text, _ in ROWS[:3]], fmt)
    task = TextClassification(train_file=str(train), eval_file=str(train), test_file=str(test))
    loaded = task.load()
    assert loaded["test"].column_names == ["text"] and loaded["test"]["text"] == [t for t, _ in ROWS[:3]]
    part = write(tmp_path / f"part.{fmt}", [(ROWS[0][0], "pos"), (ROWS[1][0], blank)], fmt)
    with pytest.raises(UserError, match="label column 'label' is empty"):
        TextClassification(train_file=str(train), eval_file=str(train), test_file=str(part)).load()


QUESTIONS = ["What came into force?", "Who wrote the play?", "When did the war end?", "Where is the river?",
             "Why did prices rise?", "How many people live there?"]
SENTENCES = ["The new constitution came into force that day.", "The play was first staged in 1603 in London.",
             "The fighting stopped in the spring of 1945.", "The river runs through the old town centre.",
             "Prices rose as the harvest failed for two years.", "About two million people live in the region."]
LONG = [s + " " + s + " " + s + " " + s for s in SENTENCES]


@pytest.mark.parametrize("fmt", ["csv", "tsv", "jsonl"])
def test_a_pair_is_not_read_as_its_named_half(tmp_path: Path, cli, fmt: str) -> None:
    """Finding: a file of QNLI's layout (question, sentence, label) was read as `sentence` alone,
    its question never seen (a pair task trained on half of it, exit 0): the name picked one
    text and the other, as text-like, was dropped with no word. It is one line asking which, at
    load and from the CLI (exit 2, nothing written); columns that are not text-like stay unread."""
    rows = [(q, s, "entailment" if i % 2 else "not_entailment") for i, (q, s) in enumerate(zip(QUESTIONS, SENTENCES))]
    train = write(tmp_path / f"train.{fmt}", rows, fmt, cols=("question", "sentence", "label"))  # type: ignore[arg-type]
    message = (f"{train}: cannot tell whether the text is 'sentence' alone or a pair with 'question', which reads "
               "as text as much as it; set task.text_columns, e.g. task.text_columns=[question, sentence] or "
               "task.text_columns=[sentence]")
    with pytest.raises(UserError) as info:
        TextClassification(train_file=str(train), eval_file=str(train)).load()
    assert str(info.value) == message
    recipe = write_recipe(tmp_path / "r.yaml", f"""model: {{checkpoint: bert-base-uncased}}
task: {{name: text_classification, train_file: {train}, eval_file: {train}}}
method: {{name: lora}}
""")
    code, _, err = cli("run", recipe, "--smoke", "--runs-dir", tmp_path / "runs")
    assert code == 2 and err == f"error: {message}\n"
    assert not list((tmp_path / "runs").rglob("metrics.json"))
    task = TextClassification(train_file=str(train), eval_file=str(train), text_columns=["question", "sentence"])
    assert task.load()["train"]["question"] == QUESTIONS  # named: read as named


@pytest.mark.parametrize("cols, values, picked", [
    (("text", "label", "source"), ["web", "web", "news", "web", "news", "web"], ["text"]),  # few values
    (("sentence", "label", "date"), [f"2024-0{i + 1}-1{i}" for i in range(6)], ["sentence"]),  # far shorter
    (("title", "text", "label"), QUESTIONS, ["text"]),  # a title far shorter than its text
    (("sentence", "label", "year"), [str(1990 + i) for i in range(6)], ["sentence"]),  # numbers
    (("idx", "review", "label"), [str(i) for i in range(6)], ["review"]),  # an id is not text
])
def test_columns_that_are_not_a_second_text_stay_unread(tmp_path: Path, cols: tuple, values: list, picked: list) -> None:
    cells = {"label": ["pos", "neg"] * 3, cols[0 if cols[0] not in ("text", "sentence", "review") else 2]: values}
    text = next(c for c in cols if c not in cells)
    cells[text] = LONG
    rows = [tuple(cells[c][i] for c in cols) for i in range(6)]
    train = write(tmp_path / "t.csv", rows, "csv", cols=cols)  # type: ignore[arg-type]
    task = TextClassification(train_file=str(train), eval_file=str(train))
    task.load()
    assert task.text_columns == picked


def test_json_values_that_are_not_text_are_not_a_second_text(tmp_path: Path) -> None:
    """A record's metadata (an object, a list, a number per row) is never taken for a pair's half."""
    rows = [{"text": LONG[i], "label": ["pos", "neg"][i % 2], "meta": {"summary": SENTENCES[i], "n": i},
             "tags": [f"t{i}", "x"], "n": i * 1.5} for i in range(6)]
    train = tmp_path / "t.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = TextClassification(train_file=str(train), eval_file=str(train))
    task.load()
    assert task.text_columns == ["text"]


@pytest.mark.parametrize("fmt", ["csv", "tsv", "jsonl", "json"])
def test_labels_in_two_unicode_forms_are_said(tmp_path: Path, fmt: str) -> None:
    """Finding: `café` written as one code point and as `e` + a combining accent (two writers, or
    a file from macOS) trained as two classes that print alike, with no word (a 3-class model
    for 2, id2label holding 'café' twice, exit 0). Said as labels differing in case are, escaped."""
    rows = [(f"text {i}", ["caf\u00e9", "cafe\u0301", "tea"][i % 3]) for i in range(6)]
    train = write(tmp_path / f"train.{fmt}", rows, fmt)
    task = TextClassification(train_file=str(train), eval_file=str(train))
    task.load()
    assert len(task.label_names) == 3  # as written: still their own classes
    assert list(task.notices().values()) == [
        f"{train}: 1 group(s) of labels differ only in case, spaces, Unicode form, invisible characters or how a number is written "
        "('cafe\\u0301' / 'caf\\xe9'); each is its own class: write them alike if they are one"]


@pytest.mark.parametrize("fmt", ["csv", "tsv", "jsonl", "json", "joined csv"])
def test_labels_that_differ_by_invisible_characters_are_said(tmp_path: Path, fmt: str) -> None:
    """Finding: a label with a character that shows nothing (the BOM two joined CSV files leave
    at the start of the second one's first row, a zero-width space, a soft hyphen) was a class of
    its own that prints as another: `pos` and BOM+`pos` trained a 3-class model for 2, id2label
    holding 'pos' twice, exit 0, without a word. Said as labels differing in case are, escaped."""
    if fmt == "joined csv":  # cat a.csv b.csv, b saved with a BOM and without its header
        train = tmp_path / "train.csv"
        train.write_bytes(b"label,text\npos,a\nneg,b\n" + "\ufeffpos,c\nneg,d\n".encode())
        shown = "'pos' / '\\ufeffpos'"
    else:
        rows = [(f"text {i}", ["pos", "pos\u200b", "neg", "ne\u00adg"][i % 4]) for i in range(8)]
        train = write(tmp_path / f"train.{fmt}", rows, fmt)
        shown = "'neg' / 'ne\\xadg'; 'pos' / 'pos\\u200b'"
    task = TextClassification(train_file=str(train), eval_file=str(train))
    task.load()
    assert len(task.label_names) == (3 if fmt == "joined csv" else 4)  # as written: still their own classes
    assert list(task.notices().values()) == [
        f"{train}: {1 if fmt == 'joined csv' else 2} group(s) of labels differ only in case, spaces, Unicode form, "
        f"invisible characters or how a number is written ({shown}); each is its own class: write them alike "
        "if they are one"]


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_training_data_of_one_class_is_refused_when_labels_are_given(tmp_path: Path, cli, fmt: str) -> None:
    """Finding: with task.labels given, a training file holding one of them trained a classifier
    that answers that class alone, exit 0 (labels read from the data were refused so already).
    One line, at load and from the CLI (exit 2, nothing written)."""
    train = write(tmp_path / f"train.{fmt}", [r for r in ROWS if r[1] == "pos"], fmt)
    dev = write(tmp_path / f"dev.{fmt}", ROWS, fmt)
    message = (f"{train}: column 'label' has 1 distinct label(s) ('pos') of the 2 named; classification needs "
               "at least 2 in the training data")
    with pytest.raises(UserError) as info:
        TextClassification(train_file=str(train), eval_file=str(dev), labels=["neg", "pos"]).load()
    assert str(info.value) == message
    recipe = write_recipe(tmp_path / "r.yaml", f"""model: {{checkpoint: bert-base-uncased}}
task: {{name: text_classification, train_file: {train}, eval_file: {dev}, labels: [neg, pos]}}
method: {{name: full}}
""")
    code, _, err = cli("run", recipe, "--smoke", "--runs-dir", tmp_path / "runs")
    assert code == 2 and err == f"error: {message}\n"
    assert not list((tmp_path / "runs").rglob("metrics.json"))
    # a training file of two of three named classes is a choice, not refused
    TextClassification(train_file=str(dev), eval_file=str(dev), labels=["neg", "pos", "meh"]).load()


def test_scores_read_as_classes_are_said(tmp_path: Path) -> None:
    """Finding: STS-B's file read with the default task.problem (classification) trained 161
    classes, one per score as written, with no word (exit 0 where the eval split held no score
    training lacked). Labels that are numbers with fractions are said, naming task.problem; whole
    numbers (star ratings) are classes as often as not, and are not."""
    sts = Path(os.environ["TOOLKIT_DATA"]) / "glue" / "STS-B" / "dev.tsv"
    task = TextClassification(train_file=str(sts), eval_file=str(sts))
    task.load()
    assert len(task.label_names) == 161 and task.text_columns == ["sentence1", "sentence2"]
    assert task.notices()["label scores"] == (
        f"{sts}: the 161 labels are numbers, 137 with a fraction (0.083, 0.100, 0.2, ...); each is its own "
        "class (task.problem: classification): set task.problem=regression if they are scores")
    assert "label scores" not in TextClassification(train_file=str(sts), eval_file=str(sts), problem="regression").notices()
    stars = write(tmp_path / "stars.csv", [(f"t{i}", str(1 + i % 5)) for i in range(10)], "csv")
    ratings = TextClassification(train_file=str(stars), eval_file=str(stars))
    ratings.load()
    assert ratings.label_names == ["1", "2", "3", "4", "5"] and "label scores" not in ratings.notices()


@pytest.mark.parametrize("mark", ["NA", "NaN", "null", "None"])
@pytest.mark.parametrize("fmt", ["csv", "tsv", "jsonl"])
def test_a_label_written_as_a_missing_value_is_said(tmp_path: Path, fmt: str, mark: str) -> None:
    """Finding: R's write.csv writes a missing label as NA (pandas' to_json, Python's str(None):
    NaN, null, None); read as written, it was a class of its own, trained on and scored, exit 0,
    where pandas (run_glue) reads such a cell as no label. Said, naming the label and its rows;
    not where task.labels names it."""
    rows = [(f"t{i}", ["pos", "neg", mark][i % 3]) for i in range(9)]
    path = write(tmp_path / f"d.{fmt}", rows, fmt)
    task = TextClassification(train_file=str(path), eval_file=str(path))
    task.load()
    assert mark in task.label_names
    assert task.notices()["label missing"] == (
        f"{path}: 3 row(s) have the label '{mark}', which pandas and R write for a missing value; each is a class "
        "here (cells are read as written): take out rows that have no label")
    named = TextClassification(train_file=str(path), eval_file=str(path), labels=["neg", "pos", mark])
    named.load()
    assert "label missing" not in named.notices()
    plain = write(tmp_path / f"p.{fmt}", [(f"t{i}", ["pos", "neg", "NAN-1"][i % 3]) for i in range(9)], fmt)
    task = TextClassification(train_file=str(plain), eval_file=str(plain))
    task.load()
    assert "label missing" not in task.notices()


def test_a_label_outside_many_is_named_in_a_short_line(tmp_path: Path) -> None:
    """The line naming a label outside the training labels lists 20 of them and the count (161 for
    STS-B's scores read as classes: one line of 1,100 characters)."""
    train = write(tmp_path / "train.csv", [(f"t{i}", str(i)) for i in range(30)], "csv")
    dev = write(tmp_path / "dev.csv", [("x", "0"), ("y", "31")], "csv")
    with pytest.raises(UserError, match=r"dev.csv:3: label '31' is not one of 0, 1, 2, .*, 19, \.\.\. \(30 in all\)$"):
        TextClassification(train_file=str(train), eval_file=str(dev)).load()



def _fake_hub(monkeypatch: pytest.MonkeyPatch, train: dict, validation: dict, features: dict | None = None) -> None:
    """task.dataset served from memory (datasets' own Dataset, its column types inferred as a Hub
    split's are, a list column a Sequence, or given: a ClassLabel), with no network."""
    import datasets

    from toolkit.tasks import text_classification

    typed = datasets.Features(features) if features else None
    splits = datasets.DatasetDict(train=datasets.Dataset.from_dict(train, features=typed),
                                  validation=datasets.Dataset.from_dict(validation, features=typed))
    monkeypatch.setattr(text_classification, "hub_offline", lambda: False)
    monkeypatch.setattr(text_classification, "hub_dataset", lambda task, *args, **kwargs: splits)


@pytest.mark.parametrize("column, values, message", [
    ("label", [[0, 1], [1], [0], []], "label column 'label' is a list, expected text or a number"),  # multi-label
    ("label", [{"id": 0}, {"id": 1}, {"id": 0}, {"id": 1}], "label column 'label' is an object, expected text or a number"),
    ("text", [["a", "great", "movie"], ["dull"], ["so", "good"], ["bad"]], "column 'text' is a list, expected text"),
    ("text", ["a great movie", " ", "so good", "bad"], "column 'text' is empty; every record needs some text"),
])
@pytest.mark.parametrize("split", ["train", "validation"])
def test_a_hub_split_is_checked_as_a_file_is(tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch, column: str,
                                             values: list, message: str, split: str) -> None:
    """Finding: a Hub data set's labels were never checked as a file's are: a multi-label data set
    (a Sequence column of label ids, go_emotions' layout) trained one class per list as Python
    prints it ("[0, 1]", "[1]", "[]": 4 classes), and an object label or a text column of word
    lists (a token-level data set) were read as their Python text, exit 0. Each is one line naming
    the split and the record, at load (every entry point: run, eval, the API) and from the CLI."""
    good = {"text": ["a great movie", "dull", "so good", "bad"], "label": [1, 0, 1, 0]}
    bad = {**good, column: values}
    _fake_hub(monkeypatch, *((bad, good) if split == "train" else (good, bad)))
    record = 1 if column == "label" or isinstance(values[0], list) else 2
    expected = f"org/reviews[{split}]: record {record}: {message}"
    with pytest.raises(UserError) as info:
        TextClassification(dataset="org/reviews").load()
    assert str(info.value) == expected
    if split == "validation" and column == "label" and values[0] == [0, 1]:  # the CLI once: exit 2, nothing left
        recipe = write_recipe(tmp_path / "r.yaml", """model: {checkpoint: bert-base-uncased}
task: {name: text_classification, dataset: org/reviews}
method: {name: full}
""")
        code, _, err = cli("run", recipe, "--smoke", "--runs-dir", tmp_path / "runs")
        assert code == 2 and err == f"error: {expected}\n", err
        assert not list((tmp_path / "runs").rglob("metrics.json"))
    # the same values are fine where the data is right
    _fake_hub(monkeypatch, good, good)
    task = TextClassification(dataset="org/reviews")
    task.load()
    assert task.label_names == ["0", "1"] and "hub test split" not in task.notices()


def test_a_hub_label_of_two_json_types_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Hub split read from JSON files whose label is 1 in one record and "1" in another (datasets
    holds such a column as JSON text) is one line naming the split, as a file's is; the check
    read the split's name as a file to find the line (a FileNotFoundError traceback)."""
    import datasets

    from toolkit.tasks import text_classification

    (tmp_path / "mixed.jsonl").write_text('{"text": "a great movie", "label": 1}\n{"text": "dull", "label": "0"}\n')
    mixed = datasets.load_dataset("json", data_files=str(tmp_path / "mixed.jsonl"), split="train",
                                  cache_dir=str(tmp_path / "cache"))
    monkeypatch.setattr(text_classification, "hub_offline", lambda: False)
    monkeypatch.setattr(text_classification, "hub_dataset",
                        lambda *args, **kwargs: datasets.DatasetDict(train=mixed, validation=mixed))
    with pytest.raises(UserError) as info:
        TextClassification(dataset="org/reviews").load()
    assert str(info.value) == "org/reviews[validation]: label column 'label' holds values of more than one type; one type per field"


def test_a_hub_test_split_scored_in_place_of_a_validation_split_is_said(monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding: a Hub data set without a validation split (imdb, ag_news: train and test) is
    scored on its test split, and the best checkpoint chosen there, with no word (exit 0): the
    number reads as a held-out test score. Said."""
    import datasets

    from toolkit.tasks import text_classification

    rows = datasets.Dataset.from_dict({"text": ["a great movie", "dull", "so good", "bad"], "label": [1, 0, 1, 0]})
    monkeypatch.setattr(text_classification, "hub_offline", lambda: False)
    monkeypatch.setattr(text_classification, "hub_dataset",
                        lambda *args, **kwargs: datasets.DatasetDict(train=rows, test=rows))
    task = TextClassification(dataset="org/imdb")
    task.load()
    assert task.notices()["hub test split"] == (
        "task.dataset: 'org/imdb' has no validation split; its test split is the eval split, on which "
        "train.keep_best chooses the checkpoint (and a sweep its settings): its scores are not held out from those choices")


@pytest.mark.parametrize("column, named", [("label", False), ("intent", False), ("intent", True)])
def test_a_hub_class_label_column_gives_its_names(tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch,
                                                   column: str, named: bool) -> None:
    """Finding: a Hub data set's ClassLabel column (imdb's, ag_news', every GLUE-style set's) was
    mapped to its names by a `map` that kept the column's ClassLabel type, which read the names
    back as ids: every such data set stopped at its first row ("label '0' is not one of neg,
    pos"). And the names were looked up under `label` before the label column was picked, so a
    ClassLabel of another name (clinc_oos' `intent`) would have trained on the ids as names.
    The ids are the Hub's, the names its ClassLabel's, in a run and its predictions alike."""
    import datasets

    rows = {"text": ["send the money", "how much is left", "lock my card", "wire it now"], column: [0, 1, 2, 0]}
    _fake_hub(monkeypatch, rows, rows, {"text": datasets.Value("string"),
                                        column: datasets.ClassLabel(names=["transfer", "balance", "freeze"])})
    task = TextClassification(dataset="org/bank", **({"label_column": column} if named else {}))
    data = task.load()
    assert task.label_names == ["transfer", "balance", "freeze"] and task.label_column == column
    assert data["train"]["label"] == [0, 1, 2, 0] and data["eval"][""]["label"] == [0, 1, 2, 0]
    if column == "intent" and not named:  # a run and its predictions name the classes
        recipe = write_recipe(tmp_path / "r.yaml", """model: {checkpoint: bert-base-uncased}
task: {name: text_classification, dataset: org/bank, max_length: 16}
method: {name: full}
train: {max_steps: 1, batch_size: 4}
""")
        code, out, err = cli("run", recipe, "--smoke", "--runs-dir", tmp_path / "runs")
        assert code == 0, err
        run = Path(out.strip().splitlines()[-1].split(":")[0])
        assert json.loads((run / "metrics.json").read_text())["label_names"] == ["transfer", "balance", "freeze"]
        import toolkit

        assert toolkit.predict(run, ["freeze my card"])[0]["label"] in ("transfer", "balance", "freeze")


@pytest.mark.parametrize("labels, settings, said", [
    (("entailment", "not_entailment"), {"metrics": ["f1"]}, "not_entailment"),  # the negative class, by the alphabet
    (("pos", "neg"), {"metrics": ["accuracy", "f1"]}, "pos"),
    (("entailment", "not_entailment"), {"metrics": ["accuracy"]}, None),  # no F1 asked for
    (("entailment", "not_entailment"), {"metrics": ["f1"], "labels": ["not_entailment", "entailment"]}, None),  # chosen
    (("0", "1"), {"metrics": ["f1"]}, None),  # numbers: the larger, by convention
    (("a", "b", "c"), {"metrics": ["f1"]}, None),  # macro F1: no positive class
])
def test_the_class_f1_is_of_is_said_where_the_alphabet_chose_it(tmp_path: Path, labels: tuple, settings: dict,
                                                                 said: str | None) -> None:
    """Finding: over two labels F1 is label id 1's, the second as sorted, and for names the
    alphabet chose it: RTE's, MRPC's and QQP's labels as text (`not_entailment`, `not_equivalent`,
    `not_duplicate`) sort after the class they negate, and f1 was the negative class's, exit 0,
    said only in metrics.json's metric_info. One warning names the class and the setting."""
    rows = [(f"text {i}", labels[i % len(labels)]) for i in range(6)]
    train = write(tmp_path / "train.csv", rows, "csv")
    task = TextClassification(train_file=str(train), eval_file=str(train), **settings)
    task.load()
    line = task.notices().get("f1 positive")
    if said is None:
        assert line is None
    else:
        other = next(n for n in labels if n != said)
        assert line == (f"task.metrics: f1 is the F1 of '{said}' alone (label id 1: the labels '{other}', '{said}' as "
                        f"sorted); for the F1 of '{other}', list it second: task.labels=[{said}, {other}]")
        assert task.metric_info()["f1"] == f"F1 of label '{said}' (id 1) as the positive class"


@pytest.mark.parametrize("fmt", ["csv", "tsv", "jsonl"])
@pytest.mark.parametrize("joined", ["sports,politics", "sports; politics", "politics|sports"])
def test_labels_that_are_other_labels_joined_are_said(tmp_path: Path, fmt: str, joined: str) -> None:
    """Finding: a multi-label file written as text (`sports,politics` beside `sports` and
    `politics`) trained each set of labels as a class of its own, with no word, exit 0 (a JSON
    list label is refused). Said in one warning naming them; labels that merely hold the mark are
    not (`a, b and c` is no join of two labels)."""
    rows = [(f"text {i}", label) for i, label in enumerate(["sports", "politics", joined, "sports", "a, b and c"])]
    train = write(tmp_path / f"train.{fmt}", rows, fmt)
    task = TextClassification(train_file=str(train), eval_file=str(train))
    task.load()
    assert len(task.label_names) == 4  # as written: still their own classes
    assert task.notices()["label sets"] == (
        f"{train}: 1 label(s) are other labels joined ('{joined}'): a multi-label file? each set is trained as a "
        "class of its own; text_classification reads one label per example")
    plain = write(tmp_path / f"plain.{fmt}", [r for r in rows if r[1] != joined], fmt)
    task = TextClassification(train_file=str(plain), eval_file=str(plain))
    task.load()
    assert "label sets" not in task.notices()

# --- a pair's two texts are told apart, in every family ------------------------------------------
PAIR = ("The show was at its end", "Start again now.")


def _between(tokenizer, ids: list[int]) -> list[int]:
    """The ids between the first text's tokens and the second's in a pair's encoding."""
    first = tokenizer(PAIR[0], add_special_tokens=False)["input_ids"]
    second = tokenizer(PAIR[1], add_special_tokens=False)["input_ids"]
    start = next(i for i in range(len(ids)) if ids[i:i + len(first)] == first) + len(first)
    end = next(i for i in range(start, len(ids)) if ids[i:i + len(second)] == second)
    return ids[start:end]


@pytest.mark.parametrize("family", ["gpt2", "bert", "roberta", "bart", "t5"])
@pytest.mark.parametrize("task", ["glue", "own"])
def test_a_pair_is_encoded_with_a_mark_between_its_texts(tmp_path: Path, family: str, task: str) -> None:
    """Finding: GPT-2's tokenizer has no pair template, so RTE's "...at its end" + "Start again"
    was encoded as "...at its endStart again" (run_glue's reading): no mark where the first text
    ends, and its last word run into the second's first. A launch now sets task.pair_separator to
    eos on a decoder-only model (recorded in recipe.yaml and its id); the run's tokenizer puts
    <|endoftext|> there, counted in max_length. Every other family's own marks are left alone,
    and so are their run ids and a single text's encoding."""
    from datasets import Dataset

    from conftest import FAMILY_IDS
    from toolkit import models
    from toolkit.tasks.glue import Glue

    settings = (Glue(subset="rte", max_length=16) if task == "glue" else
                TextClassification(train_file="t.csv", eval_file="t.csv", max_length=16))
    settings.settle(models.family_of(FAMILY_IDS[family]), trains=True)
    assert settings.pair_separator == ("eos" if family == "gpt2" else None)
    folder = models.smoke_checkpoint(FAMILY_IDS[family])
    tok = models.load_tokenizer(folder)
    own = tok(*PAIR)["input_ids"]
    settings.adapt_tokenizer(tok)
    if not isinstance(settings, Glue):
        settings.text_columns = ["sentence1", "sentence2"]
    columns = settings.text_columns
    raw = Dataset.from_dict({columns[0]: [PAIR[0], PAIR[0] * 5], columns[1]: [PAIR[1], PAIR[1]], "label": [0, 1]})
    ids = settings.encode(raw, tok)["input_ids"]
    if family == "gpt2":
        assert _between(tok, ids[0]) == [tok.eos_token_id]
    else:
        assert ids[0] == own and _between(tok, own)  # the family's own mark, untouched
    assert len(ids[1]) == 16  # cut to max_length, the mark counted
    assert tok(PAIR[0])["input_ids"] == models.load_tokenizer(folder)(PAIR[0])["input_ids"]  # one text: as before


@pytest.mark.parametrize("recipe, separated", [
    ("glue/rte/gpt2-full", True), ("glue/rte/gpt2-lora", True), ("glue/sst2/gpt2-lora", False),
    ("glue/rte/gpt2-icl-0shot", False), ("glue/rte/bert-base-uncased-full", False),
    ("glue/rte/roberta-base-lora", False), ("glue/rte/bart-base-full", False), ("glue/rte/t5-base-full", False)])
def test_only_a_decoders_pair_runs_record_the_separator(recipe: str, separated: bool) -> None:
    """The setting is decided at launch and is in the run id only where it separates: every
    other run keeps its id (the field, unset, is out of the hash), and a run's recipe.yaml made
    before it is read back unset (no separator, as that run trained)."""
    from toolkit import recipe as recipe_module
    from toolkit.recipe_data import read_yaml

    path = Path(__file__).resolve().parents[1] / "recipes" / f"{recipe}.yaml"
    loaded = recipe_module.load(path)
    assert ("pair_separator" in loaded.hashed_dict()["task"]) is separated
    assert loaded.task.pair_separator == ("eos" if separated else None)
    assert recipe_module.parse(read_yaml(path)).task.pair_separator is None  # a recipe.yaml read back


def test_a_gpt2_pair_run_predicts_and_exports_as_it_trained(tmp_path: Path, cli, tiny_checkpoint) -> None:
    """Own pair data on GPT-2: the run's recipe.yaml says eos, eval scores as the run did (and
    refuses another separator, which its saved tokenizer would not read), and toolkit predict and
    the exported folder in plain transformers' pipeline (text_pair) give the same probabilities,
    reading the pair with the separator."""
    import toolkit
    from transformers import pipeline

    rows = [(f"{a} {i}", b, lab) for i, (a, b, lab) in enumerate([("It rained", "The ground is wet", "yes"),
                                                                   ("It rained", "The sky is green", "no")] * 4)]
    train = write(tmp_path / "train.csv", rows, "csv", ("sentence1", "sentence2", "label"))
    recipe = write_recipe(tmp_path / "r.yaml", f"""model: {{checkpoint: gpt2}}
task: {{name: text_classification, train_file: {train}, eval_file: {train}}}
method: {{name: full}}
train: {{epochs: 1, batch_size: 4}}
""")
    code, out, err = cli("run", recipe, "--smoke", "--runs-dir", tmp_path / "runs")
    assert code == 0, err
    (run,) = [p.parent for p in (tmp_path / "runs").rglob("metrics.json")]
    assert "pair_separator: eos" in (run / "recipe.yaml").read_text()
    trained = json.loads((run / "metrics.json").read_text())["eval"]
    assert toolkit.evaluate(run)["eval"] == pytest.approx(trained, abs=1e-6)
    with pytest.raises(UserError, match="task.pair_separator: the run's saved tokenizer holds it as the run trained"):
        toolkit.evaluate(run, overrides=["task.pair_separator=none"])  # recorded as none, read with eos
    (row,) = toolkit.predict(run, [PAIR])
    toolkit.export(run, tmp_path / "out")
    clf = pipeline("text-classification", model=str(tmp_path / "out"), top_k=None)
    plain = {r["label"]: r["score"] for r in clf({"text": PAIR[0], "text_pair": PAIR[1]})}
    assert plain == pytest.approx(row["probabilities"], abs=1e-5)
    exported = clf.tokenizer(*PAIR)["input_ids"]
    assert _between(clf.tokenizer, exported) == [clf.tokenizer.eos_token_id]

