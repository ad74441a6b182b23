"""Language modelling's reference (run_mlm / run_clm): grouped blocks, Trainer, perplexity;
one shared masked-LM scorer for both sides."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from parity.common import bert_dropout, in_order, raw_splits, reference_attention, timed, training_arguments
from parity.seq2seq import summed_loss


# --- reference: language modelling (run_mlm / run_clm) -----------------------------------------
def grouped(tok: Any, texts: list[str], size: int, special: bool, end: list[int], breaks: bool = False) -> dict:
    """run_mlm / run_clm's group_texts: documents tokenised, concatenated, cut into blocks of
    `size` (the remainder dropped; a corpus shorter than one block is one shorter block).
    `breaks`: the rows are the lines of one running text (`documents: text`), as run_clm.py reads
    a text file (keep_linebreaks): each line with its \n, `end` once after the last."""
    if breaks:
        assert not special, "a running text is framed once, not as the tokenizer frames each line"
        ids = [v for row in tok([t + "\n" for t in texts], add_special_tokens=False)["input_ids"] for v in row] + end
        flat = {"input_ids": ids}
    else:
        enc = tok(texts, add_special_tokens=special, return_special_tokens_mask=special)
        keys = ["input_ids"] + (["special_tokens_mask"] if special else [])
        flat = {k: [v for row in enc[k] for v in row + (end if k == "input_ids" else [0] * len(end))] for k in keys}
    total = len(flat["input_ids"])
    usable = (total // size) * size if total >= size else total
    return {k: [v[i:i + size] for i in range(0, usable, size)] for k, v in flat.items()}


def reference_lm(recipe: Any, path: str, out: Path) -> dict:
    """MLM: DataCollatorForLanguageModeling(mlm_probability) on blocks with [CLS]/[SEP] per
    document; CLM: blocks with <|endoftext|> after each document (or, reading a running text,
    its lines with their \n and <|endoftext|> after the last), labels = inputs. Perplexity
    = exp(Trainer.evaluate's eval_loss)."""
    from datasets import Dataset
    from transformers import (AutoModelForMaskedLM, AutoTokenizer, Trainer,
                              default_data_collator, set_seed)

    task = recipe.task
    train_rows, eval_rows = raw_splits(recipe)
    tok = AutoTokenizer.from_pretrained(path)
    mlm = task.name == "mlm"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    set_seed(recipe.train.seed)
    model = AutoModelForMaskedLM.from_pretrained(path, **bert_dropout(recipe), **reference_attention(recipe)) if mlm \
        else causal_lm(path, recipe.model.dropout, **reference_attention(recipe))
    end = [] if mlm else [tok.eos_token_id]
    size = task.block_length(tok)

    def blocks(rows: Any) -> Any:
        data = grouped(tok, list(rows["text"]), size, mlm, end, breaks=task.line_breaks())
        return Dataset.from_dict(data if mlm else {**data, "labels": data["input_ids"]})  # run_clm: labels = inputs

    # run_clm batches with default_data_collator: DataCollatorForLanguageModeling(mlm=False)
    # would drop the loss on <|endoftext|>, which is GPT-2's pad token here
    collator = masking(tok, task) if mlm else default_data_collator
    trainer = in_order(Trainer(model=model, args=training_arguments(recipe, out), train_dataset=blocks(train_rows),
                               data_collator=collator))
    result = trainer.train()
    if mlm:
        trainer.save_model(str(out / "model"))  # scored again on one mask set (side())
    heldout = blocks(eval_rows)
    evaluated, seconds = timed(lambda: trainer.evaluate(heldout))
    loss = evaluated["eval_loss"]
    return {"metrics": {"perplexity": math.exp(loss), "loss": loss},
            "train_samples_per_s": result.metrics["train_samples_per_second"],
            "eval_samples_per_s": len(eval_rows) / seconds, "train_s": result.metrics["train_runtime"]}


def one_mask_set_loss(model_dir: str, tokenizer: str, recipe: Any) -> float:
    """A trained masked LM's loss per masked token on the held-out blocks, under one mask set:
    run_mlm's blocks and DataCollatorForLanguageModeling's 80/10/10 masking, drawn from torch's
    generator seeded 0 whichever side trained the model. The two sides' own evaluations differ
    (the toolkit scores fixed masks per token, Trainer fresh masks and a mean of batch means), so
    this is the one number on which their models compare directly."""
    import torch
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer)
    model, info = AutoModelForMaskedLM.from_pretrained(model_dir, output_loading_info=True)
    if info["missing_keys"]:  # a head drawn at random here would score noise
        raise RuntimeError(f"{model_dir}: no trained weights for {sorted(info['missing_keys'])[:3]}")
    model.eval()
    blocks = grouped(tok, list(raw_splits(recipe)[1]["text"]), recipe.task.block_length(tok), True, [])
    rows = [{"input_ids": ids, "special_tokens_mask": sp} for ids, sp in zip(blocks["input_ids"], blocks["special_tokens_mask"])]
    collate = masking(tok, recipe.task)
    torch.manual_seed(0)
    batches = [collate(rows[i:i + 32]) for i in range(0, len(rows), 32)]  # the masks, drawn before any model runs
    total, count = 0.0, 0
    with torch.no_grad():
        for batch in batches:
            loss, n = summed_loss(model, batch, shifted=False)  # the collator took special_tokens_mask out
            total, count = total + loss, count + n
    return total / max(count, 1)


def masking(tok: Any, task: Any) -> Any:
    """run_mlm's collator with the recipe's masking: task.mlm_probability of the tokens chosen,
    task.mask_ratio of them [MASK], task.random_ratio a random token (transformers' mask_replace_prob
    and random_replace_prob, the same fractions of the chosen tokens), the rest kept."""
    from transformers import DataCollatorForLanguageModeling

    return DataCollatorForLanguageModeling(tok, mlm_probability=task.mlm_probability,
                                           mask_replace_prob=task.mask_ratio, random_replace_prob=task.random_ratio)


def causal_lm(path: str, dropout: float | None, **load: Any) -> Any:
    """GPT-2 for Trainer with `loss_type` named. Finding (transformers 5.24): a checkpoint whose
    config leaves loss_type unset (GPT-2's) makes Trainer count every label when it normalises
    the causal loss (`num_items_in_batch`), not the labels after the shift, so its eval loss is
    the true per-token loss x (L-1)/L: 10.48 for 10.82 at blocks of 32 (tests/test_parity.py)."""
    from transformers import AutoModelForCausalLM

    # GPT-2's config names for the recipe's model.dropout (None: the checkpoint's own)
    config = {} if dropout is None else dict.fromkeys(("resid_pdrop", "embd_pdrop", "attn_pdrop"), dropout)
    model = AutoModelForCausalLM.from_pretrained(path, **config, **load)  # load: reference_attention's
    model.loss_type = "ForCausalLM"
    return model
