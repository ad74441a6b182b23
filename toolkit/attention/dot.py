"""Scaled dot-product attention written out: the reference every other module is compared with.

It equals transformers' eager and sdpa within float rounding (tests/test_attention.py), so a
difference between `dot` and another module is the other module's doing, not the plumbing's.
"""

from __future__ import annotations

from dataclasses import dataclass

from toolkit.attention import ATTENTION, Attention, allowed, softmax_attention
from toolkit.lazy import lazy

torch = lazy("torch", globals())


@ATTENTION.register("dot")
@dataclass
class Dot(Attention):
    query_masks = True  # every query its own keys: the full (q, kv) matrix is masked

    def attend(self, module, q, k, v, pad, scaling, dropout, bias):
        scores = torch.matmul(q * scaling, k.transpose(-1, -2))  # (b, h, tq, tk); scaling q is O(n)
        keep = allowed(module, pad, q.shape[-2], k.shape[-2], q.device)
        return softmax_attention(module, scores, v, keep, dropout, bias)
