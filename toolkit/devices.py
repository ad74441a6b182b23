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


def reset_peak_memory(device: torch.device) -> None:
    """Forget the peak so far, so each run of a sweep (one process) reports its own. CUDA: the
    allocator's peak. CPU: the process's peak RSS (VmHWM), reset by writing 5 to
    /proc/self/clear_refs (Linux >= 4.0); elsewhere the peak stays the process's."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


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


