"""glibc's malloc and a large-vocabulary training step on CPU: what returning freed memory to the
kernel costs.

A GPT-2 step on CPU allocates several tensors of (batch, tokens, 50,257) floats (the logits,
log-softmax, their gradients: 400 MB each at 16 x 128). glibc serves any block over its mmap
threshold (at most 32 MB by default) with a fresh `mmap` and unmaps it on `free`, so every step
touches those pages anew: millions of minor page faults, each zero-filled by the kernel. Setting
glibc's own tunables `MALLOC_MMAP_THRESHOLD_` and `MALLOC_TRIM_THRESHOLD_` above the largest
block keeps freed blocks in the heap for the next step.

This runs the same training steps (random 4 x 256 GPT-2, the parity harness's, fused AdamW, one
thread) in fresh processes, alternately with glibc's defaults and with both tunables at 2 GiB,
and prints per setting: the median step time after the first, user and system CPU seconds,
minor page faults, and peak RSS. Neither the toolkit nor Trainer sets these; they are the
user's, per process, before it starts (see the README's CPU notes for the trade-off).

    python benchmarks/malloc_trim.py [--steps 6] [--rounds 2] [--batch 16] [--tokens 128]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TUNED = {"MALLOC_MMAP_THRESHOLD_": str(2**31 - 1), "MALLOC_TRIM_THRESHOLD_": str(2**31 - 1)}


def refault(mb: int, rounds: int = 10) -> int:
    """The fewest minor page faults of a round, among `rounds` rounds after the first two, each of
    which fills three `mb` MB tensors, two alive at once, and frees them (as a training step's
    logits and gradients come and go): about 3 x mb x 256 every round when glibc returns freed
    blocks to the kernel; 0 once the heap keeps them, which it settles into within a few rounds
    (when depends on where other allocations land)."""
    import resource

    import torch

    n, faults = mb * 2**18, []
    for _ in range(rounds):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        a, b = torch.ones(n), torch.ones(n)
        del a
        c = torch.ones(n)
        del b, c
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return min(faults[2:])


def steps(n: int, batch: int, tokens: int) -> dict:
    """n training steps of the parity harness's random GPT-2 in this process."""
    import resource
    import time

    import torch
    from transformers import AutoModelForCausalLM

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from parity import random_gpt2

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(random_gpt2(smoke=False)).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    ids = torch.randint(0, model.config.vocab_size, (batch, tokens))
    times = []
    before = resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(n):
        start = time.perf_counter()
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    after = resource.getrusage(resource.RUSAGE_SELF)
    return {"step_s": statistics.median(times[1:]), "user_s": after.ru_utime - before.ru_utime,
            "sys_s": after.ru_stime - before.ru_stime, "minor_faults": after.ru_minflt - before.ru_minflt,
            "peak_rss_mb": after.ru_maxrss / 1024}


def main() -> int:
    if "--child" in sys.argv[1:]:  # a process this script started, on flags of its own making: its peak
        parser = argparse.ArgumentParser()  # RSS is measured, and holds no import of the toolkit
    else:
        from toolkit.arguments import ScriptParser  # a user error: one line, exit 2

        parser = ScriptParser(prog="benchmarks/malloc_trim.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    for name, least in (("steps", 2), ("rounds", 1), ("batch", 1), ("tokens", 2)):
        if getattr(args, name) < least:  # the first step is warm-up: the median needs one more
            parser.error(f"--{name} must be at least {least}, got {getattr(args, name)}")
    if args.child:
        print("ROW " + json.dumps(steps(args.steps, args.batch, args.tokens)))
        return 0
    if not sys.platform.startswith("linux"):
        print("glibc's tunables: Linux only", file=sys.stderr)
        return 2
    got: dict[str, list[dict]] = {"glibc default": [], "both at 2 GiB": []}
    base = {k: v for k, v in os.environ.items() if k not in TUNED}
    for _ in range(args.rounds):  # alternating, so both settings meet the same load
        for name, env in (("glibc default", base), ("both at 2 GiB", {**base, **TUNED})):
            out = subprocess.run([sys.executable, __file__, "--child", f"--steps={args.steps}",
                                  f"--batch={args.batch}", f"--tokens={args.tokens}"],
                                 env=env, capture_output=True, text=True, check=True).stdout
            got[name].append(json.loads(next(l for l in out.splitlines() if l.startswith("ROW "))[4:]))
    print(f"GPT-2 4 x 256, batch {args.batch} x {args.tokens} tokens, {args.steps} steps, one thread, "
          f"{args.rounds} processes per setting (medians)\n")
    print("| malloc | step s | user s | system s | minor faults | peak RSS MB |\n|---|---|---|---|---|---|")
    for name, rows in got.items():
        m = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        print(f"| {name} | {m['step_s']:.2f} | {m['user_s']:.1f} | {m['sys_s']:.1f} | "
              f"{m['minor_faults']:,.0f} | {m['peak_rss_mb']:,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
