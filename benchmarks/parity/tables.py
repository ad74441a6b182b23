"""The Markdown tables: both sides (mean +- std over the seeds), the paired difference and the
baselines."""

from __future__ import annotations

import math
import statistics
from typing import Any

from parity.specs import SPECS
from toolkit.reports.core import no_spread


# --- tables -------------------------------------------------------------------------------------
def mean_std(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def paired(ours: list[float], theirs: list[float]) -> str:
    """Mean of the per-seed differences (toolkit - reference) ± their std, and the paired t."""
    diffs = [a - b for a, b in zip(ours, theirs)]
    if len(diffs) < 2:
        return f"{diffs[0]:+.2f} (1 seed)"
    sd, mean = statistics.stdev(diffs), statistics.mean(diffs)
    if no_spread(diffs):  # t is undefined (0/0) or infinite (float rounding: 1e15), neither a number to print
        same = "equal on every seed" if not mean else "the same difference on every seed"
        return f"{mean:+.2f} ± 0.00 ({same}, n = {len(diffs)})"
    t = mean / (sd / math.sqrt(len(diffs)))
    return f"{mean:+.2f} ± {sd:.2f} (t = {t:+.2f}, n = {len(diffs)})"


def table(columns: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows])


def render(task: str, result: dict) -> str:
    """The Markdown table of one task type: both sides, the paired difference, the baselines."""
    if task in ("objectives", "icl"):
        parts = result.items() if task == "objectives" else [("icl: batched against one at a time", result)]
        return "\n\n".join(f"**{name}**\n\n" + table(["measure", "value"], [[k, f"{v:.4g}" if isinstance(v, float) else v]
                                                                         for k, v in part.items()])
                           for name, part in parts)
    spec, rows = SPECS[task], result["rows"]
    seeds = sorted({r["seed"] for r in rows})
    by = {s: {r["seed"]: r for r in rows if r["side"] == s} for s in ("toolkit", "reference")}
    # on a GPU the CPU seconds say little: the whole side's wall time and the GPU's peak instead
    gpu = all("peak_gpu_mb" in r for r in rows)
    cols = ["side", *spec.metrics, "train samples/s", "eval samples/s",
            "wall s (whole side)" if gpu else "CPU s (whole side)", "peak GPU MB" if gpu else "peak RSS MB",
            "distinct outputs"]
    body = []
    for s, name in (("toolkit", "toolkit"), ("reference", "transformers (reference)")):
        got = [by[s][seed] for seed in seeds]
        body.append([name, *[mean_std([g["metrics"][m] * scale(m) for g in got]) for m in spec.metrics],
                     mean_std([g["train_samples_per_s"] for g in got]), mean_std([g["eval_samples_per_s"] for g in got]),
                     mean_std([g["wall_s"] for g in got]) if gpu else cpu_seconds(got, seeds),
                     f"{max(g['peak_gpu_mb' if gpu else 'peak_rss_mb'] for g in got):.0f}",
                     " ".join(g.get("distinct_predictions") or "" for g in got)])
    body.append(["paired difference", *[paired([by["toolkit"][x]["metrics"][m] * scale(m) for x in seeds],
                                               [by["reference"][x]["metrics"][m] * scale(m) for x in seeds])
                                        for m in spec.metrics], "", "", "", "", ""])
    for name, scores in result.get("baselines", {}).items():
        body.append([f"baseline: {name}", *[f"{scores[m] * scale(m):.2f}" if m in scores else "" for m in spec.metrics],
                     "", "", "", "", ""])
    budget = "smoke" if result["smoke"] else "the recipe's own protocol" if result.get("full") else spec.budget
    if result.get("set"):
        budget += "; then --set " + ", ".join(result["set"])  # overrides what the budget says
    if result.get("reference_batches") == "toolkit":
        budget += "; the reference trained on the toolkit's batches, in its order"
    if gpu:
        budget += f", on one {rows[0]['gpu']}"
    head = f"**{task}** ({budget}; seeds {', '.join(map(str, seeds))})"
    return head + "\n\n" + table(cols, body)


def cpu_seconds(got: list[dict], seeds: list[int]) -> str:
    """Mean ± std of the CPU seconds of the seeds that recorded them (rows measured before the
    column existed have none; those measured say which seeds they are)."""
    have = [(s, g["cpu_s"]) for s, g in zip(seeds, got) if "cpu_s" in g]
    if not have:
        return ""
    text = mean_std([c for _, c in have])
    return text if len(have) == len(got) else f"{text} (seed {', '.join(str(s) for s, _ in have)})"


def scale(metric: str) -> float:
    """ROUGE and SQuAD's EM / F1 are fractions on both sides; shown in percent like BLEU."""
    return 100.0 if metric.startswith("rouge") or metric.endswith(("f1", "exact_match")) else 1.0
