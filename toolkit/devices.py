"""Where a run executes: the launch strategy check and the peak-memory probes the loop and the
benchmarks read (hand-written: accelerate reports neither a CPU peak nor a refused strategy)."""

from __future__ import annotations

import os
import resource
from pathlib import Path

from toolkit.errors import UserError
from toolkit.lazy import lazy

torch = lazy("torch", globals())


def check_strategy(got: str) -> None:
    """A launch asked for FSDP or DeepSpeed and the run is about to be something else (accelerate
    turns them on for GPUs only; toolkit.sharding turns them on for CPU processes): refused rather
    than run as plain data parallel under the strategy's name."""
    for env, kind in (("ACCELERATE_USE_FSDP", "FSDP"), ("ACCELERATE_USE_DEEPSPEED", "DEEPSPEED")):
        if os.environ.get(env, "false").lower() == "true" and got != kind:
            raise UserError(f"STRATEGY: this launch asks for {kind}, but here it would run as {got}; use "
                            "STRATEGY=ddp (or NPROC without STRATEGY), or STRATEGY=fsdp/zero2/zero3 under a distributed launch")


def check_accelerate_env(mixed_precision: str, scoring: bool = False) -> None:
    """What the recipe decides, accelerate also reads from the environment when an Accelerator is
    made (a variable left by another launch, `accelerate launch`'s flags or its config): a dynamo
    backend compiled the model of a recipe saying compile: false (137 s instead of 12 on the tests'
    tiny BERT, another loss, the same run folder), and ACCELERATE_MIXED_PRECISION=bf16 made `eval`
    score a float32 run in bf16. A value other than the neutral one `accelerate launch` exports
    (NO, 1, `no` or the recipe's own precision) is one line. `mixed_precision`: the recipe's for a
    run; for eval and predict (`scoring`) the run's (its recipe.yaml's), which they compute in."""
    backend = os.environ.get("ACCELERATE_DYNAMO_BACKEND", "").strip()
    if backend.lower() not in ("", "no"):
        raise UserError(f"ACCELERATE_DYNAMO_BACKEND={backend}: accelerate would compile the model besides what "
                        "the recipe asks (train.compile decides); unset it, or launch with dynamo_backend: no")
    steps = os.environ.get("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "").strip()
    if steps not in ("", "1"):
        raise UserError(f"ACCELERATE_GRADIENT_ACCUMULATION_STEPS={steps}: accelerate would scale each loss by "
                        f"1/{steps} on top of the recipe's train.grad_accum; unset it (set train.grad_accum instead)")
    precision = os.environ.get("ACCELERATE_MIXED_PRECISION", "").strip()
    if precision.lower() in ("", "no", mixed_precision):
        return
    if scoring:
        raise UserError(f"ACCELERATE_MIXED_PRECISION={precision}: eval and predict compute in the run's own "
                        f"train.mixed_precision ({mixed_precision}), as the run scored itself; unset it")
    raise UserError(f"ACCELERATE_MIXED_PRECISION={precision}: the run computes in the recipe's "
                    f"train.mixed_precision ({mixed_precision}); set train.mixed_precision={precision.lower()} "
                    "or unset the variable")


CLEAR_REFS = Path("/proc/self/clear_refs")
# runs started in this process, and whether the latest one's reset could not forget the peak
_peaks = {"runs": 0, "unreset": False}


def reset_peak_memory(device: torch.device) -> None:
    """Forget the peak so far, so each run of a sweep (one process) reports its own. CUDA: the
    allocator's peak. CPU: the process's peak RSS (VmHWM), reset by writing 5 to
    /proc/self/clear_refs (Linux >= 4.0). Where that cannot be done (no /proc, not allowed), the
    peak read is the process's: `run_peak_memory_mb` gives it for the process's first run alone."""
    _peaks["runs"] += 1
    _peaks["unreset"] = False
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        CLEAR_REFS.write_text("5")
    except OSError:
        _peaks["unreset"] = True


def run_peak_memory_mb(device: torch.device) -> float | None:
    """The peak of the run started at the latest `reset_peak_memory`: `peak_memory_mb`, or None
    where the reset could not be made and an earlier run of this process (a sweep, the Python API
    in a loop) may hold the peak: that one's peak was reported as this run's, exit 0."""
    if _peaks["unreset"] and _peaks["runs"] > 1:
        return None
    return peak_memory_mb(device)


def proc_status_mb(key: str) -> float | None:
    """VmRSS / VmHWM of this process from /proc (Linux), in MiB; None elsewhere."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def peak_memory_mb(device: torch.device) -> float:
    """CUDA: max allocated since the last reset. CPU: peak process RSS since the last reset
    (VmHWM; getrusage's ru_maxrss where /proc is missing: it cannot be reset)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    hwm = proc_status_mb("VmHWM")
    return hwm if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


