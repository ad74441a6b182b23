"""BitFit (Ben Zaken et al. 2021): only the bias terms of the body and the task head train.

No PEFT is needed: it is a choice of which parameters have requires_grad. The result is saved as
a full model (`save_pretrained`), so plain `AutoModelFor...from_pretrained` reloads it with no
toolkit code; the biases alone would be smaller but would need a custom loader.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from toolkit.errors import UserError
from toolkit.lazy import lazy
from toolkit.methods import METHODS, Context, Method, is_head, set_trainable
from toolkit.methods.freeze import LM_HEADS

torch = lazy("torch", globals())

LM_TASK_TYPES = ("CAUSAL_LM", "SEQ_2_SEQ_LM", "")  # a language model's head (masked LM: PEFT has no type)


def is_bias(name: str) -> bool:
    """A bias term: a parameter named `bias` (linear, convolution and layer-norm layers alike: the
    paper trains all of them) or `..._bias`, a bias a layer holds apart from its projections
    (DeBERTa's query and value biases `q_bias` and `v_bias`, its in_proj being bias-free; XLNet's
    `r_w_bias`, `r_r_bias`, `r_s_bias`). Those were frozen: BitFit on DeBERTa trained no query
    or value bias (the paper's most changed terms), exit 0. A table of position biases held as
    an embedding (T5's `relative_attention_bias.weight`) is a weight, as in the paper."""
    last = name.rsplit(".", 1)[-1]
    return last == "bias" or last.endswith("_bias")


def advice(lm_head: bool) -> str:
    """What to use instead on a model without bias terms."""
    return "use lora or ia3" if lm_head else "use method freeze for that, or lora/ia3"


@METHODS.register("bitfit")
@dataclass
class BitFit(Method):
    whole_model: ClassVar[bool] = True  # save_pretrained of the whole model: a chain can start from it

    def incompatible(self, family: str | None, task: Any) -> str | None:
        if family == "t5":
            return ("bitfit trains bias terms and T5 has none (its linear and layer-norm layers are "
                    f"bias-free), so only the head would train; {advice(self.head(task, family) in LM_HEADS)}")
        return None

    def apply(self, model: torch.nn.Module, ctx: Context) -> torch.nn.Module:
        """Every bias term and the head (with the modules the checkpoint lacked) train. A body
        without a bias term is refused: the family test at validate knows T5 alone, and BitFit on
        a Llama, Mistral, Gemma or mT5 (bias-free too) trained the head alone, a linear probe under
        bitfit's name, exit 0 (or, on a language model's tied head, stopped as training nothing)."""
        if not any(is_bias(n) for n, _ in model.named_parameters() if not is_head(n, ctx.head_names)):
            raise UserError(f"method.name: bitfit trains bias terms and this {model.config.model_type} model "
                            "has none outside its head (its linear and layer-norm layers are bias-free), so "
                            f"only the head would train; {advice(ctx.peft_task_type in LM_TASK_TYPES)}")
        set_trainable(model, lambda n: is_bias(n) or is_head(n, ctx.head_names))
        return model
