"""In-context prompting on a generation task: the toolkit's batched scoring and generation
against one example at a time."""

from __future__ import annotations

import statistics

from parity.common import raw_splits
from parity.seq2seq import generation_kwargs
from parity.specs import overrides, resolved_recipe


# --- in-context prompting on a generation task: batched against one at a time -----------------
def icl_check(path: str, examples: int = 8, shots: int = 2, batch_size: int = 4, smoke: bool = True) -> dict:
    """The toolkit's batched evaluation step of a decoder-only generation task with k
    demonstrations in every prompt, each example its own (what method icl runs), against each
    example alone through the plain model: the same summed target loss and the same greedy
    continuation (both stopped at the separator)."""
    import torch
    from transformers import AutoModelForCausalLM

    from toolkit import models
    from toolkit.methods.icl import demonstration_sets
    from toolkit.tasks._generation import stop_at

    recipe = resolved_recipe("gpt2", overrides("gpt2", smoke, path, 42))
    task = recipe.task
    task.model_head("gpt2")
    train, rows = raw_splits(recipe)
    rows = rows.select(range(min(examples, len(rows))))
    tok = models.load_tokenizer(path)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    sets = demonstration_sets(train, shots, recipe.train.seed, len(rows), examples=rows)  # each its own, as icl
    task.prompt_in_context([[(task.source_text(d), task.target_text(d)) for d in s] for s in sets], "\n\n",
                           model.config.n_positions, lambda texts: tok(texts)["input_ids"])
    encoded = task.encode(rows, tok)
    collate = task.collator(tok, model)
    batched_loss, batched_gen, single_loss, single_gen = {}, {}, {}, {}
    with torch.no_grad():
        for i in range(0, len(encoded), batch_size):
            feats = [encoded[j] for j in range(i, min(i + batch_size, len(encoded)))]
            out = task.eval_step(model, collate(feats))
            for f, loss, gen in zip(feats, out["loss"].tolist(), out["generated"].tolist()):
                batched_loss[f["example_index"]] = loss
                batched_gen[f["example_index"]] = [t for t in gen if t != tok.pad_token_id]
        for f in (encoded[j] for j in range(len(encoded))):
            labels = torch.tensor([f["labels"]])
            n = int((labels[:, 1:] != -100).sum())
            single_loss[f["example_index"]] = float(model(input_ids=torch.tensor([f["input_ids"]]), labels=labels).loss) * n
            prompt = torch.tensor([f["prompt_ids"]])
            gen = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), pad_token_id=tok.pad_token_id,
                                 stopping_criteria=stop_at(tok, ["\n\n"], prompt.shape[1]),
                                 **generation_kwargs(task))[0, prompt.shape[1]:].tolist()
            single_gen[f["example_index"]] = [t for t in gen if t != tok.pad_token_id]
    keys = sorted(single_loss)
    rel = max(abs(batched_loss[k] - single_loss[k]) / max(abs(single_loss[k]), 1e-9) for k in keys)
    return {"examples": len(keys), "shots": shots, "batch_size": batch_size, "max_relative_loss_difference": rel,
            "same_generation": sum(batched_gen[k] == single_gen[k] for k in keys),
            "prompt_tokens_mean": statistics.mean(len(encoded[j]["prompt_ids"]) for j in range(len(encoded)))}
