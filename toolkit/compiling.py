"""train.compile: the training step's forward and loss (and so, through AOT autograd, its
backward) compiled with torch.compile.

Why: on a GPU a fine-tuning step of a base-size model is launch-bound (hundreds of small kernels,
each launched from Python). Compiled, the kernels fuse; on CUDA, `mode="reduce-overhead"` also
records each shape as a CUDA graph that replays with a single launch. The training batches are
padded to a few lengths (batching.BucketPadding), and the batch and length dimensions are marked
dynamic (`mark_dynamic`): the step compiles once for every length, and CUDA graph trees record
one graph per (batch, length) shape, which costs a step or two, not a compilation. (Compiled per
static shape, each bucket was a whole compilation: about 40 s each for a 4-layer BERT on this CPU,
and the first GPU check spent 80 s of a 113 s row compiling one.) What still recompiles (an int
argument that changes, say) is bounded by the recompile limit, raised to SHAPE_LIMIT, past which
the run stops in one line rather than running the shape eager in silence.

The optimizer is fused AdamW (one multi-tensor kernel) outside the graph; `train.compile_optimizer:
true` compiles clipping and the AdamW update into a second function of their own
(toolkit/optimizer_step.py: the learning rate a 0-d tensor, so the schedule does not recompile it).
Its `auto` is off: measured on an H200 (2026-11-27, docs/gpu.md) it was no faster than fused AdamW.

`auto` compiles on CUDA and not on a CPU: on a CPU the step is compute-bound, Inductor's C++
compilation takes minutes, and the toolkit's CPU dropout (toolkit/dropout.py) is already fused.
What is left eager, and why, is said in one line (each plug-in's `compile_eager`, read by `eager_reason`).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from toolkit.attention import ATTENTION
from toolkit.errors import UserError
from toolkit.methods import METHODS

# The backend torch.compile uses: None is Inductor (the default). The CPU tests set "aot_eager"
# (the same graph capture, AOT autograd and recompile guards, run by eager kernels: seconds
# where Inductor's C++ build of every graph takes minutes on 2 cores).
BACKEND: str | None = None


# Micro-batches from which `auto` compiles on CUDA. Compilation costs about a minute before the
# first step (bert-base shape: 80 s on the first H100 check, 65 s on the second, 60 s on an H200)
# and saves 28-56 ms a step against eager bf16 (44 -> 15.7, 61.0 -> 16.3, 67.3 -> 11.7 ms): it pays
# from 2,850, 1,450 and 1,080 steps. Below this count a compiled run ends later than an eager one
# (the H200's 120-step row: 61 samples/s over the whole run compiled, 286 eager): docs/gpu.md.
AUTO_MIN_STEPS = 2000


def wanted(setting: Any, device: torch.device) -> bool:
    """train.compile resolved on this device: auto is on for CUDA only (and, in the loop, only
    for a run long enough to repay the compilation: `too_short`)."""
    if setting == "auto":
        return device.type == "cuda"
    return bool(setting)


def too_short(setting: Any, micro_batches: int) -> str | None:
    """Why `auto` leaves a CUDA run of this many micro-batches eager; None where it compiles.
    `true` compiles whatever the length (the user asked for it)."""
    if setting != "auto" or micro_batches >= AUTO_MIN_STEPS:
        return None
    return (f"train.compile: auto runs this run's {micro_batches} micro-batches eager: compiling takes about "
            f"a minute and pays from about {AUTO_MIN_STEPS} (train.compile: true compiles anyway)")


def eager_reason(method: str, attention: Any = None) -> str | None:
    """Why a step with this method and attention module is not compiled; None where it is. Each
    plug-in declares its own reason (`compile_eager`), so no name is listed here."""
    name = getattr(attention, "name", attention)
    why = METHODS.get(method).compile_eager
    if why:
        return f"method {method}: {why}"
    why = ATTENTION.get(name).compile_eager if isinstance(name, str) and name in ATTENTION else None
    return f"attention {name}: {why}" if why else None


def strategy_reason(deepspeed_plugin: Any) -> str | None:
    """Why the launch's strategy leaves the step eager; None where it compiles. ZeRO-3 gathers and
    releases each layer's parameters through hooks inside every forward, which dynamo traces
    again: on an H100 (2026-11-26, gpt2 LoRA, `benchmarks/gpu_sharding.py`) the compiled step
    passed SHAPE_LIMIT recompiles and the run stopped, where the plain run compiled once."""
    if deepspeed_plugin is not None and deepspeed_plugin.zero_stage == 3:
        return "DeepSpeed ZeRO-3 gathers and releases parameters inside each forward (dynamo re-traces it)"
    return None


def optimizer_wanted(setting: Any) -> bool:
    """train.compile_optimizer resolved: auto is off everywhere (an H200 measured it no faster
    than fused AdamW, its steady rate lower: docs/gpu.md); true compiles it on any device."""
    return setting is True


SHAPE_LIMIT = 64  # compiled shapes of one step; past it the run stops (never eager in silence)


def compile_step(fn: Callable, device: torch.device, fullgraph: bool = False, dynamic: bool | None = None,
                 size_asserts: bool = True) -> Callable:
    """`fn` (one micro-batch -> its summed loss) compiled; call it on `mark_dynamic(batch)`. Dynamo would run a
    shape past its recompile limit eager without a word: here it raises instead (`step_error`)."""
    import torch._dynamo

    config = torch._dynamo.config
    for name, value in (("recompile_limit", max(config.recompile_limit, SHAPE_LIMIT)),
                        ("accumulated_recompile_limit", max(config.accumulated_recompile_limit, SHAPE_LIMIT)),
                        ("fail_on_recompile_limit_hit", True)):
        _FOUND.setdefault(name, getattr(config, name))  # put back by `settings_as_found`
        setattr(config, name, value)
    mode = "reduce-overhead" if device.type == "cuda" and BACKEND is None else None
    # dynamic=None: the marked dimensions are symbolic from the first compilation; anything else
    # that varies becomes symbolic at its first recompile (torch's "automatic dynamic"); False:
    # every shape static (the optimizer's: the parameters' shapes never change)
    kwargs: dict[str, Any] = {"dynamic": dynamic, "fullgraph": fullgraph}
    if BACKEND is not None:
        kwargs["backend"] = BACKEND
    elif size_asserts:
        kwargs["mode"] = mode
    else:  # the same mode, without Inductor's check of every input's size and stride on each call:
        # dynamo's guards check them already; over the optimizer's ~800 tensors the checks cost
        # about 1.5 ms a call on this CPU for 40 parameters (benchmarks/bench/optimizer_host.py)
        kwargs["options"] = {**({"triton.cudagraphs": True} if mode == "reduce-overhead" else {}),
                             "size_asserts": False, "alignment_asserts": False}
    return torch.compile(fn, **kwargs)


# dynamo's settings as compile_step found them, before it changed them for the run's compiled step
_FOUND: dict[str, Any] = {}


def keep_from_here() -> None:
    """What settings_as_found puts back is what they were from this call on (a compile_step called
    outside the API before, as the tests do, is not undone by the next API call)."""
    _FOUND.clear()


def settings_as_found() -> None:
    """Dynamo's process-wide settings put back as compile_step found them (the Python API calls this
    after each call): after `toolkit.run` with train.compile a notebook's own `torch.compile` raised
    FailOnRecompileLimitHit past 64 shapes, where dynamo runs such a shape eager."""
    import torch._dynamo

    while _FOUND:
        name, value = _FOUND.popitem()
        setattr(torch._dynamo.config, name, value)


def mark_dynamic(batch: dict) -> dict:
    """The batch with its tensors' batch dimension and sequence dimension (the second, where there
    is one) marked dynamic for the compiled step. `maybe_`: a dimension the model specialises (a
    fixed-size label vector, say) stays static instead of failing the compile."""
    import torch._dynamo

    for value in batch.values():
        if isinstance(value, torch.Tensor) and value.ndim >= 1:
            for dim in range(min(value.ndim, 2)):
                torch._dynamo.maybe_mark_dynamic(value, dim)
    return batch


def step_error(error: Exception) -> Exception:
    """A step past the shape limit, as one line a user can act on; other errors as they are."""
    if type(error).__name__ == "FailOnRecompileLimitHit":
        return UserError(f"train.compile: the step met more than {SHAPE_LIMIT} batch shapes; pad to fewer "
                         "(train.pad_multiple, train.length_buckets) or set train.compile: false")
    return error


def mark_step() -> None:
    """Tell CUDA graph trees that a new micro-batch begins: the last one's outputs were used."""
    if BACKEND is None and torch.cuda.is_available():
        torch.compiler.cudagraph_mark_step_begin()


def graph_count() -> int:
    """Graphs dynamo compiled so far in this process (torch's own counter): compilations."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])
