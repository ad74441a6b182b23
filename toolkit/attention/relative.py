"""Relative position representations (Shaw et al. 2018), clipped at distance k.

Each layer learns 2k+1 key and value vectors (shared by its heads, as in the paper), one per
clipped distance j - i. They start at zero, so the swapped model starts exactly where the
pretrained one is. Refused in cross-attention: source and target positions are not comparable.
With T5, Shaw's terms join T5's own relative bias (both are added to the same scores).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from toolkit.attention import ATTENTION, MOST, Attention, allowed, softmax_attention, token_positions
from toolkit.lazy import lazy

torch = lazy("torch", globals())


@ATTENTION.register("relative")
@dataclass
class Relative(Attention):
    query_masks = True  # every query its own keys: the full (q, kv) matrix is masked
    positional = True
    cross: bool = False
    k: int = field(default=16, metadata={"min": 1, "max": MOST - 1})  # clipping distance

    def oversized(self, positions: int | None, width: int | None) -> str | None:
        """k at most the farthest two of the model's positions can be apart: beyond it no
        distance occurs, and its 2k+1 table rows per layer are never read."""
        if positions and self.k > positions - 1:
            return (f"k: {self.k} is above {positions - 1}, the farthest apart two tokens of this model's "
                    f"{positions} positions can be: no distance reaches the clip, and each layer would hold "
                    f"{2 * self.k + 1} rows no token reads; set k at most {positions - 1}")
        return None

    def parameters(self, heads: int, dim: int) -> dict[str, torch.Tensor]:
        return {"key": torch.zeros(2 * self.k + 1, dim), "value": torch.zeros(2 * self.k + 1, dim)}

    def attend(self, module, q, k, v, pad, scaling, dropout, bias):
        b, h, tq, _ = q.shape
        tk = k.shape[-2]
        pos = token_positions(pad, b, tk, q.device)  # (b|1, tk): padding takes no position
        rel = pos[:, None, :] - pos[:, tk - tq:, None]  # (b|1, tq, tk): j - i (a cache comes first)
        index = (rel.clamp(-self.k, self.k) + self.k)[:, None].expand(b, h, tq, tk)
        scores = torch.matmul(q, k.transpose(-1, -2))  # (b, h, tq, tk)
        by_distance = torch.matmul(q, module.tk_attn_key.t())  # (b, h, tq, 2k+1)
        scores = (scores + by_distance.gather(-1, index)) * scaling
        keep = allowed(module, pad, tq, tk, q.device)
        out, weights = softmax_attention(module, scores, v, keep, dropout, bias)
        buckets = weights.new_zeros(b, h, tq, 2 * self.k + 1).scatter_add_(-1, index, weights)
        extra = torch.matmul(buckets, module.tk_attn_value)  # (b, h, tq, d)
        return out + extra.transpose(1, 2), weights  # (b, tq, h, d)
