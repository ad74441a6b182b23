"""Text metrics: ROUGE (rouge-score), BLEU and chrF (sacreBLEU), SQuAD exact match and F1.

ROUGE and sacreBLEU come from their reference packages. SQuAD's normalisation and token F1 are
written out here because the official scripts are not packaged: this is the algorithm of the
official v1.1 / v2.0 evaluation scripts (lower-case, drop punctuation and the articles a/an/the,
collapse whitespace; F1 over the multiset of tokens; the best over the gold answers; an
unanswerable question's gold is the empty string), including v2.0's best null threshold.
"""

from __future__ import annotations

import collections
import math
import re
import string
from functools import lru_cache, partial
from typing import Sequence

ROUGE_KEYS = ("rouge1", "rouge2", "rougeL", "rougeLsum")


@lru_cache(maxsize=1)
def _segmenter():
    import pysbd

    return pysbd.Segmenter(language="en", clean=False)


def sentence_lines(text: str) -> str:
    """One sentence per line, which rougeLsum needs to be the summary-level LCS that published
    CNN/DM numbers report (without newlines it equals rougeL). pysbd: rule-based, pip-installable,
    no downloaded data (NLTK's punkt models cannot be fetched here)."""
    return "\n".join(s.strip() for s in _segmenter().segment(text) if s.strip())


def reference_lists(references: Sequence[str | Sequence[str]]) -> list[list[str]]:
    """Each example's references as a list: a string is its one reference. An example with none
    is refused (ValueError): no metric here has a score for it."""
    lists = [[refs] if isinstance(refs, str) else list(refs) for refs in references]
    empty = next((i for i, refs in enumerate(lists) if not refs), None)
    if empty is not None:
        raise ValueError(f"example {empty} has no reference to score against")
    return lists


def rouge(predictions: Sequence[str], references: Sequence[str | Sequence[str]]) -> dict[str, float]:
    """Mean F-measure of ROUGE-1/2/L/Lsum over examples, Porter stemming on (as
    `evaluate`'s rouge and the summarization example scripts use it). A mean, not
    rouge-score's bootstrap mid-point, so the number does not depend on a random resampling.
    An example may have several references (a list): each key's score is the best F-measure
    over them, as rouge-score's `score_multi` (and `evaluate`'s rouge on a list) takes it."""
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(list(ROUGE_KEYS), use_stemmer=True)
    totals = dict.fromkeys(ROUGE_KEYS, 0.0)
    for pred, refs in zip(predictions, reference_lists(references)):
        lines = sentence_lines(pred)
        scores = [scorer.score(sentence_lines(ref), lines) for ref in refs]  # (target, prediction)
        for key in ROUGE_KEYS:
            totals[key] += max(s[key].fmeasure for s in scores)
    n = max(len(predictions), 1)
    return {k: v / n for k, v in totals.items()}


_LETTERS = re.compile(r"[^\W_]", re.UNICODE)  # letters and digits of any script
_ROUGE_KEPT = re.compile(r"[a-z0-9]")  # what rouge-score's tokenizer keeps once text is lower-cased


def rouge_dropped(texts: Sequence[str]) -> float:
    """The fraction of the letters and digits in `texts` that rouge-score's tokenizer drops.

    Its tokenizer (the one `evaluate`'s rouge and transformers' summarization example use)
    lower-cases and keeps a-z and 0-9 alone, everything else a separator: Cyrillic, Greek,
    Arabic or CJK text is no tokens at all, and a summary identical to its reference scores 0."""
    letters = kept = 0
    for text in texts:
        found = _LETTERS.findall(text.lower())
        letters += len(found)
        kept += sum(bool(_ROUGE_KEPT.fullmatch(ch)) for ch in found)
    return 1 - kept / letters if letters else 0.0


def rouge_reads(ch: str) -> bool:
    """Whether rouge-score's tokenizer reads character `ch` (a-z and 0-9 once lower-cased)."""
    return bool(_ROUGE_KEPT.fullmatch(ch.lower()))


def rouge_unread(texts: Sequence[str]) -> list[int]:
    """The positions of the `texts` in which rouge-score's tokenizer finds no token at all (no
    a-z or 0-9 once lower-cased: Cyrillic, Greek, CJK, punctuation alone). Such a reference
    scores 0 against any prediction, its own text included; such a prediction scores 0 against
    any reference."""
    from rouge_score import tokenizers

    tokenizer = tokenizers.DefaultTokenizer(use_stemmer=False)  # stemming never empties a token list
    return [i for i, text in enumerate(texts) if not tokenizer.tokenize(text)]


# Scripts written without spaces between words -> the sacreBLEU tokenizers that find words in
# them (sacreBLEU's own for the language first); a space-based one (13a, intl, none) reads a whole
# sentence as one word. Kana before Han: Japanese text holds both.
SPACELESS_SCRIPTS = (("Japanese kana", re.compile(r"[\u3040-\u30ff]"), ("ja-mecab", "char")),
                     ("Chinese characters", re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]"), ("zh", "char")),
                     ("Thai", re.compile(r"[\u0e00-\u0e7f]"), ("char",)), ("Lao", re.compile(r"[\u0e80-\u0eff]"), ("char",)),
                     ("Khmer", re.compile(r"[\u1780-\u17ff]"), ("char",)), ("Myanmar", re.compile(r"[\u1000-\u109f]"), ("char",)))
SPACE_BASED = ("13a", "intl", "none")
HANGUL = re.compile(r"[\u1100-\u11ff\u3130-\u318f\uac00-\ud7af]")  # Korean: jamo, compatibility jamo, syllables


def written_in(texts: Sequence[str], script: re.Pattern) -> float:
    """The share of the letters and digits of `texts` that are of `script`."""
    letters = "".join("".join(_LETTERS.findall(t)) for t in texts)
    return len(script.findall(letters)) / len(letters) if letters else 0.0


def spaceless_script(texts: Sequence[str]) -> tuple[str, float, tuple[str, ...]] | None:
    """(script, its share of the letters, the tokenizers that fit it) where most of the letters in
    `texts` are of scripts written without spaces; None otherwise. The first script listed that
    occurs names the text (kana: Japanese, though its Han characters are counted with it)."""
    letters = "".join("".join(_LETTERS.findall(t)) for t in texts)
    if not letters:
        return None
    found = [(name, len(pattern.findall(letters)), fits) for name, pattern, fits in SPACELESS_SCRIPTS]
    share = sum(n for _, n, _ in found) / len(letters)
    name, _, fits = next(f for f in found if f[1]) if share > 0.5 else (None, 0, ())
    return (name, share, fits) if name else None


def sacrebleu_scores(predictions: Sequence[str], references: Sequence[str | Sequence[str]],
                     tokenize: str = "13a") -> tuple[dict[str, float], dict[str, str]]:
    """Corpus BLEU and chrF on detokenised text, and their sacreBLEU signatures. An example may
    have several references (a list, their number free per example): sacreBLEU's multi-reference
    scoring, the references as streams with None where an example has fewer (its way of a
    variable count; an empty string would be scored as a reference of length 0), its signature
    `nrefs:N` or `nrefs:var`. One reference each was `[references]` and is scored as before."""
    from sacrebleu.metrics import BLEU, CHRF

    lists = reference_lists(references)
    width = max(map(len, lists), default=1)
    streams = [[refs[j] if j < len(refs) else None for refs in lists] for j in range(width)]
    bleu, chrf = BLEU(tokenize=tokenize), CHRF()
    scores = {"bleu": bleu.corpus_score(list(predictions), streams).score,
              "chrf": chrf.corpus_score(list(predictions), streams).score}
    return scores, {"bleu": str(bleu.get_signature()), "chrf": str(chrf.get_signature())}


def sacrebleu_signatures(tokenize: str = "13a", counts: Sequence[int] = (1,)) -> dict[str, str]:
    """The signatures of the settings alone (sacreBLEU fills in the reference count once it has
    scored something, hence a corpus of one sentence per reference count in `counts`, the counts
    of references per example that were scored: one count, nrefs:N; several, nrefs:var)."""
    counts = sorted(set(counts)) or [1]
    _, signatures = sacrebleu_scores(["a"] * len(counts), [["a"] * n for n in counts], tokenize)
    return {f"{k}_signature": v for k, v in signatures.items()}


# --- SQuAD ---------------------------------------------------------------------------------------
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCT = frozenset(string.punctuation)


def answer_reads(ch: str) -> bool:
    """Whether the official SQuAD normalisation (`normalize_answer`) keeps character `ch` (ASCII
    punctuation and whitespace it drops)."""
    return not ch.isspace() and ch not in _PUNCT


def normalize_answer(text: str) -> str:
    """The official normalisation: lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def token_f1(prediction: str, gold: str, version: str = "v2") -> float:
    """Token F1 of the official scripts: v2.0 scores an empty answer 1 only against an empty
    gold; v1.1 has no such rule, so with nothing in common (empty included) it is 0."""
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if version == "v2" and (not pred or not ref):
        return float(pred == ref)
    common = collections.Counter(pred) & collections.Counter(ref)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


def best_over(metric, prediction: str, golds: Sequence[str]) -> float:
    return max(metric(prediction, g) for g in (golds or [""]))


def squad_scores(predictions: Sequence[str], golds: Sequence[Sequence[str]],
                 version: str = "v2") -> dict[str, float]:
    """exact_match and f1 as fractions (the official script prints them times 100), each version
    as its own official script scores the same predictions.

    v1.1 (evaluate-v1.1.py) takes the golds as listed ("the" included: EM 1 for "", F1 0) and
    has no breakdown. v2.0 (evaluate-v2.0.py on a predictions file, the leaderboard's call and
    `evaluate`'s squad_v2 as run_qa calls it) first drops golds that normalise to nothing
    (`v2_golds`), so a question left with none has "" as its one right answer; HasAns_/NoAns_
    are reported for whichever of the two sets has questions (the script's `if has_ans_qids`),
    split by the gold list as given, before that dropping (its `qid_to_has_ans` is
    `bool(qa['answers'])`): a question whose only answer is "the" is HasAns, scored against ""."""
    has = [i for i, g in enumerate(golds) if g]
    if version == "v2":
        golds = [v2_golds(g) for g in golds]
    f1_of = partial(token_f1, version=version)
    em = [best_over(exact_match, p, g) for p, g in zip(predictions, golds)]
    f1 = [best_over(f1_of, p, g) for p, g in zip(predictions, golds)]
    n = max(len(em), 1)
    out = {"exact_match": sum(em) / n, "f1": sum(f1) / n}
    if version == "v2":
        answerable = set(has)
        no = [i for i in range(len(golds)) if i not in answerable]
        for name, idx in (("HasAns", has), ("NoAns", no)):
            if idx:
                out[f"{name}_exact_match"] = sum(em[i] for i in idx) / len(idx)
                out[f"{name}_f1"] = sum(f1[i] for i in idx) / len(idx)
    return out


def best_null_threshold(answer_scores: Sequence[float], null_gaps: Sequence[float],
                        answerable: Sequence[bool], answered: Sequence[bool] | None = None) -> tuple[float, float]:
    """The official v2.0 `find_best_thresh`: answer "" when null_gap > threshold.

    answer_scores: EM (or F1) of each question's best non-null answer; null_gaps: the null score
    minus the best non-null score (higher: more likely unanswerable); answered: whether that
    non-null answer is non-empty (an unanswerable question costs 1 only then). Start from
    answering every question with "", then admit questions in increasing gap order; the best
    running score gives the threshold. The official script's gaps are probabilities, so its
    search starts at their floor, 0.0 ("" wherever the probability is above 0); logit gaps have
    no floor (they go below 0.0, and 0.0 is the fixed threshold here, not "answer nothing"), so
    where answering nothing everywhere scores best the threshold is `below_every` gap: a finite
    number, the same in the returned dict, metrics.json and eval-*.json (-inf was null in the
    files), which evaluate-v2.0.py's --na-prob-thresh takes to give best_* back.
    Returns (best score fraction, threshold)."""
    answered = [True] * len(null_gaps) if answered is None else answered
    score = best = float(sum(not a for a in answerable))
    threshold = below_every(null_gaps)
    for i in sorted(range(len(null_gaps)), key=lambda i: null_gaps[i]):
        score += answer_scores[i] if answerable[i] else (-1.0 if answered[i] else 0.0)
        if score > best:
            best, threshold = score, null_gaps[i]
    return best / max(len(null_gaps), 1), threshold


def below_every(gaps: Sequence[float]) -> float:
    """The largest whole number below every gap (a threshold at which every question answers
    ""): readable where it is printed, and below the largest finite float, the gap of a question
    with no span at all, too."""
    low = min(gaps, default=0.0)
    whole = float(math.ceil(low) - 1)
    return whole if whole < low else math.nextafter(low, -math.inf)


def v2_golds(golds: Sequence[str]) -> list[str]:
    """SQuAD v2.0's gold list: answers that normalise to nothing ("the", ".") are dropped, and a
    question left with none is unanswerable (empty list)."""
    return [g for g in golds if normalize_answer(g)]
