"""full, freeze and lora on every family: the loss falls and only the intended parameters change."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForSequenceClassification

from conftest import FAMILY_IDS
from toolkit import models
from toolkit.methods import METHODS, Context, count_params, is_head

CASES = [("full", {}), ("freeze", {}), ("lora", {"r": 4})]
TEXTS = ["a great movie", "terrible, boring and far too long", "fine", "I loved it"]
LABELS = torch.tensor([1, 0, 1, 1])


def intended(name: str, param: str, heads: list[str]) -> bool:
    if name == "full":
        return True
    if name == "freeze":
        return is_head(param, heads)
    return "lora_" in param or "modules_to_save" in param  # lora: adapters + the head's trained copy


@pytest.mark.parametrize("family", list(FAMILY_IDS))
@pytest.mark.parametrize("name, settings", CASES)
def test_method_trains(tiny_checkpoint, family: str, name: str, settings: dict) -> None:
    torch.manual_seed(0)
    path = tiny_checkpoint(family)
    tok = models.load_tokenizer(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=2, pad_token_id=tok.pad_token_id)
    heads = models.head_names(model)
    assert heads, "every family has a classification head"
    model = METHODS.get(name)(**settings).apply(model, Context(model.config.model_type, heads, "SEQ_CLS", tok))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    batch = tok(TEXTS, padding=True, return_tensors="pt")
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for _ in range(8):
        loss = torch.nn.functional.cross_entropy(model(**batch).logits, LABELS)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all(intended(name, n, heads) for n in changed), sorted(changed)[:5]
    trainable, total = count_params(model)
    assert (trainable == total) == (name == "full") and trainable > 0


# minimal settings where a method's defaults would not fit a 2-layer, width-32 model in one step
FITTING = {"prompt_tuning": {"num_virtual_tokens": 4},
           "prefix_tuning": {"num_virtual_tokens": 4}, "p_tuning": {"num_virtual_tokens": 4, "encoder_hidden_size": 16}}


@pytest.mark.parametrize("name", METHODS.names())
def test_params_are_counted_once_and_trainable_is_what_the_optimizer_steps(tiny_checkpoint, name: str) -> None:
    """total_params: every parameter the forward runs, once; trainable_params: the optimizer's.
    Finding: PEFT keeps a `modules_to_save` head twice (its idle original and the trained copy),
    and both were in total_params. Here the forward itself says what it runs: every parameter
    is made to require grad, and those one backward reaches are the ones that count."""
    from types import SimpleNamespace

    from toolkit.train import _optimizer

    torch.manual_seed(0)
    path = tiny_checkpoint("bert")
    tok = models.load_tokenizer(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=2)
    method = METHODS.get(name)(**FITTING.get(name, {}))
    model = method.apply(model, Context(model.config.model_type, models.head_names(model), "SEQ_CLS", tok,
                                        total_steps=10))
    trainable, total = count_params(model)
    recipe = SimpleNamespace(method=method, train=SimpleNamespace(weight_decay=0.01, precision_mode="fp32", lr=1e-3))
    groups = _optimizer(model, recipe, torch.device("cpu")).param_groups if method.trains else []  # icl: none
    stepped = {id(p): p.numel() for g in groups for p in g["params"]}
    assert trainable == sum(stepped.values()) and (trainable > 0) == method.trains
    for param in model.parameters():
        param.requires_grad_(True)
    model.train()
    model(**tok(TEXTS, padding=True, return_tensors="pt"), labels=LABELS).loss.backward()
    used = {id(p): p.numel() for p in model.parameters() if p.grad is not None}
    assert total == sum(used.values())
