"""Prefix tuning through PEFT (Li & Liang 2021): trainable key/value prefixes in every layer.

PEFT hands the prefixes to the model as a key/value cache (`past_key_values`), so the model must
consume a cache in the layers that read the input. The task head trains as `modules_to_save`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from toolkit.lazy import lazy
from toolkit.methods import METHODS, Context, Method, peft_task_type
from toolkit.methods.prompt_tuning import MLM_REFUSAL

torch = lazy("torch", globals())

SEQ_CLS_HEAD = "sequence-classification"


@METHODS.register("prefix_tuning")
@dataclass
class PrefixTuning(Method):
    name = "prefix_tuning"
    num_virtual_tokens: int = field(default=20, metadata={"min": 1})
    prefix_projection: bool = False  # True: prefixes come from an MLP (Li & Liang's reparameterisation)
    encoder_hidden_size: int | None = field(default=None, metadata={"min": 1})  # the MLP's width; None: the model's hidden size

    def incompatible(self, family: str | None, task: Any) -> str | None:
        if self.head(task) == "masked-lm":
            return MLM_REFUSAL.format(method=self.name)
        if self.head(task) == SEQ_CLS_HEAD and family in ("bart", "t5"):
            cls = "BartForSequenceClassification" if family == "bart" else "T5ForSequenceClassification"
            return (f"prefix_tuning needs a model whose encoder reads a key/value cache; {cls} passes "
                    "the cache to its decoder only, so the prefixed attention mask does not fit the "
                    "encoder; use lora, ia3 or bitfit")
        return None

    def apply(self, model: torch.nn.Module, ctx: Context) -> torch.nn.Module:
        from peft import PrefixTuningConfig, get_peft_model

        config = PrefixTuningConfig(
            task_type=peft_task_type(ctx), num_virtual_tokens=self.num_virtual_tokens,
            prefix_projection=self.prefix_projection, encoder_hidden_size=self.encoder_hidden_size,
            modules_to_save=list(ctx.head_names) or None,
        )
        return get_peft_model(model, config)
