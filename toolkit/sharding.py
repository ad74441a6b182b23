"""Sharded training for the one loop: FSDP2 (torch's `fully_shard`) on GPUs and on CPU processes
(gloo), in one place.

accelerate owns most of FSDP2 here: its `prepare` swaps the optimizer onto the sharded
parameters, its `save_state`/`load_state` write and read sharded checkpoints
(torch.distributed.checkpoint), its `clip_grad_norm_` is DTensor-aware. What it leaves undone or
gets wrong for the toolkit's models, this module does:
- on CPU processes it never turns FSDP on (AcceleratorState makes ACCELERATE_USE_FSDP a
  DistributedType.FSDP only for GPU-like multi-device types; MULTI_CPU stays plain data
  parallel), although everything above is device-agnostic and runs on gloo: `enable` switches it;
- its wrapping (`fsdp2_prepare_model`, accelerate 1.15) fails on two families: it shards BERT's
  `BertEmbeddings` (named in `_no_split_modules`) and then the word embeddings inside it a second
  time, where `fully_shard` takes the DTensor parameters for tensor parallelism and fails in
  `DeviceMesh._concatenate` ("value was None": the default mesh has no dimension names); and it
  groups T5's tied `shared` and `lm_head` but leaves `encoder.embed_tokens`, which holds the same
  parameter, to the root ("shared with a parameter already managed by another FSDP group").
  `shard` wraps by one rule instead: a unit holds every module that holds any of its parameters;
- the values the loop reads (the clipped gradient norm) and the saved model are DTensors: `full`
  and `gathered` make them plain.
DeepSpeed (ZeRO-2/3) runs through accelerate's plugin, on GPUs and (`enable`, as for FSDP) on CPU
processes, where accelerate leaves it off; here are the checks of what its engine would not honour
and the gathering of ZeRO-3's partitions for the saved model.
"""

from __future__ import annotations

import atexit
import importlib.util
import itertools
import json
import logging
import os
import sys
from contextlib import contextmanager
from typing import Any, Iterator

from toolkit import runs
from toolkit.errors import UserError
from toolkit.lazy import lazy
from toolkit.methods import Method

torch = lazy("torch", globals())


def asked() -> str | None:
    """The sharded strategy this launch asks for (accelerate launch's environment, as
    `runs.strategy` names it): 'fsdp', 'deepspeed' (any ZeRO stage) or None (plain data parallel
    or one process)."""
    way = runs.strategy()
    return "deepspeed" if way.startswith("zero") else None if way in runs.NEUTRAL_STRATEGIES else way


def check_cpu_launch() -> None:
    """On a machine without GPUs: refuse, before anything is built, a sharded launch that cannot
    run here as what it says."""
    kind = asked()
    if kind == "deepspeed" and os.environ.get("LOCAL_RANK") is None:
        raise UserError("STRATEGY=zero2/zero3: DeepSpeed needs a distributed launch (accelerate launch, even "
                        "for one process); use `make run ... NPROC=2 STRATEGY=zero2`")
    if kind == "deepspeed" and importlib.util.find_spec("deepspeed") is None:
        raise UserError("STRATEGY=zero2/zero3: DeepSpeed is not installed; pip install -e '.[deepspeed]'")
    if kind == "fsdp":
        if os.environ.get("LOCAL_RANK") is None:
            raise UserError("STRATEGY=fsdp: FSDP needs a distributed launch (accelerate launch or torchrun, "
                            "even for one process); use `make run ... NPROC=2 STRATEGY=fsdp`")
        if os.environ.get("FSDP_VERSION", "1") != "2":
            raise UserError("FSDP_VERSION: on CPU processes the toolkit runs FSDP2 only "
                            "(fsdp_version: 2, as configs/accelerate/fsdp.yaml); FSDP1 needs GPUs")
        # torch's offload policy moves shards between an accelerator and the host: on CPU processes
        # it failed deep in fully_shard ("Cannot access accelerator device when none is available")
        if os.environ.get("FSDP_OFFLOAD_PARAMS", "false").lower() == "true":
            raise UserError("fsdp_offload_params: true offloads to the CPU from a GPU; on CPU processes the "
                            "parameters are on the CPU already: use fsdp_offload_params: false "
                            "(as configs/accelerate/fsdp.yaml)")


def enable(accelerator: Any, recipe: Any) -> None:
    """Turn accelerate's FSDP on for CPU processes where the launch asked for it (see the module
    docstring; the plugin is read from the launch's FSDP_* environment as accelerate reads it),
    and refuse what the strategy cannot run as the recipe asks (`unsupported`, `deepspeed_conflict`)."""
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    if asked() == "fsdp" and accelerator.distributed_type == DistributedType.MULTI_CPU:
        plugin = FullyShardedDataParallelPlugin()
        if accelerator.mixed_precision != "no":
            plugin.set_mixed_precision(accelerator.mixed_precision)
        accelerator.state.fsdp_plugin = plugin
        # both shared states, as AcceleratorState.__init__ does on GPUs (a later AcceleratorState()
        # copies PartialState's over its own)
        accelerator.state.distributed_type = DistributedType.FSDP
        _set_launch_kind(DistributedType.FSDP)
    if asked() == "deepspeed" and accelerator.distributed_type == DistributedType.MULTI_CPU:
        _deepspeed_on_cpu(accelerator)
    kind = accelerator.distributed_type
    if kind == DistributedType.FSDP and not is_fsdp(accelerator):
        raise UserError("fsdp_version: the toolkit runs FSDP2 only (fsdp_version: 2, as configs/accelerate/fsdp.yaml)")
    why = unsupported(recipe.method) if kind in (DistributedType.FSDP, DistributedType.DEEPSPEED) else None
    if why:
        raise UserError(f"method.name: '{recipe.method.name}' under {kind.value}: {why}; run it without STRATEGY")
    if kind == DistributedType.DEEPSPEED:
        plugin = accelerator.state.deepspeed_plugin
        deepspeed_conflict(recipe.train, plugin, accelerator.num_processes)
        # the loop's batches come from a batch sampler (length buckets), whose loader has no
        # batch_size for accelerate to read: the recipe says it (left out of a file with a
        # train_batch_size, DeepSpeed would derive its own)
        if plugin.deepspeed_config.get("train_micro_batch_size_per_gpu", "auto") == "auto":
            plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = recipe.train.batch_size
        buckets_from_the_model(plugin.deepspeed_config)


# DeepSpeed's sizes that transformers' DeepSpeed guide sets "auto" (accelerate then sizes them from
# the model's hidden size: h*h, 0.9*h*h, 10*h); a key a config leaves out gets DeepSpeed's default
BUCKETS = ("reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold")


def buckets_from_the_model(config: dict) -> None:
    """A DeepSpeed config that leaves the bucket sizes out (accelerate's YAML route always does:
    its `deepspeed_config` keys cannot name them) gets them as "auto", for accelerate to size from
    the model. Left out, ZeRO-3 allocates DeepSpeed's default gradient bucket, 5e8 elements (2 GB in
    fp32), whatever the model: on an H100 a gpt2 LoRA run under ZeRO-3 peaked at 2852 MB against
    the plain run's 799-853 (2026-11-27). Sizes a config gives are kept."""
    zero = config.setdefault("zero_optimization", {})
    for key in BUCKETS if int(zero.get("stage", 0) or 0) == 3 else BUCKETS[:1]:
        zero.setdefault(key, "auto")


_GROUP_ENDED_AT_EXIT: list[bool] = []


def end_group_at_exit() -> None:
    """The process group accelerate started (a torchrun/`accelerate launch` process) destroyed at
    the interpreter's exit, while Python is still whole: left to the interpreter's finalization,
    gloo's worker threads still held work whose tensors reached back into Python, and a process
    that had finished its run and written every file aborted there ('terminate called without an
    active exception', SIGABRT): the launch ended with exit 1, a finished run reported as a
    crash. Registered once per process (several runs in one process share the group); a no-op
    where the group is gone already or was never started (one process)."""
    if _GROUP_ENDED_AT_EXIT or not torch.distributed.is_available() or not torch.distributed.is_initialized():
        return
    _GROUP_ENDED_AT_EXIT.append(True)
    atexit.register(_end_group)


def _end_group() -> None:
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


_LAUNCH_KIND: dict[str, Any] = {}  # PartialState's distributed_type as the launch made it, once changed


def _set_launch_kind(kind: Any) -> None:
    """PartialState's kind of launch set to FSDP or DeepSpeed on CPU processes (accelerate's own
    says MULTI_CPU there), the launch's own kept for `restore_launch_kind`."""
    from accelerate.state import PartialState

    _LAUNCH_KIND.setdefault("distributed_type", PartialState._shared_state["distributed_type"])
    PartialState._shared_state["distributed_type"] = kind


def restore_launch_kind() -> None:
    """Before the next run in the same process: PartialState as the launch made it. Left as the
    last run set it, a second `toolkit.run` in one CPU FSDP launch was refused ('fsdp_version:
    the toolkit runs FSDP2 only'), and under ZeRO-3 it raised an AttributeError: accelerate
    took the kind for its own and skipped setting the plugin up."""
    from accelerate.state import PartialState

    if "distributed_type" in _LAUNCH_KIND and PartialState._shared_state:
        PartialState._shared_state["distributed_type"] = _LAUNCH_KIND.pop("distributed_type")


def _deepspeed_on_cpu(accelerator: Any) -> None:
    """DeepSpeed on CPU processes, which accelerate leaves plain data parallel (AcceleratorState
    turns ACCELERATE_USE_DEEPSPEED into DistributedType.DEEPSPEED only when not on the CPU):
    DeepSpeed's own CPU accelerator runs ZeRO over torch.distributed's gloo group that accelerate
    has started; its plugin is read from the launch's environment as accelerate reads it.
    DeepSpeed's shared-memory all-reduce kernel (`deepspeed_shm_comm`) would be JIT-compiled with
    ninja at start-up (minutes on a small machine): the collectives go through gloo instead, as
    DeepSpeed itself does where that op is not compatible."""
    import_deepspeed()
    import deepspeed.ops
    from accelerate.utils import DeepSpeedPlugin, DistributedType
    from deepspeed import comm

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # DeepSpeed's own switch for it
    if not comm.is_initialized():
        comm.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    plugin = DeepSpeedPlugin()
    plugin.set_mixed_precision(accelerator.mixed_precision)
    plugin.select(_from_accelerator_state=True)
    state = accelerator.state
    state.deepspeed_plugins = plugin
    state._mixed_precision = "no"  # DeepSpeed casts itself, from its config (as AcceleratorState sets)
    state.distributed_type = DistributedType.DEEPSPEED
    _set_launch_kind(DistributedType.DEEPSPEED)


def import_deepspeed() -> Any:
    """The `deepspeed` module, imported with what its import sets in the process put back: its
    `__init__` sets PYTORCH_NVML_BASED_CUDA_CHECK=1 in os.environ and its LoggerFactory gives the
    "DeepSpeed" logger a level, a stdout handler and propagate False. Left so, the first run of a
    process (or of the Python API) ran without them and every later one with them: the
    environment a sweep's child process or a launch inherits and the way DeepSpeed's records went
    depended on whether an earlier run had imported DeepSpeed. Every variable the import sets or
    changes is put back, and each logger that existed before gets its level, handlers and
    propagation back (quiet's filters stay on it); one imported already is returned as it is."""
    if "deepspeed" in sys.modules:
        return sys.modules["deepspeed"]
    env = dict(os.environ)
    loggers = {name: (logger.level, logger.propagate, list(logger.handlers))
               for name, logger in [("", logging.getLogger()), *logging.root.manager.loggerDict.items()]
               if isinstance(logger, logging.Logger)}
    try:
        import deepspeed
    finally:
        for key in [k for k in os.environ if k not in env]:
            del os.environ[key]
        os.environ.update({k: v for k, v in env.items() if os.environ.get(k) != v})
        for name, (level, propagate, handlers) in loggers.items():
            logger = logging.getLogger(name or None)
            logger.setLevel(level)
            logger.propagate = propagate
            logger.handlers[:] = handlers
    return deepspeed


def import_deepspeed_if_asked() -> None:
    """Under a DeepSpeed launch, `import_deepspeed` before the Accelerator is made: accelerate's
    AcceleratorState imports it (deepspeed.comm) and would leave what the import sets."""
    if asked() == "deepspeed" and importlib.util.find_spec("deepspeed") is not None:
        import_deepspeed()


# the accelerate-config keys accelerate refuses beside `deepspeed_config_file` (its
# DeepSpeedPlugin._deepspeed_config_checks: they "will be ignored"), as the launch names them in
# ACCELERATE_CONFIG_DS_FIELDS
FILE_OVERRIDES = ("gradient_accumulation_steps", "gradient_clipping", "zero_stage", "offload_optimizer_device",
                  "offload_param_device", "offload_param_nvme_path", "offload_optimizer_nvme_path",
                  "zero3_save_16bit_model", "mixed_precision")


def check_deepspeed_file(train: Any) -> None:
    """Before the Accelerator is made (accelerate's own ValueError there was a traceback): a
    DeepSpeed launch with a config file (`deepspeed_config_file:`) that accelerate would refuse,
    in one line naming the file and the key: a key of the accelerate config beside the file, or
    the file enabling one half precision under a recipe of the other."""
    path = os.environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE", "none")
    if asked() != "deepspeed" or path == "none":
        return
    fields = [f for f in os.environ.get("ACCELERATE_CONFIG_DS_FIELDS", "").split(",") if f in FILE_OVERRIDES]
    if fields:
        raise UserError(f"{fields[0]}: in the accelerate config beside deepspeed_config_file: {path}, which accelerate "
                        f"takes alone; remove {fields[0]} from the accelerate config ("
                        + ("train.mixed_precision decides the precision" if fields[0] == "mixed_precision"
                           else f"set it in {path}") + ")")
    try:
        config = json.loads(open(path, encoding="utf-8").read())
    except (OSError, ValueError):
        return  # not a readable JSON file: accelerate's own message
    for dtype in ("fp16", "bf16"):
        section = config.get(dtype) if isinstance(config, dict) else None
        if isinstance(section, dict) and str(section.get("enabled", "")).lower() == "true" \
                and train.mixed_precision != dtype:
            raise UserError(f"{dtype}.enabled: true in the DeepSpeed config {path}, but train.mixed_precision is "
                            f"{train.mixed_precision}: its engine would train in {dtype} under the recipe's "
                            f"precision; set it to \"auto\" (the recipe decides) or train.mixed_precision: {dtype}")


def deepspeed_conflict(train: Any, plugin: Any, processes: int = 1) -> None:
    """Under accelerate's DeepSpeed the engine steps inside `accelerator.backward` (clipping with
    its own config's gradient_clipping, at every micro-batch the loop hands it): settings the loop
    would otherwise honour and DeepSpeed would not are refused in one line."""
    clip = plugin.deepspeed_config.get("gradient_clipping", 0.0)
    own = plugin.deepspeed_config.get("gradient_accumulation_steps", 1)
    if own not in (1, "1", "auto", None):  # a config file's (accelerate launch's flag is refused with the env)
        raise UserError(f"gradient_accumulation_steps: {own} in the DeepSpeed config: its engine would scale every "
                        f"loss by 1/{own} for an accumulation the loop does not do (each micro-batch is an optimizer "
                        f"step here), so the gradients, their logged norm and what train.max_grad_norm clips would be "
                        f"1/{own} of the run's; set it to 1 or \"auto\", and raise train.batch_size for a larger batch")
    for dtype in ("fp16", "bf16"):  # accelerate fills "auto" from the run's precision, keeps a value as written
        section = plugin.deepspeed_config.get(dtype)
        if isinstance(section, dict) and str(section.get("enabled", "")).lower() == "true" \
                and train.mixed_precision != dtype:
            raise UserError(f"{dtype}.enabled: true in the DeepSpeed config, but train.mixed_precision is "
                            f"{train.mixed_precision}: its engine would train in {dtype} under the recipe's "
                            f"precision; set it to \"auto\" (the recipe decides) or train.mixed_precision: {dtype}")
    for section, whose in (("optimizer", "AdamW (train.lr, train.weight_decay)"),
                           ("scheduler", "learning-rate schedule (train.warmup_steps, the linear decay)")):
        if section in plugin.deepspeed_config:  # accelerate's ValueError at prepare, a traceback
            raise UserError(f"{section}: in the DeepSpeed config; the run's {whose} is the recipe's: remove "
                            f"the {section} section")
    micro = plugin.deepspeed_config.get("train_micro_batch_size_per_gpu")
    if micro not in (None, "auto") and micro != train.batch_size:  # the engine's, while the loop feeds the recipe's
        raise UserError(f"train_micro_batch_size_per_gpu: {micro} in the DeepSpeed config, but each process's batch "
                        f"is train.batch_size: {train.batch_size}; set it to \"auto\" or {train.batch_size}")
    whole = plugin.deepspeed_config.get("train_batch_size")
    if whole not in (None, "auto") and whole != train.batch_size * processes:  # accelerate keeps a written value
        raise UserError(f"train_batch_size: {whole} in the DeepSpeed config, but the run's batch is train.batch_size "
                        f"{train.batch_size} x {processes} process(es) = {train.batch_size * processes}; set it to "
                        f"\"auto\" or {train.batch_size * processes}, or change train.batch_size")
    if train.grad_accum != 1:
        raise UserError(f"train.grad_accum: {train.grad_accum} under DeepSpeed, whose engine steps at every "
                        "micro-batch here; use train.grad_accum: 1 with a larger train.batch_size")
    if float(clip or 0.0) != float(train.max_grad_norm or 0.0):
        raise UserError(f"train.max_grad_norm: {train.max_grad_norm}, but the DeepSpeed config clips at "
                        f"{clip} (gradient_clipping); make them equal")
    if train.skip_nonfinite:
        raise UserError("train.skip_nonfinite: DeepSpeed has stepped before the loop sees a non-finite "
                        "gradient; use 0 (the run stops instead)")


def unsupported(method: Any) -> str | None:
    """Why FSDP or DeepSpeed cannot run this method, or None. A method that trains nothing has
    nothing to shard (its evaluation would run whole on every process); a method with hooks of its
    own between steps (an extra loss, a per-step update, state beside the weights: AdaLoRA) reads
    and writes whole parameters and their gradients outside the forward pass, where FSDP and ZeRO
    hold only shards (ZeRO-2: of the gradients; ZeRO-3 and FSDP: of the parameters too)."""
    if not method.trains:
        return "it trains nothing, so there is nothing to shard (evaluation would run whole on every process)"
    hooks = [n for n in ("extra_loss", "after_step", "skipped_step", "state_dict")
             if getattr(type(method), n) is not getattr(Method, n)]
    if hooks:
        return (f"its {', '.join(hooks)} read whole parameters and gradients between steps, where a "
                "sharded run holds only shards")
    return None


def is_fsdp(accelerator: Any) -> bool:
    return bool(getattr(accelerator, "is_fsdp2", False))


def prepare(accelerator: Any, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *rest: Any) -> tuple:
    """accelerator.prepare(model, optimizer, *rest); under FSDP2 the model is sharded here first
    (`shard`) and the optimizer moved onto the sharded parameters, so accelerate's own swap finds
    nothing left to do; `generate` is made an FSDP forward (it calls the encoder or `forward`
    below the root, whose parameters must be gathered for it)."""
    if not is_fsdp(accelerator):
        return accelerator.prepare(model, optimizer, *rest)
    from torch.distributed.fsdp import register_fsdp_forward_method
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    plugin = accelerator.state.fsdp_plugin
    if plugin.activation_checkpointing or plugin.cpu_ram_efficient_loading:
        raise UserError("fsdp_activation_checkpointing / fsdp_cpu_ram_efficient_loading: not run by the "
                        "toolkit's sharding; use train.gradient_checkpointing, and load as usual")
    if plugin.auto_wrap_policy is not transformer_auto_wrap_policy:
        raise UserError("fsdp_auto_wrap_policy: the toolkit shards by transformer layer "
                        "(TRANSFORMER_BASED_WRAP, as configs/accelerate/fsdp.yaml)")
    plugin.set_auto_wrap_policy(model)  # resolves the layer names while the classes have them
    names = {id(p): n for n, p in model.named_parameters()}
    shard(model, plugin, accelerator.mixed_precision)
    sharded = dict(model.named_parameters())
    for group in optimizer.param_groups:
        group["params"] = [sharded[names[id(p)]] for p in group["params"]]
    prepared = accelerator.prepare(model, optimizer, *rest)
    if hasattr(prepared[0], "generate"):
        register_fsdp_forward_method(prepared[0], "generate")
    return prepared


def shard(model: torch.nn.Module, plugin: Any, mixed_precision: str = "no") -> None:
    """fully_shard as accelerate's `fsdp2_prepare_model` does (one unit per transformer layer of
    the model's `_no_split_modules`, the embeddings carved out, then the root), under one rule: a
    unit takes every module that holds any of its parameters (tied weights), and a layer that
    shares a parameter with a module outside it is left to the root."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    kwargs = {"reshard_after_forward": plugin.reshard_after_forward, "offload_policy": plugin.cpu_offload,
              "mp_policy": plugin.mixed_precision_policy or MixedPrecisionPolicy()}
    if mixed_precision != "no":  # FSDP2 keeps fp32 masters; the policy casts for compute
        for param in model.parameters():
            if param.requires_grad and param.dtype != torch.float32:
                param.data = param.data.float()
    holders = _holders(model)
    layers = set(plugin.transformer_cls_names_to_wrap or getattr(model, "_no_split_modules", None) or [])
    for module in reversed(list(model.modules())):  # children before their parents
        if module is not model and type(module).__name__ in layers and _self_contained(module, holders):
            fully_shard(module, **kwargs)
    emb = getattr(model, "get_input_embeddings", lambda: None)()
    out = getattr(model, "get_output_embeddings", lambda: None)()
    carved: set[int] = set()
    for seed, keep in ((emb, kwargs["reshard_after_forward"]), (out, False)):  # the head is used last
        if seed is None or id(seed) in carved or _any_sharded([seed]):  # inside a layer's unit already
            continue
        group = _tied_group(seed, holders)
        if not _any_sharded(group):
            if out is not None and id(out) in {id(m) for m in group}:
                keep = False
            fully_shard(group, **{**kwargs, "reshard_after_forward": keep})
            carved |= {id(m) for m in group}
    fully_shard(model, **{k: v for k, v in kwargs.items() if k != "reshard_after_forward"})


def _holders(model: torch.nn.Module) -> dict[int, list[torch.nn.Module]]:
    """id(parameter or module) -> the modules holding it directly: more than one for a tied
    weight, or a module reachable by two paths (PEFT's prompt methods keep the word embeddings
    as an attribute of their own)."""
    found: dict[int, list[torch.nn.Module]] = {}
    for module in model.modules():
        for child in [*module._parameters.values(), *module._modules.values()]:
            if child is not None:
                found.setdefault(id(child), []).append(module)
    return found


def _self_contained(module: torch.nn.Module, holders: dict[int, list[torch.nn.Module]]) -> bool:
    """Whether nothing outside `module` holds one of its parameters or submodules."""
    inside = {id(m) for m in module.modules()}
    held = [*module.parameters(), *(m for m in module.modules() if m is not module)]
    return all(id(h) in inside for x in held for h in holders[id(x)])


def _tied_group(seed: torch.nn.Module, holders: dict[int, list[torch.nn.Module]]) -> list[torch.nn.Module]:
    """`seed` and every module holding one of its parameters, and theirs in turn."""
    group, todo = {id(seed): seed}, [seed]
    while todo:
        for param in todo.pop().parameters():
            for holder in holders[id(param)]:
                if id(holder) not in group:
                    group[id(holder)] = holder
                    todo.append(holder)
    return list(group.values())


def _any_sharded(modules: list[torch.nn.Module]) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for m in modules for p in m.parameters())


def full(value: Any, device: Any = None) -> Any:
    """A DTensor as the plain tensor it stands for (a collective: every process calls it); a
    number (DeepSpeed's gradient norm) as a tensor on `device`; anything else as it is."""
    from torch.distributed.tensor import DTensor

    if isinstance(value, DTensor):
        return value.full_tensor()
    if isinstance(value, (int, float)):
        return torch.tensor(float(value), device=device)
    return value


def save_names_as_loaded(model: torch.nn.Module) -> None:
    """The weight renamings `save_pretrained` reverts (transformers 5: `_weight_conversions`) cut
    to those the load used, as a plain load keeps them. transformers' ZeRO-3 load
    (`_load_state_dict_into_zero3_model`) keeps every registered one, used or not, among them the
    legacy `LayerNorm.gamma/beta` -> `weight/bias`: a BERT or RoBERTa saved after a ZeRO-3 run
    (full, bitfit, freeze) named its LayerNorms `gamma`/`beta`, unlike the same run's save
    without sharding (transformers reads both back alike; other readers of the file do not)."""
    for module in model.modules():
        kept = getattr(module, "_weight_conversions", None)
        if kept and all(hasattr(c, "was_used") for c in kept):
            module._weight_conversions = [c for c in kept if c.was_used()]


@contextmanager
def gathered(model: torch.nn.Module, main: bool) -> Iterator[torch.nn.Module]:
    """The model with plain, whole parameters (on the CPU, in the main process) in place of its
    DTensor shards, for saving with the method's own save (PEFT, transformers); every process
    enters it (each parameter is gathered by all), the shards are put back on exit. One
    parameter at a time is whole on the device; tied parameters stay tied. ZeRO-3's partitions:
    whole on every process while inside, as DeepSpeed gathers them."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    if any(hasattr(p, "ds_id") for p in model.parameters()):  # DeepSpeed ZeRO-3: its own gathering
        deepspeed = import_deepspeed()

        save_names_as_loaded(model)

        with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=None):
            yield model
        return
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


# --- resuming a checkpoint under the launch that wrote it ------------------------------------
def written_under(folder: Any) -> tuple[str, int]:
    """(strategy, processes) a checkpoint folder was written under, read from accelerate's layout
    of it: FSDP's `pytorch_model_fsdp_0/` (torch.distributed.checkpoint; `pytorch_model_fsdp.bin`
    or `pytorch_model_fsdp_rank<r>.bin` under another fsdp_state_dict_type), DeepSpeed's
    engine folder `pytorch_model/` (ZeRO-3 writes one `zero_pp_rank_*_model_states.pt` per rank,
    ZeRO-1/2 one `mp_rank_00_model_states.pt`), else plain weights; one `random_states_<rank>.pkl`
    per process. Read from the files, it holds for checkpoints written before it was asked."""
    from pathlib import Path

    folder = Path(folder)
    processes = len(list(folder.glob("random_states_*.pkl")))
    if any(folder.glob("pytorch_model_fsdp*")):  # fsdp_state_dict_type SHARDED (a folder), FULL or LOCAL
        return "fsdp", processes
    engine = folder / "pytorch_model"
    if engine.is_dir():
        return ("zero3" if any(engine.glob("zero_pp_rank_*_model_states.pt")) else "zero2"), processes
    return ("ddp" if processes > 1 else "no strategy"), processes


def launched_as(accelerator: Any) -> tuple[str, int]:
    """(strategy, processes) of this launch, named as `written_under` names a checkpoint's."""
    kind = accelerator.distributed_type.value
    if kind == "FSDP":
        return "fsdp", accelerator.num_processes
    if kind == "DEEPSPEED":
        stage = int(accelerator.state.deepspeed_plugin.zero_stage or 0)
        return ("zero3" if stage == 3 else "zero2"), accelerator.num_processes
    return ("ddp" if accelerator.num_processes > 1 else "no strategy"), accelerator.num_processes


def check_resume(accelerator: Any, folder: Any) -> None:
    """A checkpoint resumes under the strategy and process count that wrote it, or not at all: the
    loaders read only their own layout (an FSDP checkpoint under ZeRO-2 failed with a bare
    AssertionError inside DeepSpeed's loader, a DDP one under FSDP with a missing file), and a
    sharded checkpoint is cut per rank. The run id holds the process count and a sharded strategy
    (runs.run_id), but a run made before the strategy was in it sits at the plain launch's id,
    where that launch finds its checkpoints: one line naming both."""
    then, now = written_under(folder), launched_as(accelerator)
    if then[1] and then != now:  # (no RNG file: not accelerate's layout; its loader judges it)
        def say(s: tuple[str, int]) -> str:
            return f"STRATEGY={s[0]} on {s[1]} process(es)" if s[0] != "no strategy" else "1 plain process"
        raise UserError(f"{folder}: written under {say(then)}, but this launch is {say(now)}; a checkpoint "
                        f"resumes only under the launch that wrote it: relaunch as it was (NPROC={then[1]}"
                        f"{'' if then[0] == 'no strategy' else ' STRATEGY=' + then[0]}), or --force to start "
                        "this run again from step 0")


# --- commands under a launch of several processes --------------------------------------------
SHARED_ACROSS_PROCESSES = ("run", "sweep", "eval")  # split their work over a launch's processes


def check_command(command: str) -> None:
    """Under a launch of several processes (torchrun, accelerate launch, `make ... NPROC=2`) only
    the commands that split their work over the processes run (training, a sweep's runs,
    evaluation: gathered, written once). Any other does its whole job in every process: `predict`
    to standard output printed every prediction once per process, exit 0; `export` and `cp`
    wrote the same folder from every process at once. Refused in one line instead; so is `eval`
    under FSDP or DeepSpeed, which it would run as plain data parallel under their name."""
    processes = runs.world_size()
    if command == "eval" and asked():  # (`run` and `sweep`'s runs shard; `eval` would not)
        raise UserError(f"toolkit eval: under STRATEGY={'fsdp' if asked() == 'fsdp' else 'zero2/zero3'} it would "
                        "run the whole model in every process (data parallel, not sharded; on GPUs accelerate's "
                        "own FSDP wrapping, which fails on BERT and T5); launch it with STRATEGY=ddp or in one process: "
                        "the saved model of a sharded run is a plain folder")
    if processes > 1 and command not in SHARED_ACROSS_PROCESSES:
        raise UserError(f"toolkit {command}: runs in one process, and this launch has {processes} "
                        f"(WORLD_SIZE={processes}); run it without torchrun / accelerate launch (or NPROC=1); "
                        f"under a launch only {', '.join(SHARED_ACROSS_PROCESSES)} split their work over the processes")



def check_api_writer(function: str, what: str) -> None:
    """The Python API's `export` and `report` write one folder or file (`what`); in a script under
    a launch of several processes (torchrun, accelerate launch) each process that calls them
    writes it, all at once: `toolkit.export` on 2 gloo processes wrote the folder from one and
    failed in the other with a bare `OSError: [Errno 39] Directory not empty` (or both wrote the
    same files). Such a call is rank 0's: in any other process it is one line (the CLI's command
    is every process's, and refused whole: `check_command`)."""
    processes, rank = runs.world_size(), runs.rank()
    if processes > 1 and rank != 0:
        raise UserError(f"toolkit.{function}: writes {what} once, and this is process {rank} of a launch of "
                        f"{processes} (RANK={rank}); call it from rank 0 alone (if os.environ.get('RANK', '0') "
                        "== '0'), or outside the launch")

# What a collective raises in a process whose peer has gone (gloo's TCP pair, NCCL's abort): the
# peer stopped first, on its own error (said on its own line), a signal or a crash.
PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
             "NCCL communicator was aborted", "remote process exiting prematurely")


def peer_stopped(exc: BaseException) -> str | None:
    """Under a launch of several processes, the one line for a collective that failed because
    another process of the launch stopped; None for any other exception. The process that
    stopped first said why on its own line (a user error, a full disk), and this one's traceback
    (gloo's `Connection closed by peer` from a barrier, 40 lines per process) buried it."""
    if runs.world_size() < 2 or not isinstance(exc, RuntimeError):
        return None
    if not any(marker in str(exc) for marker in PEER_GONE):
        return None
    return (f"process {runs.rank()} of {runs.world_size()} stopped with the launch: another of its processes "
            "stopped first (its own `error:` line, or the launcher's report of its exit, says why)")


_ASKED = itertools.count()  # point_launch's calls in this process


def point_launch(point: int) -> dict[str, str]:
    """The environment of a sweep's `point`-th run (its own `toolkit run` processes, one per process
    of the launch) under a torchrun / accelerate launch: a rendezvous store of its own.

    torchrun's workers meet in the launcher's store (TORCHELASTIC_USE_AGENT_STORE), whose keys
    hold each member's address under names that every process group of the launch's first
    generation shares. A sweep's first point ran; the second point's processes read the first
    one's addresses, left in the store, and gloo failed to connect to the gone processes
    ("Connection refused", a traceback, the sweep stopped at its second point). Each point's run
    now hosts a fresh store on a port rank 0 picks and passes to the others through the
    launcher's store, under a key of the point's own."""
    if runs.world_size() < 2 or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return {}  # one process, or a launcher whose rank 0 hosts a new store for every process group
    import socket
    from datetime import timedelta

    from torch.distributed import TCPStore

    agent = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                     timeout=timedelta(minutes=30))
    # every process of the launch asks for the same points in the same order: the n-th ask is the
    # same key on each, and a second sweep in one launch (the API, a script) does not read the first's
    key = f"toolkit/sweep/{next(_ASKED)}/point-{point}/port"
    if runs.rank() == 0:
        with socket.socket() as s:  # a free port of this host (the launch's MASTER_ADDR)
            s.bind(("", 0))
            agent.set(key, str(s.getsockname()[1]))
    return {"MASTER_PORT": agent.get(key).decode(), "TORCHELASTIC_USE_AGENT_STORE": "False"}
