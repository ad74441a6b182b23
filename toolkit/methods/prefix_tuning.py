"""Prefix tuning (Li & Liang 2021): trainable key/value prefixes in every attention layer.

PEFT holds the parameters and the saved format (`PrefixTuningConfig`, its prompt encoder, its
`adapter_model.safetensors`), so the trainable count, `prefix_projection` and plain-PEFT loading
are PEFT's own. The way the prefixes reach the layers is the toolkit's, written here because PEFT
has no other: PEFT hands them to the model as a key/value cache through `past_key_values`, and
each transformers release may rename that argument (5.24 calls it `cache` and PEFT then refuses
BERT, RoBERTa and GPT-2), and encoder-only models stopped reading a cache at all. Here the
prefixes go in through transformers' attention interface instead:

- `install` registers, for the model's attention implementation X (eager, sdpa or a toolkit
  attention module), a function `tk_prefix+X` that prepends the layer's prefix to its keys and
  values and widens the mask, then calls X; the model is switched to that name, whose mask
  function is X's. Every attention layer that gets a prefix carries `tk_prefix_slot`.
- The PEFT model's `forward` and `generate` compute the prefixes once per call (batch 1, expanded
  inside attention) and hand them to their layers before running the base model. Generation
  works with the model's own cache: the cache holds real tokens only, the prefix comes first.

The layout of PEFT's prompt encoder output is kept exactly (PEFT's `get_prompt`): for one stack
(encoder-only, decoder-only) layer i gets rows 2i (key) and 2i+1 (value); for encoder-decoders
(two "transformer submodules") the rows are doubled and layer i of the decoder gets rows
4i..4i+3 modulo 2L of the doubled stack for its self-attention key, value and cross-attention
key, value; the encoder gets none, as in PEFT.

One difference from PEFT's cache route, on purpose: real tokens keep positions 0..L-1, as in
pretraining. The cache route shifted them by `num_virtual_tokens`, which overflowed BERT's
position table at max_length 512 (a recipe's default) and so could not run there.
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field
from typing import Any, ClassVar

from toolkit.attention import ATTENTION, attention_layers, causal_keep, is_causal, is_cross, min_value
from toolkit.errors import UserError
from toolkit.lazy import lazy
from toolkit.methods import METHODS, Context, Method, instead, peft_task_type
from toolkit.methods.prompt_tuning import COMPOSITE, WEIGHTS, composite_refusal, encoder_decoder_head, mlm_refusal

torch = lazy("torch", globals())

WRAPPED = "tk_prefix+"  # the attention implementation name is WRAPPED + the model's own
BUILTIN = ("eager", "sdpa")  # transformers' implementations the prefix can wrap (mask in hand)


@METHODS.register("prefix_tuning")
@dataclass
class PrefixTuning(Method):
    num_virtual_tokens: int = field(default=20, metadata={"min": 1})
    prefix_projection: bool = False  # True: prefixes come from an MLP (Li & Liang's reparameterisation)
    encoder_hidden_size: int | None = field(default=None, metadata={"min": 1})  # the MLP's width; None: the model's hidden size
    positionless_keys: ClassVar[bool] = True

    def incompatible(self, family: str | None, task: Any) -> str | None:
        """The family's and task's refusals first, which no setting lifts (a setting's advice
        followed there met them next), then the settings'."""
        if self.head(task) == "masked-lm":
            return mlm_refusal(self.name, family, task)
        if family == COMPOSITE:
            return composite_refusal(self.name, task)
        cls = encoder_decoder_head(family, self.head(task))
        if cls is not None:  # PEFT lays out two stacks for a seq2seq LM only
            return one_stack_refusal(family, cls, task)
        if self.encoder_hidden_size is not None and not self.prefix_projection:  # PEFT's MLP only
            return ("method.encoder_hidden_size is the width of the prefix projection, and "
                    "method.prefix_projection is false (no projection to size); set method.prefix_projection: true")
        return None

    def apply(self, model: torch.nn.Module, ctx: Context) -> torch.nn.Module:
        from peft import PrefixTuningConfig, get_peft_model

        config = PrefixTuningConfig(
            task_type=peft_task_type(ctx), num_virtual_tokens=self.num_virtual_tokens,
            prefix_projection=self.prefix_projection, encoder_hidden_size=self.encoder_hidden_size,
            modules_to_save=list(ctx.head_names) or None, token_dim=key_width(model.config),
            num_layers=decoder_layers(model) if ctx.peft_task_type == "SEQ_2_SEQ_LM" else None,
        )
        return install(get_peft_model(model, config))

    def loaded(self, model: torch.nn.Module) -> torch.nn.Module:
        return install(model)

    # PEFT's own prefix route needs a cache transformers 5.24's models no longer take
    export_load: ClassVar[str] = ("peft and the toolkit's prefix route: "
                                  "toolkit.methods.prefix_tuning.install(PeftModel.from_pretrained({base}, OUT))")


def key_width(config: Any) -> int | None:
    """The width of a layer's keys (heads x head size) where it is not the model's hidden size,
    else None (PEFT takes the hidden size). PEFT sizes each prefix by the hidden size, and T5's
    heads are `d_kv` wide whatever `d_model` is: t5-3b's and t5-11b's (d_kv 128, 32 and 128
    heads of a 1024 width) stopped at the first batch with a shape error."""
    heads, size = getattr(config, "num_heads", None), getattr(config, "d_kv", None)
    if heads and size and heads * size != getattr(config, "d_model", heads * size):
        return heads * size
    return None


def decoder_layers(model: Any) -> int | None:
    """The number of an encoder-decoder's decoder layers (those with cross-attention), the layers
    its prefixes go to; None where none is found (PEFT then reads the config's).

    PEFT sizes the prefix table by the config's layer count, which for BART and T5 is the
    encoder's (`num_hidden_layers`, `num_layers`), and the decoder reads its rows alone: where the
    encoder is the deeper stack (distilbart-12-3, distilbart-xsum-12-1, T5s with fewer decoder
    layers) the rows past the decoder's never trained and were counted in `trainable_params`
    (12-3: half the table), and where the decoder is deeper more of its layers shared rows than
    PEFT's doubled layout makes layers share at equal depths (i and i + L/2)."""
    found = sum(1 for path, layer in attention_layers(model) if is_cross(path, layer))
    return found or None


def one_stack_refusal(family: str | None, cls: str | None = None, task: Any = None) -> str:
    """`task`: the recipe's, for the advice (the methods of WEIGHTS that run it); None where a
    loaded model is found so (no advice: no recipe is at hand)."""
    cls = cls or f"{family}'s model"
    advice = f"; {instead(family, task, WEIGHTS)}" if task is not None else ""
    return (f"prefix_tuning: PEFT lays out the prefixes of any model but a seq2seq LM as one stack of "
            f"layers, and {cls} runs two (encoder and decoder), so no layer would know its prefix{advice}")


# --- putting the prefixes in -------------------------------------------------------------------
def install(peft_model: Any) -> Any:
    """Route a PEFT prefix-tuning model's prefixes through the attention interface (see the
    module docstring); returns the same model. Also for `PeftModel.from_pretrained` results."""
    base = peft_model.get_base_model()
    config = peft_model.active_peft_config
    current = base.config._attn_implementation or "eager"
    own = current[len(WRAPPED):] if current.startswith(WRAPPED) else current
    _register(own)
    if current != WRAPPED + own:
        base.set_attn_implementation(WRAPPED + own)
        if base.config._attn_implementation != WRAPPED + own:
            raise UserError(f"prefix_tuning: {type(base).__name__} does not take an attention "
                            "function through transformers' attention interface")
    two = config.num_transformer_submodules == 2
    if base.config.is_encoder_decoder and not two:
        raise ValueError(one_stack_refusal(base.config.model_type, type(base).__name__))
    index: dict[str, int] = {}
    for path, layer in attention_layers(base):
        kind = "cross" if is_cross(path, layer) else (
            "encoder" if two and ".encoder." in f".{path}." else "self")
        layer.tk_prefix_slot = None
        if kind == "encoder":
            continue  # PEFT's encoder-decoder layout has prefixes for the decoder only
        i = index.get(kind, 0)
        index[kind] = i + 1
        if two:
            rows = config.num_layers * 2
            first = (4 * i + (2 if kind == "cross" else 0)) % rows
            layer.tk_prefix_slot = (first, first + 1)
        else:
            layer.tk_prefix_slot = (2 * i, 2 * i + 1)
        layer.tk_prefix = None
    if not index:
        raise UserError(f"prefix_tuning: found no attention layer in {type(base).__name__}")
    peft_model.forward = types.MethodType(_forward, peft_model)
    peft_model.generate = types.MethodType(_generate, peft_model)
    return peft_model


def prefixes(peft_model: Any) -> torch.Tensor:
    """(2L, 1, heads, n, head_dim): every layer's key and value prefix, as PEFT's get_prompt lays
    them out (one batch row: the prefix is the same for every example)."""
    config = peft_model.active_peft_config
    encoder = peft_model.prompt_encoder[peft_model.active_adapter]
    n = config.num_virtual_tokens
    if config.inference_mode:  # loaded for inference: PEFT saved the encoder's output as the table
        raw = encoder.embedding.weight[None, :n]
    else:
        tokens = peft_model.prompt_tokens[peft_model.active_adapter][None, :n]
        raw = encoder(tokens.to(encoder.embedding.weight.device))
    heads = config.num_attention_heads
    raw = raw.view(1, n, config.num_layers * 2, heads, config.token_dim // heads)
    return raw.permute(2, 0, 3, 1, 4)


def _hand_out(peft_model: Any) -> None:
    """Give every slotted layer its (key, value) prefix for the coming call. They stay until the
    next call, so that activation checkpointing recomputes the same forward in backward."""
    table = prefixes(peft_model)
    for module in peft_model.get_base_model().modules():
        slot = getattr(module, "tk_prefix_slot", None)
        if slot is not None:
            module.tk_prefix = (table[slot[0]], table[slot[1]])


def _forward(self: Any, *args: Any, **kwargs: Any) -> Any:
    _hand_out(self)
    return self.get_base_model()(*args, **kwargs)


def _generate(self: Any, *args: Any, **kwargs: Any) -> Any:
    _hand_out(self)
    return self.get_base_model().generate(*args, **kwargs)


# --- the attention function --------------------------------------------------------------------
def _register(own: str) -> None:
    """`tk_prefix+own` in transformers' attention and mask interfaces (idempotent)."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if own not in BUILTIN and own not in ATTENTION:
        raise UserError(f"prefix_tuning runs with model.attention eager, sdpa or a toolkit module "
                        f"({', '.join(ATTENTION.names())}); not with {own}")
    name = WRAPPED + own
    if name in ALL_ATTENTION_FUNCTIONS:
        return
    mask = ALL_MASK_ATTENTION_FUNCTIONS[own]
    AttentionInterface.register(name, _attention)
    AttentionMaskInterface.register(name, mask)


def _base_function(module: Any, own: str) -> Any:
    """The function the model would call without prefixes: a registered one, or for eager the
    modeling file's own `eager_attention_forward` (T5's adds its position bias there)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if own != "eager" and own in ALL_ATTENTION_FUNCTIONS:
        return ALL_ATTENTION_FUNCTIONS[own]
    modeling = sys.modules.get(type(module).__module__)
    fn = getattr(modeling, "eager_attention_forward", None)
    if fn is None:
        raise RuntimeError(f"{type(module).__module__} has no eager_attention_forward")
    return fn


def _attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, Any]:
    """Prepend the layer's prefix to keys and values, widen the mask (prefix keys are seen by
    every query), then call the model's own attention function."""
    own = module.config._attn_implementation[len(WRAPPED):]
    fn = _base_function(module, own)
    prefix = getattr(module, "tk_prefix", None)
    if prefix is None:
        return fn(module, query, key, value, attention_mask, **kwargs)
    b, n = key.shape[0], prefix[0].shape[-2]
    tq, tk = query.shape[-2], key.shape[-2]
    pk = prefix[0].to(key.dtype).expand(b, -1, -1, -1)
    pv = prefix[1].to(value.dtype).expand(b, -1, -1, -1)
    key, value = torch.cat([pk, key], dim=-2), torch.cat([pv, value], dim=-2)
    if attention_mask is not None:
        keep = True if attention_mask.dtype == torch.bool else 0.0
        attention_mask = torch.nn.functional.pad(attention_mask, (n, 0), value=keep)
    elif is_causal(module) and own not in ATTENTION:  # toolkit modules apply causality themselves
        allowed = torch.nn.functional.pad(causal_keep(tq, tk, query.device), (n, 0), value=True)
        attention_mask = torch.zeros(allowed.shape, dtype=query.dtype, device=query.device)
        attention_mask = attention_mask.masked_fill(~allowed, min_value(attention_mask))[None, None]
    bias = kwargs.get("position_bias")  # T5: additive (1|b, h, tq, tk); prefixes have no position
    if isinstance(bias, torch.Tensor) and bias.shape[-1] == tk:
        kwargs["position_bias"] = torch.nn.functional.pad(bias, (n, 0))
    return fn(module, query, key, value, attention_mask, **kwargs)
