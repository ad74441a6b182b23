"""Sharded training for the one loop: FSDP2 (torch's `fully_shard`) through accelerate, on GPUs and
on CPU processes (gloo), in one place.

accelerate owns FSDP2 here: its `prepare` shards the model (`fsdp2_prepare_model`) and swaps the
optimizer onto the sharded parameters, its `save_state`/`load_state` write and read sharded
checkpoints (torch.distributed.checkpoint), its `clip_grad_norm_` is DTensor-aware. Three things
it leaves undone, which this module does:
- on CPU processes it never turns FSDP on (AcceleratorState makes ACCELERATE_USE_FSDP a
  DistributedType.FSDP only for GPU-like multi-device types; MULTI_CPU stays plain data
  parallel), although everything above is device-agnostic and runs on gloo: `enable` switches it;
- it shards a layer class named in the model's `_no_split_modules` and then the input embeddings
  inside it a second time (BERT's `BertEmbeddings`): the second `fully_shard` sees DTensor
  parameters, takes them for tensor parallelism and fails in `DeviceMesh._concatenate` (the mesh
  has no dimension names): `prepare` leaves such classes to the units accelerate carves itself;
- the values the loop reads (the clipped gradient norm) and the saved model are DTensors: `full`
  and `gathered` make them plain.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Any, Iterator

from toolkit.errors import UserError
from toolkit.lazy import lazy

torch = lazy("torch", globals())


def asked() -> str | None:
    """The sharded strategy this launch asks for (accelerate launch's environment): 'fsdp',
    'deepspeed' or None (plain data parallel or one process)."""
    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
        return "fsdp"
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
        return "deepspeed"
    return None


def check_cpu_launch() -> None:
    """On a machine without GPUs: refuse, before anything is built, a sharded launch that cannot
    run here as what it says."""
    kind = asked()
    if kind == "fsdp":
        if os.environ.get("LOCAL_RANK") is None:
            raise UserError("STRATEGY=fsdp: FSDP needs a distributed launch (accelerate launch or torchrun, "
                            "even for one process); use `make run ... NPROC=2 STRATEGY=fsdp`")
        if os.environ.get("FSDP_VERSION", "1") != "2":
            raise UserError("FSDP_VERSION: on CPU processes the toolkit runs FSDP2 only "
                            "(fsdp_version: 2, as configs/accelerate/fsdp.yaml); FSDP1 needs GPUs")


def enable(accelerator: Any) -> None:
    """Turn accelerate's FSDP on for CPU processes where the launch asked for it (see the module
    docstring); the plugin is read from the launch's FSDP_* environment as accelerate reads it."""
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    if asked() != "fsdp" or accelerator.distributed_type != DistributedType.MULTI_CPU:
        return
    plugin = FullyShardedDataParallelPlugin()
    if accelerator.mixed_precision != "no":
        plugin.set_mixed_precision(accelerator.mixed_precision)
    accelerator.state.fsdp_plugin = plugin
    # both shared states, as AcceleratorState.__init__ does on GPUs (a later AcceleratorState()
    # copies PartialState's over its own)
    accelerator.state.distributed_type = DistributedType.FSDP
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP


def is_fsdp(accelerator: Any) -> bool:
    return getattr(accelerator, "is_fsdp2", False)


def prepare(accelerator: Any, model: torch.nn.Module, *rest: Any) -> tuple:
    """accelerator.prepare(model, *rest); under FSDP2 first the layer classes to shard on their
    own (`wrap_classes`), and after it `generate` made an FSDP forward: it calls the encoder or
    `forward` below the root, whose parameters must be gathered for it."""
    if not is_fsdp(accelerator):
        return accelerator.prepare(model, *rest)
    from torch.distributed.fsdp import register_fsdp_forward_method

    plugin = accelerator.state.fsdp_plugin
    if plugin.transformer_cls_names_to_wrap is None:
        plugin.transformer_cls_names_to_wrap = wrap_classes(model)
    prepared = accelerator.prepare(model, *rest)
    if hasattr(prepared[0], "generate"):
        register_fsdp_forward_method(prepared[0], "generate")
    return prepared


def wrap_classes(model: torch.nn.Module) -> list[str]:
    """Names of the `_no_split_modules` classes whose instances hold none of the carved modules."""
    carved = [m for m in (getattr(model, "get_input_embeddings", lambda: None)(),
                          getattr(model, "get_output_embeddings", lambda: None)()) if m is not None]
    names = set(getattr(model, "_no_split_modules", None) or [])
    keep = set()
    for module in model.modules():
        name = type(module).__name__
        if name in names:
            inside = {id(m) for m in module.modules()}
            if any(id(c) in inside for c in carved):
                continue
            keep.add(name)
    return sorted(keep)


def full(value: Any) -> Any:
    """A DTensor as the plain tensor it stands for (a collective: every process calls it);
    anything else as it is."""
    from torch.distributed.tensor import DTensor

    return value.full_tensor() if isinstance(value, DTensor) else value


@contextmanager
def gathered(model: torch.nn.Module, main: bool) -> Iterator[torch.nn.Module]:
    """The model with plain, whole parameters (on the CPU, in the main process) in place of its
    DTensor shards, for saving with the method's own save (PEFT, transformers); every process
    enters it (each parameter is gathered by all), the shards are put back on exit. One
    parameter at a time is whole on the device; tied parameters stay tied."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    for module in model.modules():  # a root left gathered after its last forward: shards again
        if isinstance(module, FSDPModule):
            module.reshard()
    swapped: list[tuple[torch.nn.Module, str, torch.nn.Parameter]] = []
    whole: dict[int, torch.nn.Parameter] = {}
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if not isinstance(param, DTensor):
                continue
            if id(param) not in whole:
                value = param.full_tensor().detach()
                whole[id(param)] = torch.nn.Parameter(value.cpu() if main else value.new_empty(0),
                                                      requires_grad=param.requires_grad)
            swapped.append((module, name, param))
            module._parameters[name] = whole[id(param)]
    try:
        yield model
    finally:
        for module, name, param in swapped:
            module._parameters[name] = param
