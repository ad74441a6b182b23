"""Host time per training step on the CPU, by part, before and after a change (issue 35).

On the first GPU checks the compiled step was host-bound: the GPU idled while Python ran the
step's forward call, autograd, clipping, the optimizer, the schedule and the tally. On this CPU a
tiny model (2 layers, width 32) makes the kernels cheap, so the step's time is that same Python
overhead; this measures it per part with `bench.trainer.StepProfile` (its parts timed, the
profiler off: on a CPU the profiler's per-op recording would be most of what it measured).

    python benchmarks/bench/host_step.py --before HEAD~1      # before/after, one table

Modes: "aot_eager" and "eager" (the forward and backward compiled or not), each also with "+opt":
`train.compile_optimizer: true`, clipping and the AdamW update compiled too (their host time is
then all in "optimizer, schedule, tally"; the "clip + optimizer, schedule, tally" row compares).
"aot_eager" runs a graph's ops one by one from Python, which for the optimizer's ~15 small ops
per parameter costs more than fused AdamW's single kernel: "eager+inductor" compiles the
optimizer alone with Inductor (C++ kernels on a CPU, about 2 minutes of compilation per run).

Each figure is the least (and the median) of `--repeats` child processes, alternating before and after (this VM's
speed drifts), each a `train.run` of the tiny BERT on SST-2 with the step compiled by the
"aot_eager" backend (dynamo's guards, AOT autograd's backward, eager kernels) and eager.
`--before REV` checks that revision out in a temporary git worktree and runs its toolkit; the
"after" rows run the working tree as it was when the command started (also a worktree).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def child(args: argparse.Namespace) -> None:
    """One run in this process, with the toolkit of `args.tree`; prints the profile as JSON."""
    sys.path.insert(0, args.tree)
    import torch

    from toolkit import compiling, models, recipe as recipes, train  # from args.tree: imported first

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench.trainer import StepProfile

    torch.manual_seed(0)
    forward, _, optimizer = args.compile.partition("+")
    if args.compile != "eager" and optimizer != "inductor":  # "eager+opt": the optimizer's backend too
        compiling.BACKEND = "aot_eager"  # "eager+inductor": the optimizer alone, by Inductor (C++ here)
    raw = {"model": {"checkpoint": models.smoke_checkpoint("bert-base-uncased")},
           "task": {"name": "glue", "subset": "sst2", "max_length": 64,
                    "max_train_samples": args.steps * args.batch_size, "max_eval_samples": 8},
           "method": {"name": args.method},
           "train": {"epochs": 1, "max_steps": args.steps, "batch_size": args.batch_size, "lr": 1e-3,
                     "log_every": 1000, "eval_every": 0, "keep_best": False, "fast_dropout": False,
                     "max_grad_norm": args.max_grad_norm, "compile": forward != "eager",
                     "pad_multiple": 16, **({"compile_optimizer": True} if optimizer else {})}}
    recipe = recipes.parse(raw, name="host-step")
    with tempfile.TemporaryDirectory() as out:
        with StepProfile(args.steps - args.count - 1, args.count, trace=False) as profiled:
            train.run(recipes.RunPlan(recipe), Path(out))
        print("RESULT " + json.dumps({**profiled.result, "weights": weights_digest(Path(out) / "model")}))


def weights_digest(folder: Path) -> str:
    """A digest of the trained weights' bytes: a change that only cuts host time leaves it as it was."""
    from safetensors.torch import load_file

    digest = hashlib.sha256()
    for path in sorted(folder.glob("*.safetensors")):
        tensors = load_file(path)
        for name in sorted(tensors):
            digest.update(name.encode() + tensors[name].float().numpy().tobytes())
    return digest.hexdigest()[:12]


def worktree(rev: str, folder: Path) -> str:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(folder), rev], check=True)
    return str(folder)


def measure(args: argparse.Namespace, tree: str, compile_: str) -> dict:
    command = [sys.executable, __file__, "--child", "--tree", tree, "--compile", compile_,
               "--steps", str(args.steps), "--count", str(args.count), "--batch-size", str(args.batch_size),
               "--method", args.method, "--max-grad-norm", str(args.max_grad_norm)]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise SystemExit(f"row failed ({tree}, {compile_}):\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def best_row(results: list[dict]) -> dict:
    """Each part's least ms over the runs: other work on this VM's shared cores only ever adds
    time to a run, so the least is the closest to the step's own cost (the median is printed too)."""
    rows = [{**r["host_parts_ms"], "clip + optimizer, schedule, tally": r["host_parts_ms"]["clip"]
             + r["host_parts_ms"]["optimizer, schedule, tally"], "host in step": r["host_in_step_ms"],
             "wall per step": r["wall_ms"]} for r in results]
    return {part: (min(row[part] for row in rows), statistics.median(row[part] for row in rows)) for part in rows[0]}


def main() -> None:
    if "--child" in sys.argv[1:]:  # a process this script started, on flags of its own making: the
        p = argparse.ArgumentParser()  # toolkit it imports is --tree's, imported first (`child`)
    else:
        from toolkit.arguments import ScriptParser  # a user error: one line, exit 2

        p = ScriptParser(prog="benchmarks/bench/host_step.py", description=__doc__,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", help="a git revision to compare against (its toolkit, in a worktree)")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--count", type=int, default=30, help="steady steps timed (the last ones but one)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--method", default="full")
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--modes", default="aot_eager,eager,aot_eager+opt,eager+opt",
                   help="the step compiled (aot_eager) or eager; +opt: with train.compile_optimizer "
                        "(its clipping and AdamW update compiled; the --before tree runs without it)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--tree", default=str(ROOT), help=argparse.SUPPRESS)
    p.add_argument("--compile", default="aot_eager", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)
    with tempfile.TemporaryDirectory() as tmp:
        # the working tree as it is now (a stash commit; HEAD when clean): edits during the run stay out
        now = subprocess.run(["git", "-C", str(ROOT), "stash", "create"], capture_output=True, text=True).stdout
        trees = {"after": worktree(now.strip() or "HEAD", Path(tmp) / "after")}
        if args.before:
            trees = {"before": worktree(args.before, Path(tmp) / "before"), **trees}
        try:
            results = {(label, mode): [] for label in trees for mode in args.modes.split(",")
                       if label == "after" or "+opt" not in mode}  # an older tree has no compile_optimizer
            for _ in range(args.repeats):
                for label, mode in results:
                    results[label, mode].append(measure(args, trees[label], mode))
        finally:
            for tree in trees.values():
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", tree])
    rows = {key: best_row(value) for key, value in results.items()}
    digests = {key: sorted({r["weights"] for r in value}) for key, value in results.items()}
    names = [f"{label}, {mode}" for label, mode in rows]
    print(f"host ms per steady step, least (median) of {args.repeats} runs; tiny BERT, batch {args.batch_size}, "
          f"method {args.method}, max_grad_norm {args.max_grad_norm}, {args.count} steps of {args.steps}\n")
    print("| part | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 1) + "|")
    for part in next(iter(rows.values())):
        print(f"| {part} | " + " | ".join(f"{row[part][0]:.2f} ({row[part][1]:.2f})" for row in rows.values()) + " |")
    print("| trained weights (digest) | " + " | ".join(", ".join(d) for d in digests.values()) + " |")


if __name__ == "__main__":
    main()
