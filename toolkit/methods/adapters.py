"""Bottleneck adapters (Houlsby et al. 2019; Pfeiffer et al. 2020), injected by hand.

No maintained library provides them for transformers 5 (the `adapters` package pins
transformers 4.x and PEFT has none), so this file is a small injection module of our own.

An adapter is `h + up(act(down(h)))` with `up` initialised to zero, so the adapted model starts
exactly equal to the pretrained one. It sits on a sub-block's output *before* that block's
residual add and LayerNorm (Houlsby's placement): we attach it to the sub-block's output
projection as a child module named `bottleneck_adapter` and apply it with a forward hook.
The projection stays the same object with the same parameter names, so code that reads it
(T5 checks `wo.weight.dtype`) and every base state-dict key keep working.

Where they go, per family (`houlsby`: both places; `pfeiffer`: the feed-forward one only):

    family         after attention                     after feed-forward
    bert, roberta  layer.N.attention.output.dense      layer.N.output.dense
    gpt2           h.N.attn.c_proj                     h.N.mlp.c_proj
    bart           layers.N.self_attn.out_proj         layers.N.fc2
    t5             block.N.layer.0.SelfAttention.o     block.N.layer.K.DenseReluDense.wo

In encoder-decoder models both stacks are adapted and `layers` indexes each stack. Decoder
cross-attention (BART `encoder_attn`, T5 `EncDecAttention`) gets no adapter: Houlsby's
attention adapter follows *self*-attention, and AdapterHub's seq2seq configs leave
cross-attention adapters off by default; it also keeps houlsby at exactly two adapters per
layer. Only the adapters and the task head train; `save` writes just those, and
`load_adapters` puts them back into a fresh base model.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Literal

from toolkit.errors import UserError
from toolkit.lazy import lazy
from toolkit.methods import METHODS, Context, Method, is_head, set_trainable
from toolkit.models import BOTTLENECK_CONFIG, head_names

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
CHILD = "bottleneck_adapter"  # the child module name, and the marker of adapter parameters
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


def is_adapter(name: str) -> bool:
    """Whether a parameter name belongs to an injected adapter (what trains and is saved)."""
    return f".{CHILD}." in f".{name}"


def _out_width(module: nn.Module) -> int:
    """Output features of a Linear, or of GPT-2's Conv1D (whose weight is (in, out))."""
    if isinstance(module, nn.Linear):
        return module.out_features
    if hasattr(module, "nf"):
        return int(module.nf)
    raise TypeError(f"cannot tell the output width of {type(module).__name__}")


@METHODS.register("adapters")
@dataclass
class Adapters(Method):
    """Settings of the bottleneck adapters; `apply` freezes the base and trains adapters + head."""

    config: Literal["houlsby", "pfeiffer"] = "houlsby"  # houlsby: after attention and feed-forward; pfeiffer: feed-forward only
    reduction_factor: int = field(default=16, metadata={"min": 1})
    bottleneck_size: int | None = field(default=None, metadata={"min": 1})  # wins over the factor
    non_linearity: Literal["relu", "gelu", "swish", "silu", "tanh"] = "relu"
    layers: list[int] | None = field(default=None, metadata={"min": 0, "min_items": 1})  # layer indices to adapt (each stack); None = all
    export_load: ClassVar[str] = "the toolkit: toolkit.methods.adapters.load_adapters({base}, OUT)"

    def incompatible(self, family: str | None, task: Any) -> str | None:
        if family is not None and family not in PLACES:
            return f"bottleneck adapters know the layers of {', '.join(PLACES)}, not '{family}'"
        return None

    def size_for(self, width: int) -> int:
        """An explicit bottleneck_size wins, so a recipe can match a paper's absolute size."""
        return self.bottleneck_size or max(1, width // self.reduction_factor)

    def targets(self, model: nn.Module) -> list[tuple[str, nn.Module]]:
        """(name, module) of every output projection that gets an adapter, in model order."""
        family = model.config.model_type
        if family not in PLACES:
            raise UserError(f"method.name: bottleneck adapters know the layers of {', '.join(PLACES)}, "
                            f"not '{family}'")
        places = PLACES[family] if self.config == "houlsby" else PLACES[family][1:]
        patterns = [re.compile(r"(?:.*\.)?" + p) for p in places]
        found, seen = [], set()
        for name, module in model.named_modules():
            match = next((m for m in (p.fullmatch(name) for p in patterns) if m), None)
            if match is None:
                continue
            seen.add(int(match.group(1)))
            if self.layers is None or int(match.group(1)) in self.layers:
                found.append((name, module))
        if not seen:
            raise UserError(f"method.name: found no {family} layer to put bottleneck adapters in")
        missing = sorted(set(self.layers or []) - seen)
        if missing:
            raise UserError(f"method.layers: the {family} model has layers 0..{max(seen)}, "
                            f"so no layer {missing[0]}")
        return found

    def inject(self, model: nn.Module) -> int:
        """Attach an adapter to every target; returns how many. Refuses a model adapted already."""
        from toolkit.methods._bottleneck import Bottleneck

        targets = self.targets(model)
        adapted = [name for name, module in targets if hasattr(module, CHILD)]
        if adapted:
            raise UserError(f"{adapted[0]} has a bottleneck adapter already; use a fresh base model")
        for _, module in targets:
            width = _out_width(module)
            weight = next(module.parameters())
            adapter = Bottleneck(width, self.size_for(width), self.non_linearity)
            module.add_module(CHILD, adapter.to(device=weight.device, dtype=weight.dtype))
            module.register_forward_hook(_adapt_output)
        return len(targets)

    def apply(self, model: nn.Module, ctx: Context) -> nn.Module:
        """Adapters and the task head train; every base weight, LayerNorms included, is frozen."""
        self.inject(model)
        set_trainable(model, lambda n: is_adapter(n) or is_head(n, ctx.head_names))
        return model

    def save(self, model: nn.Module, path: Path) -> None:
        """Adapter and head weights plus our config: megabytes, where the base is hundreds."""
        from safetensors.torch import save_file

        heads = head_names(model)
        tensors = {n: p.detach().cpu().contiguous().clone() for n, p in model.named_parameters()
                   if is_adapter(n) or is_head(n, heads)}
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(path / WEIGHTS_FILE))
        info = {"method": self.name, "settings": dataclasses.asdict(self),
                "base_model": getattr(model.config, "_name_or_path", None),
                "model_type": model.config.model_type, "head_names": heads,
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
    method.inject(base_model)
    tensors = load_file(str(path / WEIGHTS_FILE))
    current = base_model.state_dict()
    wrong = [k for k, v in tensors.items() if k not in current or current[k].shape != v.shape]
    if wrong:
        raise UserError(f"{path}: saved weight {wrong[0]} does not fit this base model "
                        f"(trained on {info.get('base_model')}, a {info.get('model_type')})")
    result = base_model.load_state_dict(tensors, strict=False)
    lacking = [k for k in result.missing_keys if is_adapter(k)]
    if lacking:
        raise UserError(f"{path}: {WEIGHTS_FILE} lacks adapter weight {lacking[0]}")
    heads = info.get("head_names", [])
    set_trainable(base_model, lambda n: is_adapter(n) or is_head(n, heads))
    return base_model
