"""`make attention`: every attention module side by side, one report.

1. Training: each recipe in recipes/attention/sst2/ (real all-MiniLM-L6-v2, an SST-2 subset, the
   same budget for all) is run with `toolkit run` in its own process; the table gives dev
   accuracy, train time, peak memory (process RSS, as metrics.json has it) and how far the swapped
   model's last hidden states are from the stock model's before any training.
2. Length sweep: forward + backward of one MiniLM-sized attention call (1 x 12 heads x 32 dims)
   per module over sequence lengths, timed, with peak memory counted as the largest sum of live
   tensor storages that torch operators allocated (a dispatch mode sees every allocation and
   every free, backward included; the q, k, v inputs are not counted).

Writes RUNS/report.md, RUNS/sweep.png and RUNS/sweep.json.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from toolkit.arguments import ScriptParser  # noqa: E402
RECIPES = ROOT / "recipes" / "attention" / "sst2"
ORDER = ["sdpa", "dot", "bilinear", "additive", "sparsemax", "relative", "alibi", "local", "bigbird",
         "linear", "performer"]


# --- 1. training -------------------------------------------------------------------------------
def train_all(runs: Path, extra: list[str]) -> list[dict]:
    from toolkit import recipe as recipes

    rows = []
    for name in ORDER:
        path = RECIPES / f"minilm-{name}.yaml"
        cmd = [sys.executable, "-m", "toolkit.cli", "run", str(path), "--runs-dir", str(runs / "train"), *extra]
        print("$", " ".join(cmd[2:]), flush=True)
        subprocess.run(cmd, check=True, cwd=ROOT)
        recipe = recipes.load(path, extra)
        out = runs / "train" / recipe.name / recipe.hash
        metrics = json.loads((out / "metrics.json").read_text())
        rows.append({"module": name, "accuracy": metrics["eval"]["accuracy"],
                     "train_s": metrics["train_runtime_s"], "peak_mb": metrics["peak_memory_mb"],
                     "trainable": metrics["trainable_params"], **deviation(recipe)})
    return rows


def deviation(recipe) -> dict:
    """Last hidden states of the swapped vs the stock model on 64 dev sentences, before training:
    the swapped model as its run started (seeded with train.seed, as setup seeds it: a module's
    random start, additive's, is the run's draw; seed 0 measured another draw than the one trained)."""
    from accelerate.utils import set_seed

    from toolkit import models

    tok = models.load_tokenizer(models.resolve(recipe.model.checkpoint))
    texts = _dev_lines()[:64]
    batch = tok(texts, padding=True, truncation=True, max_length=recipe.task.max_length, return_tensors="pt")
    states = []
    for attention in ("eager", recipe.model.attention):
        set_seed(recipe.train.seed)
        model, _ = models.load(recipe.model.checkpoint, "sequence-classification", {"num_labels": 2}, attention)
        with torch.no_grad():
            states.append(model.eval()(**batch, output_hidden_states=True).hidden_states[-1])
    real = batch["attention_mask"].bool()
    diff = (states[1] - states[0])[real]
    return {"dev_max_abs": float(diff.abs().max()),
            "dev_rel": float(diff.norm() / states[0][real].norm())}


def _dev_lines() -> list[str]:
    from toolkit.tasks.glue import Glue

    task = Glue(subset="sst2")
    dev = task.load()["eval"][""]
    return list(dev["text_a"])


# --- 2. the length sweep -----------------------------------------------------------------------
class PeakMemory(TorchDispatchMode):
    """Largest sum of live storages allocated by operators inside the context."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.now = self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        for key, (ref, size) in list(self.live.items()):
            if ref.expired():
                self.now -= size
                del self.live[key]
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                if storage.data_ptr() not in self.live and storage.nbytes():
                    self.live[storage.data_ptr()] = (StorageWeakRef(storage), storage.nbytes())
                    self.now += storage.nbytes()
        self.peak = max(self.peak, self.now)
        return out


def layer_call(name: str, heads: int, dim: int):
    """A stand-in attention layer (encoder self-attention) and the function transformers would call."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from toolkit.attention import ATTENTION, PREFIX

    module = nn.Module()
    module.is_causal = False
    if name in ("sdpa", "eager"):
        from transformers.models.bert.modeling_bert import eager_attention_forward

        fn = ALL_ATTENTION_FUNCTIONS["sdpa"] if name == "sdpa" else eager_attention_forward
        return module, fn
    settings = ATTENTION.get(name)(**SWEEP_SETTINGS.get(name, {}))
    module.tk_settings, module.tk_cross, module.tk_index = settings, False, 0
    for pname, value in settings.parameters(heads, dim).items():
        module.register_parameter(PREFIX + pname, nn.Parameter(value))
    for bname, value in settings.buffers().items():
        module.register_buffer(PREFIX + bname, value)
    return module, ALL_ATTENTION_FUNCTIONS[name]


SWEEP_SETTINGS = {"local": {"window": 64}, "bigbird": {"block": 64, "global_blocks": 1, "random_blocks": 2},
                  "performer": {"features": 64}, "additive": {"dim": 16}, "relative": {"k": 16}}


def fwd_bwd(module, fn, n: int, heads: int, dim: int) -> None:
    q, k, v = (torch.randn(1, heads, n, dim, requires_grad=True) for _ in range(3))
    out, _ = fn(module, q, k, v, None, scaling=dim ** -0.5, dropout=0.0)  # no padding: one sequence
    out.float().pow(2).mean().backward()


def _best_ms(module, fn, n: int, heads: int, dim: int, budget_s: float = 1.0) -> float:
    """The fastest of 2 to 10 runs (about `budget_s` of them) after a warm-up: on a shared CPU the
    minimum is the run least disturbed by other processes."""
    fwd_bwd(module, fn, n, heads, dim)
    times: list[float] = []
    while len(times) < 2 or (len(times) < 10 and sum(times) < budget_s):
        start = time.perf_counter()
        fwd_bwd(module, fn, n, heads, dim)
        times.append(time.perf_counter() - start)
    return min(times) * 1000


def sweep(lengths: list[int], names: list[str], heads: int, dim: int, limit_mb: float,
          limit_ms: float) -> dict:
    """Length by length, every module in turn (so that a burst of load elsewhere hits all of
    them alike); a module stops when its next length is predicted over the memory or time limit."""
    calls = {name: layer_call(name, heads, dim) for name in names}
    results: dict = {name: {} for name in names}
    stopped: set[str] = set()
    for n in lengths:
        for name in names:
            if name in stopped:
                continue
            done = [results[name][m] for m in sorted(results[name])]
            if len(done) >= 2 and done[-1]["peak_mb"] ** 2 / max(done[-2]["peak_mb"], 1e-9) > limit_mb:
                print(f"{name:10s} n={n:5d}  skipped: predicted peak above {limit_mb:.0f} MiB", flush=True)
                stopped.add(name)
                continue
            if done and done[-1]["ms"] * 4 > limit_ms:
                print(f"{name:10s} n={n:5d}  skipped: predicted time above {limit_ms / 1000:.0f} s", flush=True)
                stopped.add(name)
                continue
            module, fn = calls[name]
            with PeakMemory() as mem:
                fwd_bwd(module, fn, n, heads, dim)
            peak = mem.peak / 2**20
            ms = _best_ms(module, fn, n, heads, dim)
            results[name][n] = {"ms": ms, "peak_mb": peak}
            print(f"{name:10s} n={n:5d}  {ms:9.1f} ms  {peak:9.1f} MiB", flush=True)
    return results


# --- the report --------------------------------------------------------------------------------
def _fmt(x: float, digits: int = 1) -> str:
    return f"{x:.{digits}f}"


def train_table(rows: list[dict]) -> str:
    head = ("| module | dev accuracy | train time (s) | peak memory (MiB, RSS) | trainable params "
            "| deviation from stock before training (max abs / relative) |\n|---|---|---|---|---|---|\n")
    return head + "".join(
        f"| {r['module']} | {r['accuracy']:.4f} | {_fmt(r['train_s'])} | {_fmt(r['peak_mb'], 0)} | "
        f"{r['trainable']:,} | {r['dev_max_abs']:.2e} / {r['dev_rel']:.2e} |\n" for r in rows)


def sweep_tables(res: dict, lengths: list[int]) -> str:
    def cell(name: str, n: int, key: str, ref: str | None) -> str:
        got = res.get(name, {}).get(n)
        if got is None:
            return "—"
        if ref is None:
            return _fmt(got[key], 0 if key == "peak_mb" else 1)
        base = res.get(ref, {}).get(n)
        return "—" if base is None else f"{got[key] / base[key]:.2f}"

    out = []
    for key, title in (("ms", "forward+backward time (ms)"), ("peak_mb", "peak memory (MiB)")):
        for ref, label in ((None, title), ("dot", f"{title.split(' (')[0]} / dot")):
            out.append(f"**{label}**\n\n| module | " + " | ".join(map(str, lengths)) + " |\n|---|"
                       + "---|" * len(lengths) + "\n")
            for name in res:
                out.append(f"| {name} | " + " | ".join(cell(name, n, key, ref) for n in lengths) + " |\n")
            out.append("\n")
    return "".join(out)


def targets(res: dict) -> str:
    def r(name: str, n: int, key: str, ref: str = "dot") -> float | None:
        a, b = res.get(name, {}).get(n), res.get(ref, {}).get(n)
        return None if a is None or b is None else a[key] / b[key]

    lines = []
    top = max((n for n in res.get("dot", {})), default=None)
    for name in ("linear", "performer"):
        ratio = r(name, top, "peak_mb") if top else None
        ns = sorted(res.get(name, {}))
        growth = res[name][ns[-1]]["peak_mb"] / res[name][ns[-2]]["peak_mb"] if len(ns) > 1 else None
        ok = ratio is not None and ratio <= 0.25
        lines.append(f"- {name}: peak memory at {top} tokens = {ratio:.3f} x dot (target <= 0.25: "
                     f"{'met' if ok else 'NOT met'}); x{growth:.2f} from {ns[-2]} to {ns[-1]} tokens "
                     f"(linear growth: x{ns[-1] / ns[-2]:.0f})" if ratio and growth else f"- {name}: not measured")
    for name in ("local", "bigbird"):
        lines.append(_faster_than_dot(res, name, r))
    ratio = r("dot", 512, "ms", "sdpa")
    if ratio:
        lines.append(f"- dot / sdpa time at 512 tokens: {ratio:.2f} (target <= 1.5: {'met' if ratio <= 1.5 else 'NOT met'})")
    return "\n".join(lines) + "\n"


def _faster_than_dot(res: dict, name: str, r) -> str:
    """The line of a sparse module's time target: its time / dot's at each length from 2048 that
    it ran. A length dot did not run (its predicted memory or time was over the sweep's limits) is
    said so and counts as met: dot could not go there. No such length: not measured. Finding: a
    length dot skipped made the line 'NOT met' beside no number, and a sweep without 2048 tokens
    (--lengths 128,512) said 'NOT met' for a target it never measured, exit 0."""
    points = [n for n in sorted(res.get(name, {})) if n >= 2048]
    if not points:
        return f"- {name}: time / dot from 2048 tokens: not measured (no length from 2048 in this sweep that {name} ran)"
    shown, ok = [], True
    for n in points:
        ratio = r(name, n, "ms")
        shown.append(f"{n}: dot not run (over the sweep's limits)" if ratio is None else f"{n}: {ratio:.2f}")
        ok = ok and (ratio is None or ratio < 1)
    return f"- {name}: time / dot from 2048 tokens: {', '.join(shown)} (target < 1: {'met' if ok else 'NOT met'})"


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    colours = plt.cm.tab20.colors  # 12 lines: the default cycle of 10 would repeat colours
    for i, (name, points) in enumerate(res.items()):
        ns = sorted(points)
        style = "--" if name in ("sdpa", "eager") else "-"
        for ax, key in zip(axes, ("ms", "peak_mb")):
            ax.plot(ns, [points[n][key] for n in ns], style, marker="o", ms=3, label=name,
                    color=colours[(2 * i) % 20 + (2 * i) // 20])
    for ax, title in zip(axes, ("forward+backward time (ms)", "peak memory (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    axes[1].legend(fontsize=8, ncol=2)
    fig.suptitle("one MiniLM-sized attention layer (12 heads x 32), CPU")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    p = ScriptParser(prog="benchmarks/attention.py", description=__doc__.splitlines()[0])
    p.add_argument("--runs-dir", default="runs/attention")
    p.add_argument("--skip-train", action="store_true")
    p.add_argument("--train-args", default="", help="overrides for every training run, e.g. 'task.max_train_samples=500'")
    p.add_argument("--lengths", default="128,256,512,1024,2048,4096")
    p.add_argument("--limit-mb", type=float, default=4096, help="skip a length whose predicted peak is above this")
    p.add_argument("--limit-s", type=float, default=20, help="skip a length whose predicted time is above this")
    p.add_argument("--reuse-sweep", action="store_true", help="take the sweep from RUNS/sweep.json (train only)")
    p.add_argument("--threads", type=int, default=1, help="torch threads for the sweep (1: least disturbed by "
                   "other processes on a shared machine)")
    args = p.parse_args()
    runs = Path(args.runs_dir)
    runs.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    transformers.logging.set_verbosity_error()
    rows = [] if args.skip_train else train_all(runs, args.train_args.split())
    lengths = [int(x) for x in args.lengths.split(",")]
    torch.set_num_threads(args.threads)
    if args.reuse_sweep:
        res = json.loads((runs / "sweep.json").read_text())["sweep"]
        res = {name: {int(n): v for n, v in points.items()} for name, points in res.items()}
    else:
        res = sweep(lengths, ["sdpa", "eager"] + ORDER[1:], heads=12, dim=32, limit_mb=args.limit_mb,
                    limit_ms=args.limit_s * 1000)
    (runs / "sweep.json").write_text(json.dumps({"train": rows, "sweep": res}, indent=1))
    plot(res, runs / "sweep.png")
    report = ["# Attention modules side by side\n\n",
              f"torch {torch.__version__}, transformers {transformers.__version__}, "
              f"{torch.get_num_threads()} CPU threads.\n\n"]
    if rows:
        budget = f" (overrides: `{args.train_args}`)" if args.train_args else ""
        report += [f"## Fine-tuned on the demo setting{budget}\n\n", train_table(rows), "\n"]
    report += ["## Length sweep (one attention layer, forward + backward)\n\n", sweep_tables(res, lengths),
               "## Targets\n\n", targets(res), "\n![sweep](sweep.png)\n"]
    (runs / "report.md").write_text("".join(report))
    print("".join(report))
    print(f"wrote {runs / 'report.md'} and {runs / 'sweep.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
