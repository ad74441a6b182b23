"""Sharded launches measured: one process under each strategy (plain, FSDP2, DeepSpeed ZeRO-2 and
ZeRO-3) for bert-base full fine-tuning and gpt2 LoRA on SST-2, each against the plain run on the
same seed and batches: did it run (or stop with one line), the largest relative loss difference,
the same dev scores, the saved model reloading in one process with the same scores, peak memory.

    python benchmarks/gpu_sharding.py            # on a GPU: full-size models with random weights
    python benchmarks/gpu_sharding.py --smoke    # on CPU: --smoke models, each strategy on a CPU process
    python benchmarks/gpu_sharding.py --cases gpt2 --strategies zero3,fsdp --budget-s 240 --json rows.json

Each row is printed (stderr) and written to --json as it finishes, so a call cut short keeps the
rows it measured; with --budget-s no launch outlives the budget (the H200 call of 2026-11-27 asked
for four launches under a 300 s limit, took them all in silence and came back with nothing).

The models are random-weight bert-base / gpt2 built from their configs with the real tokenizers
($TOOLKIT_TOKENIZERS): no download, the real sizes. `rows()` returns the rows (dicts) for
`make gpu-check`; `table()` prints them as Markdown.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from toolkit.arguments import ScriptParser

# Everything a benchmark reads is here (the data, the tokenizers, random-weight or packaged
# models): off-line, a Hub id is not looked up on the network first (a machine without one, as the
# lent GPU machines are, spent ~3 s of retries per row process on it), and every row's process
# inherits this.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
CASES = [("bert-base-uncased", "{name: full}"), ("gpt2", "{name: lora, r: 8}")]
STRATEGIES = ["plain", "fsdp", "zero2", "zero3"]
RECIPE = """model: {{checkpoint: {checkpoint}, dropout: 0.0}}
task: {{name: glue, subset: sst2, max_length: 64, max_train_samples: {train}, max_eval_samples: {eval}}}
method: {method}
train: {{epochs: 1, lr: 2.0e-5, seed: 7, batch_size: 8, eval_batch_size: 32, log_every: 1, keep_best: false,
         mixed_precision: 'no'}}
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def random_checkpoint(name: str, where: Path) -> str:
    """A full-size model of `name`'s family with random weights and its real tokenizer."""
    import torch
    from transformers import AutoModel, AutoTokenizer, BertConfig, GPT2Config

    folder = where / f"random-{name}"
    if (folder / "config.json").is_file():
        return str(folder)
    tok = AutoTokenizer.from_pretrained(Path(os.environ.get("TOOLKIT_TOKENIZERS", ROOT.parent / "shared" / "tokenizers")) / name)
    config = {"bert-base-uncased": BertConfig, "gpt2": GPT2Config}[name]()
    config.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)  # the same model in every call: rows of two calls compare
        model = AutoModel.from_config(config)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def _pythonpath() -> str:
    """This checkout first, then what the caller had: `make gpu-check` puts the carried wheels'
    site there (the GPU image's own transformers is too old and it has no DeepSpeed)."""
    return os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))


def launch(strategy: str, recipe: Path, runs: Path, smoke: bool,
           timeout: float = 1800) -> subprocess.CompletedProcess:
    """One process: plain `toolkit run`, or `accelerate launch` with the strategy's config.
    Stopped after `timeout` seconds with everything it started (accelerate's launcher starts
    the training process as its child: killing the launcher alone left that one on the GPU)."""
    tail = ["-m", "toolkit.cli", "run", str(recipe), "--runs-dir", str(runs)] + ["--smoke"] * smoke
    if strategy == "plain":
        cmd = [sys.executable, *tail]
    else:
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
               str(ROOT / "configs" / "accelerate" / f"{strategy}.yaml"), "--num_processes", "1",
               "--main_process_port", str(_port()), *tail]
    env = {**os.environ, "PYTHONPATH": _pythonpath(), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    return run_group(cmd, timeout, cwd=ROOT, env=env)


def run_group(cmd: list[str], timeout: float, **popen: object) -> subprocess.CompletedProcess:
    """`cmd` run to its end, its output kept; past `timeout` seconds it is killed with every
    process it started (its own process group), and TimeoutExpired raised."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, **popen)  # type: ignore[call-overload]
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _run_folder(runs: Path) -> Path | None:
    found = [p.parent for p in runs.rglob("recipe.yaml")]
    return found[0] if len(found) == 1 else None


def _losses(run: Path) -> list[float]:
    lines = [json.loads(l) for l in (run / "log.jsonl").read_text().splitlines()]
    return [l["loss"] for l in lines if "loss" in l]


RELOAD = """import sys
from toolkit.cli import main
for run in sys.argv[1:]:
    try:
        main(["eval", run])
    except Exception as exc:  # this run's model does not reload; the next is still scored
        print(f"error: {run}: {type(exc).__name__}: {exc}", file=sys.stderr)
"""


def _reload(runs: list[Path]) -> list[dict]:
    """Each saved model scored in turn in one fresh process, apart from the launches that trained
    them (from_pretrained / PEFT); {} for one that did not load or score. One process for all: an
    interpreter's start-up was most of a --smoke reload's time."""
    for run in runs:
        (run / "eval-eval.json").unlink(missing_ok=True)
    if runs:
        subprocess.run([sys.executable, "-c", RELOAD, *map(str, runs)], cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": _pythonpath()}, capture_output=True, text=True, timeout=1800)
    files = [run / "eval-eval.json" for run in runs]
    return [json.loads(file.read_text())["eval"] if file.is_file() else {} for file in files]


def _last_line(proc: subprocess.CompletedProcess) -> str:
    lines = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
    return lines[0] if lines else (proc.stderr.strip().splitlines() or ["?"])[-1][:200]


def row(name: str, method: str, strategy: str, work: Path, smoke: bool, plain: dict | None,
        timeout: float = 1800) -> dict:
    """One launch measured; `plain` is the plain run's row (None for the plain run itself)."""
    checkpoint = name if smoke else random_checkpoint(name, work)
    sizes = {"train": 64, "eval": 32} if smoke else {"train": 160, "eval": 200}  # 20 steps of 8
    recipe = work / f"{name}-{strategy}.yaml"
    recipe.write_text(RECIPE.format(checkpoint=checkpoint, method=method, **sizes))
    runs = work / f"runs-{name}-{strategy}"
    out = {"model": name, "method": method.split(",")[0].split(":")[1].strip(" }"), "strategy": strategy,
           "processes": 1}
    start = time.perf_counter()
    try:
        proc = launch(strategy, recipe, runs, smoke, timeout)
    except subprocess.TimeoutExpired:
        return {**out, "ran": "stopped", "seconds": round(time.perf_counter() - start, 1),
                "note": f"--budget-s ran out after {timeout:.0f} s of it"}
    out["seconds"] = round(time.perf_counter() - start, 1)
    run = _run_folder(runs)
    if proc.returncode != 0 or run is None or not (run / "metrics.json").is_file():
        return {**out, "ran": "refused" if proc.returncode == 2 else "failed", "note": _last_line(proc)}
    metrics = json.loads((run / "metrics.json").read_text())
    losses = _losses(run)
    out.update(ran="yes", device=metrics["device"], distributed_type=metrics["distributed_type"],
               steps=metrics["train_steps"], eval=metrics["eval"], losses=losses,
               peak_memory_mb=round(metrics["peak_memory_mb"], 1))
    out["run"] = run  # scored again after every launch (`rows`), for "reloads"
    if plain is not None and plain.get("ran") == "yes":
        ref = plain["losses"]
        out["max_rel_loss_diff"] = (max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, ref))
                                    if len(losses) == len(ref) else None)
        out["same_eval"] = {k: v for k, v in metrics["eval"].items() if not k.startswith("loss")} == \
            {k: v for k, v in plain["eval"].items() if not k.startswith("loss")}
    return out


MIN_LAUNCH_S = 45  # --budget-s: no launch starts with less left (a gpt2 launch took 60-90 s on a GPU)
RELOAD_S = 40  # kept back from --budget-s for the reload of the saved models


def rows(smoke: bool = False, work: Path | None = None, cases: list | None = None,
         strategies: list[str] | None = None, budget_s: float | None = None,
         on_row: Callable[[list[dict]], None] | None = None) -> list[dict]:
    """Every case under every strategy, the plain run first whether asked for or not: the others
    are compared to it. `on_row(rows so far)` after each launch; with `budget_s`, a launch gets
    what is left of it (less RELOAD_S), and those with under MIN_LAUNCH_S left are listed as not
    run."""
    work = Path(work or tempfile.mkdtemp(prefix="gpu-sharding-"))
    began = time.perf_counter()

    def left() -> float:
        return 1800.0 if budget_s is None else budget_s - (time.perf_counter() - began)

    out: list[dict] = []
    order = ["plain"] + [s for s in strategies or STRATEGIES if s != "plain"]
    for name, method in cases or CASES:
        plain = None
        for strategy in order:
            room = left() - (RELOAD_S if budget_s is not None else 0)
            if room < MIN_LAUNCH_S:
                got = {"model": name, "strategy": strategy, "ran": "not run",
                       "note": f"{max(left(), 0):.0f} s of --budget-s {budget_s:g} left"}
            else:
                got = row(name, method, strategy, work, smoke, plain, room)
            plain = got if strategy == "plain" else plain
            out.append(got)
            print(f"{name} {strategy}: {got['ran']}, {got.get('seconds', 0):.0f} s"
                  + (f" ({got['note']})" if got.get("note") else ""), file=sys.stderr, flush=True)
            if on_row is not None:
                on_row(out)
    done = [r for r in out if r.get("ran") == "yes"]
    runs = [r.pop("run") for r in done]
    if done and left() < RELOAD_S / 2:
        for r in done:
            r["reloads"], r["note"] = None, "reload not run: --budget-s spent"
        return out
    for r, reloaded in zip(done, _reload(runs)):
        r["reloads"] = bool(reloaded) and all(abs(reloaded[k] - v) <= 1e-4 * max(1.0, abs(v))
                                              for k, v in r["eval"].items())
    return out


COLUMNS = ["model", "method", "strategy", "processes", "ran", "device", "distributed_type", "steps",
           "max_rel_loss_diff", "same_eval", "reloads", "peak_memory_mb", "seconds", "note"]


def table(found: list[dict]) -> str:
    def cell(v: object) -> str:
        if isinstance(v, float):
            return f"{v:.2e}" if abs(v) < 1e-2 and v else f"{v:g}"
        return "" if v is None else str(v).replace("|", "/")

    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in COLUMNS) + " |" for r in found]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = ScriptParser(prog="benchmarks/gpu_sharding.py", description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="--smoke models on CPU (the test runs this)")
    parser.add_argument("--json", help="also write the rows here")
    parser.add_argument("--cases", default="", help="model names to run, comma-separated (default: all)")
    parser.add_argument("--strategies", default="", help="comma-separated subset of " + ",".join(STRATEGIES))
    parser.add_argument("--budget-s", type=float, default=None,
                        help="seconds for the whole call: no launch outlives it, the rest are listed as not run")
    args = parser.parse_args(argv)
    asked = {"--cases": ([c for c in args.cases.split(",") if c], [c[0] for c in CASES]),
             "--strategies": ([s for s in args.strategies.split(",") if s], STRATEGIES)}
    for flag, (names, known) in asked.items():
        unknown = [n for n in names if n not in known]
        if unknown:  # one line, before any launch (the first GPU call ran 'fsdp2' into a traceback)
            parser.error(f"{flag}: no '{unknown[0]}'; choose from {', '.join(known)}")
    cases = [c for c in CASES if not asked["--cases"][0] or c[0] in asked["--cases"][0]]
    def write(found: list[dict]) -> None:  # after every launch: a call cut short keeps its rows
        if args.json:
            Path(args.json).write_text(json.dumps(found, indent=2, default=str) + "\n")

    found = rows(args.smoke, cases=cases, strategies=asked["--strategies"][0] or None, budget_s=args.budget_s,
                 on_row=write)
    write(found)
    print(table(found))
    return 0 if all(r.get("ran") in ("yes", "refused") for r in found) else 1


if __name__ == "__main__":
    sys.exit(main())
