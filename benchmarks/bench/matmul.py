"""Section matmul: the machine's measured matmul throughput and the model-FLOPs utilisation."""

from __future__ import annotations

import argparse
import statistics

import torch

from toolkit import models

from bench.common import (cuda, device, mfu, non_embedding_params, random_batch, run_row, step_breakdown,
                          table, time_alternating, timed, training_step)


def matmul_gflops(n: int, dtype: torch.dtype, reps: int = 10) -> float:
    """GFLOP/s of an n x n @ n x n matmul (2 n^3 FLOPs), median of `reps` timed after 3 warm-ups."""
    a = torch.randn(n, n, device=device()).to(dtype)
    b = torch.randn(n, n, device=device()).to(dtype)
    for _ in range(3):
        a @ b
    times = [timed(lambda: a @ b) for _ in range(reps)]
    return 2 * n**3 / statistics.median(times) / 1e9


def matmul_sizes(args: argparse.Namespace) -> list[tuple[str, int, str]]:
    """(dtype, size, note): fp32 always; bf16 on CUDA at full size, on CPU only at a small size
    (most CPUs have no bf16 matrix units: a bf16 matmul is several times slower than fp32, and a
    bf16 autocast training step far slower still); fp16 on CUDA when asked for."""
    n = args.matmul_size or (8192 if cuda() else 2048)
    rows = [("fp32", n, "")]
    if cuda():
        rows.append(("bf16", n, ""))
        if args.precision == "fp16":
            rows.append(("fp16", n, ""))
    else:
        rows.append(("bf16", args.cpu_bf16_size, "CPU: small size only (--cpu-bf16-size)"))
    return rows


def matmul_row(args: argparse.Namespace, checkpoint: str) -> dict:
    """Matmul GFLOP/s per dtype, then the MFU of a full fine-tuning step of the bench's model on
    a batch-size x length batch of real tokens, against the matmul rate of the run's precision."""
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    matmuls = [{"dtype": name, "size": n, "gflops": matmul_gflops(n, dtypes[name]), "note": note}
               for name, n, note in matmul_sizes(args)]
    reference = next(m for m in matmuls if m["dtype"] == {"no": "fp32"}.get(args.precision, args.precision))
    steps = args.mfu_steps or (6 if not cuda() else 20)
    # (toolkit dropout, compiled): on CPU the step as the toolkit runs it and with torch's dropout
    # (train.fast_dropout=false); on a GPU (where the dropout is torch's either way) eager and
    # compiled as train.compile compiles it (also where a compile backend is set: the suite's
    # smoke). Fresh models, their steps alternating; the compiled one's warm-up compiles it.
    from toolkit import compiling

    variants = [(True, False)] + ([(False, False)] if not cuda() else [])
    if cuda() or compiling.BACKEND is not None:
        variants.append((False, True))
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state()
    loaded = [models.load(checkpoint, "sequence-classification", {"num_labels": 2}, args.attention)
              for _ in variants]
    batch = random_batch(args.mfu_batch_size, args.mfu_length, len(loaded[0][1]))
    step_fns = [training_step(model, batch, args.precision, fast, compiled)
                for (model, _), (fast, compiled) in zip(loaded, variants)]
    all_times = time_alternating(step_fns, warmup=2, steps=steps)
    n = non_embedding_params(loaded[0][0])
    rows = []
    for (fast, compiled), times, step in zip(variants, all_times, step_fns):
        step_s = statistics.median(times)
        tokens_per_s = args.mfu_batch_size * args.mfu_length / step_s
        rows.append({"model": args.model_label, "non_embedding_params": n, "batch": args.mfu_batch_size,
                     "length": args.mfu_length, "precision": args.precision, "steps": steps,
                     "dropout": ("torch" if not fast or cuda() else "toolkit (default)" if args.precision == "no"
                                 else "toolkit's flag on; autocast's bf16/fp16 tensors keep torch's"),
                     "compiled": compiled,
                     "step_s": step_s, "tokens_per_s": tokens_per_s, "model_gflops": 6 * n * tokens_per_s / 1e9,
                     "reference": f"{reference['dtype']} matmul, n={reference['size']}",
                     "reference_gflops": reference["gflops"],
                     "mfu": mfu(n, tokens_per_s, reference["gflops"] * 1e9), "breakdown": step_breakdown(step)})
    return {"matmul": matmuls, "mfu": rows[0], "mfu_rows": rows}


def matmul_tables(result: dict) -> str:
    first = table(["dtype", "n (n x n @ n x n)", "GFLOP/s", "note"],
                  [[r["dtype"], r["size"], f"{r['gflops']:.1f}", r["note"]] for r in result["matmul"]])
    second = table(["model", "non-embedding params", "batch x length", "precision", "dropout", "compiled", "step s (median)",
                    "tokens/s", "model GFLOP/s (6N x tokens/s)", "reference", "MFU"],
                   [[m["model"], f"{m['non_embedding_params']:,}", f"{m['batch']} x {m['length']}",
                     m["precision"], m.get("dropout", "torch"), str(m.get("compiled", False)), f"{m['step_s']:.3f}", f"{m['tokens_per_s']:.0f}",
                     f"{m['model_gflops']:.1f}", f"{m['reference']}: {m['reference_gflops']:.1f} GFLOP/s",
                     f"{100 * m['mfu']:.1f}%"] for m in result.get("mfu_rows", [result["mfu"]])])
    rows = [m for m in result.get("mfu_rows", []) if m.get("breakdown")]
    if rows:
        parts = list(rows[0]["breakdown"])
        second += "\n\nWhere one profiled step's time goes (seconds, by op self time; the profiler adds a little):\n\n"
        second += table(["part", *(f"dropout: {m['dropout']}" + (", compiled" if m.get("compiled") else "") for m in rows)],
                        [[part, *(f"{m['breakdown'][part]:.3f} ({100 * m['breakdown'][part] / sum(m['breakdown'].values()):.0f}%)"
                                  for m in rows)] for part in parts])
        gemm = rows[0]["breakdown"][parts[0]]
        second += (f"\n\nThe linear layers' matmuls alone run at {6 * rows[0]['non_embedding_params'] * rows[0]['batch'] * rows[0]['length'] / gemm / 1e9:.0f} "
                   f"GFLOP/s in the first row: the gap to 100% MFU is the rest of the step.")
    return first + "\n\n" + second


def section_matmul(args: argparse.Namespace, checkpoint: str) -> tuple[dict, str]:
    result = run_row("matmul", checkpoint)
    m = result["mfu"]
    text = (f"### Matmul throughput and MFU\n\n{matmul_tables(result)}\n\n"
            f"Step: forward, backward and fused AdamW over every parameter, {m['batch']} x {m['length']} random "
            f"tokens, no padding, median of {m['steps']} steps after 2 untimed; on CPU with the toolkit's "
            "dropout (train.fast_dropout, the default) and with torch's, two fresh models whose steps "
            "alternate. MFU = 6 x non-embedding params x tokens/s / measured matmul FLOP/s of the run's precision.")
    return result, text
