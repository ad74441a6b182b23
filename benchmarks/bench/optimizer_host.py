"""Host time of clipping + AdamW alone, eager against train.compile_optimizer, on the CPU (issue 35).

The second GPU check put clipping (2.5 ms) and the optimizer with its schedule (3.2 ms) at 5.7 of
the compiled bf16 step's 14.7 host ms; fused AdamW is one kernel, so that time is Python: per
parameter (`_init_group`, the clip's walk) and per call. This times that alone over as many
parameters as bert-base has (`--params`, 201), each tiny (`--size`: the kernels cost nothing, so
what is left is the host's work), one call per step, the learning rate changing every step:

- eager: torch's `clip_grad_norm_`, the loop's found_inf skip and fused AdamW's `step`, as
  `Loop.step` calls them;
- compiled: `optimizer_step.CompiledStep` (clip + update, one compiled function) with `--backend`:
  "inductor" (C++ kernels on a CPU; Triton and a CUDA graph on a GPU: the lever's real form) or
  "aot_eager" (the suite's backend: the graph's ops run one by one from Python, so it shows the
  guards and the call, not the fusion).

    python benchmarks/bench/optimizer_host.py --backend inductor --steps 200

Prints host ms per step (median of `--repeats` timed blocks of `--steps`), the compilations, and
the largest difference of the weights from the eager run's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from toolkit.arguments import ScriptParser  # noqa: E402


def build(n: int, size: int, seed: int = 0):
    import torch
    from transformers import get_linear_schedule_with_warmup

    torch.manual_seed(seed)
    params = [torch.nn.Parameter(torch.randn(size)) for _ in range(n)]
    groups = [{"params": params[::2], "weight_decay": 0.01}, {"params": params[1::2], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=1e-3, fused=True)
    return params, optimizer, get_linear_schedule_with_warmup(optimizer, 10, 100_000)


def eager_step(params, optimizer, loss):
    import torch

    from toolkit.tally import clear_skip, skip_unless

    norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
    skip_unless(optimizer, torch.isfinite(loss) & torch.isfinite(norm))
    optimizer.step()
    clear_skip(optimizer)


def run(args: argparse.Namespace, compiled: bool) -> tuple[list[float], list, int]:
    import torch
    from torch._dynamo.utils import counters

    from toolkit import compiling, optimizer_step

    params, optimizer, schedule = build(args.params, args.size)
    before = counters["stats"]["unique_graphs"]
    if compiled:
        compiling.BACKEND = None if args.backend == "inductor" else args.backend
        step = optimizer_step.CompiledStep(optimizer, 1.0, lambda fn: compiling.compile_step(
            fn, torch.device("cpu"), fullgraph=True, dynamic=False, size_asserts=args.size_asserts))
    generator = torch.Generator().manual_seed(1)
    grads = [[torch.randn(args.size, generator=generator) for _ in params] for _ in range(4)]
    loss = torch.ones(())
    times = []
    for block in range(args.repeats + 1):  # the first block warms up (and compiles)
        for i in range(args.steps):
            for p, g in zip(params, grads[i % 4]):
                p.grad = g.clone()
            start = time.perf_counter()
            if compiled:
                step(loss)
            else:
                eager_step(params, optimizer, loss)
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            if block:
                times.append(time.perf_counter() - start)
    per_block = [1000 * statistics.fmean(times[k * args.steps:(k + 1) * args.steps]) for k in range(args.repeats)]
    return per_block, [p.detach().clone() for p in params], counters["stats"]["unique_graphs"] - before


def main() -> None:
    p = ScriptParser(prog="benchmarks/bench/optimizer_host.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--params", type=int, default=201, help="parameter tensors (bert-base: 201)")
    p.add_argument("--size", type=int, default=16, help="elements per parameter")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--backend", default="inductor", choices=["inductor", "aot_eager"])
    p.add_argument("--size-asserts", action="store_true", help="keep Inductor's per-call input checks (the loop drops them)")
    args = p.parse_args()
    eager_ms, eager_w, _ = run(args, False)
    compiled_ms, compiled_w, graphs = run(args, True)
    diff = max(float((a - b).abs().max()) for a, b in zip(eager_w, compiled_w))
    print(f"{args.params} parameters of {args.size}, {args.steps} steps x {args.repeats}: host ms per step "
          f"(clip + AdamW, median of blocks): eager {statistics.median(eager_ms):.3f} "
          f"(blocks {', '.join(f'{t:.3f}' for t in eager_ms)}), compiled ({args.backend}) "
          f"{statistics.median(compiled_ms):.3f} (blocks {', '.join(f'{t:.3f}' for t in compiled_ms)}); "
          f"compilations {graphs}; largest weight difference {diff:.2e}")


if __name__ == "__main__":
    main()
