"""Sparsemax in place of softmax (Martins and Astudillo 2016): the Euclidean projection of the
scores onto the simplex, so that unlikely keys get exactly zero weight.

Masked keys are set to a large negative number before the projection; they fall outside the
support and get exact zeros like every other key below the threshold.

The projection runs in float32 whatever the scores' dtype (bf16 weights, mixed precision): its
support test compares 1 + k z_(k) with a cumulative sum, and in bf16 (8 significant bits) that
sum drifts past the test, so masked (future, padded) keys entered the support and causal outputs
were off by orders of magnitude; in fp16 the clamp below overflowed. Softmax is upcast by
autocast for the same reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from toolkit.attention import ATTENTION, Attention, allowed, softmax_attention
from toolkit.lazy import lazy

torch = lazy("torch", globals())


def sparsemax(scores: torch.Tensor) -> torch.Tensor:
    """Along the last dim: max(z - tau, 0) with tau chosen so that the row sums to 1; computed in
    float32 (or float64) and returned in the scores' dtype."""
    dtype = scores.dtype
    scores = scores.float() if torch.finfo(dtype).bits < 32 else scores
    z = scores - scores.amax(dim=-1, keepdim=True)  # shift: tau is shift-equivariant
    z = z.clamp(min=-1e6)  # masked entries (dtype min) stay finite through the cumulative sum
    ranked, _ = torch.sort(z, dim=-1, descending=True)
    ks = torch.arange(1, z.shape[-1] + 1, device=z.device, dtype=z.dtype)
    cumulative = ranked.cumsum(dim=-1)
    support = (1 + ks * ranked) > cumulative  # (..., tk): a prefix of the ranking
    size = support.sum(dim=-1, keepdim=True)  # >= 1: the largest score is always in
    tau = (cumulative.gather(-1, size - 1) - 1) / size.to(z.dtype)
    return torch.clamp(z - tau, min=0).to(dtype)


@ATTENTION.register("sparsemax")
@dataclass
class Sparsemax(Attention):
    query_masks = True  # every query its own keys: the full (q, kv) matrix is masked

    def attend(self, module, q, k, v, pad, scaling, dropout, bias):
        scores = torch.matmul(q, k.transpose(-1, -2)) * scaling  # (b, h, tq, tk)
        keep = allowed(module, pad, q.shape[-2], k.shape[-2], q.device)
        return softmax_attention(module, scores, v, keep, dropout, bias, normalize=sparsemax)
