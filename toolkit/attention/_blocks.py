"""Block-sparse softmax attention shared by `local` and `bigbird`.

The sequence is cut into blocks of `block` tokens; query block i attends to the key blocks listed
in row i of `index` (nb, K), so scores are (nb, block, K * block) instead of (n, n): memory and
time grow with n * K * block, linearly in n for a fixed pattern.
"""

from __future__ import annotations

from typing import Callable

from toolkit.attention import min_value
from toolkit.lazy import lazy

torch = lazy("torch", globals())
F = lazy("torch.nn.functional", globals())

Rule = Callable[["torch.Tensor", "torch.Tensor"], "torch.Tensor"]  # (query pos, key pos) -> may attend


def neighbours(nb: int, offsets: list[int], extra: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(nb, K) key-block indices (clamped into range) and whether each is real and not a repeat;
    (H, nb, K) where `extra` (H, nb, E) gives each of H heads its own extra blocks."""
    rows = torch.arange(nb)[:, None]
    index = rows + torch.tensor(offsets)[None, :]  # (nb, len(offsets))
    if extra is not None:
        index = torch.cat([index.expand(*extra.shape[:-1], -1), extra], dim=-1)  # (..., nb, K)
    valid = (index >= 0) & (index < nb)
    index = index.clamp(0, nb - 1)
    same = index[..., :, None] == index[..., None, :]  # (..., nb, K, K)
    earlier = torch.ones(same.shape[-2:], dtype=torch.bool).tril(-1)
    repeat = (same & earlier & valid[..., None, :]).any(dim=-1)  # a valid copy came before
    return index, valid & ~repeat


def block_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor,
                    scaling: float, block: int, index: torch.Tensor, valid: torch.Tensor, rule: Rule,
                    bias: torch.Tensor | None, dropout: float, training: bool) -> torch.Tensor:
    """q, k, v (b, h, n, d) of one sequence (self-attention), keys (b, n) -> (b, h, n, d); `index`
    and `valid` are (nb, K), one pattern for every head, or (h, nb, K), one per head."""
    b, h, n, d = q.shape
    if index.ndim == 2:
        index, valid = index[None], valid[None]
    heads, nb, dev = index.shape[0], index.shape[1], q.device  # heads: 1 or h
    pad = nb * block - n
    index, valid = index.to(dev), valid.to(dev)
    qb, kb, vb = (F.pad(x, (0, 0, 0, pad)).view(b, h, nb, block, d) for x in (q, k, v))
    if heads == 1:
        kg, vg = kb[:, :, index[0]], vb[:, :, index[0]]  # (b, h, nb, K, block, d)
    else:
        own = torch.arange(h, device=dev)[:, None, None]  # each head its own blocks
        kg, vg = kb[:, own, index], vb[:, own, index]
    kg, vg = kg.flatten(3, 4), vg.flatten(3, 4)  # (b, h, nb, K * block, d)
    scores = torch.matmul(qb, kg.transpose(-1, -2)) * scaling  # (b, h, nb, block, K * block)
    qpos = torch.arange(nb * block, device=dev).view(nb, block)  # (nb, block)
    kpos = (index[..., None] * block + torch.arange(block, device=dev)).flatten(2)  # (heads, nb, K * block)
    ok = valid.repeat_interleave(block, dim=2) & (kpos < n)  # (heads, nb, K * block)
    ok = ok[:, :, None, :] & rule(qpos[None, :, :, None], kpos[:, :, None, :])  # (heads, nb, block, K * block)
    real = F.pad(keys, (0, pad))[:, kpos]  # (b, heads, nb, K * block)
    ok = ok[None] & real[:, :, :, None, :]  # (b, heads, nb, block, K * block)
    if bias is not None:  # T5: gather its dense (tq, tk) bias at the same positions
        padded = F.pad(bias, (0, pad, 0, pad))
        if heads == 1:
            scores = scores + padded[:, :, qpos[:, :, None], kpos[0][:, None, :]]
        else:
            own = torch.arange(h, device=dev)[:, None, None, None]
            padded = padded.expand(-1, h, -1, -1)
            scores = scores + padded[:, own, qpos[None, :, :, None], kpos[:, :, None, :]]
    scores = scores.masked_fill(~ok, min_value(scores))
    weights = F.dropout(torch.softmax(scores, dim=-1), p=dropout, training=training)
    out = torch.matmul(weights, vg)  # (b, h, nb, block, d)
    return out.view(b, h, nb * block, d)[:, :, :n]


def packing(pad: torch.Tensor | None, b: int) -> torch.Tensor | None:
    """(b, tk) for each row the order that brings its real keys first, in their order, and its
    padding after them; None where no row has a padded key before a real one (the usual right
    padding: nothing to move). Left padding is a roll; a soft prompt before a left-padded prompt
    (generation from embeddings) leaves a gap inside the row, which packing closes."""
    if pad is None:
        return None
    keys = pad.any(dim=-2)[:, 0, :].expand(b, -1)  # (b, tk)
    later_real = keys.flip(-1).cummax(dim=-1).values.flip(-1)  # a real key at or after j
    if not torch.compiler.is_compiling() and not bool((later_real & ~keys).any()):  # a host read
        return None
    return torch.sort((~keys).int(), dim=-1, stable=True).indices


def take(x: torch.Tensor, order: torch.Tensor, dim: int) -> torch.Tensor:
    """x (b, ...) with each row's positions along `dim` taken in its own `order` (b, n)."""
    shape = [x.shape[0]] + [1] * (x.ndim - 1)
    shape[dim] = x.shape[dim]
    return x.gather(dim, order.view(shape).expand(x.shape))


def in_packed_rows(attend, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pad: torch.Tensor | None,
                   bias: torch.Tensor | None) -> torch.Tensor:
    """attend(q, k, v, pad, bias) -> (b, n, h, d) run on self-attention rows whose padding is moved
    after their text (`packing`), and its output moved back: a block grid and a window then count
    positions from each row's first real token and skip padding inside the row, so no output
    depends on the padding a batch gave the row."""
    b = q.shape[0]
    order = packing(pad, b)
    if order is None:
        return attend(q, k, v, pad, bias)
    pad = take(pad.expand(b, *pad.shape[1:]), order, 3)  # (b, 1, tq|1, tk)
    if pad.shape[2] > 1:  # a custom (tq, tk) mask: its query rows move too
        pad = take(pad, order, 2)
    if bias is not None:  # T5's (tq, tk) bias: both positions move
        bias = take(take(bias.expand(b, *bias.shape[1:]), order, 2), order, 3)
    out = attend(*(take(x, order, 2) for x in (q, k, v)), pad, bias)
    return take(out, order.argsort(dim=-1), 1)  # (b, n, h, d), each row's padding back in place
