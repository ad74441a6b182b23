"""Performer's FAVOR+ (Choromanski et al. 2021): softmax attention estimated with positive
orthogonal random features phi(x) = exp(w^T x - |x|^2 / 2) / sqrt(m), in O(n) memory.

The projections are not learned: they are drawn from a seed, the layer's index and a round
number, and redrawn every `redraw_every` optimizer steps (0 = never). The step counter is a
buffer (`tk_attn_draws`), so it is checkpointed and a resumed run redraws exactly when an
uninterrupted one does; a step is counted at its first training pass, so micro-batches of one
step (train.grad_accum) share its draw, as the rows of one larger batch would. Evaluation uses
the draw of the last training step (a draw is taken at the start of a training step, as the
reference implementation takes one at the start of a training pass). Refused for T5 (see
Attention).

A pass is counted by a forward pre-hook on the whole model, never inside the attention layer:
activation checkpointing (train.gradient_checkpointing) runs a layer's forward again in
backward, and a count there advanced the counter twice per pass and, at a round's boundary,
took the gradient of another draw than the loss was computed with.

The key features are stabilised by a shift that cancels in each query's ratio. In causal layers
it is each query's own, over the keys it sees (`causal_favor`): one shift over every key of the
row let a later key with a larger feature logit push the earlier keys' features under the
denominator's floor, so a future token changed the outputs before it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from toolkit.attention import ATTENTION, MOST, PREFIX, Attention, is_causal, key_keep
from toolkit.attention.linear import EPS, kernel_attention, wide
from toolkit.lazy import lazy

torch = lazy("torch", globals())
F = lazy("torch.nn.functional", globals())


def orthogonal_features(m: int, d: int, generator: torch.Generator) -> torch.Tensor:
    """(m, d): stacked orthogonal blocks, rows rescaled to Gaussian norms (FAVOR+'s estimator)."""
    blocks = []
    for _ in range(-(-m // d)):
        square, _ = torch.linalg.qr(torch.randn(d, d, generator=generator))
        blocks.append(square.t())
    w = torch.cat(blocks)[:m]
    norms = torch.randn(m, d, generator=generator).norm(dim=1, keepdim=True)
    return w * norms


def feature_logits(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x (b, h, t, d) -> (b, h, t, m): the log of phi(x) * sqrt(m), before any stabilising shift."""
    return torch.matmul(x, w.t()) - 0.5 * (x * x).sum(dim=-1, keepdim=True)


def positive_features(x: torch.Tensor, w: torch.Tensor, keys: torch.Tensor | None) -> torch.Tensor:
    """x (b, h, t, d) -> (b, h, t, m); stabilised by a max that cancels in the attention ratio."""
    logits = feature_logits(x, w)
    if keys is None:  # queries: a per-row constant cancels between numerator and denominator
        shift = logits.amax(dim=-1, keepdim=True)
    else:  # keys: one constant per (b, h), taken over real keys only (a row without any: all)
        real = logits.masked_fill(~keys[:, None, :, None], float("-inf"))
        shift = real.amax(dim=(-2, -1), keepdim=True)
        shift = torch.where(torch.isfinite(shift), shift, logits.amax(dim=(-2, -1), keepdim=True))
    return torch.exp(logits - shift.detach()) / math.sqrt(w.shape[0])


def causal_favor(phi_q: torch.Tensor, log_k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor,
                 chunk: int) -> torch.Tensor:
    """Causal FAVOR+ where no key after a query reaches it, not even through the stabiliser.

    phi_q (b, h, tq, m) query features, log_k (b, h, tk, m) key feature logits (`feature_logits`),
    v (b, h, tk, d), keys (b, tk) bool; query i sits at key position tk - tq + i (a cache first).
    Key features are exp(log_k - s_i) with s_i the largest logit of the real keys at or before
    query i (a running max): it cancels in each query's ratio, as a shift over all keys would,
    but a shift over all keys let a later key with a larger logit push every earlier key's
    features towards 0, below the denominator's floor (EPS): earlier outputs changed with a later
    token, and cached decoding differed from the full forward. Chunked as linear's prefix sums:
    a (chunk x chunk) product inside a chunk, running (m x d) sums across chunks, each summed
    at its own end's shift and rescaled (by factors <= 1) to the query's. Float32 (`wide`)."""
    b, h, tq, m = phi_q.shape
    tk, d = log_k.shape[-2], v.shape[-1]
    seen = tk - tq
    log_k = log_k.masked_fill(~keys[:, None, :, None], float("-inf"))  # padded keys: features 0
    top = log_k.detach().amax(dim=-1).cummax(dim=-1).values  # (b, h, tk) running max
    # before a row's first real key (padding): that key's, so that the shift never decreases
    # along the row and every rescaling factor below is exp(<= 0); a row without any: 0
    first = torch.where(torch.isfinite(top), top, torch.full_like(top, float("inf"))).amin(dim=-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.where(torch.isfinite(first), first, torch.zeros_like(first)))
    scale = 1.0 / math.sqrt(m)
    psi = torch.exp(log_k - top[..., None]) * scale  # (b, h, tk, m): each key at its own shift, <= 1
    c = max(1, min(chunk, tq))
    nc = -(-tq // c)
    pad = nc * c - tq
    qc = F.pad(phi_q, (0, 0, 0, pad)).view(b, h, nc, c, m)
    kc = F.pad(psi[:, :, seen:], (0, 0, 0, pad)).view(b, h, nc, c, m)
    vc = F.pad(v[:, :, seen:], (0, 0, 0, pad)).view(b, h, nc, c, d)
    tc = F.pad(top[:, :, seen:], (0, pad), mode="replicate").view(b, h, nc, c)  # shift of each position
    # segments: the cache (0), then each chunk; each summed at the shift of its last key
    before = top[:, :, max(seen - 1, 0):max(seen, 1)]  # (b, h, 1): the cache's last shift (none: the first)
    ends = torch.cat([before, tc[..., -1]], dim=-1)  # (b, h, nc + 1)
    to_end = torch.exp(tc - tc[..., -1:])  # (b, h, nc, c): a key's shift to its chunk's end's
    seg_kv = torch.matmul((kc * to_end[..., None]).transpose(-1, -2), vc)  # (b, h, nc, m, d)
    seg_z = (kc * to_end[..., None]).sum(dim=-2)  # (b, h, nc, m)
    cache_kv = torch.matmul(psi[:, :, :seen].transpose(-1, -2) * torch.exp(top[:, :, :seen] - before)[:, :, None],
                            v[:, :, :seen])[:, :, None]  # (b, h, 1, m, d)
    cache_z = (psi[:, :, :seen] * torch.exp(top[:, :, :seen] - before)[..., None]).sum(dim=-2)[:, :, None]
    seg_kv, seg_z = torch.cat([cache_kv, seg_kv], dim=2), torch.cat([cache_z, seg_z], dim=2)
    # chunk k starts after segments 0..k, at the shift ends[k]; segment s reaches it by exp(ends[s] - ends[k])
    earlier = torch.ones(nc, nc + 1, dtype=torch.bool, device=v.device).tril()  # s <= k
    gap = (ends[..., None, :] - ends[..., :nc, None]).masked_fill(~earlier, float("-inf"))
    reach = torch.exp(gap)  # (b, h, nc, nc + 1), <= 1
    before_kv = torch.einsum("bhks,bhsmd->bhkmd", reach, seg_kv)  # (b, h, nc, m, d)
    before_z = torch.einsum("bhks,bhsm->bhkm", reach, seg_z)  # (b, h, nc, m)
    to_query = torch.exp(ends[..., :nc, None] - tc)[..., None]  # (b, h, nc, c, 1): chunk start -> query
    inside_ok = torch.ones(c, c, dtype=torch.bool, device=v.device).tril()
    rescale = torch.exp((tc[..., None, :] - tc[..., :, None]).masked_fill(~inside_ok, float("-inf")))
    inside = torch.matmul(qc, kc.transpose(-1, -2)) * rescale  # (b, h, nc, c, c): j <= i, at i's shift
    num = torch.matmul(qc, before_kv) * to_query + torch.matmul(inside, vc)  # (b, h, nc, c, d)
    den = torch.matmul(qc, before_z.unsqueeze(-1)) * to_query + inside.sum(dim=-1, keepdim=True)
    num, den = num.view(b, h, nc * c, d)[:, :, :tq], den.view(b, h, nc * c, 1)[:, :, :tq]
    return (num / den.clamp(min=EPS)).transpose(1, 2).contiguous()  # (b, tq, h, d)


@ATTENTION.register("performer")
@dataclass
class Performer(Attention):
    forms_scores = False
    compile_eager = "it draws its random features from a torch.Generator made in the forward (opaque to dynamo)"
    features: int = field(default=64, metadata={"min": 1, "max": MOST})
    redraw_every: int = field(default=100, metadata={"min": 0})  # optimizer steps; 0 = never
    # None: the run's train.seed (draw_seed); a number within train.seed's bounds (a larger one
    # overflowed torch.Generator.manual_seed at the first forward, a traceback)
    seed: int | None = field(default=None, metadata={"min": 0, "max": 2**32 - 1})
    chunk: int = field(default=64, metadata={"min": 1})

    def oversized(self, positions: int | None, width: int | None) -> str | None:
        """features at most the longest sequence the model reads: with m random features for n
        tokens FAVOR+ costs O(n m) against exact softmax's O(n^2), so m > n buys an estimate of
        softmax attention at more than its exact price."""
        if positions and self.features > positions:
            return (f"features: {self.features} is above {positions}, the longest sequence this model reads: "
                    "with more random features than tokens FAVOR+ costs more than the exact softmax "
                    f"attention it estimates; set features at most {positions}")
        return None

    def buffers(self) -> dict[str, torch.Tensor]:
        return {"draws": torch.zeros((), dtype=torch.long)}

    def prepare(self, model):
        model = super().prepare(model)
        counter = PREFIX + "draws"

        def count(top, args):
            """Once per optimizer step, at its first training pass (no gradient held yet: the loop
            zeroes them with set_to_none after each step), never for a recomputation (gradient
            checkpointing) or a later micro-batch of the step (train.grad_accum): counted per
            pass, 4 micro-batches redrew 4 times as often as one batch 4 times larger, and a
            redraw could fall inside a step (its gradient summed over two draws), exit 0. The
            layers are the called model's own, found at each pass: a deep copy of the model
            (whose hooks are copied by reference) counted into the original's layers."""
            if top.training and torch.is_grad_enabled() and all(p.grad is None for p in top.parameters()):
                for layer in top.modules():
                    if counter in layer._buffers:
                        layer._buffers[counter] += 1

        model._tk_pass_count = model.register_forward_pre_hook(count)
        return model

    def wrapped(self, model):
        """The pass counter's hook moves to the model the loop calls: a method's wrapper may call
        the body's `forward` directly, past the body's hooks (PEFT's AdaLoraModel does), and the
        counter never moved (redraw_every ignored, exit 0). Moved, not added: a wrapper that calls
        the body (LoRA's) would count each pass twice."""
        # its own attribute: PEFT's wrappers hand on an attribute they lack to the body's
        body = next((m for m in model.modules() if vars(m).get("_tk_pass_count") is not None), None)
        if body is None or body is model:
            return
        handle = body._tk_pass_count
        hook = body._forward_pre_hooks[handle.id]
        handle.remove()
        body._tk_pass_count = None
        model._tk_pass_count = model.register_forward_pre_hook(hook)

    def projection(self, module, d: int, device: torch.device) -> torch.Tensor:
        # the training step running now (the model's pre-hook counted it at its first pass), else
        # the last one that ran: evaluation scores the draw the model last trained with (the next
        # step's, taken at a multiple of redraw_every, was one no step had used)
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
            if is_causal(module):  # a shift over all keys would let later keys reach earlier queries
                dtype = v.dtype
                return causal_favor(phi_q, feature_logits(k * root, w), wide(v), keys, self.chunk).to(dtype), None
            phi_k = positive_features(k * root, w, keys)
        return kernel_attention(phi_q, phi_k, v, keys, False, self.chunk), None
