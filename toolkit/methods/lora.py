"""LoRA through PEFT (Hu et al. 2021); the task head trains alongside as `modules_to_save`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from toolkit.hf_tables import table
from toolkit.lazy import lazy
from toolkit.methods import METHODS, Context, Method, check_mergeable, check_ranks, keep_label_maps, peft_task_type, wrap_peft
from toolkit.methods import merged as methods_merged
from toolkit.schema import UNORDERED

torch = lazy("torch", globals())


@METHODS.register("lora")
@dataclass
class Lora(Method):
    r: int = field(default=8, metadata={"min": 1})
    alpha: int = field(default=16, metadata={"min": 1})
    dropout: float = field(default=0.0, metadata={"min": 0.0, "below": 1.0})  # 1: the adapters see zeros, never train
    target_modules: list[str] | None = field(default=None, metadata={"min_items": 1, UNORDERED: True})  # None: PEFT's default for the family (query/value)
    bias: Literal["none", "all", "lora_only"] = "none"
    merge: bool = False  # save the weights merged into the base: a plain transformers folder
    use_dora: ClassVar[bool] = False  # methods/dora.py: the same settings, PEFT's DoRA
    transformers_loads: ClassVar[bool] = True

    def incompatible(self, family: str | None, task: Any) -> str | None:
        return no_default_targets(self.target_modules, family, "LORA")

    def sizes(self) -> dict[str, int]:
        return {"method.r": self.r}

    def apply(self, model: torch.nn.Module, ctx: Context) -> torch.nn.Module:
        from peft import LoraConfig

        config = LoraConfig(
            task_type=peft_task_type(ctx), r=self.r, lora_alpha=self.alpha,
            lora_dropout=self.dropout, target_modules=self.target_modules, bias=self.bias,
            modules_to_save=list(ctx.head_names) or None, use_dora=self.use_dora,
        )
        wrapped = wrap_peft(model, config)
        check_ranks(self, wrapped, ctx)
        if self.merge:  # before training: the save would refuse it after the whole run
            check_mergeable(wrapped, "method.merge")
        return wrapped

    def saves_model(self) -> bool:
        return self.merge  # merged: a plain transformers folder; else the adapter alone

    def save(self, model: torch.nn.Module, path: Path) -> None:
        """merge: W + BA folded into the base weights (PEFT's merge_and_unload), so the result
        loads without PEFT and can be a later run's checkpoint (continued pretraining)."""
        if not self.merge:
            return super().save(model, path)
        save_merged(model, Path(path))


def save_merged(model: torch.nn.Module, path: Path) -> None:
    """A PEFT model's deltas folded into its base weights (PEFT's merge_and_unload) and saved."""
    merged = methods_merged(model, "method.merge")
    merged.save_pretrained(path)
    keep_label_maps(merged.config, path)


def no_default_targets(target_modules: list[str] | None, family: str | None, peft_type: str) -> str | None:
    """Why PEFT cannot pick the target modules itself: none given and none in PEFT's table of
    defaults for this method (`TRANSFORMERS_MODELS_TO_{peft_type}_TARGET_MODULES_MAPPING`, one per
    method: AdaLoRA's lacks families LoRA's has, XLM-RoBERTa and ELECTRA among them). Checked
    against LoRA's table, an AdaLoRA run on those passed validate and stopped after loading the
    model and the data, saying `method.target_modules: []` matched no layer."""
    defaults = table("peft.utils.constants", f"TRANSFORMERS_MODELS_TO_{peft_type}_TARGET_MODULES_MAPPING")
    if target_modules is None and family not in defaults:
        name = {"LORA": "LoRA", "ADALORA": "AdaLoRA"}.get(peft_type, peft_type)
        return (f"PEFT has no default {name} target modules for {family}; set "
                "method.target_modules to its attention projections' names")
    return None
