"""BigBird's block-sparse attention (Zaheer et al. 2020): each query block sees its neighbouring
blocks, `global_blocks` leading blocks (which in turn see everything) and `random_blocks` blocks
drawn per layer and per head (as BigBird defines them, and transformers draws them: each layer
its own seed, each head its own blocks) from (`seed`, the layer's index, the sequence length),
so a batch and its replay see the same pattern.

No eval output depends on what shares a sentence's batch (no score may move with
train.eval_batch_size). So in evaluation the random blocks are left out, as transformers' BigBird
does (its random block mask is all zeros when not training): drawn over the padded length, they
changed with the longest sentence of the batch. And the block grid starts at each sequence's
first real token: a row with padding before real tokens (a decoder's left-padded prompts, a soft
prompt before them) is packed so that its padding comes last, attended in blocks, and put back
(`in_packed_rows`); otherwise its blocks and global tokens would move
with the padding its batch gave it.

Causal layers keep the pattern and mask future keys. A sequence of at most `global_blocks` + 2
blocks is plain softmax attention (each block outside the global ones sees its neighbours: all
of them); setup says so in one warning line where that covers the longest sequence a run feeds
(`dense_within`). With a cache (generation) each new query keeps exactly the keys the full
forward over the sequence so far gives it at its position (its neighbouring and global blocks,
counted from the row's first real token; a global query keeps all): cached decoding equals
decoding without a cache, and a model is scored with the attention it was trained with (the new
queries used to attend densely to every cached key). Cross-attention stays `dot`
unless `cross: true`, which is refused where a family has cross-attention (the pattern is over
positions of one sequence).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from toolkit.attention import (ATTENTION, Attention, allowed, is_causal, key_keep, softmax_attention,
                               token_positions)
from toolkit.attention._blocks import block_attention, in_packed_rows, neighbours
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
    # None: the run's train.seed (draw_seed); a number within train.seed's bounds (a larger one
    # overflowed torch.Generator.manual_seed at the first forward, a traceback)
    seed: int | None = field(default=None, metadata={"min": 0, "max": 2**32 - 1})

    def pattern(self, nb: int, heads: int = 1, layer: int = 0,
                training: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """Neighbours, global blocks and (training only: see the module's docstring) random ones:
        (heads, nb, K) key blocks of each query block, the random ones drawn per layer and per
        head as BigBird's (transformers' seeds each layer with its index and draws every head in
        turn), from (seed, layer, nb); (nb, K), shared by every head, without random blocks."""
        glob = torch.arange(min(self.global_blocks, nb)).expand(nb, -1)  # (nb, G)
        if not (training and self.random_blocks):
            return neighbours(nb, [-1, 0, 1], glob)
        g = torch.Generator().manual_seed(self.draw_seed() * 1_000_003 + layer * 10_007 + nb)
        drawn = torch.randint(0, nb, (heads, nb, self.random_blocks), generator=g)  # head by head
        return neighbours(nb, [-1, 0, 1], torch.cat([glob.expand(heads, -1, -1), drawn], dim=-1))

    def dense_within(self, length: int) -> tuple[str, str] | None:
        """Dense when every query block outside the global ones sees every key block without the
        random ones: at most global_blocks + 2 blocks."""
        if -(-length // self.block) > self.global_blocks + 2:
            return None
        most = (length - 1) // (self.global_blocks + 2)
        fix = (f"set model.attention.block at most {most} to make it sparse" if most >= 1
               else "sequences this short are dense at any block")
        return f"blocks of {self.block}, global_blocks {self.global_blocks}", fix

    def attend(self, module, q, k, v, pad, scaling, dropout, bias):
        if q.shape[-2] != k.shape[-2]:  # new queries against a cache
            return self._cached(module, q, k, v, pad, scaling, dropout, bias)
        tq = q.shape[-2]
        if self.dense_within(tq):  # softmax attention: one (tq, tk) product, dot's dropout draw
            scores = torch.matmul(q, k.transpose(-1, -2)) * scaling
            return softmax_attention(module, scores, v, allowed(module, pad, tq, tq, q.device), dropout, bias)[0], None
        out = in_packed_rows(lambda q, k, v, pad, bias: self._attend(module, q, k, v, pad, scaling, dropout, bias)[0],
                             q, k, v, pad, bias)
        return out, None  # (b, tq, h, d)

    def _cached(self, module, q, k, v, pad, scaling, dropout, bias):
        """The last tq of tk positions (a KV cache before them), as dense rows masked to the keys
        `_attend` gives those positions in one pass over all tk: the block grid counts each
        row's real tokens only (`token_positions`), as `in_packed_rows` does, and a padded key
        is masked anyway."""
        b, tq, tk, dev = q.shape[0], q.shape[-2], k.shape[-2], q.device
        pos = token_positions(pad, b, tk, dev)  # (b|1, tk)
        i = pos[:, tk - tq:]  # (b|1, tq) from the first real token
        j = pos % tk  # (b|1, tk); a padded key before the text: anywhere, it is masked
        nb = -(-tk // self.block)
        index, valid = self.pattern(nb, q.shape[1], getattr(module, "tk_index", 0), module.training)
        if index.ndim == 2:  # one pattern for every head
            index, valid = index[None], valid[None]  # (heads, nb, K) key blocks of each query block
        sees = ((index[..., None] == torch.arange(nb)) & valid[..., None]).any(dim=-2).to(dev)  # (heads, nb, nb)
        near = sees[:, (i // self.block)[:, :, None], (j // self.block)[:, None, :]].transpose(0, 1)  # (b|1, heads, tq, tk)
        keep = near | (i < self.global_blocks * self.block)[:, None, :, None]  # (b|1, heads, tq, tk)
        causal_and_pad = allowed(module, pad, tq, tk, dev)
        keep = keep if causal_and_pad is None else keep & causal_and_pad
        scores = torch.matmul(q, k.transpose(-1, -2)) * scaling
        return softmax_attention(module, scores, v, keep, dropout, bias)[0], None  # as _attend: no weights

    def _attend(self, module, q, k, v, pad, scaling, dropout, bias):
        causal = is_causal(module)
        b, h, tq, _ = q.shape
        tk = k.shape[-2]
        n_global = min(self.global_blocks * self.block, tq)
        if n_global >= tq:  # global rows cover everything: dense rows
            scores = torch.matmul(q, k.transpose(-1, -2)) * scaling
            return softmax_attention(module, scores, v, allowed(module, pad, tq, tk, q.device), dropout, bias)
        nb = -(-tq // self.block)
        index, valid = self.pattern(nb, h, getattr(module, "tk_index", 0), module.training)
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
