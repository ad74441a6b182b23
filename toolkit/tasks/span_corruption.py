"""`span_corruption`: T5's pretraining objective (Raffel et al. 2020).

15% of a block's tokens (noise density) are split into spans of mean length 3; the input keeps
the other tokens and puts one sentinel (<extra_id_0>, <extra_id_1>, ...) in place of each span;
the target is each sentinel followed by the span it hides. Both end with </s>. Raw blocks are
sized by T5's `compute_input_and_target_lengths` so that the input is `max_length` long (never
more) and nothing is truncated. The noise mask follows the reference `random_spans_noise_mask`
(t5.data.preprocessors; transformers' run_t5_mlm_flax.py), re-written here on a numpy Generator
because neither library exposes it as a function of (length, rng).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from toolkit.errors import UserError
from toolkit.tasks import TASKS
from toolkit.tasks._text import TextTask, config_value, tokenizer_files, whose


def noise_counts(length: int, density: float, mean_span: float) -> tuple[int, int]:
    """(noise tokens, noise spans) of a block of `length` tokens, as the reference rounds them:
    at least one of each kind of token, and no more spans than either kind has tokens (each
    noise span sits between two non-empty kept runs). The spans were noise / mean_span: at
    mean_noise_span_length 1 on an odd block at density 0.5 more spans than kept tokens, so two
    spans ran together and the block held fewer sentinels than counted."""
    noise = int(round(length * density))
    kept = length - noise
    noise = min(max(noise, 1), length - 1)
    return noise, max(int(round(min(noise, kept) / mean_span)), 1)


def compute_input_and_target_lengths(inputs_length: int, density: float = 0.15,
                                     mean_span: float = 3.0) -> tuple[int, int]:
    """(raw tokens per block, target length) so that the corrupted input, sentinels and </s>
    included, is at most `inputs_length` long (T5's reference computation, on the counts the
    noise mask draws: `noise_counts`). The reference counts unclamped spans and only searches
    upwards from `inputs_length` raw tokens: where a block's spans are as many as its noise
    tokens (mean_noise_span_length 1, or a short block whose span count is raised to 1) the input
    came out one token longer than max_length."""
    def lengths(tokens: int) -> tuple[int, int]:
        noise, spans = noise_counts(tokens, density, mean_span)
        return tokens - noise + spans + 1, noise + spans + 1

    tokens = inputs_length
    while tokens > 2 and lengths(tokens)[0] > inputs_length:
        tokens -= 1
    while lengths(tokens + 1)[0] <= inputs_length:
        tokens += 1
    _, targets = lengths(tokens)
    if density == 0.5 and targets > inputs_length:  # the reference's own special case
        tokens, targets = tokens - 1, targets - 1
    return tokens, targets


def _segments(items: int, segments: int, rng: np.random.Generator) -> np.ndarray:
    """`items` split into `segments` non-empty runs at random: their lengths."""
    first = np.zeros(items, bool)
    first[1 + rng.permutation(items - 1)[:segments - 1]] = True  # run starts after position 0
    return np.bincount(np.cumsum(first), minlength=segments)


def random_spans_noise_mask(length: int, rng: np.random.Generator, density: float = 0.15,
                            mean_span: float = 3.0) -> np.ndarray:
    """(length,) bool: noise spans alternating with kept runs, the block starting with a kept run."""
    noise, spans = noise_counts(length, density, mean_span)
    noise_lengths = _segments(noise, spans, rng)
    kept_lengths = _segments(length - noise, spans, rng)
    interleaved = np.stack([kept_lengths, noise_lengths], axis=1).reshape(-1)  # (2 * spans,)
    span_index = np.repeat(np.arange(2 * spans), interleaved)
    return span_index % 2 == 1


def span_corruption(ids: np.ndarray, noise: np.ndarray, sentinels: list[int],
                    eos_id: int) -> tuple[list[int], list[int]]:
    """(input, target): each noise span -> the next sentinel in the input; each sentinel followed
    by its span in the target; both closed by </s>."""
    starts = noise & ~np.concatenate([[False], noise[:-1]])  # first token of each noise span
    if starts.sum() > len(sentinels):
        raise UserError(f"task: {int(starts.sum())} noise spans in a block and only {len(sentinels)} "
                        "sentinel tokens; lower task.max_length or raise mean_noise_span_length")
    span_no = np.cumsum(starts) - 1  # which span each token is in
    inputs, targets = [], []
    for i, token in enumerate(np.asarray(ids).tolist()):
        if not noise[i]:
            inputs.append(token)
            continue
        if starts[i]:
            inputs.append(sentinels[span_no[i]])
            targets.append(sentinels[span_no[i]])
        targets.append(token)
    return inputs + [eos_id], targets + [eos_id]


@TASKS.register("span_corruption")
@dataclass(kw_only=True)
class SpanCorruption(TextTask):
    head = "seq2seq-lm"
    kind, examples = "encoder-decoder", "T5"
    instead = "denoise for BART, mlm for encoders, clm for decoders"
    packs_as = "run_t5_mlm_flax.py"

    noise_density: float = field(default=0.15, metadata={"min": 0.01, "max": 0.5})
    mean_noise_span_length: float = field(default=3.0, metadata={"min": 1.0})


    def tokenizer_named(self, folder: Path) -> bool:
        """<extra_id_0> in a vocabulary or the added tokens, or a positive `extra_ids` (T5's
        tokenizer classes add that many sentinels of their own)."""
        return named_sentinels(tokenizer_files(folder)) > 0

    def check_tokenizer(self, folder: Path, checkpoint: str) -> None:
        """The sentinels, and enough of them for a block's spans (`refuse_spans`): read off the
        files where they name them, else off the tokenizer (`refuse_tokenizer`)."""
        named = named_sentinels(tokenizer_files(folder))
        if named:
            self.refuse_spans(named, checkpoint)
        else:
            super().check_tokenizer(folder, checkpoint)

    def refuse_tokenizer(self, tokenizer: Any, checkpoint: str | None = None) -> None:
        self.refuse_spans(len(sentinel_ids(tokenizer, checkpoint)), checkpoint)

    def spans_per_block(self, max_length: int | None = None) -> int:
        """The noise spans of every full block: `random_spans_noise_mask` draws exactly this many."""
        tokens = compute_input_and_target_lengths(max_length or self.max_length, self.noise_density,
                                                  self.mean_noise_span_length)[0]
        return noise_counts(tokens, self.noise_density, self.mean_noise_span_length)[1]

    def refuse_spans(self, sentinels: int, checkpoint: str | None = None) -> None:
        """One line where a block has more noise spans than the tokenizer has sentinels (one per
        span): from the recipe's numbers, at validate. It was refused only when the first block
        was encoded, after the model had loaded."""
        spans = self.spans_per_block()
        if spans <= sentinels:
            return
        low, high = 1, self.max_length  # the longest max_length whose blocks fit (spans grow with it)
        while low < high:
            middle = (low + high + 1) // 2
            low, high = (middle, high) if self.spans_per_block(middle) <= sentinels else (low, middle - 1)
        raise UserError(f"task.max_length: {self.max_length} at noise_density {self.noise_density} and "
                        f"mean_noise_span_length {self.mean_noise_span_length} puts {spans} noise spans in a "
                        f"block, and {whose(checkpoint)} has {sentinels} sentinel tokens (one a span); "
                        f"use task.max_length at most {low}, or raise mean_noise_span_length")

    def block_length(self, tokenizer: Any) -> int:
        return compute_input_and_target_lengths(self.max_length, self.noise_density,
                                                self.mean_noise_span_length)[0]

    def corrupt(self, example: dict, rng: np.random.Generator, tokenizer: Any) -> dict:
        ids = np.asarray(example["input_ids"])
        if len(ids) < 2:
            return {"input_ids": ids.tolist() + [tokenizer.eos_token_id], "labels": [tokenizer.eos_token_id]}
        noise = random_spans_noise_mask(len(ids), rng, self.noise_density, self.mean_noise_span_length)
        inputs, targets = span_corruption(ids, noise, sentinel_ids(tokenizer), tokenizer.eos_token_id)
        return {"input_ids": inputs, "labels": targets}


def named_sentinels(files: dict[str, str]) -> int:
    """How many sentinels the tokenizer files name (<extra_id_0> up without a gap, or a positive
    `extra_ids`: T5's tokenizer classes add that many of their own); 0: none named."""
    extra = config_value(files, "extra_ids")
    named = {int(n) for text in files.values() for n in re.findall(r"<extra_id_(\d+)>", text)}
    count = next(i for i in range(len(named) + 1) if i not in named)
    return max(count, extra if isinstance(extra, int) and not isinstance(extra, bool) else 0)


def sentinel_ids(tokenizer: Any, checkpoint: str | None = None) -> list[int]:
    """<extra_id_0>, <extra_id_1>, ... as the tokenizer has them (T5: ids counting down from the top)."""
    found = []
    for i in range(1000):
        token = f"<extra_id_{i}>"
        tid = tokenizer.convert_tokens_to_ids(token)
        if tid is None or tid == tokenizer.unk_token_id:
            break
        found.append(tid)
    if not found:
        raise UserError(f"task.name: span_corruption needs T5's sentinel tokens <extra_id_0>, ...; {whose(checkpoint)} "
                        "has none; use a T5 checkpoint, or denoise for BART and encoder-decoder warm starts, "
                        "mlm for encoders")
    return found
