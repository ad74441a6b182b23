"""Full fine-tuning: every parameter trains."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from toolkit.lazy import lazy
from toolkit.methods import METHODS, Context, Method, set_trainable

torch = lazy("torch", globals())


@METHODS.register("full")
@dataclass
class Full(Method):
    whole_model: ClassVar[bool] = True  # save_pretrained of the whole model: a chain can start from it

    def apply(self, model: torch.nn.Module, ctx: Context) -> torch.nn.Module:
        set_trainable(model, lambda _: True)
        return model
