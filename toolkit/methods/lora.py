"""LoRA through PEFT (Hu et al. 2021); the task head trains alongside as `modules_to_save`."""

from __future__ import annotations

import re

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from toolkit.errors import UserError
from toolkit.hf_tables import table
from toolkit.lazy import lazy
from toolkit.methods import METHODS, Context, Method, check_mergeable, check_ranks, is_head, keep_label_maps, peft_task_type, wrap_peft
from toolkit.methods.bitfit import BIAS_FREE, has_bias
from toolkit.methods import merged as methods_merged
from toolkit.schema import UNORDERED, added

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
    # PEFT's per-layer r and alpha: a layer's name or the end of it (PEFT reads each key as a regular
    # expression ending at a dot) -> its own value; the layers no key names take r and alpha
    rank_pattern: dict[str, int] = added(default_factory=dict, neutral={}, min=1)
    alpha_pattern: dict[str, int] = added(default_factory=dict, neutral={}, min=1)
    use_dora: ClassVar[bool] = False  # methods/dora.py: the same settings, PEFT's DoRA
    lifted_by: ClassVar[dict[str, Any]] = {"target_modules": ["query"]}  # no PEFT default for the family
    transformers_loads: ClassVar[bool] = True

    def incompatible(self, family: str | None, task: Any) -> str | None:
        return self.refusal(family, biased=False)

    def incompatible_checkpoint(self, family: str | None, task: Any, config: dict) -> str | None:
        """The family's refusal of `bias` lifted where the checkpoint's config turns biases on."""
        return self.refusal(family, biased=has_bias(config))

    def refusal(self, family: str | None, biased: bool) -> str | None:
        """Why this method cannot run on this family (`biased`: the checkpoint turns biases on).
        `bias` other than none on a family without bias terms (T5, Llama, ... `bitfit.BIAS_FREE`)
        is refused: PEFT makes the bias terms it finds trainable and says nothing where there are
        none, so `bias: all` on T5 trained what `bias: none` trains, exit 0, under another run id
        and a recipe saying otherwise."""
        for setting in ("rank_pattern", "alpha_pattern"):
            for key in getattr(self, setting):
                try:
                    re.compile(key)
                except re.error as exc:
                    raise UserError(f"method.{setting}: key {key!r} is not a regular expression PEFT can read "
                                    f"({exc}); give a layer's name or the end of it") from None
        if self.bias != "none" and family in BIAS_FREE and not biased:
            return (f"method.bias: {self.bias} trains bias terms and {family} has none (its linear and norm "
                    "layers are bias-free), so it would train as bias: none; set method.bias: none")
        return no_default_targets(self.target_modules, family, "LORA")

    def sizes(self) -> dict[str, int]:
        return {"method.r": self.r, **{f"method.rank_pattern.{k}": v for k, v in self.rank_pattern.items()}}

    def layer_sizes(self, layer: str) -> dict[str, int]:
        """The rank of `layer`: its rank_pattern entry's, else r."""
        key = pattern_key(self.rank_pattern, layer)
        return {f"method.rank_pattern.{key}": self.rank_pattern[key]} if key is not None else {"method.r": self.r}

    def apply(self, model: torch.nn.Module, ctx: Context) -> torch.nn.Module:
        from peft import LoraConfig

        config = LoraConfig(
            task_type=peft_task_type(ctx), r=self.r, lora_alpha=self.alpha,
            lora_dropout=self.dropout, target_modules=self.target_modules, bias=self.bias,
            modules_to_save=list(ctx.head_names) or None, use_dora=self.use_dora,
            rank_pattern=dict(self.rank_pattern), alpha_pattern=dict(self.alpha_pattern),
        )
        wrapped = wrap_peft(model, config)
        check_biases(self.bias, wrapped, ctx.head_names)
        check_patterns(self, wrapped.targeted_module_names, ctx.sized)
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


def check_biases(bias: str, wrapped: torch.nn.Module, heads: list[str]) -> None:
    """Refuse `bias` all or lora_only where PEFT found no bias term to train (a body without biases,
    adapted layers without biases): the run would be bias: none under another name, exit 0. The
    head's biases train whatever `bias` says (`modules_to_save`), so they are not counted."""
    if bias == "none":
        return
    base = wrapped.get_base_model()
    trained = [n for n, p in base.named_parameters() if p.requires_grad and n.rsplit(".", 1)[-1] == "bias"
               and not is_head(n, heads) and ".modules_to_save." not in f".{n}." and "lora_" not in n]
    if trained:
        return
    where = "outside its head" if bias == "all" else "in the layers the method adapts"
    body = any(n.rsplit(".", 1)[-1] == "bias" and not is_head(n, heads) for n, _ in base.named_parameters())
    fix = "set method.bias: none" + (", or all to train the body's biases" if bias != "all" and body else "")
    raise UserError(f"method.bias: {bias} trains bias terms and this {base.config.model_type} model has none {where}, "
                    f"so it would train as bias: none; {fix}")


def pattern_key(pattern: dict[str, int], layer: str) -> str | None:
    """The key of `pattern` that names `layer` (a module name of the base model), as PEFT matches
    one (`peft.utils.other.get_pattern_key`: the key, a regular expression, ends the name at a
    dot boundary), or None."""
    for key in pattern:
        if re.match(rf"(.*\.)?({key})$", layer):
            return key
    return None


def check_patterns(method: Lora, targeted: list[str], sized: bool = True) -> None:
    """Every key of rank_pattern and alpha_pattern names an adapted layer, and no layer is named by
    two keys. PEFT gives a key that names no adapted layer (a typo, a layer left out of
    target_modules) nothing, and of two keys naming one layer the first written wins: either ran
    with other ranks than the recipe says, exit 0. `sized` False (a --smoke model, 2 layers): a
    key naming a deeper layer of the real model (`layer.11.attention.self.query`) names none
    here, and is not asked."""
    leaves = sorted({n.rsplit(".", 1)[-1] for n in targeted})
    for setting in ("rank_pattern", "alpha_pattern"):
        pattern = getattr(method, setting)
        for key in pattern:
            named = [n for n in targeted if re.match(rf"(.*\.)?({key})$", n)]
            if not named and sized:
                raise UserError(f"method.{setting}: key {key!r} names no layer the method adapts (the adapted "
                                f"layers end in: {', '.join(leaves)}); give a layer's name or the end of it, "
                                "and add it to method.target_modules if it is not adapted")
            for layer in named:
                others = [k for k in pattern if k != key and re.match(rf"(.*\.)?({k})$", layer)]
                if others:
                    raise UserError(f"method.{setting}: keys {key!r} and {others[0]!r} both name layer {layer}; "
                                    "give each layer one key")


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
