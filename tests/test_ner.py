"""`ner`: CoNLL files read sentence by sentence, tags on first sub-tokens, seqeval's entity-level
scores against hand-worked cases, exact resume, and the task's own head and prediction path."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import torch
import pytest

from conftest import SHARED, write_recipe
from test_adalora_dora import resumed_and_uninterrupted
from toolkit.errors import UserError
from toolkit.methods import METHODS
from toolkit.tasks.ner import CONLL_TAGS, IGNORE, Ner, align_labels, entity_scores, read_conll

RECIPE = """model: {{checkpoint: bert-base-uncased}}
task: {{name: ner, max_length: 32}}
method: {method}
train: {{epochs: 1, lr: 1.0e-3, batch_size: 4, seed: 7, keep_best: false}}
"""


def test_conll_files_read_sentence_by_sentence(tmp_path: Path) -> None:
    file = tmp_path / "x.txt"
    file.write_text("-DOCSTART- O\n\nEU B-ORG\nrejects O\n\n\nPeter B-PER\nBlackburn I-PER\n")
    read = read_conll(file)
    assert (read.tokens, read.tags, read.lines) == ([["EU", "rejects"], ["Peter", "Blackburn"]],
                                                    [["B-ORG", "O"], ["B-PER", "I-PER"]], [[3, 4], [7, 8]])
    assert Ner(train_file=None, eval_file=str(file)).load()["eval"][""]["tags"] == [[3, 0], [1, 2]]
    real = SHARED / "data" / "ner" / "conll2003"
    assert [len(read_conll(real / f).tokens) for f in ("train.txt", "valid.txt")] == [14041, 3250]


@pytest.mark.parametrize("content, message", [
    ("EU B-ORG\nrejects B-FOO\n", "x.txt:2: tag 'B-FOO' is not one of task.labels"),
    ("EU B-ORG\nrejects\n", "x.txt:2: expected 'token TAG', got 'rejects'"),
    ("-DOCSTART- -X- O\n\n", "x.txt: holds no sentences"),
    ("\n\n", "x.txt: the file is empty"),  # whitespace only: the shared reader's byte scan
])
def test_bad_files_are_one_line_naming_the_line(tmp_path: Path, content: str, message: str) -> None:
    file = tmp_path / "x.txt"
    file.write_text(content)
    with pytest.raises(UserError, match=message):
        Ner(train_file=None, eval_file=str(file)).load()


# --- issue 37 rule 4: tag schemes are checked, not assumed -----------------------------------
@pytest.mark.parametrize("content, scheme, message", [
    # plain types: seqeval would read PER as prefix P + type ER (and ORG as O, outside)
    ("Peter PER\nsaid O\n", "auto", r"x.txt:1: tag 'PER' has no B-/I- prefix, so entity scoring would read "
                                     r"it as prefix 'P' \+ type 'ER'; write BIO tags \(B-PER .*I-PER"),
    ("EU B-ORG\nsaid O\n\nParis U-LOC\n", "auto", r"x.txt:4: tag 'U-LOC' has prefix 'U'; BILOU's U-: write IOBES's S-"),
    ("EU S-ORG\n", "IOB2", r"x.txt:1: tag 'S-ORG' has prefix 'S'; the IOB2 prefixes are B, I"),
    ("EU O\nPeter I-PER\n", "IOB2", r"x.txt:2: 'I-PER' after 'O' is not IOB2: an entity starts with B-PER"),
    ("Peter B-PER\nParis I-LOC\n", "IOB2", r"x.txt:2: 'I-LOC' after 'B-PER' is not IOB2"),
    ("Peter B-PER\nsaid O\n", "IOB1", r"x.txt:1: 'B-PER' after the sentence's start is not IOB1: an entity starts with I-PER"),
    ("Peter B-PER\nsaid O\n\nParis S-LOC\n", "auto", r"x.txt:2: 'O' after 'B-PER' is not IOBES: the PER entity "
                                                      r"opened by B-PER must continue with I-PER or end with E-PER"),
    ("New B-LOC\nYork I-LOC\n", "IOBES", r"x.txt:2: the sentence's end after 'I-LOC' is not IOBES"),
])
def test_tags_outside_the_scheme_are_one_line_naming_file_line_and_fix(
        tmp_path: Path, content: str, scheme: str, message: str) -> None:
    file = tmp_path / "x.txt"
    file.write_text(content)
    task = Ner(train_file=None, eval_file=str(file), labels=None, scheme=scheme)
    task.check()
    with pytest.raises(UserError, match=message):
        task.load()


@pytest.mark.parametrize("content, scheme", [
    ("EU B-ORG\nrejects O\nPeter B-PER\nBlackburn I-PER\n", "IOB2"),
    ("EU I-ORG\nrejects O\nPeter I-PER\nBlackburn I-PER\nMary B-PER\n", "IOB1"),
    ("EU S-ORG\nrejects O\nPeter B-PER\nvan I-PER\nBlackburn E-PER\n", "IOBES"),
])
def test_each_scheme_is_found_and_recorded(tmp_path: Path, content: str, scheme: str) -> None:
    file = tmp_path / "x.txt"
    file.write_text(content)
    task = Ner(train_file=None, eval_file=str(file), labels=None)
    task.load()
    assert task.metric_info() == {"tag_scheme": scheme, "entity_scoring": "seqeval default mode (conlleval), not strict"}
    assert task.label_names[0] == "O" and set(task.label_names) == set(content.split()[1::2])


SCHEME_FILES = {  # one file of each scheme, the same two entities (ORG, PER) in each
    "IOB2": [(["EU", "rejects", "Peter", "Blackburn"], ["B-ORG", "O", "B-PER", "I-PER"])],
    "IOB1": [(["EU", "rejects", "Peter", "Blackburn"], ["I-ORG", "O", "I-PER", "I-PER"])],
    "IOBES": [(["EU", "rejects", "Peter", "Blackburn"], ["S-ORG", "O", "B-PER", "E-PER"])],
}


def write_sentences(path: Path, sentences: list[tuple[list[str], list[str]]]) -> Path:
    """CoNLL (`.txt`) or JSONL (`.jsonl`) by the path's suffix."""
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps({"tokens": w, "ner_tags": t}) + "\n" for w, t in sentences))
    else:
        path.write_text("".join("".join(f"{w} {t}\n" for w, t in zip(*s)) + "\n" for s in sentences))
    return path


@pytest.mark.parametrize("suffix", [".txt", ".jsonl"])
@pytest.mark.parametrize("train, dev", [("IOB2", "IOB1"), ("IOB1", "IOB2"), ("IOBES", "IOB2"), ("IOB1", "IOBES")])
@pytest.mark.parametrize("scheme", ["auto", "IOB1", "IOB2", "IOBES"])
def test_files_in_different_schemes_are_one_line_naming_each(tmp_path: Path, suffix: str, train: str, dev: str,
                                                             scheme: str) -> None:
    """Finding: a Hub-derived IOB2 train file beside CoNLL-2003's original IOB1 test file was
    refused at the first tag of one file that broke the other's scheme, ending "(or set
    task.scheme to the file's scheme)": no setting passes both files (each is refused in the other
    one's scheme). The line names each file's scheme and the tag that shows it, whatever
    task.scheme is; files of one scheme, or a file without entities beside any, still load."""
    files = {split: write_sentences(tmp_path / f"{split}{suffix}", SCHEME_FILES[name])
             for split, name in (("train", train), ("eval", dev))}
    task = Ner(train_file=str(files["train"]), eval_file=str(files["eval"]), labels=None, scheme=scheme)
    if scheme in ("IOB1", "IOB2") and "IOBES" in (train, dev):  # S-/E- tags: refused by their prefix first
        with pytest.raises(UserError, match=f"has prefix '[SE]'; the {scheme} prefixes are B, I"):
            task.load()
        return
    with pytest.raises(UserError) as raised:
        task.load()
    said = str(raised.value)
    assert f"the train file is {train} ({files['train']}" in said, said
    assert f"the eval file is {dev} ({files['eval']}" in said and "whatever task.scheme says" in said, said
    assert "or set task.scheme" not in said and "\n" not in said
    for name in (train, dev):  # one scheme throughout, or no entity in the other file: loads
        write_sentences(files["eval"], SCHEME_FILES[name])
        write_sentences(files["train"], SCHEME_FILES[name] + [(["it", "rained"], ["O", "O"])])
        task = Ner(train_file=str(files["train"]), eval_file=str(files["eval"]), labels=None)
        task.load()
        assert task.metric_info()["tag_scheme"] == name
    write_sentences(files["eval"], [(["it", "rained"], ["O", "O"])])
    task = Ner(train_file=str(files["train"]), eval_file=str(files["eval"]), labels=None)
    task.load()
    assert task.metric_info()["tag_scheme"] == dev


MISWRITTEN_TAGS = {  # a tag the file means, written otherwise -> what the line says is right
    "0": "the tag outside entities is O (the capital letter); a number is a tag id only as a JSON number",
    "2": "a number is a tag id only as a JSON number in a JSON(L) file's tags, with task.labels naming the tags",
    "o": "the tag outside entities is O (the capital letter)",
    "b-per": "a prefix is a capital letter and '-': write B-per",
    "B_PER": "a prefix is a capital letter and '-': write B-PER",
    "I.PER": "a prefix is a capital letter and '-': write I-PER",
}


def _miswritten(where: str, tag: str, tmp_path: Path) -> Ner:
    """A task whose `where` (a CoNLL or JSONL train/eval file, or task.labels) holds `tag`."""
    good, bad = [["Peter", "B-PER"], ["said", "O"]], [["Peter", tag], ["said", "O"]]
    if where == "task.labels":
        return Ner(train_file=None, eval_file=None, labels=["O", tag, "B-PER"])
    files = {}
    for split in ("train", "eval"):
        rows = bad if where.endswith(split) else good
        if where.startswith("jsonl"):
            files[split] = tmp_path / f"{split}.jsonl"
            files[split].write_text(json.dumps({"tokens": [w for w, _ in rows], "ner_tags": [t for _, t in rows]}) + "\n")
        else:
            files[split] = tmp_path / f"{split}.txt"
            files[split].write_text("".join(f"{w} {t}\n" for w, t in rows))
    return Ner(train_file=str(files["train"]), eval_file=str(files["eval"]), labels=None)


@pytest.mark.parametrize("tag", sorted(MISWRITTEN_TAGS))
@pytest.mark.parametrize("where", ["conll train", "conll eval", "jsonl train", "jsonl eval", "task.labels"])
def test_a_miswritten_tag_is_told_how_it_is_written_right(tmp_path: Path, where: str, tag: str) -> None:
    """Finding: a tag without a B-/I- prefix was always told to be written as a plain type's BIO
    tags: `0` (zero for O) `write BIO tags (B-0 ...)`, a CoNLL file of tag ids `(B-2 ...)`, `b-per`
    `(B-b-per ...)`, `B_PER` `(B-B_PER ...)`; the line now says what is right, wherever the tag is."""
    with pytest.raises(UserError) as caught:
        task = _miswritten(where, tag, tmp_path)
        task.check()
        task.load()
    said = str(caught.value)
    assert f"tag '{tag}' has no B-/I- prefix" in said and f"; {MISWRITTEN_TAGS[tag]}" in said and "B-" + tag not in said
    if where != "task.labels":
        assert said.startswith(f"{tmp_path / where.split()[1]}.{where.split()[0].replace('conll', 'txt')}:")


@pytest.mark.parametrize("tag, right", [("B-PER ", "write 'B-PER'"), (" O", "write 'O'"), ("\tI-PER", "write 'I-PER'"),
                                        (" per ", "write BIO tags (B-per "),
                                        ("B-PER\n", "write 'B-PER'")])
@pytest.mark.parametrize("where", ["jsonl train", "jsonl eval", "task.labels"])
def test_a_tag_with_spaces_at_its_ends_is_told_to_drop_them(tmp_path: Path, where: str, tag: str, right: str) -> None:
    """Finding: a JSON tag or a task.labels entry with a space at an end ('B-PER ') was told to
    be written 'B-B-PER ' (a plain type's BIO advice). A CoNLL column holds no spaces."""
    with pytest.raises(UserError) as caught:
        task = _miswritten(where, tag, tmp_path)
        task.check()
        task.load()
    said = str(caught.value)
    assert f"tag {tag!r} has no B-/I- prefix" in said and f"; a tag holds no spaces at its ends: {right}" in said, said
    assert "B-" + tag not in said and "\n" not in said


def test_labels_without_prefixes_are_refused_with_the_recipe(tmp_path: Path, cli) -> None:
    """task.labels is checked with the recipe (no data read, no model loaded): exit 2, one line."""
    recipe = write_recipe(tmp_path / "r.yaml", RECIPE.format(method="{name: full}"))
    code, _, err = cli("run", recipe, "task.labels=[O,PER,LOC]", "--smoke", "--runs-dir", tmp_path / "runs")
    assert code == 2 and err.count("\n") == 1 and not (tmp_path / "runs").exists()
    assert "task.labels: tag 'PER' has no B-/I- prefix" in err and "(B-PER for an entity's first word" in err


def test_tags_go_to_first_sub_tokens(tiny_checkpoint) -> None:
    from toolkit import models

    tok = models.load_tokenizer(tiny_checkpoint("bert"))
    words, tags = ["Peter", "Blackburnshire", "said"], [1, 2, 0]
    enc = tok(words, is_split_into_words=True)
    labels = align_labels(enc.word_ids(), tags)
    pieces = tok.convert_ids_to_tokens(enc["input_ids"])
    assert len(pieces) > len(words) + 2  # the long name is split into sub-tokens
    firsts = [lab for piece, lab in zip(pieces, labels) if lab != IGNORE]
    assert firsts == tags and labels[0] == labels[-1] == IGNORE  # [CLS], [SEP]
    assert all(p.startswith("##") for p, lab in zip(pieces, labels) if lab == IGNORE and p not in ("[CLS]", "[SEP]"))


def test_entity_scores_as_seqeval_defines_them() -> None:
    """Worked by hand: an entity counts when its type and its whole span match."""
    # one of two entities right (PER), LOC predicted as ORG: P = R = F1 = 1/2; 3 of 4 tokens right
    s = entity_scores([["B-PER", "I-PER", "O", "B-LOC"]], [["B-PER", "I-PER", "O", "B-ORG"]])
    assert s == {"f1": 0.5, "precision": 0.5, "recall": 0.5, "accuracy": 0.75}
    # default (conlleval) mode: an entity may start with I-
    assert entity_scores([["B-PER", "I-PER"]], [["I-PER", "I-PER"]])["f1"] == 1.0
    # a type change inside a span splits it: PER(0..1) is neither found nor predicted
    assert entity_scores([["B-PER", "I-PER"]], [["B-PER", "I-ORG"]])["f1"] == 0.0
    # a span cut short: 1 of 2 predicted entities right, 1 of 1 true -> P 1/2, R 1, F1 2/3
    s = entity_scores([["B-LOC", "I-LOC", "O"], ["B-PER", "O", "O"]], [["B-LOC", "O", "O"], ["B-PER", "O", "B-ORG"]])
    assert (s["precision"], s["recall"]) == (1 / 3, 1 / 2) and s["f1"] == pytest.approx(0.4)


@pytest.mark.parametrize("true, pred, undefined", [
    ([["O", "O"], ["O"]], [["O", "O"], ["O"]], {"f1", "precision", "recall"}),  # right everywhere, no entity
    ([["B-PER", "O"]], [["O", "O"]], {"precision"}),  # nothing predicted: recall 0, F1 0
    ([["O", "O"]], [["B-PER", "O"]], {"recall"}),  # nothing to find: precision 0, F1 0
    ([["B-PER", "O"]], [["B-PER", "O"]], set()),
])
def test_a_score_of_no_entity_is_undefined_never_zero(capsys, monkeypatch, true, pred, undefined) -> None:
    """Finding: seqeval's zero_division stand-in scored sentences without entities, tagged all O
    by the model, as F1 0.0, precision 0.0 and recall 0.0 (a model that found nothing, where it was
    right on every word), exit 0. A score whose denominator is 0 is NaN (null in metrics.json) with
    a warning, as a GLUE F1 of no positive anywhere is; defined scores stay seqeval's."""
    monkeypatch.setattr("toolkit.quiet._SAID", set())
    got = entity_scores(true, pred)
    assert {k for k, v in got.items() if np.isnan(v)} == undefined
    err = capsys.readouterr().err
    assert all(f"warning: {name} is undefined (" in err for name in undefined) and err.count("\n") == len(undefined)
    assert got["accuracy"] == np.mean([t == p for ts, ps in zip(true, pred) for t, p in zip(ts, ps)])
    assert all(got[k] in (0.0, 1.0) for k in {"f1", "precision", "recall"} - undefined)


def test_a_run_scored_on_sentences_without_entities_records_null(tmp_path: Path, cli, tiny_checkpoint) -> None:
    """Through the run (training's evaluation, metrics.json) and toolkit eval alike."""
    import toolkit

    train, dev = tmp_path / "train.txt", tmp_path / "dev.txt"
    train.write_text("EU B-ORG\nrejects O\n\nPeter B-PER\nsaid O\n\n" * 2)
    dev.write_text("the O\nend O\n\nit O\nrained O\n")
    recipe = write_recipe(tmp_path / "r.yaml", f"""model: {{checkpoint: {tiny_checkpoint('bert')}}}
task: {{name: ner, train_file: {train}, eval_file: {dev}, labels: null, max_length: 16}}
method: {{name: full}}
train: {{epochs: 1, batch_size: 4, keep_best: false}}
""")
    code, out, err = cli("run", recipe, "--runs-dir", tmp_path / "runs")
    assert code == 0, err
    (run,) = [p.parent for p in (tmp_path / "runs").rglob("metrics.json")]
    scores = json.loads((run / "metrics.json").read_text())["eval"]
    assert scores["recall"] is None and "warning: recall is undefined (no entity in the gold tags of 2 sentence(s))" in err
    assert (scores["f1"] is None) == (scores["precision"] is None)  # all O predicted: both undefined; else F1 0
    again = toolkit.evaluate(run)["eval"]
    assert again["recall"] is None and again["accuracy"] == scores["accuracy"]
    # toolkit eval on a file of another scheme (CoNLL-2003's original IOB1) than the run's IOB2 train file
    iob1 = tmp_path / "iob1.txt"
    iob1.write_text("EU I-ORG\nrejects O\n\nPeter I-PER\nsaid O\n")
    code, _, err = cli("eval", run, f"task.eval_file={iob1}")
    assert code == 2 and err.count("error:") == 1 and err.splitlines()[-1].startswith("error: the train file"), err
    assert f"the train file is IOB2 ({train}:1: 'B-ORG'" in err and f"the eval file is IOB1 ({iob1}:1: 'I-ORG'" in err
    assert not (run / "eval-eval.json").exists() or json.loads((run / "eval-eval.json").read_text())["eval"] == again
    _predict_untagged(run, cli, tmp_path)


def _predict_untagged(run: Path, cli, tmp_path: Path) -> None:
    """`toolkit predict` (CLI, API) on words the model does not tag: a word of no sub-token (U+FFFD
    to BERT's tokenizer) inside a sentence, and a sentence cut at task.max_length=16. Finding:
    `tagged` counted the words seen, so the uncut sentence said 2 of its 3 words were tagged and
    `tags[:tagged]` kept the untagged word's O and dropped 'rejects'' real tag. Now `tagged` is
    where the cut falls (cut sentences alone) and `no_token` lists the words of no sub-token."""
    from toolkit import api, models

    tok = models.load_tokenizer(str(run / "model"))
    short, long = ["EU", "\ufffd", "rejects"], ["EU", "\ufffd"] + ["word"] * 12 + ["\ufffd", "more", "words"]
    assert tok(short, is_split_into_words=True).word_ids() == [None, 0, 2, None]  # the word has no sub-token
    fits = 1 + max(w for w in tok(long, is_split_into_words=True, truncation=True, max_length=16).word_ids()
                   if w is not None)
    source = tmp_path / "untagged.jsonl"
    source.write_text(json.dumps({"tokens": short}) + "\n" + json.dumps({"tokens": long}) + "\n")
    code, _, err = cli("predict", run, "--input", source, "--output", tmp_path / "untagged-out.jsonl")
    assert code == 0, err
    rows = [json.loads(line) for line in (tmp_path / "untagged-out.jsonl").read_text().splitlines()]
    assert api.predict(run, [short, long]) == rows
    assert "tagged" not in rows[0] and rows[0]["no_token"] == [1] and rows[0]["tags"][1] == "O"
    assert rows[1]["tagged"] == fits < len(long) and rows[1]["no_token"] == [1, 14]
    assert all(t == "O" for t in rows[1]["tags"][fits:])
    import csv  # --output .json and .csv hold the same rows: `tagged` / `no_token` where a row has them
    for fmt in ("json", "csv"):
        path = tmp_path / f"untagged-out.{fmt}"
        code, _, err = cli("predict", run, "--input", source, "--output", path)
        assert code == 0, err
        if fmt == "json":
            assert json.loads(path.read_text()) == rows
            continue
        read = list(csv.DictReader(path.open(newline="")))
        assert [{k: json.loads(v) for k, v in r.items() if v != ""} for r in read] == rows


def test_score_reads_every_gold_word() -> None:
    """A sentence is scored on all its gold words: the prediction at each word's first sub-token
    (`word_index`), `O` for a word the model never saw (cut off, or no sub-token). Finding: words
    past task.max_length were dropped from gold and prediction alike, as in run_ner: an entity
    after the cut was neither missed nor counted."""
    task = Ner()
    per, i_per, o, loc = (CONLL_TAGS.index(t) for t in ("B-PER", "I-PER", "O", "B-LOC"))
    raw = {"tags": [[per, i_per, o, loc, loc], [loc, o, per]]}
    # sentence 1 cut after its third word (B-LOC, B-LOC unseen); sentence 2's middle word has no sub-token
    words = np.array([[IGNORE, 0, 1, IGNORE, 2, IGNORE], [IGNORE, 0, IGNORE, 2, IGNORE, IGNORE]])
    preds = np.array([[o, per, i_per, o, o, per], [loc, loc, IGNORE, per, IGNORE, IGNORE]])
    expected = entity_scores([["B-PER", "I-PER", "O", "B-LOC", "B-LOC"], ["B-LOC", "O", "B-PER"]],
                             [["B-PER", "I-PER", "O", "O", "O"], ["B-LOC", "O", "B-PER"]])
    assert task.score({"preds": preds, "word_index": words}, raw) == expected
    assert expected["recall"] == 0.6 and expected["precision"] == 1.0  # the cut LOCs are missed


def test_a_bpe_ner_run_scores_cut_sentences_alike_at_every_entry_point(tmp_path: Path, cli, capsys) -> None:
    """One rule at every entry point: the run's eval, `toolkit eval` and `toolkit predict`'s tags
    (scored here by hand) agree on sentences cut at task.max_length, with the cut words counted
    as predicted O; the warning counts the words the model never sees, checked against the
    tokenizer read whole, at predict too (CLI and API: its cuts went unsaid, exit 0). The run is
    RoBERTa's: its saved tokenizer reads words as running text."""
    from toolkit import api, models

    names = ["Peter", "Blackburn", "visited", "Zürich", "and", "Geneva", "with", "the", "EU", "team"]
    tags = ["B-PER", "I-PER", "O", "B-LOC", "O", "B-LOC", "O", "O", "B-ORG", "O"]
    sentences = [(names * k, tags * k) for k in (1, 2, 3, 1)]  # the longer ones run past 16 tokens
    conll = lambda rows: "".join("".join(f"{w} {t}\n" for w, t in zip(*r)) + "\n" for r in rows)
    (tmp_path / "train.txt").write_text(conll(sentences[:1] * 4))
    (tmp_path / "eval.txt").write_text(conll(sentences))
    recipe = write_recipe(tmp_path / "r.yaml", RECIPE.format(method="{name: full}").replace("bert-base-uncased", "roberta-base"))
    code, _, err = cli("run", recipe, "--smoke", "--runs-dir", tmp_path / "runs", "train.max_steps=2",
                       "task.max_length=16", f"task.train_file={tmp_path / 'train.txt'}",
                       f"task.eval_file={tmp_path / 'eval.txt'}")
    assert code == 0, err
    run = next((tmp_path / "runs").rglob("metrics.json")).parent
    tok = models.load_tokenizer(str(run / "model"))  # what predict loads
    assert models.words_read_as_text(tok)
    unseen = 0
    for words, _ in sentences:
        firsts = {w: i for i, w in reversed(list(enumerate(tok(words, is_split_into_words=True).word_ids())))
                  if w is not None}
        unseen += sum(firsts[w] > 16 - 2 for w in range(len(words)))  # [CLS] .. [SEP] in 16
    assert unseen > 0 and f"warning: {unseen} of {40 + 70} words are never seen by the model" in err  # 40 train + 70 eval
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"tokens": w}) + "\n" for w, _ in sentences))
    code, _, err = cli("predict", run, "--input", source, "--output", tmp_path / "out.jsonl")
    assert code == 0, err
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [len(r["tags"]) for r in rows] == [len(w) for w, _ in sentences]  # every word tagged
    cut = sum(len(tok(words, is_split_into_words=True)["input_ids"]) > 16 for words, _ in sentences)
    said = [f"warning: {unseen} of 70 words are never seen by the model", "): tagged O\n",
            f"warning: {cut} of 4 sentences cut at task.max_length=16 tokens"]
    assert all(line in err for line in said), err  # predict says its cuts as the run does
    assert api.predict(run, [w for w, _ in sentences]) == rows
    api_err = capsys.readouterr().err
    assert all(line in api_err for line in said), api_err
    by_hand = entity_scores([t for _, t in sentences], [r["tags"] for r in rows])
    ran = json.loads((run / "metrics.json").read_text())["eval"]
    assert {k: ran[k] for k in by_hand} == pytest.approx(by_hand)
    code, _, err = cli("eval", run)
    assert code == 0, err
    assert json.loads((run / "eval-eval.json").read_text())["eval"] == pytest.approx(ran)
    seen = [r.get("tagged", len(r["tags"])) for r in rows]
    head_only = entity_scores([t[:n] for (_, t), n in zip(sentences, seen)], [r["tags"][:n] for r, n in zip(rows, seen)])
    assert head_only != by_hand  # what scoring the seen words alone (run_ner) would have said

    # an export's line says how a word's tag is read (the folder tags every sub-token): followed in
    # plain transformers, it gives predict's tags (transformers' pipeline, as loaded, tags each sub-token)
    import torch
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    note = api.export(run, tmp_path / "out", merge=False)
    assert "a word's tag is the one at its first sub-token" in note and 'aggregation_strategy="first"' in note, note
    plain_tok = AutoTokenizer.from_pretrained(tmp_path / "out")
    plain = AutoModelForTokenClassification.from_pretrained(tmp_path / "out").eval()
    for (words, _), row in zip(sentences, rows):
        enc = plain_tok(words, is_split_into_words=True, truncation=True, return_tensors="pt")
        with torch.no_grad():
            ids = plain(**enc).logits[0].argmax(-1).tolist()
        first = {w: i for i, w in reversed(list(enumerate(enc.word_ids()))) if w is not None}
        assert [plain.config.id2label[ids[first[w]]] if w in first else "O" for w in range(len(words))] == row["tags"]


@pytest.mark.parametrize("family", ["bert", "roberta", "gpt2", "bart", "t5"])
def test_words_tokenize_as_in_running_text(tiny_checkpoint, family: str) -> None:
    """Byte-level BPE tokenizers read each word of a list as if it began the text ('rejects',
    not 'Ġrejects') unless loaded with add_prefix_space: tokens pretraining seldom saw."""
    from toolkit import models

    words = ["EU", "rejects", "German", "call", "to", "boycott", "Brötchen", "."]
    sentence = " ".join(words)
    tok = models.load_tokenizer(tiny_checkpoint(family), words=True)
    as_list = tok(words, is_split_into_words=True, add_special_tokens=False)["input_ids"]
    assert as_list == tok(sentence, add_special_tokens=False)["input_ids"]
    if family in ("roberta", "gpt2", "bart"):  # the default load is the case the rule is for
        plain = models.load_tokenizer(tiny_checkpoint(family))
        assert plain(words, is_split_into_words=True, add_special_tokens=False)["input_ids"] != \
            plain(sentence, add_special_tokens=False)["input_ids"]


# LoRA on NER resumes in tests/test_resume_rules.py (every task, its shipped recipe); full here
@pytest.mark.parametrize("method, stop_after", [("{name: full}", 1)])
def test_ner_resumed_run_equals_uninterrupted(tmp_path: Path, cli, method: str, stop_after: int) -> None:
    recipe = write_recipe(tmp_path / "r.yaml", RECIPE.format(method=method))
    common = ["--smoke", "task.max_train_samples=16", "task.max_eval_samples=16", "train.max_steps=4",
              "train.log_every=1"]
    a, _ = resumed_and_uninterrupted(tmp_path, cli, recipe, stop_after, common)
    metrics = json.loads((a / "metrics.json").read_text())
    assert set(metrics["eval"]) == {"f1", "precision", "recall", "accuracy", "loss"}
    assert metrics["main_metric"] == "f1"


def test_predict_splits_words_as_the_training_reader_does(tmp_path: Path, cli) -> None:
    """One word rule: a CoNLL line's token 'New\u00a0York' is one word, so predict's text inputs
    (a plain-text line, a JSONL string, the API's string) split at spaces and tabs alone and tag
    it once, as a list of the same words is tagged; a blank word is one line, exit 2, at every
    entry point (str.split made it two words and two tags, exit 0)."""
    from toolkit import api

    words = ["Peter", "visited", "New\u00a0York", "\u3000Tokyo"]
    (tmp_path / "train.txt").write_text("Peter B-PER\nvisited O\nNew\u00a0York B-LOC\n\u3000Tokyo B-LOC\n\n" * 4)
    assert read_conll(tmp_path / "train.txt").tokens[0] == words
    recipe = write_recipe(tmp_path / "r.yaml", RECIPE.format(method="{name: full}"))
    code, _, err = cli("run", recipe, "--smoke", "--runs-dir", tmp_path / "runs", "train.max_steps=1",
                       f"task.train_file={tmp_path / 'train.txt'}", f"task.eval_file={tmp_path / 'train.txt'}")
    assert code == 0, err
    run = next((tmp_path / "runs").rglob("metrics.json")).parent
    text = "Peter  visited\tNew\u00a0York \u3000Tokyo"
    (tmp_path / "in.txt").write_text(text + "\n")
    (tmp_path / "in.jsonl").write_text(json.dumps({"tokens": text}) + "\n")
    (tmp_path / "list.jsonl").write_text(json.dumps({"tokens": words}) + "\n")
    rows = []
    for source in ("in.txt", "in.jsonl", "list.jsonl"):
        code, _, err = cli("predict", run, "--input", tmp_path / source, "--output", tmp_path / f"out-{source}.jsonl")
        assert code == 0, err
        rows += [json.loads(line) for line in (tmp_path / f"out-{source}.jsonl").read_text().splitlines()]
    rows += api.predict(run, [text, words])
    assert [r["tokens"] for r in rows] == [words] * 5
    assert all(len(r["tags"]) == 4 and r["tags"] == rows[0]["tags"] for r in rows)
    (tmp_path / "bad.jsonl").write_text(json.dumps({"tokens": "Peter \u200b visited"}) + "\n")
    code, _, err = cli("predict", run, "--input", tmp_path / "bad.jsonl", "--output", tmp_path / "bad-out.jsonl")
    assert code == 2 and "predict: input 0: 'tokens' word 2 ('\\u200b') is blank" in err
    assert not (tmp_path / "bad-out.jsonl").exists()
    with pytest.raises(UserError, match="input 1: 'tokens' word 2 .* is blank"):
        api.predict(run, [words, ["Peter", "\u00a0"]])
    # a CoNLL file (as training reads it, -DOCSTART- and all) is sentences of its first column, not a
    # sentence per 'word TAG' line ('Peter B-PER' tagged as two words, exit 0); plain lines stay lines
    (tmp_path / "test.txt").write_text("-DOCSTART- O\n\n" + (tmp_path / "train.txt").read_text())
    (tmp_path / "plain.txt").write_text("Peter visited\nTokyo today\n")
    for source, expect, note in (("test.txt", [words] * 4, "read as a CoNLL file"),
                                 ("plain.txt", [["Peter", "visited"], ["Tokyo", "today"]], None)):
        code, _, err = cli("predict", run, "--input", tmp_path / source, "--output", tmp_path / "conll-out.jsonl")
        assert code == 0 and (note in err if note else "CoNLL" not in err), err
        out = [json.loads(line) for line in (tmp_path / "conll-out.jsonl").read_text().splitlines()]
        assert [r["tokens"] for r in out] == expect and all(len(r["tags"]) == len(r["tokens"]) for r in out)


def test_labels_must_hold_o_once(tmp_path: Path, cli) -> None:
    recipe = write_recipe(tmp_path / "r.yaml", RECIPE.format(method="{name: full}"))
    code, _, err = cli("run", recipe, "--smoke", "--runs-dir", tmp_path / "runs", "task.labels=[B-PER,B-PER,O]")
    assert code == 2 and err.count("error:") == 1 and "task.labels: 'B-PER' is listed twice" in err, err


@pytest.mark.parametrize("records, settings, expected", [
    ([{"tokens": ["Peter", "said"], "ner_tags": ["B-PER", "O"]}], {}, [[1, 0]]),
    ([{"words": ["Peter", "said"], "tags": [1, 0]}], {"labels": ["O", "B-PER", "I-PER"]}, [[1, 0]]),
    ([{"id": 3, "w": ["Peter", "said"], "t": ["B-PER", "O"]}], {"tokens_field": "w"}, [[1, 0]]),
])
def test_jsonl_sentences_with_their_fields_inferred(tmp_path: Path, records: list, settings: dict, expected: list) -> None:
    file = tmp_path / "x.jsonl"
    file.write_text("".join(json.dumps(r) + "\n" for r in records))
    task = Ner(train_file=None, eval_file=str(file), **{"labels": None, **settings})
    assert task.load()["eval"][""]["tags"] == expected


@pytest.mark.parametrize("record, settings, message", [
    ({"a": ["Peter"], "b": ["B-PER"], "c": ["x"]}, {},
     r"task.tokens_field: .*x.jsonl has no 'tokens' field \(candidates: 'a', 'b', 'c'; .*set task.tokens_field"),
    ({"tokens": ["Peter", "said"], "ner_tags": ["B-PER"]}, {}, r"x.jsonl:1: 'ner_tags' holds 1 tags for 2 words"),
    ({"tokens": ["Peter"], "ner_tags": [1]}, {}, r"x.jsonl:1: tags are numbers; set task.labels"),
    ({"tokens": ["Peter"], "ner_tags": ["PER"]}, {}, r"x.jsonl:1: tag 'PER' has no B-/I- prefix"),
])
def test_bad_jsonl_sentences_are_one_line(tmp_path: Path, record: dict, settings: dict, message: str) -> None:
    file = tmp_path / "x.jsonl"
    file.write_text(json.dumps(record) + "\n")
    with pytest.raises(UserError, match=message):
        Ner(train_file=None, eval_file=str(file), labels=None, **settings).load()


@pytest.mark.parametrize("split", ["train_file", "eval_file"])
@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_tag_ids_are_ids_where_one_sentence_writes_a_whole_number_as_a_fraction(tmp_path: Path, suffix: str,
                                                                                split: str) -> None:
    """Finding: JSON has one number type, and one tag id written `0.0` anywhere in a file made the
    reader hold every sentence's tags as doubles: the first sentence, written `[1, 2, 0]`, was
    refused as "tags should be text (B-PER) or numbers". A whole number is the id it names, in a
    train or an eval file, a JSON list or JSONL; a fraction is still no id."""
    records = [{"tokens": ["Peter", "Blackburn", "said"], "ner_tags": [1, 2, 0]},
               {"tokens": ["EU", "rejects"], "ner_tags": [1, 0.0]}]
    file = tmp_path / f"x{suffix}"
    write = lambda rows: file.write_text(json.dumps(rows) if suffix == ".json" else  # noqa: E731
                                         "".join(json.dumps(r) + "\n" for r in rows))
    write(records)
    plain = tmp_path / "plain.jsonl"
    plain.write_text("".join(json.dumps({"tokens": ["Peter", "said"], "ner_tags": ["B-PER", "O"]}) + "\n" for _ in range(2)))
    files = {"train_file": str(plain), "eval_file": str(plain), split: str(file)}
    task = Ner(**files, labels=["O", "B-PER", "I-PER"])
    loaded = task.load()
    assert (loaded["train"] if split == "train_file" else loaded["eval"][""])["tags"] == [[1, 2, 0], [1, 0]]
    records[1]["ner_tags"] = [1, 0.5]
    write(records)
    with pytest.raises(UserError, match=rf"x{re.escape(suffix)}(:2|: record 2): tag 0.5 is not an id into task.labels"):
        Ner(**files, labels=["O", "B-PER", "I-PER"]).load()


@pytest.mark.parametrize("name", sorted(n for n in METHODS.names() if METHODS.get(n)().added_positions()))
def test_soft_prompts_leave_one_tag_per_sub_token(tiny_checkpoint, name: str) -> None:
    """Methods that add virtual positions: PEFT prepends the soft prompt, and the token
    classifier gives it logits too. Finding: `method=prompt_tuning` on ner stopped with a
    traceback in the loss (`Expected target size [8, 20], got [8, 16]`); the input's own
    positions are the last ones. Loss, eval outputs and predict line up with the words."""
    from datasets import Dataset

    from toolkit import models
    from toolkit.methods import Context

    task = Ner(max_length=16)
    path = tiny_checkpoint("bert")
    model, tok = models.load(path, "token-classification", task.head_kwargs(), "eager")
    method = METHODS.get(name)(num_virtual_tokens=4)
    model = method.apply(model, Context(model.config.model_type, models.head_names(model), "TOKEN_CLS", tok))
    words = [["Peter", "Blackburn", "visited", "Geneva"], ["EU", "rejects", "German", "call"] * 3]
    tags = [[1, 2, 0, 5], [3, 0, 7, 0] * 3]
    encoded = task.encode(Dataset.from_dict({"tokens": words, "tags": tags}), tok)
    batch = task.collator(tok)([encoded[i] for i in range(2)])
    with torch.no_grad():
        out = task.eval_step(model.eval(), batch)
    assert out["preds"].shape == batch["labels"].shape and torch.isfinite(out["loss"]).all()
    scores = task.score({k: v.numpy() for k, v in out.items()}, {"tags": tags})
    assert 0 <= scores["accuracy"] <= 1
    rows = task.predict(model, tok, [{"tokens": w} for w in words])
    assert [len(r["tags"]) for r in rows] == [len(w) for w in words]


@pytest.mark.parametrize("fmt", ["conll", "jsonl"])
def test_tags_that_differ_only_in_case_or_invisible_characters_are_said(tmp_path: Path, fmt: str) -> None:
    """Finding: `B-PER` beside `B-Per`, or beside `B-PER` with a zero-width space (one annotator's
    tool, a pasted tag), were two tags and two entity types that print alike: a right `PER` span
    scored wrong against the other, exit 0, without a word (classification labels alike were said).
    Said once, escaped, for the tags found in either file."""
    sentences = {"train": [(["John", "runs"], ["B-PER", "O"]), (["Mary", "walks"], ["B-Per", "O"])],
                 "eval": [(["Ann", "sits"], ["B-PER\u200b", "O"])]}
    files = {}
    for split, rows in sentences.items():
        path = tmp_path / f"{split}.{'txt' if fmt == 'conll' else 'jsonl'}"
        if fmt == "conll":
            path.write_text("".join("".join(f"{w} {t}\n" for w, t in zip(*row)) + "\n" for row in rows))
        else:
            path.write_text("".join(json.dumps({"tokens": row[0], "ner_tags": row[1]}) + "\n" for row in rows))
        files[split] = path
    task = Ner(train_file=str(files["train"]), eval_file=str(files["eval"]), labels=None)  # found in the files
    task.load()
    assert len(task.label_names) == 4  # as written: still their own tags
    assert list(task.notices().values()) == [
        f"{files['eval']}: entity type(s) 'PER\\u200b' appear in no sentence of {files['train']}: the model never "
        "learns them, and every one of their entities counts as missed in the scores",
        f"{files['train']}, {files['eval']}: 1 group(s) of tags differ only in case, spaces, Unicode form or invisible "
        "characters ('B-PER' / 'B-PER\\u200b' / 'B-Per'); each is its own tag (and entity type): write them alike if "
        "they are one"]


@pytest.mark.parametrize("labels, said", [
    (["O", "B-PER", "I-PER", "E-PER", "S-PER"], "E-PER, S-PER"),  # IOBES labels, IOB2 files: said
    (["O", "B-PER", "I-PER"], None),  # the files' own scheme: nothing said
])
def test_labels_of_a_scheme_the_files_lack_are_said(tmp_path: Path, labels: list[str], said: str | None) -> None:
    """Finding: task.labels in IOBES (S-/E-) beside IOB2 files: those classes were never trained
    and could still be predicted, exit 0 without a word. One line naming the tags and the scheme.
    (The reverse, IOB2 labels beside IOBES files, is refused at the file's first S- tag.)"""
    path = tmp_path / "train.txt"
    path.write_text("John B-PER\nSmith I-PER\nruns O\n\nMary B-PER\nwalks O\n")
    task = Ner(train_file=str(path), eval_file=str(path), labels=labels)
    task.check()
    task.load()
    lines = [v for v in task.notices().values() if "task.labels holds" in v]
    assert lines == ([f"task.labels holds {said}, not IOB2 tags, and the files ({path}, {path}) are IOB2: no file "
                      "holds them, so those classes are never trained, yet the model can predict them; drop them "
                      "from task.labels (or write the files in IOBES)"] if said else [])
    iobes = tmp_path / "iobes.txt"
    iobes.write_text("John B-PER\nSmith E-PER\nruns O\n\nMary S-PER\nwalks O\n")
    with pytest.raises(UserError, match="tag 'E-PER' is not one of task.labels"):
        Ner(train_file=str(iobes), eval_file=str(iobes), labels=["O", "B-PER", "I-PER"]).load()


@pytest.mark.parametrize("dev, said", [
    ("Paris B-LOC\nsleeps O\n\nAnn B-ORG\nCo I-ORG\n", "LOC, ORG"),  # types no training sentence holds
    ("Mary B-PER\nLee I-PER\nwalks O\n", None),  # a trained type: nothing said
])
def test_entity_types_only_the_eval_file_holds_are_said(tmp_path: Path, dev: str, said: str | None) -> None:
    """Finding: an entity type in the eval file and in no training sentence was added to the
    labels, never trained, and each of its entities scored as missed, exit 0 without a word."""
    train, held = tmp_path / "train.txt", tmp_path / "dev.txt"
    train.write_text("John B-PER\nSmith I-PER\nruns O\n")
    held.write_text(dev)
    task = Ner(train_file=str(train), eval_file=str(held), labels=None)
    task.check()
    task.load()
    lines = [v for v in task.notices().values() if "appear in no sentence" in v]
    assert lines == ([f"{held}: entity type(s) {said} appear in no sentence of {train}: the model never learns them, "
                      "and every one of their entities counts as missed in the scores"] if said else [])


@pytest.mark.parametrize("source", ["file", "stdin"])
def test_predict_reads_a_conll_file_with_tags_the_run_lacks_as_conll(tmp_path: Path, monkeypatch, capsys,
                                                                     source: str) -> None:
    """A CoNLL test file is sentences of its first column whatever its gold tags are: one whose last
    column held a type the run's model lacks (B-DRUG) was read as plain lines, each `word POS chunk
    TAG` line a sentence of four words tagged one by one, exit 0. Lines whose last word is not
    tag-shaped stay lines."""
    from toolkit import inference

    task = Ner(train_file=None, eval_file="unused", labels=["O", "B-ORG", "I-ORG"])
    conll = "-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\n\nAspirin NN B-NP B-DRUG\ndaily RB B-ADVP S-FREQ\n"
    plain = "Peter visited\nTokyo today\n"
    roads = "Route I-95\nBomber B-52\n"  # tag-shaped, but none of the run's tags: lines
    for content, expect, note in ((conll, [["EU", "rejects"], ["Aspirin", "daily"]],
                                   "its tags are not read (2 tag(s) not among this run's: B-DRUG, S-FREQ)"),
                                  (plain, [["Peter", "visited"], ["Tokyo", "today"]], None),
                                  (roads, [["Route", "I-95"], ["Bomber", "B-52"]], None)):
        file = tmp_path / "in.txt"
        file.write_text(content)
        if source == "stdin":
            monkeypatch.setattr("sys.stdin", file.open(encoding="utf-8"))
        rows, _ = inference._read_inputs("-" if source == "stdin" else str(file), ["tokens"], ("tokens",), task)
        words = [r["tokens"] if isinstance(r["tokens"], list) else Ner.words_of(r["tokens"], 0) for r in rows]
        err = capsys.readouterr().err
        assert words == expect and (note in err if note else "CoNLL" not in err), err
    # a -DOCSTART- line makes it CoNLL: words alone are sentences; a line it cannot read is one line
    bad = {"-DOCSTART-\n\nEU\nrejects\n\nAspirin\n": [["EU", "rejects"], ["Aspirin"]],
           "-DOCSTART- O\n\nEU B-ORG\nNew York B-LOC\n": r"in.txt:4: 3 columns where line 3 has 2; a file with -DOCSTART-",
           "-DOCSTART- -X- O\n\nEU NNP NNP\n": r"in.txt:3: the last column 'NNP' is not a tag"}
    for content, expect in bad.items():
        file = tmp_path / "in.txt"
        file.write_text(content)
        if source == "stdin":
            monkeypatch.setattr("sys.stdin", file.open(encoding="utf-8"))
        read = lambda: inference._read_inputs("-" if source == "stdin" else str(file), ["tokens"], ("tokens",), task)
        if isinstance(expect, list):
            assert [r["tokens"] for r in read()[0]] == expect
            assert "read as a CoNLL file (1 column, words alone): 2 sentences" in capsys.readouterr().err
        else:
            with pytest.raises(UserError, match=expect.replace("in.txt", "<stdin>" if source == "stdin" else "in.txt")):
                read()


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_the_export_line_names_the_pipeline_only_where_it_groups_the_runs_words(tiny_checkpoint, family: str) -> None:
    """An export's line named pipeline(aggregation_strategy="first") as grouping entities by the
    run's rule (a word's tag at its first sub-token) for every tokenizer: with BERT's WordPiece the
    pipeline cuts 'U.S.' into four words, each tagged at its own sub-token, and gave other entities
    than the run's, exit 0. Now the line promises it exactly where the pipeline's entities are the
    rule's (checked on a random model), and says otherwise where they are not."""
    from seqeval.metrics.sequence_labeling import get_entities
    from transformers import AutoModelForTokenClassification, pipeline

    from toolkit import models
    from toolkit.tasks.ner import PROBE_WORDS, first_words, word_tags

    tok = models.load_tokenizer(tiny_checkpoint(family), words=True)  # as the run saves it
    torch.manual_seed(0)
    model = AutoModelForTokenClassification.from_pretrained(
        tiny_checkpoint(family), num_labels=len(CONLL_TAGS), id2label=dict(enumerate(CONLL_TAGS)),
        label2id={t: i for i, t in enumerate(CONLL_TAGS)}).eval()
    words = ["Peter", *PROBE_WORDS, "visited", "New", "York"] * 2
    enc = tok(words, is_split_into_words=True, return_tensors="pt")
    with torch.no_grad():
        ids = model(**enc).logits[0].argmax(-1).tolist()
    tags = word_tags(ids, first_words(enc.word_ids(0)), len(words), CONLL_TAGS)
    starts = np.cumsum([0] + [len(w) + 1 for w in words])
    by_rule = [(kind, int(starts[a]), int(starts[b] + len(words[b]))) for kind, a, b in get_entities(tags)]
    found = pipeline("token-classification", model=model, tokenizer=tok, aggregation_strategy="first")(" ".join(words))
    by_pipeline = [(e["entity_group"], e["start"], e["end"]) for e in found]
    line = Ner().export_settings(tok)
    promised = 'aggregation_strategy="first") groups entities by that rule' in line
    assert promised == (by_pipeline == by_rule), (line, by_rule, by_pipeline)
    assert promised == (family != "bert"), line  # WordPiece splits a word at its punctuation
    if not promised:
        assert "'U.S.'" in line and "tag by the rule above" in line, line
