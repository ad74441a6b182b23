"""Attention modules x the five families: padding, causality, reduction to softmax, gradients,
trainability under every method, saving, validation errors and exact resume."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
import torch

from conftest import write_recipe

FAMILIES = ["bert", "roberta", "gpt2", "bart", "t5"]
HEAD = {"bert": "sequence-classification", "roberta": "sequence-classification", "gpt2": "causal-lm",
        "bart": "seq2seq-lm", "t5": "seq2seq-lm"}
# Small settings so that a 12-token input spans several windows, blocks and chunks.
SMALL = {"dot": {}, "additive": {"dim": 4}, "bilinear": {}, "sparsemax": {}, "local": {"window": 2},
         "bigbird": {"block": 2, "global_blocks": 1, "random_blocks": 1}, "linear": {"chunk": 4},
         "performer": {"features": 16, "chunk": 4}, "relative": {"k": 3}, "alibi": {}}
# Settings at which a module is softmax attention on the same weights.
REDUCES = {"dot": {}, "bilinear": {}, "local": {"window": 64}, "bigbird": {"block": 64},
           "relative": {}, "alibi": {"scale": 0.0}}
REFUSED = {("linear", "t5"), ("performer", "t5")}


SHARPEN = 8.0  # query and key weights x8: scores x64, a few units at most, as T5's and a trained model's


def sharpen(model, factor: float = SHARPEN) -> None:
    """Scale every attention layer's query and key projections (weights and biases) by `factor`.
    A small random model's attention is near uniform (scores below 0.06 on BERT, RoBERTa, GPT-2
    and BART), where a swapped module whose scores were 1% off (a wrong scale, a bias at another
    position) still gave the stock outputs within 2e-6: every parity check at 1e-5 passed it.
    Sharpened, such an error shows at 4e-5 or more on every family
    (test_parity_sees_a_one_percent_score_error). T5's projections are already that sharp."""
    from toolkit.layers import attention_layers

    with torch.no_grad():
        for _, layer in attention_layers(model):
            for name in ("query", "key", "q_proj", "k_proj"):  # BERT/RoBERTa, BART
                projection = getattr(layer, name, None)
                if projection is not None:
                    projection.weight.mul_(factor)
                    if projection.bias is not None:
                        projection.bias.mul_(factor)
            if hasattr(layer, "c_attn"):  # GPT-2: query, key and value side by side (Conv1D: in x 3 out)
                width = layer.embed_dim
                layer.c_attn.weight[:, :2 * width].mul_(factor)
                layer.c_attn.bias[:2 * width].mul_(factor)


@pytest.fixture(scope="module")
def stock(tiny_checkpoint):
    """family -> (eager model, tokenizer, checkpoint), loaded once; attention sharpened (`sharpen`)
    where the small random model's is near uniform."""
    from toolkit import models

    cache: dict = {}

    def get(family: str):
        if family not in cache:
            ck = tiny_checkpoint(family)
            model, tok = models.load(ck, HEAD[family], {}, "eager")
            if family != "t5":
                sharpen(model)
            cache[family] = (model.eval(), tok, ck)
        return cache[family]

    return get


def swapped(stock_entry, name: str, settings: dict, family: str):
    from toolkit import models
    from toolkit.attention import ATTENTION

    model, _, ck = stock_entry
    attention = ATTENTION.get(name)(**settings)
    out, _ = models.load(ck, HEAD[family], {}, attention)
    out.load_state_dict(model.state_dict(), strict=False)  # same weights as the stock model
    return out.eval()


def resettled(stock_entry, name: str, settings: dict):
    """The stock model with a module swapped in without a reload (a copy, its attention switched,
    `prepare`): what models.load builds (test_load_builds_what_the_tests_build), without the
    second models.load spends loading the tokenizer again."""
    import copy

    from toolkit.attention import ATTENTION

    model = copy.deepcopy(stock_entry[0])
    model.set_attn_implementation(name)
    return ATTENTION.get(name)(**settings).prepare(model).eval()


def batch(family: str, tok) -> dict:
    """Two texts of different length: the short one padded (on the left for GPT-2, where
    right padding would be hidden by causality anyway)."""
    tok.padding_side = "left" if family == "gpt2" else "right"
    enc = tok(["a short one", "this sentence is quite a bit longer than that one"], padding=True,
              return_tensors="pt")
    out = dict(enc)
    if HEAD[family] == "seq2seq-lm":
        out["decoder_input_ids"] = enc["input_ids"][1:2, :8].repeat(2, 1)
    return out


def output(model, inputs: dict) -> torch.Tensor:
    """What a change must (not) reach: per-token hidden states or logits."""
    result = model(**inputs, output_hidden_states=True)
    return result.logits if result.logits.dim() == 3 else result.hidden_states[-1]


def real(inputs: dict, out: torch.Tensor) -> torch.Tensor:
    """The positions anyone reads: a fully padded query row is an average of anything."""
    if "decoder_input_ids" in inputs:  # decoder positions: no padding there
        return out
    return out[inputs["attention_mask"].bool()]


def _registered() -> list[str]:
    from toolkit.attention import ATTENTION

    return sorted(ATTENTION.names())


CASES = [(n, f) for n in _registered() for f in FAMILIES]  # SMALL must name every module


@pytest.mark.parametrize("name, family", CASES)
def test_module_on_family(stock, name: str, family: str) -> None:
    """Padded tokens change nothing; no future token leaks; a sentence's eval output is the same
    alone and beside a longer one; gradients reach the new parameters."""
    from toolkit.attention import ATTENTION, PREFIX

    reason = ATTENTION.get(name)(**SMALL[name]).incompatible(family)
    if (name, family) in REFUSED:
        assert reason and "bias" in reason
        return
    assert reason is None
    entry = stock(family)
    model, tok = resettled(entry, name, SMALL[name]), entry[1]
    moved_off_their_start(model)
    inputs = batch(family, tok)
    with torch.no_grad():
        base = output(model, inputs)
        other = dict(inputs, input_ids=inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, 42))
        changed = output(model, other)
    torch.testing.assert_close(real(inputs, changed), real(inputs, base), atol=1e-5, rtol=0)
    assert not any(torch.isnan(t).any() for t in (base, changed))
    if family in ("gpt2", "bart", "t5"):
        _assert_no_future_leak(model, inputs, family, base)
    _assert_batch_invariant(model, tok, family)
    _assert_other_side_padding_unseen(model, tok, family)
    model.train()
    output(model, inputs).float().pow(2).mean().backward()
    added = {n: p for n, p in model.named_parameters() if PREFIX in n}
    assert bool(added) == (name in ("additive", "bilinear", "relative"))
    for n, p in added.items():
        assert p.grad is not None and p.grad.abs().sum() > 0, n


def moved_off_their_start(model) -> None:
    """The added parameters moved off their initial values, as training moves them: `relative`'s
    tables start at zero and `bilinear`'s W at the identity, where both are `dot`, and a check of
    padding, causality or batch invariance run there passed whatever their positions or masks did."""
    from toolkit.attention import PREFIX

    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if PREFIX in n:
                p.add_(0.5 * torch.randn(p.shape, generator=g))


def _assert_batch_invariant(model, tok, family: str) -> None:
    """No score depends on train.eval_batch_size (tests/test_evaluation.py), so no module's eval
    output may depend on what shares a sentence's batch: its padded length, and for GPT-2 the
    left padding that moves its first token (positions counted from the first real token, as
    generate() gives them). Finding: bigbird drew its random blocks from the padded length and
    laid its block grid from the first padded position, so a sentence scored differently beside
    a longer one (on BERT and on GPT-2)."""
    tok.padding_side = "left" if family == "gpt2" else "right"
    short = "a shorter one, of a few words spanning blocks"
    alone = dict(tok([short], return_tensors="pt"))
    beside = dict(tok([short, "this sentence is quite a bit longer than that one, and longer still: "
                              "it runs on for many more words than the other"], padding=True, return_tensors="pt"))
    assert beside["attention_mask"][0].sum() < beside["attention_mask"].shape[1]  # it was padded
    if family == "gpt2":
        for inputs in (alone, beside):
            inputs["position_ids"] = (inputs["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    if HEAD[family] == "seq2seq-lm":  # the same decoder input beside each: the encoder is what is padded
        for inputs in (alone, beside):
            inputs["decoder_input_ids"] = torch.tensor([[0, 5, 9, 12]]).repeat(len(inputs["input_ids"]), 1)
    with torch.no_grad():
        a, b = output(model, alone)[0], output(model, beside)[0]
    if HEAD[family] != "seq2seq-lm":
        b = b[beside["attention_mask"][0].bool()]
    torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name, family", sorted({(n, "bart") for n in _registered()} | {("additive", f) for f in FAMILIES}))
def test_load_builds_what_the_tests_build(stock, name: str, family: str) -> None:
    """models.load (the toolkit's one build: registration, attn_implementation, prepare) gives
    the model `resettled` builds without a reload, which the other tests use: every module on
    BART (encoder, causal decoder and cross-attention) and one with parameters on every family."""
    entry = stock(family)
    loaded, rebuilt = swapped(entry, name, SMALL[name], family), resettled(entry, name, SMALL[name])
    assert loaded.config._attn_implementation == rebuilt.config._attn_implementation == name
    assert {n for n, _ in loaded.named_parameters()} == {n for n, _ in rebuilt.named_parameters()}
    rebuilt.load_state_dict(loaded.state_dict())  # the added parameters' random start too
    inputs = batch(family, entry[1])
    with torch.no_grad():
        torch.testing.assert_close(output(rebuilt, inputs), output(loaded, inputs), atol=0, rtol=0)


def _assert_other_side_padding_unseen(model, tok, family: str) -> None:
    """The padding side `batch` does not use (encoders left, GPT-2 right), beside a row with no
    real token: the padding's content reaches no real position and nothing is NaN. Positions are
    given (RoBERTa counts them from the ids, so changing a pad id would move them)."""
    tok.padding_side = "right" if family == "gpt2" else "left"
    inputs = dict(tok(["a short one", "this sentence is quite a bit longer than that one", "x"], padding=True,
                      return_tensors="pt"))
    inputs["attention_mask"][2] = 0
    if family in ("bert", "roberta", "gpt2"):
        inputs["position_ids"] = (inputs["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    if HEAD[family] == "seq2seq-lm":
        inputs["decoder_input_ids"] = inputs["input_ids"][1:2, :6].repeat(3, 1)
    with torch.no_grad():
        base = output(model, inputs)
        changed = output(model, dict(inputs, input_ids=inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, 42)))
    assert torch.isfinite(base).all() and torch.isfinite(changed).all()
    rows = slice(0, 2)  # the all-padding row's outputs are an average of padding: nobody reads them
    torch.testing.assert_close(real({k: v[rows] for k, v in inputs.items()}, changed[rows]),
                               real({k: v[rows] for k, v in inputs.items()}, base[rows]), atol=1e-5, rtol=0)


def _assert_no_future_leak(model, inputs: dict, family: str, base: torch.Tensor) -> None:
    key = "decoder_input_ids" if HEAD[family] == "seq2seq-lm" else "input_ids"
    t = 5
    ids = inputs[key].clone()
    ids[:, t:] = (ids[:, t:] + 7) % 100 + 3
    with torch.no_grad():
        changed = output(model, dict(inputs, **{key: ids}))
    # row 1 is unpadded (row 0's fully padded query rows may average anything: nobody reads them)
    torch.testing.assert_close(changed[1, :t], base[1, :t], atol=1e-5, rtol=0)
    assert (changed[1, t:] - base[1, t:]).abs().max() > 1e-4  # the change did reach later positions


@pytest.mark.parametrize("name, family", [(n, f) for n in REDUCES for f in FAMILIES])
def test_reduces_to_stock_softmax(stock, name: str, family: str) -> None:
    entry = stock(family)
    model, tok = resettled(entry, name, REDUCES[name]), entry[1]
    inputs = batch(family, tok)
    with torch.no_grad():
        ours, theirs = (real(inputs, output(m, inputs)) for m in (model, entry[0]))
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)


# Settings at which a module is softmax attention on this file's batches (at most 15 tokens):
# `local`'s window and bigbird's blocks (3 blocks of 6, one global) cover them without being longer.
DENSE_IN_TRAINING = {**REDUCES, "local": {"window": 14}, "bigbird": {"block": 6, "global_blocks": 1, "random_blocks": 1}}


@pytest.mark.parametrize("name, family", [(n, f) for n in DENSE_IN_TRAINING for f in FAMILIES])
def test_a_module_that_reduces_to_softmax_trains_as_stock(stock, name: str, family: str) -> None:
    """In training (dropout on, one seed), a module at settings where it is softmax attention gives
    the stock model's loss and gradients exactly: the same attention-dropout masks, drawn over the
    same (b, h, tq, tk) weights. Finding: `local` with a window covering the sequence (and bigbird
    with at most global_blocks + 2 blocks that do not make one) ran its block path, whose dropout
    drew its mask over three blocks' copies: another mask under the same seed (MiniLM's loss 0.01
    off stock, T5's 0.46 at dropout 0.3), exit 0, where the docs call it softmax attention."""
    from toolkit.attention import ATTENTION, attention_layers

    entry = stock(family)
    stock_model, tok = copy.deepcopy(entry[0]), entry[1]
    model = resettled(entry, name, DENSE_IN_TRAINING[name])
    inputs = batch(family, tok)
    if family == "gpt2":  # training pads on the right (TextToTextCollator); labels -100 there
        tok.padding_side = "right"
        inputs = dict(tok(["a short one", "this sentence is quite a bit longer than that one"], padding=True,
                          return_tensors="pt"))
        inputs["labels"] = inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, -100)
    elif HEAD[family] == "seq2seq-lm":
        inputs["labels"] = inputs["decoder_input_ids"]
    else:
        inputs["labels"] = torch.tensor([0, 1])
    longest = inputs["input_ids"].shape[1]
    settings = ATTENTION.get(name)(**DENSE_IN_TRAINING[name])
    assert name in ("dot", "bilinear", "relative", "alibi") or settings.dense_within(longest)
    results = []
    for each in (stock_model, model):
        for _, layer in attention_layers(each):
            if isinstance(getattr(layer, "dropout", None), float):  # BART's float (bart-base: 0.0); the rest draw at 0.1
                layer.dropout = 0.1
        each.train()
        torch.manual_seed(11)
        loss = each(**inputs).loss
        loss.backward()
        results.append((loss.detach(), {n: p.grad for n, p in each.named_parameters() if p.grad is not None}))
    (loss, grads), (theirs, their_grads) = results
    torch.testing.assert_close(theirs, loss, atol=1e-6, rtol=0)
    assert grads.keys() <= their_grads.keys()
    for n, g in grads.items():
        torch.testing.assert_close(their_grads[n], g, atol=1e-5, rtol=1e-5, msg=n)


@pytest.mark.parametrize("family", FAMILIES)
def test_parity_sees_a_one_percent_score_error(stock, family: str) -> None:
    """The models the parity checks run on can tell: `dot` with its scores 1% off (scaling x1.01)
    is further from the stock model than the 1e-5 every parity check allows, on every family.
    Finding: on the small random models' near-uniform attention it was within 2.4e-6 (BERT,
    RoBERTa, BART), so a module off by that much passed every equality with stock."""
    from toolkit.attention import ATTENTION

    entry = stock(family)
    model, inputs = resettled(entry, "dot", {}), batch(family, entry[1])
    dot = ATTENTION.get("dot")
    exact = dot.attend
    with torch.no_grad():
        theirs = real(inputs, output(entry[0], inputs))
        torch.testing.assert_close(real(inputs, output(model, inputs)), theirs, atol=1e-5, rtol=0)
        try:
            dot.attend = lambda self, module, q, k, v, pad, scaling, *rest: exact(self, module, q, k, v, pad,
                                                                                scaling * 1.01, *rest)
            off = real(inputs, output(model, inputs))
        finally:
            dot.attend = exact
    assert (off - theirs).abs().max() > 2e-5


@pytest.mark.parametrize("family", FAMILIES)
def test_dot_equals_sdpa(stock, family: str) -> None:
    from toolkit import models

    entry = stock(family)
    sdpa, _ = models.load(entry[2], HEAD[family], {}, "sdpa")
    sdpa.load_state_dict(entry[0].state_dict())
    model, inputs = resettled(entry, "dot", {}), batch(family, entry[1])
    with torch.no_grad():
        ours, theirs = (real(inputs, output(m, inputs)) for m in (model, sdpa.eval()))
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", [n for n in SMALL if ("linear" not in n and n != "performer")])
def test_t5_relative_bias_reaches_every_module(stock, name: str) -> None:
    """T5 (5.23) hands its relative bias to the attention function as `position_bias`; every module
    that forms scores adds it to them (the stock-equality test above shows it is added exactly
    where eager adds it), and removing the bias changes the output."""
    entry = stock("t5")
    model, inputs = resettled(entry, name, SMALL[name]), batch("t5", entry[1])
    with torch.no_grad():
        base = output(model, inputs)
        for layer in model.modules():
            if getattr(layer, "has_relative_attention_bias", False):
                layer.relative_attention_bias.weight.mul_(3.0)
        assert (output(model, inputs) - base).abs().max() > 1e-4


DECODERS = ("gpt2", "bart", "t5")


@pytest.mark.parametrize("name, family", [(n, f) for n in _registered() for f in DECODERS if (n, f) not in REFUSED])
def test_cached_decoding_equals_the_full_forward(stock, name: str, family: str) -> None:
    """Generation with a KV cache (greedy and beam search alike) scores each new token as a full
    forward over the sequence so far does (use_cache=False), for every module on every decoder:
    GPT-2 left-padded with positions from the first real token (as generate() gives them), BART
    and T5 decoders with cross-attention and T5's bias. A module that reduces to softmax gives the
    stock model's cached logits too. Finding: bigbird's new queries attended densely to every
    cached key, so cached and uncached generation differed (0.4 in a beam score on tiny GPT-2)
    and a model trained block-sparse was scored dense."""
    entry = stock(family)
    tok = entry[1]
    tok.padding_side = "left" if family == "gpt2" else "right"
    texts = ["a short one", "this sentence is quite a bit longer than that one, and longer still"]
    enc = dict(tok(texts, padding=True, return_tensors="pt"))
    if family == "gpt2":  # the prompt's last token comes from the cache step
        ids, mask = enc["input_ids"], enc["attention_mask"]
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        full = {"input_ids": ids, "attention_mask": mask, "position_ids": positions}
        first = {"input_ids": ids[:, :-1], "attention_mask": mask[:, :-1], "position_ids": positions[:, :-1]}
        step = {"input_ids": ids[:, -1:], "attention_mask": mask, "position_ids": positions[:, -1:]}
    else:
        dec = enc["input_ids"][1:2, :9].repeat(2, 1)
        full = dict(enc, decoder_input_ids=dec)
        first, step = dict(enc, decoder_input_ids=dec[:, :-1]), dict(enc, decoder_input_ids=dec[:, -1:])
    model = resettled(entry, name, SMALL[name])
    moved_off_their_start(model)  # relative's tables and bilinear's W in use, not at dot's start
    runs = [model]
    if name in REDUCES:  # at their start, with settings that reduce to softmax; the stock model
        runs += [resettled(entry, name, {**SMALL[name], **REDUCES[name]}), entry[0]]
    logits = []
    with torch.no_grad():
        for model in runs:
            whole = model(**full, use_cache=False).logits[:, -1]
            past = model(**first, use_cache=True).past_key_values
            cached = model(**step, past_key_values=past).logits[:, -1]
            torch.testing.assert_close(cached, whole, atol=1e-5, rtol=0)
            logits.append(cached)
    for other in logits[2:]:  # the reduced module against the stock model
        torch.testing.assert_close(logits[1], other, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name, family", [(n, f) for n in _registered() for f in DECODERS if (n, f) not in REFUSED])
def test_a_static_cache_generates_as_the_dynamic_one(stock, name: str, family: str) -> None:
    """`generate` with a static KV cache (a checkpoint's generation_config may ask for
    `cache_implementation: static`, and the toolkit's generation keeps it) scores every new token
    as with the dynamic cache, for every module on every decoder, as the stock model does. A
    static cache hands each layer its whole buffer, written or not. Finding: the modules took the
    queries for the buffer's last slots and its unwritten slots for real keys, so a prompt's later
    tokens reached its earlier ones (GPT-2: 0.01 in the scores of every module, dot included) and
    T5's decoder attended to the empty slots (4.6 in a logit), exit 0. Now the mask function
    hands over the written slots only (queries at q_offset + i, transformers' rule)."""
    entry = stock(family)
    tok = entry[1]
    tok.padding_side = "left" if family == "gpt2" else "right"
    enc = dict(tok(["a short one", "this sentence is quite a bit longer than that one"], padding=True,
                   return_tensors="pt"))
    model = resettled(entry, name, SMALL[name])
    moved_off_their_start(model)
    settings = {"max_new_tokens": 4, "do_sample": False, "num_beams": 1, "pad_token_id": tok.pad_token_id,
                "output_scores": True, "return_dict_in_generate": True}
    with torch.no_grad():
        dynamic, static = (torch.stack(model.generate(**enc, **settings, **extra).scores)
                           for extra in ({}, {"cache_implementation": "static"}))
    seen = torch.isfinite(dynamic)
    assert torch.equal(seen, torch.isfinite(static))
    torch.testing.assert_close(static[seen], dynamic[seen], atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", _registered())
def test_soft_prompt_generation_does_not_move_with_the_batch(stock, name: str) -> None:
    """A decoder's soft prompt (prompt tuning, p-tuning) generates from embeddings with the
    virtual tokens before the left-padded prompt: padding inside the row, between the soft
    tokens and the text. Every score of every generated token (with the cache) is the same with
    a longer prompt beside it as alone, for every module. Finding: local, bigbird, relative and
    alibi placed keys by their index in the row, so the padding a batch-mate gave a prompt moved
    the text away from its soft tokens (hidden beyond local's window, penalised by alibi, another
    relative bucket, another block): generated text that changed with train.eval_batch_size,
    exit 0. Now a key's position counts real tokens only (`token_positions`), as generate's
    position ids do, and the block modules run on rows with their padding moved after the text."""
    from transformers import LogitsProcessor

    from toolkit.methods import METHODS as REGISTRY, Context

    entry = stock("gpt2")
    tok = entry[1]
    tok.padding_side = "left"
    model = resettled(entry, name, SMALL[name])
    ctx = Context(family="gpt2", head_names=[], peft_task_type="CAUSAL_LM", tokenizer=tok)
    model = REGISTRY.get("prompt_tuning")(num_virtual_tokens=3).apply(model, ctx).eval()
    for n, p in model.named_parameters():  # relative's tables start at zero: give them a say
        if "tk_attn_" in n:
            torch.nn.init.normal_(p, std=0.5)

    class Scores(LogitsProcessor):
        def __init__(self) -> None:
            self.seen: list = []

        def __call__(self, ids, scores):
            self.seen.append(scores.clone())
            return scores

    def scores(texts: list) -> torch.Tensor:
        record = Scores()
        enc = tok(texts, padding=True, return_tensors="pt")
        with torch.no_grad():
            model.generate(**enc, max_new_tokens=3, do_sample=False, logits_processor=[record],
                           pad_token_id=tok.pad_token_id)
        return torch.stack([s[0] for s in record.seen])  # the first row's steps

    alone = scores(["a short one"])
    beside = scores(["a short one", "this sentence is quite a bit longer than that one, and longer still"])
    torch.testing.assert_close(beside, alone, atol=1e-5, rtol=0)


def _training_methods() -> list[str]:
    from toolkit.methods import METHODS as REGISTRY

    return sorted(n for n in REGISTRY.names() if REGISTRY.get(n)().trains)


@pytest.mark.parametrize("method", _training_methods())
def test_performer_counts_each_training_pass_once_under_every_method(stock, method: str) -> None:
    """performer's pass counter (redraw_every) moves by one per training pass of the model the
    loop calls, whatever wraps the body. Finding: it counted in a forward pre-hook on the body,
    and PEFT's AdaLoraModel calls the body's `forward` directly, past its hooks: under adalora
    the counter never moved and the features were never redrawn (redraw_every ignored), exit 0.
    `keep_trainable` (after the method) now moves the hook to the outermost model; moved, not
    added, so a wrapper that does call the body (LoRA's) does not count a pass twice."""
    from toolkit import attention, models
    from toolkit.methods import METHODS as REGISTRY, Context

    entry = stock("gpt2")
    model = resettled(entry, "performer", dict(SMALL["performer"], redraw_every=1))
    ctx = Context(family="gpt2", head_names=models.head_names(model), peft_task_type="CAUSAL_LM",
                  tokenizer=entry[1], total_steps=10)
    model = REGISTRY.get(method)().apply(model, ctx)
    attention.keep_trainable(model)
    model.train()
    inputs = batch("gpt2", entry[1])
    for _ in range(2):
        model(**inputs)
    with torch.no_grad():
        model.eval()(**inputs)  # evaluation counts nothing
    counts = [int(b) for n, b in model.named_buffers() if n.endswith("tk_attn_draws")]
    assert counts and set(counts) == {2}, counts


def test_performer_counts_into_its_own_layers_after_a_deep_copy(stock) -> None:
    """A deep copy of a performer model (hooks are copied by reference) counts its training passes
    into its own layers. Finding: the hook's closure held the original's layers, so the copy's
    passes moved the original's counter and the copy never redrew, exit 0."""
    import copy

    entry = stock("gpt2")
    original = resettled(entry, "performer", dict(SMALL["performer"], redraw_every=1))
    twin = copy.deepcopy(original).train()
    twin(**batch("gpt2", entry[1]))
    draws = [{int(b) for n, b in m.named_buffers() if n.endswith("tk_attn_draws")} for m in (original, twin)]
    assert draws == [{0}, {1}], draws


@pytest.mark.parametrize("redraw_every", [1, 2])
@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_performer_evaluates_with_the_draw_it_last_trained_with(stock, family: str, redraw_every: int) -> None:
    """An evaluation after training passes scores the model with the random features its last
    training pass used (as the reference Performer, which redraws at the start of a training pass
    only), whatever the pass count. Finding: evaluation took the draw the *next* training pass
    would use, so where the count was a multiple of `redraw_every` (eval_steps a multiple of it,
    the end of such a run, the saved model, `toolkit eval`) the model was scored with features
    no training pass had used, exit 0."""
    entry = stock(family)
    model = resettled(entry, "performer", dict(SMALL["performer"], redraw_every=redraw_every))
    for module in model.modules():  # dropout off: the training pass's output is the model's
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    inputs = batch(family, entry[1])
    for _ in range(2 * redraw_every + 1):  # passes ending on a boundary and between two
        trained = real(inputs, output(model.train(), inputs))
        with torch.no_grad():
            scored = real(inputs, output(model.eval(), inputs))
        torch.testing.assert_close(scored, trained.detach(), atol=1e-6, rtol=0)


@pytest.mark.parametrize("name, family", [(n, f) for n in SMALL for f in ("gpt2", "bart")])
def test_gradient_checkpointing_changes_nothing(stock, name: str, family: str) -> None:
    """Activation checkpointing runs each layer's forward again in backward: the gradients and
    every buffer (performer's draw counter, redrawing every pass here) are those of one plain pass."""
    settings = dict(SMALL[name], **({"redraw_every": 1} if name == "performer" else {}))
    entry = stock(family)
    plain = resettled(entry, name, settings)
    inputs = batch(family, entry[1])
    results = []
    for checkpointed in (False, True):
        model = resettled(entry, name, settings)
        model.load_state_dict(plain.state_dict())  # the added parameters too
        if checkpointed:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
        torch.manual_seed(0)
        output(model, inputs).float().pow(2).mean().backward()
        results.append(({n: p.grad for n, p in model.named_parameters() if p.grad is not None},
                        {n: b.clone() for n, b in model.named_buffers() if "tk_attn_" in n}))
    (grads, buffers), (grads_ck, buffers_ck) = results
    assert grads.keys() == grads_ck.keys() and grads
    for n in grads:
        torch.testing.assert_close(grads_ck[n], grads[n], atol=1e-8, rtol=1e-4, msg=n)
    assert buffers.keys() == buffers_ck.keys() and all(torch.equal(buffers[n], buffers_ck[n]) for n in buffers)
    assert all(int(b) == 1 for b in buffers.values())  # performer: one pass counted


@pytest.mark.parametrize("name, family", [(n, f) for n in SMALL for f in ("bert", "gpt2", "bart")])
def test_output_attentions_or_one_line(stock, name: str, family: str) -> None:
    """output_attentions=True gives a weight tensor per layer where the module forms weights, and
    one line where it does not (transformers returned an empty tuple, silently). Finding: the line
    came only where the family hands the keyword on to its attention function; GPT-2 pops it (its
    output collector records the weights), so a forward and generate() gave `attentions=()`, exit 0."""
    from toolkit.errors import UserError

    entry = stock(family)
    model, inputs = resettled(entry, name, SMALL[name]), batch(family, entry[1])
    weightless = name in ("local", "bigbird", "linear", "performer")
    with torch.no_grad():
        if weightless:
            with pytest.raises(UserError, match=f"output_attentions: {name} attention forms no attention weights"):
                model(**inputs, output_attentions=True)
            if family == "gpt2":
                with pytest.raises(UserError, match=f"output_attentions: {name} attention forms no attention weights"):
                    model.generate(**inputs, max_new_tokens=2, do_sample=False, pad_token_id=entry[1].pad_token_id,
                                   output_attentions=True, return_dict_in_generate=True)
            model(**inputs, output_hidden_states=True)  # asking for hidden states alone is no request for weights
            return
        result = model(**inputs, output_attentions=True)
    found = result.encoder_attentions + result.cross_attentions if family == "bart" else result.attentions
    layers = 2 * model.config.encoder_layers if family == "bart" else model.config.num_hidden_layers
    assert len(found) == layers and all(a.shape[-1] == inputs["input_ids"].shape[-1] for a in found)
    torch.testing.assert_close(found[0].sum(-1), torch.ones_like(found[0].sum(-1)), atol=1e-4, rtol=0)


def test_sparsemax_gives_exact_zeros_and_sums_to_one() -> None:
    from toolkit.attention.sparsemax import sparsemax

    p = sparsemax(torch.tensor([[3.0, 1.0, 0.2, -torch.finfo(torch.float32).max]]))
    assert p[0, 2] == 0 and p[0, 3] == 0 and torch.allclose(p.sum(-1), torch.ones(1))


TASK_TYPE = {"bert": "SEQ_CLS", "roberta": "SEQ_CLS", "gpt2": "CAUSAL_LM", "bart": "SEQ_2_SEQ_LM", "t5": "SEQ_2_SEQ_LM"}


def _with_method(entry, family: str, method: str):
    """The stock model with bilinear swapped in (its parameters on every family, cross-attention
    included) and `method` applied, its own parameters drawn from seed 0."""
    from toolkit import attention, models
    from toolkit.methods import METHODS as REGISTRY, Context

    model = resettled(entry, "bilinear", {})
    ctx = Context(family=family, head_names=models.head_names(model), peft_task_type=TASK_TYPE[family],
                  tokenizer=entry[1], total_steps=10)
    torch.manual_seed(0)
    model = REGISTRY.get(method)().apply(model, ctx)
    attention.keep_trainable(model)
    return model.eval()


def _applicable(methods: list[str]) -> list[tuple[str, str]]:
    """(method, family) pairs the method applies to: bitfit refuses a family without bias terms
    (t5) as it is applied, as validate refuses it (toolkit/methods/bitfit.BIAS_FREE)."""
    from toolkit.methods.bitfit import BIAS_FREE

    return [(m, f) for m in methods for f in FAMILIES if not (m == "bitfit" and f in BIAS_FREE)]


@pytest.mark.parametrize(("method", "family"), _applicable(_training_methods()))
def test_attention_parameters_stay_trainable(stock, tmp_path: Path, method: str, family: str) -> None:
    """After any method's freeze, keep_trainable turns the added parameters back on; they are
    saved beside the method's result under the plain model's names, whatever the method, and load
    back into a plain model and into the method's model, which then gives the saved model's
    outputs. Finding: the names were PEFT's with its prefixes stripped, and a prompt-learning
    wrapper (prompt_tuning, p_tuning, prefix_tuning) puts the body one level higher than LoRA's,
    so BART's `model.decoder...` was saved as `decoder...`: not the names docs/attention.md
    promised (the same module in a plain model)."""
    from toolkit import attention

    entry = stock(family)
    model = _with_method(entry, family, method)
    added = {n: p for n, p in model.named_parameters() if attention.PREFIX in n}
    assert added and all(p.requires_grad for p in added.values())
    with torch.no_grad():
        for p in added.values():
            p.add_(torch.randn_like(p))
    settings_obj = attention.ATTENTION.get("bilinear")()
    attention.save(model, tmp_path, settings_obj)
    assert attention.settings_of(tmp_path) == settings_obj
    plain = resettled(entry, "bilinear", {})
    names = sorted(n for n in plain.state_dict() if attention.PREFIX in n)
    from safetensors.torch import load_file

    assert sorted(load_file(tmp_path / attention.FILE)) == names
    assert attention.load_saved(plain, tmp_path) == len(names)
    trained = attention._added(model)
    assert all(torch.equal(t, trained[n]) for n, t in attention._added(plain).items())
    twin = _with_method(entry, family, method)  # the method's model again, as a reload builds it
    assert attention.load_saved(twin, tmp_path) == len(names)
    inputs = batch(family, entry[1])
    with torch.no_grad():
        assert torch.equal(twin(**inputs).logits, model(**inputs).logits)


def test_attention_files_saved_under_the_older_names_still_load(stock, tmp_path: Path) -> None:
    """A file an earlier toolkit wrote under a prompt-learning method on BART (`decoder...` for
    `model.decoder...`) loads into a plain model and into the method's model."""
    from safetensors.torch import save_file

    from toolkit import attention

    entry = stock("bart")
    plain = resettled(entry, "bilinear", {})
    values = {n: torch.randn(t.shape) for n, t in attention._added(plain).items()}
    assert all(n.startswith("model.") for n in values)
    attention.save(plain, tmp_path, attention.ATTENTION.get("bilinear")())
    save_file({n[len("model."):]: t for n, t in values.items()}, str(tmp_path / attention.FILE))
    for model in (plain, _with_method(entry, "bart", "prompt_tuning")):
        assert attention.load_saved(model, tmp_path) == len(values)
        assert all(torch.equal(t, values[n]) for n, t in attention._added(model).items())


@pytest.mark.parametrize("attention, family, expected", [
    ("{name: local, causal: true}", "bert-base-uncased", "causal window"),
    ("{name: linear}", "t5-base", "order-blind"),
    ("{name: relative, cross: true}", "facebook/bart-base", "cross-attention"),
    ("{name: local, windw: 8}", "bert-base-uncased", "model.attention.windw: unknown key (did you mean 'window'?)"),
    ("{name: local, window: 0}", "bert-base-uncased", "model.attention.window: 0 is below the minimum 1"),
    ("{name: lokal}", "bert-base-uncased", "did you mean 'local'"),
    ("flash_attention_2", "bert-base-uncased", "needs the flash_attn package"),
    # transformers' continuous-batching forms, whose paged cache the toolkit never runs: without it
    # paged|eager attended to padding (BERT 0.02 off sdpa) and dropped T5's bias (5.2 off), exit 0
    ("'paged|eager'", "bert-base-uncased", "continuous batching"),
    ("'paged|eager'", "t5-base", "use 'eager'"),
    ("'paged|sdpa'", "gpt2", "use 'sdpa'"),
    ("{name: performer, seed: 5000000000}", "bert-base-uncased", "model.attention.seed: 5000000000 is above the maximum"),
    ("{name: bigbird, seed: -1}", "bert-base-uncased", "model.attention.seed: -1 is below the minimum 0"),
])
def test_refused_at_validate(tmp_path: Path, cli, attention: str, family: str, expected: str) -> None:
    recipe = write_recipe(tmp_path / "r.yaml", f"model: {{checkpoint: {family}, attention: {attention}}}\n"
                          "task: {name: glue, subset: sst2}\nmethod: {name: full}\n")
    code, _, err = cli("validate", recipe)
    assert code == 2 and expected in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize("family", FAMILIES)
def test_transformers_attention_that_cannot_train_here_is_refused_at_validate(tmp_path: Path, cli, tiny_checkpoint,
                                                                               monkeypatch, family: str) -> None:
    """transformers' own attention names that load and then stop with a traceback are one line at
    validate: a Hub kernel without the `kernels` package (an ImportError at load, after the data),
    flex_attention on a machine without a GPU (torch's FlexAttention has no backward on CPU) and,
    on one, with attention dropout in the model (a ValueError at the first training step): the
    checkpoint's own (BART's is 0: it validates) or model.dropout's."""
    from transformers.utils.import_utils import is_kernels_available

    checkpoint = tiny_checkpoint(family)

    def validate(attention: str, dropout: str = "") -> tuple[int, str]:
        recipe = write_recipe(tmp_path / "r.yaml", f"model: {{checkpoint: {checkpoint}, attention: '{attention}'{dropout}}}\n"
                              "method: {name: full}\ntask: {name: glue, subset: sst2}\n")
        code, _, err = cli("validate", recipe)
        lines = [line for line in err.splitlines() if line.startswith("error:")]  # not a model build's progress
        assert "Traceback" not in err and len(lines) == (code == 2), err
        return code, "".join(lines)

    assert not is_kernels_available()
    assert validate("kernels-community/flash-attn")[1].count("kernels package") == 1
    import torch

    # flex_attention on a family that cannot run it at all, on any machine and in evaluation too: GPT-2's
    # class has no flex (refused at load, after the data), T5's position bias is read out of bounds
    # (torch's compiled kernel stopped on CPU: index out of bounds, after the data and the model)
    refused = {"gpt2": "transformers has no 'flex_attention' for gpt2 (GPT2Model does not support it",
               "t5": "transformers' flex_attention cannot run t5: its flex_attention reads T5's position bias"}
    if not torch.cuda.is_available():
        code, err = validate("flex_attention")
        assert code == 2 and refused.get(family, "trains on a GPU only") in err, err
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    code, err = validate("flex_attention")
    assert (code == 0) == (family == "bart"), err
    assert refused.get(family, "takes no attention dropout" if family != "bart" else "") in err, err
    code, err = validate("flex_attention", ", dropout: 0.0")
    assert (code == 0) == (family not in refused) and (family not in refused or refused[family] in err), err
    assert validate("sdpa")[0] == 0


@pytest.mark.parametrize("family, upstream, refused", [("bert", 0.0, False), ("bart", 0.2, True)])
def test_flex_attention_dropout_is_checked_in_the_model_a_chain_loads(tmp_path: Path, cli, tiny_checkpoint, monkeypatch,
                                                                     family: str, upstream: float, refused: bool) -> None:
    """A `{run: ...}` recipe under flex_attention loads the upstream run's model/, saved with that
    run's model.dropout: it was checked against the base checkpoint's config instead, so BERT's
    0.1 refused a chain whose upstream had set dropout 0, and BART's 0 passed one whose upstream
    had set 0.2 (the traceback at the first step on a GPU)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    up = write_recipe(tmp_path / "up.yaml", f"model: {{checkpoint: {tiny_checkpoint(family)}, dropout: {upstream}}}\n"
                      "method: {name: full}\ntask: {name: glue, subset: sst2}\n")
    down = write_recipe(tmp_path / "down.yaml", f"model: {{checkpoint: {{run: {up}}}, attention: flex_attention}}\n"
                        "method: {name: full}\ntask: {name: glue, subset: sst2}\n")
    code, _, err = cli("validate", down)
    assert code == (2 if refused else 0) and "Traceback" not in err, err
    if refused:
        assert f"the model of run {up} (saved with its model.dropout) has 0.2" in err, err


@pytest.mark.parametrize("family", ["gpt2", "t5"])
@pytest.mark.parametrize("method", ["full", "icl"])
def test_flex_attention_a_family_cannot_run_is_refused_at_validate(tmp_path: Path, cli, tiny_checkpoint,
                                                                   family: str, method: str) -> None:
    """Evaluation-only too (in-context prompting trains nothing): GPT-2 under flex_attention was
    refused by transformers only at load, after the data loaded, and T5 stopped inside torch's
    compiled kernel on CPU ("index out of bounds": transformers' flex_attention reads T5's one-row
    position bias at each example's index); each is one line at validate now, exit 2."""
    task = "{name: glue, subset: sst2}" if method == "full" else "{name: squad}"
    recipe = write_recipe(tmp_path / "r.yaml", f"model: {{checkpoint: {tiny_checkpoint(family)}, attention: "
                          f"flex_attention}}\nmethod: {{name: {method}}}\ntask: {task}\n")
    code, _, err = cli("validate", recipe)
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert "flex_attention" in lines[0] and "use sdpa or eager" in lines[0], lines


SIZES = {"relative": "k", "additive": "dim", "performer": "features"}


def _size_bound(name: str, folder: Path) -> int | None:
    """The largest size setting the model can use, read here from its config.json as the docs state
    it: relative's clip one short of the usable positions, performer's features the positions,
    additive's width the model's; None where the model sets none (T5's positions are relative).
    Usable positions: the learned ones, or its tokenizer's model_max_length where lower (RoBERTa's
    514 embeddings hold 512 positions after the padding offset)."""
    config = json.loads((folder / "config.json").read_text())
    positions = None if config["model_type"] == "t5" else config.get("max_position_embeddings") or config.get("n_positions")
    limit = json.loads((folder / "tokenizer_config.json").read_text()).get("model_max_length")
    positions = positions and min(positions, limit) if isinstance(limit, int) else positions
    if name == "additive":
        return config.get("hidden_size") or config.get("d_model") or config.get("n_embd")
    return positions and (positions - 1 if name == "relative" else positions)


@pytest.mark.parametrize("name", ["relative", "performer"])
def test_a_position_bound_counts_the_padding_offset_without_a_tokenizer_limit(tmp_path: Path, cli, tiny_checkpoint,
                                                                              name: str) -> None:
    """A RoBERTa checkpoint whose tokenizer was saved without a model_max_length: validate bounded
    relative.k and performer.features by its 514 learned positions (513, 514 passed), where the
    run's check (`models.padding_offset`) holds it to 512, the first two rows being the padding
    offset. Validate counts the offset by the same rule now: 511 and 512 pass, one more is refused."""
    folder = tmp_path / "no-limit"
    shutil.copytree(tiny_checkpoint("roberta"), folder)
    tok_config = json.loads((folder / "tokenizer_config.json").read_text())
    tok_config.pop("model_max_length", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_config))
    assert json.loads((folder / "config.json").read_text())["max_position_embeddings"] == 514
    bound, field = (511, "k") if name == "relative" else (512, "features")

    def validate(value: int) -> tuple[int, str]:
        recipe = write_recipe(tmp_path / "r.yaml", f"model: {{checkpoint: {folder}, attention: {{name: {name}, "
                              f"{field}: {value}}}}}\ntask: {{name: glue, subset: sst2}}\nmethod: {{name: full}}\n")
        code, _, err = cli("validate", recipe)
        return code, err

    assert validate(bound)[0] == 0
    code, err = validate(bound + 1)
    assert code == 2 and f"model.attention.{field}: {bound + 1} is above" in err and f"at most {bound}" in err, err


@pytest.mark.parametrize("name, family", [(n, f) for n in SIZES for f in FAMILIES if (n, f) not in REFUSED])
def test_a_size_setting_beyond_what_the_model_can_use_is_refused(tmp_path: Path, cli, tiny_checkpoint, name: str,
                                                                 family: str) -> None:
    """relative.k, additive.dim and performer.features had no upper bound: a huge value allocated
    its tables per layer at load until memory ran out. Validate now refuses, in one line naming
    the field, a value above what the checkpoint (its config.json) can use, and accepts the bound
    itself; where the config sets none (T5's positions) or validate cannot read it off-line
    (bert-base-uncased), the schema's maximum (attention.MOST) holds."""
    from toolkit.attention import MOST

    checkpoint = tiny_checkpoint(family)
    bound = _size_bound(name, Path(checkpoint))
    field = SIZES[name]

    def validate(value: int, where: str = checkpoint, *flags: str) -> tuple[int, str]:
        recipe = write_recipe(tmp_path / "r.yaml", f"model: {{checkpoint: {where}, attention: {{name: {name}, "
                              f"{field}: {value}}}}}\ntask: {{name: glue, subset: sst2}}\nmethod: {{name: full}}\n")
        code, _, err = cli("validate", recipe, *flags)
        return code, err

    if family == "roberta" and name != "additive":  # 514 embeddings, 512 positions: the bound is the latter
        assert bound == (511 if name == "relative" else 512)
    if bound is not None:
        assert validate(bound)[0] == 0
        code, err = validate(bound + 1)
        assert code == 2 and f"model.attention.{field}: {bound + 1} is above" in err and f"at most {bound}" in err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
        # --smoke runs a small model in its place, but the recipe is the checkpoint's: its bound holds there too
        code, err = validate(bound + 1, checkpoint, "--smoke")
        assert code == 2 and f"at most {bound}" in err
    most = MOST - 1 if name == "relative" else MOST
    code, err = validate(most + 1, checkpoint if bound is None else "bert-base-uncased")
    assert code == 2 and f"model.attention.{field}: {most + 1} is above the maximum {most}" in err


@pytest.fixture(scope="module")
def saved_folders(stock, tmp_path_factory):
    """module name -> an earlier run's folder holding model/ saved with that module (SMALL settings)."""
    from toolkit import attention

    root, made = tmp_path_factory.mktemp("trained"), {}

    def get(name: str) -> Path:
        if name not in made:
            entry = stock("bert")
            model, settings = resettled(entry, name, SMALL[name]), attention.ATTENTION.get(name)(**SMALL[name])
            folder = root / name / "model"
            model.save_pretrained(folder)
            entry[1].save_pretrained(folder)
            attention.save(model, folder, settings)
            made[name] = folder.parent
        return made[name]

    return get


def _other_settings(name: str) -> str:
    """The module with one setting other than SMALL's (`cross`, which every module has)."""
    from toolkit.attention import ATTENTION, as_recipe_text

    settings = ATTENTION.get(name)(**SMALL[name])
    settings.cross = not settings.cross
    return as_recipe_text(settings)


@pytest.mark.parametrize("spelled", ["model", "run"])
@pytest.mark.parametrize("name", _registered())
def test_a_checkpoint_trained_with_a_module_is_not_loaded_without_it(saved_folders, tmp_path: Path, cli, name: str,
                                                                     spelled: str) -> None:
    """An earlier run's model/ (or its run folder) as model.checkpoint is its weights under the
    module they trained with, as a `{run: ...}` chain is: a recipe naming no attention ran them under
    transformers' default attention, and one naming the module with other settings started the
    module's trained parameters afresh (load_saved loads only under the very settings), exit 0
    both. Refused at validate, at run and through the API, before anything is written; the
    module's own settings, another attention, and other settings of a module without parameters run."""
    import toolkit
    from toolkit.attention import ATTENTION, as_recipe_text
    from toolkit.errors import UserError

    run = saved_folders(name)
    checkpoint = run / "model" if spelled == "model" else run
    recipe = write_recipe(tmp_path / "r.yaml", f"model: {{checkpoint: {checkpoint}}}\n"
                          "task: {name: glue, subset: sst2, max_length: 16}\nmethod: {name: lora, r: 4}\n")
    runs = tmp_path / "runs"
    own = as_recipe_text(ATTENTION.get(name)(**SMALL[name]))
    has_parameters = bool(ATTENTION.get(name)().parameters(1, 1))
    for override, refused in ([], "would leave out"), ([f"model.attention={_other_settings(name)}"],
                                                       "would start them afresh" if has_parameters else None):
        for entry in ("validate", "run", "api"):
            if entry == "api":
                try:
                    toolkit.validate(recipe, overrides=override) if refused is None else toolkit.run(
                        recipe, runs_dir=runs, overrides=override)
                    code, err = 0, ""
                except UserError as exc:
                    code, err = 2, str(exc)
            elif entry == "run" and refused is None:
                continue  # validating is enough where it runs
            else:
                code, _, err = cli(entry, recipe, *override, *(["--runs-dir", runs] if entry == "run" else []))
            if refused is None:
                assert code == 0, err
                continue
            assert code == 2 and refused in err and f"trained with attention module '{name}'" in err, err
            assert f"set model.attention: {own}" in err and "Traceback" not in err
            assert not runs.exists()
    for named in (f"model.attention={own}", "model.attention=sdpa"):
        assert cli("validate", recipe, named)[0] == 0


@pytest.mark.parametrize("checkpoint", ["gpt2", "t5-base"])
def test_an_in_context_run_with_a_random_module_scores_again_as_it_ran(tmp_path: Path, checkpoint: str) -> None:
    """An in-context run (no training) loads its base with the module, whose parameters may start
    random (additive): the run drew them after seeding with train.seed, and `toolkit eval` or
    `predict` on the run (inference.load_model) must build that very model. Finding: the
    in-context load was not seeded, so each eval drew other parameters and scored another model
    than the run's (loss 0.6938, then 0.6936, then 0.6935), exit 0."""
    import toolkit

    recipe = write_recipe(tmp_path / "r.yaml", f"model: {{checkpoint: {checkpoint}, attention: {{name: additive, dim: 4}}}}\n"
                          "task: {name: glue, subset: rte, max_eval_samples: 8}\n"
                          "method: {name: icl, shots: 1}\ntrain: {seed: 42}\n")
    run = toolkit.run(recipe, runs_dir=tmp_path / "runs", smoke=True)
    ran = json.loads((run.dir / "metrics.json").read_text())["eval"]
    torch.manual_seed(1234)  # whatever the process drew before: the reload is seeded as the run was
    again = toolkit.evaluate(run)
    again = again.get("eval", again)
    assert again["loss"] == pytest.approx(ran["loss"], abs=1e-6), (again, ran)  # float summation order alone


@pytest.mark.parametrize("name", sorted(SMALL))
def test_positional_modules_refuse_prefix_tuning(tmp_path: Path, cli, name: str) -> None:
    """Prefix tuning's keys have no position; a positional module took them for tokens before the
    text (bigbird then ran dense, equal to dot; local hid them beyond the window)."""
    from toolkit.attention import ATTENTION

    recipe = write_recipe(tmp_path / "r.yaml", f"model: {{checkpoint: gpt2, attention: {name}}}\n"
                          "task: {name: glue, subset: sst2}\nmethod: {name: prefix_tuning}\n")
    code, _, err = cli("validate", recipe)
    if ATTENTION.get(name).positional:
        assert code == 2 and "prefix_tuning adds keys that have no position" in err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    else:
        assert code == 0, err
    recipe.write_text(recipe.read_text().replace("prefix_tuning", "lora"))  # only its keys are real tokens
    assert cli("validate", recipe)[0] == 0


def test_settings_are_hashed_and_listed(tmp_path: Path, cli) -> None:
    from toolkit import recipe as recipes

    path = write_recipe(tmp_path / "r.yaml", "model: {checkpoint: bert-base-uncased, attention: local}\n"
                        "task: {name: glue, subset: sst2}\nmethod: {name: full}\n")
    plain, wider = recipes.load(path), recipes.load(path, ["model.attention={name: local, window: 8}"])
    assert plain.to_dict()["model"]["attention"] == {"name": "local", "cross": False, "window": 64, "causal": False}
    assert plain.hash != wider.hash
    assert recipes.load(path, ["model.attention=sdpa"]).model.attention == "sdpa"
    code, out, _ = cli("ls", "attention")
    assert code == 0 and "sdpa" in out and "bigbird" in out and "performer" in out


@pytest.mark.parametrize("module", ["performer", "bigbird"])
def test_random_draws_follow_the_runs_seed_unless_one_is_set(tmp_path: Path, module: str) -> None:
    """The seeds of a sweep redraw a module's random features (its spread counts the draws); the
    recipe keeps `seed: null`, so a report still groups those runs as seeds of one setting."""
    from toolkit import recipe as recipes
    from toolkit.reports.core import setting

    path = write_recipe(tmp_path / "r.yaml", f"model: {{checkpoint: bert-base-uncased, attention: {module}}}\n"
                        "task: {name: glue, subset: sst2}\nmethod: {name: full}\n")
    a, b = (recipes.load(path, [f"train.seed={s}"]) for s in (1, 2))
    assert a.model.attention.draw_seed() == 1 and b.model.attention.draw_seed() == 2
    assert a.to_dict()["model"]["attention"]["seed"] is None
    assert setting({"recipe": a.to_dict(), "metrics": {}}) == setting({"recipe": b.to_dict(), "metrics": {}})
    fixed = [recipes.load(path, [f"train.seed={s}", f"model.attention={{name: {module}, seed: 5}}"]) for s in (1, 2)]
    assert [r.model.attention.draw_seed() for r in fixed] == [5, 5]


RECIPE = """model: {{checkpoint: {checkpoint}, attention: {attention}}}
task: {{name: glue, subset: sst2, max_length: 32}}
method: {method}
train: {{epochs: 1, lr: 1.0e-3, batch_size: 4, seed: 7, keep_best: false}}
"""


@pytest.mark.parametrize("checkpoint, attention, method", [
    ("bert-base-uncased", "{name: bilinear}", "{name: lora, r: 4}"),
    ("gpt2", "{name: performer, features: 8, redraw_every: 1}", "{name: full}"),
])
def test_resume_is_exact(tmp_path: Path, cli, checkpoint: str, attention: str, method: str) -> None:
    """Stop after 2 of 4 steps, resume: same losses and the same saved weights (attention ones too)."""
    from safetensors.torch import load_file

    recipe = write_recipe(tmp_path / "r.yaml", RECIPE.format(checkpoint=checkpoint, attention=attention, method=method))
    common = ["--smoke", "task.max_train_samples=12", "train.max_steps=4", "train.log_every=1"]
    full, parts = tmp_path / "full", tmp_path / "parts"
    assert cli("run", recipe, "--runs-dir", full, *common)[0] == 0
    assert cli("run", recipe, "--runs-dir", parts, *common, "--stop-after", 2)[0] == 0
    code, out, _ = cli("run", recipe, "--runs-dir", parts, *common)
    assert code == 0 and "resuming from" in out
    runs = [next(p.rglob("metrics.json")).parent for p in (full, parts)]
    logs = [[json.loads(l).get("loss") for l in (r / "log.jsonl").read_text().splitlines()] for r in runs]
    assert logs[0] == logs[1]
    a, b = (load_file(r / "model" / "attention.safetensors") for r in runs)
    assert a.keys() == b.keys() and a and all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads((runs[0] / "model" / "attention.json").read_text())["name"] in attention
    if "full" in method:  # the run folder as a checkpoint: the saved attention state comes back
        from toolkit import attention as modules, models

        settings = modules.settings_of(runs[0] / "model")
        model, _ = models.load(str(runs[0]), "sequence-classification", {}, settings)
        state = modules._added(model)
        assert state.keys() == a.keys() and all(torch.equal(state[k], a[k]) for k in a)
        assert int(a["transformer.h.0.attn.tk_attn_draws"]) > 0
        # by hand as toolkit eval does: the same features (drawn from the run's train.seed: 7)
        from toolkit.inference import load_model, run_recipe

        theirs, tok = load_model(runs[0], run_recipe(runs[0]))
        inputs = tok(["a sentence to score", "and another, longer one"], padding=True, return_tensors="pt")
        with torch.no_grad():
            torch.testing.assert_close(model.eval()(**inputs).logits, theirs(**inputs).logits, atol=0, rtol=0)


def test_performer_redraws_by_optimizer_steps_however_the_batch_is_split(tmp_path: Path, cli) -> None:
    """A run's trajectory does not depend on how its global batch is split into micro-batches
    (tests/test_accounting.py), so performer's redraw_every counts optimizer steps. Finding: it
    counted training forward passes, so batch 2 x 4 accumulated redrew 4 times as often as batch 8
    (and a redraw fell inside a step): another model, eval loss 0.6941868 against 0.6941864 on
    tiny GPT-2, exit 0. Now a step is counted at its first pass (no gradient held yet)."""
    from safetensors.torch import load_file

    recipe = write_recipe(tmp_path / "r.yaml", RECIPE.format(
        checkpoint="gpt2", attention="{name: performer, features: 8, redraw_every: 2}", method="{name: full}"))
    common = ["--smoke", "model.dropout=0.0", "task.max_train_samples=24", "task.max_eval_samples=8"]
    results = []
    for split in (["train.batch_size=8"], ["train.batch_size=2", "train.grad_accum=4"]):
        assert cli("run", recipe, "--runs-dir", tmp_path / split[-1], *common, *split)[0] == 0
        run = next((tmp_path / split[-1]).rglob("metrics.json")).parent
        metrics = json.loads((run / "metrics.json").read_text())
        draws = {int(t) for t in load_file(run / "model" / "attention.safetensors").values()}
        assert draws == {metrics["train_steps"]}, (split, draws)  # each step counted once
        results.append(metrics["eval"]["loss"])
    assert results[0] == results[1], results


def _restricting(name: str) -> str | None:
    """The setting that bounds who attends to whom (a window, a block), or None."""
    from dataclasses import fields

    from toolkit.attention import ATTENTION

    return next((f.name for f in fields(ATTENTION.get(name)) if f.name in ("window", "block")), None)


def _bounds(name: str, length: int) -> tuple[dict, dict]:
    """(settings just dense at `length`, settings just short of it) for a restricting module."""
    if name == "local":
        return {"window": length - 1}, {"window": length - 2}
    if name == "bigbird":  # dense at <= global_blocks + 2 = 3 blocks
        return {"block": -(-length // 3), "random_blocks": 1}, {"block": (length - 1) // 3, "random_blocks": 1}
    raise AssertionError(f"{name} bounds attention by '{_restricting(name)}': give its boundary here")


@pytest.mark.parametrize("name, family", [(n, f) for n in _registered() for f in ("bert", "gpt2")])
def test_dense_within_says_exactly_when_a_module_is_dense(stock, name: str, family: str) -> None:
    """A module that bounds attention (a window, a block) claims to be dense at a length exactly
    when it equals softmax attention there: one setting at the boundary equals the stock model,
    one short of it does not. A module that bounds nothing never claims it."""
    from toolkit.attention import ATTENTION

    if _restricting(name) is None:
        assert all(ATTENTION.get(name)().dense_within(n) is None for n in (2, 16, 4096))
        return
    entry = stock(family)
    inputs = dict(entry[1](["one sentence of some fourteen tokens or so, to cut in blocks"], return_tensors="pt"))
    length = inputs["input_ids"].shape[1]
    with torch.no_grad():
        stock_out = output(entry[0], inputs)
        for settings, dense in zip(_bounds(name, length), (True, False)):
            assert (ATTENTION.get(name)(**settings).dense_within(length) is not None) == dense
            ours = output(resettled(entry, name, settings), inputs)
            assert torch.allclose(ours, stock_out, atol=1e-5) == dense, (settings, dense)


@pytest.mark.parametrize("recipe, overrides, says", [
    ("glue/sst2/bert-base-uncased-prompt_tuning", ["model.attention={name: local, window: 19}", "task.max_length=16",
                                                   "method.num_virtual_tokens=4"],
     "local (window 19) covers the longest sequence this run feeds (20 tokens: task.max_length 16 + 4 virtual tokens)"),
    ("squad/v1.1/gpt2-full", ["model.attention={name: bigbird, block: 24}", "task.max_length=32",
                              "task.max_target_length=32", "task.generation.max_new_tokens=8"],
     "bigbird (blocks of 24, global_blocks 1) covers the longest sequence this run feeds (68 tokens: "
     "task.max_length 32 + 3 suffix + 33 answer tokens)"),  # the target and its EOS
])
def test_a_window_covering_every_sequence_is_said_at_setup(capsys, recipe: str, overrides: list, says: str) -> None:
    """Finding: a `local` window or bigbird block as long as the sequences ran plain dense softmax
    under the module's name, silently. The longest sequence counts a method's virtual tokens and
    a decoder's prompt suffix and answer; one warning line, said once."""
    from toolkit import recipe as recipes
    from toolkit.setup import build

    plan = recipes.plan(f"recipes/{recipe}.yaml", ["task.max_train_samples=4", "task.max_eval_samples=4", *overrides],
                        smoke=True)
    build(plan)
    lines = [line for line in capsys.readouterr().err.splitlines() if "covers the longest sequence" in line]
    assert len(lines) == 1 and lines[0].startswith(f"warning: model.attention: {says}"), lines
    assert "plain dense softmax attention, not" in lines[0]


def _bare_layer(name: str, settings: dict, heads: int, dim: int, causal: bool):
    """An attention layer as `prepare` leaves it (settings, role, added parameters moved off their
    initial values), without a model around it: the module's `attend` alone."""
    from toolkit.attention import ATTENTION, PREFIX

    attention = ATTENTION.get(name)(**settings)
    layer = torch.nn.Module()
    layer.is_causal, layer.tk_cross, layer.tk_index, layer.tk_settings = causal, False, 0, attention
    g = torch.Generator().manual_seed(1)
    for pname, value in attention.parameters(heads, dim).items():
        layer.register_parameter(PREFIX + pname, torch.nn.Parameter(value + 0.1 * torch.randn(value.shape, generator=g)))
    for bname, value in attention.buffers().items():
        layer.register_buffer(PREFIX + bname, value)
    return attention, layer.eval()


@pytest.mark.parametrize("name", _registered())
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_low_precision_stays_within_its_rounding(name: str, causal: bool) -> None:
    """bf16 weights / mixed precision (autocast) and fp16 give each module's float64 output within
    the dtype's rounding, as they do for `dot`; no NaN. Findings: sparsemax's support test ran on a
    bf16 cumulative sum and let masked (future, padded) keys in (causal outputs off by 5e4
    relative); in fp16 it raised an overflow error. linear's unnormalised sums over 1,024 keys
    overflowed fp16 (NaN); performer's bf16 features doubled dot's error. And in this test: it
    converted one layer in place (Module.to), so the fp16, autocast and later runs of the modules
    with parameters (additive, bilinear, relative) used weights already rounded to bf16 (bilinear's
    fp16 error read 4.7e-3, its own is 2.8e-3), under an fp16 tolerance of 1e-2, four times dot's
    2.6e-3. Each run now starts from a copy of the float32 weights; the tolerances sit just above
    the largest error measured (bf16 3.3e-2, fp16 4.7e-3, sparsemax's both)."""
    b, h, n, d = 2, 1, 512, 16
    settings = {**SMALL[name], **{"local": {"window": 16}, "bigbird": {"block": 16}}.get(name, {})}
    attention, layer = _bare_layer(name, settings, h, d, causal)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, generator=g, dtype=torch.float64) * 3 + 2 for _ in range(3))
    pad = torch.ones(b, 1, 1, n, dtype=torch.bool)
    pad[0, ..., n // 2:] = False
    real = pad[:, 0, 0, :, None, None].expand(b, n, h, d)  # (b, n, h, d): real query rows

    def error(out: torch.Tensor) -> float:
        return float((out.double() - exact)[real].norm() / exact[real].norm())

    def weights(dtype: torch.dtype):  # a copy: Module.to converts in place, and the next
        return copy.deepcopy(layer).to(dtype)  # dtype's run must not start from rounded weights

    with torch.no_grad():
        exact, _ = attention.attend(weights(torch.float64), q, k, v, pad, d ** -0.5, 0.0, None)
        for dtype, tolerance in ((torch.bfloat16, 4e-2), (torch.float16, 6e-3)):
            low, _ = attention.attend(weights(dtype), q.to(dtype), k.to(dtype), v.to(dtype), pad, d ** -0.5, 0.0, None)
            assert low.dtype == dtype and torch.isfinite(low).all(), dtype
            with torch.autocast("cpu", dtype=dtype):  # float32 weights under mixed precision
                mixed, _ = attention.attend(weights(torch.float32), q.float(), k.float(), v.float(), pad, d ** -0.5, 0.0,
                                            None)
            for out in (low, mixed):
                assert error(out) < tolerance, (dtype, out.dtype, error(out))
        # after them, float32 is float64 within its rounding: no run above rounded the layer's weights
        single, _ = attention.attend(weights(torch.float32), q.float(), k.float(), v.float(), pad, d ** -0.5, 0.0, None)
        assert error(single) < 1e-5, error(single)


@pytest.mark.parametrize("name", _registered())
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_a_row_without_real_tokens_stays_finite(name: str, causal: bool) -> None:
    """A batch row whose attention mask is all zeros (an empty text) gives finite outputs in every
    module: a NaN there reaches the loss's gradient through the masked sum (NaN * 0 is NaN) and
    every weight after one step. Finding: performer's key features took their stabilising maximum
    over the real keys only, -inf for such a row, and exp overflowed to NaN."""
    attention, layer = _bare_layer(name, SMALL[name], 2, 8, causal)
    q, k, v = (torch.randn(2, 2, 12, 8, generator=torch.Generator().manual_seed(i)) for i in range(3))
    pad = torch.ones(2, 1, 1, 12, dtype=torch.bool)
    pad[1] = False
    with torch.no_grad():
        out, _ = attention.attend(layer, q, k, v, pad, 8 ** -0.5, 0.0, None)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("name", _registered())
@pytest.mark.parametrize("model_type", ["llama", "mt5", "distilbert"])
def test_families_outside_the_tested_five_are_refused(tmp_path: Path, cli, name: str, model_type: str) -> None:
    """Each family hands its attention function its own extras, so a module is only known right on
    the families it is tested on. Findings: on llama (grouped key/value heads), gemma2 and mistral
    `prepare` raised a traceback at load; on distilbert and gpt_neox the first forward did; on mt5
    (T5's relative bias under another family name) linear and performer would have run
    order-blind, as they are refused on t5 for. Now one line at validate, for every module."""
    folder = tmp_path / model_type
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": model_type}))
    recipe = write_recipe(tmp_path / "r.yaml", f"model: {{checkpoint: {folder}, attention: {name}}}\n"
                          "task: {name: glue, subset: sst2}\nmethod: {name: full}\n")
    code, _, err = cli("validate", recipe)
    assert code == 2 and f"model.attention: '{name}' cannot run on {model_type}: the toolkit's attention modules run on" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize("name", _registered())
def test_a_forward_under_inference_mode_leaves_training_possible(name: str) -> None:
    """Whatever a module keeps between calls (performer's drawn features) must not carry
    torch.inference_mode into a later training pass. Finding: performer cached its features from
    an inference-mode forward and the next backward raised "Inference tensors cannot be saved"."""
    attention, layer = _bare_layer(name, SMALL[name], 2, 8, False)
    q, k, v = (torch.randn(1, 2, 9, 8, generator=torch.Generator().manual_seed(i)) for i in range(3))
    with torch.inference_mode():
        before, _ = attention.attend(layer, q, k, v, None, 8 ** -0.5, 0.0, None)
    q.requires_grad_(True)
    after, _ = attention.attend(layer, q, k, v, None, 8 ** -0.5, 0.0, None)
    after.sum().backward()
    assert q.grad is not None and torch.equal(after.detach(), before.clone())  # the same draw


def test_make_attention_deviation_is_of_the_model_the_run_starts_from(monkeypatch) -> None:
    """`make attention`'s "deviation from stock before training" measures the swapped model its
    run starts from. Finding: it seeded with 0, the run with train.seed, so additive's random
    start there was another draw than the one the row's run trained."""
    import importlib.util

    from toolkit import models, recipe as recipes
    from toolkit.setup import build

    spec = importlib.util.spec_from_file_location("attention_bench", Path(__file__).parents[1] / "benchmarks" / "attention.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    plan = recipes.plan("recipes/attention/sst2/minilm-additive.yaml", ["task.max_train_samples=4", "task.max_eval_samples=4",
                                                                        "model.attention={name: additive, dim: 4}"], smoke=True)
    started = {n: p.detach().clone() for n, p in build(plan).model.named_parameters() if "tk_attn_" in n}
    loaded, load = [], models.load

    def keep(*args, **kwargs):
        loaded.append(load(*args, **kwargs)[0])
        return loaded[-1], None

    recipe = plan.recipe
    recipe.model.checkpoint = models.smoke_checkpoint(recipe.model.checkpoint)  # the smoke run's model
    monkeypatch.setattr(models, "load", keep)
    monkeypatch.setattr(bench, "_dev_lines", lambda: ["a fine film", "not good at all, and long"])
    assert set(bench.deviation(recipe)) == {"dev_max_abs", "dev_rel"}
    measured = {n: p for n, p in loaded[-1].named_parameters() if "tk_attn_" in n}
    assert measured.keys() == started.keys() and all(torch.equal(measured[n], started[n]) for n in started)


def test_make_attention_targets_say_what_was_measured() -> None:
    """`make attention`'s target lines for the sparse modules (time / dot from 2048 tokens) count
    only what ran: a length dot skipped (over the sweep's memory or time limit) where the module
    ran is said and met, a sweep with no length from 2048 is 'not measured'. Finding: both were
    'NOT met', a claim about a comparison the sweep never made, exit 0."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("attention_bench", Path(__file__).parents[1] / "benchmarks" / "attention.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    point = lambda ms: {"ms": ms, "peak_mb": 1.0}
    res = {"dot": {1024: point(10), 2048: point(40)}, "local": {1024: point(12), 2048: point(20), 4096: point(41)},
           "bigbird": {1024: point(12), 2048: point(50), 4096: point(99)}}
    lines = bench.targets(res).splitlines()
    assert "- local: time / dot from 2048 tokens: 2048: 0.50, 4096: dot not run (over the sweep's limits) (target < 1: met)" in lines
    assert "- bigbird: time / dot from 2048 tokens: 2048: 1.25, 4096: dot not run (over the sweep's limits) (target < 1: NOT met)" in lines
    short = {"dot": {128: point(1), 512: point(4)}, "local": {128: point(1), 512: point(3)}}
    assert "- local: time / dot from 2048 tokens: not measured (no length from 2048 in this sweep that local ran)" \
        in bench.targets(short).splitlines()


@pytest.mark.parametrize("method, settings", [("full", {}), ("lora", {"r": 4}), ("prompt_tuning", {"num_virtual_tokens": 4})])
@pytest.mark.parametrize("name", [n for n in _registered() if n in ("additive", "bilinear", "relative")])
def test_weight_decay_leaves_a_parameter_that_starts_at_the_identity(stock, tmp_path: Path, name: str, method: str,
                                                                   settings: dict) -> None:
    """bilinear's W starts at the identity, where the module is dot-product attention; weight
    decay pulled it to 0 (every score to 0: uniform attention) whatever the data, as it would
    IA3's scales. It is kept out of decay under every method; tables and matrices that start at 0
    or at random (relative's, additive's) are decayed as any matrix."""
    from toolkit import attention, models, recipe as recipes
    from toolkit.methods import Context
    from toolkit.train import _optimizer

    recipe = recipes.load(write_recipe(tmp_path / "r.yaml", f"model: {{checkpoint: bert-base-uncased, attention: {name}}}\n"
                                       f"task: {{name: glue, subset: sst2}}\nmethod: {{name: {method}}}\n"
                                       "train: {weight_decay: 0.1}\n"), [f"method.{k}={v}" for k, v in settings.items()])
    entry = stock("bert")
    model = resettled(entry, name, SMALL[name])
    ctx = Context(family="bert", head_names=models.head_names(model), peft_task_type="SEQ_CLS", tokenizer=entry[1])
    model = recipe.method.apply(model, ctx)
    attention.keep_trainable(model)
    groups = {id(p): g["weight_decay"] for g in _optimizer(model, recipe, torch.device("cpu")).param_groups
              for p in g["params"]}
    added = {n.rsplit(".", 1)[-1]: groups[id(p)] for n, p in model.named_parameters() if attention.PREFIX in n}
    assert added and all(decay == (0.0 if n == "tk_attn_w" else 0.1) for n, decay in added.items()), added


@pytest.mark.parametrize("cached", [False, True], ids=["full", "cached"])
@pytest.mark.parametrize("name", _registered())
def test_a_later_key_never_reaches_an_earlier_query(name: str, cached: bool) -> None:
    """Causal self-attention: whatever a later token's key is (here far larger than the others,
    and for performer aligned with one of its random features, where its feature logits are
    largest), the outputs of the queries before it do not change, without a cache and with the
    earlier tokens' keys in one (a left-padded row beside a full one). Finding: performer
    stabilised its key features by their largest logit over every key of the row, future ones
    included; one later key with a larger logit pushed every earlier key's features below the
    denominator's floor, and earlier outputs changed by their whole size (2.8 of 2.8), exit 0:
    a decoder's future token leaked into its past, and cached decoding differed from the full
    forward. Its causal sums now take each query's shift over the keys it sees."""
    from toolkit.attention import attention_forward

    heads, dim, n = 2, 32, 12  # a head as wide as a real one's: feature logits span tens
    attention, layer = _bare_layer(name, SMALL[name], heads, dim, True)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, heads, n, dim, generator=g) for _ in range(3))
    pad = torch.ones(2, 1, 1, n, dtype=torch.bool)
    pad[1, ..., :3] = False  # left padding
    outliers = [s * torch.randn(dim, generator=g) for s in (4.0, 12.0, 1e4)]
    if name == "performer":  # a key at a feature's direction and norm: its largest feature logit
        w = attention.projection(layer, dim, q.device)
        root = (dim ** -0.5) ** 0.5
        outliers += [w[i] / root * f for i in w.norm(dim=1).argsort()[-2:] for f in (0.5, 1.0)]
    tq = 4 if cached else n  # the last tq queries against every key (the rest in a cache)

    def earlier(keys):
        with torch.no_grad():
            out, _ = attention_forward(layer, q[:, :, n - tq:], keys, v, pad, scaling=dim ** -0.5)
        return out[:, :-1][pad[:, 0, 0, n - tq:-1]]  # every real query before the last token

    before = earlier(k)
    for outlier in outliers:
        changed = k.clone()
        changed[:, :, -1] = outlier
        torch.testing.assert_close(earlier(changed), before, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("name, family", [(n, f) for n in _registered() for f in DECODERS if (n, f) not in REFUSED])
def test_a_later_token_leaves_a_decoders_earlier_outputs_bit_for_bit(stock, name: str, family: str) -> None:
    """A decoder (GPT-2; BART's and T5's, with cross-attention) run with its last token replaced by
    large random embeddings gives exactly the same logits at every earlier position: causality is
    masking, so any difference is a leak, however small. Findings: performer's shift over every
    key let the last token in (2e-6 here, the whole output with a wide head:
    test_a_later_key_never_reaches_an_earlier_query), and linear's exclusive prefix sums, formed
    as (all chunks) - (own chunk), kept a later key's rounding (2e-7 here, 2e-5 from a key of 1e4)."""
    entry = stock(family)
    model = resettled(entry, name, SMALL[name])
    moved_off_their_start(model)
    ids = entry[1](["this sentence is quite a bit longer than that one"], return_tensors="pt")["input_ids"]
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        embedded = model.get_input_embeddings()(ids)

        def earlier(embeds):
            if family == "gpt2":
                return model(inputs_embeds=embeds).logits[:, :-1]
            return model(input_ids=ids, decoder_inputs_embeds=embeds).logits[:, :-1]

        before = earlier(embedded)
        for scale in (1.0, 10.0, 100.0):
            changed = embedded.clone()
            changed[:, -1] = scale * torch.randn(embedded.shape[-1], generator=g)
            assert torch.equal(earlier(changed), before), (scale, (earlier(changed) - before).abs().max())


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_bigbird_draws_its_random_blocks_per_layer_and_head(causal: bool) -> None:
    """BigBird's random blocks are drawn per layer and per head (the paper; transformers seeds each
    layer with its index and draws every head in turn), reproducibly from the seed. Finding: every
    layer and every head of a model attended to the same random blocks. In training (where the
    random blocks are used) the output is dense softmax masked to each head's own pattern (T5's
    bias gathered per head too), cached queries get the full forward's keys, and no later or
    padded key reaches a real query."""
    from toolkit.attention import attention_forward

    heads, dim, n, block = 4, 8, 16, 2
    nb = n // block
    attention, layer = _bare_layer("bigbird", {"block": block, "global_blocks": 1, "random_blocks": 2, "seed": 5},
                                   heads, dim, causal)
    drawn = [attention.pattern(nb, heads, i)[0] for i in range(3)]
    assert drawn[0].shape[0] == heads and all(torch.equal(d, attention.pattern(nb, heads, i)[0]) for i, d in enumerate(drawn))
    assert all(not torch.equal(d[a], d[b]) for d in drawn for a in range(heads) for b in range(a))  # per head
    assert all(not torch.equal(drawn[i], drawn[j]) for i in range(3) for j in range(i))  # per layer
    assert attention.pattern(nb, heads, 0, training=False)[0].ndim == 2  # evaluation: no random blocks

    layer.tk_index = 2
    layer.train()
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, heads, n, dim, generator=g) for _ in range(3))
    bias = torch.randn(1, heads, n, n, generator=g)
    pad = torch.ones(2, 1, 1, n, dtype=torch.bool)
    pad[1, ..., -5:] = False  # right padding

    def forward(q, k, v, bias):
        with torch.no_grad():
            return attention_forward(layer, q, k, v, pad, scaling=dim ** -0.5, position_bias=bias)[0]

    out = forward(q, k, v, bias)
    index, valid = attention.pattern(nb, heads, 2)
    sees = ((index[..., None] == torch.arange(nb)) & valid[..., None]).any(dim=-2)  # (heads, nb, nb)
    i = torch.arange(n)
    keep = sees[:, i[:, None] // block, i[None, :] // block] | (i < block)[None, :, None]  # (heads, n, n)
    keep = keep[None] & pad & ((i[None, :] <= i[:, None]) if causal else True)
    scores = (torch.matmul(q, k.transpose(-1, -2)) * dim ** -0.5 + bias).masked_fill(~keep, torch.finfo(q.dtype).min)
    reference = torch.matmul(torch.softmax(scores, dim=-1), v).transpose(1, 2)  # (b, n, h, d)
    rows = pad[:, 0, 0]
    torch.testing.assert_close(out[rows], reference[rows], atol=1e-5, rtol=1e-5)
    noise = torch.randn(k.shape, generator=g)
    moved = forward(q, torch.where(pad[:, :, 0, :, None], k, noise), torch.where(pad[:, :, 0, :, None], v, noise), bias)
    torch.testing.assert_close(moved[rows], out[rows], atol=1e-6, rtol=1e-6)  # padded keys unseen
    if causal:
        later = k.clone()
        later[:, :, 10] = 1e3 * torch.randn(dim, generator=g)
        torch.testing.assert_close(forward(q, later, v, bias)[:, :10], out[:, :10], atol=1e-6, rtol=1e-6)
        cached = forward(q[:, :, -6:], k, v, bias[:, :, -6:])  # the last 6 queries, the rest in a cache
        torch.testing.assert_close(cached[rows[:, -6:]], out[:, -6:][rows[:, -6:]], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", _registered())
def test_packed_sequences_stay_apart_or_are_refused(stock, name: str) -> None:
    """GPT-2 given two sequences packed in one row (position ids restarting, no attention mask,
    no cache: a training forward) gets from transformers a mask that keeps each sequence to
    itself. A module that applies a full (q, kv) mask gives each sequence what it gives it alone
    (`dot`: the stock model's logits too); one that reads key padding only refuses in one line.
    Finding: the mask function reduced every mask to key padding, so the sequences attended to
    each other, `dot` included (0.09 in a logit against eager), exit 0."""
    from toolkit.attention import ATTENTION
    from toolkit.errors import UserError

    entry = stock("gpt2")
    model = resettled(entry, name, SMALL[name])
    moved_off_their_start(model)
    first, second = torch.tensor([[5, 6, 7, 8, 9]]), torch.tensor([[10, 11, 12, 13, 14, 15, 16]])
    ids = torch.cat([first, second], dim=1)
    positions = torch.cat([torch.arange(5), torch.arange(7)])[None]
    with torch.no_grad():
        if not ATTENTION.get(name).query_masks:
            with pytest.raises(UserError, match="applies key padding only"):
                model(input_ids=ids, position_ids=positions, use_cache=False)
            return
        packed = model(input_ids=ids, position_ids=positions, use_cache=False).logits[0]
        alone = torch.cat([model(input_ids=x, use_cache=False).logits[0] for x in (first, second)])
        torch.testing.assert_close(packed, alone, atol=1e-5, rtol=0)
        if name == "dot":
            stock_packed = entry[0](input_ids=ids, position_ids=positions, use_cache=False).logits[0]
            torch.testing.assert_close(packed, stock_packed, atol=1e-5, rtol=0)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("name", _registered())
def test_a_4d_mask_is_applied_as_given_or_refused(name: str, causal: bool) -> None:
    """A custom (q, kv) mask: one that is key padding (and causality, in a causal layer) gives what
    the same padding as a key mask gives, in every module; one that hides a key from some queries
    only is applied query by query where the module can (`query_masks`: a hidden key's value never
    reaches that query) and refused in one line where it cannot. A float mask is additive, as
    eager adds it: 0 / the minimum is the bool mask, and -10000 (older extended masks) hides a key
    as eager's sum does, or is refused where a module cannot add it to its scores. Findings: linear,
    performer, local and bigbird took any query's keys from a (q, kv) mask, so each query saw keys
    its mask hid; a -10000 mask was thresholded at half the minimum and hid nothing; exit 0."""
    from toolkit.attention import ATTENTION, attention_forward, causal_keep
    from toolkit.errors import UserError

    heads, dim, n = 2, 8, 6
    attention, layer = _bare_layer(name, SMALL[name], heads, dim, causal)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, heads, n, dim, generator=g) for _ in range(3))
    keys = torch.ones(2, 1, 1, n, dtype=torch.bool)
    keys[1, ..., -2:] = False
    full = keys & causal_keep(n, n, q.device) if causal else keys.expand(-1, -1, n, -1)

    def run(mask, values=v):
        with torch.no_grad():
            return attention_forward(layer, q, k, values, mask, scaling=dim ** -0.5)[0]

    for same in (full, torch.zeros(full.shape).masked_fill(~full, torch.finfo(torch.float32).min)):
        torch.testing.assert_close(run(same)[0], run(keys)[0], atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(run(same)[1, :4], run(keys)[1, :4], atol=1e-6, rtol=1e-6)
    older = torch.zeros(full.shape).masked_fill(~full, -10000.0)  # an older extended mask: additive
    module = ATTENTION.get(name)
    if module.query_masks and not module.positional:
        torch.testing.assert_close(run(older)[0], run(keys)[0], atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(run(older)[1, :4], run(keys)[1, :4], atol=1e-6, rtol=1e-6)
    else:
        with pytest.raises(UserError, match="cannot add a float attention mask"):
            run(older)
    hidden = full.clone()
    hidden[:, :, 3:, 0] = False  # key 0 hidden from queries 3.. only
    if not ATTENTION.get(name).query_masks:
        with pytest.raises(UserError, match="applies key padding only"):
            run(hidden)
        return
    moved = v.clone()
    moved[:, :, 0] = 100.0
    torch.testing.assert_close(run(hidden, moved)[0, 3:], run(hidden)[0, 3:], atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_dot_adds_a_float_mask_as_eager_does(stock, family: str) -> None:
    """The extended mask older code builds, (1 - mask) * -10000 (with the causal part on GPT-2),
    gives `dot` the stock model's outputs. Finding: -10000 was read as 'keep' (0.03 off eager on
    BERT, 0.16 on GPT-2), exit 0."""
    entry = stock(family)
    model, inputs = resettled(entry, "dot", {}), batch(family, entry[1])
    mask = inputs["attention_mask"]
    n = mask.shape[1]
    older = (1.0 - mask[:, None, None, :].float()) * -10000.0
    if family == "gpt2":
        older = older + torch.full((n, n), -10000.0).triu(1)
    inputs = dict(inputs, attention_mask=older)
    with torch.no_grad():
        ours, theirs = (output(m, inputs)[mask.bool()] for m in (model, entry[0]))
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
