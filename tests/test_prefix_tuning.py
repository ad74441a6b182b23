"""Prefix tuning through the attention interface (toolkit/methods/prefix_tuning.py).

The reference is the model's own key/value cache: the same prefixes handed to the unwrapped model
as a cache, with the mask and positions a cache-fed model needs said explicitly, must give the
same logits. Generation must give the same tokens with and without the model's cache (prefix and
cache in the right order, causal offsets right), and the source must still matter to an
encoder-decoder (cross-attention sees prefix and encoder states). End to end: extractive SQuAD
on BERT and summarization on BART through `toolkit run --smoke`.
"""

from __future__ import annotations

import inspect
import json

import pytest
import torch
from transformers import (AutoModelForCausalLM, AutoModelForSeq2SeqLM,
                          AutoModelForSequenceClassification, DynamicCache)
from transformers.utils import logging as hf_logging

from conftest import ROOT, shared_tokenizer
from toolkit import models
from toolkit.methods import METHODS, Context
from toolkit.methods.prefix_tuning import WRAPPED, prefixes

N = 4
TEXTS = ["a great movie", "terrible, boring and far too long"]


@pytest.fixture(autouse=True)
def _quiet():
    hf_logging.set_verbosity_error()


def _prefixed(model, tok, task_type: str, **settings):
    ctx = Context(family=model.config.model_type, head_names=models.head_names(model),
                  peft_task_type=task_type, tokenizer=tok)
    return METHODS.get("prefix_tuning")(num_virtual_tokens=N, **settings).apply(model, ctx)


def _classifier(tiny: str, impl: str):
    torch.manual_seed(0)
    tok = shared_tokenizer(tiny)
    model = AutoModelForSequenceClassification.from_pretrained(tiny, num_labels=2, attn_implementation=impl)
    if model.config.pad_token_id is None:
        tok.pad_token = tok.eos_token
        model.config.pad_token_id = tok.eos_token_id
    return model.eval(), tok


def _cache_reference(peft_model, batch, family: str, pad_id: int, impl: str) -> torch.Tensor:
    """The unwrapped model, on its own attention function, fed the prefixes as its key/value
    cache (transformers' own route), with a 4D mask that shows every prefix key and positions
    0..T-1 for the real tokens."""
    base = peft_model.get_base_model()
    base.set_attn_implementation(impl)
    table = prefixes(peft_model)
    b, t = batch["input_ids"].shape
    cache = DynamicCache([(table[2 * i].expand(b, -1, -1, -1), table[2 * i + 1].expand(b, -1, -1, -1))
                          for i in range(table.shape[0] // 2)])
    real = batch["attention_mask"].bool()
    keep = torch.cat([torch.ones(b, N, dtype=torch.bool), real], 1)[:, None, None, :].expand(b, 1, t, N + t)
    if family == "gpt2":
        keep = keep & torch.ones(t, N + t, dtype=torch.bool).tril(N)
    mask = torch.zeros(keep.shape).masked_fill(~keep, torch.finfo(torch.float32).min)
    if family == "roberta":  # RoBERTa counts positions from padding_idx + 1, pads at padding_idx
        positions = real.long().cumsum(1) * real.long() + pad_id
    else:
        positions = torch.arange(t)[None].expand(b, -1)
    cache_arg = "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"
    return base(input_ids=batch["input_ids"], attention_mask=mask, position_ids=positions,
                **{cache_arg: cache}).logits


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("family", ["bert", "roberta", "gpt2"])
def test_prefixes_equal_the_models_own_cache_route(tiny_checkpoint, family, impl):
    model, tok = _classifier(tiny_checkpoint(family), impl)
    batch = dict(tok(TEXTS, padding=True, return_tensors="pt"))
    with torch.no_grad():
        plain = model(**batch).logits
        prefixed = _prefixed(model, tok, "SEQ_CLS")
        assert model.config._attn_implementation == WRAPPED + impl
        got = prefixed(**batch).logits
        want = _cache_reference(prefixed, batch, family, tok.pad_token_id, impl)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert (got - plain).abs().max() > 1e-6, "the prefixes changed nothing"


def _lm(family: str, tiny: str, d_kv: int | None = None):
    torch.manual_seed(0)
    tok = shared_tokenizer(tiny)
    cls = AutoModelForCausalLM if family == "gpt2" else AutoModelForSeq2SeqLM
    model = cls.from_pretrained(tiny) if d_kv is None else cls.from_pretrained(tiny, d_kv=d_kv, ignore_mismatched_sizes=True)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
        model.config.pad_token_id = tok.eos_token_id
    return model, tok


@pytest.mark.parametrize("family, d_kv", [("gpt2", None), ("bart", None), ("t5", None), ("t5", 8)])
def test_generation_trains_and_reads_prefix_and_cache_in_order(tiny_checkpoint, family, d_kv):
    """A few steps lower the loss; then greedy generation is the same with the model's cache as
    without it, and (encoder-decoders) the source still steers the output. T5 with heads narrower
    than d_model / num_heads (`d_kv`, as t5-3b's and t5-11b's are wider): PEFT sized the prefixes
    by the hidden size and the first batch stopped with a shape error."""
    model, tok = _lm(family, tiny_checkpoint(family), d_kv)
    task_type = "CAUSAL_LM" if family == "gpt2" else "SEQ_2_SEQ_LM"
    prefixed = _prefixed(model, tok, task_type, prefix_projection=True, encoder_hidden_size=16)
    prefixed.eval()  # no dropout: the loss comparison is deterministic
    src = tok(TEXTS, padding=True, return_tensors="pt")
    target = tok(["good", "bad"], padding=True, return_tensors="pt").input_ids
    if family == "gpt2":
        inputs = {"input_ids": src.input_ids, "attention_mask": src.attention_mask,
                  "labels": src.input_ids.masked_fill(src.attention_mask == 0, -100)}
    else:
        inputs = {**dict(src), "labels": target.masked_fill(target == tok.pad_token_id, -100)}
    opt = torch.optim.AdamW([p for p in prefixed.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for _ in range(4):
        loss = prefixed(**inputs).loss
        losses.append(loss.item())
        loss.backward()
        opt.step()
        opt.zero_grad()
    assert losses[-1] < losses[0]
    assert all(p.grad is None for n, p in prefixed.named_parameters() if not p.requires_grad)
    one = {k: v[:1] for k, v in dict(src).items()}
    with torch.no_grad():
        cached = prefixed.generate(**one, max_new_tokens=6, do_sample=False, use_cache=True)
        uncached = prefixed.generate(**one, max_new_tokens=6, do_sample=False, use_cache=False)
        assert torch.equal(cached, uncached)
        if family != "gpt2":
            out = [prefixed(**{k: v[i:i + 1] for k, v in dict(src).items()},
                            decoder_input_ids=target[:1]).logits for i in range(2)]
            assert not torch.allclose(out[0], out[1], atol=1e-5), "the decoder no longer sees the source"


@pytest.mark.parametrize("family", ["bart", "t5"])
@pytest.mark.parametrize("encoder, decoder", [(3, 1), (1, 2)])
def test_every_prefix_row_is_read_when_the_stacks_differ_in_depth(tiny_checkpoint, tmp_path, family, encoder, decoder):
    """Only the decoder reads an encoder-decoder's prefixes, and PEFT sized the table by the
    config's layer count, the encoder's: with a deeper encoder (distilbart-12-3) the rows past the
    decoder's never trained and counted in trainable_params; with a deeper decoder more layers
    shared rows. The table is now the decoder's: every key/value row of it gets a gradient,
    trainable_params is n x 2 x decoder layers x width, and plain PEFT reloads it."""
    from peft import PeftModel
    from transformers import AutoConfig

    from toolkit.methods import count_params

    config = AutoConfig.from_pretrained(tiny_checkpoint(family))
    if family == "bart":
        config.encoder_layers = config.num_hidden_layers = encoder
        config.decoder_layers = decoder
    else:
        config.num_layers, config.num_decoder_layers = encoder, decoder
    torch.manual_seed(0)
    model = AutoModelForSeq2SeqLM.from_config(config)
    model.save_pretrained(tmp_path / "base")
    tok = shared_tokenizer(tiny_checkpoint(family))
    prefixed = _prefixed(model, tok, "SEQ_2_SEQ_LM")
    peft_config = prefixed.active_peft_config
    assert peft_config.num_layers == decoder
    assert count_params(prefixed)[0] == N * 2 * decoder * config.d_model
    batch = dict(tok(TEXTS, padding=True, return_tensors="pt"))
    decoder_in = torch.tensor([[config.decoder_start_token_id, 5, 6]] * 2)
    prefixed(**batch, decoder_input_ids=decoder_in).logits.pow(2).mean().backward()
    grad = prefixed.prompt_encoder["default"].embedding.weight.grad.view(N, 2 * peft_config.num_layers, -1)
    idle = (grad.abs().sum((0, 2)) == 0).nonzero().flatten().tolist()
    assert not idle, f"prefix rows {idle} are read by no layer"
    prefixed.eval().save_pretrained(tmp_path / "adapter")
    reloaded = METHODS.get("prefix_tuning")().loaded(
        PeftModel.from_pretrained(AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "base"), tmp_path / "adapter")).eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(**batch, decoder_input_ids=decoder_in).logits,
                                   prefixed(**batch, decoder_input_ids=decoder_in).logits)


def test_prefix_tuning_runs_extractive_qa_and_summarization_end_to_end(cli, runs_dir):
    method = "method={name: prefix_tuning, num_virtual_tokens: 4}"
    for recipe in ("squad/v1.1/bert-base-uncased-lora", "summarization/samsum/bart-base-lora"):
        code, _, err = cli("run", ROOT / "recipes" / f"{recipe}.yaml", method, "--smoke",
                           "--runs-dir", runs_dir / recipe)
        assert code == 0, err
        (metrics,) = (runs_dir / recipe).rglob("metrics.json")
        saved = json.loads(next((runs_dir / recipe).rglob("adapter_config.json")).read_text())
        assert saved["peft_type"] == "PREFIX_TUNING" and saved["num_virtual_tokens"] == 4
        assert json.loads(metrics.read_text())["eval"], recipe
        code, out, err = cli("eval", metrics.parent)
        assert code == 0, err


def test_unsupported_attention_is_one_line(tiny_checkpoint):
    from toolkit.errors import UserError
    from toolkit.methods.prefix_tuning import _register

    with pytest.raises(UserError, match="prefix_tuning runs with model.attention eager, sdpa or a toolkit module"):
        _register("flash_attention_2")


def test_activation_checkpointing_gives_the_same_gradients(tiny_checkpoint):
    """PEFT refuses prefix tuning under gradient checkpointing (its cache route breaks); here the
    prefixes stay on their layers, so the recomputed forward in backward is the same one."""
    grads = []
    for checkpointing in (False, True):
        model, tok = _classifier(tiny_checkpoint("bert"), "sdpa")
        prefixed = _prefixed(model, tok, "SEQ_CLS")
        if checkpointing:  # as the loop does: after the method (PEFT refuses it before)
            prefixed.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        assert model.is_gradient_checkpointing == checkpointing
        prefixed.train()
        for module in prefixed.modules():  # no dropout: the two passes must see the same network
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
        batch = dict(tok(TEXTS, padding=True, return_tensors="pt"))
        torch.nn.functional.cross_entropy(prefixed(**batch).logits, torch.tensor([1, 0])).backward()
        grads.append({n: p.grad.clone() for n, p in prefixed.named_parameters() if p.requires_grad})
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-5, atol=1e-7)
