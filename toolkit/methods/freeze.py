"""A frozen-body probe: only the task head trains (the linear-probe baseline)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from toolkit.lazy import lazy
from toolkit.methods import METHODS, Context, Method, is_head, set_trainable

torch = lazy("torch", globals())


@METHODS.register("freeze")
@dataclass
class Freeze(Method):

    def incompatible(self, family: str | None, task: Any) -> str | None:
        if self.head(task, family) in ("causal-lm", "seq2seq-lm"):
            return ("freeze trains the task head only, and a language-model head is the input "
                    "embedding matrix (tied), so nothing would train; use lora, ia3 or bitfit")
        return None

    def apply(self, model: torch.nn.Module, ctx: Context) -> torch.nn.Module:
        set_trainable(model, lambda n: is_head(n, ctx.head_names))
        return model
