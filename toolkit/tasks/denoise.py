"""`denoise`: BART's pretraining (Lewis et al. 2020): sentence permutation, then text infilling.

Text infilling: span lengths are drawn from Poisson(3) until they cover 30% of the block's words
(the last one trimmed to fit); each span of length >= 1 starting at a random word is replaced by
ONE mask token, each zero-length span inserts a mask token. The decoder reconstructs the
original block: <s>, documents each closed by </s> (as run_bart_dlm_flax closes them), </s>. This follows fairseq's DenoisingDataset (mask 0.3, Poisson lambda 3,
replace-length 1, whole words, sentences split at tokens made only of '.', '?' and '!' followed by a space: `full_stops`); it is written here because
neither transformers nor datasets ships it, and kept a pure function of (ids, rng) so the tests
can check its statistics. Not reproduced: fairseq's optional random-token spans (mask-random).
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from toolkit.errors import UserError
from toolkit.tasks import TASKS
from toolkit.tasks._lm import special_frame
from toolkit.tasks._text import TextTask, config_value, tokenizer_files, whose


def permute_sentences(is_end: np.ndarray, rng: np.random.Generator,
                      is_space: np.ndarray | None = None) -> np.ndarray:
    """Token positions of a block with its sentences shuffled (each sentence ends after a run of
    `is_end` tokens: a full stop and the document's </s> after it close one sentence; the tail is
    one too): `ids[order]` is the permuted block. Whitespace-only tokens (`is_space`) in or right
    after such a run belong to it: WikiText's and PTB's every line ends in a space (" ... worms . "
    is '.', ' ', '</s>' to BART), and the run ended at the full stop, so the space and the
    document's </s> were a sentence of their own, shuffled away from the document they closed
    (its last sentence ran into the next document's first in the noisy input), exit 0."""
    n = len(is_end)
    is_end = np.asarray(is_end, bool)
    joined = is_end | (np.zeros(n, bool) if is_space is None else np.asarray(is_space, bool))
    cuts = [0]
    start = None
    for i in range(n):  # runs of end and whitespace tokens; one holding an end closes a sentence
        if joined[i] and start is None:
            start = i
        if start is not None and (i + 1 == n or not joined[i + 1]):
            if is_end[start:i + 1].any() and i + 1 < n:
                cuts.append(i + 1)
            start = None
    cuts.append(n)
    sentences = [np.arange(a, b) for a, b in zip(cuts[:-1], cuts[1:]) if b > a]
    if not sentences:
        return np.arange(n)
    return np.concatenate([sentences[i] for i in rng.permutation(len(sentences))])


def span_lengths(budget: int, rng: np.random.Generator, poisson_lambda: float = 3.0) -> np.ndarray:
    """Poisson(lambda) lengths drawn until they sum to `budget` words, the last one trimmed."""
    lengths = np.zeros(0, dtype=np.int64)
    while lengths.sum() < budget:
        lengths = np.concatenate([lengths, rng.poisson(poisson_lambda, size=max(budget, 1))])
    cum = np.cumsum(lengths)
    last = int(np.searchsorted(cum, budget))  # first span whose cumulative length reaches budget
    lengths = lengths[:last + 1].copy()
    lengths[last] = budget - (cum[last - 1] if last > 0 else 0)
    return lengths


def text_infilling(ids: np.ndarray, rng: np.random.Generator, mask_id: int, ratio: float = 0.3,
                   poisson_lambda: float = 3.0, word_start: np.ndarray | None = None) -> np.ndarray:
    """`ids` with spans of whole words (Poisson lengths, `ratio` of the words in all) each
    replaced by one `mask_id`, and one `mask_id` inserted per zero-length span, up to the tokens
    the spans removed: the noisy input is never longer than `ids`, so a block of max_length fits
    the positions (with a small poisson_lambda most spans are empty, and uncapped inserts made the
    input longer than the block: past BART's 1024 positions an IndexError mid-run)."""
    ids = np.asarray(ids, dtype=np.int64)
    n = len(ids)
    if n == 0:
        return ids
    flags = np.ones(n, bool) if word_start is None else np.asarray(word_start, bool).copy()
    flags[0] = True  # the block's first token begins a word (the tail of a word its start cut):
    # a block with no word start at all (one word longer than the block) went through unmasked
    starts = np.flatnonzero(flags)
    budget = math.ceil(len(starts) * ratio)
    if budget == 0:  # mask_ratio 0: sentence permutation alone (one of BART's ablations)
        return ids
    lengths = span_lengths(budget, rng, poisson_lambda)
    spans, inserts = lengths[lengths > 0][:len(starts)], int((lengths == 0).sum())
    chosen = rng.permutation(len(starts))[:len(spans)]  # word index each span starts at
    bounds = np.append(starts, n)  # token where each word starts, then the end
    masked, covered = np.zeros(n, bool), np.zeros(n, bool)  # covered: inside a span, not its start
    for word, length in zip(chosen, spans):
        a, b = bounds[word], bounds[min(word + length, len(starts))]
        masked[a:b] = True
        covered[a + 1:b] = True
    keep_as_mask = masked & ~covered  # span starts not swallowed by an earlier span
    out = np.where(keep_as_mask, mask_id, ids)[~masked | keep_as_mask]
    return insert_masks(out, min(inserts, n - len(out)), rng, mask_id)


def insert_masks(ids: np.ndarray, count: int, rng: np.random.Generator, mask_id: int) -> np.ndarray:
    """`count` mask tokens at random positions among len(ids) + count slots."""
    if count == 0:
        return ids
    total = len(ids) + count
    at = np.zeros(total, bool)
    at[rng.permutation(total)[:count]] = True
    out = np.full(total, mask_id, dtype=np.int64)
    out[~at] = ids
    return out


@TASKS.register("denoise")
@dataclass(kw_only=True)
class Denoise(TextTask):
    head = "seq2seq-lm"
    kind, examples = "encoder-decoder", "BART"
    instead = "span_corruption for T5, mlm for encoders, clm for decoders"
    packs_as = "run_bart_dlm_flax.py"

    mask_ratio: float = field(default=0.3, metadata={"min": 0.0, "max": 0.9})
    poisson_lambda: float = field(default=3.0, metadata={"min": 0.0})
    permute_sentences: bool = True

    def check(self) -> None:
        super().check()
        if self.poisson_lambda <= 0:  # every span would be empty: no draw ever covers the budget
            raise UserError(f"task.poisson_lambda: {self.poisson_lambda} gives only zero-length spans, "
                            "which never reach task.mask_ratio of the words; use a mean above 0 (BART: 3)")

    def block_length(self, tokenizer: Any) -> int:
        return self.max_length - sum(map(len, special_frame(tokenizer)))  # room for <s> and </s> (`corrupt`)

    def document_start(self, tokenizer: Any) -> list[int]:
        return []  # each block begins with <s> (fairseq's: `corrupt`); documents in it are split by their </s>

    def word_starts(self) -> bool:
        return True

    def tokenizer_named(self, folder: Path) -> bool:
        return config_value(tokenizer_files(folder), "mask_token") is not None

    def refuse_tokenizer(self, tokenizer: Any, checkpoint: str | None = None) -> None:
        if tokenizer.mask_token_id is None:
            raise UserError(f"task.name: denoise needs a tokenizer with a mask token (BART's <mask>); "
                            f"{whose(checkpoint)} has none; for T5 use span_corruption")

    def corrupt(self, example: dict, rng: np.random.Generator, tokenizer: Any) -> dict:
        self.refuse_tokenizer(tokenizer)
        ids, starts = np.asarray(example["input_ids"]), np.asarray(example["word_start"], bool)
        order = np.arange(len(ids))
        if self.permute_sentences:  # a document's end closes its last sentence too
            order = permute_sentences(full_stops(ids, tokenizer) | np.isin(ids, self.document_end(tokenizer)), rng,
                                      whitespace_tokens(ids, tokenizer))
        noisy = text_infilling(ids[order], rng, tokenizer.mask_token_id, self.mask_ratio,
                               self.poisson_lambda, starts[order])
        # the block is one text to the model, framed as the tokenizer frames one (BART: <s> .. </s>,
        # fairseq's; a BERT2BERT warm start: [CLS] .. [SEP]). It was <s> + block + eos_token_id
        # whatever the tokenizer: BERT's has no EOS, and the None in the block was a TypeError
        # traceback at the first batch of a recipe validate had passed
        before, after = special_frame(tokenizer)
        return {"input_ids": before + noisy.tolist() + after, "labels": before + ids.tolist() + after}


_MEMO: "weakref.WeakKeyDictionary[Any, dict[tuple[str, int], bool]]" = weakref.WeakKeyDictionary()


def _asked(ids: np.ndarray, tokenizer: Any, kind: str, ask: Any) -> np.ndarray:
    """(len(ids),) bool: `ask(token string)` of each id's token, special tokens False; each id
    asked of the tokenizer once per kind."""
    try:
        memo = _MEMO.setdefault(tokenizer, {})
    except TypeError:  # a tokenizer no weak reference can hold: asked afresh
        memo = {}
    ids = np.asarray(ids, dtype=np.int64).tolist()
    special = set(tokenizer.all_special_ids)
    for i in {i for i in ids if (kind, i) not in memo}:
        memo[kind, i] = i not in special and bool(ask(tokenizer.convert_ids_to_tokens(i)))
    return np.array([memo[kind, i] for i in ids], bool)


def whitespace_tokens(ids: np.ndarray, tokenizer: Any) -> np.ndarray:
    """(len(ids),) bool: tokens that are whitespace alone (byte-level BPE's 'Ġ' and 'Ċ')."""
    return _asked(ids, tokenizer, "space", lambda t: not tokenizer.convert_tokens_to_string([t]).strip())


def full_stops(ids: np.ndarray, tokenizer: Any) -> np.ndarray:
    """(len(ids),) bool: the sentence ends of a block: a full stop, question or exclamation mark,
    or a token of several ('?!', '...': `sentence_ends`), followed by whitespace, a special token or the block's end. Where the tokens show the spacing
    (byte-level BPE, SentencePiece), a mark with a letter or digit right after it is no end: the
    dot of a decimal (3.14), a URL (www.example.com), WikiText's number separator (60 @.@ 5) split
    a sentence in two and the permutation moved its halves apart, exit 0. A WordPiece vocabulary
    (BERT's) writes no spacing, and every mark ends a sentence there."""
    ids = np.asarray(ids, dtype=np.int64)
    marks = np.isin(ids, sentence_ends(tokenizer))
    if not marks.any():
        return marks
    probe = tokenizer.convert_ids_to_tokens(sentence_ends(tokenizer)[0])
    joined = _asked(ids[1:], tokenizer, "joined",
                    lambda t: not tokenizer.convert_tokens_to_string([probe, t])[len(tokenizer.convert_tokens_to_string([probe])):][:1].isspace())
    return marks & ~np.append(joined, False)


END_MARKS = ".!?"  # the characters that end a sentence; a token made of them alone is an end
_ENDS: "weakref.WeakKeyDictionary[Any, list[int]]" = weakref.WeakKeyDictionary()


def sentence_ends(tokenizer: Any) -> list[int]:
    """Ids of the tokens made only of sentence-ending marks (`END_MARKS`), with or without a
    word-start marker: '.', '?', '!' and the vocabulary's runs of them ('?!', '!!', '...', 'Ġ?!').
    It was the three single marks alone: byte-level BPE writes "Really?! He ran." with one '?!'
    token, so that sentence ran into the next one and the permutation moved them as one, exit 0.
    The single full stop comes first (`full_stops` probes the spacing with it)."""
    try:
        return _ENDS[tokenizer]
    except (KeyError, TypeError):
        pass
    found = []
    for mark in END_MARKS:
        for token in (mark, "\u0120" + mark, "\u2581" + mark):
            i = tokenizer.convert_tokens_to_ids(token)
            if i is not None and i != tokenizer.unk_token_id:
                found.append(i)
    special = set(tokenizer.all_special_ids)
    for token, i in sorted(tokenizer.get_vocab().items(), key=lambda item: item[1]):
        body = token.lstrip("\u0120\u2581")
        if len(body) > 1 and not set(body) - set(END_MARKS) and i not in special and i not in found:
            found.append(i)
    try:
        _ENDS[tokenizer] = found
    except TypeError:  # a tokenizer no weak reference can hold: looked up afresh
        pass
    return found
