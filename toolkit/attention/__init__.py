"""Attention modules: one file, one registry name, a settings dataclass with `attend`.

Every module is registered with transformers twice, under its own name: its attention function
with `AttentionInterface` and a mask function with `AttentionMaskInterface`. The second matters:
for a name that has no mask function, `masking_utils` returns `attention_mask=None` and BERT or
GPT-2 would silently attend to padding. `register()` does both, once: toolkit.models.load calls
it before it builds a model, and importing this package calls it only where transformers'
modeling code is loaded already (importing that takes seconds, which `toolkit validate` and
`toolkit ls` do not spend).

The mask function registered here hands over key padding only, as a (b, 1, 1, kv) bool tensor
(True = attend), never a (q, kv) matrix: the O(n) modules (linear, performer) and the block-sparse
ones (local, bigbird) would otherwise pay O(n^2) memory for the mask alone. Causality comes from
the layer itself (`module.is_causal`, set by every family: BERT as decoder, GPT-2 self-attention,
BART and T5 decoder self-attention), with the query offset `kv - q` that a cache or a prefix adds.

`prepare(model)` runs between loading and the method: it finds the attention layers, marks
self- and cross-attention, hands each layer the settings, and adds the module's parameters (named
`tk_attn_*`, which `keep_trainable` turns back on after any method froze them).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import pkgutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from toolkit.errors import UserError
from toolkit.layers import attention_layers  # noqa: F401  (importers name it here too)
from toolkit.lazy import lazy
from toolkit.registry import Registry
from toolkit.schema import build_dataclass

torch = lazy("torch", globals())
nn = lazy("torch.nn", globals())

ATTENTION: Registry[type] = Registry("attention module")
PREFIX = "tk_attn_"  # every parameter or buffer an attention module adds carries it
CROSS_NAMES = ("crossattention", "encoder_attn", "EncDecAttention")  # BERT/GPT-2, BART, T5
HAS_CROSS = ("bart", "t5")  # families whose decoder attends to an encoder
ENCODERS = ("bert", "roberta", "bart", "t5")  # families with bidirectional self-attention
# The families every module is wired and tested on (tests/test_attention.py walks them all); any
# other model_type is refused at validate. Each family hands its attention function its own
# extras, which a module would drop or break on: grouped key/value heads (llama, mistral: a shape
# error), sliding windows (mistral), logit soft-capping (gemma2), T5's relative bias under another
# name (mt5, umt5: linear and performer would run order-blind), layers `prepare` cannot find
# (distilbert, gpt_neox: a traceback at the first forward).
FAMILIES = ("bert", "roberta", "gpt2", "bart", "t5")
FILE, SETTINGS_FILE = "attention.safetensors", "attention.json"
# The largest size setting (relative.k, additive.dim, performer.features) any model may take, for
# checkpoints whose config validate cannot read off-line (each module's `oversized` bounds it by
# the model's own positions or width where it can): above every width and every learned position
# count of the five families (at most 1024 positions; T5's own bias stops telling distances apart
# at 128), and a huge value allocated tables per layer at load until memory ran out.
MOST = 8192


def min_value(t: torch.Tensor) -> float:
    return torch.finfo(t.dtype).min


@dataclass
class Attention:
    """Base of every module's settings; an instance lives on each attention layer it serves."""

    name: ClassVar[str] = ""
    positional: ClassVar[bool] = False  # uses token positions: meaningless across two sequences
    forms_scores: ClassVar[bool] = True  # has a (q, kv) score matrix that T5's bias can join
    # applies a (q, kv) mask as given, each query its own keys (`allowed` over the full score
    # matrix); the others read key padding only, and refuse a mask that is more (`query_mask_refused`)
    query_masks: ClassVar[bool] = False
    compile_eager: ClassVar[str | None] = None  # why train.compile leaves the step eager, or None
    cross: bool = True  # also replace cross-attention (False: cross-attention stays `dot`)
    # added parameters (names without the prefix) that start at a multiplicative identity, where
    # the module is softmax attention: train.weight_decay would pull them to 0, away from where
    # the pretrained model is, whatever the data (as IA3's scales, which start at 1)
    not_decayed: ClassVar[tuple[str, ...]] = ()

    run_seed: ClassVar[int] = 0  # the run's train.seed (set per instance by the recipe; not a setting)

    def draw_seed(self) -> int:
        """The seed of a module's random draws (performer, bigbird): its `seed` setting, else
        (None, the default) the run's train.seed, so that the seeds of a sweep redraw and its
        spread counts the draws. Not in the settings: the recipe and its hash keep None."""
        seed = getattr(self, "seed", None)
        return self.run_seed if seed is None else seed

    # --- validate ---------------------------------------------------------------------------
    def incompatible(self, family: str | None) -> str | None:
        """Why this module cannot run on this family, or None; checked before weights load."""
        if family is not None and family not in FAMILIES:
            return (f"the toolkit's attention modules run on {', '.join(FAMILIES[:-1])} and "
                    f"{FAMILIES[-1]} only, the families they are tested on (each family passes "
                    "its attention its own extras: grouped key/value heads, sliding windows, "
                    "soft-capping, position biases); use one of transformers' own (eager, sdpa) "
                    f"on {family}")
        if self.positional and self.cross and family in HAS_CROSS:
            return (f"{self.name} uses token positions, and in cross-attention a target token's "
                    "position says nothing about its distance to a source token; set "
                    f"model.attention.cross=false (cross-attention then stays dot)")
        if not self.forms_scores and family == "t5":
            return (f"T5's only position signal is a relative bias added to the score matrix, "
                    f"which {self.name} never forms; without it T5 would be order-blind")
        return None

    def oversized(self, positions: int | None, width: int | None) -> str | None:
        """'field: why' where a setting is larger than this model can use, or None: `positions`
        the tokens it can read (`models.max_positions`: RoBERTa's 514 embeddings hold 512; None
        where it has no learned positions), `width` its hidden size. Checked at validate where the
        checkpoint's config.json is on this machine. A huge value allocated per layer at load and
        ran out of memory there."""
        return None

    def incompatible_method(self, method: Any) -> str | None:
        """Why this module cannot run with this method, or None; checked before weights load."""
        if self.positional and getattr(method, "positionless_keys", False):
            return (f"{method.name} adds keys that have no position, and {self.name} places every "
                    "key by its position (they would be taken for tokens before the text: hidden "
                    "by a window, dense for bigbird, penalised or bucketed by distance); use a "
                    "module that is not positional, or another method")
        return None

    def dense_within(self, length: int) -> tuple[str, str] | None:
        """(what covers them, the setting that would not) where this module, which restricts who
        attends to whom, restricts nothing on sequences of at most `length` tokens (every query
        sees every key: plain softmax attention); None otherwise, and for modules that never
        restrict (dot, additive, linear, ...)."""
        return None

    # --- after loading ----------------------------------------------------------------------
    def prepare(self, model: nn.Module) -> nn.Module:
        """Hand every attention layer these settings and its role; add parameters if any."""
        for index, (path, layer) in enumerate(attention_layers(model)):
            layer.tk_settings = self
            layer.tk_cross = is_cross(path, layer)
            layer.tk_index = index
            if layer.tk_cross and not self.cross:
                continue
            heads, dim = heads_and_dim(layer, model.config)
            ref = next(layer.parameters())
            with torch.no_grad():
                for pname, value in self.parameters(heads, dim).items():
                    param = nn.Parameter(value.to(device=ref.device, dtype=ref.dtype))
                    layer.register_parameter(PREFIX + pname, param)
                for bname, value in self.buffers().items():
                    layer.register_buffer(PREFIX + bname, value.to(ref.device))
        return model

    def parameters(self, heads: int, dim: int) -> dict[str, torch.Tensor]:
        """Initial values of this module's per-layer parameters (none by default)."""
        return {}

    def buffers(self) -> dict[str, torch.Tensor]:
        """Per-layer state saved with checkpoints (performer's draw counter)."""
        return {}

    def wrapped(self, model: nn.Module) -> None:
        """After the method: `model` is what the loop calls, the prepared body inside it (PEFT's
        wrappers, which may call the body's `forward` directly, past its hooks)."""

    # --- the forward ------------------------------------------------------------------------
    def attend(self, module: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               pad: torch.Tensor | None, scaling: float, dropout: float,
               bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """q (b, h, tq, d), k/v (b, h, tk, d), pad (b, 1, 1, tk) bool key padding (True = attend)
        or None; causality is the module's to apply (`allowed` does it for dense modules);
        returns (b, tq, h, d) and the weights when they exist."""
        raise NotImplementedError

    @classmethod
    def register_with_transformers(cls) -> None:
        from transformers import AttentionInterface, AttentionMaskInterface

        AttentionInterface.register(cls.name, attention_forward)
        AttentionMaskInterface.register(cls.name, key_padding_mask)

    def to_dict(self) -> dict:
        return {"name": self.name, **dataclasses.asdict(self)}


def config_value(config: dict, *names: str) -> int | None:
    """The first of `names` a model's config sets to a positive integer (families name their
    width and positions differently: hidden_size, n_embd, d_model; max_position_embeddings,
    n_positions), or None."""
    for name in names:
        value = config.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def dense_warning(attention: Any, longest: int, parts: str) -> str | None:
    """One line where the module's window or blocks cover the longest sequence the run can feed
    (`parts` says what makes it that long): a comparison row would claim a sparse module while
    every token attends to every other. Said, not refused: a length sweep may mean it (its short
    points are then dense), and the line keeps that row from passing for sparse."""
    dense = attention.dense_within(longest) if isinstance(attention, Attention) else None
    if dense is None:
        return None
    return (f"model.attention: {attention.name} ({dense[0]}) covers the longest sequence this run feeds "
            f"({longest} tokens: {parts}), so every token attends to every other: this is plain dense "
            f"softmax attention, not {attention.name}; {dense[1]}")


# --- the two functions transformers calls ------------------------------------------------------
def key_padding_mask(batch_size: int, q_length: int, kv_length: int, q_offset: int = 0,
                     kv_offset: int = 0, attention_mask: torch.Tensor | None = None,
                     mask_function: Any = None, **kwargs: Any) -> torch.Tensor | None:
    """The mask function of every module: (b, 1, 1, kv) bool key padding, or None without padding.

    Its length also says which keys exist: under a causal mask, query i sits at position
    q_offset + i (transformers' own rule), and a static KV cache (a checkpoint's generation_config
    `cache_implementation: static`) hands every layer its whole buffer, kv_length slots, of which
    only the first q_offset + q_length are written. The modules take the queries for the last keys
    (a cache comes first), so they read unwritten slots as the queries' own positions: the future
    of the prompt leaked into every query of the prefill, exit 0. So under a causal mask the mask
    covers the written slots only, shorter than the keys, and `attention_forward` cuts the keys
    (and T5's bias) to it.

    A mask function that is neither the plain causal nor the bidirectional one (transformers
    composes one for packed sequences: position ids that restart inside a row, without an
    attention mask) is not key padding: it is handed over whole, as the (b, 1, q, kv) bool matrix
    it describes. Reduced to key padding, a packed row's sequences attended to each other, `dot`
    included (0.09 in GPT-2's logits against eager), exit 0."""
    from transformers.masking_utils import (bidirectional_mask_function, causal_mask_function,
                                            prepare_padding_mask, sdpa_mask)

    if mask_function is not None and mask_function not in (causal_mask_function, bidirectional_mask_function):
        return sdpa_mask(batch_size, q_length, kv_length, q_offset, kv_offset, mask_function=mask_function,
                         attention_mask=attention_mask, allow_is_causal_skip=False,
                         use_vmap=kwargs.get("use_vmap", False), device=kwargs.get("device"))
    written = kv_length
    if mask_function is causal_mask_function:  # not a bidirectional (encoder, cross-attention) mask
        end = int(q_offset) + q_length - kv_offset  # a tensor for a static cache: one host read
        if 0 < end < kv_length:
            written = end
    padding = prepare_padding_mask(attention_mask, kv_length, kv_offset)
    if padding is None:
        if written == kv_length:
            return None
        return torch.ones(batch_size, 1, 1, written, dtype=torch.bool, device=kwargs.get("device"))
    padding = padding[:, kv_offset:kv_offset + written]  # the keys' own slots (a sliding window starts later)
    # no mask where nothing is padded: a host read, skipped while compiling (train.compile), where
    # an all-true mask gives the same result and the read would break the graph
    if written == kv_length and (not torch.compiler.is_compiling() and bool(padding.all())):
        return None
    return padding[:, None, None, :].bool()  # (b, 1, 1, kv)


def attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, scaling: float | None = None,
                      dropout: float = 0.0, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """What every registered name points at: finds the layer's settings and calls its module."""
    settings = getattr(module, "tk_settings", None)
    if settings is None:
        raise RuntimeError(f"{type(module).__name__} has no attention settings: load the model "
                           "with toolkit.models.load (or call settings.prepare(model) after loading)")
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    if getattr(module, "tk_cross", False) and not settings.cross:
        settings = ATTENTION.get("dot")()
    pad, bias = attention_mask, kwargs.get("position_bias")  # T5's bias: (1 or b, h, tq, tk), additive
    if pad is not None and pad.dtype != torch.bool:  # a custom 4D float mask
        pad, bias = additive_mask(settings, pad, bias)
    if pad is not None and pad.shape[-1] < key.shape[-2]:  # slots a static cache has not written yet
        written = pad.shape[-1]
        key, value = key[:, :, :written], value[:, :, :written]
        bias = None if bias is None else bias[..., :written]
    refused = query_mask_refused(settings, module, pad)
    if refused:
        raise UserError(refused)
    out, weights = settings.attend(module, query, key, value, pad, scaling, dropout, bias)
    if weights is None and weights_requested(kwargs):  # else transformers returns () silently
        raise UserError(f"output_attentions: {settings.name} attention forms no attention weights "
                        "(it never builds the full query x key matrix); ask for them with a module "
                        "that does (dot, bilinear, relative, ...), or leave output_attentions off")
    return out, weights


def weights_requested(kwargs: dict) -> bool:
    """Whether the model's caller asked for attention weights: the `output_attentions` keyword
    where the family hands it on to its attention function (BERT, RoBERTa, BART, T5), or else the
    output collector transformers' `capture_outputs` set for this forward (it records each layer's
    weights with a hook), which is all there is where the family drops the keyword: GPT-2 pops it.
    Reading the keyword alone, a module that forms no weights gave GPT-2 `attentions=()` (a
    forward and `generate(output_attentions=True)` alike), exit 0."""
    if kwargs.get("output_attentions"):
        return True
    try:
        from transformers.utils.output_capturing import _active_collector
    except ImportError:  # another transformers: the keyword is all there is
        return False
    collected = _active_collector.get()
    return bool(collected) and any(str(key).endswith("attentions") for key in collected)


def additive_mask(settings: Attention, mask: torch.Tensor,
                  bias: torch.Tensor | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(bool mask, bias) for a custom float mask, which is additive, as eager adds it to the scores:
    one of 0 (keep) and at most half the dtype's minimum (hide) is a bool mask; one with other
    values (the -10000 of older extended masks, a soft bias) joins the scores as T5's bias does,
    in a module that masks the full matrix and places no key by its position, and is refused in
    one line by the others. Finding: it was thresholded at half the minimum, so -10000 on padded
    keys kept them (`dot` 0.03 off eager on BERT, 0.16 on GPT-2), exit 0. One host read."""
    hidden = mask <= min_value(mask) / 2
    if bool(((mask == 0) | hidden).all()):
        return ~hidden, bias
    if not settings.query_masks or settings.positional:
        usable = [n for n in ATTENTION.names() if ATTENTION.get(n).query_masks and not ATTENTION.get(n).positional]
        raise UserError(f"model.attention: {settings.name} cannot add a float attention mask to its scores, and "
                        "this one has values other than 0 (keep) and the dtype's minimum (hide), such as -10000; "
                        f"pass a bool mask, a 0/minimum one or a 2D attention_mask, or use {', '.join(usable)}")
    return None, mask if bias is None else bias + mask


def query_mask_refused(settings: Attention, module: nn.Module, pad: torch.Tensor | None) -> str | None:
    """Why `settings` cannot apply `pad`, or None: a module that reads key padding only (its
    `query_masks` false: linear, performer, local, bigbird) took any query's keys from a (q, kv)
    mask that gives queries different keys (packed sequences, a custom 4D mask), so each query
    saw keys its mask hides, exit 0. A (q, kv) mask that is key padding (and causality, in a
    causal layer) is applied as such. One host read, only where such a mask is given."""
    if pad is None or pad.shape[-2] == 1 or settings.query_masks:
        return None
    tq, tk = pad.shape[-2], pad.shape[-1]
    keys = pad.any(dim=-2, keepdim=True)
    expected = keys & causal_keep(tq, tk, pad.device) if is_causal(module) else keys
    if bool((pad == expected).all()):
        return None
    return (f"model.attention: {settings.name} applies key padding only, and this attention mask gives "
            "queries different keys (packed sequences: position ids restarting inside a row with no "
            "attention_mask; or a custom 4D mask); pass a 2D attention_mask with one sequence per row, "
            f"or use a module that applies a full mask ({', '.join(n for n in ATTENTION.names() if ATTENTION.get(n).query_masks)})")


def is_causal(module: nn.Module) -> bool:
    return bool(getattr(module, "is_causal", False)) and not getattr(module, "tk_cross", False)


def allowed(module: nn.Module, pad: torch.Tensor | None, tq: int, tk: int,
            device: torch.device) -> torch.Tensor | None:
    """(b|1, 1, tq|1, tk) bool for dense modules: key padding, and future keys off when causal."""
    keep = pad
    if is_causal(module):
        future = causal_keep(tq, tk, device)[None, None]  # (1, 1, tq, tk)
        keep = future if keep is None else keep & future
    return keep


def causal_keep(tq: int, tk: int, device: torch.device) -> torch.Tensor:
    """(tq, tk): query i sits at position i + tk - tq (a cache or a prefix comes first)."""
    i = torch.arange(tq, device=device)[:, None] + (tk - tq)
    return torch.arange(tk, device=device)[None, :] <= i


def key_keep(pad: torch.Tensor | None, b: int, tk: int, device: torch.device) -> torch.Tensor:
    """(b, tk) bool: the keys a query may see, for modules that never form a (tq, tk) matrix."""
    if pad is None:
        return torch.ones(b, tk, dtype=torch.bool, device=device)
    return pad.any(dim=-2)[:, 0, :].expand(b, tk)  # a custom (tq, tk) mask: any query's keys


def token_positions(pad: torch.Tensor | None, b: int, tk: int, device: torch.device) -> torch.Tensor:
    """(b|1, tk) each key's position among its row's real keys, for the positional modules (local,
    bigbird, relative, alibi): padding anywhere in a row, before the text or inside it (a soft
    prompt before a left-padded prompt, as `generate` from embeddings gets it), takes no position,
    as `generate` counts position ids from the mask. A query is the key at its own position (the
    last tq of tk: a cache comes first). Padded keys get the position of the real key before
    them (-1 before the first); they are masked anyway."""
    if pad is None:
        return torch.arange(tk, device=device)[None, :]
    return key_keep(pad, b, tk, device).long().cumsum(dim=-1) - 1


def softmax_attention(module: nn.Module, scores: torch.Tensor, v: torch.Tensor,
                      keep: torch.Tensor | None, dropout: float, bias: torch.Tensor | None,
                      normalize: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores (b, h, tq, tk) -> (b, tq, h, d): add T5's bias, mask, normalize, drop out, mix."""
    if bias is not None:
        scores = scores + bias
    if keep is not None:
        scores = scores.masked_fill(~keep, min_value(scores))
    weights = (normalize or (lambda s: torch.softmax(s, dim=-1)))(scores)
    if dropout and module.training:  # p = 0 would still cost a pass over (tq, tk)
        from toolkit.dropout import module_dropout

        weights = module_dropout(module, weights, dropout)
    out = torch.matmul(weights, v)  # (b, h, tq, d)
    return out.transpose(1, 2).contiguous(), weights  # (b, tq, h, d)


# --- finding the layers ------------------------------------------------------------------------
def is_cross(path: str, module: nn.Module) -> bool:
    return bool(getattr(module, "is_cross_attention", False)) or any(n in path.split(".") for n in CROSS_NAMES)


def heads_and_dim(module: nn.Module, config: Any) -> tuple[int, int]:
    for heads, dim in (("num_attention_heads", "attention_head_size"), ("num_heads", "head_dim"),
                       ("n_heads", "key_value_proj_dim")):
        if hasattr(module, heads) and hasattr(module, dim):
            return int(getattr(module, heads)), int(getattr(module, dim))
    raise RuntimeError(f"cannot tell heads and head size of {type(module).__name__}")


# --- recipe, trainability, saving --------------------------------------------------------------
def from_recipe(value: Any, where: str = "model.attention") -> Any:
    """A recipe's `model.attention` -> None, a transformers name (str) or a module's settings."""
    if value is None or isinstance(value, Attention):
        return value
    if isinstance(value, str):
        return ATTENTION.get(value)() if value in ATTENTION else value
    if not isinstance(value, dict):
        raise UserError(f"{where}: expected a name or a mapping with a name, got {value!r}")
    raw = dict(value)
    if "name" not in raw:
        raise UserError(f"{where}.name: required field is missing (e.g. {{name: local, window: 64}})")
    name = str(raw.pop("name"))
    if name not in ATTENTION and not raw:
        return name  # {name: sdpa}: one of transformers' own
    cls = ATTENTION.get(name, f"{where}.name")
    return build_dataclass(cls, raw, where)


def name_of(attention: Any) -> str | None:
    return attention.name if isinstance(attention, Attention) else attention


def undecayed(model: nn.Module) -> set[int]:
    """ids of the added parameters that train.weight_decay must leave: those a layer's module
    names in `not_decayed` (they start at an identity), read off the layers themselves."""
    kept = set()
    for _, layer in attention_layers(model):
        for pname in getattr(getattr(layer, "tk_settings", None), "not_decayed", ()):
            param = getattr(layer, PREFIX + pname, None)
            if isinstance(param, nn.Parameter):
                kept.add(id(param))
    return kept


def keep_trainable(model: nn.Module) -> None:
    """After a method froze and wrapped the body: the attention module's own parameters train with
    every method, and a module's per-pass hooks move to the model the loop calls (`wrapped`)."""
    for name, param in model.named_parameters():
        if PREFIX in name:
            param.requires_grad_(True)
    settings = {id(s): s for _, layer in attention_layers(model) if isinstance(s := getattr(layer, "tk_settings", None), Attention)}
    for each in settings.values():
        each.wrapped(model)


def _body(model: nn.Module) -> nn.Module:
    """The transformers model inside a PEFT wrapper (`get_base_model`), else the model itself: its
    parameter names are those of the plain model, whatever the method. Stripping PEFT's prefixes
    from the wrapper's names could not tell them: a prompt-learning wrapper puts the body right
    under `base_model.`, LoRA's under `base_model.model.`, so BART's `model.decoder...` (a body
    whose first module is `model`) was saved as `decoder...` under prompt and prefix tuning."""
    get = getattr(model, "get_base_model", None)
    return get() if callable(get) else model


def _added(model: nn.Module) -> dict[str, torch.Tensor]:
    """The module's added tensors (parameters and buffers), by their names in the plain model."""
    return {n: t for n, t in _body(model).state_dict().items() if PREFIX in n}


def _older_name(name: str) -> str | None:
    """The name an earlier toolkit saved a tensor under where a prompt-learning method wrapped a
    body whose first module is `model` (BART): without that `model.`."""
    return name[len("model."):] if name.startswith("model.") else None


def save(model: nn.Module, folder: Path, attention: Any) -> None:
    """attention.json (the settings) and attention.safetensors (added parameters) beside the model."""
    from safetensors.torch import save_file

    if not isinstance(attention, Attention):
        return
    folder.mkdir(parents=True, exist_ok=True)
    saved = {**attention.to_dict(), "run_seed": attention.run_seed}  # the draws of `seed: null`
    (folder / SETTINGS_FILE).write_text(json.dumps(saved, indent=2) + "\n")
    tensors = {n: t.detach().cpu().contiguous() for n, t in _added(model).items()}
    if tensors:
        save_file(tensors, str(folder / FILE))


def load_saved(model: nn.Module, folder: Path, expected: Any = None) -> int:
    """Load attention.safetensors (if any) into a prepared model, plain or wrapped by a method;
    returns how many tensors. With `expected`, only when the folder was saved with those very
    settings (an earlier run used as a checkpoint with another module starts that module afresh).
    A file an earlier toolkit wrote under a prompt-learning method on BART (`_older_name`) loads too."""
    from safetensors.torch import load_file

    file = Path(folder) / FILE
    if not file.is_file() or (expected is not None and settings_of(folder) != expected):
        return 0
    saved = load_file(str(file))
    state = _added(model)
    names = {n: n if n in saved else _older_name(n) for n in state}
    missing = [n for n, found in names.items() if found not in saved]
    if missing:
        raise UserError(f"{file}: no saved value for {missing[0]}; was the run made with another "
                        "model.attention?")
    with torch.no_grad():
        for n, t in state.items():
            t.copy_(saved[names[n]])
    return len(state)


def as_recipe_text(attention: Attention) -> str:
    """A module's settings as a recipe writes them: `{name: additive, cross: true, dim: 8}`."""
    fields = ", ".join(f"{k}: {json.dumps(v)}" for k, v in attention.to_dict().items() if k != "name")
    return f"{{name: {attention.name}{', ' + fields if fields else ''}}}"


def left_behind(trained: Any, asked: Any, warm_start: bool = False) -> str | None:
    """Why a recipe asking for attention `asked` would leave behind the module `trained` that its
    checkpoint's weights were trained under (a `{run: ...}` upstream, a run's model/ folder as a
    path), or None. Naming none ran the trained body under transformers' default attention, the
    module's parameters unread; naming the same module with other settings started its trained
    parameters afresh (`load_saved` loads only what was saved under the very settings), exit 0
    both. Naming another attention (sdpa, another module) leaves it on purpose."""
    if not isinstance(trained, Attention):
        return None  # no toolkit module there (a transformers name changes no weight)
    if asked is None:
        if warm_start:
            return ("which this recipe would leave out; a warm-started encoder-decoder cannot keep it: start "
                    "from a model trained without it")
        return (f"which this recipe would leave out; set model.attention: {as_recipe_text(trained)} to go on "
                "with it (its parameters come with it), or name the attention to use instead "
                "(model.attention: sdpa drops it)")
    if not isinstance(asked, Attention) or asked.name != trained.name or asked == trained:
        return None
    if not trained.parameters(1, 1):
        return None  # nothing trained to leave (a window, a block size, a seed changes no weight)
    return (f"whose trained parameters (tk_attn_*) load only under those very settings, and this recipe's "
            f"{as_recipe_text(asked)} would start them afresh; set model.attention: {as_recipe_text(trained)} "
            "to go on with them, or name another attention to leave them")


def settings_of(folder: Path) -> Any:
    """The settings an earlier run saved (attention.json), or None; with the run's train.seed,
    which its random draws followed where `seed` is null (performer's features: reloaded by hand
    without it, they were drawn from seed 0 and the outputs were another model's)."""
    file = Path(folder) / SETTINGS_FILE
    if not file.is_file():
        return None
    raw = json.loads(file.read_text())
    run_seed = raw.pop("run_seed", None) if isinstance(raw, dict) else None
    settings = from_recipe(raw, str(file))
    if run_seed is not None and isinstance(settings, Attention):
        settings.run_seed = int(run_seed)
    return settings


def register() -> None:
    """Every module's attention and mask function registered with transformers, once."""
    global _registered
    if not _registered:
        for name in ATTENTION.names():
            ATTENTION.get(name).register_with_transformers()
        _registered = True


_registered = False
for _info in pkgutil.iter_modules(__path__):
    if not _info.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_info.name}")
if "transformers.modeling_utils" in sys.modules:
    register()
