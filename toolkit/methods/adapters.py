"""Bottleneck adapters (Houlsby et al. 2019; Pfeiffer et al. 2020), injected by hand.

No maintained library provides them for transformers 5 (the `adapters` package pins
transformers 4.x and PEFT has none), so this file is a small injection module of our own.

An adapter is `h + up(act(down(h)))` with `up` initialised to zero, so the adapted model starts
exactly equal to the pretrained one. Where it reads and adds is AdapterHub's (the `adapters`
library's DoubleSeqBnConfig and SeqBnConfig, the definitions of Houlsby and Pfeiffer there):

- houlsby: on each sub-block's output *before* that block's residual add and LayerNorm, after
  self-attention and after the feed-forward block: attached to the sub-block's output projection
  as a child module named `bottleneck_adapter` and applied with a forward hook on the dropout
  module the sub-block applies to that output (dense, dropout, adapter: AdapterHub's order; BART,
  whose layers drop out with a call, has that call moved into a hook on each sub-layer's
  projection, the adapter after it: `CALLED_DROPOUT`);
- pfeiffer: once per layer, after the feed-forward block, reading what follows the block's
  residual add: a post-LayerNorm family (BERT, RoBERTa, BART) `LN(s + A(LN(s)))` with s the
  block's output plus its residual and LN the layer's own LayerNorm (hooked there); a pre-LayerNorm
  family (GPT-2, T5) `s + A(s)` on the residual stream after the block (hooked on the block, or
  T5's feed-forward sub-layer). Until this placement it read the feed-forward projection's output,
  as houlsby's second adapter does, which is not Pfeiffer's adapter (other results, exit 0);
  a folder saved so loads the same way (its config has no `placement`).

The hooked modules stay the same objects with the same parameter names, so code that reads them
(T5 checks `wo.weight.dtype`) and every base state-dict key keep working.

Where they go, per family (`houlsby`: the first two; `pfeiffer`: the third):

    family         after attention                  after feed-forward           pfeiffer
    bert, roberta  layer.N.attention.output.dense   layer.N.output.dense         layer.N.output.LayerNorm
    gpt2           h.N.attn.c_proj                  h.N.mlp.c_proj               h.N
    bart           layers.N.self_attn.out_proj      layers.N.fc2                 layers.N.final_layer_norm
    t5             block.N.layer.0.SelfAttention.o  block.N.layer.K.DenseReluDense.wo  block.N.layer.K

In encoder-decoder models both stacks are adapted and `layers` indexes each stack: every index
must exist in each (a 12-layer encoder with a 6-layer decoder takes 0..5). Decoder
cross-attention (BART `encoder_attn`, T5 `EncDecAttention`) gets no adapter: Houlsby's
attention adapter follows *self*-attention, and AdapterHub's seq2seq configs leave
cross-attention adapters off by default; it also keeps houlsby at exactly two adapters per
layer. Only the adapters and the task head train (and, with `train_layer_norms`, the base's
layer normalisations, as Houlsby et al. trained them); `save` writes just those, and
`load_adapters` puts them back into a fresh base model.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Literal

from toolkit.errors import UserError
from toolkit.lazy import lazy
from toolkit.schema import UNORDERED, added
from toolkit.methods import METHODS, Context, Method, check_sizes, is_head, set_trainable
from toolkit.models import BOTTLENECK_CHILD, BOTTLENECK_CONFIG, head_names

torch = lazy("torch", globals())
nn = lazy("torch.nn", globals())

_BERT = (r"layer\.(\d+)\.attention\.output\.dense", r"layer\.(\d+)\.output\.dense")
# family -> (after-attention, after-feed-forward) module-name patterns; group 1 = layer index
PLACES: dict[str, tuple[str, str]] = {
    "bert": _BERT,
    "roberta": _BERT,
    "gpt2": (r"h\.(\d+)\.attn\.c_proj", r"h\.(\d+)\.mlp\.c_proj"),
    "bart": (r"layers\.(\d+)\.self_attn\.out_proj", r"layers\.(\d+)\.fc2"),
    "t5": (r"block\.(\d+)\.layer\.0\.SelfAttention\.o", r"block\.(\d+)\.layer\.\d+\.DenseReluDense\.wo"),
}
# family -> Pfeiffer's place: (module-name pattern, group 1 = layer index; how it is read: "norm",
# the LayerNorm after the feed-forward residual add of a post-LN layer; "stream", the output of a
# pre-LN block or sub-layer after its residual add; a child the module must have, or None)
PFEIFFER: dict[str, tuple[str, str, str | None]] = {
    "bert": (r"layer\.(\d+)\.output\.LayerNorm", "norm", None),
    "roberta": (r"layer\.(\d+)\.output\.LayerNorm", "norm", None),
    "gpt2": (r"h\.(\d+)", "stream", None),
    "bart": (r"layers\.(\d+)\.final_layer_norm", "norm", None),
    "t5": (r"block\.(\d+)\.layer\.\d+", "stream", "DenseReluDense"),
}
# family -> (pattern of a houlsby projection's name, what makes the name of the dropout module the
# sub-layer applies to that projection's output); the adapter is applied after it (AdapterHub's and
# Houlsby et al.'s order: dense, dropout, adapter).
AFTER_DROPOUT: dict[str, tuple[tuple[str, str], ...]] = {
    "bert": ((r"\.dense$", ".dropout"),),
    "roberta": ((r"\.dense$", ".dropout"),),
    "gpt2": ((r"\.attn\.c_proj$", ".attn.resid_dropout"), (r"\.mlp\.c_proj$", ".mlp.dropout")),
    "t5": ((r"\.SelfAttention\.o$", ".dropout"), (r"\.DenseReluDense\.wo$", ".dropout")),
}
# family -> a layer whose forward drops out every sub-layer's output with a call, no module
# (BART's `nn.functional.dropout(h, p=self.dropout)`): (pattern of the layer's name, the float
# attribute the call reads, the output projections of its sub-layers). In a layer given houlsby
# adapters that dropout moves into a hook on each projection (the same call and p at the same
# point of the forward, so the same masks), the adapter after it, and the attribute becomes 0.
CALLED_DROPOUT: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "bart": (r"layers\.\d+", "dropout", ("self_attn.out_proj", "encoder_attn.out_proj", "fc2")),
}
PLACEMENT = "adapterhub"  # written into a saved config; a folder without it is the earlier placement
CHILD = BOTTLENECK_CHILD  # the child module name, and the marker of adapter parameters
CONFIG_FILE = BOTTLENECK_CONFIG
WEIGHTS_FILE = "bottleneck_adapters.safetensors"


def __getattr__(name: str) -> Any:
    """`Bottleneck` and `ACTIVATIONS` live in _bottleneck.py (they import torch); still named here."""
    if name in ("Bottleneck", "ACTIVATIONS"):
        from toolkit.methods import _bottleneck

        return getattr(_bottleneck, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _adapt_output(module: nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
    """Forward hook: a plain function (not a closure) so models stay picklable and deep-copyable."""
    return getattr(module, CHILD)(output)


def _adapt_normed(module: nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
    """Forward hook on a post-LN layer's LayerNorm, whose input s is the feed-forward block's output
    plus its residual: LN(s + A(LN(s))), AdapterHub's Pfeiffer (the adapter's own residual, then
    the layer's residual, then the layer's LayerNorm again)."""
    return module.forward(inputs[0] + getattr(module, CHILD).delta(output))  # forward: not this hook again


def _adapt_stream(module: nn.Module, inputs: tuple, output: Any) -> Any:
    """Forward hook on a pre-LN block (or sub-layer) whose output is the residual stream: s + A(s)."""
    if isinstance(output, tuple):
        return (getattr(module, CHILD)(output[0]),) + output[1:]
    return getattr(module, CHILD)(output)


HOOKS = {"output": _adapt_output, "norm": _adapt_normed, "stream": _adapt_stream}


def _adapt_dropped(projection: nn.Module, module: nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
    """Forward hook on the dropout that follows `projection`: its adapter on the dropped output."""
    return getattr(projection, CHILD)(output)


def _drop_then_adapt(p: float, module: nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
    """Forward hook on a sub-layer's output projection where the layer's dropout was a call: that
    dropout, then the projection's adapter (if it has one) on the dropped output."""
    dropped = nn.functional.dropout(output, p=p, training=module.training)
    adapter = module._modules.get(CHILD)
    return dropped if adapter is None else adapter(dropped)


def _called_dropout_layer(model: nn.Module, name: str) -> str | None:
    """The name of the layer whose forward drops out projection `name`'s output with a call."""
    pattern, _, projections = CALLED_DROPOUT.get(model.config.model_type, ("", "", ()))
    for projection in projections:
        layer = name[: -len(projection) - 1]
        if name.endswith("." + projection) and re.fullmatch(r"(?:.*\.)?" + pattern, layer):
            return layer
    return None


def _move_called_dropout(model: nn.Module, layer_name: str) -> None:
    """The layer's dropout call made a hook on each of its sub-layers' output projections."""
    _, attribute, projections = CALLED_DROPOUT[model.config.model_type]
    layer = model.get_submodule(layer_name)
    p = float(getattr(layer, attribute))
    setattr(layer, attribute, 0.0)
    for projection in projections:
        try:
            module = layer.get_submodule(projection)
        except AttributeError:  # an encoder layer has no cross-attention
            continue
        module.register_forward_hook(functools.partial(_drop_then_adapt, p))


def _dropout_after(model: nn.Module, name: str) -> nn.Module | None:
    """The nn.Dropout module the sub-layer applies to the output of projection `name`, or None."""
    for pattern, replacement in AFTER_DROPOUT.get(model.config.model_type, ()):
        if re.search(pattern, name):
            try:
                found = model.get_submodule(re.sub(pattern, replacement, name))
            except AttributeError:
                return None
            return found if isinstance(found, nn.Dropout) else None
    return None


def is_adapter(name: str) -> bool:
    """Whether a parameter name belongs to an injected adapter (what trains and is saved)."""
    return f".{CHILD}." in f".{name}"


def _out_width(module: nn.Module, model: nn.Module) -> int:
    """Output features of a Linear, of GPT-2's Conv1D (whose weight is (in, out)) or of a
    LayerNorm; a block's is the model's hidden size."""
    if isinstance(module, nn.Linear):
        return module.out_features
    if hasattr(module, "nf"):
        return int(module.nf)
    if isinstance(module, nn.LayerNorm):
        return int(module.normalized_shape[-1])
    width = getattr(model.config, "hidden_size", None)
    if not isinstance(width, int):  # a config without the attribute: one line, not an AttributeError
        raise UserError(f"method.name: adapters cannot tell the width of {type(module).__name__} in a "
                        f"{model.config.model_type} model (its config has no hidden_size); "
                        "use another method (lora)")
    return width


@METHODS.register("adapters")
@dataclass
class Adapters(Method):
    """Settings of the bottleneck adapters; `apply` freezes the base and trains adapters + head."""

    config: Literal["houlsby", "pfeiffer"] = "houlsby"  # houlsby: after attention and feed-forward; pfeiffer: feed-forward only
    reduction_factor: int = field(default=16, metadata={"min": 1})
    bottleneck_size: int | None = field(default=None, metadata={"min": 1})  # wins over the factor
    non_linearity: Literal["relu", "gelu", "swish", "silu", "tanh"] = "relu"
    layers: list[int] | None = field(default=None, metadata={"min": 0, "min_items": 1, UNORDERED: True})  # layer indices to adapt (each stack); None = all
    # the base's layer normalisations train too, as Houlsby et al. (2019) trained them ("the layer
    # normalization parameters per layer"); off: frozen, as the `adapters` library leaves them
    train_layer_norms: bool = added(default=False, neutral=False)
    export_load: ClassVar[str] = "the toolkit: toolkit.methods.adapters.load_adapters({base}, OUT)"

    def incompatible(self, family: str | None, task: Any) -> str | None:
        if family is not None and family not in PLACES:
            return f"bottleneck adapters know the layers of {', '.join(PLACES)}, not '{family}'"
        return None

    def ignores(self, task: Any) -> dict[str, str]:
        if self.bottleneck_size is None:
            return {}
        return {"method.reduction_factor": (f"method.bottleneck_size: {self.bottleneck_size} sizes every adapter "
                                            "and wins over the factor; keep one of the two")}

    def sizes(self) -> dict[str, int]:
        if self.bottleneck_size is not None:
            return {"method.bottleneck_size": self.bottleneck_size}
        return {"method.reduction_factor": self.reduction_factor}  # above the width: a size of 0

    def size_for(self, width: int) -> int:
        """An explicit bottleneck_size wins, so a recipe can match a paper's absolute size."""
        return self.bottleneck_size or max(1, width // self.reduction_factor)

    def places(self, family: str, legacy: bool = False) -> list[tuple[str, str, str | None]]:
        """(pattern, hook kind, child the module must have) of each place this config adapts.
        `legacy`: a pfeiffer folder saved before the AdapterHub placement (the feed-forward
        projection's output, as houlsby's second adapter)."""
        attention, feed_forward = PLACES[family]
        if self.config == "houlsby":
            return [(attention, "output", None), (feed_forward, "output", None)]
        return [(feed_forward, "output", None)] if legacy else [PFEIFFER[family]]

    def targets(self, model: nn.Module, legacy: bool = False,
                saved: bool = False) -> list[tuple[str, nn.Module, str]]:
        """(name, module, hook kind) of every module that gets an adapter, in model order. `saved`:
        a folder's settings, put back as they trained (one saved before an index had to exist in
        every stack adapted only the stacks that have it)."""
        family = model.config.model_type
        if family not in PLACES:
            raise UserError(f"method.name: bottleneck adapters know the layers of {', '.join(PLACES)}, "
                            f"not '{family}'")
        places = [(re.compile(r"(?:.*\.)?" + p), kind, child) for p, kind, child in self.places(family, legacy)]
        found: list[tuple[str, nn.Module, str]] = []
        stacks: dict[str, set[int]] = {}  # each stack of layers (encoder, decoder) -> its layer indices
        for name, module in model.named_modules():
            match = next(((m, kind) for m, kind in ((p.fullmatch(name), kind) for p, kind, child in places
                                                     if child is None or hasattr(module, child)) if m), None)
            if match is None:
                continue
            stacks.setdefault(name[:match[0].start(1)].rstrip("."), set()).add(int(match[0].group(1)))
            if self.layers is None or int(match[0].group(1)) in self.layers:
                found.append((name, module, match[1]))
        if not stacks:
            raise UserError(f"method.name: found no {family} layer to put bottleneck adapters in")
        # `layers` indexes each stack: an index one stack lacks would adapt the others alone
        for stack, seen in stacks.items() if not saved else [("the model", set().union(*stacks.values()))]:
            missing = sorted(set(self.layers or []) - seen)
            if missing:
                sizes = ", ".join(f"{s} 0..{max(n)}" for s, n in stacks.items())
                raise UserError(f"method.layers: {missing[0]} indexes each stack of layers the adapters go in, and "
                                f"the {family} model has {sizes}, so no layer {missing[0]} in {stack}")
        return found

    def inject(self, model: nn.Module, legacy: bool = False, saved: bool = False) -> int:
        """Attach an adapter to every target; returns how many. Refuses a model adapted already."""
        from toolkit.methods._bottleneck import Bottleneck

        targets = self.targets(model, legacy, saved)
        adapted = [name for name, module, _ in targets if hasattr(module, CHILD)]
        if adapted:
            raise UserError(f"{adapted[0]} has a bottleneck adapter already; use a fresh base model")
        moved: set[str] = set()  # layers whose dropout call became hooks on their projections
        for name, module, kind in targets:
            width = _out_width(module, model)
            weight = next(module.parameters())
            adapter = Bottleneck(width, self.size_for(width), self.non_linearity)
            module.add_module(CHILD, adapter.to(device=weight.device, dtype=weight.dtype))
            # after the sub-layer's dropout: the same function in eval mode (folders saved when it
            # read the projection's output load as they were); in training it reads the dropped output
            dropout = _dropout_after(model, name) if kind == "output" else None
            layer = _called_dropout_layer(model, name) if kind == "output" else None
            if dropout is not None:
                dropout.register_forward_hook(functools.partial(_adapt_dropped, module))
            elif layer is not None:
                if layer not in moved:
                    _move_called_dropout(model, layer)
                    moved.add(layer)
            else:
                module.register_forward_hook(HOOKS[kind])
        return len(targets)

    def trained(self, model: nn.Module, heads: list[str]) -> Callable[[str], bool]:
        """Whether a parameter trains: an adapter's, the head's, and with train_layer_norms a
        normalisation layer's of the base (what `save` writes, `load_adapters` puts back)."""
        norms = layer_norm_names(model) if self.train_layer_norms else set()
        return lambda n: is_adapter(n) or is_head(n, heads) or n in norms

    def apply(self, model: nn.Module, ctx: Context) -> nn.Module:
        """Adapters and the task head train; every base weight is frozen, LayerNorms included
        unless train_layer_norms."""
        if ctx.sized:  # a --smoke model's widths are no yardstick: validate bounded the real one's
            name, width = min(((n, _out_width(m, model)) for n, m, _ in self.targets(model)), key=lambda t: t[1])
            check_sizes(self, width, f"the width of layer {name}")
        self.inject(model)
        set_trainable(model, self.trained(model, ctx.head_names))
        return model

    def save(self, model: nn.Module, path: Path) -> None:
        """Adapter and head weights plus our config: megabytes, where the base is hundreds."""
        from safetensors.torch import save_file

        heads = head_names(model)
        keep = self.trained(model, heads)
        tensors = {n: p.detach().cpu().contiguous().clone() for n, p in model.named_parameters() if keep(n)}
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(path / WEIGHTS_FILE))
        info = {"method": self.name, "settings": dataclasses.asdict(self),
                "base_model": getattr(model.config, "_name_or_path", None),
                "model_type": model.config.model_type, "head_names": heads, "placement": PLACEMENT,
                "adapters": sum(1 for n in tensors if is_adapter(n) and n.endswith(".up.weight"))}
        (path / CONFIG_FILE).write_text(json.dumps(info, indent=2) + "\n")

    def load(self, folder: Path, base: Callable[[], nn.Module], whole: Callable[[], nn.Module]) -> nn.Module:
        """The saved adapters re-injected into the run's base model."""
        if (Path(folder) / CONFIG_FILE).is_file():
            return load_adapters(base(), folder)
        return super().load(folder, base, whole)


def load_adapters(base_model: nn.Module, path: str | Path) -> nn.Module:
    """Re-inject saved adapters (and the saved head) into a fresh base model, for inference or
    further training; the base must be the checkpoint they were trained on (see the config)."""
    from safetensors.torch import load_file

    path = Path(path)
    if not (path / CONFIG_FILE).is_file():
        raise UserError(f"{path}: no {CONFIG_FILE} here; point at the model/ folder of an adapters run")
    info = json.loads((path / CONFIG_FILE).read_text())
    method = Adapters(**info["settings"])
    method.inject(base_model, legacy=info.get("placement") != PLACEMENT, saved=True)
    tensors = load_file(str(path / WEIGHTS_FILE))
    current = base_model.state_dict()
    wrong = [k for k, v in tensors.items() if k not in current or current[k].shape != v.shape]
    if wrong:
        raise UserError(f"{path}: saved weight {wrong[0]} does not fit this base model "
                        f"(trained on {info.get('base_model')}, a {info.get('model_type')})")
    result = base_model.load_state_dict(tensors, strict=False)
    norms = layer_norm_names(base_model) if method.train_layer_norms else set()
    lacking = [k for k in result.missing_keys if is_adapter(k) or k in norms]
    if lacking:
        raise UserError(f"{path}: {WEIGHTS_FILE} lacks adapter weight {lacking[0]}")
    heads = info.get("head_names", [])
    set_trainable(base_model, method.trained(base_model, heads))
    return base_model


def layer_norm_names(model: nn.Module) -> set[str]:
    """The parameters of the base's normalisation layers (nn.LayerNorm, T5's RMS T5LayerNorm, any
    `...LayerNorm` / `...RMSNorm` module), adapters' and heads' aside."""
    return {f"{name}.{p}" if name else p for name, module in model.named_modules()
            if type(module).__name__.endswith(("LayerNorm", "RMSNorm")) and not is_adapter(name)
            for p, _ in module.named_parameters(recurse=False)}
