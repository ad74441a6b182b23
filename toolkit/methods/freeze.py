"""A frozen-body probe: only the task head trains (the linear-probe baseline)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from toolkit.lazy import lazy
from toolkit.methods import METHODS, Context, Method, instead, is_head, set_trainable

torch = lazy("torch", globals())

# heads with no task head module (models.HEAD_MODULES) to train: their output layer is tied to the
# input embeddings (masked LM too: BERT's and RoBERTa's decoders are), so freeze would train nothing
# and the run stopped only after loading the model and the data
LM_HEADS = ("causal-lm", "seq2seq-lm", "masked-lm")
INSTEAD = ("lora", "ia3", "bitfit")  # methods that train the body, asked by `methods.instead`


@METHODS.register("freeze")
@dataclass
class Freeze(Method):
    whole_model: ClassVar[bool] = True  # save_pretrained of the whole model: a chain can start from it

    def incompatible(self, family: str | None, task: Any) -> str | None:
        if self.head(task, family) in LM_HEADS:
            return ("freeze trains the task head only, and a language model's head is its input "
                    f"embedding matrix (tied), so nothing would train; {instead(family, task, INSTEAD)}")
        return None

    def apply(self, model: torch.nn.Module, ctx: Context) -> torch.nn.Module:
        set_trainable(model, lambda n: is_head(n, ctx.head_names))
        return model
