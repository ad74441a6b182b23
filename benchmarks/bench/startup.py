"""Section startup: wall time of `toolkit ls`, `toolkit validate`, a `--smoke` run, and time to the
first error of a run with a mistake in it (said before torch is imported: toolkit/recipe.py check_data)."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time


from bench.common import ROOT, table


STARTUP_RECIPE = "recipes/demo/sst2/minilm-full.yaml"


STARTUP = [  # (label, toolkit arguments, target seconds, exit code); {runs} is a fresh temporary folder
    ("toolkit ls", ["ls"], 2.0, 0),
    (f"toolkit validate {STARTUP_RECIPE}", ["validate", STARTUP_RECIPE], 2.0, 0),
    (f"toolkit run {STARTUP_RECIPE} --smoke", ["run", STARTUP_RECIPE, "--smoke", "--runs-dir", "{runs}", "--force"], 8.0, 0),
    # time to the first error: each is one line and exit 2 before any library loads
    (f"first error: toolkit run {STARTUP_RECIPE} train.lrr=1e-4 (typo)",
     ["run", STARTUP_RECIPE, "train.lrr=1e-4", "--runs-dir", "{runs}"], 1.0, 2),
    ("first error: toolkit run demo/own-data/minilm-lora task.train_file=missing.csv",
     ["run", "demo/own-data/minilm-lora", "task.train_file={runs}/missing.csv", "--runs-dir", "{runs}"], 1.0, 2),
]


def toolkit_command(arguments: list[str]) -> list[str]:
    """What the `toolkit` console script runs (toolkit.cli:main), with this interpreter."""
    return [sys.executable, "-c", "import sys; from toolkit.cli import main; sys.exit(main())", *arguments]


def startup_rows(repeats: int = 3) -> list[dict]:
    """Wall time of each start-up command as a subprocess from this checkout, median of
    `repeats`; the smoke run gets a fresh runs folder each time (and --force)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    rows = []
    for label, arguments, target, code in STARTUP:
        times = []
        for _ in range(repeats):
            with tempfile.TemporaryDirectory() as tmp:
                cmd = toolkit_command([a.replace("{runs}", tmp) for a in arguments])
                start = time.perf_counter()
                done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
                times.append(time.perf_counter() - start)
            if done.returncode != code:
                raise RuntimeError(f"{label} failed ({done.returncode}):\n{done.stderr[-2000:]}")
        rows.append({"command": label, "median_s": statistics.median(times), "min_s": min(times),
                     "max_s": max(times), "repeats": repeats, "target_s": target,
                     "met": statistics.median(times) < target})
    return rows


def startup_table(rows: list[dict]) -> str:
    return table(["command", "median s", "min-max s", "target", "met"],
                 [[f"`{r['command']}`", f"{r['median_s']:.2f}", f"{r['min_s']:.2f}-{r['max_s']:.2f}",
                   f"< {r['target_s']:.0f} s", "yes" if r["met"] else "NO"] for r in rows])


def section_startup(args: argparse.Namespace, checkpoint: str) -> tuple[list[dict], str]:
    rows = startup_rows(args.startup_repeats)
    text = (f"### Start-up\n\nEach command a fresh `python -c 'from toolkit.cli import main; main()'` (what "
            f"the `toolkit` script runs) from {ROOT}, wall time, median of {args.startup_repeats}.\n\n"
            f"{startup_table(rows)}")
    return rows, text
