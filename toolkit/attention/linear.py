"""Linear attention (Katharopoulos et al. 2020): softmax(q k^T) replaced by phi(q) phi(k)^T with
phi = elu + 1, so that sum_j phi(k_j) v_j^T is formed once and memory is O(n) in the length.

Causal layers use prefix sums over chunks: inside a chunk of `chunk` tokens a small masked
(chunk x chunk) product, across chunks a running (features x d) state; nothing is n x n.
There are no attention weights, hence no attention dropout. Refused for T5 (see Attention).

The sums run in float32 whatever the inputs' dtype: numerator and denominator are unnormalised
sums over every key, which grow with the length (softmax attention never forms one); in fp16
(mixed_precision: fp16) they overflowed to inf at about 4k tokens and the output was NaN.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from toolkit.attention import ATTENTION, Attention, is_causal, key_keep
from toolkit.lazy import lazy

torch = lazy("torch", globals())
F = lazy("torch.nn.functional", globals())

EPS = 1e-6


def wide(x: torch.Tensor) -> torch.Tensor:
    """x in float32 where its dtype is narrower (bf16, fp16); as it is otherwise."""
    return x.float() if torch.finfo(x.dtype).bits < 32 else x


def kernel_attention(phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor,
                     causal: bool, chunk: int) -> torch.Tensor:
    """phi_q (b, h, tq, m), phi_k (b, h, tk, m), v (b, h, tk, d), keys (b, tk) bool -> (b, tq, h, d),
    summed in float32 (see the module's docstring) and returned in v's dtype."""
    dtype = v.dtype
    phi_q, phi_k, v = (wide(x) for x in (phi_q, phi_k, v))
    with torch.autocast(v.device.type, enabled=False):  # else its matmuls go back to bf16 / fp16
        return _kernel_sums(phi_q, phi_k, v, keys, causal, chunk).to(dtype)


def _kernel_sums(phi_q, phi_k, v, keys, causal, chunk):
    """kernel_attention's sums, in the inputs' dtype."""
    phi_k = phi_k * keys[:, None, :, None].to(phi_k.dtype)  # padded keys contribute nothing
    tq, tk = phi_q.shape[-2], phi_k.shape[-2]
    if not causal:
        kv = torch.matmul(phi_k.transpose(-1, -2), v)  # (b, h, m, d)
        num = torch.matmul(phi_q, kv)  # (b, h, tq, d)
        den = torch.matmul(phi_q, phi_k.sum(dim=-2).unsqueeze(-1))  # (b, h, tq, 1)
    else:
        seen = tk - tq  # keys before the first query (a cache): visible to every query
        state_kv = torch.matmul(phi_k[:, :, :seen].transpose(-1, -2), v[:, :, :seen])  # (b, h, m, d)
        state_z = phi_k[:, :, :seen].sum(dim=-2)  # (b, h, m)
        num, den = _causal_chunks(phi_q, phi_k[:, :, seen:], v[:, :, seen:], state_kv, state_z, chunk)
    return (num / den.clamp(min=EPS)).transpose(1, 2).contiguous()  # (b, tq, h, d)


def _causal_chunks(phi_q, phi_k, v, state_kv, state_z, chunk):
    """Numerator (b, h, n, d) and denominator (b, h, n, 1) of causal kernel attention."""
    b, h, n, m = phi_q.shape
    d = v.shape[-1]
    c = max(1, min(chunk, n))
    nc = -(-n // c)
    pad = nc * c - n
    qc, kc, vc = (F.pad(x, (0, 0, 0, pad)).view(b, h, nc, c, x.shape[-1]) for x in (phi_q, phi_k, v))
    chunk_kv = torch.matmul(kc.transpose(-1, -2), vc)  # (b, h, nc, m, d)
    chunk_z = kc.sum(dim=-2)  # (b, h, nc, m)
    # exclusive prefix: the sums of the chunks before, never (all - own): that subtraction left a
    # later key's rounding in an earlier query's output (1e-3 from a key of 1e4)
    before_kv = F.pad(chunk_kv.cumsum(dim=2)[:, :, :-1], (0, 0, 0, 0, 1, 0)) + state_kv[:, :, None]
    before_z = F.pad(chunk_z.cumsum(dim=2)[:, :, :-1], (0, 0, 1, 0)) + state_z[:, :, None]
    inside = torch.matmul(qc, kc.transpose(-1, -2)).tril()  # (b, h, nc, c, c): j <= i within a chunk
    num = torch.matmul(qc, before_kv) + torch.matmul(inside, vc)  # (b, h, nc, c, d)
    den = torch.matmul(qc, before_z.unsqueeze(-1)) + inside.sum(dim=-1, keepdim=True)  # (b, h, nc, c, 1)
    return num.view(b, h, nc * c, d)[:, :, :n], den.view(b, h, nc * c, 1)[:, :, :n]


@ATTENTION.register("linear")
@dataclass
class Linear(Attention):
    forms_scores = False
    chunk: int = field(default=64, metadata={"min": 1})  # causal prefix-sum chunk length

    def attend(self, module, q, k, v, pad, scaling, dropout, bias):
        keys = key_keep(pad, q.shape[0], k.shape[-2], q.device)
        out = kernel_attention(F.elu(q) + 1, F.elu(k) + 1, v, keys, is_causal(module), self.chunk)
        return out, None
