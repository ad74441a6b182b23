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
from toolkit.methods import METHODS, Context, HeadOnly, Method, instead, is_head, set_trainable

torch = lazy("torch", globals())


def is_bias(name: str) -> bool:
    """A bias term: a parameter named `bias` (linear, convolution and layer-norm layers alike: the
    paper trains all of them) or `..._bias`, a bias a layer holds apart from its projections
    (DeBERTa's query and value biases `q_bias` and `v_bias`, its in_proj being bias-free; XLNet's
    `r_w_bias`, `r_r_bias`, `r_s_bias`). Those were frozen: BitFit on DeBERTa trained no query
    or value bias (the paper's most changed terms), exit 0. A table of position biases held as
    an embedding (T5's `relative_attention_bias.weight`) is a weight, as in the paper."""
    last = name.rsplit(".", 1)[-1]
    return last == "bias" or last.endswith("_bias")


# Families whose body holds no bias term at transformers' defaults (bias-free linear layers, RMS
# or parameter-free norms), refused at validate: the family test knew T5 alone, so prompt tuning's
# and freeze's advice (computed from this refusal, `methods.instead`) named bitfit for a Llama or
# an mT5, and bitfit then refused the body as it was applied. A checkpoint of another family
# without biases is still refused as the method is applied. tests/test_advice.py builds each
# family's body from its config and checks that it holds no bias.
# A checkpoint whose config.json turns biases on (`has_bias`) is not refused at validate.
BIAS_FREE = ("t5", "mt5", "umt5", "longt5", "switch_transformers", "llama", "mistral", "ministral",
             "mixtral", "gemma", "gemma2", "gemma3_text", "olmo", "olmo2", "olmoe", "phi3", "granite",
             "granitemoe", "cohere", "qwen3", "qwen3_moe", "mpt", "helium", "smollm3", "exaone4")
INSTEAD = ("freeze", "lora", "ia3")  # what trains on a body without biases
# config keys that turn a BIAS_FREE family's bias terms on, each with the value that does:
# Llama's, Granite's, Helium's, SmolLM3's `attention_bias` and `mlp_bias` (Qwen2-style
# checkpoints of the Llama family carry q/k/v biases so), Gemma's, OLMo's, Cohere's, Qwen3's
# `attention_bias`, Switch's `router_bias` (not MPT's `no_bias: false`: transformers' MPT builds
# its layers bias-free whatever it says). tests/test_advice.py flips each in every family's
# default config that holds it and finds bias terms in the body built.
BIAS_SWITCHES = {"attention_bias": True, "mlp_bias": True, "router_bias": True}


def has_bias(config: dict) -> bool:
    """Whether the checkpoint's config.json turns bias terms on (`BIAS_SWITCHES`). A key the family
    does not read passes here and meets the refusal as the method is applied."""
    return any(key in config and config[key] is value for key, value in BIAS_SWITCHES.items())


@METHODS.register("bitfit")
@dataclass
class BitFit(Method):
    whole_model: ClassVar[bool] = True  # save_pretrained of the whole model: a chain can start from it

    def incompatible(self, family: str | None, task: Any) -> str | None:
        if family in BIAS_FREE:
            return (f"bitfit trains bias terms and {family} has none (its linear and norm layers are "
                    f"bias-free), so only the head would train; {instead(family, task, INSTEAD)}")
        return None

    def incompatible_checkpoint(self, family: str | None, task: Any, config: dict) -> str | None:
        """The family's refusal unless the checkpoint's config turns biases on: a Llama with
        `attention_bias: true` has q/k/v/o biases to train, and was refused at validate as bias-free."""
        return None if has_bias(config) else self.incompatible(family, task)

    def apply(self, model: torch.nn.Module, ctx: Context) -> torch.nn.Module:
        """Every bias term and the head (with the modules the checkpoint lacked) train. A body
        without a bias term is refused: validate knows the families of BIAS_FREE, and BitFit on a
        body without biases trained the head alone, a linear probe under bitfit's name, exit 0 (or,
        on a language model's tied head, stopped as training nothing)."""
        if not any(is_bias(n) for n, _ in model.named_parameters() if not is_head(n, ctx.head_names)):
            raise UserError(f"method.name: bitfit trains bias terms and this {model.config.model_type} model "
                            "has none outside its head (its linear and layer-norm layers are bias-free), so "
                            f"only the head would train; {instead(ctx.family, HeadOnly(ctx.head), INSTEAD)}")
        set_trainable(model, lambda n: is_bias(n) or is_head(n, ctx.head_names))
        return model

