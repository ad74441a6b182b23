"""(IA)^3 through PEFT (Liu et al. 2022, T-Few): learned vectors that rescale keys, values and
feed-forward activations; the fewest trainable parameters of the additive methods, and mergeable.

Target and feed-forward modules default to PEFT's per-family choice; the task head trains as
`modules_to_save`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from toolkit.hf_tables import table
from toolkit.lazy import lazy
from toolkit.methods import METHODS, Context, Method, peft_task_type, wrap_peft
from toolkit.schema import UNORDERED

torch = lazy("torch", globals())


@METHODS.register("ia3")
@dataclass
class IA3(Method):
    transformers_loads: ClassVar[bool] = True
    target_modules: list[str] | None = field(default=None, metadata={"min_items": 1, UNORDERED: True})  # None: PEFT's default for the family
    feedforward_modules: list[str] | None = field(default=None, metadata={UNORDERED: True})  # a subset of target_modules, scaled on their input
    # no PEFT default for the family: both set, together
    lifted_by: ClassVar[dict[str, Any]] = {"target_modules": ["query"], "feedforward_modules": []}

    def incompatible(self, family: str | None, task: Any) -> str | None:
        if (self.feedforward_modules is not None) != (self.target_modules is not None):
            return "method.target_modules and method.feedforward_modules are set together or not at all"
        defaults = table("peft.utils.constants", "TRANSFORMERS_MODELS_TO_IA3_TARGET_MODULES_MAPPING")
        if self.target_modules is None and family not in defaults:
            return (f"PEFT has no default IA3 target modules for {family}; set method.target_modules "
                    "and method.feedforward_modules")
        extra = set(self.feedforward_modules or []) - set(self.target_modules or [])
        if extra:
            return f"method.feedforward_modules must be among target_modules; not there: {sorted(extra)}"
        return None

    def decays(self, name: str, param: torch.nn.Parameter) -> bool:
        """The learned vectors are scales that start at 1 (the identity): weight decay would pull
        them toward 0, shrinking the activations they scale, not toward the base model. PEFT
        stores them as (n, 1) matrices, so the fewer-than-2-dimensions rule missed them."""
        return "ia3_l" not in name and super().decays(name, param)

    def apply(self, model: torch.nn.Module, ctx: Context) -> torch.nn.Module:
        from peft import IA3Config

        config = IA3Config(
            task_type=peft_task_type(ctx), target_modules=self.target_modules,
            feedforward_modules=self.feedforward_modules, modules_to_save=list(ctx.head_names) or None,
        )
        return wrap_peft(model, config)
