"""BitFit (Ben Zaken et al. 2021): only the bias terms of the body and the task head train.

No PEFT is needed: it is a choice of which parameters have requires_grad. The result is saved as
a full model (`save_pretrained`), so plain `AutoModelFor...from_pretrained` reloads it with no
toolkit code; the biases alone would be smaller but would need a custom loader.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from toolkit.lazy import lazy
from toolkit.methods import METHODS, Context, Method, is_head, set_trainable
from toolkit.methods.freeze import LM_HEADS

torch = lazy("torch", globals())


def is_bias(name: str) -> bool:
    """Linear, convolution and layer-norm biases alike (the paper trains all of them)."""
    return name == "bias" or name.endswith(".bias")


@METHODS.register("bitfit")
@dataclass
class BitFit(Method):
    whole_model: ClassVar[bool] = True  # save_pretrained of the whole model: a chain can start from it

    def incompatible(self, family: str | None, task: Any) -> str | None:
        if family == "t5":
            other = "lora or ia3" if self.head(task, family) in LM_HEADS else "method freeze for that, or lora/ia3"
            return ("bitfit trains bias terms and T5 has none (its linear and layer-norm layers are "
                    f"bias-free), so only the head would train; use {other}")
        return None

    def apply(self, model: torch.nn.Module, ctx: Context) -> torch.nn.Module:
        set_trainable(model, lambda n: is_bias(n) or is_head(n, ctx.head_names))
        return model
