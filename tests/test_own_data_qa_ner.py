"""Your own data for extractive QA (v1.1 and v2.0) and NER in two arguments (issue 38, part 2): the
shipped own-data recipes with nothing but task.train_file / task.eval_file, on files whose field
names the toolkit infers; where it cannot choose, one line lists the candidates and the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import ROOT
from toolkit.errors import UserError
from toolkit.tasks.squad import read_squad

OWN = ROOT / "recipes" / "demo" / "own-data"


def _qa_records(unanswerable: bool, hub_layout: bool) -> list[dict]:
    """Flat records named as many exports name them (query / passage / answers)."""
    rows = []
    for a in range(6):
        passage = f"The museum of town {a} opened in {1900 + a} and shows old maps of the coast."
        year = str(1900 + a)
        answers = [{"text": year, "answer_start": passage.index(year)}]
        if hub_layout:
            answers = {"text": [year], "answer_start": [passage.index(year)]}
        rows.append({"id": f"q{a}", "query": f"When did the museum of town {a} open?", "passage": passage,
                     "answers": answers})
        if unanswerable:
            rows.append({"id": f"n{a}", "query": f"Who painted the maps of town {a}?", "passage": passage,
                         "answers": {"text": [], "answer_start": []} if hub_layout else []})
    return rows


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_qa_v2_own_data_in_two_arguments(tmp_path: Path, cli, position_lookups: list) -> None:
    train = _jsonl(tmp_path / "train.jsonl", _qa_records(True, hub_layout=True))
    dev = _jsonl(tmp_path / "dev.jsonl", _qa_records(True, hub_layout=False))
    code, _, err = cli("run", OWN / "minilm-full-qa-v2.yaml", f"task.train_file={train}", f"task.eval_file={dev}",
                       "--smoke", "--runs-dir", tmp_path / "runs")
    assert code == 0, err
    (metrics,) = (tmp_path / "runs").rglob("metrics.json")
    scores = json.loads(metrics.read_text())["eval"]
    assert {"HasAns_f1", "NoAns_f1", "best_f1"} <= set(scores)
    rows = [json.loads(line) for line in (metrics.parent / "predictions.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == [r["id"] for r in _qa_records(True, False)]  # every dev question, in order
    assert all("no_answer_score" in r for r in rows)
    recipe = (metrics.parent / "recipe.yaml").read_text()
    assert "split_articles: null" in recipe  # the own train file replaced the shipped split
    assert position_lookups == []  # valid files: no record's file:line looked up


def test_qa_v1_own_data_refuses_unanswerable_questions(tmp_path: Path, cli) -> None:
    dev = _jsonl(tmp_path / "dev.jsonl", _qa_records(True, hub_layout=True))
    code, _, err = cli("run", OWN / "minilm-full-qa.yaml", f"task.train_file={dev}", f"task.eval_file={dev}",
                       "--smoke", "--runs-dir", tmp_path / "runs")
    assert code == 2 and err.count("\n") == 1
    assert "6 of 12 questions have no answer" in err and "dev.jsonl:2" in err and "minilm-full-qa-v2" in err


@pytest.mark.parametrize("record, settings, message", [
    ({"ask": "Why?", "a": "Because.", "b": "Context.", "answers": []}, {},
     r"task.question_field: .*x.jsonl has no 'question' field \(candidates: 'ask', 'a', 'b'; .*set task.question_field"),
    ({"q": "Why?", "a": "Because.", "b": "Context.", "answers": []}, {},  # q is a question's name: the context is open
     r"task.context_field: .*x.jsonl has no 'context' field \(candidates: 'a', 'b'; .*set task.context_field"),
    ({"query": "Why?", "passage": "Because.", "answers": [], "extra": "x"}, {"question_field": "ask"},
     r"task.question_field: .*x.jsonl has no field 'ask' \(it has: query, passage, answers, extra\)"),
    ({"question": "Why?", "context": "Because.", "answers": {"text": ["Because"], "answer_start": [0, 3]}}, {},
     r"x.jsonl:1: question 0: answers hold 1 text\(s\) and 2 answer_start\(s\)"),
    ({"question": "Why?", "context": "Because.", "answers": [{"text": "cause", "answer_start": 0}]}, {},
     r"x.jsonl:1: question 0: answer 'cause' at answer_start 0 does not match the context"),
])
def test_flat_qa_files_that_cannot_be_read_are_one_line(tmp_path: Path, record: dict, settings: dict,
                                                         message: str) -> None:
    from toolkit.tasks.squad import QaFields

    path = _jsonl(tmp_path / "x.jsonl", [record])
    with pytest.raises(UserError, match=message):
        read_squad(str(path), "v2", QaFields(**{k.removesuffix("_field"): v for k, v in settings.items()}))


def test_flat_and_squad_layouts_read_the_same_questions(tmp_path: Path) -> None:
    flat = read_squad(str(_jsonl(tmp_path / "x.jsonl", _qa_records(True, hub_layout=True))), "v2")
    listed = read_squad(str(_jsonl(tmp_path / "y.jsonl", _qa_records(True, hub_layout=False))), "v2")
    assert flat == listed
    assert [r["article"] for r in flat] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]  # a context is one article
    as_list = tmp_path / "z.json"
    as_list.write_text(json.dumps(_qa_records(True, hub_layout=True)))
    assert read_squad(str(as_list), "v2") == flat


def test_ner_own_data_in_two_arguments(tmp_path: Path, cli, position_lookups: list) -> None:
    """Tags of the user's own (drug and dose names) are read from the files, checked, and named
    in the run's labels; a JSONL of `words` / `labels` is read by its inferred fields."""
    sentences = [(["Take", "aspirin", "twice", "daily"], ["O", "B-DRUG", "B-FREQ", "I-FREQ"]),
                 (["Ibuprofen", "400", "mg"], ["B-DRUG", "B-DOSE", "I-DOSE"])] * 8
    rows = [{"words": w, "labels": t} for w, t in sentences]
    train, dev = _jsonl(tmp_path / "train.jsonl", rows), _jsonl(tmp_path / "dev.jsonl", rows[:4])
    code, _, err = cli("run", OWN / "minilm-lora-ner.yaml", f"task.train_file={train}", f"task.eval_file={dev}",
                       "--smoke", "--runs-dir", tmp_path / "runs")
    assert code == 0, err
    (metrics_file,) = (tmp_path / "runs").rglob("metrics.json")
    metrics = json.loads(metrics_file.read_text())
    assert metrics["label_names"] == ["O", "B-DOSE", "I-DOSE", "B-DRUG", "B-FREQ", "I-FREQ"]
    assert metrics["metric_info"] == {"tag_scheme": "IOB2", "entity_scoring": "seqeval default mode (conlleval), not strict"} and set(metrics["eval"]) >= {"f1", "accuracy"}
    assert position_lookups == []
    # predict finds an input's words as eval finds them in a file (`words`, `tokens`, or the one list):
    # it demanded `tokens` of a run trained and evaluated on files of `words`
    import toolkit

    run = metrics_file.parent
    renamed = _jsonl(tmp_path / "renamed.jsonl", [{"tokens": r["words"], "ner_tags": r["labels"]} for r in rows[:4]])
    code, out, err = cli("eval", run, f"task.eval_file={renamed}")
    assert code == 0, err
    assert json.loads((run / "eval-eval.json").read_text())["eval"]["f1"] == metrics["eval"]["f1"]
    predicted = {}
    for name, source in (("words", dev), ("tokens", renamed)):
        code, out, err = cli("predict", run, "--input", source)
        assert code == 0, err
        predicted[name] = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        assert [p[name] for p in predicted[name]] == [r["words"] for r in rows[:4]]  # under the input's name
    assert [p["tags"] for p in predicted["words"]] == [p["tags"] for p in predicted["tokens"]]
    api = toolkit.predict(run, [{"sentence": r["words"]} for r in rows[:4]])  # the one list-valued field
    assert [p["tags"] for p in api] == [p["tags"] for p in predicted["words"]]
    assert [p["sentence"] for p in api] == [r["words"] for r in rows[:4]]


@pytest.mark.parametrize("recipe, settings", [
    ("demo/own-data/minilm-full-qa-v2", ["task.question_field=query"]),  # set, beside a 'question' it does not read
    ("squad/v1.1/t5-base-full", []),  # generative, the fields inferred from the file
], ids=["extractive-v2-set", "generative-inferred"])
def test_own_qa_data_predicts_by_the_fields_the_run_read(tmp_path: Path, cli, recipe: str, settings: list) -> None:
    """predict reads a question and a context by the names the run's data gave them: a file of
    the training layout (query / passage) was refused for lacking 'question', and one that also
    holds a 'question' field the run never read was answered from it, exit 0. Predicting on the
    run's own eval file gives the run's predictions.jsonl."""
    import toolkit

    rows = _qa_records(unanswerable="v2" in recipe, hub_layout=True)
    if settings:
        rows = [{**r, "question": "Which colour is the sky?"} for r in rows]
    train, dev = _jsonl(tmp_path / "train.jsonl", rows), _jsonl(tmp_path / "dev.jsonl", rows[:4])
    run = toolkit.run(recipe, [f"task.train_file={train}", f"task.eval_file={dev}", "train.max_steps=1", *settings],
                      runs_dir=tmp_path / "runs", smoke=True)
    scored = [json.loads(line) for line in (run.dir / "predictions.jsonl").read_text().splitlines()]
    code, out, err = cli("predict", run.dir, "--input", dev)
    assert code == 0, err
    predicted = [json.loads(line) for line in out.splitlines() if line.startswith("{")]  # after the run's lines
    assert [p["query"] for p in predicted] == [r["query"] for r in rows[:4]]
    assert [p["passage"] for p in predicted] == [r["passage"] for r in rows[:4]]
    assert [p["prediction"] for p in predicted] == [s["prediction"] for s in scored]
    if "v2" in recipe:
        assert [p["no_answer_score"] for p in predicted] == pytest.approx([s["no_answer_score"] for s in scored], abs=1e-4)
    assert [p["prediction"] for p in toolkit.predict(run.dir, [{"query": r["query"], "passage": r["passage"]}
                                                                for r in rows[:4]])] == [s["prediction"] for s in scored]
    # a file of SQuAD's names: predict finds its fields as `toolkit eval RUN task.eval_file=NEW` does
    # (it demanded the run's own `query` / `passage`); a field the recipe sets is needed by both
    renamed = _jsonl(tmp_path / "renamed.jsonl", [{"id": r["id"], "question": r["query"], "context": r["passage"],
                                                   "answers": r["answers"]} for r in rows[:4]])
    code, _, err = cli("eval", run.dir, f"task.eval_file={renamed}")
    code_p, out, err_p = cli("predict", run.dir, "--input", renamed)
    if settings:  # task.question_field=query: neither reads another field
        assert code == code_p == 2
        for said in (err, err_p):
            assert "task.question_field: " in said and "renamed.jsonl has no field 'query'" in said, said
        return
    assert code == code_p == 0, err + err_p
    evaluated = [json.loads(line) for line in (run.dir / "predictions-eval.jsonl").read_text().splitlines()]
    predicted = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [p["prediction"] for p in predicted] == [e["prediction"] for e in evaluated] == [s["prediction"] for s in scored]
    assert [(p["question"], p["context"]) for p in predicted] == [(r["query"], r["passage"]) for r in rows[:4]]
    api = toolkit.predict(run.dir, [{"q": r["query"], "paragraph": r["passage"]} for r in rows[:4]])
    assert [p["prediction"] for p in api] == [s["prediction"] for s in scored] and set(api[0]) >= {"q", "paragraph"}



CONTEXT = "Marie Curie studied in Paris; the Café Curie in Paris is named after her."
FIRST, SECOND = CONTEXT.index("Paris"), CONTEXT.rindex("Paris")


@pytest.mark.parametrize("layout", ["squad", "flat-hub", "flat-list", "json-list"])
@pytest.mark.parametrize("text, start, expected", [
    ("Paris", 3, rf"does not match the context there \('ie Cu'\); the context holds it at answer_start {FIRST}, "
                 r"the nearest of 2 places: fix answer_start$"),
    ("Paris", SECOND + 3, rf"the context holds it at answer_start {SECOND}, the nearest of 2 places"),
    ("Caf\u00e9 Curie", 0, rf"holds it at answer_start {CONTEXT.index('Café')}: fix answer_start$"),
    ("Cafe\u0301", CONTEXT.index("Café"), r"the same characters in different Unicode forms \(equal under NFC"),
    ("London", 0, r"does not match the context there \('Marie '\); fix answer_start$"),
])
def test_an_answer_not_at_its_start_says_what_would_be_right(tmp_path: Path, layout: str, text: str, start: int,
                                                             expected: str) -> None:
    """Finding: an answer whose text is in the context but not at its answer_start, or whose text
    is the context's in another Unicode form (typed as 'e' + U+0301 where the context holds 'é',
    both showing `Café`), was one line ending 'fix answer_start' in every layout: for the second
    no answer_start is right. The line names the start that is (the nearest place) or the Unicode
    form that makes the two equal; 'fix answer_start' alone where the text is nowhere."""
    answer = {"text": text, "answer_start": start}
    if layout == "squad":
        path = tmp_path / "x.json"
        path.write_text(json.dumps({"data": [{"title": "t", "paragraphs": [{"context": CONTEXT, "qas": [
            {"id": "q0", "question": "Where?", "answers": [answer]}]}]}]}))
    else:
        answers = {"text": [text], "answer_start": [start]} if layout == "flat-hub" else [answer]
        record = {"id": "q0", "question": "Where?", "context": CONTEXT, "answers": answers}
        path = _jsonl(tmp_path / "x.jsonl", [record]) if layout != "json-list" else tmp_path / "x.json"
        if layout == "json-list":
            path.write_text(json.dumps([record]))
    with pytest.raises(UserError, match=expected) as error:
        read_squad(str(path), "v1")
    assert "\n" not in str(error.value)
