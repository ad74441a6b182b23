"""`mlm`: BERT's masked language modelling (Devlin et al. 2019) for any encoder with an MLM head.

15% of the tokens are selected (whole words with `whole_word_mask`); of those 80% become the mask
token, 10% a random token, 10% stay; only selected tokens carry labels. Special tokens are never
selected, and padding is added after masking so it never is either. Evaluation: perplexity of
the masked held-out tokens under masks drawn once from `corruption_seed` (see tasks/_text.py).

The masking is written here rather than taken from transformers' DataCollatorForLanguageModeling
/ DataCollatorForWholeWordMask because those draw from torch's global RNG inside the collator
(no fixed evaluation masks) and the whole-word one works on token strings ("##") that RoBERTa's
tokenizer does not use; this one is a pure function of (ids, rng) and takes words as the runs of
the text between whitespace (`_text.word_starts`, the fast tokenizer's character offsets, as
transformers 5's whole-word collator draws them), so any encoder's tokenizer works and the
statistics can be tested directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from toolkit.errors import UserError
from toolkit.tasks import TASKS
from toolkit.tasks._lm import IGNORE
from toolkit.tasks._text import TextTask, whose


def mask_tokens(ids: np.ndarray, special: np.ndarray, rng: np.random.Generator, mask_id: int,
                vocab_size: int, probability: float = 0.15, mask_ratio: float = 0.8,
                random_ratio: float = 0.1, word_start: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(input_ids, labels) of one block: each token (or each word, given `word_start`) is selected
    with `probability`; selected tokens become `mask_id` with `mask_ratio`, a random id with
    `random_ratio`, else stay. `special` (1 = never select) covers [CLS], [SEP], padding. The
    first token always begins a word."""
    ids = np.asarray(ids, dtype=np.int64)
    allowed = ~np.asarray(special, dtype=bool)
    if word_start is None:
        selected = rng.random(len(ids)) < probability
    else:
        starts = np.asarray(word_start, dtype=np.int64).copy()
        starts[:1] = 1  # the block's first token begins a word: the tail of a word the block's
        # start cut is a word of its own here. It was merged into the next word, and a block
        # with no word start at all (one long word: a protein, a URL) was an IndexError
        word = np.cumsum(starts) - 1  # word index of each token
        selected = (rng.random(int(word[-1]) + 1) < probability)[word]
    selected &= allowed
    labels = np.where(selected, ids, IGNORE)
    roll = rng.random(len(ids))
    out = ids.copy()
    out[selected & (roll < mask_ratio)] = mask_id
    swap = selected & (roll >= mask_ratio) & (roll < mask_ratio + random_ratio)
    out[swap] = rng.integers(0, vocab_size, int(swap.sum()))
    return out, labels


@TASKS.register("mlm")
@dataclass(kw_only=True)
class MaskedLM(TextTask):
    head = "masked-lm"
    kind, examples = "encoder", "BERT, RoBERTa"
    instead = "clm for decoders, denoise or span_corruption for encoder-decoders"
    perplexity = True  # of the labelled tokens
    causal_shift: ClassVar[bool] = False  # each position predicts its own (masked) token

    mlm_probability: float = field(default=0.15, metadata={"min": 0.01, "max": 0.9})
    mask_ratio: float = field(default=0.8, metadata={"min": 0.0, "max": 1.0})
    random_ratio: float = field(default=0.1, metadata={"min": 0.0, "max": 1.0})
    whole_word_mask: bool = False

    def check(self) -> None:
        super().check()
        if self.mask_ratio + self.random_ratio > 1.0:
            raise UserError("task.random_ratio: mask_ratio + random_ratio must be at most 1")


    def metric_info(self) -> dict[str, str]:
        """Which perplexity and accuracy these are: a masked token is predicted from the block it
        was packed in, or from its document alone (`line_by_line`): other contexts, other numbers
        of the same model, never a grid to choose the lower from (as clm's windows)."""
        seen = (f"each document alone, cut at {self.max_length} tokens" if self.line_by_line
                else f"documents packed into blocks of {self.max_length} tokens")
        return {**super().metric_info(), **{k: f"masked tokens of {seen}" for k in ("perplexity", "accuracy")}}

    def special_mask(self) -> bool:
        return True  # [CLS] doc [SEP] per document, as BERT was pretrained: never selected

    def word_starts(self) -> bool:
        return self.whole_word_mask

    # tokenizer_named: left True (not checked at validate). Every encoder with a masked-LM head
    # (the kind `require_kind` checks) comes with its mask token, and BERT's tokenizer files leave
    # it to the class's default ([MASK]): asking would read the tokenizer (transformers, seconds)
    # at the validate of every BERT recipe. The run refuses a tokenizer without one.

    def refuse_tokenizer(self, tokenizer: Any, checkpoint: str | None = None) -> None:
        if tokenizer.mask_token_id is None:
            raise UserError(f"task.name: mlm needs a tokenizer with a mask token; {whose(checkpoint)} has none")

    def corrupt(self, example: dict, rng: np.random.Generator, tokenizer: Any) -> dict:
        self.refuse_tokenizer(tokenizer)
        ids = np.asarray(example["input_ids"])
        special = np.asarray(example["special_tokens_mask"], dtype=bool) | np.isin(ids, tokenizer.all_special_ids)
        inputs, labels = mask_tokens(ids, special, rng, tokenizer.mask_token_id, len(tokenizer),
                                     self.mlm_probability, self.mask_ratio, self.random_ratio,
                                     example.get("word_start") if self.whole_word_mask else None)
        return {"input_ids": inputs.tolist(), "labels": labels.tolist()}
