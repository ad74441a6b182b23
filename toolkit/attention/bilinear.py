"""Luong's general score q^T W k (Luong et al. 2015), one W per layer and head.

W starts as the identity, so the swapped model starts exactly where the pretrained one is and
fine-tuning learns how far from plain dot-product scoring to move. It is kept out of weight
decay, which would pull it to 0 (every score to 0: uniform attention) whatever the data.
"""

from __future__ import annotations

from dataclasses import dataclass

from toolkit.attention import ATTENTION, Attention, allowed, softmax_attention
from toolkit.lazy import lazy

torch = lazy("torch", globals())


@ATTENTION.register("bilinear")
@dataclass
class Bilinear(Attention):
    query_masks = True  # every query its own keys: the full (q, kv) matrix is masked
    not_decayed = ("w",)  # starts at the identity: weight decay would pull the scores to 0

    def parameters(self, heads: int, dim: int) -> dict[str, torch.Tensor]:
        return {"w": torch.eye(dim).repeat(heads, 1, 1)}  # (h, d, d)

    def attend(self, module, q, k, v, pad, scaling, dropout, bias):
        qw = torch.einsum("bhtd,hde->bhte", q, module.tk_attn_w)  # (b, h, tq, d)
        scores = torch.matmul(qw, k.transpose(-1, -2)) * scaling  # (b, h, tq, tk)
        keep = allowed(module, pad, q.shape[-2], k.shape[-2], q.device)
        return softmax_attention(module, scores, v, keep, dropout, bias)
