"""BigBird's block-sparse attention (Zaheer et al. 2020): each query block sees its neighbouring
blocks, `global_blocks` leading blocks (which in turn see everything) and `random_blocks` blocks
drawn once per sequence length from `seed`, so a batch and its replay see the same pattern.

Causal layers keep the pattern and mask future keys. A block covering the sequence is plain
softmax attention. With a cache (generation) the new queries attend densely to every cached key:
the pattern is defined over a whole sequence, not a growing one. Cross-attention stays `dot` unless `cross: true`, which is refused where a
family has cross-attention (the pattern is over positions of one sequence).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from toolkit.attention import ATTENTION, Attention, allowed, is_causal, key_keep, softmax_attention
from toolkit.attention._blocks import block_attention, neighbours
from toolkit.lazy import lazy

torch = lazy("torch", globals())


@ATTENTION.register("bigbird")
@dataclass
class BigBird(Attention):
    positional = True
    cross: bool = False
    block: int = field(default=64, metadata={"min": 1})
    global_blocks: int = field(default=1, metadata={"min": 0})
    random_blocks: int = field(default=2, metadata={"min": 0})
    seed: int | None = None  # None: the run's train.seed (draw_seed)

    def pattern(self, nb: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.draw_seed() * 7919 + nb)
        extra = [torch.arange(min(self.global_blocks, nb)).expand(nb, -1),
                 torch.randint(0, nb, (nb, self.random_blocks), generator=g)]
        return neighbours(nb, [-1, 0, 1], torch.cat(extra, dim=1))

    def attend(self, module, q, k, v, pad, scaling, dropout, bias):
        causal = is_causal(module)
        b, h, tq, _ = q.shape
        tk = k.shape[-2]
        n_global = min(self.global_blocks * self.block, tq)
        if tq != tk or n_global >= tq:  # a cache, or global rows cover everything: dense rows
            scores = torch.matmul(q, k.transpose(-1, -2)) * scaling
            return softmax_attention(module, scores, v, allowed(module, pad, tq, tk, q.device), dropout, bias)
        nb = -(-tq // self.block)
        index, valid = self.pattern(nb)
        rule = (lambda i, j: j <= i) if causal else (lambda i, j: torch.ones_like(i - j, dtype=torch.bool))
        keys = key_keep(pad, b, tk, q.device)
        out = block_attention(q, k, v, keys, scaling, self.block, index, valid, rule, bias, dropout,
                              module.training)  # (b, h, tq, d)
        if n_global:  # global query rows attend to every key
            scores = torch.matmul(q[:, :, :n_global], k.transpose(-1, -2)) * scaling  # (b, h, g, tk)
            keep = allowed(module, pad, tq, tk, q.device)
            keep = None if keep is None else keep[..., :n_global, :] if keep.shape[-2] > 1 else keep
            top, _ = softmax_attention(module, scores, v, keep, dropout,
                                       None if bias is None else bias[..., :n_global, :])
            out = torch.cat([top.transpose(1, 2), out[:, :, n_global:]], dim=2)
        return out.transpose(1, 2).contiguous(), None  # (b, tq, h, d)
