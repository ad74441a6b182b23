"""The bottleneck adapter module (see adapters.py), apart because it subclasses torch's nn.Module:
importing it imports torch, which `toolkit validate` does not need for the adapters' settings."""

from __future__ import annotations

import torch
from torch import nn

ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "gelu": nn.GELU, "swish": nn.SiLU,
                                           "silu": nn.SiLU, "tanh": nn.Tanh}


class Bottleneck(nn.Module):
    """h + up(act(down(h))); `up` starts at zero so the adapter starts as the identity.

    `down` keeps nn.Linear's weight init but a zero bias: with a random negative bias a ReLU
    unit can be off for every token, and while `up` is zero such an adapter gets no gradient
    at all and never wakes (a real risk at small bottlenecks).
    """

    def __init__(self, width: int, size: int, activation: str) -> None:
        super().__init__()
        self.down = nn.Linear(width, size)
        self.act = ACTIVATIONS[activation]()
        self.up = nn.Linear(size, width)
        nn.init.zeros_(self.down.bias)
        nn.init.zeros_(self.up.weight)
        nn.init.zeros_(self.up.bias)

    def delta(self, hidden: torch.Tensor) -> torch.Tensor:
        """up(act(down(h))): what the adapter adds."""
        return self.up(self.act(self.down(hidden)))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden + self.delta(hidden)
