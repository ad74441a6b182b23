"""LoRA through PEFT (Hu et al. 2021); the task head trains alongside as `modules_to_save`."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from peft import LoraConfig, TaskType, get_peft_model

from toolkit.methods import METHODS, Context, Method


@METHODS.register("lora")
@dataclass
class Lora(Method):
    name = "lora"
    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: list[str] | None = None  # None: PEFT's default for the family (query/value)
    bias: str = "none"

    def incompatible(self, family, task) -> str | None:
        if self.r < 1:
            return f"method.r must be at least 1, got {self.r}"
        if self.bias not in ("none", "all", "lora_only"):
            return f"method.bias must be none, all or lora_only, got '{self.bias}'"
        return None

    def apply(self, model: torch.nn.Module, ctx: Context) -> torch.nn.Module:
        config = LoraConfig(
            task_type=TaskType[ctx.peft_task_type], r=self.r, lora_alpha=self.alpha,
            lora_dropout=self.dropout, target_modules=self.target_modules, bias=self.bias,
            modules_to_save=list(ctx.head_names) or None,
        )
        return get_peft_model(model, config)
