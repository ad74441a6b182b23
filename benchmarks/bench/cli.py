"""The command line: which sections run, the flags, and the row a child process measures."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import bench
from bench.common import EXTRA_SECTIONS, METHODS, MINILM, SECTIONS, SIZES, build_checkpoint, cuda, header
from bench.graph_step import graph_row
from bench.levers import compile_row, lever_row, section_levers
from bench.lora import lora_row, section_lora
from bench.matmul import matmul_row, section_matmul
from bench.startup import section_startup
from bench.trainer import eval_row, section_methods, section_trainer, toolkit_row, trainer_row, warm_up
from toolkit.arguments import ScriptParser


def trainer_section_row(args: argparse.Namespace, kind: str, checkpoint: str) -> dict:
    """One row of the trainer (or methods) section, in this fresh process, after the warm-up."""
    with tempfile.TemporaryDirectory() as tmp:
        if args.warm_up:
            warm_up(args, checkpoint, Path(tmp) / "warmup")
        if kind == "toolkit":
            return toolkit_row(args, checkpoint, Path(tmp) / "toolkit")
        if kind.startswith("method:"):
            return toolkit_row(args, checkpoint, Path(tmp) / "method", kind.split(":", 1)[1])
        if kind.startswith("lever:"):
            return lever_row(args, checkpoint, Path(tmp) / "lever", kind.split(":", 1)[1])
        return trainer_row(args, checkpoint, Path(tmp) / "trainer", padded=kind == "trainer-padded")


def measure(args: argparse.Namespace) -> Any:
    """The row `--row` names, measured in this (fresh) process."""
    kind = args.row
    if args.compile_backend:
        from toolkit import compiling

        compiling.BACKEND = args.compile_backend
    if kind.startswith("lora:"):
        return lora_row(args, kind.split(":", 1)[1])
    if kind.startswith("graph:"):
        return graph_row(args, kind.split(":", 1)[1])
    if kind == "matmul":
        return matmul_row(args, args.resolved_checkpoint)
    if kind == "compile":
        return compile_row(args, args.resolved_checkpoint)
    if kind == "eval":
        return eval_row(args, args.resolved_checkpoint)
    return trainer_section_row(args, kind, args.resolved_checkpoint)


RUNNERS: dict[str, Callable[[argparse.Namespace, str], tuple[Any, str]]] = {
    "trainer": section_trainer, "matmul": section_matmul, "lora": section_lora, "startup": section_startup,
    "methods": section_methods, "levers": section_levers}


def sections(value: str) -> list[str]:
    """`trainer,lora` -> ['trainer', 'lora']; `all` -> the default four."""
    names = [s.strip() for s in value.split(",") if s.strip()]
    if names == ["all"]:
        return list(SECTIONS)
    unknown = [s for s in names if s not in SECTIONS + EXTRA_SECTIONS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown section(s) {unknown}; choose from "
                                         f"{', '.join(SECTIONS + EXTRA_SECTIONS)} or all")
    return names


def parser() -> argparse.ArgumentParser:
    p = ScriptParser(prog="benchmarks/bench", description=bench.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sections", type=sections, default=list(SECTIONS),
                   help=f"comma-separated, from {', '.join(SECTIONS + EXTRA_SECTIONS)} (default: all but methods)")
    model = p.add_mutually_exclusive_group()
    model.add_argument("--checkpoint", default=MINILM, help=f"model of the trainer and matmul sections (default {MINILM})")
    model.add_argument("--size", choices=sorted(SIZES), default=None,
                       help="a random-weight BERT of this size instead of --checkpoint")
    p.add_argument("--steps", type=int, default=50, help="optimizer steps per trainer row")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--eval-samples", type=int, default=None, help="dev examples (default: all 872)")
    p.add_argument("--eval-batch-size", type=int, default=None, help="the toolkit's train.eval_batch_size")
    p.add_argument("--trainer-eval-batch-size", type=int, default=8, help="Trainer's per_device_eval_batch_size")
    p.add_argument("--eval-repeats", type=int, default=3, help="passes each in the interleaved evaluation row")
    p.add_argument("--group-by-length", action=argparse.BooleanOptionalAction, default=None,
                   help="the toolkit's train.group_by_length (default: the toolkit's default, true)")
    p.add_argument("--precision", choices=["no", "bf16", "fp16"], default="no")
    p.add_argument("--compile", choices=["auto", "true", "false"], default=None,
                   help="the toolkit's train.compile (default: the toolkit's default, auto)")
    p.add_argument("--compile-optimizer", choices=["auto", "true", "false"], default=None,
                   help="the toolkit's train.compile_optimizer (default: the toolkit's default, auto: off)")
    p.add_argument("--precision-mode", choices=["autocast", "bf16_master"], default=None,
                   help="the toolkit's train.precision_mode with --precision bf16 (default: the toolkit's, autocast)")
    p.add_argument("--pad-multiple", type=int, default=None, help="the toolkit's train.pad_multiple")
    p.add_argument("--length-buckets", default=None, help="the toolkit's train.length_buckets, e.g. 64,128")
    p.add_argument("--warm-up", action=argparse.BooleanOptionalAction, default=True,
                   help="the untimed short toolkit run before each trainer row (--no-warm-up: gpu_check --smoke)")
    p.add_argument("--compile-backend", default=None,
                   help="torch.compile backend of compiled rows (default inductor; aot_eager for CPU smoke runs)")
    p.add_argument("--profile-steps", type=int, default=0,
                   help="toolkit rows: profile this many steady steps (wall, host and device-busy ms per step)")
    p.add_argument("--seed", type=int, default=None,
                   help="train.seed of the trainer rows (default 42): gpu_check's accuracy rows over several seeds")
    p.add_argument("--attention", default="sdpa")
    p.add_argument("--matmul-size", type=int, default=None, help="n of the matmul (default 2048 CPU, 8192 CUDA)")
    p.add_argument("--cpu-bf16-size", type=int, default=512, help="n of the bf16 matmul on CPU")
    p.add_argument("--mfu-batch-size", type=int, default=32)
    p.add_argument("--mfu-length", type=int, default=128)
    p.add_argument("--mfu-steps", type=int, default=None, help="timed steps (default 6 CPU, 20 CUDA)")
    p.add_argument("--compile-length", type=int, default=64, help="sequence length of the levers' compile rows")
    p.add_argument("--lora-batch-size", dest="lora_batch", type=int, default=None, help="default 8 CPU, 32 CUDA")
    p.add_argument("--lora-length", type=int, default=128)
    p.add_argument("--lora-steps", type=int, default=3)
    p.add_argument("--lora-model", choices=["roberta-base", "tiny"], default="roberta-base",
                   help="the LoRA section's random model (tiny: gpu_check --smoke)")
    p.add_argument("--lora-repeats", type=int, default=2, help="processes per LoRA-section row, alternating")
    p.add_argument("--startup-repeats", type=int, default=3)
    p.add_argument("--methods", nargs="*", default=list(METHODS), help="the methods section's methods")
    p.add_argument("--json", default=None, help="also write every row here")
    p.add_argument("--row", default=None, help=argparse.SUPPRESS)  # internal: the row this process measures
    p.add_argument("--resolved-checkpoint", default=None, help=argparse.SUPPRESS)
    return p


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser()
    args = p.parse_args(argv)
    if args.precision == "fp16" and not cuda():
        p.error("--precision fp16 needs a CUDA GPU (the toolkit refuses it on CPU)")
    if args.precision_mode == "bf16_master" and args.precision != "bf16":
        p.error("--precision-mode bf16_master needs --precision bf16 (the toolkit refuses it otherwise)")
    args.lora_batch = args.lora_batch or (32 if cuda() else 8)
    args.model_label = f"random {args.size}" if args.size else args.checkpoint
    return args


def main() -> None:
    """Each section's rows run in their own processes; this one prints the tables."""
    import datasets
    import transformers

    args = parse()
    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    if args.row:
        print("ROW " + json.dumps(measure(args)))
        return
    info = header(args)
    print(f"# make bench\n\n{info['device']} | torch {info['torch']}, transformers {info['transformers']} | "
          f"precision {info['precision']} | {info['date']} | commit {(info['git_commit'] or '?')[:10]}\n", flush=True)
    results: dict[str, Any] = {"header": info, "args": {k: v for k, v in vars(args).items() if k not in ("row",)}}
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = build_checkpoint(args.size, Path(tmp) / "model") if args.size else args.checkpoint
        for name in args.sections:
            start = time.perf_counter()
            try:
                results[name], text = RUNNERS[name](args, checkpoint)
            except RuntimeError as exc:
                failed.append(name)
                text = f"### {name}: FAILED\n\n```\n{exc}\n```"
            print(f"{text}\n\n({name}: {time.perf_counter() - start:.0f} s)\n", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    if failed:
        sys.exit(f"failed sections: {', '.join(failed)}")
