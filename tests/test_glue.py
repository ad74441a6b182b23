"""GLUE: official metrics against hand-computed values; the local loader on the real files."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import shared_tokenizer
from toolkit.errors import UserError

from toolkit.tasks.glue import Glue, glue_metrics
from toolkit.tasks.text_classification import TextClassification


def test_metrics_match_hand_computed_values() -> None:
    labels = np.array([1, 1, 0, 0, 1, 0])
    preds = np.array([1, 0, 0, 1, 1, 0])
    # TP=2 FN=1 FP=1 TN=2: acc 4/6, F1 = 2*2/(2*2+1+1) = 2/3, MCC = (2*2-1*1)/sqrt(3*3*3*3) = 1/3
    got = glue_metrics(("accuracy", "f1", "matthews_correlation"), preds, labels)
    assert got == pytest.approx({"accuracy": 4 / 6, "f1": 2 / 3, "matthews_correlation": 1 / 3})


def test_correlations_match_hand_computed_values() -> None:
    labels = np.array([1.0, 2.0, 3.0, 4.0])
    preds = np.array([1.0, 3.0, 2.0, 4.0])
    # centred: l = [-1.5,-.5,.5,1.5], p = [-1.5,.5,-.5,1.5]; cov = 2.25-.25-.25+2.25 = 4; var = 5 each
    # Spearman on ranks (same values here) = 1 - 6*sum(d^2)/(n(n^2-1)) = 1 - 6*2/60 = 0.8
    got = glue_metrics(("pearson", "spearmanr"), preds, labels)
    assert got == pytest.approx({"pearson": 4 / 5, "spearmanr": 0.8})


@pytest.mark.parametrize("preds, labels, flat", [
    ([2.5, 2.5, 2.5], [1.0, 2.0, 3.0], "predictions do not vary over 3"),  # a collapsed regressor
    ([1.0, 2.0, 3.0], [4.0, 4.0, 4.0], "labels do not vary over 3"),
    ([2.5], [1.0], "predictions and labels do not vary over 1"),  # a split of one example
])
def test_an_undefined_correlation_is_nan_and_said_never_zero(capsys, monkeypatch, tmp_path: Path, preds, labels,
                                                             flat) -> None:
    """Pearson and Spearman of a side that does not vary are undefined (scipy's, and so `evaluate`'s
    GLUE metric, NaN): the run records null and says why, instead of a 0.0 that reads as a score,
    averages into the GLUE score and, first seen, blocked best-model selection (nothing beat it)."""
    from test_report import fake_run
    from toolkit import reports, runs
    from toolkit.tasks import CATALOGUE
    from toolkit.train import improves

    monkeypatch.setattr("toolkit.quiet._SAID", set())  # what this process said already
    got = glue_metrics(("pearson", "spearmanr"), np.array(preds), np.array(labels))
    assert all(np.isnan(v) for v in got.values()), got
    err = capsys.readouterr().err
    assert f"warning: pearson is undefined ({flat} example(s)); recorded as null" in err
    assert "warning: spearmanr is undefined" in err
    glue_metrics(("pearson", "spearmanr"), np.array(preds), np.array(labels))  # the next evaluation
    assert "undefined" not in capsys.readouterr().err  # said once, not at every evaluation
    pearson = CATALOGUE["pearson"]
    assert not improves(pearson, float("nan"), 0.5, None, None)  # an undefined score is not kept as best
    assert improves(pearson, -0.2, 0.9, float("nan"), 0.5)  # and any defined one beats it
    run = fake_run(tmp_path, "stsb", "full", 42, {"pearson": 0.5, "spearmanr": 0.5}, main="pearson")
    metrics = json.loads((run / "metrics.json").read_text())
    runs.write_json(run / "metrics.json", {**metrics, "eval": {**got, "loss": 1.0}})
    assert json.loads((run / "metrics.json").read_text())["eval"]["pearson"] is None
    (item,) = reports.collect(tmp_path)  # the report reads null as not recorded
    assert "pearson" not in item["metrics"]["eval"] and item["metrics"]["eval"]["loss"] == 1.0


@pytest.mark.parametrize("subset, n_dev, labels", [
    ("cola", 1043, {0, 1}), ("sst2", 872, {0, 1}), ("mrpc", 408, {0, 1}), ("rte", 277, {0, 1}),
    ("wnli", 71, {0, 1}), ("stsb", 1500, None),
])
def test_local_glue_files_load(subset: str, n_dev: int, labels: set | None) -> None:
    data = Glue(subset=subset).load()
    dev = data["eval"][""]
    assert len(dev) == n_dev
    if labels is None:
        assert 0.0 <= min(dev["label"]) and max(dev["label"]) <= 5.0
    else:
        assert set(dev["label"]) == labels
    assert len(data["train"]) > n_dev


def test_qnli_has_no_train_split_and_says_how_to_carve_one() -> None:
    with pytest.raises(UserError, match="train_from_dev"):
        Glue(subset="qnli").load()
    carved = Glue(subset="qnli", train_from_dev=0.5).load()
    again = Glue(subset="qnli", train_from_dev=0.5).load()
    assert len(carved["train"]) + len(carved["eval"][""]) == 5463
    assert carved["train"]["text_a"][:5] == again["train"]["text_a"][:5]
    train_q = set(zip(carved["train"]["text_a"], carved["train"]["text_b"]))
    assert not train_q & set(zip(carved["eval"][""]["text_a"], carved["eval"][""]["text_b"]))


MNLI_HEADER = ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
               "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label")


def _mnli_row(i: int, label: str) -> str:
    return f"{i}\t1\t1a\tfiction\t( x )\t( y )\t(x)\t(y)\tPremise {i}.\tHypothesis {i}.\t{label}\t{label}"


def test_mnli_and_qqp_layouts(tmp_path: Path) -> None:
    mnli = tmp_path / "glue" / "MNLI"
    mnli.mkdir(parents=True)
    rows = ["entailment", "neutral", "contradiction"]
    for name in ("train.tsv", "dev_matched.tsv", "dev_mismatched.tsv"):
        (mnli / name).write_text("\n".join([MNLI_HEADER] + [_mnli_row(i, l) for i, l in enumerate(rows)]) + "\n")
    data = Glue(subset="mnli", data_dir=str(tmp_path)).load()
    assert set(data["eval"]) == {"", "_mm"}
    assert data["eval"]["_mm"]["label"] == [0, 1, 2]
    assert data["train"]["text_b"][1] == "Hypothesis 1."
    qqp = tmp_path / "glue" / "QQP"
    qqp.mkdir()
    text = "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n0\t1\t2\tHow?\tWhy?\t0\n1\t3\t4\tA?\tA?\t1\n"
    for name in ("train.tsv", "dev.tsv"):
        (qqp / name).write_text(text)
    data = Glue(subset="qqp", data_dir=str(tmp_path)).load()
    assert data["eval"][""]["label"] == [0, 1] and data["eval"][""]["text_a"] == ["How?", "A?"]


def test_bad_label_and_missing_column_name_file_and_line(tmp_path: Path) -> None:
    sst = tmp_path / "glue" / "SST-2"
    sst.mkdir(parents=True)
    (sst / "train.tsv").write_text("sentence\tlabel\ngood film\t1\nbad film\t7\n")
    (sst / "dev.tsv").write_text("sentence\tlabel\nok\t0\n")
    task = Glue(subset="sst2", data_dir=str(tmp_path))
    with pytest.raises(UserError, match=r"SST-2/train.tsv:3: label '7' is not one of 0, 1"):
        task.load()
    (sst / "train.tsv").write_text("text\tlabel\ngood\t1\n")
    with pytest.raises(UserError, match="column 'sentence' is missing"):
        task.load()


def test_a_file_read_again_is_its_current_content(tmp_path: Path) -> None:
    """read_tsv keeps the files it parsed (SST-2's train.tsv: a third of a second a run): a
    caller changing its lists changes no later read, a file rewritten (the same size, even the
    same time stamp) is read again, and an error is said at every read."""
    import os

    from toolkit.tasks.glue import SPECS, read_tsv

    path = tmp_path / "train.tsv"
    path.write_text("sentence\tlabel\ngood film\t1\nbad film\t0\n")
    first = read_tsv(path, SPECS["sst2"])
    assert first == {"text_a": ["good film", "bad film"], "label": [1, 0]}
    first["text_a"][0], first["label"] = "changed", []
    assert read_tsv(path, SPECS["sst2"]) == {"text_a": ["good film", "bad film"], "label": [1, 0]}
    stamp = path.stat().st_mtime_ns
    path.write_text("sentence\tlabel\nfine film\t1\nbad film\t1\n")
    os.utime(path, ns=(stamp, stamp))
    assert read_tsv(path, SPECS["sst2"]) == {"text_a": ["fine film", "bad film"], "label": [1, 1]}
    path.write_text("sentence\tlabel\nfine film\t1\nbad film\t7\n")
    for _ in range(2):
        with pytest.raises(UserError, match=r"train.tsv:3: label '7' is not one of 0, 1"):
            read_tsv(path, SPECS["sst2"])


# a head trained with GLUE's labels in another id order (roberta-large-mnli's first), one per head layout
LABEL_ORDERS = [("bert", "mnli", ["CONTRADICTION", "NEUTRAL", "ENTAILMENT"]),
                ("gpt2", "mnli", ["neutral", "contradiction", "entailment"]),
                ("bart", "qnli", ["NOT_ENTAILMENT", "ENTAILMENT"])]


@pytest.mark.parametrize("family, subset, theirs", LABEL_ORDERS, ids=[f"{f}-{s}" for f, s, _ in LABEL_ORDERS])
def test_a_checkpoint_with_the_labels_in_another_order_predicts_the_same_labels(
        tmp_path: Path, tiny_checkpoint, family: str, subset: str, theirs: list[str]) -> None:
    """Finding: the task's id2label replaced the checkpoint's, so a head trained with contradiction
    at id 0 had every "contradiction" read as "entailment" (accuracy wrong, exit 0). Loaded for the
    task, each example gets the label the checkpoint itself gives it, under the task's ids (as
    run_glue maps labels to the model's ids), whatever the head's layout."""
    import torch
    from transformers import AutoModelForSequenceClassification

    from toolkit import models

    tok = shared_tokenizer(tiny_checkpoint(family))
    torch.manual_seed(0)
    theirs_model = AutoModelForSequenceClassification.from_pretrained(
        tiny_checkpoint(family), id2label=dict(enumerate(theirs)), label2id={n: i for i, n in enumerate(theirs)},
        pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id).eval()
    theirs_model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    task = Glue(subset=subset)
    ours, _ = models.load(str(tmp_path / "m"), "sequence-classification", task.head_kwargs())
    texts = ["A man plays a guitar on stage.", "Nobody is here.", "The cat sat on the mat."]
    with torch.no_grad():
        pairs = tok(*[texts] * len(task.text_columns), padding=True, return_tensors="pt")  # as classify reads them
        ids = theirs_model(**pairs).logits.argmax(-1).tolist()
    want = [theirs[i] for i in ids]
    assert [w.lower() for w in want] != [task.label_names[i] for i in ids]  # their ids read as the task's: wrong
    got = [p["label"] for p in task.classify(ours.eval(), tok, [{c: t for c in task.text_columns} for t in texts])]
    assert [g.lower() for g in got] == [w.lower() for w in want]
    assert [ours.config.id2label[i] for i in range(task.num_labels)] == task.label_names


F1_TASKS = [Glue(subset="mrpc"), Glue(subset="qqp"),  # GLUE's F1 tasks, and a user's two labels
            TextClassification(eval_file="unused.csv", labels=["neg", "pos"], metrics=["accuracy", "f1"])]


@pytest.mark.parametrize("task", F1_TASKS, ids=["mrpc", "qqp", "own-data"])
def test_f1_with_no_positive_anywhere_is_nan_and_said_never_zero(capsys, monkeypatch, task) -> None:
    """F1 = 2TP / (2TP + FP + FN) is 0/0 where the positive class (id 1) is in neither the labels
    nor the predictions (an eval split of negatives, every one predicted negative): it was 0.0,
    scikit-learn's zero_division stand-in, read as a model that found no positive and averaged
    into a GLUE score. NaN (null in metrics.json) with a warning, as an undefined correlation; a
    positive on either side keeps F1 defined, 0.0 where none is found (every path that scores
    a classifier: training's evaluation, toolkit eval and in-context prompting call compute_metrics)."""
    monkeypatch.setattr("toolkit.quiet._SAID", set())
    got = task.compute_metrics(np.array([0, 0, 0]), np.array([0, 0, 0]))
    assert np.isnan(got["f1"]) and got["accuracy"] == 1.0
    assert ("warning: f1 is undefined (the positive class, label id 1, is in neither the labels nor the predictions "
            "of 3 example(s)); recorded as null") in capsys.readouterr().err
    assert task.compute_metrics(np.array([0, 0, 0]), np.array([0, 1, 0]))["f1"] == 0.0  # a positive missed
    assert task.compute_metrics(np.array([1, 0, 0]), np.array([0, 0, 0]))["f1"] == 0.0  # a false positive
    macro = TextClassification(eval_file="unused.csv", labels=["a", "b", "c"], metrics=["f1"])
    assert macro.compute_metrics(np.array([0, 0, 2]), np.array([0, 0, 0]))["f1"] == pytest.approx(0.4)  # (0.8 + 0) / 2


MCC_TASKS = [Glue(subset="cola"),  # GLUE's MCC task, and a user's two and three labels
             TextClassification(eval_file="unused.csv", labels=["neg", "pos"], metrics=["matthews_correlation"]),
             TextClassification(eval_file="unused.csv", labels=["a", "b", "c"], metrics=["matthews_correlation"])]


@pytest.mark.parametrize("task", MCC_TASKS, ids=["cola", "own-data", "own-data-3"])
@pytest.mark.parametrize("label", [0, 1])
def test_matthews_correlation_of_labels_of_one_class_is_nan_and_said_never_zero(capsys, monkeypatch, task,
                                                                                   label: int) -> None:
    """MCC divides by the labels' spread, which is 0 where an eval split's labels are all one
    class (a CoLA subset of acceptable sentences): it was 0.0, scikit-learn's stand-in, for every
    model, one right on every example included, read as chance level and averaged into a GLUE
    score. NaN (null in metrics.json) with a warning, as an undefined F1 or correlation; constant
    predictions against labels that vary stay 0.0, as GLUE scores a majority-class baseline (every
    path that scores a classifier calls compute_metrics)."""
    monkeypatch.setattr("toolkit.quiet._SAID", set())
    labels = np.full(4, label)
    for preds in (labels, np.array([0, 1, 0, 1])):
        got = task.compute_metrics(preds, labels)["matthews_correlation"]
        assert np.isnan(got)
    assert ("warning: matthews_correlation is undefined (the labels of 4 example(s) are all one class); recorded "
            "as null") in capsys.readouterr().err
    assert task.compute_metrics(np.full(4, label), np.array([0, 1, 1, 0]))["matthews_correlation"] == 0.0
    assert task.compute_metrics(np.array([0, 1, 1, 0]), np.array([0, 1, 1, 0]))["matthews_correlation"] == 1.0
    assert "undefined" not in capsys.readouterr().err


def _read(folder: Path) -> dict[str, list[str]]:
    return {p.name: p.read_text().splitlines() for p in folder.iterdir()}


def _submission(task: Glue, tmp_path: Path) -> dict[str, list[str]]:
    """task.submission with a stand-in classifier that answers each label name in turn."""
    names = task.label_names
    task.classify = lambda model, tok, rows: [{"label": names[i % len(names)]} for i in range(len(rows))]
    written = task.submission(lambda: (None, None), tmp_path / "sub")
    return {p.name: p.read_text().splitlines() for p in written}


def test_mnli_submission_holds_both_test_sets_and_the_diagnostic_in_glues_label_names(tmp_path: Path) -> None:
    """Finding: --glue-test for MNLI wrote MNLI-m.tsv and MNLI-mm.tsv but no AX.tsv, which the
    GLUE server reads (the diagnostic set, predicted by the MNLI model) with every submission."""
    mnli, diagnostic = tmp_path / "glue" / "MNLI", tmp_path / "glue" / "diagnostic"
    mnli.mkdir(parents=True)
    test_header = "\t".join(MNLI_HEADER.split("\t")[:10])
    for name in ("test_matched.tsv", "test_mismatched.tsv"):
        (mnli / name).write_text("\n".join([test_header] + [_mnli_row(i, "")[:-2].rstrip("\t") for i in range(4)]) + "\n")
    task = Glue(subset="mnli", data_dir=str(tmp_path))
    with pytest.raises(UserError, match=r"--glue-test: .*glue/diagnostic/diagnostic.tsv is not there \(the "
                                        r"diagnostic set, whose AX.tsv the GLUE server reads"):
        _submission(task, tmp_path)
    assert not (tmp_path / "sub").exists()  # refused before anything is written
    diagnostic.mkdir()
    (diagnostic / "diagnostic.tsv").write_text("index\tsentence1\tsentence2\n0\tA dog.\tAn animal.\n1\tX.\tY.\n")
    files = _submission(task, tmp_path)
    assert sorted(files) == ["AX.tsv", "MNLI-m.tsv", "MNLI-mm.tsv"]
    assert files["AX.tsv"] == ["index\tprediction", "0\tentailment", "1\tneutral"]
    assert files["MNLI-m.tsv"][1:] == ["0\tentailment", "1\tneutral", "2\tcontradiction", "3\tentailment"]
    # a failure predicting a later file (a non-finite output on AX) left MNLI-m.tsv and MNLI-mm.tsv
    # of this model beside the previous model's AX.tsv; now every file is predicted before any is written
    calls = []

    def fails_at_the_third(model, tok, rows):
        calls.append(1)
        if len(calls) == 3:
            raise UserError("the model's outputs are not finite")
        return [{"label": "neutral"} for _ in rows]

    task.classify = fails_at_the_third
    with pytest.raises(UserError, match="not finite"):
        task.submission(lambda: (None, None), tmp_path / "sub")
    assert _read(tmp_path / "sub") == files  # the earlier submission, untouched
    shutil.rmtree(tmp_path / "sub")
    calls.clear()
    with pytest.raises(UserError, match="not finite"):
        task.submission(lambda: (None, None), tmp_path / "sub")
    assert not (tmp_path / "sub").exists()
    (diagnostic / "diagnostic.tsv").write_text("index\tsentence1\tsentence2\n0\tA dog.\tAn animal.\n1\tX.\n")
    with pytest.raises(UserError, match=r"diagnostic.tsv:3: expected at least 3 columns, got 2"):
        _submission(task, tmp_path)


def test_a_submission_that_cannot_be_written_whole_leaves_the_one_before(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding: a full disk at MNLI's second file (MNLI-mm.tsv) left the new MNLI-m.tsv beside the
    previous model's MNLI-mm.tsv and AX.tsv, a submission of two models; and every call wrote under
    one name (`.MNLI-m.tsv.partial`), so two at once cut each other's. Now every file is written
    under names of the call's own before any is renamed (runs.write_all_whole): all or none."""
    import errno

    mnli, diagnostic = tmp_path / "glue" / "MNLI", tmp_path / "glue" / "diagnostic"
    mnli.mkdir(parents=True)
    diagnostic.mkdir()
    test_header = "\t".join(MNLI_HEADER.split("\t")[:10])
    for name in ("test_matched.tsv", "test_mismatched.tsv"):
        (mnli / name).write_text("\n".join([test_header] + [_mnli_row(i, "")[:-2].rstrip("\t") for i in range(4)]) + "\n")
    (diagnostic / "diagnostic.tsv").write_text("index\tsentence1\tsentence2\n0\tA dog.\tAn animal.\n")
    task = Glue(subset="mnli", data_dir=str(tmp_path))
    before = _submission(task, tmp_path)
    task.classify = lambda model, tok, rows: [{"label": "neutral"} for _ in rows]  # another model's answers
    writes = []
    real_text, real_bytes = Path.write_text, Path.write_bytes

    def full_at_the_second(write):
        def wrapped(self, *args, **kwargs):
            writes.append(self.name)
            if len(writes) == 2:
                raise OSError(errno.ENOSPC, "No space left on device", str(self))
            return write(self, *args, **kwargs)
        return wrapped

    monkeypatch.setattr(Path, "write_text", full_at_the_second(real_text))
    monkeypatch.setattr(Path, "write_bytes", full_at_the_second(real_bytes))
    with pytest.raises(OSError, match="No space left"):
        task.submission(lambda: (None, None), tmp_path / "sub")
    monkeypatch.undo()
    assert _read(tmp_path / "sub") == before  # the earlier submission whole, and nothing else there
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == sorted(before)


@pytest.mark.parametrize("task, said", [
    (Glue(subset="mrpc"), "F1 of label 'equivalent' (id 1) as the positive class"),
    (Glue(subset="qqp"), "F1 of label 'duplicate' (id 1) as the positive class"),
    (Glue(subset="sst2"), None), (Glue(subset="stsb"), None),
    ("positive,negative", "F1 of label 'negative' (id 1) as the positive class"),
    ("a,b,c", "macro F1: the unweighted mean of the F1 of each of the 3 labels that occurs in the gold labels or "
              "the predictions (scikit-learn's macro average)"),
], ids=["mrpc", "qqp", "sst2", "stsb", "own-two", "own-three"])
def test_metrics_json_says_which_f1_it_is(task, said: str | None) -> None:
    """F1 over two labels is label id 1's alone; with a user's labels (as `labels:` orders them)
    that can be the class not meant, so metrics.json names it, and the score is that class's."""
    from toolkit.tasks.text_classification import TextClassification

    if isinstance(task, str):
        task = TextClassification(train_file="x.csv", eval_file="x.csv", labels=task.split(","),
                                  metrics=["f1", "accuracy"])
    assert task.metric_info().get("f1") == said
    if said and "(id 1)" in said:  # predicted all label 1 on labels [1, 0]: F1 of label 1 = 2/3
        assert task.compute_metrics([1, 1], [1, 0])["f1"] == pytest.approx(2 / 3)
    if said and "macro" in said:  # label c in neither: the mean over a and b (F1 2/3 each), not 4/9
        assert task.compute_metrics([0, 1, 1], [0, 1, 0])["f1"] == pytest.approx(2 / 3)


def _layout(spec, texts: list[str], label: str) -> tuple[str, str]:
    """(header line or "", one row) of a GLUE file in `spec`'s layout: header files as
    index + text columns + label; CoLA's header-less one as source, label, original label, sentence."""
    if not spec.header:
        return "", "\t".join(["gj04", label, "", *texts])
    return "\t".join(["index", *spec.columns, spec.label_column]), "\t".join(["0", *texts, label])


@pytest.mark.parametrize("subset", sorted(__import__("toolkit.tasks.glue", fromlist=["SPECS"]).SPECS))
def test_a_tab_inside_a_text_is_one_line_never_shifted_columns(tmp_path: Path, subset: str) -> None:
    """Finding: a row with more tab-separated fields than its header (a text holding a tab) was read
    by position, exit 0: MRPC's second sentence was the first one's second half and the real one
    dropped, CoLA's sentence was cut at the tab, MNLI's gold_label could be read from another label
    column. Now one line naming the file and line, in every GLUE reader (train/dev files and the
    --glue-test files); empty fields past the layout (a trailing tab) shift nothing and still read."""
    from toolkit.tasks.glue import SPECS, read_test, read_tsv

    spec = SPECS[subset]
    label = spec.labels[-1] if spec.labels else "2.5"
    texts = ["A first text.", "A second text."][: len(spec.columns)]
    head, good = _layout(spec, texts, label)
    _, shifted = _layout(spec, ["A first\ttext.", *texts[1:]], label)
    path = tmp_path / "train.tsv"
    lines = [head] * spec.header + [good]
    path.write_text("\n".join(lines + [shifted]) + "\n")
    with pytest.raises(UserError, match=rf"train.tsv:{len(lines) + 1}: {len(good.split(chr(9))) + 1} tab-separated "
                                        rf"fields where the file's layout has {len(good.split(chr(9)))}: a text holding a tab"):
        read_tsv(path, spec)
    path.write_text("\n".join(lines + [good + "\t\t"]) + "\n")  # a trailing tab: read as the row without it
    got = read_tsv(path, spec)
    assert got["text_a"] == ["A first text."] * 2 and got.get("text_b", texts[1:] * 2) == texts[1:] * 2
    assert got["label"] == [spec.labels.index(label) if spec.labels else 2.5] * 2
    # the test files GLUE's server is sent predictions of, by index
    folder = tmp_path / "glue" / spec.folder
    columns = spec.test_columns or spec.columns
    for n, test_file in enumerate(spec.submissions):
        (folder / test_file).parent.mkdir(parents=True, exist_ok=True)
        rows = ["\t".join(["index", *columns]), "\t".join(["0", *texts])]
        if n == 0:
            rows.append("\t".join(["1", "A first\ttext.", *texts[1:]]))
        (folder / test_file).write_text("\n".join(rows) + "\n")
    first = Path(next(iter(spec.submissions))).name
    with pytest.raises(UserError, match=rf"{first}:3: {len(columns) + 2} tab-separated fields where the file's "
                                        rf"layout has {len(columns) + 1}"):
        read_test(Glue(subset=subset, data_dir=str(tmp_path)))


@pytest.mark.parametrize("subset", sorted(__import__("toolkit.tasks.glue", fromlist=["SPECS"]).SPECS))
def test_a_carriage_return_inside_a_row_is_one_line_at_its_line(tmp_path: Path, subset: str) -> None:
    """A lone \\r inside a GLUE row (an editor's stray old-Mac line end) ended the row there for
    the csv module: the row was refused as a short one at a line number one past the file's,
    every later line's number shifted. Now one line at the row's own line, in the train/dev
    reader and the --glue-test reader alike (the `\\r\\n` line ends of a Windows copy still read)."""
    from toolkit.tasks.glue import SPECS, read_test, read_tsv

    spec = SPECS[subset]
    label = spec.labels[-1] if spec.labels else "2.5"
    texts = ["A first text.", "A second text."][: len(spec.columns)]
    head, good = _layout(spec, texts, label)
    _, broken = _layout(spec, ["A first\rtext.", *texts[1:]], label)
    lines = [head] * spec.header + [good, good]
    path = tmp_path / "train.tsv"
    path.write_bytes(("\r\n".join(lines) + "\r\n").encode())
    assert len(read_tsv(path, spec)["text_a"]) == 2
    path.write_bytes(("\n".join(lines + [broken, good]) + "\n").encode())
    with pytest.raises(UserError, match=rf"train.tsv:{len(lines) + 1}: a carriage return"):
        read_tsv(path, spec)
    folder = tmp_path / "glue" / spec.folder
    columns = spec.test_columns or spec.columns
    first = next(iter(spec.submissions))
    (folder / first).parent.mkdir(parents=True, exist_ok=True)
    (folder / first).write_bytes(("\n".join(["\t".join(["index", *columns]), "\t".join(["0", "a\rb", *texts[1:]])])
                                  + "\n").encode())
    with pytest.raises(UserError, match=rf"{Path(first).name}:2: a carriage return"):
        read_test(Glue(subset=subset, data_dir=str(tmp_path)))


@pytest.mark.parametrize("subset", sorted(__import__("toolkit.tasks.glue", fromlist=["SPECS"]).SPECS))
def test_a_test_file_with_no_rows_is_one_line_never_an_empty_submission(tmp_path: Path, subset: str) -> None:
    """Finding: --glue-test on a test file holding its header alone (a download cut short) wrote
    `index<TAB>prediction` and nothing else, exit 0, as train and dev files were refused ("has no
    rows"). Now the same line, for every test file of every task (MNLI's three), before the model loads."""
    from toolkit.tasks.glue import SPECS, read_test

    spec = SPECS[subset]
    columns = spec.test_columns or spec.columns
    folder = tmp_path / "glue" / spec.folder
    files = list(spec.submissions)
    for n, test_file in enumerate(files):
        (folder / test_file).parent.mkdir(parents=True, exist_ok=True)
        rows = ["\t".join(["index", *columns])] + ["\t".join(["0", *["A text."] * len(columns)])] * (n != len(files) - 1)
        (folder / test_file).write_text("\n".join(rows) + "\n\n")
    with pytest.raises(UserError, match=rf"{Path(files[-1]).name}: has no rows \(a header alone\)"):
        read_test(Glue(subset=subset, data_dir=str(tmp_path)))


# What GLUE's server reads, written out here apart from the toolkit's specs: each task's files,
# and per label name the string its files hold (0/1 where GLUE's own files write numbers, WNLI's
# entailment included; the label names for the NLI tasks but WNLI). None: STS-B's score.
GLUE_SERVER = {
    "cola": ({"CoLA.tsv"}, {"unacceptable": "0", "acceptable": "1"}),
    "sst2": ({"SST-2.tsv"}, {"negative": "0", "positive": "1"}),
    "mrpc": ({"MRPC.tsv"}, {"not_equivalent": "0", "equivalent": "1"}),
    "qqp": ({"QQP.tsv"}, {"not_duplicate": "0", "duplicate": "1"}),
    "stsb": ({"STS-B.tsv"}, None),
    "mnli": ({"MNLI-m.tsv", "MNLI-mm.tsv", "AX.tsv"},
             {"entailment": "entailment", "neutral": "neutral", "contradiction": "contradiction"}),
    "qnli": ({"QNLI.tsv"}, {"entailment": "entailment", "not_entailment": "not_entailment"}),
    "rte": ({"RTE.tsv"}, {"entailment": "entailment", "not_entailment": "not_entailment"}),
    "wnli": ({"WNLI.tsv"}, {"not_entailment": "0", "entailment": "1"}),
}
STSB_OUTPUTS = [-0.8, 0.4, 2.0, 3.1, 5.7, 4.2, 1.15, -0.2]  # two below 0, one above 5


def _test_files(subset: str, tmp_path: Path) -> tuple[Glue, dict[str, list[str]]]:
    """The task reading GLUE's own test file where the shared data has it, else a small one in its
    layout (index column, text columns) with indexes out of order; -> (task, {server file: indexes})."""
    from toolkit.tasks import data_root
    from toolkit.tasks.glue import SPECS

    spec, real = SPECS[subset], data_root(None) / "glue" / SPECS[subset].folder
    if all((real / name).is_file() for name in spec.submissions):
        task = Glue(subset=subset)
    else:
        task = Glue(subset=subset, data_dir=str(tmp_path))
        columns = spec.test_columns or spec.columns
        first = "id" if subset == "qqp" else "index"
        for n, name in enumerate(spec.submissions):
            path = tmp_path / "glue" / spec.folder / name
            path.parent.mkdir(parents=True, exist_ok=True)
            rows = [[str(i), *[f"Text {i} of {c}." for c in columns]] for i in (7, 3, 11 + n, 0, 5, 2, 9, 4)]
            path.write_text("\n".join("\t".join(r) for r in [[first, *columns], *rows]) + "\n")
    indexes = {}
    for name, submission in spec.submissions.items():
        path = Path(os.path.normpath((task.data_dir and Path(task.data_dir) / "glue" / spec.folder or real) / name))
        lines = [line.split("\t") for line in path.read_text(encoding="utf-8-sig").splitlines() if line]
        indexes[submission] = [row[0] for row in lines[1:]]
    return task, indexes


@pytest.mark.parametrize("subset", sorted(GLUE_SERVER))
def test_every_tasks_submission_is_the_file_glues_server_reads(tmp_path: Path, subset: str) -> None:
    """--glue-test for each of the nine tasks: the server's file names (MNLI's three with AX), the
    `index<TAB>prediction` header, one row per test row with its index in the test file's order,
    and each predicted label as GLUE's files write it (WNLI 0/1 although its labels are named as
    RTE's, which writes the names), STS-B's score with three decimals clipped to 0..5."""
    task, indexes = _test_files(subset, tmp_path)
    files, strings = GLUE_SERVER[subset]
    names = task.label_names
    if strings is None:
        task.classify = lambda model, tok, rows: [{"score": STSB_OUTPUTS[i % len(STSB_OUTPUTS)]} for i in range(len(rows))]
    else:
        task.classify = lambda model, tok, rows: [{"label": names[i % len(names)]} for i in range(len(rows))]
    written = {p.name: p.read_text().splitlines() for p in task.submission(lambda: (None, None), tmp_path / "sub")}
    assert set(written) == files == set(indexes)
    for name, lines in written.items():
        assert lines[0] == "index\tprediction"
        rows = [line.split("\t") for line in lines[1:]]
        assert [r[0] for r in rows] == indexes[name] and len(rows) > 0
        if strings is None:
            assert [r[1] for r in rows[:8]] == ["0.000", "0.400", "2.000", "3.100", "5.000", "4.200", "1.150", "0.000"]
        else:
            assert [r[1] for r in rows] == [strings[names[i % len(names)]] for i in range(len(rows))]


def test_stsb_dev_scores_the_unclipped_outputs_and_the_submission_clips() -> None:
    """STS-B's dev Pearson and Spearman are scipy's on the model's outputs as they are, as run_glue
    and evaluate's GLUE metric compute them (no clipping to the labels' 0..5), where --glue-test
    writes them clipped (test_every_tasks_submission_is_the_file_glues_server_reads): the two
    differ where outputs leave 0..5, and the dev number is run_glue's."""
    from scipy.stats import pearsonr, spearmanr

    preds, labels = np.array(STSB_OUTPUTS), np.array([0.2, 0.0, 2.4, 3.0, 4.6, 4.8, 1.0, 0.6])
    got = Glue(subset="stsb").compute_metrics(preds, labels)
    assert got == pytest.approx({"pearson": pearsonr(preds, labels)[0], "spearmanr": spearmanr(preds, labels)[0]})
    clipped = np.clip(preds, 0.0, 5.0)
    assert abs(got["pearson"] - pearsonr(clipped, labels)[0]) > 1e-3
    assert abs(got["spearmanr"] - spearmanr(clipped, labels)[0]) > 1e-3


# Two rows of GLUE's leaderboard (test server; percent), its score as printed beside them: MRPC and
# QQP F1/accuracy, STS-B Pearson/Spearman, MNLI-m and MNLI-mm. The score is the mean over nine task
# scores, MNLI's the mean of its two splits (counted as two tasks, BERT-large's would be 81.1).
LEADERBOARD = {
    "BERT-large": (80.5, {"cola": 60.5, "sst2": 94.9, "mrpc": (89.3, 85.4), "stsb": (87.6, 86.5), "qqp": (72.1, 89.3),
                          "mnli": (86.7, 85.9), "qnli": 92.7, "rte": 70.1, "wnli": 65.1}),
    "BERT-base": (78.3, {"cola": 52.1, "sst2": 93.5, "mrpc": (88.9, 84.8), "stsb": (87.1, 85.8), "qqp": (71.2, 89.2),
                         "mnli": (84.6, 83.4), "qnli": 90.5, "rte": 66.4, "wnli": 65.1}),
}


@pytest.mark.parametrize("row", sorted(LEADERBOARD))
def test_the_glue_average_reproduces_the_leaderboards_score(row: str) -> None:
    from toolkit.reports.glue import glue_average, official, task_score

    printed, numbers = LEADERBOARD[row]
    keys = {"mrpc": ("f1", "accuracy"), "qqp": ("f1", "accuracy"), "stsb": ("pearson", "spearmanr"),
            "mnli": ("accuracy", "accuracy_mm")}
    evals = {t: dict(zip(keys[t], v)) if isinstance(v, tuple) else dict(zip(official(t), [v])) for t, v in numbers.items()}
    assert all(sorted(evals[t]) == sorted(official(t)) for t in evals)
    assert round(glue_average({t: task_score(e, t) for t, e in evals.items()}), 1) == printed
