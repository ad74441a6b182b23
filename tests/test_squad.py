"""SQuAD: official normalisation and EM/F1 worked by hand, the v2.0 null threshold, windows and
span post-processing on hand-made contexts, and bad SQuAD files."""

from __future__ import annotations

import collections
import csv
import functools
import json
import re
import string
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import ROOT, SHARED, shared_tokenizer, write_recipe
from toolkit.errors import UserError
from toolkit.tasks._qa import best_spans, window_features
from toolkit.tasks._text_metrics import (best_null_threshold, exact_match, normalize_answer, squad_scores,
                                         token_f1)
from toolkit.tasks.squad import read_squad, split_by_article


def test_normalisation_and_scores_worked_by_hand() -> None:
    assert normalize_answer("The  Cat, sat!") == "cat sat"
    assert normalize_answer("an apple a day") == "apple day"
    assert exact_match("the Denver Broncos", "Denver Broncos.") == 1.0
    # pred {cat, sat, on}, gold {cat, sat}: P = 2/3, R = 1, F1 = 2 * (2/3) / (5/3) = 0.8
    assert token_f1("the cat sat on", "a cat sat") == pytest.approx(0.8)
    assert token_f1("", "") == 1.0 and token_f1("x", "") == 0.0
    # the best over gold answers: second gold matches exactly
    scores = squad_scores(["Broncos", "1990"], [["Denver Broncos", "Broncos"], ["in 1991"]], "v1")
    assert scores == pytest.approx({"exact_match": 0.5, "f1": 0.5})  # (1 + 0) / 2 both
    # v2.0 adds the HasAns breakdown whenever a question is answerable, as its script does
    assert squad_scores(["Broncos", "1990"], [["Denver Broncos", "Broncos"], ["in 1991"]], "v2") == pytest.approx(
        {"exact_match": 0.5, "f1": 0.5, "HasAns_exact_match": 0.5, "HasAns_f1": 0.5})
    v2 = squad_scores(["", "paris", "x"], [[], ["Paris"], []])
    assert v2["HasAns_exact_match"] == 1.0 and v2["NoAns_exact_match"] == 0.5
    assert v2["exact_match"] == pytest.approx(2 / 3)


def test_best_null_threshold_worked_by_hand() -> None:
    # q0 answerable (answer F1 1.0, gap -2), q1 unanswerable (gap 1), q2 answerable (F1 0.5, gap 3)
    # all null: 1 right. Admit q0 (-2): 2.0; q1 (1): 1.0; q2 (3): 1.5 -> best 2.0 at threshold -2
    best, threshold = best_null_threshold([1.0, 0.0, 0.5], [-2.0, 1.0, 3.0], [True, False, True])
    assert best == pytest.approx(2 / 3) and threshold == -2.0


def test_null_threshold_starts_below_every_logit_gap() -> None:
    """Logit gaps can be negative: when answering nothing anywhere is best, the threshold is
    below every gap (every question gets ""): the largest whole number below them, not the
    official script's 0.0 (the floor of its probabilities), which would keep both answers here
    and score 0; where every gap is above 0.0, that is 0.0; below the largest finite float (a
    question with no span at all) too."""
    import sys

    # q0 answerable, its best span scores 0 (gap -1); q1 unanswerable, a non-empty span (gap -2)
    best, threshold = best_null_threshold([0.0, 0.0], [-1.0, -2.0], [True, False], [True, True])
    assert best == 0.5 and threshold == -3.0
    assert best_null_threshold([0.0, 0.0], [-1.5, 2.0], [True, False], [True, True]) == (0.5, -2.0)
    assert best_null_threshold([0.0], [0.25], [True], [True]) == (0.0, 0.0)
    _, threshold = best_null_threshold([0.0], [sys.float_info.max], [False], [False])
    assert threshold < sys.float_info.max
    # an unanswerable question whose best span is empty costs nothing when admitted
    best, threshold = best_null_threshold([1.0, 0.0], [-1.0, -2.0], [True, False], [True, False])
    assert best == 1.0 and threshold == -1.0


def test_golds_that_normalise_to_nothing_follow_each_official_script() -> None:
    # v1.1 keeps gold "the": EM compares "" with "" (1), F1 finds no common token (0)
    v1 = squad_scores([""], [["the"]], "v1")
    assert v1["exact_match"] == 1.0 and v1["f1"] == 0.0
    # v2.0 drops it from the golds, so "" is the right answer; the question stays HasAns, since
    # the official script's qid_to_has_ans is bool(qa['answers']): q0 "" vs [""] 1, q1 "the"
    # (normalises to "") vs ["Paris"] 0, q2 "x" vs [""] 0. All three HasAns, no NoAns key.
    v2 = squad_scores(["", "the", "x"], [["the"], ["the", "Paris"], ["."]], "v2")
    assert v2 == pytest.approx({"exact_match": 1 / 3, "f1": 1 / 3, "HasAns_exact_match": 1 / 3, "HasAns_f1": 1 / 3})
    # with a truly unanswerable question (no answers listed) beside it, NoAns holds only that one
    v2 = squad_scores(["", ""], [["the"], []], "v2")
    assert v2["HasAns_f1"] == 1.0 and v2["NoAns_f1"] == 1.0 and v2["f1"] == 1.0


# --- the official scripts' rules, written out here as a second reading of them --------------------
def _official_tokens(text: str) -> list[str]:
    """evaluate-v1.1.py / evaluate-v2.0.py's normalize_answer, then split."""
    text = text.lower().translate(str.maketrans("", "", string.punctuation))
    return re.sub(r"\b(a|an|the)\b", " ", text).split()


def _official_f1(gold: list[str], pred: list[str], v2: bool) -> float:
    if v2 and (not gold or not pred):  # v2.0 only: an empty side scores 1 when both are empty
        return float(gold == pred)
    same = sum((collections.Counter(gold) & collections.Counter(pred)).values())
    return 0.0 if not same else 2 * same / (len(pred) + len(gold))  # 2PR / (P + R)


def official_v1(golds: dict, preds: dict) -> dict:
    em = [max(float(_official_tokens(g) == _official_tokens(preds[q])) for g in gs) for q, gs in golds.items()]
    f1 = [max(_official_f1(_official_tokens(g), _official_tokens(preds[q]), False) for g in gs)
          for q, gs in golds.items()]
    return {"exact_match": sum(em) / len(em), "f1": sum(f1) / len(f1)}


def official_v2(golds: dict, preds: dict, na_probs: dict | None = None, thresh: float = 1.0) -> dict:
    """evaluate-v2.0.py: raw scores against the golds that normalise to something (else ""),
    the no-answer threshold applied by the file's has-answers, HasAns/NoAns where they have
    questions, and with an na_prob file the best threshold (starting at 0.0). Fractions."""
    raw: dict[str, dict] = {"exact": {}, "f1": {}}
    for q, gs in golds.items():
        kept = [g for g in gs if _official_tokens(g)] or [""]
        pred = _official_tokens(preds[q])
        raw["exact"][q] = max(float(_official_tokens(g) == pred) for g in kept)
        raw["f1"][q] = max(_official_f1(_official_tokens(g), pred, True) for g in kept)
    has = {q: bool(gs) for q, gs in golds.items()}
    na = na_probs or dict.fromkeys(golds, 0.0)
    out: dict[str, float] = {}
    for key, scores in raw.items():
        final = {q: float(not has[q]) if na[q] > thresh else s for q, s in scores.items()}
        out[key] = sum(final.values()) / len(final)
        for name, qs in (("HasAns", [q for q in golds if has[q]]), ("NoAns", [q for q in golds if not has[q]])):
            if qs:
                out[f"{name}_{key}"] = sum(final[q] for q in qs) / len(qs)
        if na_probs is not None:
            best = score = float(sum(not h for h in has.values()))
            out[f"best_{key}_thresh"] = 0.0
            for q in sorted(na, key=na.get):
                score += scores[q] if has[q] else (-1.0 if preds[q] else 0.0)
                if score > best:
                    best, out[f"best_{key}_thresh"] = score, na[q]
            out[f"best_{key}"] = best / len(golds)
    return out


def _toolkit_names(official: dict) -> dict:
    """The official keys under the toolkit's names (`exact` -> `exact_match`, best_* as they are)."""
    return {k.replace("exact", "exact_match") if not k.startswith("best") else k: v for k, v in official.items()}


# (golds as listed, best non-empty span, null score minus the span's score): "" when above 0.0
V2_CASES = {
    "mixed": [(["Paris"], "Paris", -1.0), (["Big Ben"], "Ben", -2.0), ([], "London", -0.5),
              ([], "x", 1.5), (["Eiffel Tower", "the tower"], "the eiffel tower.", 0.5)],
    # golds that normalise to nothing: the question is HasAns, and "" (or "the") is its right answer
    "empty golds": [(["the"], "x", 2.0), (["."], "the", -1.0), (["a", "Rome"], "an", -3.0),
                    ([], "The", -0.25), (["Oslo"], "Oslo", 0.75)],
    "all answerable": [(["Paris"], "Paris", -1.0), (["one two three"], "two three four", -0.5),
                       (["Nile"], "Amazon", 0.2)],
    "all unanswerable": [([], "x", 1.0), ([], "y", -1.0), ([], "z", 0.1)],
}


def _raw(golds: list[list[str]]):
    from datasets import Dataset

    context = " ".join(sorted({t for g in golds for t in g})) + " and more"  # holds every gold
    return Dataset.from_list([{"id": f"q{i}", "question": "?", "context": context,
                               "answers": {"text": g, "answer_start": [context.index(t) for t in g]}}
                              for i, g in enumerate(golds)])


@pytest.mark.parametrize("case", list(V2_CASES))
def test_v2_extractive_scores_equal_the_official_script(case: str, monkeypatch) -> None:
    """Squad.score (the training loop's, toolkit eval's and icl's entry) on crafted spans: its
    exact_match, f1, HasAns_*/NoAns_* are evaluate-v2.0.py's on the run's predictions ("" where
    the null score wins), its best_* the script's with --na-prob-file (thresholds below 0.0
    allowed). With the na_prob file at threshold 0 the script's own fixed-threshold figures differ
    in one place, its own: an abstention on a HasAns question whose every gold normalises to
    nothing scores 0 there and 1 on the predictions."""
    from toolkit.tasks._qa import Best
    from toolkit.tasks.squad import Squad

    rows = V2_CASES[case]
    golds = {f"q{i}": g for i, (g, _, _) in enumerate(rows)}
    spans = {f"q{i}": s for i, (_, s, _) in enumerate(rows)}
    gaps = {f"q{i}": gap for i, (_, _, gap) in enumerate(rows)}
    task = Squad(version="v2", mode="extractive")
    task._extractive = True
    monkeypatch.setattr(task, "spans", lambda outputs, raw: [Best(spans[q], 0.0, gaps[q]) for q in golds])
    got = task.score({}, _raw(list(golds.values())))

    predicted = {q: "" if gaps[q] > 0.0 else spans[q] for q in golds}
    plain = _toolkit_names(official_v2(golds, predicted))
    with_file = _toolkit_names(official_v2(golds, spans, gaps, thresh=0.0))
    assert {k: v for k, v in got.items() if not k.startswith("best")} == pytest.approx(plain)
    for key in ("best_exact", "best_f1"):
        assert got[key] == pytest.approx(with_file[key])
        # below every gap (answer nothing anywhere): the script starts at 0.0, its probabilities' floor
        low = got[f"{key}_thresh"] < min(gaps.values())
        assert got[f"{key}_thresh"] == (with_file[f"{key}_thresh"] if not low else got[f"{key}_thresh"])
        # the tuned threshold, given to the script as --na-prob-thresh, scores the tuned figure
        at = _toolkit_names(official_v2(golds, spans, gaps, thresh=got[f"{key}_thresh"]))
        assert got[key] == pytest.approx(at["exact_match" if key == "best_exact" else "f1"]) or case == "empty golds"
    odd = sum(gaps[q] > 0.0 and bool(golds[q]) and not any(_official_tokens(g) for g in golds[q]) for q in golds)
    assert got["exact_match"] - with_file["exact_match"] == pytest.approx(odd / len(golds))
    assert (odd > 0) == (case == "empty golds")


@pytest.mark.parametrize("entry", ["run and eval", "predict"])
@pytest.mark.parametrize("case", ["v1.1", *V2_CASES])
def test_the_answers_file_alone_gives_the_scores_and_the_best_span_pair_the_tuned_ones(
        case: str, entry: str, monkeypatch) -> None:
    """Finding: the run's and eval's predictions.answers.json held each question's best
    non-empty span beside na_prob.json, so evaluate-v2.0.py given the answers file alone (as
    SQuAD v2.0 predictions are scored, and as run_qa.py's predictions.json is read) scored the
    run as if it never abstained, exit 0. Every file named answers holds the answers the run
    scored ("" where it abstains): the official script on it alone gives the run's exact_match,
    f1 and HasAns/NoAns; the best spans and null scores go in best_spans.json / na_probs.json,
    which with --na-prob-thresh 0 give best_* (and the fixed-threshold scores but where the
    script's own rule differs). Over the run's and eval's files and predict's, v1.1 and v2.0."""
    from toolkit.tasks._qa import Best
    from toolkit.tasks.squad import Squad

    version = "v1" if case == "v1.1" else "v2"
    rows = V2_CASES["mixed"] if case == "v1.1" else V2_CASES[case]
    rows = [(g or ["x"], s, gap) for g, s, gap in rows] if version == "v1" else rows  # v1.1: every question answered
    golds = {f"q{i}": g for i, (g, _, _) in enumerate(rows)}
    bests = [Best(s, 0.0, gap) for _, s, gap in rows]
    task = Squad(version=version, mode="extractive")
    task._extractive = True
    monkeypatch.setattr(task, "spans", lambda outputs, raw: list(bests))
    monkeypatch.setattr(task, "best_answers", lambda model, tok, raw: list(bests))
    raw = _raw(list(golds.values())).add_column("title", ["T"] * len(golds))
    scores = task.score({}, raw)
    if entry == "predict":
        files = task.predict_files(task.predict(None, None, [{"id": q, "question": "?", "context": c}
                                                             for q, c in zip(golds, raw["context"])]))
    else:
        files = task.prediction_files(task.predictions({}, raw), raw)
        files.pop("dataset")
    assert sorted(files) == (["answers"] if version == "v1" else ["answers", "best_spans", "na_probs"])
    if version == "v1":
        assert scores == pytest.approx(official_v1(golds, files["answers"]))
        return
    plain = _toolkit_names(official_v2(golds, files["answers"]))
    assert {k: v for k, v in scores.items() if not k.startswith("best")} == pytest.approx(plain)
    paired = _toolkit_names(official_v2(golds, files["best_spans"], files["na_probs"], thresh=0.0))
    assert (scores["best_exact"], scores["best_f1"]) == pytest.approx((paired["best_exact"], paired["best_f1"]))
    if case != "empty golds":  # the one place the script with --na-prob-file scores otherwise (above)
        assert {k: v for k, v in scores.items() if not k.startswith("best")} == pytest.approx(
            {k: v for k, v in paired.items() if not k.startswith("best")})


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("mode", ["extractive", "generative"])
def test_every_squad_scoring_path_equals_its_versions_official_script(version: str, mode: str, monkeypatch) -> None:
    """Each version is scored as its own script scores the same predictions: v1.1 keeps a gold of
    "the" (EM 1 for "", F1 0) and has no HasAns/NoAns; v2.0 drops it. A generative v2.0 model's
    "unanswerable" is the empty answer."""
    from toolkit.tasks._qa import Best
    from toolkit.tasks.squad import NO_ANSWER, Squad

    golds = {"q0": ["the"], "q1": ["Paris", "a"], "q2": ["Big Ben"], "q3": ["Nile"]}
    texts = {"q0": "", "q1": "an", "q2": "big ben.", "q3": "Amazon Nile river"}
    if version == "v2":
        golds["q4"], texts["q4"] = [], ""
    task = Squad(version=version, mode=mode)
    task._extractive = mode == "extractive"
    if mode == "extractive":  # null scores below every span: the spans are the predictions
        monkeypatch.setattr(task, "spans", lambda outputs, raw: [Best(texts[q], 0.0, -1.0) for q in golds])
    else:
        # v2.0's abstention text is its empty answer; a v1.1 model answers "" by ending at once
        monkeypatch.setattr(task, "decoded", lambda outputs: [texts[q] or (NO_ANSWER if version == "v2" else "")
                                                              for q in golds])
    got = task.score({}, _raw(list(golds.values())))
    official = official_v1(golds, texts) if version == "v1" else _toolkit_names(official_v2(golds, texts))
    assert {k: v for k, v in got.items() if not k.startswith("best")} == pytest.approx(official)
    assert got["exact_match"] != got["f1"]  # "" against "the": EM 1, F1 0 (v1.1); 1, 1 (v2.0)


CONTEXT = "Alpha beta gamma delta. The answer is Marie Curie herself. Epsilon zeta eta theta iota kappa."


def _windows(tok_name: str, max_length: int, stride: int = 8) -> dict:
    tok = shared_tokenizer(str(SHARED / "tokenizers" / tok_name))  # read once a worker: 16 calls
    answers = [{"text": ["Marie Curie"], "answer_start": [CONTEXT.index("Marie Curie")]}]
    return window_features(tok, ["Who is it?"], [CONTEXT], answers, max_length, stride)


@pytest.mark.parametrize("tok_name", ["bert-base-uncased", "roberta-base"])
def test_windows_label_the_answer_only_where_it_is_whole(tok_name: str) -> None:
    """Over several window sizes: a window is labelled at the answer's tokens exactly when it holds
    the whole answer; one that holds part of it (the answer spans two windows) gets [CLS]."""
    first, last = CONTEXT.index("Marie Curie"), CONTEXT.index("Marie Curie") + len("Marie Curie")
    partial_seen = False
    for max_length in range(12, 20):
        feats = _windows(tok_name, max_length, stride=2)
        assert len(feats["input_ids"]) >= 2
        for offsets, s, e in zip(feats["offsets"], feats["start_positions"], feats["end_positions"]):
            chars = [o for o in offsets if o[0] >= 0]
            lo, hi = chars[0][0], chars[-1][1]
            whole = lo <= first and hi >= last
            partial_seen |= not whole and lo < last and hi > first
            assert (s != 0) == whole
            if s:
                assert CONTEXT[offsets[s][0]:offsets[e][1]] == "Marie Curie"
    assert partial_seen


def test_post_processing_picks_the_answer_from_the_second_window() -> None:
    """Two hand-made windows over one context: the first holds only "Marie" (the answer is cut at
    its end), the second the whole name. The best start+end over both windows is the full span."""
    context = "xx Marie Curie yy"
    # token offsets: window 0 = [CLS] xx Marie | window 1 = [CLS] Marie Curie yy
    offsets = np.array([[[-1, -1], [0, 2], [3, 8], [-1, -1]],
                        [[-1, -1], [3, 8], [9, 14], [15, 17]]])  # (2 windows, 4 tokens, 2)
    start = np.array([[0.0, 0.1, 2.0, -100], [0.0, 3.0, 0.5, 0.1]])
    end = np.array([[0.0, 0.1, 2.5, -100], [0.0, 0.2, 3.0, 0.1]])
    (best,) = best_spans(start, end, offsets, np.array([0, 0]), [context], n_best=20, max_answer_length=30)
    assert best.text == "Marie Curie" and best.score == pytest.approx(6.0)
    assert best.null_score == 0.0
    (short,) = best_spans(start, end, offsets, np.array([0, 0]), [context], n_best=20, max_answer_length=1)
    assert short.text == "Marie"  # a 2-token span is too long: window 0's "Marie" (2.0 + 2.5) wins


@functools.lru_cache(maxsize=None)
def _tokenizer(name: str):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(SHARED / "tokenizers" / name))
    tok.pad_token = tok.pad_token or tok.eos_token
    return tok


# contexts where a span's characters are easy to get wrong: odd whitespace, non-Latin text, the
# answer as the context's last characters, and (with 20-token windows) in a later window only
HARD_CONTEXTS = [
    ("Alpha beta gamma. The answer comes at the very end: Curie", "Curie"),
    ("Alpha\u00a0beta. Marie\u00a0Curie\u3000was\there.\r\n\n  Then more text follows it.", "Marie\u00a0Curie"),
    ("Éloïse met Ægir in Köln 🙂 and Zoë in 東京 on Tuesday, then went home again.", "Köln"),
    (" ".join(["filler words go here"] * 12) + "\n\n The answer:  (1990).\n", "(1990)."),
    # decomposed accents (NFD): BERT uncased strips the combining marks from its tokens' offsets
    ("Le Zu\u0308rich de ne\u0301e est Cafe\u0301 ici.", "Zu\u0308rich de ne\u0301e est Cafe\u0301"),
    # non-spacing marks of combining class 0 (Devanagari's and Thai's vowel signs), which BERT
    # uncased strips as it strips accents; the answer ending the context too
    ("Hindi greeting: \u0928\u092e\u0938\u094d\u0924\u0947, Thai: \u0e14\u0e35", "\u0e14\u0e35"),
    ("Hindi greeting: \u0928\u092e\u0938\u094d\u0924\u0947, Thai: \u0e14\u0e35", "\u0928\u092e\u0938\u094d\u0924\u0947"),
]


@pytest.mark.parametrize("tok_name", ["bert-base-uncased", "roberta-base", "bart-base", "gpt2"])
@pytest.mark.parametrize("context, answer", HARD_CONTEXTS, ids=["end", "whitespace", "unicode", "later-window", "nfd",
                                                           "mark-class-0-at-end", "mark-class-0"])
def test_the_labelled_span_comes_back_as_the_answer_text_exactly(tok_name: str, context: str, answer: str) -> None:
    """Windows, labels and span search together, for every tokenizer kind (WordPiece, byte-level
    BPE with and without trim_offsets): logits that point at each window's labelled tokens give
    the gold answer's characters back, nothing more (GPT-2's offsets hold the space before a
    word: its spans came back as " Curie")."""
    from toolkit.tasks._qa import WindowCollator

    tok = _tokenizer(tok_name)
    gold = {"text": [answer], "answer_start": [context.index(answer)]}
    feats = window_features(tok, ["Who is it?"], [context], [gold], max_length=20 + 12 * (len(context) < 200), stride=4)
    batch = WindowCollator(tok)([{k: feats[k][i] for k in feats} for i in range(len(feats["input_ids"]))])
    start, end = np.zeros(batch["input_ids"].shape), np.zeros(batch["input_ids"].shape)  # (windows, t)
    for w, (s, e) in enumerate(zip(feats["start_positions"], feats["end_positions"])):
        start[w, s], end[w, e] = (5.0, 5.0) if s else (0.0, 0.0)
    if len(context) > 200:  # the long context: its answer is in a later window, not the first
        assert len(feats["input_ids"]) > 2 and feats["start_positions"][0] == 0
    (best,) = best_spans(start, end, batch["offsets"].numpy(), batch["example_index"].numpy(), [context],
                         n_best=20, max_answer_length=30)
    assert best.text == answer

def _squad_file(path: Path, articles: int = 4, bad: bool = False) -> Path:
    data = []
    for a in range(articles):
        context = f"Article {a} says the capital is City{a}."
        start = context.index(f"City{a}") + (1 if bad and a == 2 else 0)
        data.append({"title": f"T{a}", "paragraphs": [{"context": context, "qas": [
            {"id": f"q{a}", "question": "What is the capital?",
             "answers": [{"text": f"City{a}", "answer_start": start}]}]}]})
    path.write_text(json.dumps({"version": "1.1", "data": data}))
    return path


def test_split_by_article_keeps_articles_apart(tmp_path: Path) -> None:
    rows = read_squad(str(_squad_file(tmp_path / "d.json", articles=10)))
    train, evaluation = split_by_article(rows, 0.8, seed=0)
    assert len(train) == 8 and len(evaluation) == 2
    assert not {r["article"] for r in train} & {r["article"] for r in evaluation}
    assert split_by_article(rows, 0.8, seed=0) == (train, evaluation)  # seeded


def test_answer_offset_mismatch_is_one_line_naming_file_and_question(tmp_path: Path, cli) -> None:
    bad = _squad_file(tmp_path / "bad.json", bad=True)
    with pytest.raises(UserError, match=r"bad.json:1: article 2 \('T2'\), question q2: answer 'City2' at answer_start"):
        read_squad(str(bad))
    recipe = write_recipe(tmp_path / "r.yaml", f"""model: {{checkpoint: bert-base-uncased}}
task: {{name: squad, eval_file: {bad}, split_articles: 0.5}}
method: {{name: full}}
""")
    code, _, err = cli("run", recipe, "--smoke", "--runs-dir", tmp_path / "runs")
    assert code == 2 and err.count("\n") == 1 and "question q2" in err
    assert not (tmp_path / "runs").exists()


def test_real_dev_file_reads_and_splits() -> None:
    rows = read_squad("$TOOLKIT_DATA/squad/v1.1/dev-v1.1.json")
    assert len(rows) == 10570
    train, evaluation = split_by_article(rows, 0.834, seed=0)
    assert len({r["article"] for r in train}) == 40 and len({r["article"] for r in evaluation}) == 8


def _v2_file(path: Path) -> Path:
    """A SQuAD v2.0 file: per article one answerable and one unanswerable question."""
    articles = []
    for a in range(6):
        context = f"Article {a} says that the capital of country {a} is city number {a} by the sea."
        answer = f"city number {a}"
        articles.append({"title": f"t{a}", "paragraphs": [{"context": context, "qas": [
            {"id": f"{a}-y", "question": f"What is the capital of country {a}?", "is_impossible": False,
             "answers": [{"text": answer, "answer_start": context.index(answer)}]},
            {"id": f"{a}-n", "question": f"Who painted country {a}?", "is_impossible": True, "answers": []}]}]})
    path.write_text(json.dumps({"version": "v2.0", "data": articles}))
    return path


def test_v2_extractive_run_reports_fixed_and_tuned_thresholds_apart(tmp_path: Path, cli) -> None:
    data = _v2_file(tmp_path / "dev-v2.json")
    recipe = write_recipe(tmp_path / "r.yaml", f"""model: {{checkpoint: bert-base-uncased}}
task: {{name: squad, version: v2, eval_file: {data}, split_articles: 0.5, max_length: 64, doc_stride: 16}}
method: {{name: full}}
train: {{max_steps: 2, lr: 1.0e-3, batch_size: 4}}
""")
    code, _, err = cli("run", recipe, "--smoke", "--runs-dir", tmp_path / "runs")
    assert code == 0, err
    (metrics,) = (tmp_path / "runs").rglob("metrics.json")
    scores = json.loads(metrics.read_text())["eval"]
    for key in ("f1", "exact_match", "HasAns_f1", "NoAns_f1", "best_f1", "best_exact"):
        assert key in scores, key
    assert "null_threshold" not in scores
    # the tuned threshold is chosen on these very questions: it can only do as well or better
    assert scores["best_f1"] >= scores["f1"] - 1e-9 and scores["best_exact"] >= scores["exact_match"] - 1e-9


@pytest.mark.parametrize("checkpoint", ["bert-base-uncased", "roberta-base"])
def test_answering_nothing_anywhere_is_one_threshold_in_the_api_and_the_files(
        tmp_path: Path, cli, checkpoint: str) -> None:
    """Finding: where answering "" everywhere scored best (here: every question unanswerable,
    so admitting any non-empty span costs), best_*_thresh was -inf in toolkit.evaluate's dict
    and null in metrics.json and eval-eval.json. The official script reports 0.0 there, its
    probabilities' floor; on the toolkit's logit gaps 0.0 is the fixed threshold, not "answer
    nothing", so the threshold is the largest whole number below every gap, the same number in
    the run's metrics.json, `toolkit eval`'s file and the API's dict, and evaluate-v2.0.py's
    --na-prob-thresh at it gives best_exact and best_f1 back."""
    import math

    import toolkit

    data = _v2_file(tmp_path / "dev-v2.json")
    doc = json.loads(data.read_text())
    for article in doc["data"]:
        for qa in article["paragraphs"][0]["qas"]:
            qa.update(is_impossible=True, answers=[])
    data.write_text(json.dumps(doc))
    recipe = write_recipe(tmp_path / "r.yaml", f"""model: {{checkpoint: {checkpoint}}}
task: {{name: squad, version: v2, eval_file: {data}, split_articles: 0.5, max_length: 64, doc_stride: 16}}
method: {{name: full}}
train: {{max_steps: 1, batch_size: 4}}
""")
    code, _, err = cli("run", recipe, "--smoke", "--runs-dir", tmp_path / "runs")
    assert code == 0, err
    (metrics_file,) = (tmp_path / "runs").rglob("metrics.json")
    run = metrics_file.parent
    code, _, err = cli("eval", run)
    assert code == 0, err
    given = [json.loads(metrics_file.read_text())["eval"], json.loads((run / "eval-eval.json").read_text())["eval"],
             toolkit.evaluate(run)["eval"]]
    na_probs, spans = (json.loads((run / f"predictions.{n}.json").read_text()) for n in ("na_probs", "best_spans"))
    low = min(na_probs.values())
    for scores in given:
        assert scores["best_exact"] == scores["best_f1"] == 1.0
        assert scores["best_exact_thresh"] == scores["best_f1_thresh"] == math.ceil(low) - 1
    golds = dict.fromkeys(na_probs, [])
    at = official_v2(golds, spans, na_probs, thresh=given[0]["best_f1_thresh"])
    assert (at["exact"], at["f1"]) == (1.0, 1.0)


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_answers_written_without_spaces_are_said_to_score_f1_as_exact_match(tmp_path: Path, cli, version: str) -> None:
    """The official F1 splits answers at spaces: a Chinese answer is one word, its F1 its exact
    match (scored so, as the official scripts do: "居里夫人" against "居里夫人获得" F1 0). That
    was unsaid, exit 0; one `warning:` line at the run's start and at `toolkit eval`, v1.1 and
    v2.0; none for Latin answers."""
    assert squad_scores(["居里夫人"], [["居里夫人获得"]], version)["f1"] == 0.0
    articles = []
    for a in range(4):
        context = f"第{a}篇文章说居里夫人获得了诺贝尔奖。"
        qas = [{"id": f"{a}-y", "question": "谁获得了诺贝尔奖？", "answers": [{"text": "居里夫人", "answer_start": context.index("居里夫人")}]}]
        if version == "v2":
            qas.append({"id": f"{a}-n", "question": "谁画了这幅画？", "answers": [], "is_impossible": True})
        articles.append({"title": f"t{a}", "paragraphs": [{"context": context, "qas": qas}]})
    data = tmp_path / "dev.json"
    data.write_text(json.dumps({"version": "v2.0" if version == "v2" else "1.1", "data": articles}, ensure_ascii=False))
    recipe = write_recipe(tmp_path / "r.yaml", f"""model: {{checkpoint: bert-base-uncased}}
task: {{name: squad, version: {version}, eval_file: {data}, split_articles: 0.5, max_length: 64, doc_stride: 16}}
method: {{name: full}}
train: {{max_steps: 1, batch_size: 4}}
""")
    code, _, err = cli("run", recipe, "--smoke", "--runs-dir", tmp_path / "runs")
    assert code == 0, err
    said = [line for line in err.splitlines() if "written without spaces" in line]
    assert len(said) == 1 and "Chinese characters" in said[0] and "exact match" in said[0], err
    (metrics,) = (tmp_path / "runs").rglob("metrics.json")
    code, _, err = cli("eval", metrics.parent)
    assert code == 0, err
    assert sum("written without spaces" in line for line in err.splitlines()) == 1, err
    assert not _squad_task_notes(tmp_path)


def _squad_task_notes(tmp_path: Path) -> dict:
    """The notes a Latin-script file gives (none about spaceless answers)."""
    from toolkit.tasks.squad import Squad

    task = Squad(version="v2", eval_file=str(_v2_file(tmp_path / "latin.json")), split_articles=0.5)
    task.load()
    return {k: v for k, v in task.notices().items() if "spaceless" in k}


def test_every_task_reads_the_data_dir_its_recipe_names(tmp_path: Path, monkeypatch) -> None:
    """task.data_dir stands for $TOOLKIT_DATA in the recipe's paths, whatever the environment says."""
    from toolkit.tasks.squad import Squad
    from toolkit.tasks.summarization import Summarization

    monkeypatch.setenv("TOOLKIT_DATA", str(tmp_path / "elsewhere"))
    mine = tmp_path / "mine"
    (mine / "squad").mkdir(parents=True)
    _v2_file(mine / "squad" / "dev.json")
    squad = Squad(version="v2", eval_file="$TOOLKIT_DATA/squad/dev.json", split_articles=0.5,
                  data_dir=str(mine))
    data = squad.load()
    assert len(data["train"]) + len(data["eval"][""]) == 12
    (mine / "s.jsonl").write_text('{"dialogue": "A: hi", "summary": "A greets."}\n' * 3)
    summ = Summarization(eval_file="$TOOLKIT_DATA/s.jsonl", train_file="$TOOLKIT_DATA/s.jsonl",
                         data_dir=str(mine))
    assert summ.read(summ.eval_file)[0]["target"] == "A greets."
    assert summ.expand("$TOOLKIT_DATA/x.json") == str(mine / "x.json")


# --- issue 37 rule 3: the official rules for unanswerable questions ---------------------------
V11_MINILM = ROOT / "recipes" / "squad" / "v1.1" / "minilm-full.yaml"
V20_MINILM = ROOT / "recipes" / "squad" / "v2.0" / "minilm-full.yaml"


def test_a_v1_run_refuses_unanswerable_questions_with_their_count(tmp_path: Path, cli) -> None:
    data = _v2_file(tmp_path / "dev-v2.json")
    with pytest.raises(UserError, match=r"dev-v2.json: 6 of 12 questions have no answer .*the first at "
                                        r".*dev-v2.json:\d+\).*set task.version=v2"):
        read_squad(str(data), "v1")
    assert len(read_squad(str(data), "v2")) == 12
    code, _, err = cli("run", V11_MINILM, f"task.eval_file={data}", "--smoke", "--runs-dir", tmp_path / "runs")
    assert code == 2 and err.count("\n") == 1 and "recipes/squad/v2.0/" in err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("impossible, answers, message", [
    (True, None, r"is_impossible is true but it lists 1 answer\(s\) \('City1'\)"),
    (False, [], "is_impossible is false but it lists no answer"),
])
def test_is_impossible_that_contradicts_the_answers_is_refused_at_its_line(
        tmp_path: Path, impossible: bool, answers: list | None, message: str) -> None:
    """Never dropped: the official v2.0 script goes by the answers, BERT's run_squad by the flag."""
    path = _squad_file(tmp_path / "d.json")
    doc = json.loads(path.read_text())
    qa = doc["data"][1]["paragraphs"][0]["qas"][0]
    qa.update(is_impossible=impossible, answers=qa["answers"] if answers is None else answers)
    path.write_text(json.dumps(doc, indent=1))
    line = [x.strip() for x in json.dumps(doc, indent=1).splitlines()].index('"id": "q1",')  # 1-based: its '{'

    with pytest.raises(UserError, match=rf"d.json:{line}: article 1 \('T1'\), question q1: {message}"):
        read_squad(str(path), "v2")


def test_a_question_id_given_twice_is_scored_apart_in_the_official_files(capsys) -> None:
    from toolkit.tasks.squad import unique_ids

    assert unique_ids(["a", "b", "a", "a"]) == ["a", "b", "a#2", "a#3"]
    assert capsys.readouterr().err.count("warning: 1 question id(s) appear more than once") == 1
    assert unique_ids(["a", "b"]) == ["a", "b"] and not capsys.readouterr().err
    # a renamed repeat never takes a name the file gives another question (a#2 twice: one answer
    # scored for both questions in the official files)
    given = ["a", "a", "a#2", "a", "a#2"]
    assert unique_ids(given) == ["a", "a#3", "a#2", "a#4", "a#2#2"]


def test_version_override_files_the_run_under_its_version() -> None:
    from toolkit import recipe as recipes

    assert recipes.load(V11_MINILM).name == "squad/v1.1/minilm-full"
    assert recipes.load(V11_MINILM, ["task.version=v2"]).name == "squad/v2.0/minilm-full"
    assert recipes.load(V20_MINILM).name == "squad/v2.0/minilm-full"


@pytest.mark.parametrize("entry", ["run", "cli eval", "api evaluate"])
def test_v2_recipe_writes_what_the_official_script_reads_and_it_gives_the_run_scores(
        tmp_path: Path, cli, entry: str) -> None:
    """The shipped v2.0 recipe on a v2 file: predictions.jsonl holds each question's no-answer
    score; the dataset and answers files alone, scored as evaluate-v2.0.py scores them, give the
    run's exact_match, f1 and HasAns/NoAns, and with best_spans / na_probs at --na-prob-thresh 0
    its best_* figures; the same for `toolkit eval` and `toolkit.evaluate`, which read an older
    run folder (answers.json holding best spans beside na_prob.json) and leave no stale file of
    the old pair beside theirs."""
    import toolkit

    data = _v2_file(tmp_path / "dev-v2.json")
    code, _, err = cli("run", V20_MINILM, f"task.eval_file={data}", "task.split_articles=0.5", "--smoke",
                       "--runs-dir", tmp_path / "runs")
    assert code == 0, err
    (metrics_file,) = (tmp_path / "runs" / "squad" / "v2.0" / "minilm-full").rglob("metrics.json")
    run = metrics_file.parent
    scores = json.loads(metrics_file.read_text())["eval"]
    stem = "predictions"
    if entry != "run":
        stem = "predictions-eval"
        for name in ("answers", "na_prob"):  # what an older toolkit left: best spans beside na_prob
            (run / f"{stem}.{name}.json").write_text("{}")
        (run / "predictions.na_probs.json").rename(run / "predictions.na_prob.json")
        (run / "predictions.best_spans.json").rename(run / "predictions.answers.json")
        if entry == "cli eval":
            code, _, err = cli("eval", run)
            assert code == 0, err
            scores = json.loads((run / "eval-eval.json").read_text())["eval"]
        else:
            scores = toolkit.evaluate(run)["eval"]
        assert not (run / f"{stem}.na_prob.json").exists() and (run / "predictions.na_prob.json").exists()
    rows = [json.loads(line) for line in (run / f"{stem}.jsonl").read_text().splitlines()]
    dataset, answers, spans, na_probs = (json.loads((run / f"{stem}.{name}.json").read_text())
                                         for name in ("dataset", "answers", "best_spans", "na_probs"))
    assert dataset["version"] == "v2.0" and len(rows) == 6
    for row in rows:
        assert row["prediction"] == ("" if row["no_answer_score"] > 0 else row["best_span"])
    assert answers == {r["id"]: r["prediction"] for r in rows} and spans == {r["id"]: r["best_span"] for r in rows}
    golds = {qa["id"]: [a["text"] for a in qa["answers"]]
             for article in dataset["data"] for p in article["paragraphs"] for qa in p["qas"]}
    assert set(golds) == set(answers) == set(na_probs) == {r["id"] for r in rows}
    alone = _toolkit_names(official_v2(golds, answers))
    paired = _toolkit_names(official_v2(golds, spans, na_probs, thresh=0.0))  # no gold here is "the"
    for key in ("exact_match", "f1", "HasAns_exact_match", "HasAns_f1", "NoAns_exact_match", "NoAns_f1"):
        assert scores[key] == pytest.approx(alone[key]) == pytest.approx(paired[key]), key
    for key in ("best_exact", "best_f1"):
        assert scores[key] == pytest.approx(paired[key]), key


@pytest.mark.parametrize("tok_name", ["bert-base-uncased", "roberta-base", "bart-base", "gpt2"])
def test_a_question_longer_than_a_window_allows_is_cut_and_its_answer_still_found(tok_name: str) -> None:
    """Finding: a question leaving a window no more than task.doc_stride context tokens stopped
    the run with a Rust panic from the tokenizer (a traceback, as in run_qa.py). It is cut to its
    first tokens that fit (as BERT's run_squad cuts at max_query_length), said once with the
    count, and the windows still slide over the whole context."""
    from datasets import Dataset

    from toolkit.tasks.squad import Squad

    tok = _tokenizer(tok_name)
    long_question = "Which of the many people named in this rather long question " * 8 + "is it?"
    rows = [{"question": q, "context": CONTEXT, "answers": {"text": ["Marie Curie"],
             "answer_start": [CONTEXT.index("Marie Curie")]}} for q in (long_question, "Who is it?")]
    task = Squad(max_length=48, doc_stride=16, mode="extractive")
    task.model_head("bert")
    feats = task.encode(Dataset.from_list(rows), tok)
    assert max(len(ids) for ids in feats["input_ids"]) <= 48
    assert all(sum(o[0] >= 0 for o in offsets) > 16 for offsets in feats["offsets"])  # context beside it
    for example in (0, 1):  # the answer labelled in some window of each question
        assert any(s for s, e in zip(feats["start_positions"], feats["example_index"]) if e == example)
    (line,) = [v for k, v in task.notices().items() if k == "cut questions"]
    assert line.startswith("1 of 2 questions cut to their first ") and "task.doc_stride=16" in line


@pytest.mark.parametrize("checkpoint, mode, metric, valid", [
    ("bert-base-uncased", "auto", "best_f1", True), ("bert-base-uncased", "extractive", "best_f1", True),
    ("gpt2", "auto", "best_f1", False), ("t5-base", "generative", "best_f1", False),
    ("gpt2", "extractive", "best_f1", True),
    ("bert-base-uncased", "extractive", "best_f1_thresh", False), ("bert-base-uncased", "extractive", "best_exact_thresh", False),
])
def test_best_thresholds_are_selectable_exactly_where_the_run_has_them(tmp_path: Path, cli, checkpoint: str,
                                                                     mode: str, metric: str, valid: bool) -> None:
    """best_* come from the null score of an extractive v2.0 run: train.metric=best_f1 validates
    there, and a generative run (which has none) is refused at validate in one line, not by a
    KeyError at its first evaluation. The thresholds beside them are not scores (a higher one is
    no better checkpoint): selecting on them kept the step with the largest threshold, exit 0."""
    data = _v2_file(tmp_path / "dev-v2.json")
    recipe = write_recipe(tmp_path / "r.yaml", f"""model: {{checkpoint: {checkpoint}}}
task: {{name: squad, version: v2, mode: {mode}, eval_file: {data}, split_articles: 0.5}}
method: {{name: full}}
train: {{metric: {metric}}}
""")
    code, _, err = cli("validate", recipe)
    assert code == (0 if valid else 2), err
    if not valid:
        assert len(err.strip().splitlines()) == 1 and f"train.metric: '{metric}' is not a metric of this task" in err


def test_a_selected_metric_the_evaluation_does_not_give_is_one_line(tmp_path: Path, cli) -> None:
    """A v2.0 split with no unanswerable question gives no NoAns_* (as its official script): a run
    selecting NoAns_f1 passed validate and ended in a KeyError at its first evaluation."""
    data = _v2_file(tmp_path / "dev-v2.json")
    rows = json.loads(data.read_text())
    for article in rows["data"]:
        for paragraph in article["paragraphs"]:
            paragraph["qas"] = [q for q in paragraph["qas"] if not q["is_impossible"]]
    data.write_text(json.dumps(rows))
    recipe = write_recipe(tmp_path / "r.yaml", f"""model: {{checkpoint: bert-base-uncased}}
task: {{name: squad, version: v2, eval_file: {data}, split_articles: 0.5, max_length: 64, doc_stride: 16}}
method: {{name: full}}
train: {{max_steps: 2, lr: 1.0e-3, batch_size: 4, metric: NoAns_f1}}
""")
    code, _, err = cli("run", recipe, "--smoke", "--runs-dir", tmp_path / "runs")
    lines = [line for line in err.splitlines() if "error" in line]  # on a line of its own, after the bar
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith("error: train.metric: 'NoAns_f1' is not among what this evaluation gives (")
    assert "HasAns_f1" in lines[0] and "exact_match" in lines[0]


def _answerable_only(path: Path) -> Path:
    """`_v2_file` less its unanswerable questions: a file SQuAD v1.1 reads."""
    rows = json.loads(_v2_file(path).read_text())
    for article in rows["data"]:
        for paragraph in article["paragraphs"]:
            paragraph["qas"] = [q for q in paragraph["qas"] if not q["is_impossible"]]
    path.write_text(json.dumps(rows))
    return path


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("checkpoint, mode, windows", [
    ("bert-base-uncased", "auto", True), ("gpt2", "extractive", True),
    ("t5-base", "auto", False), ("gpt2", "generative", False),
])
def test_the_window_rule_holds_exactly_where_the_run_makes_windows(tmp_path: Path, cli, version: str,
                                                                  checkpoint: str, mode: str, windows: bool) -> None:
    """Finding: a generative run (T5 by `auto`, or `mode: generative`) with task.doc_stride at or
    above half of task.max_length was refused at validate by the extractive window rule, though it
    makes no windows (question and context are one source, cut at max_length). The rule holds
    where the mode resolves to extractive, through validate and run alike, and nowhere else.
    A generative run reads no doc_stride at all: one set there is refused as a setting the run
    never reads (recipe.refuse_ignored), not by the window rule; left out, the run runs."""
    data = (_v2_file if version == "v2" else _answerable_only)(tmp_path / f"dev-{version}.json")
    written = f"""model: {{checkpoint: {checkpoint}}}
task: {{name: squad, version: {version}, mode: {mode}, eval_file: {data}, split_articles: 0.5,
        max_length: 64, doc_stride: 32{'' if windows else ', max_target_length: 8, generation: {max_new_tokens: 4}'}}}
method: {{name: full}}
train: {{max_steps: 1, batch_size: 4}}
"""
    recipe = write_recipe(tmp_path / "r.yaml", written)
    rule = "task.doc_stride: 32 must be below half of task.max_length (64) so windows move forward"
    code, _, err = cli("validate", recipe)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.strip().endswith(rule) == windows, err
    if not windows:
        assert "task.doc_stride: a generative run" in err, err
        recipe = write_recipe(tmp_path / "r.yaml", written.replace(", doc_stride: 32", ""))
        assert cli("validate", recipe)[0] == 0
    code, _, err = cli("run", recipe, "--smoke", "--runs-dir", tmp_path / "runs")
    if windows:
        assert code == 2 and err.strip().splitlines()[-1] == f"error: {rule}", err
        assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("*.json"))
    else:
        assert code == 0, err
        (metrics,) = (tmp_path / "runs").rglob("metrics.json")
        assert "f1" in json.loads(metrics.read_text())["eval"]


def test_a_question_with_no_span_in_any_window_writes_files_the_official_script_reads(tmp_path: Path) -> None:
    """Finding: with task.n_best=1 every window's best start came after its best end, so no span
    was left: no_answer_score was infinite, written `Infinity` (not JSON) in predictions.jsonl and
    predict's rows and null in na_prob.json (now na_probs.json), on which evaluate-v2.0.py stops with a TypeError. It
    answers "" at every threshold, with the largest finite score, over the run's and eval's rows
    and files and predict's rows; the files give the script the run's best_exact and best_f1."""
    import types

    import torch

    from toolkit import runs
    from toolkit.tasks._qa import WindowCollator
    from toolkit.tasks.squad import Squad

    tok = _tokenizer("bert-base-uncased")
    raw = _raw([["Marie Curie"], []]).add_column("title", ["T", "T"])
    task = Squad(version="v2", mode="extractive", max_length=32, doc_stride=8, n_best=1)
    task.model_head("bert")

    class Ramp(torch.nn.Module):  # best start: a window's last token, best end: its first
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, input_ids: torch.Tensor, **_: object) -> types.SimpleNamespace:
            ramp = torch.arange(input_ids.shape[1], dtype=torch.float).expand(input_ids.shape)
            return types.SimpleNamespace(start_logits=ramp, end_logits=-ramp)

    feats = task.windows(tok, list(raw["question"]), list(raw["context"]), list(raw["answers"]))
    batch = WindowCollator(tok)([{k: feats[k][i] for k in feats} for i in range(len(feats["input_ids"]))])
    out = Ramp()(batch["input_ids"])
    outputs = {"start_logits": out.start_logits.numpy(), "end_logits": out.end_logits.numpy(),
               "offsets": batch["offsets"].numpy(), "example_index": batch["example_index"].numpy()}
    metrics = task.score(outputs, raw)
    rows = task.predictions(outputs, raw)
    runs.write_predictions(tmp_path / "predictions.jsonl", rows, task.prediction_files(rows, raw))
    strict = functools.partial(json.loads, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
    rows = [strict(line) for line in (tmp_path / "predictions.jsonl").read_text().splitlines()]
    answers, na_prob = (strict((tmp_path / f"predictions.{n}.json").read_text()) for n in ("best_spans", "na_probs"))
    predicted = task.predict(Ramp(), tok, [{"question": r["question"], "context": r["context"]} for r in raw])
    strict(runs.jsonl_line(predicted[0]))
    for row in [*rows, *predicted]:
        assert row["prediction"] == row["best_span"] == "" and row["no_answer_score"] > 0.0
    golds = {r["id"]: r["answers"]["text"] for r in raw}
    official = official_v2(golds, answers, na_prob, thresh=0.0)  # a number each: the script sorts them
    assert (metrics["best_exact"], metrics["best_f1"], metrics["exact_match"]) == pytest.approx(
        (official["best_exact"], official["best_f1"], 0.5))


# --- the questions of a file as written, in each layout the reader takes ------------------------
QA_CONTEXT = "The museum opened in 1901 in Paris."


def _qa_file(tmp_path: Path, layout: str, questions: list[dict]) -> Path:
    """`questions` ({"id", "question", maybe "answers" as SQuAD's list, "is_impossible"}) over one
    context, each its own article: SQuAD's JSON, flat JSONL (the Hub's answers object) or a flat
    JSON list (SQuAD's answers list)."""
    if layout == "squad":
        doc = {"data": [{"title": f"T{i}", "paragraphs": [{"context": QA_CONTEXT, "qas": [q]}]}
                        for i, q in enumerate(questions)]}
        path = tmp_path / "d.json"
        path.write_text(json.dumps(doc, indent=1))
        return path
    rows = []
    for q in questions:
        row = {**q, "context": QA_CONTEXT}
        if layout == "jsonl" and isinstance(q.get("answers"), list):
            row["answers"] = {"text": [a["text"] for a in q["answers"]],
                              "answer_start": [a["answer_start"] for a in q["answers"]]}
        rows.append(row)
    path = tmp_path / ("d.jsonl" if layout == "jsonl" else "d.json")
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) if layout == "jsonl" else json.dumps(rows, indent=1))
    return path


def _answer(text: str, start: Any = None) -> list[dict]:
    return [{"text": text, "answer_start": QA_CONTEXT.index(text) if start is None else start}]


LAYOUTS = ["squad", "jsonl", "json list"]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("version", ["v1", "v2"])
def test_a_question_without_an_answers_field_is_refused_at_its_place(tmp_path: Path, layout: str, version: str) -> None:
    """An absent (or null) answers field is no list of answers: read as unanswerable, a
    misspelt key made a v2.0 run score "" right on the question, exit 0. is_impossible: true
    says it outright, and reads as before."""
    given = [{"id": "a", "question": "When?", "answers": _answer("1901")},
             {"id": "b", "question": "Where?", "answer": _answer("Paris")}]
    path = _qa_file(tmp_path, layout, given)
    with pytest.raises(UserError, match=r"d.jsonl?:\d+: .*question b: 'answers' is missing; list the question's answers"):
        read_squad(str(path), version)
    given[1] = {"id": "b", "question": "Where?", "answers": None}
    with pytest.raises(UserError, match=r"question b: 'answers' is missing"):
        read_squad(str(_qa_file(tmp_path, layout, given)), version)
    if version == "v2":
        given[1] = {"id": "b", "question": "Where?", "is_impossible": True}
        rows = read_squad(str(_qa_file(tmp_path, layout, given)), version)
        assert [r["answers"]["text"] for r in rows] == [["1901"], []]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_answer_starts_are_whole_numbers_by_value_and_a_fraction_is_refused_at_its_own_place(tmp_path: Path,
                                                                                            layout: str) -> None:
    """JSON has one number type: a column holding 29.5 is read as doubles, and the first
    question (answer_start 21) was refused for it; 21.0 is the whole number 21."""
    given = [{"id": "a", "question": "When?", "answers": _answer("1901")},
             {"id": "b", "question": "Where?", "answers": _answer("Paris", 29.5)}]
    with pytest.raises(UserError, match=r"question b: an answer's 'answer_start' is a number, expected a whole"):
        read_squad(str(_qa_file(tmp_path, layout, given)), "v1")
    given[1] = {"id": "b", "question": "Where?", "answers": _answer("Paris", 29.0)}
    rows = read_squad(str(_qa_file(tmp_path, layout, given)), "v1")
    assert [r["answers"]["answer_start"] for r in rows] == [[21], [29]]
    assert all(type(s) is int for r in rows for s in r["answers"]["answer_start"])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_question_ids_read_as_written_in_every_layout(tmp_path: Path, layout: str) -> None:
    """A number id is named by its value (7 beside 7.5 is "7", not "7.0"), and ids of two JSON
    types (7 beside "a") read as each is written: SQuAD's layout was refused with Arrow's
    ArrowInvalid where the flat ones read it."""
    given = [{"id": 7, "question": "When?", "answers": _answer("1901")},
             {"id": 7.5, "question": "Where?", "answers": _answer("Paris")},
             {"id": "a", "question": "Who?", "answers": _answer("The museum")},
             {"id": 2 ** 60 + 1, "question": "What?", "answers": _answer("museum")}]
    if layout == "jsonl":
        given = given[:3]  # a whole number past 2^53 beside doubles: refused there (check_exact)
    rows = read_squad(str(_qa_file(tmp_path, layout, given)), "v1")
    assert [r["id"] for r in rows] == ["7", "7.5", "a", str(2 ** 60 + 1)][:len(given)]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("blank", [" ", "\u200b", "\n\t"])
def test_a_blank_answer_is_refused_at_its_place(tmp_path: Path, layout: str, blank: str) -> None:
    """An answer of whitespace or invisible characters alone matched its context there and was
    trained as no answer (no token holds it) and scored against "" (v1.1: exact 1), exit 0."""
    context = f"The museum{blank}opened in 1901."
    given = [{"id": "a", "question": "When?", "answers": [{"text": blank, "answer_start": context.index(blank)}]}]
    path = _qa_file(tmp_path, layout, given)
    path.write_text(path.read_text().replace(json.dumps(QA_CONTEXT), json.dumps(context)))
    with pytest.raises(UserError, match=r"question a: answer .* is blank \(whitespace or invisible characters alone\)"):
        read_squad(str(path), "v1")


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_the_no_answer_text_is_an_abstention_under_v2_alone(version: str, monkeypatch) -> None:
    """A generative run answers NO_ANSWER for "no answer" under v2.0 only: v1.1 trains no question
    towards it, and a gold answer "unanswerable" generated right was scored as "" (exact 0) in
    the run, and predicted as "", exit 0. Scoring and predict alike."""
    from datasets import Dataset

    from toolkit.tasks._generation import TextToText
    from toolkit.tasks.squad import NO_ANSWER, Squad

    context = "The court called it unanswerable."
    rows = [{"id": "a", "title": "", "question": "What did the court call it?", "context": context, "article": 0,
             "answers": {"text": [NO_ANSWER], "answer_start": [context.index(NO_ANSWER)]}},
            {"id": "b", "title": "", "question": "Who wrote it?", "context": context, "article": 0,
             "answers": {"text": [], "answer_start": []}}][:1 if version == "v1" else 2]
    task = Squad(version=version, mode="generative")
    monkeypatch.setattr(Squad, "decoded", lambda self, outputs: [NO_ANSWER] * len(rows))
    scores = task.score({}, Dataset.from_list(rows))
    if version == "v1":  # the gold answer, generated
        assert scores["exact_match"] == 1.0
    else:  # an abstention: wrong on the answerable question, right on the other
        assert scores["HasAns_exact_match"] == 0.0 and scores["NoAns_exact_match"] == 1.0
    monkeypatch.setattr(TextToText, "predict", lambda self, model, tok, given: [{**r, "prediction": NO_ANSWER} for r in given])
    (row,) = task.predict(None, None, [{"question": "q?", "context": context}])
    assert row["prediction"] == (NO_ANSWER if version == "v1" else "")


@pytest.mark.parametrize("mode, refused", [("generative", True), ("extractive", False)])
def test_a_v2_answer_that_is_the_no_answer_text_is_refused_where_generated(tmp_path: Path, mode: str,
                                                                           refused: bool) -> None:
    """Generative v2.0 would train that question to the abstention and score it wrong where it is
    right; an extractive run reads spans and abstains by its null score, so it reads the file."""
    from toolkit.tasks.squad import Squad

    context = "The court called the question unanswerable."
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [
        {"id": "q1", "question": "Who?", "context": context, "answers": []},
        {"id": "q2", "question": "What?", "context": context,
         "answers": [{"text": "unanswerable", "answer_start": context.index("unanswerable")}]}]))
    task = Squad(version="v2", mode=mode, train_file=str(path), eval_file=str(path))
    task.model_head("bert")
    if refused:
        with pytest.raises(UserError, match=r"d.jsonl: question q2 has the answer 'unanswerable', the text a "
                                            r"generative SQuAD v2.0 run answers for a question without one"):
            task.load()
    else:
        assert len(task.load()["eval"][""]) == 2


def test_scoring_another_eval_file_does_not_split_it_unasked(tmp_path: Path, cli, capsys) -> None:
    """A run that split its eval file by article, scored on another file (`toolkit eval RUN
    task.eval_file=OTHER`, the API alike): the split applied to OTHER, and its held-out articles
    alone (2 of 12) were scored as the file's score, exit 0. Now one line, unless the split is
    named; with split_articles=null every question is scored. A train_file given there turned
    the split off and scored the run's own training articles: one line too, as does another draw
    of the run's own file (split_seed, another split_articles). The run's own file still scores as
    the run did."""
    import toolkit

    run = toolkit.run(V11_MINILM, [f"task.eval_file={_squad_file(tmp_path / 'dev.json', articles=6)}",
                                   "task.split_articles=0.5", "train.max_steps=1"], runs_dir=tmp_path / "runs", smoke=True)
    other = _squad_file(tmp_path / "other.json", articles=12)
    capsys.readouterr()  # the run's own lines
    code, _, err = cli("eval", run.dir, f"task.eval_file={other}")
    assert code == 2 and err.count("\n") == 1 and "set task.split_articles=null to score all of it" in err
    assert not (run.dir / "eval-eval.json").exists()
    with pytest.raises(UserError, match="the run split its eval file by article"):
        toolkit.evaluate(run.dir, overrides=[f"task.eval_file={other}"])
    toolkit.evaluate(run.dir, overrides=[f"task.eval_file={other}", "task.split_articles=null"])
    assert len((run.dir / "predictions-eval.jsonl").read_text().splitlines()) == 12
    toolkit.evaluate(run.dir, overrides=[f"task={{eval_file: {other}, split_articles: 0.5}}"])  # asked for
    assert len((run.dir / "predictions-eval.jsonl").read_text().splitlines()) == 6
    capsys.readouterr()  # the API's evaluations' lines (a --smoke run's warning)
    code, _, err = cli("eval", run.dir, f"task.train_file={other}")  # the split off: its training articles scored
    assert code == 2 and err.count("\n") == 1 and "the articles the run trained on included" in err
    for other_draw in ("task.split_seed=7", "task.split_articles=0.25"):  # the run's own file, drawn again
        code, _, err = cli("eval", run.dir, other_draw)
        assert code == 2 and err.count("\n") == 1 and "another draw would score articles the run trained on" in err, err
    scores = toolkit.evaluate(run.dir, overrides=["task.max_eval_samples=null"])["eval"]  # its own file, as the run
    assert scores["f1"] == pytest.approx(json.loads((run.dir / "metrics.json").read_text())["eval"]["f1"])


def test_split_seed_is_bounded_as_train_seed(tmp_path: Path, cli) -> None:
    """Finding: SQuAD's task.split_seed took any integer, where the pretraining tasks' and
    train.seed are 0 .. 2**32 - 1; Python's Random(-7) draws what Random(7) draws, so a negative
    seed silently split the articles of another seed, exit 0. Outside the bounds: one line at
    validate; at either end the articles split."""
    from toolkit.tasks.squad import Squad

    for bad, said in ((-7, "below the minimum 0"), (2**32, "above the maximum 4294967295")):
        code, _, err = cli("validate", V11_MINILM, f"task.split_seed={bad}")
        assert code == 2 and len(err.strip().splitlines()) == 1 and f"task.split_seed: {bad} is {said}" in err, err
    data = _squad_file(tmp_path / "dev.json", articles=6)
    for seed in (0, 2**32 - 1):
        code, _, err = cli("validate", V11_MINILM, f"task.split_seed={seed}", f"task.eval_file={data}")
        assert code == 0, err
        rows = Squad(eval_file=str(data), split_articles=0.5, split_seed=seed).load()
        assert rows["train"].num_rows and rows["eval"][""].num_rows


# --- predict on new questions: the layouts eval reads, ids kept, the official scorer's file ----------
def _dev_subset(path: Path, version: str) -> Path:
    """Two articles of the real SQuAD v1.1 dev file, two paragraphs each (v2: plus a question
    without an answer per paragraph, and a numeric id, as a JSON number)."""
    data = json.loads((SHARED / "data" / "squad" / "v1.1" / "dev-v1.1.json").read_text())
    articles = [{"title": a["title"], "paragraphs": a["paragraphs"][:2]} for a in data["data"][:2]]
    if version == "v2":
        for a, article in enumerate(articles):
            for p, paragraph in enumerate(article["paragraphs"]):
                paragraph["qas"] = paragraph["qas"][:3] + [
                    {"id": 900 + 10 * a + p, "question": "Who painted the moon?", "answers": []}]
    path.write_text(json.dumps({"version": "v2.0" if version == "v2" else "1.1", "data": articles}))
    return path


@pytest.fixture(scope="module")
def predict_runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """version -> (run folder, its SQuAD-layout file): one smoke run per version, shared."""
    import toolkit

    out = {}
    for version in ("v1", "v2"):
        folder = tmp_path_factory.mktemp(f"predict-{version}")
        data = _dev_subset(folder / "dev.json", version)
        run = toolkit.run(V11_MINILM, [f"task.version={version}", f"task.train_file={data}", f"task.eval_file={data}",
                                       "train.max_steps=2", "task.max_length=128", "task.doc_stride=32"],
                          runs_dir=folder / "runs", smoke=True)
        out[version] = (run.dir, data)
    return out


def _flat(data: Path) -> list[dict]:
    doc = json.loads(data.read_text())
    return [{"id": qa["id"], "question": qa["question"], "context": p["context"], "answers": qa["answers"]}
            for a in doc["data"] for p in a["paragraphs"] for qa in p["qas"]]


PREDICT_LAYOUTS = ["document", "jsonl", "json-list", "csv", "stdin-document", "stdin-list",
                   "api-document", "api-articles", "api-flat", "api-tuples"]


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("layout", PREDICT_LAYOUTS)
def test_predict_reads_every_layout_eval_reads_keeps_ids_and_writes_the_official_answers(
        tmp_path: Path, cli, monkeypatch, predict_runs: dict, layout: str, version: str) -> None:
    """Finding: predict refused SQuAD's article layout (`field 'question' is missing (it has:
    title, paragraphs)`), which train and eval read, and its rows had no question id: predictions
    could not be joined to their questions nor given to evaluate-v1.1.py / -v2.0.py. Now every
    layout (the file, standard input, the API's document, articles or flat records) gives the
    same rows, each with its id (a number as its text; the input's number where it has none),
    and --output writes OUT.answers.json, {id: answer}, which the official script scores as the
    run's own evaluation of the same file scores."""
    import toolkit

    run, data = predict_runs[version]
    flat = _flat(data)
    ids = [str(r["id"]) for r in flat]
    doc = json.loads(data.read_text())
    out = tmp_path / "preds.jsonl"
    if layout.startswith("api"):
        given = {"api-document": doc, "api-articles": doc["data"],
                 "api-flat": [{k: r[k] for k in ("id", "question", "context")} for r in flat],
                 "api-tuples": [(r["question"], r["context"]) for r in flat]}[layout]
        rows = toolkit.predict(run, given)
    else:
        if layout == "document":
            source = data
        elif layout.startswith("stdin"):
            source = "-"
            pretty = tmp_path / "pretty.json"  # one document (or list of records) over many lines, piped in
            pretty.write_text(json.dumps(doc if layout == "stdin-document" else flat, indent=2))
            monkeypatch.setattr("sys.stdin", pretty.open(encoding="utf-8"))
        elif layout == "csv":
            source = tmp_path / "in.csv"
            with source.open("w", newline="") as f:
                writer = csv.DictWriter(f, ["id", "question", "context"], extrasaction="ignore")
                writer.writeheader()
                writer.writerows(flat)
        else:
            source = tmp_path / ("in.jsonl" if layout == "jsonl" else "in.json")
            source.write_text("".join(json.dumps(r) + "\n" for r in flat) if layout == "jsonl" else json.dumps(flat))
        code, _, err = cli("predict", run, "--input", source, "--output", out)
        assert code == 0, err
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        answers = json.loads((tmp_path / "preds.answers.json").read_text())
        assert answers == {r["id"]: r["prediction"] for r in rows}
        beside = sorted(p.name for p in tmp_path.glob("preds.*.json"))
        assert beside == ["preds.answers.json"] + (["preds.best_spans.json", "preds.na_probs.json"] if version == "v2" else [])
    if layout == "api-tuples":  # no ids given: each input's number, as read_squad numbers flat records
        ids = [str(i) for i in range(len(flat))]
    assert [r["id"] for r in rows] == ids
    assert [(r["question"], r["context"]) for r in rows] == [(r["question"], r["context"]) for r in flat]

    scored = toolkit.evaluate(run, overrides=["task.train_file=null", "task.max_eval_samples=null"])["eval"]  # the same file, as eval scores it
    evaluated = [json.loads(line) for line in (run / "predictions-eval.jsonl").read_text().splitlines()]
    assert [r["prediction"] for r in rows] == [r["prediction"] for r in evaluated]
    # eval's answers file holds those answers too ("" where v2.0 abstains), not its best spans
    assert list(json.loads((run / "predictions-eval.answers.json").read_text()).values()) == [r["prediction"] for r in rows]
    golds = {i: [a["text"] for a in r["answers"]] for i, r in zip(ids, flat)}
    mine = {r["id"]: r["prediction"] for r in rows}
    official = official_v1(golds, mine) if version == "v1" else _toolkit_names(official_v2(golds, mine))
    assert {k: v for k, v in scored.items() if k in official} == pytest.approx(official)


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_a_qa_export_line_names_the_answer_search_and_following_it_gives_predicts_answers(
        tmp_path: Path, cli, predict_runs: dict, version: str) -> None:
    """Finding: an extractive export's line named the tokenizer's cut alone; the window stride,
    n_best, max_answer_length and (v2.0) the null threshold, which no file of the folder holds,
    were left for a plain transformers user to guess, and other values give other answers from
    the same logits. The line names them as run_qa.py's flags; plain transformers (AutoTokenizer,
    AutoModelForQuestionAnswering) on the folder, windowed and searched as the line says, answers
    every question as `toolkit predict` does."""
    import torch
    import yaml
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer

    import toolkit

    run, data = predict_runs[version]
    code, out, err = cli("export", run, tmp_path / "out")
    assert code == 0, err
    flags = {k: float(v) for k, v in re.findall(r"--(\w+) (-?[\d.]+)", out)}
    task = yaml.safe_load((run / "recipe.yaml").read_text())["task"]
    expected = {"max_seq_length": task["max_length"], "doc_stride": task["doc_stride"],
                "n_best_size": task["n_best"], "max_answer_length": task["max_answer_length"]}
    assert flags == {**expected, **({"null_score_diff_threshold": 0.0} if version == "v2" else {})}, out
    assert ("--version_2_with_negative" in out) == (version == "v2"), out
    tok = AutoTokenizer.from_pretrained(tmp_path / "out")
    model = AutoModelForQuestionAnswering.from_pretrained(tmp_path / "out").eval()
    flat = _flat(data)
    mine = []
    for row in flat:  # the line's search, written out
        q, c = row["question"], row["context"]
        enc = tok(q, c, truncation="only_second", max_length=int(flags["max_seq_length"]),
                  stride=int(flags["doc_stride"]), return_overflowing_tokens=True, return_offsets_mapping=True,
                  padding=True, return_tensors="pt")
        offsets = enc.pop("offset_mapping")
        enc.pop("overflow_to_sample_mapping")
        with torch.no_grad():
            logits = model(**enc)
        start, end = logits.start_logits, logits.end_logits
        best, text, null = float("-inf"), "", float("inf")
        for w in range(len(start)):
            null = min(null, float(start[w, 0] + end[w, 0]))
            context = [i for i, side in enumerate(enc.sequence_ids(w)) if side == 1]
            n = int(flags["n_best_size"])
            for s in sorted(context, key=lambda i: -float(start[w, i]))[:n]:
                for e in sorted(context, key=lambda i: -float(end[w, i]))[:n]:
                    score = float(start[w, s] + end[w, e])
                    if s <= e < s + flags["max_answer_length"] and score > best:
                        best, text = score, c[int(offsets[w, s, 0]):int(offsets[w, e, 1])]
        mine.append("" if version == "v2" and null - best > flags["null_score_diff_threshold"] else text)
    predicted = toolkit.predict(run, [{k: r[k] for k in ("id", "question", "context")} for r in flat])
    assert mine == [r["prediction"] for r in predicted]
    assert version == "v1" or "" in mine  # the threshold decided somewhere


BAD_PREDICT_INPUTS = {
    "no questions": ({"data": [{"title": "x", "paragraphs": []}]}, "no questions found"),
    "id missing": ({"data": [{"title": "T", "paragraphs": [{"context": "Paris is in France.", "qas": [
        {"question": "Where?"}]}]}]}, "'id' is missing"),
    "question a number": ({"data": [{"title": "T", "paragraphs": [{"context": "Paris is in France.", "qas": [
        {"id": "a", "question": 5}]}]}]}, "'question' is a number, expected text"),
    "blank context": ({"data": [{"title": "T", "paragraphs": [{"context": " \u200b", "qas": [
        {"id": "a", "question": "Where?"}]}]}]}, "empty context or question"),
    "flat id null": ([{"id": None, "question": "Where?", "context": "Paris is in France."}], "its id 'id' is null"),
}


@pytest.mark.parametrize("entry", ["file", "stdin", "api"])
@pytest.mark.parametrize("case", list(BAD_PREDICT_INPUTS))
def test_a_qa_predict_input_it_cannot_read_is_one_line(tmp_path: Path, cli, monkeypatch, predict_runs: dict,
                                                      case: str, entry: str) -> None:
    """Finding: a SQuAD document whose articles hold no question was an IndexError traceback in
    predict (file and standard input). Each unreadable input is one line, exit 2, from the file,
    standard input and the API alike, and nothing is written."""
    import toolkit

    run, _ = predict_runs["v1"]
    content, said = BAD_PREDICT_INPUTS[case]
    source = tmp_path / "in.json"
    source.write_text(json.dumps(content, indent=1))
    if entry == "api":
        with pytest.raises(toolkit.UserError, match=re.escape(said)):
            toolkit.predict(run, content)
        return
    if entry == "stdin":
        monkeypatch.setattr("sys.stdin", source.open(encoding="utf-8"))
    code, _, err = cli("predict", run, "--input", "-" if entry == "stdin" else source, "--output", tmp_path / "o.jsonl")
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: ") and said in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.json"]


def test_a_generative_run_predicts_the_article_layout_with_ids_as_its_eval(tmp_path: Path, cli) -> None:
    """The same rule for a text-to-text run (T5): SQuAD's articles read, ids kept, the answers
    file {id: generated answer}, each the answer `toolkit eval` generates for that question."""
    import toolkit

    data = _dev_subset(tmp_path / "dev.json", "v1")
    doc = json.loads(data.read_text())
    doc["data"] = [{"title": a["title"], "paragraphs": a["paragraphs"][:1]} for a in doc["data"]]  # 2 paragraphs
    data.write_text(json.dumps(doc))
    run = toolkit.run("squad/v1.1/t5-base-full", [f"task.train_file={data}", f"task.eval_file={data}", "train.max_steps=1",
                                                  "task.max_length=96", "task.generation.max_new_tokens=3"],
                      runs_dir=tmp_path / "runs", smoke=True)
    code, _, err = cli("predict", run.dir, "--input", data, "--output", tmp_path / "p.jsonl")
    assert code == 0, err
    rows = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == [r["id"] for r in _flat(data)]
    assert json.loads((tmp_path / "p.answers.json").read_text()) == {r["id"]: r["prediction"] for r in rows}
    toolkit.evaluate(run.dir, overrides=["task.train_file=null", "task.max_eval_samples=null"])
    evaluated = [json.loads(line) for line in (run.dir / "predictions-eval.jsonl").read_text().splitlines()]
    assert [(r["id"], r["prediction"]) for r in rows] == [(r["id"], r["prediction"]) for r in evaluated]
