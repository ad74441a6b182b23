"""Extractive question answering: contexts in overlapping windows, spans back to text.

The windowing is the tokenizer's own (fast tokenizers: `return_overflowing_tokens` with `stride`,
`return_offsets_mapping`), as in transformers' run_qa.py. The span search over windows is written
here because no library packages it (transformers keeps it in an example script): for each window,
the `n_best` highest start and end logits among the context's tokens are paired (utils_qa.py takes
them over every position, then drops those outside the context: a choice that can move with a
batch's padding), spans reversed or longer than `max_answer_length` tokens are dropped, and the
best start+end score over all windows wins.
The null answer's score is the [CLS] (first token) start+end, the lowest over the windows.
"""

from __future__ import annotations

import sys
import unicodedata
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from toolkit.lazy import lazy

torch = lazy("torch", globals())


def window_features(tokenizer: Any, questions: list[str], contexts: list[str],
                    answers: list[dict], max_length: int, stride: int) -> dict[str, list]:
    """Tokenised windows of (question, context) with offsets (-1 outside the context) and the
    labelled start/end token of the first gold answer, or the first token when the window does
    not hold the whole answer (or there is none).

    A context token's offsets are those of its characters less the whitespace around them
    (`_trimmed`): byte-level BPE without trim_offsets (GPT-2's) folds the space before a word into
    its token, and a span cut at those offsets came back as " Curie" in predictions and in the
    answers file the official script reads."""
    questions, _, _ = cut_questions(tokenizer, questions, max_length, stride)
    # the question first, the context second and cut into windows, for every family: run_qa.py
    # swaps them where the tokenizer pads on the left (XLNet's convention), so a BERT checkpoint
    # whose tokenizer was saved with `padding_side: left` read its windows context first
    enc = tokenizer(questions, contexts, truncation="only_second", max_length=max_length,
                    stride=stride, return_overflowing_tokens=True, return_offsets_mapping=True)
    context_side = 1
    out: dict[str, list] = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
                            "offsets": [], "start_positions": [], "end_positions": [], "example_index": []}
    for i, offsets in enumerate(enc["offset_mapping"]):
        example = enc["overflow_to_sample_mapping"][i]
        seq = enc.sequence_ids(i)
        context = contexts[example]
        offsets = [_trimmed(context, *o) if s == context_side else [-1, -1] for o, s in zip(offsets, seq)]
        start, end = _label(offsets, answers[example])
        out["offsets"].append(offsets)
        out["start_positions"].append(start)
        out["end_positions"].append(end)
        out["example_index"].append(example)
    if "token_type_ids" in enc:
        out["token_type_ids"] = enc["token_type_ids"]
    return out


def question_room(tokenizer: Any, max_length: int, stride: int) -> int:
    """The most question tokens a window can hold: the context side must keep more than `stride`
    tokens, or the tokenizer cannot slide its windows (a Rust panic, a traceback, in run_qa.py
    as here) for one long question."""
    return max_length - tokenizer.num_special_tokens_to_add(pair=True) - stride - 1


def cut_questions(tokenizer: Any, questions: list[str], max_length: int, stride: int) -> tuple[list[str], int, int]:
    """(questions without leading space, how many were cut, the room): each question whole where
    it fits `question_room`, else its first tokens that do (BERT's run_squad cuts a question at
    max_query_length), so that the windows still hold its context instead of the run stopping."""
    room = question_room(tokenizer, max_length, stride)
    out = [q.lstrip() for q in questions]
    enc = tokenizer(out, add_special_tokens=False, return_offsets_mapping=True)
    cut = 0
    for i, ids in enumerate(enc["input_ids"]):
        if len(ids) <= room:
            continue
        cut += 1
        for keep in range(room, 0, -1):  # a prefix can tokenize longer than it did inside the text
            text = out[i][:enc["offset_mapping"][i][keep - 1][1]].rstrip()
            if len(tokenizer(text, add_special_tokens=False)["input_ids"]) <= room:
                break
        out[i] = text
    return out, cut, room


def _trimmed(context: str, first: int, last: int) -> list[int]:
    """[first, last) without the whitespace at either end; [-1, -1] (no place a span can start
    or end) for a token of whitespace alone, such as a byte-level token of line breaks. The end
    takes in the non-spacing marks that follow it: a tokenizer that strips accents (BERT uncased)
    drops every such mark (Unicode category Mn) from its tokens and their offsets, and an answer
    cut at them lost it ('Café' came back 'Cafe': exact match 0 against the context's own text).
    Taken by category, not by combining class: Devanagari's and Thai's vowel signs are Mn of
    class 0, and 'नमस्ते' came back 'नमस्त' (and a training answer ending its context with one
    was labelled as no answer)."""
    while first < last and context[first].isspace():
        first += 1
    while last > first and context[last - 1].isspace():
        last -= 1
    if first >= last:
        return [-1, -1]
    while last < len(context) and (unicodedata.category(context[last]) == "Mn"
                                   or unicodedata.combining(context[last])):
        last += 1
    return [first, last]


def _label(offsets: list[list[int]], answer: dict) -> tuple[int, int]:
    """Token positions of the first answer's characters (less the whitespace around them) in
    this window; (0, 0) if not all in it."""
    if not answer["text"]:
        return 0, 0
    text = answer["text"][0]
    first = answer["answer_start"][0] + len(text) - len(text.lstrip())
    last = answer["answer_start"][0] + len(text.rstrip())  # exclusive
    if first >= last:  # an answer of whitespace alone: no token holds it
        return 0, 0
    inside = [i for i, (a, _) in enumerate(offsets) if a >= 0]  # context tokens
    if not inside or offsets[inside[0]][0] > first or offsets[inside[-1]][1] < last:
        return 0, 0
    start = next(i for i in inside if offsets[i][1] > first)
    end = next(i for i in reversed(inside) if offsets[i][0] < last)
    return start, end


@dataclass
class Best:
    text: str
    score: float  # best non-null start+end logit; -inf: no span within the limits in any window
    null_score: float  # lowest [CLS] start+end over the example's windows

    @property
    def no_answer_score(self) -> float:
        """The null score minus the best span's score (logits; above a threshold the answer is "").
        A question with no span at all (no start before an end among the `n_best` of any window
        within `max_answer_length`: n_best 1, say) answers "" at every threshold: the largest
        finite float, not infinity, which predictions.jsonl wrote as `Infinity` (not JSON) and
        na_prob.json (now na_probs.json) as null, on which the official evaluate-v2.0.py stops
        with a TypeError."""
        return self.null_score - self.score if np.isfinite(self.score) else sys.float_info.max


def best_spans(start: np.ndarray, end: np.ndarray, offsets: np.ndarray, example_index: np.ndarray,
               contexts: Sequence[str], n_best: int, max_answer_length: int) -> list[Best]:
    """The best span of every example over its windows.

    start, end: (features, t) logits; offsets: (features, t, 2) character offsets, -1 outside the
    context (and in padding); example_index: (features,) which example each window belongs to."""
    found: list[Best] = [Best("", -np.inf, np.inf) for _ in contexts]
    for f in range(len(example_index)):
        ex = int(example_index[f])
        best = found[ex]
        best.null_score = min(best.null_score, float(start[f, 0] + end[f, 0]))
        valid = offsets[f, :, 0] >= 0  # (t,) context tokens
        starts = [i for i in np.argsort(-start[f]) if valid[i]][:n_best]
        ends = [i for i in np.argsort(-end[f]) if valid[i]][:n_best]
        for s in starts:
            for e in ends:
                if e < s or e - s + 1 > max_answer_length:
                    continue
                score = float(start[f, s] + end[f, e])
                if score > best.score:
                    best.text = contexts[ex][int(offsets[f, s, 0]):int(offsets[f, e, 1])]
                    best.score = score
    return found


class WindowCollator:
    """Pads windows for the QA head: token ids with the pad id, offsets with -1."""

    def __init__(self, tokenizer: Any) -> None:
        self.pad = tokenizer.pad_token_id

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        width = max(len(f["input_ids"]) for f in features)
        fill = {"input_ids": self.pad, "attention_mask": 0, "token_type_ids": 0}
        batch = {k: torch.tensor([list(f[k]) + [v] * (width - len(f[k])) for f in features])
                 for k, v in fill.items() if k in features[0]}  # (b, width)
        batch["offsets"] = torch.tensor([list(f["offsets"]) + [[-1, -1]] * (width - len(f["offsets"]))
                                         for f in features])  # (b, width, 2)
        for key in ("start_positions", "end_positions", "example_index"):
            batch[key] = torch.tensor([f[key] for f in features])
        return batch
