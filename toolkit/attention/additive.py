"""Bahdanau's additive score v^T tanh(W_q q + W_k k) (Bahdanau et al. 2015), per layer and head.

It cannot start where the pretrained model is (no setting makes it a dot product); the comparison
report shows how far off it starts and how much fine-tuning recovers. Memory is O(tq * tk * dim)
per head, `dim` times dot's, which is why `dim` is small by default.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from toolkit.attention import ATTENTION, MOST, Attention, allowed, softmax_attention
from toolkit.lazy import lazy

torch = lazy("torch", globals())


@ATTENTION.register("additive")
@dataclass
class Additive(Attention):
    query_masks = True  # every query its own keys: the full (q, kv) matrix is masked
    dim: int = field(default=16, metadata={"min": 1, "max": MOST})  # width of the tanh layer

    def oversized(self, positions: int | None, width: int | None) -> str | None:
        """dim at most the model's width: Bahdanau's alignment layer is as wide as the model's
        hidden state, and its (query x key x dim) activations cost dim times dot's memory."""
        if width and self.dim > width:
            return (f"dim: {self.dim} is above this model's width ({width}): the tanh layer of Bahdanau's "
                    f"score is at most as wide as the model, and its (query x key x dim) activations cost "
                    f"dim times dot's memory; set dim at most {width}")
        return None

    def parameters(self, heads: int, dim: int) -> dict[str, torch.Tensor]:
        return {"wq": torch.randn(heads, dim, self.dim) / dim ** 0.5,  # (h, d, a)
                "wk": torch.randn(heads, dim, self.dim) / dim ** 0.5,  # (h, d, a)
                "v": torch.randn(heads, self.dim) / self.dim ** 0.5}  # (h, a)

    def attend(self, module, q, k, v, pad, scaling, dropout, bias):
        qa = torch.einsum("bhtd,hda->bhta", q, module.tk_attn_wq)  # (b, h, tq, a)
        ka = torch.einsum("bhsd,hda->bhsa", k, module.tk_attn_wk)  # (b, h, tk, a)
        hidden = torch.tanh(qa[:, :, :, None, :] + ka[:, :, None, :, :])  # (b, h, tq, tk, a)
        scores = torch.einsum("bhtsa,ha->bhts", hidden, module.tk_attn_v)  # (b, h, tq, tk)
        keep = allowed(module, pad, q.shape[-2], k.shape[-2], q.device)
        return softmax_attention(module, scores, v, keep, dropout, bias)
