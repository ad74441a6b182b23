"""One side of one seed in a fresh process (this package again with --side), and the
ROW line it returns."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from parity.common import BATCHES, ROOT, SET, checkpoint_path, peak_rss_mb, raw_splits
from parity.specs import REFERENCES, SPECS, overrides, resolved_recipe, toolkit_side


# --- one side in this (fresh) process -----------------------------------------------------------
def side(args: argparse.Namespace) -> dict:
    path = checkpoint_path(SPECS[args.task].checkpoint, args.smoke)
    over = overrides(args.task, args.smoke, path, args.seed, args.full)
    cpu, wall = time.process_time(), time.perf_counter()
    spec, recipe = SPECS[args.task], resolved_recipe(args.task, over)
    with tempfile.TemporaryDirectory() as tmp:
        if args.side == "toolkit":
            row = toolkit_side(args.task, over, Path(tmp))
        else:
            row = REFERENCES[args.task](recipe, path, Path(tmp))
        if spec.rescore:  # both trained models, one scorer (each side saved its model under tmp)
            trained = next(Path(tmp).rglob("model/config.json")).parent
            row["metrics"].update(spec.rescore(str(trained), path, recipe))
    # CPU seconds of the whole side (loading, tokenising, training, evaluating): unlike samples/s,
    # barely moved by other processes sharing the cores
    if args.side == "reference":
        row["batches"] = BATCHES[0]
        from toolkit.run_metrics import examples_fingerprint

        scored = raw_splits(recipe)[1]  # the rows it scored: load()'s, as the toolkit's metrics.json fingerprints them
        row.update(eval_examples=len(scored), eval_sha256=examples_fingerprint({"": scored}))
    return {"side": args.side, "seed": args.seed, **row, "peak_rss_mb": peak_rss_mb(),
            "cpu_s": time.process_time() - cpu, "wall_s": time.perf_counter() - wall, **gpu_memory()}


def gpu_memory() -> dict:
    """On a CUDA GPU: its name and the peak memory torch's allocator handed out in this process
    (both sides allocate through it); nothing on a CPU."""
    import torch

    if not torch.cuda.is_available():
        return {}
    return {"gpu": torch.cuda.get_device_name(), "peak_gpu_mb": torch.cuda.max_memory_allocated() / 2**20}


def run_side(task: str, which: str, seed: int, smoke: bool, full: bool = False) -> dict:
    """This package again, in a new process, for one side of one seed."""
    return finish_side(start_side(task, which, seed, smoke, full, threads=None), task, which, seed)


def start_side(task: str, which: str, seed: int, smoke: bool, full: bool, threads: int | None) -> subprocess.Popen:
    """Start one side of one seed in its own process; `threads` sets its OMP_NUM_THREADS (None:
    inherited), so that sides run at once share the cores evenly."""
    cmd = [sys.executable, str(Path(__file__).resolve().parent), task, "--side", which, "--seed", str(seed)]
    cmd += (["--smoke"] if smoke else []) + (["--full"] if full else []) + [f"--set={o}" for o in SET]
    cmd += [f"--reference-batches={BATCHES[0]}"]
    env = dict(os.environ, **({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)} if threads else {}))
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)


def finish_side(proc: subprocess.Popen, task: str, which: str, seed: int) -> dict:
    stdout, stderr = proc.communicate()
    found = [line for line in stdout.splitlines() if line.startswith("ROW ")]
    if proc.returncode or not found:
        raise RuntimeError(f"{task} {which} seed {seed} failed ({proc.returncode}):\n{stderr[-3000:]}")
    return json.loads(found[-1][4:])
