"""Dropout on CPU without torch's `bernoulli_`: the same distribution, 2-3x faster.

On CPU, torch draws a dropout mask with `bernoulli_`: one double-precision uniform per element,
from the mt19937 generator, in a serial loop. In a full fine-tuning step of MiniLM (32 x 128
tokens, 2 cores) that was 20-28% of the step (torch profiler: 20 calls, 0.49-0.75 s of a
2.3-2.9 s step; 5% with this module's masks), and 14% of a LoRA step on the roberta-base shape.
torch's integer draws are no better (`torch.randint`: about 12 ns per 64-bit word here). This
module draws 32 random bits per element from numpy's PCG64DXSM (about 3 ns per 64-bit word),
seeded for each mask by one draw from torch's default generator, keeps an element when its bits
are at or above a threshold, and scales what it keeps by 1 / (1 - p):

- P(drop) = round(p * 2^32) / 2^32, within 1.2e-10 of p (float32 `bernoulli_` resolves 2^-24);
- E[output] = input, as with `nn.Dropout`; the backward multiplies by the same mask and scale;
- the mask is kept for the backward as bool, one byte an element, as torch's `native_dropout`;
- each mask's generator is seeded from torch's default CPU generator, so `set_seed` fixes the
  masks and accelerate's checkpoint (which saves that generator's state) resumes them exactly.

The random stream is not torch's: the same seed gives other masks than `nn.Dropout` would, so a
run with it differs from one without by dropout's noise. `train.fast_dropout: false` keeps
torch's own. GPUs keep torch's dropout (philox, fused into one kernel), as do `inplace` dropouts.

`install(model)` switches a model over: every `nn.Dropout` module (the hidden-state, embedding
and classifier dropouts of BERT, RoBERTa, GPT-2 and T5, PEFT's `lora_dropout`), and the
attention-probability dropout of its attention layers, under `sdpa` (which on CPU runs torch's
math path with `bernoulli_` whenever dropout is on) and under the toolkit's dense attention modules
(toolkit.attention.softmax_attention). BART applies its dropouts with `nn.functional.dropout` in
its forward code, and the block-sparse modules (local, bigbird) theirs: those stay torch's.

PyTorch has no faster CPU dropout, and inductor's own random numbers exist only inside compiled
graphs (which did not pay on this CPU; docs/numbers.md), so this is written here.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import nn

from toolkit.layers import attention_layers

# Imported only where a model trains (train.Loop, an attention layer's forward): `toolkit ls`
# and `toolkit validate` never load it, so importing torch here costs them nothing.

_INT32_MIN = -(2**31)
_SDPA: dict[str, Any] = {}  # transformers' own sdpa function, once `install` has put ours first


def applies(x: torch.Tensor, p: float) -> bool:
    """Whether this dropout is one the toolkit draws: a float32/float64 CPU tensor, 0 < p < 1
    (bf16 and fp16 keep torch's, whose scale is not rounded to the low precision)."""
    return x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64) and 0.0 < p < 1.0


def keep_mask(shape: tuple[int, ...], p: float) -> torch.Tensor:
    """A bool tensor of `shape`, each element True (kept) with probability 1 - p: 32 random bits
    per element (each 64-bit word of PCG64DXSM read as two int32), compared with round(p * 2^32)
    above the int32 minimum. The generator is seeded, per call, by one 63-bit draw from torch's
    default CPU generator, so torch's seed and saved RNG state decide every mask."""
    n = math.prod(shape)
    seed = int(torch.randint(0, 2**63 - 1, (), dtype=torch.int64))
    words = np.random.PCG64DXSM(seed).random_raw((n + 1) // 2)
    bits = torch.from_numpy(words.view(np.int32)[:n]).view(shape)
    return bits >= _INT32_MIN + round(p * 2**32)


class MaskScale(torch.autograd.Function):
    """x * keep / (1 - p), keeping the bool mask (one byte an element) for the backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, keep: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        ctx.save_for_backward(keep)
        return keep.to(x.dtype).mul_(scale).mul_(x)  # one cast, two in-place passes

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (keep,) = ctx.saved_tensors
        return keep.to(grad.dtype).mul_(ctx.scale).mul_(grad), None, None


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """`nn.functional.dropout(x, p, training)`, drawn by `keep_mask` where `applies`."""
    if not training or not applies(x, p):
        return nn.functional.dropout(x, p, training)
    return MaskScale.apply(x, keep_mask(tuple(x.shape), p), 1.0 / (1.0 - p))


_dropout = dropout  # for sdpa_forward, whose argument `dropout` (transformers' name) hides it


def module_dropout(module: Any, x: torch.Tensor, p: float) -> torch.Tensor:
    """Attention-probability dropout inside an attention layer: the toolkit's when `install`
    marked the layer, else torch's."""
    if getattr(module, "tk_fast_dropout", False):
        return dropout(x, p, module.training)
    return nn.functional.dropout(x, p, module.training)


class Dropout(nn.Dropout):
    """nn.Dropout whose CPU mask comes from `keep_mask`; `install` gives a model's nn.Dropout
    modules this class (same p, inplace and hooks)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) if self.inplace else dropout(x, self.p, self.training)


def install(model: nn.Module, device: Any = "cpu") -> int:
    """Switch `model`'s dropouts to the toolkit's (see the module's docstring) when it trains on
    a CPU (`device`); returns how many dropout modules and attention layers it switched (0 on
    any other device, where torch's dropout is the fast one)."""
    if torch.device(device).type != "cpu":
        return 0
    switched = 0
    for module in model.modules():
        if type(module) is nn.Dropout:
            module.__class__ = Dropout  # the same module (p, inplace, hooks), another forward
            switched += 1
    for _, layer in attention_layers(model):
        layer.tk_fast_dropout = True
        switched += 1
    _route_sdpa()
    return switched


def _route_sdpa() -> None:
    """Put `sdpa_forward` under transformers' name "sdpa", keeping transformers' function for
    every call it does not take (any layer `install` did not mark, GPUs, eval, p = 0)."""
    if "sdpa" in _SDPA:
        return
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    _SDPA["sdpa"] = sdpa_attention_forward
    AttentionInterface.register("sdpa", sdpa_forward)


def sdpa_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                 is_causal: bool | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' sdpa, except in training on CPU with dropout in a layer `install` marked,
    where torch's sdpa would take its math path and draw the mask with `bernoulli_`: there, the
    same math (scores, mask, softmax, dropout, mix) with the toolkit's mask. Calls with what this
    does not handle (T5's position bias, grouped key/value heads, a paged cache, softcap) go to
    transformers' function unchanged."""
    sdpa = _SDPA["sdpa"]
    simple = not (kwargs.get("position_bias") is not None or kwargs.get("cache") is not None
                  or kwargs.get("softcap") is not None or getattr(module, "num_key_value_groups", 1) > 1)
    if not (simple and module.training and getattr(module, "tk_fast_dropout", False) and applies(query, dropout)):
        return sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                    is_causal=is_causal, **kwargs)
    p = dropout
    return math_attention(module, query, key, value, attention_mask, scaling, is_causal,
                          lambda weights: _dropout(weights, p))


def math_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   attention_mask: torch.Tensor | None, scaling: float | None, is_causal: bool | None,
                   drop: Any) -> tuple[torch.Tensor, None]:
    """Scaled dot-product attention as torch's math backend computes it, with transformers'
    sdpa conventions: causal only when asked and no mask is given (upper-left aligned, keys cut
    to the queries as transformers does), a bool mask (True = attend) or an additive float one;
    returns (b, tq, h, d) contiguous. A query row with no key to attend to gets zeros, as torch's
    safe softmax gives."""
    q_length, kv_length = query.shape[2], key.shape[2]
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(q_length > 1 and attention_mask is None and causal)
    if causal and kv_length > q_length:
        key, value = key[:, :, :q_length], value[:, :, :q_length]
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    scores = torch.matmul(query * scale, key.transpose(-1, -2))  # (b, h, tq, tk)
    if causal:
        attention_mask = torch.ones(q_length, key.shape[2], dtype=torch.bool, device=query.device).tril()
    empty = None
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attention_mask, float("-inf"))
            empty = ~attention_mask.any(dim=-1, keepdim=True)
        else:
            scores = scores + attention_mask
            empty = torch.isneginf(attention_mask).all(dim=-1, keepdim=True)
    weights = torch.softmax(scores, dim=-1)
    if empty is not None and bool(empty.any()):
        weights = weights.masked_fill(empty, 0.0)
    out = torch.matmul(drop(weights), value)  # (b, h, tq, d)
    return out.transpose(1, 2).contiguous(), None
