"""T5 span corruption and BART denoising measured against their papers' definitions
(no training)."""

from __future__ import annotations

import collections
from typing import Any

from parity.common import ROOT


# --- objectives: T5 span corruption and BART denoising against their papers' definitions ------
def objective_blocks(recipe_path: str, tokenizer: str, max_length: int) -> tuple[Any, Any, Any]:
    """(task, tokenizer, blocks) of WikiText-2 valid packed as the toolkit packs them."""
    from transformers import AutoTokenizer

    from toolkit import models
    from toolkit.recipe import find_recipe, load

    recipe = load(find_recipe(str(ROOT / recipe_path)), [f"task.max_length={max_length}", "train.seed=42"])
    tok = AutoTokenizer.from_pretrained(str(models.tokenizer_dir() / tokenizer))
    raw = recipe.task.load()["train"]
    return recipe.task, tok, recipe.task.pack(raw, tok)


def span_corruption_stats(examples: int, max_length: int = 128) -> dict:
    """Raffel et al. 2020 (T5), section 3.1.4: noise density 0.15, mean span length 3; each span
    -> one sentinel in the input, the target = the sentinels each followed by their span, </s>.
    Measured over `examples` corruptions (blocks reused with fresh generators)."""
    import numpy as np

    task, tok, blocks = objective_blocks("recipes/pretrain/wikitext-2/t5-base-span_corruption.yaml", "t5", max_length)
    sentinels = [tok.convert_tokens_to_ids(f"<extra_id_{i}>") for i in range(100)]
    noise = spans = tokens = 0
    layout_ok = reconstructs = longest_input = 0
    for i in range(examples):
        ids = blocks[i % len(blocks)]["input_ids"]
        out = task.corrupt({"input_ids": ids}, np.random.default_rng(i), tok)
        inp, tgt = out["input_ids"], out["labels"]
        in_sent = [t for t in inp if t in sentinels]
        tgt_sent = [t for t in tgt if t in sentinels]
        layout_ok += in_sent == sentinels[:len(in_sent)] and tgt_sent == in_sent and tgt[0] == sentinels[0] \
            and inp[-1] == tok.eos_token_id and tgt[-1] == tok.eos_token_id
        reconstructs += rebuild_span_corruption(inp[:-1], tgt[:-1], sentinels) == list(ids)
        tokens += len(ids)
        noise += len(tgt) - 1 - len(tgt_sent)
        spans += len(tgt_sent)
        longest_input = max(longest_input, len(inp))
    length = len(blocks[0]["input_ids"])
    expected_noise = min(max(round(length * 0.15), 1), length - 1)  # T5's rounding of 15% of a block
    return {"blocks": examples, "block_tokens": length, "noise_density (paper 0.15)": noise / tokens,
            "noise_density of T5's rounding": expected_noise / length,
            "mean_noise_span_length (paper 3)": noise / spans,
            "mean span length of T5's rounding": expected_noise / max(round(expected_noise / 3.0), 1), "sentinel_layout_ok": layout_ok / examples,
            "input_and_target_rebuild_block": reconstructs / examples, "longest_input": longest_input,
            "max_length": max_length}


def rebuild_span_corruption(inp: list[int], tgt: list[int], sentinels: list[int]) -> list[int]:
    """The original block from T5's input and target: each sentinel in the input replaced by the
    tokens that follow the same sentinel in the target."""
    spans: dict[int, list[int]] = {}
    current = None
    for t in tgt:
        if t in sentinels:
            current = spans.setdefault(t, [])
        elif current is not None:
            current.append(t)
    return [x for t in inp for x in (spans.get(t, []) if t in sentinels else [t])]


def denoise_stats(examples: int, max_length: int = 128) -> dict:
    """Lewis et al. 2020 (BART), section 2.2 / 5.1: 30% of the words masked in spans of
    Poisson(3) length, each span one <mask> (a 0-length span inserts one), sentences permuted;
    the target is the original block. Measured: the fraction of tokens the input lost to masks,
    <mask>s per masked token, and the target equal to <s> block </s>."""
    import numpy as np

    from toolkit.tasks.denoise import span_lengths

    task, tok, blocks = objective_blocks("recipes/pretrain/wikitext-2/bart-base-denoise.yaml", "bart-base", max_length)
    lost = tokens = masks = target_ok = same_multiset = 0
    for i in range(examples):
        block = blocks[i % len(blocks)]
        ids = block["input_ids"]
        out = task.corrupt({"input_ids": ids, "word_start": block["word_start"]}, np.random.default_rng(i), tok)
        inp = out["input_ids"][1:-1]
        kept = [t for t in inp if t != tok.mask_token_id]
        masks += len(inp) - len(kept)
        lost += len(ids) - len(kept)
        tokens += len(ids)
        target_ok += out["labels"] == [tok.bos_token_id, *ids, tok.eos_token_id]
        same_multiset += not (collections.Counter(kept) - collections.Counter(ids))
    lengths = np.concatenate([span_lengths(1000, np.random.default_rng(s)) for s in range(100)])
    return {"blocks": examples, "block_tokens": len(blocks[0]["input_ids"]),
            "masked_token_ratio (paper: 30% of words, spans may overlap)": lost / tokens,
            "masks_per_masked_token": masks / max(lost, 1), "target_is_original": target_ok / examples,
            "input_tokens_from_block": same_multiset / examples,
            "span_length_mean (paper: Poisson lambda 3)": float(lengths[:-1].mean()),
            "span_length_zero_share (Poisson(3): e^-3 = 0.0498)": float((lengths[:-1] == 0).mean())}
