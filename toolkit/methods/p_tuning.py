"""P-tuning through PEFT (Liu et al. 2021, "GPT Understands, Too"): soft tokens produced by a small
prompt encoder (MLP or LSTM) which reparameterises them for steadier training than raw vectors.

The task head trains alongside as `modules_to_save`. Like prompt tuning it feeds `inputs_embeds`,
so it shares prompt tuning's refusals (see `soft_prompt_refusal`) and its generation on a
decoder-only model (`install`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from toolkit.lazy import lazy
from toolkit.methods import METHODS, Context, Method, peft_task_type
from toolkit.methods.prompt_tuning import PromptTuning, install, read_prompts, soft_prompt_refusal

torch = lazy("torch", globals())


@METHODS.register("p_tuning")
@dataclass
class PTuning(Method):
    num_virtual_tokens: int = field(default=20, metadata={"min": 1})
    encoder_hidden_size: int = field(default=128, metadata={"min": 1})
    encoder_reparameterization_type: Literal["MLP", "LSTM"] = "MLP"
    export_load: ClassVar[str] = PromptTuning.export_load  # the same generation route

    def incompatible(self, family: str | None, task: Any) -> str | None:
        return soft_prompt_refusal(self.name, family, task, self.head(task))

    def added_positions(self) -> int:
        return self.num_virtual_tokens

    def apply(self, model: torch.nn.Module, ctx: Context) -> torch.nn.Module:
        from peft import PromptEncoderConfig, get_peft_model

        config = PromptEncoderConfig(
            task_type=peft_task_type(ctx), num_virtual_tokens=self.num_virtual_tokens,
            encoder_hidden_size=self.encoder_hidden_size,
            encoder_reparameterization_type=self.encoder_reparameterization_type,
            modules_to_save=list(ctx.head_names) or None,
            **read_prompts(ctx, every_row_feeds_all=self.encoder_reparameterization_type == "LSTM"),
        )
        return install(get_peft_model(model, config))

    def loaded(self, model: torch.nn.Module) -> torch.nn.Module:
        return install(model)
