"""`make gpu-check`: every GPU-speed lever of issue 35 measured in one prepared run (docs/gpu.md).

One Markdown table on stdout and the same rows as JSON (`--json`, default gpu-check.json):
- toolkit vs Trainer (dynamic padding) train samples/s in bf16 and fp32, the toolkit with
  train.compile off and on (bert-base shape, random weights, SST-2, batch 32, length <= 128);
  the toolkit's also once compilation and warm-up are over ("steady", from its log.jsonl; the
  "vs Trainer" ratio is of whole runs, like for like);
- MFU at 32 x 128 of an eager and a compiled step (bench's matmul row) and of each toolkit row
  (6N x real tokens/s once warm, over the measured matmul rate of its precision);
- the compiled bf16 row again with train.compile_optimizer (clipping and the AdamW update compiled
  too, toolkit/optimizer_step.py), right after it;
- LoRA vs full step time and peak memory (bench's lora rows), eager and compiled (the step
  compiled by the toolkit's own compiling.compile_step), each pair's ratio on a line of its own;
- distinct batch shapes and compilations of each toolkit row (torch's own graph counter, the
  step's compiled variants where they disagree, and how many of Inductor's graphs its on-disk
  cache gave: the whole-run rate counts a cold compilation only where none did), and 10 of its steady steps profiled: wall, host
  and GPU-busy ms per step, the host's time split by part in a table of its own;
- SST-2 dev accuracy of MiniLM with compile off and on (a short budget, same subset and seed, both
  padded as the compiled step pads, to multiples of 16: compilation is all that differs);
  `--accuracy-seeds N`: N a side (seeds 42, 43, ...), and under the table each side's mean and
  standard deviation, the difference against the 0.5-point target and against that spread;
- with --master, bf16 with master weights (train.precision_mode: bf16_master, toolkit/precision.py)
  beside bf16's autocast: its speed rows, compile on and off, and its MiniLM accuracy row,
  compiled (measured once: autocast was faster and stayed bf16's default on CUDA);
- device, torch/transformers versions, commit; then the rows of other issues (`EXTRA_ROWS`).

`--rows KEY,...` runs only those rows of the plan (opt-in ones included, other issues' sections
left out), in its order: keys
toolkit-{bf16,fp32}-{compiled,eager}, trainer-{bf16,fp32}, {full,lora}-{eager,compiled}, mfu,
accuracy-{eager,compiled}, optimizer, master-{compiled,eager}, accuracy-master; groups
steps-eager, steps-compiled, accuracy, compiled.

Every row runs in its own process (bench's `--row`), as `make bench` does, in order of
importance, and the JSON is rewritten after each row, so a run cut short keeps what it measured.

`--smoke`: the same code path on a CPU in seconds (the conftest-sized random BERT, 3 steps, no
warm-up runs, compiled rows through dynamo's capture-only "eager" backend, rows in this process):
what the suite runs (tests/test_compile.py checks the compiled backward, through "aot_eager").
`--suite`: the test suite on this machine instead (pytest -n over its cores), with CUDA present.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

# Everything a benchmark reads is here (the data, the tokenizers, random-weight or packaged
# models): off-line, a Hub id is not looked up on the network first (a machine without one, as the
# lent GPU machines are, spent ~3 s of retries per row process on it), and every row's process
# inherits this.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # bench
sys.path.insert(0, str(HERE.parent))  # this checkout's toolkit
from toolkit.arguments import ScriptParser  # noqa: E402

# Rows other issues add (issue 36's FSDP2/DeepSpeed rows): name -> fn(args, info) -> list of rows,
# each a dict with at least "row" and, where it has them, the columns of COLUMNS. Register with
# `add_rows("fsdp2", fn)` from a module gpu_check imports (or before calling main()).
EXTRA_ROWS: dict[str, Callable[[argparse.Namespace, dict], list[dict]]] = {}
EXTRA_TABLES: dict[str, Callable[[list[dict]], str]] = {}


def add_rows(name: str, fn: Callable[[argparse.Namespace, dict], list[dict]],
             render_rows: Callable[[list[dict]], str] | None = None) -> None:
    """The hook for other issues' rows: they run after this issue's, in the same JSON, and in the
    same table, or in a table of their own under `## name` where they bring `render_rows`."""
    EXTRA_ROWS[name] = fn
    if render_rows is not None:
        EXTRA_TABLES[name] = render_rows


def _sharding_rows(args: argparse.Namespace, info: dict) -> list[dict]:
    """Issue 36: one-process FSDP2, ZeRO-2 and ZeRO-3 launches of bert-base full and gpt2 LoRA
    against the plain run (benchmarks/gpu_sharding.py); left out with --skip-sharding, and from
    --smoke (tests/test_gpu_sharding.py runs its own smoke)."""
    if args.smoke or args.skip_sharding:
        return []
    import gpu_sharding

    return gpu_sharding.rows(budget_s=getattr(args, "left_s", None))


def _sharding_table(rows: list[dict]) -> str:
    import gpu_sharding

    return gpu_sharding.table(rows)


add_rows("FSDP2 and DeepSpeed (issue 36)", _sharding_rows, _sharding_table)


# train.precision_mode: bf16_master (toolkit/precision.py) beside bf16's default autocast: the
# faster at equal accuracy becomes the default for mixed_precision: bf16 on CUDA (issue 35 part 4)
MASTER_LABEL = "bf16 master weights"
MASTER = f"toolkit, {MASTER_LABEL}"
# train.compile_optimizer (toolkit/optimizer_step.py) beside the compiled bf16 row: the second
# check found that step host-bound, clipping and the optimizer 5.7 of its 14.7 host ms
OPTIMIZER = "toolkit, compiled optimizer"
TOOLKIT_ROWS = ("toolkit", MASTER, OPTIMIZER)

MIN_ROW_S = 30  # --budget-s: no row starts with less left (the quickest GPU rows took 19-31 s)

COLUMNS = ["row", "precision", "compile", "train samples/s", "steady samples/s", "vs Trainer", "MFU", "step ms", "peak MB",
           "shapes", "compilations", "padding", "dev accuracy %"]


def parser() -> argparse.ArgumentParser:
    p = ScriptParser(prog="benchmarks/gpu_check.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="the whole path on a CPU in seconds (the suite's test)")
    p.add_argument("--suite", action="store_true", help="run the test suite here instead (pytest -n)")
    p.add_argument("--json", default="gpu-check.json")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps per speed row (default 120)")
    p.add_argument("--minilm", default=None, help="MiniLM folder for the accuracy rows (default: the toolkit's)")
    p.add_argument("--accuracy-steps", type=int, default=None, help="steps of the accuracy rows (default 300)")
    p.add_argument("--skip-sharding", action="store_true", help="leave out issue 36's FSDP2/ZeRO rows")
    p.add_argument("--budget-s", type=float, default=None,
                   help="seconds for this issue's rows: a row is stopped when they run out, and none starts with "
                        f"under {MIN_ROW_S} s left, so the table is printed within a device call's limit")
    p.add_argument("--master", action="store_true", help="also the bf16-master-weights rows (issue 35 part 4)")
    p.add_argument("--graph", action="store_true",
                   help="also the whole step as one CUDA graph, full and LoRA (bench/graph_step.py; the next lever)")
    p.add_argument("--optimizer", action="store_true", help="also the train.compile_optimizer row (issue 35 part 2)")
    p.add_argument("--accuracy-seeds", type=positive, default=1,
                   help="MiniLM accuracy rows per side (eager, compiled), seeds 42, 43, ...: mean and spread")
    p.add_argument("--rows", default=None,
                   help="comma-separated row keys or groups to run, in the plan's order (opt-in rows included; "
                        "other issues' sections left out): "
                        + ", ".join([*ROW_KEYS, *GROUPS]))
    return p


def positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value}: at least 1")
    return number


GRAPH_LABEL = "one CUDA graph"  # bench/graph_step.py's rows: forward, backward, clip and update captured whole

# --rows: each plan row's key (`row_key`), and groups of them
ROW_KEYS = ("toolkit-bf16-compiled", "optimizer", "trainer-bf16", "full-eager", "lora-eager", "full-compiled",
            "lora-compiled", "accuracy-eager", "accuracy-compiled", "toolkit-fp32-compiled", "toolkit-bf16-eager",
            "mfu", "toolkit-fp32-eager", "trainer-fp32", "master-compiled", "master-eager", "accuracy-master",
            "full-graph", "lora-graph")
GROUPS = {"steps-eager": ("full-eager", "lora-eager"), "steps-compiled": ("full-compiled", "lora-compiled"),
          "accuracy": ("accuracy-eager", "accuracy-compiled"), "graph": ("full-graph", "lora-graph"),
          "compiled": ("toolkit-bf16-compiled", "toolkit-fp32-compiled")}


def row_key(label: str, kind: str, flags: list[str]) -> str:
    """The --rows key of one plan row: what it measures, precision and compilation."""
    how = "compiled" if "--compile" in flags and flags[flags.index("--compile") + 1] == "true" else "eager"
    precision = {"no": "fp32"}.get(flags[flags.index("--precision") + 1], flags[flags.index("--precision") + 1])
    if kind.startswith("lora:"):
        return f"{kind.split(':', 1)[1]}-{how}"
    if kind.startswith("graph:"):
        return f"{kind.split(':', 1)[1]}-graph"
    if kind == "matmul":
        return "mfu"
    if kind.startswith("trainer"):
        return f"trainer-{precision}"
    if "--precision-mode" in flags:
        return "accuracy-master" if label.startswith("MiniLM") else f"master-{how}"
    if label.startswith("MiniLM"):
        return f"accuracy-{how}"
    return "optimizer" if "--compile-optimizer" in flags else f"toolkit-{precision}-{how}"


def wanted_rows(value: str | None) -> tuple[set[str] | None, list[str]]:
    """(the keys --rows names, its groups expanded; None: the default plan), and the names unknown."""
    if value is None:
        return None, []
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in ROW_KEYS and n not in GROUPS] or ([] if names else ["(none)"])
    return {k for n in names for k in GROUPS.get(n, (n,))}, unknown


def bench_flags(args: argparse.Namespace, precision: str, compiled: bool | None = None,
                checkpoint: str | None = None, mode: str | None = None, optimizer: bool = False) -> list[str]:
    """The bench command line of one row: the issue's bert-base setting (or the smoke one)."""
    if args.smoke:
        flags = ["--steps", "3", "--batch-size", "4", "--max-length", "32", "--eval-samples", "8",
                 "--mfu-batch-size", "4", "--mfu-length", "16", "--mfu-steps", "1", "--matmul-size", "64",
                 "--cpu-bf16-size", "64", "--lora-batch-size", "2", "--lora-length", "16", "--lora-steps", "1", "--lora-model", "tiny", "--no-warm-up",
                 "--compile-backend", "eager"]
    else:
        flags = ["--steps", str(args.steps or 120), "--batch-size", "32", "--max-length", "128",
                 "--eval-samples", "256", "--mfu-batch-size", "32", "--mfu-length", "128", "--lora-batch-size", "32",
                 "--lora-length", "128", "--lora-steps", "10"]
    # the toolkit's own few-shapes default (a compiled step pads to multiples of 16 up to 128:
    # one compilation, a CUDA graph per length); the first check forced buckets 64,128, which put
    # SST-2's 13-token sentences in 64 positions (+379% padding)
    flags += ["--precision", precision, "--profile-steps", "2" if args.smoke else "10"]
    flags += ["--size", "bert-base"] if not args.smoke else []
    if compiled is not None:
        flags += ["--compile", "true" if compiled else "false"]
    if mode is not None:
        flags += ["--precision-mode", mode]
    if optimizer:  # train.compile_optimizer: clipping and the AdamW update compiled as well
        flags += ["--compile-optimizer", "true"]
    return flags + (["--checkpoint", checkpoint] if checkpoint else [])


def row(args: argparse.Namespace, kind: str, checkpoint: str, flags: list[str], timeout: float | None = None) -> dict:
    """One bench row: in this process for --smoke, else in a fresh one (bench's run_row), stopped
    after `timeout` seconds (what is left of --budget-s)."""
    import bench
    from bench.cli import measure, parse

    if args.smoke:
        import torch._dynamo

        torch._dynamo.reset()  # each row compiles afresh, as in its own process (the MiniLM row uses this model here)
        parsed = parse([*flags, "--row", kind, "--resolved-checkpoint", checkpoint])
        parsed.resolved_checkpoint = checkpoint
        return measure(parsed)
    cmd = [sys.executable, str(bench.PACKAGE), *flags, "--row", kind, "--resolved-checkpoint", checkpoint]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"row {kind} stopped: --budget-s ran out after {timeout:.0f} s of it") from None
    found = [line for line in done.stdout.splitlines() if line.startswith("ROW ")]
    if getattr(args, "rows_log", None):  # warnings a row printed (recompiles, CUDA graphs skipped...)
        with open(args.rows_log, "a", encoding="utf-8") as log:
            log.write(f"\n===== {kind} {' '.join(flags)} (exit {done.returncode})\n{done.stderr[-20000:]}\n")
    if done.returncode or not found:
        raise RuntimeError(f"row {kind} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(found[-1][4:])


def header() -> dict:
    import torch
    import transformers

    from bench.common import device_name
    from toolkit import provenance

    import accelerate
    import peft

    return {"device": device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "transformers": transformers.__version__, "peft": peft.__version__, "accelerate": accelerate.__version__,
            "python": sys.version.split()[0], "commit": provenance.git_commit(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def speed_checkpoint(args: argparse.Namespace, folder: Path) -> str:
    """bert-base's shape with random weights (the issue's setting), or the suite's tiny BERT."""
    from bench.common import build_checkpoint
    from toolkit import models

    if args.smoke:
        return models.smoke_checkpoint("bert-base-uncased")
    return build_checkpoint("bert-base", folder)


def accuracy_flags(args: argparse.Namespace, precision: str, compiled: bool, mode: str | None = None,
                   seed: int | None = None) -> list[str]:
    """An accuracy row's flags: MiniLM's budget (300 steps, the whole dev set), its seed, and the
    compiled step's padding whether compiled or not (the toolkit's multiple of 16: eager, a batch
    is as long as its longest member, 39 shapes against 5 on the first H100 check), so that eager
    and compiled rows differ in compilation only."""
    flags = [f for f in bench_flags(args, precision, compiled, mode=mode) if f not in ("--size", "bert-base")]
    flags[flags.index("--steps") + 1] = str(args.accuracy_steps or (3 if args.smoke else 300))
    flags[flags.index("--eval-samples") + 1] = "8" if args.smoke else "872"
    from bench.common import SEED

    return flags + ["--pad-multiple", str(compiled_padding(flags)), "--seed", str(SEED if seed is None else seed)]


def compiled_padding(flags: list[str]) -> int:
    """The multiple the toolkit pads a compiled step's batches to at these flags' max length
    (batching.pad_multiple with train.pad_multiple unset): 16 up to length 128."""
    from types import SimpleNamespace

    from toolkit import batching

    unset = SimpleNamespace(train=SimpleNamespace(pad_multiple=None),
                            task=SimpleNamespace(max_length=int(flags[flags.index("--max-length") + 1])))
    return batching.pad_multiple(unset, compiled=True)


def selected(args: argparse.Namespace, speed: str, minilm: str) -> list[tuple[str, str, str, list[str]]]:
    """The plan, or the rows --rows names (opt-in ones included), in the plan's order."""
    keys, _ = wanted_rows(args.rows)
    if keys is None:
        return plan(args, speed, minilm)
    every = plan(argparse.Namespace(**{**vars(args), "master": True, "optimizer": True, "graph": True}), speed, minilm)
    return [entry for entry in every if row_key(entry[0], entry[1], entry[3]) in keys]


def plan(args: argparse.Namespace, speed: str, minilm: str) -> list[tuple[str, str, str, list[str]]]:
    """(label, bench row kind, checkpoint, flags), most important first: a run cut short keeps the
    rows the targets are judged on, then the rows no check has reached yet. The compiled bf16 step
    and Trainer's bf16 (the 3x target), the LoRA and full steps eager, then compiled (the LoRA
    target), MiniLM's accuracy eager and compiled, seed by seed (the same-accuracy condition), the
    compiled fp32 step (the 1.5x target), then the rows measured before (eager bf16,
    MFU, eager fp32, Trainer's fp32). Opt-in: --optimizer (train.compile_optimizer, measured on an
    H200 on 2026-11-27: no faster than fused AdamW, steady rate lower) and --master (bf16 master
    weights, measured on 2026-11-26: slower than autocast compiled, level eager)."""
    from bench.common import SEED

    tiny = "tiny roberta" if args.smoke else "roberta-base shape"
    precision = "bf16" if not args.smoke else "no"
    out = [("toolkit", "toolkit", speed, bench_flags(args, "bf16", True))]
    if args.optimizer:  # right after the row it is measured against
        out.append((OPTIMIZER, "toolkit", speed, bench_flags(args, "bf16", True, optimizer=True)))
    out += [("Trainer, dynamic padding", "trainer-dynamic", speed, bench_flags(args, "bf16"))]
    out += [(f"{m} step ({tiny})", f"lora:{m}", speed, bench_flags(args, "bf16")) for m in ("full", "lora")]
    # the same pair compiled as the loop compiles its step (eager, a base-size step is launch-bound
    # on a GPU: LoRA adds kernels and saves weight-gradient matmuls; the first checks' 1.2x)
    out += [(f"{m} step ({tiny})", f"lora:{m}", speed, bench_flags(args, "bf16", True)) for m in ("full", "lora")]
    out += [("MiniLM SST-2 accuracy", "toolkit", minilm, accuracy_flags(args, precision, compiled, seed=SEED + i))
            for i in range(args.accuracy_seeds) for compiled in (False, True)]  # seed by seed: a run cut short keeps pairs
    out += [("toolkit", "toolkit", speed, bench_flags(args, "no", True)),
            ("toolkit", "toolkit", speed, bench_flags(args, "bf16", False)),
            ("matmul and MFU at 32 x 128, eager and compiled", "matmul", speed, bench_flags(args, "bf16")),
            ("toolkit", "toolkit", speed, bench_flags(args, "no", False)),
            ("Trainer, dynamic padding", "trainer-dynamic", speed, bench_flags(args, "no"))]
    if args.master:
        out += [(MASTER, "toolkit", speed, bench_flags(args, "bf16", compiled, mode="bf16_master")) for compiled in (True, False)]
        out.append((f"MiniLM SST-2 accuracy, {MASTER_LABEL}", "toolkit", minilm,
                    accuracy_flags(args, "bf16", True, mode="bf16_master")))
    if getattr(args, "graph", False):  # bench/graph_step.py: the whole step as one CUDA graph, beside it eager
        out += [(f"{m} step ({tiny}), {GRAPH_LABEL}", f"graph:{m}", speed, bench_flags(args, "bf16"))
                for m in ("full", "lora")]
    return out


def cells(r: dict, trainer: dict[str, float], flops: dict[str, float]) -> list[str]:
    """One row's table cells (blank where the row has no such figure)."""
    sps, precision = r.get("train_samples_per_s"), r.get("precision", "")
    steady = r.get("steady_samples_per_s") or sps
    mfu = r.get("mfu")
    if mfu is None and steady and r.get("non_embedding_params") and flops.get(precision):
        # real tokens only: padding is work the model does but not work it needs
        mfu = 6 * r["non_embedding_params"] * steady * r.get("train_tokens_per_example", 0) / flops[precision]
    vs = f"{sps / trainer[precision]:.2f}x" if sps and trainer.get(precision) and r["row"] in TOOLKIT_ROWS else ""
    return [r["row"], {"no": "fp32"}.get(precision, precision), str(r.get("compile", "")),
            f"{sps:.1f}" if sps else "", f"{r['steady_samples_per_s']:.1f}" if r.get("steady_samples_per_s") else "",
            vs, f"{100 * mfu:.1f}%" if mfu else "",
            step_ms(r),
            f"{r['peak_mb']:.0f}" if r.get("peak_mb") else "", str(r.get("train_shapes", "")),
            compilations(r),
            f"+{100 * r['padding_overhead']:.0f}%" if "padding_overhead" in r else "",
            f"{100 * r['accuracy']:.2f}" if r.get("accuracy") is not None else ""]


def step_ms(r: dict) -> str:
    """A measured step's ms; a toolkit row's profiled steady steps as wall (host inside the step,
    device busy): wall well above the device's busy time is a step waiting on the host."""
    if r.get("step_profile"):
        p = r["step_profile"]
        return f"{p['wall_ms']:.1f} (host {p['host_in_step_ms']:.1f}, device {p['device_busy_ms']:.1f})"
    return f"{1000 * r['step_s']:.1f}" if r.get("step_s") else ""


def host_table(rows: list[dict]) -> str:
    """The profiled steady steps of each toolkit row: where the host's time per step goes."""
    from bench.common import table

    parts = list(rows[0]["step_profile"]["host_parts_ms"])
    head = [f"{r['row']}, {({'no': 'fp32'}).get(r.get('precision', ''), r.get('precision', ''))}, "
            f"{'compiled' if r.get('compile') else 'eager'}" for r in rows]
    body = [[part, *(f"{r['step_profile']['host_parts_ms'][part]:.2f}" for r in rows)] for part in parts]
    body += [["wall per step", *(f"{r['step_profile']['wall_ms']:.2f}" for r in rows)],
             ["device busy per step", *(f"{r['step_profile']['device_busy_ms']:.2f}" for r in rows)]]
    return "Host ms per steady step, by part (profiled steps; wall well above device busy: host-bound)\n\n" + table(
        ["part", *head], body)


def graph_notes(info: dict, rows: list[dict]) -> str:
    """Whether the compiled rows' steps ran as CUDA graphs: Inductor's skips and their reasons
    (bench's CudagraphSkips); nothing where no graph was asked for (a CPU, no compiled row)."""
    compiled = [r for r in rows if r.get("compile") and "cudagraph_skips" in r]
    if not compiled or not (info.get("cuda") or any(r["cudagraph_skips"] for r in compiled)):
        return ""
    lines = []
    for r in compiled:
        name = f"{r['row']}, {({'no': 'fp32'}).get(r.get('precision', ''), r.get('precision', ''))}"
        reasons = "; ".join(r.get("cudagraph_skip_reasons") or []) or "no reason logged"
        lines.append(f"- {name}: " + (f"{r['cudagraph_skips']} graphs not recorded ({reasons})"
                                      if r["cudagraph_skips"] else "every graph recorded"))
    return "CUDA graphs (mode reduce-overhead) in the compiled rows:\n\n" + "\n".join(lines)


def compilations(r: dict) -> str:
    """torch's graph counter, the step's own compiled variants where the two disagree, and how many
    of Inductor's graphs came from its on-disk cache (a row's whole-run rate counts the compilation
    as this process paid it: cold where none did, a fraction of that where all did)."""
    graphs, entries = r.get("compiled_graphs", ""), r.get("step_compilations")
    out = str(graphs) if entries is None or entries == graphs else f"{graphs} ({entries} step variants)"
    cache = r.get("compile_cache") or {}
    looked_up = cache.get("fxgraph_hit", 0) + cache.get("fxgraph_miss", 0)
    return f"{out}; {cache['fxgraph_hit']} of {looked_up} from cache" if looked_up else out


ACCURACY_TARGET = 0.5  # points: "the same accuracy" of compiled and eager (issue 35)


def accuracy_note(rows: list[dict]) -> str:
    """MiniLM's accuracy eager against compiled, like for like (same subset, padding and seeds):
    each side's mean and spread (sample standard deviation over its seeds), the difference of the
    means against the 0.5-point target and against the spread (within it: no larger than the larger
    side's standard deviation; one seed a side measures no spread)."""
    import statistics

    sides = {how: [100 * r["accuracy"] for r in rows if r.get("key") == f"accuracy-{how}" and r.get("accuracy") is not None]
             for how in ("eager", "compiled")}
    if not all(sides.values()):
        return ""
    seeds = sorted({r["seed"] for r in rows if r.get("key", "").startswith("accuracy-") and "seed" in r})
    padding = next((r.get("pad_multiple") for r in rows if r.get("key") == "accuracy-eager"), None)

    def side(values: list[float]) -> str:
        sd = f" ± {statistics.stdev(values):.2f}" if len(values) > 1 else ""
        return f"{statistics.mean(values):.2f}{sd} (n {len(values)})"

    diff = statistics.mean(sides["compiled"]) - statistics.mean(sides["eager"])
    spreads = [statistics.stdev(v) for v in sides.values() if len(v) > 1]
    verdict = ("one seed a side: no spread measured (--accuracy-seeds N for N a side)" if not spreads else
               f"{'within' if abs(diff) <= max(spreads) else 'outside'} the seeds' spread (the larger standard "
               f"deviation, {max(spreads):.2f})")
    return (f"MiniLM SST-2 accuracy %, compiled vs eager (same subset, seeds {', '.join(map(str, seeds))}, both "
            f"trained on batches padded to multiples of {padding}): eager {side(sides['eager'])}, compiled "
            f"{side(sides['compiled'])}; difference {diff:+.2f} points: {'within' if abs(diff) <= ACCURACY_TARGET else 'over'} "
            f"the {ACCURACY_TARGET}-point target, {verdict}")


def lora_ratio(full: dict, lora: dict) -> list[str]:
    """The LoRA target's line: LoRA's step time and peak memory over full fine-tuning's, both
    eager, both compiled or both one CUDA graph (target: step <= 0.7x in bf16)."""
    how = GRAPH_LABEL if lora.get("graph") else "compiled" if lora.get("compile") else "eager"
    cells_ = [f"LoRA / full, {how}", {"no": "fp32"}.get(lora.get("precision", ""), lora.get("precision", "")),
              str(bool(lora.get("compile")))]
    cells_ += [""] * 4 + [f"{lora['step_s'] / full['step_s']:.2f}x", f"{lora['peak_mb'] / full['peak_mb']:.2f}x"]
    return cells_ + [""] * (len(COLUMNS) - len(cells_))


def render(info: dict, rows: list[dict]) -> str:
    from bench.common import table

    trainer = {r["precision"]: r["train_samples_per_s"] for r in rows if r["row"] == "Trainer, dynamic padding"}
    flops = {({"fp32": "no"}.get(m["dtype"], m["dtype"])): m["gflops"] * 1e9
             for r in rows for m in r.get("matmul", [])}
    n = next((r["mfu"]["non_embedding_params"] for r in rows if "mfu" in r and isinstance(r["mfu"], dict)), None)
    body = []
    for r in rows:
        if isinstance(r.get("mfu"), dict):  # one line per measured step: eager, and compiled where run
            for m in r.get("mfu_rows", [r["mfu"]]):
                label = f"MFU at {m['batch']} x {m['length']}, {'compiled' if m.get('compiled') else 'eager'}"
                label += ", toolkit dropout" if m.get("dropout", "torch").startswith("toolkit") else ""
                body.append(cells({"row": label, "mfu": m["mfu"], "step_s": m["step_s"], "precision": m["precision"],
                                   "compile": bool(m.get("compiled"))}, trainer, flops))
            continue
        flat = dict(r)
        if r.get("graph") and not r.get("captured"):  # a CPU (--smoke): the same step, not captured
            flat["row"] = f"{r['row']} (not captured: no CUDA)"
        if "seed" in r and len({x.get("seed") for x in rows if x.get("key") == r.get("key")}) > 1:
            flat["row"] = f"{r['row']}, seed {r['seed']}"
        if n and flat["row"] in TOOLKIT_ROWS:  # the matmul row's model: the speed rows' model
            flat.setdefault("non_embedding_params", n)
        body.append(cells(flat, trainer, flops))
        if r.get("method") == "lora" and "step_s" in r:  # its full row's, measured the same way, before it
            full = next((f for f in rows if f.get("method") == "full" and "step_s" in f
                         and bool(f.get("compile")) == bool(r.get("compile"))
                         and bool(f.get("graph")) == bool(r.get("graph"))), None)
            if full is not None:
                body.append(lora_ratio(full, r))
    return (f"# make gpu-check\n\n{info['device']} | torch {info['torch']} (CUDA {info['cuda']}), transformers "
            f"{info['transformers']}, peft {info['peft']}, accelerate {info['accelerate']}, Python {info['python']} "
            f"| {info['date']} | commit {(info['commit'] or '?')[:10]}\n\n" + table(COLUMNS, body))


def check(args: argparse.Namespace) -> int:
    """The measured rows, one table, the JSON; then the rows other issues registered."""
    import tempfile

    info = header()
    rows: list[dict] = []
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        speed = speed_checkpoint(args, Path(tmp) / "bert-base")
        minilm = args.minilm or (speed if args.smoke else _minilm())
        began = time.perf_counter()
        args.rows_log = str(Path(args.json).with_suffix(".rows.log"))
        Path(args.rows_log).unlink(missing_ok=True)

        def budget_left() -> float | None:
            return args.budget_s - (time.perf_counter() - began) if args.budget_s else None

        for label, kind, checkpoint, flags in selected(args, speed, minilm):
            start = time.perf_counter()
            left = budget_left()
            if left is not None and left < MIN_ROW_S:  # the table is printed before the call's limit
                failed.append(label)
                print(f"{label}: not run, {left:.0f} s of --budget-s {args.budget_s} left", file=sys.stderr)
                continue
            try:
                result = row(args, kind, checkpoint, flags, left)
            except RuntimeError as exc:
                failed.append(label)
                print(f"{label}: FAILED\n{exc}", file=sys.stderr)
                continue
            rows.append({**(result if isinstance(result, dict) else {"result": result}), "row": label,
                         "precision": flags[flags.index("--precision") + 1], "seconds": time.perf_counter() - start,
                         "key": row_key(label, kind, flags),
                         **({"seed": int(flags[flags.index("--seed") + 1])} if "--seed" in flags else {})})
            print(f"{label} ({rows[-1]['precision']}): {rows[-1]['seconds']:.0f} s", file=sys.stderr, flush=True)
            Path(args.json).write_text(json.dumps({"header": info, "rows": rows}, indent=2, default=str))
        sections: dict[str, list[dict]] = {}
        for name, fn in (EXTRA_ROWS.items() if args.rows is None else ()):  # --rows: those rows only
            left = budget_left()
            if left is not None and left < MIN_ROW_S:
                failed.append(name)
                print(f"{name}: not run, {left:.0f} s of --budget-s {args.budget_s} left", file=sys.stderr)
                continue
            args.left_s = left  # what a section may spend
            found = [{**r, "section": name} for r in fn(args, info)]
            if name in EXTRA_TABLES:
                sections[name] = found
            else:
                rows += found
            Path(args.json).write_text(json.dumps({"header": info, "rows": rows, "sections": sections},
                                                  indent=2, default=str))
    Path(args.json).write_text(json.dumps({"header": info, "rows": rows, "sections": sections, "failed": failed},
                                          indent=2, default=str))
    print(render(info, rows))
    profiled = [r for r in rows if r.get("step_profile", {}).get("host_parts_ms")]
    if profiled:
        print("\n" + host_table(profiled))
    for notes in (accuracy_note(rows), graph_notes(info, rows)):
        if notes:
            print("\n" + notes)
    for name, found in sections.items():
        if found:
            print(f"\n## {name}\n\n{EXTRA_TABLES[name](found)}")
    return 1 if failed else 0


def _minilm() -> str:
    from bench.common import MINILM

    return MINILM  # the toolkit resolves it to its PyPI package; --minilm FOLDER elsewhere


SUITE_GRACE_S = 60  # after the interrupt, the seconds pytest has to print its summary before it is killed


def suite(args: argparse.Namespace, tests: Path | None = None) -> int:
    """The test suite with CUDA present and this machine's torch, spread over its cores. Test
    files that need the real MiniLM (a 90 MB package: over what a device call carries) are left
    out by name. With --budget-s, pytest is interrupted (SIGINT, as Ctrl-C) when the budget is
    spent, so it still prints its summary of what ran and failed before the device call's limit
    cuts the output off; the JSON says so (`interrupted`) and carries the failures pytest listed."""
    import torch

    tests = tests or HERE.parent / "tests"
    needs_minilm = sorted(p.name for p in tests.glob("test_*.py") if "MINILM" in p.read_text())
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfE", "-n", str(os.cpu_count() or 2), "-p", "no:cacheprovider",
           *[f"--ignore={tests / name}" for name in needs_minilm], str(tests)]
    print(f"torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}; left out (need MiniLM): "
          f"{', '.join(needs_minilm) or 'none'}", flush=True)
    proc = subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []
    deadline = time.monotonic() + args.budget_s if args.budget_s else None
    interrupted = False

    def signal_group(sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)

    def interrupt() -> None:  # Ctrl-C to pytest and its workers: the summary is still printed
        nonlocal interrupted
        interrupted = True
        signal_group(signal.SIGINT)
        timers.append(threading.Timer(SUITE_GRACE_S, signal_group, (signal.SIGKILL,)))
        timers[-1].start()

    timers = [threading.Timer(max(deadline - time.monotonic(), 0), interrupt)] if deadline else []
    for timer in timers:
        timer.start()
    for line in proc.stdout:  # shown as it comes, kept for the JSON
        print(line, end="", flush=True)
        lines.append(line.rstrip("\n"))
    code = proc.wait()
    for timer in list(timers):
        timer.cancel()
    failures = [line for line in lines if line.startswith(("FAILED ", "ERROR "))]
    Path(args.json).write_text(json.dumps({"header": header(), "suite_exit_code": code, "interrupted": interrupted,
                                           "budget_s": args.budget_s, "left_out": needs_minilm,
                                           "summary": lines[-1] if lines else "", "failures": failures}, indent=2))
    return code


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    _, unknown = wanted_rows(args.rows)
    if unknown:  # before anything is built or run
        p.error(f"--rows: unknown {', '.join(unknown)}; choose from {', '.join([*ROW_KEYS, *GROUPS])}")
    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    return suite(args) if args.suite else check(args)


if __name__ == "__main__":
    sys.exit(main())
