"""Section levers: what each of the loop's speed choices is worth (one turned off per row)."""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import torch

from toolkit import batching, models, train

from bench.common import cuda, random_batch, ratio, run_row, table, time_training_steps
from bench.trainer import toolkit_row, trainer_settings


LEVERS: dict[str, tuple[str, Callable[[argparse.Namespace], dict]]] = {
    # name -> (what changes against the toolkit's defaults, its train overrides from the bench's args)
    "defaults": ("none: length-grouped batches, evaluation longest first at 2x batch", lambda a: {}),
    "no-grouping": ("train.group_by_length=false (random batches)", lambda a: {"group_by_length": False}),
    "eval-unsorted": ("evaluation in dataset order", lambda a: {}),
    "eval-batch-1x": ("train.eval_batch_size = batch_size", lambda a: {"eval_batch_size": a.batch_size}),
    "one-thread": ("torch.set_num_threads(1)", lambda a: {}),
    "grad-checkpointing": ("train.gradient_checkpointing=true", lambda a: {"gradient_checkpointing": True}),
    "torch-dropout": ("train.fast_dropout=false (torch's bernoulli_ masks)", lambda a: {"fast_dropout": False}),
    "eager-attention": ("model.attention=eager (transformers' eager attention instead of sdpa)", lambda a: {}),
    "loader-worker": ("training batches fetched and collated by 1 DataLoader worker process", lambda a: {}),
}


def lever_row(args: argparse.Namespace, checkpoint: str, out: Path, lever: str) -> dict:
    """The toolkit row with one lever turned off (or on), in this fresh process."""
    what, overrides_of = LEVERS[lever]
    overrides = overrides_of(args)
    if lever == "eval-unsorted":
        served = batching.eval_loaders  # what train_loaders builds the loop's eval loaders with

        def unsorted(recipe: Any, setup: Any) -> tuple[dict, dict]:
            from torch.utils.data import DataLoader

            loaders, _ = served(recipe, setup)
            return ({k: DataLoader(v.dataset, batch_size=v.batch_size, collate_fn=v.collate_fn)
                     for k, v in loaders.items()}, {})

        batching.eval_loaders = unsorted
    if lever == "one-thread":
        torch.set_num_threads(1)
    if lever == "eager-attention":
        args = argparse.Namespace(**{**vars(args), "attention": "eager"})
    if lever == "loader-worker":  # the loop's own loader, with a worker (pinned memory needs a GPU)
        from torch.utils.data import DataLoader

        built = train.train_loaders

        def with_worker(recipe: Any, setup: Any, processes: int = 1, compiled: bool = False) -> tuple:
            loader, sampler, evals, orders = built(recipe, setup, processes, compiled)
            if loader is not None:
                loader = DataLoader(loader.dataset, batch_sampler=loader.batch_sampler, collate_fn=loader.collate_fn,
                                    generator=loader.generator, num_workers=1, persistent_workers=True,
                                    pin_memory=cuda())
            return loader, sampler, evals, orders

        train.train_loaders = with_worker
    return {"lever": lever, "what": what, **toolkit_row(args, checkpoint, out, train_overrides=overrides)}


def compile_row(args: argparse.Namespace, checkpoint: str) -> dict:
    """Full fine-tuning step time, eager against torch.compile (default inductor backend), at
    fixed shapes (every batch the same size: compile's best case) and with the first compiled
    steps' time (compilation) reported separately."""
    results = {}
    for compiled in (False, True):
        model, tok = models.load(checkpoint, "sequence-classification", {"num_labels": 2}, args.attention)
        if compiled:
            model = torch.compile(model)
        batch = random_batch(args.mfu_batch_size, args.compile_length, len(tok))
        start = time.perf_counter()
        # eager as the toolkit runs it; compiled with torch's dropout, which inductor draws itself
        times = time_training_steps(model, batch, args.precision, warmup=2, steps=args.mfu_steps or 3,
                                    fast_dropout=not compiled)
        total = time.perf_counter() - start
        results["compiled" if compiled else "eager"] = {
            "step_s": statistics.median(times), "warmup_s": total - sum(times)}
    return {"batch": args.mfu_batch_size, "length": args.compile_length, **results}


def section_levers(args: argparse.Namespace, checkpoint: str) -> tuple[dict, str]:
    rows = [run_row(f"lever:{name}", checkpoint) for name in LEVERS]
    # the defaults once more, last: how far this VM's speed drifted over the section
    rows.append({**run_row("lever:defaults", checkpoint), "lever": "defaults, again", "what": "none (drift check: run last)"})
    base = rows[0]
    body = [[r["lever"], r["what"], f"{r['train_samples_per_s']:.1f}", ratio(r["train_samples_per_s"], base["train_samples_per_s"]),
             f"{r['eval_samples_per_s']:.1f}", ratio(r["eval_samples_per_s"], base["eval_samples_per_s"]),
             f"{r['peak_mb']:.0f}", f"{100 * r['accuracy']:.2f}"] for r in rows]
    comp = run_row("compile", checkpoint)
    e, c = comp["eager"], comp["compiled"]
    text = (f"### Levers\n\n{trainer_settings(args)}\n\nEach row is the toolkit row with one change, in its "
            "own process after the same warm-up; ratios are against the defaults row. The last row repeats the "
            "defaults: its distance from 1.00x is this machine's drift over the section, which any other row's "
            "ratio inherits.\n\n"
            + table(["lever", "change", "train samples/s", "vs defaults", "eval samples/s", "vs defaults",
                     "peak MB", "dev accuracy %"], body)
            + f"\n\ntorch.compile (inductor), full fine-tuning step at fixed shape {comp['batch']} x "
            f"{comp['length']}:\n\n"
            + table(["", "step s (median)", "first 2 steps s (incl. compilation)"],
                    [["eager", f"{e['step_s']:.3f}", f"{e['warmup_s']:.1f}"],
                     ["compiled", f"{c['step_s']:.3f}", f"{c['warmup_s']:.1f}"],
                     ["compiled / eager", ratio(c["step_s"], e["step_s"]), ""]]))
    return {"rows": rows, "compile": comp}, text
