"""Performer's FAVOR+ (Choromanski et al. 2021): softmax attention estimated with positive
orthogonal random features phi(x) = exp(w^T x - |x|^2 / 2) / sqrt(m), in O(n) memory.

The projections are not learned: they are drawn from a seed, the layer's index and a round
number, and redrawn every `redraw_every` training forward passes (0 = never). The pass counter
is a buffer (`tk_attn_draws`), so it is checkpointed and a resumed run redraws exactly when an
uninterrupted one does. Evaluation uses the draw of the last training pass (a draw is taken
at the start of a training pass, as in the reference implementation). Refused for T5 (see Attention).

A pass is counted by a forward pre-hook on the whole model, never inside the attention layer:
activation checkpointing (train.gradient_checkpointing) runs a layer's forward again in
backward, and a count there advanced the counter twice per pass and, at a round's boundary,
took the gradient of another draw than the loss was computed with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from toolkit.attention import ATTENTION, PREFIX, Attention, attention_layers, is_causal, key_keep
from toolkit.attention.linear import kernel_attention, wide
from toolkit.lazy import lazy

torch = lazy("torch", globals())


def orthogonal_features(m: int, d: int, generator: torch.Generator) -> torch.Tensor:
    """(m, d): stacked orthogonal blocks, rows rescaled to Gaussian norms (FAVOR+'s estimator)."""
    blocks = []
    for _ in range(-(-m // d)):
        square, _ = torch.linalg.qr(torch.randn(d, d, generator=generator))
        blocks.append(square.t())
    w = torch.cat(blocks)[:m]
    norms = torch.randn(m, d, generator=generator).norm(dim=1, keepdim=True)
    return w * norms


def positive_features(x: torch.Tensor, w: torch.Tensor, keys: torch.Tensor | None) -> torch.Tensor:
    """x (b, h, t, d) -> (b, h, t, m); stabilised by a max that cancels in the attention ratio."""
    wx = torch.matmul(x, w.t())  # (b, h, t, m)
    logits = wx - 0.5 * (x * x).sum(dim=-1, keepdim=True)
    if keys is None:  # queries: a per-row constant cancels between numerator and denominator
        shift = logits.amax(dim=-1, keepdim=True)
    else:  # keys: one constant per (b, h), taken over real keys only (a row without any: all)
        real = logits.masked_fill(~keys[:, None, :, None], float("-inf"))
        shift = real.amax(dim=(-2, -1), keepdim=True)
        shift = torch.where(torch.isfinite(shift), shift, logits.amax(dim=(-2, -1), keepdim=True))
    return torch.exp(logits - shift.detach()) / math.sqrt(w.shape[0])


@ATTENTION.register("performer")
@dataclass
class Performer(Attention):
    forms_scores = False
    compile_eager = "it draws its random features from a torch.Generator made in the forward (opaque to dynamo)"
    features: int = field(default=64, metadata={"min": 1})
    redraw_every: int = field(default=100, metadata={"min": 0})  # training forward passes; 0 = never
    # None: the run's train.seed (draw_seed); a number within train.seed's bounds (a larger one
    # overflowed torch.Generator.manual_seed at the first forward, a traceback)
    seed: int | None = field(default=None, metadata={"min": 0, "max": 2**32 - 1})
    chunk: int = field(default=64, metadata={"min": 1})

    def buffers(self) -> dict[str, torch.Tensor]:
        return {"draws": torch.zeros((), dtype=torch.long)}

    def prepare(self, model):
        model = super().prepare(model)
        counted = [layer for _, layer in attention_layers(model) if hasattr(layer, PREFIX + "draws")]

        def count(top, args):  # once per training pass of the whole model, recomputation or not
            if top.training and torch.is_grad_enabled():
                for layer in counted:
                    layer.tk_attn_draws += 1

        model.register_forward_pre_hook(count)
        return model

    def projection(self, module, d: int, device: torch.device) -> torch.Tensor:
        # the training pass running now (the model's pre-hook counted it before it ran), else the
        # last one that ran: evaluation scores the draw the model last trained with (the next
        # pass's, taken at a multiple of redraw_every, was one no pass had used)
        passes = max(int(module.tk_attn_draws) - 1, 0)
        round_ = passes // self.redraw_every if self.redraw_every else 0
        cached = getattr(module, "_tk_features", None)
        stale = cached is None or cached[0] != round_ or cached[1].shape[-1] != d or cached[1].device != device
        # drawn under torch.inference_mode: autograd refuses it afterwards (a training pass raised)
        if stale or (cached[1].is_inference() and not torch.is_inference_mode_enabled()):
            g = torch.Generator().manual_seed(self.draw_seed() * 1_000_003 + module.tk_index * 10_007 + round_)
            cached = (round_, orthogonal_features(self.features, d, g).to(device))
            module._tk_features = cached
        return cached[1]

    def attend(self, module, q, k, v, pad, scaling, dropout, bias):
        """The features in float32 whatever q's dtype: exp of bf16 logits doubled the error of
        every other module's bf16 output (kernel_attention sums in float32 likewise)."""
        keys = key_keep(pad, q.shape[0], k.shape[-2], q.device)
        q, k = wide(q), wide(k)
        w = self.projection(module, q.shape[-1], q.device).to(q.dtype)
        root = scaling ** 0.5  # q.k * scaling = (root q).(root k)
        with torch.autocast(q.device.type, enabled=False):
            phi_q = positive_features(q * root, w, None)
            phi_k = positive_features(k * root, w, keys)
        return kernel_attention(phi_q, phi_k, v, keys, is_causal(module), self.chunk), None
