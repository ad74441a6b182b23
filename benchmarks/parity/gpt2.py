"""Decoder-only summarization's reference: a causal LM with the prompt masked from the loss."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from parity.common import distinct, raw_splits, reference_attention, timed, training_arguments
from parity.seq2seq import decode, generation_kwargs, rouge_scores, summed_loss
from parity.lm import causal_lm


# --- reference: decoder-only summarization (causal LM, prompt masked from the loss) ------------
def reference_gpt2(recipe: Any, path: str, out: Path) -> dict:
    """GPT-2 on prompt + ' ' + summary + <|endoftext|>, the prompt's labels -100 (the examples'
    instruction-tuning recipe); loss per target token over the test set; greedy generation from
    the prompt alone, left-padded."""
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, Trainer, set_seed

    task = recipe.task
    train_rows, eval_rows = raw_splits(recipe)
    tok = AutoTokenizer.from_pretrained(path)
    tok.pad_token = tok.eos_token
    set_seed(recipe.train.seed)
    model = causal_lm(path, recipe.model.dropout, **reference_attention(recipe))
    prefix, suffix = task.affixes()

    def examples(rows: Any) -> list[dict]:
        out = []
        for r in rows.to_list():
            src = tok(prefix + task.source_text(r), truncation=True, max_length=task.max_length)["input_ids"]
            prompt = src + tok(suffix)["input_ids"]
            answer = tok(" " + task.target_text(r), truncation=True, max_length=task.max_target_length)["input_ids"]
            answer = answer + [tok.eos_token_id]
            out.append({"input_ids": prompt + answer, "labels": [-100] * len(prompt) + answer, "prompt": prompt})
        return out

    def collate(batch: list[dict]) -> dict:
        width = max(len(b["input_ids"]) for b in batch)
        pad = lambda xs, v: [x + [v] * (width - len(x)) for x in xs]
        return {"input_ids": torch.tensor(pad([b["input_ids"] for b in batch], tok.pad_token_id)),
                "attention_mask": torch.tensor(pad([[1] * len(b["input_ids"]) for b in batch], 0)),
                "labels": torch.tensor(pad([b["labels"] for b in batch], -100))}

    train_set = Dataset.from_list([{k: v for k, v in e.items() if k != "prompt"} for e in examples(train_rows)])
    trainer = Trainer(model=model, args=training_arguments(recipe, out, remove_unused_columns=False),
                      train_dataset=train_set, data_collator=collate)
    result = trainer.train()
    test = examples(eval_rows)
    def evaluate() -> tuple[float, list[str], dict[str, float]]:  # timed with its scorer, as the toolkit's is
        loss, preds = gpt2_evaluate(model, tok, test, collate, task, recipe)
        return loss, preds, rouge_scores(preds, list(eval_rows["target"]))

    (loss, preds, scores), seconds = timed(evaluate)
    return {"metrics": {"loss": loss, **scores},
            "train_samples_per_s": result.metrics["train_samples_per_second"],
            "eval_samples_per_s": len(test) / seconds, "train_s": result.metrics["train_runtime"],
            "distinct_predictions": distinct(preds)}


def gpt2_evaluate(model: Any, tok: Any, test: list[dict], collate: Callable, task: Any, recipe: Any) -> tuple[float, list[str]]:
    """(mean loss per target token, generated summaries) in batches of the eval batch size."""
    import torch

    model.eval()
    size = recipe.train.eval_batch_size or 2 * recipe.train.batch_size
    total, count, preds = 0.0, 0, []
    with torch.no_grad():
        for i in range(0, len(test), size):
            part = test[i:i + size]
            loss, n = summed_loss(model, collate(part), shifted=True)
            total, count = total + loss, count + n
            width = max(len(p["prompt"]) for p in part)
            ids = torch.tensor([[tok.pad_token_id] * (width - len(p["prompt"])) + p["prompt"] for p in part])
            mask = torch.tensor([[0] * (width - len(p["prompt"])) + [1] * len(p["prompt"]) for p in part])
            gen = model.generate(input_ids=ids.to(model.device), attention_mask=mask.to(model.device),
                                 pad_token_id=tok.pad_token_id,
                                 **generation_kwargs(task))
            preds += decode(tok, gen[:, width:])
    return total / max(count, 1), preds
