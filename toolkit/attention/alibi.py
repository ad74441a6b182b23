"""ALiBi (Press et al. 2022): a per-head linear penalty -m_h |i - j| added to the scores.

Slopes are the paper's geometric sequence m_h = 2^(-8h/H) (for any H, not only powers of two),
times `scale`; scale 0 is plain dot-product attention. In causal layers future keys are masked,
so |i - j| is the paper's i - j. Learned absolute position embeddings (BERT, RoBERTa, GPT-2, BART)
are kept: the pretrained weights were trained with them and removing them would throw that away;
ALiBi then adds a recency bias on top. T5 has no absolute positions; ALiBi joins its relative bias.
Refused in cross-attention (positions of two sequences are not comparable).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from toolkit.attention import ATTENTION, Attention, allowed, softmax_attention, token_positions
from toolkit.lazy import lazy

torch = lazy("torch", globals())


def slopes(heads: int) -> torch.Tensor:
    return 2.0 ** (-8.0 * torch.arange(1, heads + 1) / heads)  # (h,)


@ATTENTION.register("alibi")
@dataclass
class Alibi(Attention):
    query_masks = True  # every query its own keys: the full (q, kv) matrix is masked
    positional = True
    cross: bool = False
    scale: float = field(default=1.0, metadata={"min": 0.0})

    def attend(self, module, q, k, v, pad, scaling, dropout, bias):
        b, h, tq, tk = q.shape[0], q.shape[1], q.shape[-2], k.shape[-2]
        pos = token_positions(pad, b, tk, q.device)  # (b|1, tk): padding takes no position
        distance = (pos[:, None, :] - pos[:, tk - tq:, None]).abs().to(q.dtype)  # (b|1, tq, tk)
        penalty = -self.scale * slopes(h).to(q)[:, None, None] * distance[:, None]  # (b|1, h, tq, tk)
        scores = torch.matmul(q, k.transpose(-1, -2)) * scaling + penalty  # (b, h, tq, tk)
        keep = allowed(module, pad, tq, tk, q.device)
        return softmax_attention(module, scores, v, keep, dropout, bias)
