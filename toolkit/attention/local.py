"""Local attention: each token attends to the `window` tokens on either side of it (causal
layers: the `window` tokens before it), computed in blocks of `window` tokens so that time and
memory grow as n * 3 * window rather than n^2.

A window covering the sequence is plain softmax attention; setup says so in one warning line
where it covers the longest sequence a run feeds (`dense_within`). `causal: true` also hides the right
context in bidirectional layers; it is refused on families with an encoder, whose pretrained
layers were trained to use both sides. Cross-attention stays `dot` (positions of two sequences are
not comparable); `cross: true` is refused where a family has cross-attention.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from toolkit.attention import (ATTENTION, ENCODERS, Attention, is_causal, key_keep, softmax_attention,
                               token_positions)
from toolkit.attention._blocks import block_attention, in_packed_rows, neighbours
from toolkit.lazy import lazy

torch = lazy("torch", globals())


@ATTENTION.register("local")
@dataclass
class Local(Attention):
    positional = True
    cross: bool = False
    window: int = field(default=64, metadata={"min": 1})
    causal: bool = False  # hide the right context in bidirectional layers too

    def incompatible(self, family: str | None) -> str | None:
        if self.causal and family in ENCODERS:
            return (f"a causal window in {family}'s bidirectional encoder hides the right context "
                    "its pretrained layers were trained to use; leave causal false (decoder "
                    "layers are causal already)")
        return super().incompatible(family)

    def dense_within(self, length: int) -> tuple[str, str] | None:
        if self.window < length - 1:  # tokens length - 1 apart are the farthest pair
            return None
        fix = (f"set model.attention.window below {length - 1} to make it local" if length > 2
               else "sequences this short are dense at any window")
        return f"window {self.window}", fix

    def rule(self, causal: bool):
        w = self.window
        if causal:
            return lambda i, j: (j <= i) & (i - j <= w)
        return lambda i, j: (i - j).abs() <= w

    def attend(self, module, q, k, v, pad, scaling, dropout, bias):
        causal = is_causal(module) or (self.causal and not getattr(module, "tk_cross", False))
        tq, tk = q.shape[-2], k.shape[-2]
        # generation with a cache (few queries: a dense masked product is cheap), or a window that
        # covers the row (softmax attention: one (tq, tk) product, with the dropout draw of eager's
        # and dot's; the blocks drew theirs over three blocks' copies, another mask under one seed)
        if tq != tk or self.dense_within(tq):
            pos = token_positions(pad, q.shape[0], tk, q.device)  # (b|1, tk): padding takes none
            near = self.rule(causal)(pos[:, tk - tq:, None], pos[:, None, :])  # (b|1, tq, tk)
            keep = near[:, None] if pad is None else pad & near[:, None]
            scores = torch.matmul(q, k.transpose(-1, -2)) * scaling
            return softmax_attention(module, scores, v, keep, dropout, bias)
        block = max(1, min(self.window, tq))
        nb = -(-tq // block)
        index, valid = neighbours(nb, [-1, 0] if causal else [-1, 0, 1])

        def windows(q, k, v, pad, bias):  # rows with their padding after the text
            keys = key_keep(pad, q.shape[0], tk, q.device)
            out = block_attention(q, k, v, keys, scaling, block, index, valid, self.rule(causal), bias,
                                  dropout, module.training)
            return out.transpose(1, 2)  # (b, tq, h, d)

        return in_packed_rows(windows, q, k, v, pad, bias).contiguous(), None
