"""Bytes of one step checkpoint per method: the demo recipes on the real MiniLM, stopped after
one optimizer step (the checkpoint is the one a resume would read).

    python benchmarks/checkpoint_bytes.py [--runs-dir /tmp/ckpt-bytes]

Prints a Markdown table: weights file, optimizer state, everything in the folder, and the
final model/ folder the run would keep.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from toolkit.arguments import ScriptParser

ROOT = Path(__file__).resolve().parents[1]
METHODS = ["full", "freeze", "lora", "houlsby", "pfeiffer", "prompt_tuning", "prefix_tuning",
           "p_tuning", "ia3", "bitfit"]


def folder_bytes(folder: Path, pattern: str = "*") -> int:
    return sum(p.stat().st_size for p in folder.rglob(pattern) if p.is_file())


def main() -> None:
    parser = ScriptParser(prog="benchmarks/checkpoint_bytes.py", description=__doc__.splitlines()[0])
    parser.add_argument("--runs-dir", default="/tmp/checkpoint-bytes")
    args = parser.parse_args()
    rows = []
    for method in METHODS:
        recipe = ROOT / "recipes" / "demo" / "sst2" / f"minilm-{method}.yaml"
        root = Path(args.runs_dir) / method
        subprocess.run([sys.executable, "-m", "toolkit.cli", "run", str(recipe), "--runs-dir", str(root),
                        "--stop-after", "1", "task.max_train_samples=64", "task.max_eval_samples=32"],
                       check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
        (step,) = root.rglob("step-000001")
        rows.append((method, folder_bytes(step, "model*.safetensors"), folder_bytes(step, "optimizer*"),
                     folder_bytes(step)))
    print("| method | weights in the checkpoint | optimizer state | whole checkpoint |")
    print("|---|---|---|---|")
    for method, weights, optim, whole in rows:
        print(f"| {method} | {size(weights)} | {size(optim)} | {size(whole)} |")


def size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


if __name__ == "__main__":
    main()
