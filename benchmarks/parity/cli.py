"""`python benchmarks/parity TASK ...`: run both sides of every seed (or merge earlier runs'
--json files) and print the task's table."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from parity.common import BATCHES, GPT2, SEED_LIST, SET, checkpoint_path, reference_attention
from parity.objectives import denoise_stats, span_corruption_stats
from parity.specs import BATCHABLE, SPECS, baselines, one_sided, overrides, resolved_recipe
from parity.icl import icl_check
from parity.sides import finish_side, run_side, side, start_side
from parity.tables import render
from toolkit.arguments import ScriptParser


def compare(task: str, seeds: list[int], smoke: bool, full: bool = False, together: bool = False,
            sides: tuple[str, ...] = ("toolkit", "reference")) -> dict:
    """Both sides for every seed (toolkit first, each in its own process; `together`: the two
    sides of a seed at once, each on half the cores) and the baselines; `sides`: only those
    (`--only`, to pair with another run's other side by `--merge SIDE:FILE`)."""
    if task == "objectives":
        n = 200 if smoke else 10_000
        return {"span_corruption (T5)": span_corruption_stats(n), "denoise (BART)": denoise_stats(n)}
    if task == "icl":
        return icl_check(checkpoint_path(GPT2, smoke), examples=8 if smoke else 32, smoke=smoke)
    # the recipe both sides will resolve, checked here: a bad --set is one line, not two tracebacks
    path = checkpoint_path(SPECS[task].checkpoint, smoke)
    recipe = resolved_recipe(task, overrides(task, smoke, path, seeds[0], full))
    reference_attention(recipe)  # an attention the reference cannot load: one line, before any side runs
    # a --set the reference cannot take (or a recipe it cannot run as the toolkit does): one line
    one_sided(task, recipe, resolved_recipe(task, overrides(task, smoke, path, seeds[0], full, sets=[])))
    rows = []
    for seed in seeds:
        if together and len(sides) == 2:  # both sides of the seed at once, each on half the cores: the same load for both
            threads = max(1, (os.cpu_count() or 2) // 2)
            procs = {w: start_side(task, w, seed, smoke, full, threads) for w in ("toolkit", "reference")}
            got = [(w, finish_side(p, task, w, seed)) for w, p in procs.items()]
        else:  # one after the other, each with every core
            got = [(w, run_side(task, w, seed, smoke, full)) for w in sides]
        for which, row in got:
            row["together"] = together
            rows.append(row)
            print(f"{task} seed {seed} {which}: {row['metrics']}", file=sys.stderr, flush=True)
        same_examples(rows)
    return {"smoke": smoke, "full": full, "set": list(SET), "reference_batches": BATCHES[0], "rows": rows,
            "baselines": baselines(task, recipe)}


def same_examples(rows: list[dict], where: str = "") -> None:
    """A ValueError, one line, where the two sides of a seed scored different eval examples (their
    count and the toolkit's metrics.json fingerprint, eval_sha256): their paired difference would
    be over different examples, not a number to print."""
    seen: dict[int, dict[str, tuple]] = {}
    for row in rows:
        if row.get("eval_sha256") is not None:  # (rows recorded before the fingerprint have none)
            seen.setdefault(row["seed"], {})[row["side"]] = (row["eval_examples"], row["eval_sha256"])
    for seed, got in seen.items():
        if len(set(got.values())) > 1:
            raise ValueError(f"{where}seed {seed}: the toolkit scored {got['toolkit'][0]} eval examples and the reference "
                             f"{got['reference'][0]}, not the same ones (eval_sha256 {got['toolkit'][1][:12]} against "
                             f"{got['reference'][1][:12]}): the paired difference would compare different examples")


def merge(task: str, files: list[str]) -> dict:
    """One result from several runs' --json files of `task`: their rows together (each seed once),
    the first file's baselines. The runs must share the budget (smoke, real or full, --set). A
    file named `SIDE:FILE` gives only that side's rows (`--only` runs, or one side of a run paired
    with the other side of another); the reference rows must share their batches
    (`--reference-batches`)."""
    parts = []
    for name in files:
        only, _, rest = name.partition(":")
        only, f = (only, Path(rest)) if only in ("toolkit", "reference") and rest else (None, Path(name))
        try:
            part = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"--merge: {f}: not a readable --json result ({type(err).__name__})") from None
        if not isinstance(part, dict) or not isinstance(part.get("rows"), list) or not part["rows"]:
            raise ValueError(f"--merge: {f}: no 'rows' (is it the --json of a `{task}` run?)")
        missing = [m for m in SPECS[task].metrics if m not in part["rows"][0].get("metrics", {})]
        if missing:
            raise ValueError(f"--merge: {f}: its rows lack {', '.join(missing)}: not a `{task}` result")
        rows = [r for r in part["rows"] if only in (None, r.get("side"))]
        if not rows:
            raise ValueError(f"--merge: {f}: no {only} rows")
        parts.append((f, part, rows))
    budget = {(bool(p.get("smoke")), bool(p.get("full")), tuple(p.get("set", []))) for _, p, _ in parts}
    if len(budget) > 1:
        raise ValueError("--merge: the files ran different budgets (smoke, real, full, --set); merge runs of one budget")
    batches = {p.get("reference_batches", "trainer") for _, p, rows in parts if any(r["side"] == "reference" for r in rows)}
    if len(batches) > 1:
        raise ValueError("--merge: the reference rows trained on different batches (--reference-batches); "
                         "merge reference rows of one kind")
    seen: dict[tuple, Path] = {}
    for f, _, rows in parts:
        for row in rows:
            key = (row["side"], row["seed"])
            if key in seen:
                raise ValueError(f"--merge: seed {row['seed']} ({row['side']}) is in both {seen[key]} and {f}")
            seen[key] = f
    unpaired = sorted({seed for side, seed in seen if (("reference" if side == "toolkit" else "toolkit"), seed) not in seen})
    if unpaired:
        raise ValueError(f"--merge: seed {unpaired[0]} has one side only; give each seed both sides")
    same_examples([row for _, _, rows in parts for row in rows], "--merge: ")
    first = parts[0][1]
    return {"smoke": first.get("smoke", False), "full": first.get("full", False), "set": first.get("set", []),
            "reference_batches": batches.pop() if batches else "trainer",
            "rows": [row for _, _, rows in parts for row in rows], "baselines": first.get("baselines", {})}


def main(argv: list[str] | None = None) -> int:
    parser = ScriptParser(prog="benchmarks/parity", description="Every task type against transformers' own pipeline: "
                          "the toolkit's recipe beside a Trainer-based reference run.")
    parser.add_argument("task", choices=[*SPECS, "objectives", "icl"])
    parser.add_argument("--seeds", default=SEED_LIST, help="comma-separated training seeds")
    parser.add_argument("--smoke", action="store_true", help="tiny random models and a few examples: seconds")
    parser.add_argument("--full", action="store_true",
                        help="the shipped recipe's own protocol, no budget overrides (for a GPU)")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--together", action="store_true",
                        help="run a seed's two sides at once, each on half the cores (same load on both)")
    parser.add_argument("--merge", nargs="+", metavar="JSON",
                        help="run nothing: one table from the --json files of earlier runs of this task "
                             "(seeds run in separate calls or on separate machines); SIDE:JSON takes one side's rows")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a recipe override for both sides after the budget's (e.g. train.epochs=2); repeatable")
    parser.add_argument("--reference-batches", choices=["trainer", "toolkit"], default="trainer",
                        help="trainer: the reference trains on Trainer's own sampler (the recipe's grouping); "
                             f"toolkit: on the toolkit's very batches, in its order ({', '.join(BATCHABLE)})")
    parser.add_argument("--only", choices=["toolkit", "reference"],
                        help="run this side alone (pair it with another run's other side: --merge SIDE:FILE)")
    parser.add_argument("--side", choices=["toolkit", "reference"], help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=42, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    bad = [o for o in args.set if "=" not in o or o.startswith(("model.checkpoint=", "train.seed="))]
    if bad:
        parser.error(f"--set: '{bad[0]}' is not a KEY=VALUE recipe override (the checkpoint and the "
                     "seed are the harness's: use --seeds)")
    if args.set and (args.merge or args.task not in SPECS):
        parser.error(f"--set: {'--merge runs nothing' if args.merge else f'{args.task} trains nothing'}, "
                     "so there is no recipe to override")
    if args.reference_batches == "toolkit" and args.task not in BATCHABLE:
        parser.error(f"--reference-batches toolkit: {args.task}'s reference is not wired to the toolkit's batches; "
                     f"use it with {', '.join(BATCHABLE)}")
    if args.reference_batches == "toolkit" and (args.merge or args.only == "toolkit"):
        parser.error("--reference-batches toolkit: " + ("--merge trains nothing (its files say whose batches)"
                                                        if args.merge else "--only toolkit trains no reference"))
    if args.only and (args.merge or args.together):
        parser.error(f"--only: {'--merge runs nothing' if args.merge else '--together runs both sides at once'}; "
                     "drop one of the two")
    SET[:], BATCHES[:] = args.set, [args.reference_batches]
    if args.side:
        print("ROW " + json.dumps(side(args)), flush=True)
        return 0
    from toolkit.errors import UserError

    try:
        result = merge(args.task, args.merge) if args.merge else \
            compare(args.task, parse_seeds(args.seeds), args.smoke, args.full, args.together,
                    (args.only,) if args.only else ("toolkit", "reference"))
    except (ValueError, UserError) as err:  # a bad --merge / --seeds, or a recipe --set makes invalid
        parser.error(str(err))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    if args.only:
        print("\n".join(f"{args.task} seed {r['seed']} {r['side']}: {r['metrics']}" for r in result["rows"]))
        return 0
    print(render(args.task, result))
    return 0


def parse_seeds(text: str) -> list[int]:
    try:
        return [int(s) for s in text.split(",") if s.strip()] or [42]
    except ValueError:
        raise ValueError(f"--seeds: '{text}' is not a comma-separated list of integers") from None
