"""toolkit.dropout: the CPU dropout's rate, scale and gradient, its seeding, the attention math it
runs under sdpa against transformers' sdpa, and that an installed model draws no `bernoulli_`."""

from __future__ import annotations

import math

import pytest
import torch

from toolkit import dropout


def test_keep_mask_rate_within_five_sigma_and_seeded():
    n, p = 4_000_000, 0.1
    torch.manual_seed(0)
    first = dropout.keep_mask((n,), p)
    dropped = 1.0 - first.float().mean().item()
    assert abs(dropped - p) < 5 * math.sqrt(p * (1 - p) / n)
    torch.manual_seed(0)
    assert torch.equal(dropout.keep_mask((n,), p), first)  # the default generator, seeded
    assert not torch.equal(dropout.keep_mask((n,), p), first)  # and it moves on


def test_keep_mask_odd_size_and_extreme_rates():
    torch.manual_seed(1)
    assert dropout.keep_mask((3, 5, 7), 0.5).shape == (3, 5, 7)
    assert dropout.keep_mask((10_001,), 1e-9).all()  # round(1e-9 * 2^32) = 4 of 2^32 dropped
    assert not dropout.keep_mask((10_001,), 1 - 1e-9).any()


def test_dropout_scales_what_it_keeps_and_backward_uses_the_same_mask():
    torch.manual_seed(2)
    x = torch.randn(64, 33, requires_grad=True)
    out = dropout.dropout(x, 0.25)
    kept = out != 0
    assert 0.6 < kept.float().mean().item() < 0.9
    torch.testing.assert_close(out[kept], x.detach()[kept] / 0.75)
    weights = torch.randn(64, 33)
    (out * weights).sum().backward()
    torch.testing.assert_close(x.grad, torch.where(kept, weights / 0.75, torch.zeros(())))


def test_dropout_keeps_the_mean():
    torch.manual_seed(3)
    x = torch.full((2_000_000,), 2.0)
    assert dropout.dropout(x, 0.3).mean().item() == pytest.approx(2.0, abs=5 * 2 * math.sqrt(0.3 / 0.7 / 2e6))


def test_eval_and_rate_zero_are_identity():
    x = torch.randn(4, 5)
    assert torch.equal(dropout.dropout(x, 0.5, training=False), x)
    assert torch.equal(dropout.dropout(x, 0.0), x)


def _sdpa(module, q, k, v, mask, **kw):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, q, k, v, mask, **kw)[0]


@pytest.mark.parametrize("case", ["bidirectional-padding", "causal", "causal-mask", "float-mask", "cross"])
def test_math_attention_equals_transformers_sdpa(case):
    """With dropout taken out (identity), the math path is transformers' sdpa call: masks,
    causality and its key cut, scaling, layout."""
    torch.manual_seed(4)
    b, h, tq, d = 2, 3, 6, 8
    tk = 9 if case == "cross" else tq
    q, k, v = torch.randn(b, h, tq, d), torch.randn(b, h, tk, d), torch.randn(b, h, tk, d)
    module = torch.nn.Module()
    module.is_causal = case.startswith("causal")
    mask = None
    if case == "bidirectional-padding" or case == "cross":
        mask = torch.ones(b, 1, 1, tk, dtype=torch.bool)
        mask[1, ..., -3:] = False
    elif case == "causal-mask":
        mask = torch.ones(tq, tk, dtype=torch.bool).tril()[None, None].repeat(b, 1, 1, 1)
        mask[0, ..., :2] = False  # left padding: the first two queries see no key
    elif case == "float-mask":
        mask = torch.randn(b, 1, tq, tk)
        mask[0, :, 1] = float("-inf")  # a query that sees no key: zeros, as torch's safe softmax
    ours, _ = dropout.math_attention(module, q, k, v, mask, 0.3, None, lambda w: w)
    torch.testing.assert_close(ours, _sdpa(module, q, k, v, mask, scaling=0.3), rtol=1e-5, atol=1e-6)


def _profile_ops(model, inputs) -> set[str]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        model(**inputs).loss.backward()
    return {e.key for e in prof.key_averages()}


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_installed_model_draws_no_bernoulli_and_is_seeded(tiny_checkpoint, family):
    from toolkit import models

    head = "sequence-classification" if family == "bert" else "causal-lm"
    model, tok = models.load(tiny_checkpoint(family), head, {}, "sdpa", dropout=0.2)
    model.train()
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    enc = tok(["a short one", "this sentence is quite a bit longer than that one"], padding=True,
              return_tensors="pt")
    inputs = {**enc, "labels": torch.tensor([0, 1]) if family == "bert" else enc["input_ids"]}
    assert "aten::bernoulli_" in _profile_ops(model, inputs)  # torch's dropout, before
    assert dropout.install(model) > 0
    assert "aten::bernoulli_" not in _profile_ops(model, inputs)
    torch.manual_seed(5)
    first = model(**inputs).logits
    torch.manual_seed(5)
    torch.testing.assert_close(model(**inputs).logits, first, rtol=0, atol=0)
    model.eval()  # evaluation: no dropout at all, the same as before install
    with torch.no_grad():
        a, b = model(**inputs).logits, model(**inputs).logits
    assert torch.equal(a, b)


def test_low_precision_and_inplace_keep_torchs_dropout():
    assert not dropout.applies(torch.ones(4, dtype=torch.bfloat16), 0.1)
    assert dropout.applies(torch.ones(4), 0.1)
    module = torch.nn.Dropout(0.5, inplace=True)
    holder = torch.nn.Sequential(module)
    dropout.install(holder)
    assert type(module) is dropout.Dropout and module.inplace  # switched, but inplace goes to torch
    x = torch.ones(1000)
    holder.train()(x)
    assert bool(((x == 0) | (x == 2)).all())  # torch's in-place dropout ran on x


def test_installed_model_pickles_and_copies():
    import copy
    import pickle

    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Dropout(0.1))
    dropout.install(model)
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert type(clone[1]) is dropout.Dropout and clone[1].p == 0.1


def test_install_leaves_a_model_trained_elsewhere_than_cpu_alone():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Dropout(0.1))
    assert dropout.install(model, torch.device("cuda", 0)) == 0  # GPUs: torch's dropout is the fast one
    assert type(model[1]) is torch.nn.Dropout
    assert dropout.install(model, "cpu") == 1 and type(model[1]) is dropout.Dropout
