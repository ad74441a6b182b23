"""`make gpu-check` on a CPU (`--smoke`): the whole prepared GPU run, so that it never rots
between the sessions that are lent a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def test_gpu_check_smoke_measures_every_row(tmp_path: Path) -> None:
    out = tmp_path / "gpu-check.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--smoke", "--optimizer", "--json", str(out)],
                          capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "# make gpu-check" in done.stdout and "| row | precision | compile |" in done.stdout
    result = json.loads(out.read_text())
    assert {"device", "torch", "transformers", "commit"} <= set(result["header"]) and not result["failed"]
    rows = result["rows"]
    toolkit = [r for r in rows if r["row"] == "toolkit"]
    assert sorted((r["precision"], r["compile"]) for r in toolkit) == [
        ("bf16", False), ("bf16", True), ("no", False), ("no", True)]
    assert all(r["train_samples_per_s"] > 0 and r["train_shapes"] >= 1 for r in toolkit)
    assert all(r["padding_overhead"] >= 0 for r in toolkit)
    for r in toolkit:  # two steady steps profiled: wall covers the host's part, the parts add up to it
        profile = r["step_profile"]
        assert profile["steps"] == 2 and profile["wall_ms"] >= profile["host_in_step_ms"] > 0
        assert profile["device_busy_ms"] > 0
        parts = profile["host_parts_ms"]
        assert sum(parts.values()) == pytest.approx(profile["wall_ms"]) and parts["forward call"] > 0
    assert "Host ms per steady step, by part" in done.stdout
    assert {r["precision"] for r in rows if r["row"].startswith("Trainer")} == {"bf16", "no"}
    (matmul,) = [r for r in rows if isinstance(r.get("mfu"), dict)]
    assert [m["compiled"] for m in matmul["mfu_rows"]] == [False, False, True]  # CPU: two dropouts, then compiled
    assert all(m["mfu"] > 0 for m in matmul["mfu_rows"])
    assert "| MFU at 4 x 16, compiled | bf16 | True |" in done.stdout
    assert all(r["compiled_graphs"] >= 1 and r["step_compilations"] >= 1 for r in toolkit if r["compile"])
    steps = [r for r in rows if r["row"].endswith("step (tiny roberta)")]  # eager, then compiled
    assert [(r["method"], r["compile"]) for r in steps] == [("full", False), ("lora", False), ("full", True),
                                                            ("lora", True)]
    # compiled, one graph compiled once: the loop's dropout (the toolkit's numpy masks broke it into 16)
    # and the head's problem_type set before the first step (set by it, the whole step recompiled)
    assert all(r["step_s"] > 0 for r in steps) and [r["compiled_graphs"] for r in steps] == [0, 0, 1, 1]
    for how, (full, lora) in (("eager", steps[:2]), ("compiled", steps[2:])):  # the LoRA target's ratio, per pair
        assert f"| LoRA / full, {how} | bf16 | {how == 'compiled'} |  |  |  |  | {lora['step_s'] / full['step_s']:.2f}x |" \
            in done.stdout
    accuracy = [r for r in rows if r["row"] == "MiniLM SST-2 accuracy"]
    assert [r["compile"] for r in accuracy] == [False, True] and all(0 <= r["accuracy"] <= 1 for r in accuracy)
    # like for like: eager pads as the compiled step does (the toolkit's multiple of 16), same seed
    assert [(r["pad_multiple"], r["seed"]) for r in accuracy] == [(16, 42), (16, 42)]
    assert accuracy[0]["train_shapes"] <= 2  # lengths 16 and 32 only (eager used to pad to each batch's longest)
    assert "MiniLM SST-2 accuracy %, compiled vs eager (same subset, seeds 42, both trained on batches padded to " \
           "multiples of 16)" in done.stdout and "one seed a side: no spread measured" in done.stdout
    (optimizer,) = [r for r in rows if r["row"] == "toolkit, compiled optimizer"]  # train.compile_optimizer
    assert (optimizer["precision"], optimizer["compile"], optimizer["compile_optimizer"]) == ("bf16", True, True)
    assert optimizer["step_profile"]["steps"] == 2 and optimizer["compiled_graphs"] >= 2  # the step's, the optimizer's
    assert all(r["cudagraph_skips"] == 0 for r in toolkit)  # counted in every toolkit row (none asked on a CPU)


def test_other_issues_rows_join_the_table(monkeypatch) -> None:
    import gpu_check

    monkeypatch.setattr(gpu_check, "EXTRA_ROWS", {})
    gpu_check.add_rows("fsdp2", lambda args, info: [{"row": "toolkit, FSDP2", "precision": "bf16",
                                                     "train_samples_per_s": 10.0}])
    (fn,) = gpu_check.EXTRA_ROWS.values()
    rows = [{"row": "Trainer, dynamic padding", "precision": "bf16", "train_samples_per_s": 5.0}, *fn(None, {})]
    info = {"device": "d", "torch": "t", "cuda": None, "transformers": "x", "peft": "p", "accelerate": "a",
            "python": "3", "date": "now", "commit": "abc"}
    text = gpu_check.render(info, rows)
    assert "| toolkit, FSDP2 | bf16 |  | 10.0 |" in text


def test_the_sharding_rows_are_part_of_gpu_check() -> None:
    """Issue 36's one-process FSDP2 / ZeRO rows run in the same prepared GPU call, in a table of
    their own (left out of --smoke: tests/test_gpu_sharding.py runs them on CPU)."""
    import argparse

    import gpu_check

    name = "FSDP2 and DeepSpeed (issue 36)"
    assert name in gpu_check.EXTRA_ROWS and name in gpu_check.EXTRA_TABLES
    assert gpu_check.EXTRA_ROWS[name](argparse.Namespace(smoke=True, skip_sharding=False), {}) == []


def test_the_plan_puts_the_targets_first_and_the_measured_levers_on_request() -> None:
    """The rows the targets are judged on come first, then those no GPU check has reached (a run
    cut short keeps them); the speed rows use the toolkit's own padding default (no forced
    buckets); the levers measured and not taken (bf16 master weights, the compiled optimizer)
    need --master / --optimizer."""
    import gpu_check

    args = gpu_check.parser().parse_args([])
    rows = gpu_check.plan(args, "bert", "minilm")
    labels = [label for label, *_ in rows]
    assert labels[:9] == ["toolkit", "Trainer, dynamic padding", *["full step (roberta-base shape)",
                                                                   "lora step (roberta-base shape)"] * 2,
                          "MiniLM SST-2 accuracy", "MiniLM SST-2 accuracy", "toolkit"]
    steps = [flags for label, _, _, flags in rows if label.endswith("step (roberta-base shape)")]
    assert [f[f.index("--compile") + 1] if "--compile" in f else None for f in steps] == [None, None, "true", "true"]
    assert [(flags[flags.index("--precision") + 1], flags[flags.index("--compile") + 1])
            for label, _, _, flags in rows if label == "toolkit"][:2] == [("bf16", "true"), ("no", "true")]
    assert not any(gpu_check.MASTER_LABEL in label or label == gpu_check.OPTIMIZER for label in labels)
    assert all("--length-buckets" not in flags and "--pad-multiple" not in flags  # the accuracy rows pad alike
               for label, _, _, flags in rows if not label.startswith("MiniLM"))
    assert all("--size" not in flags for label, _, _, flags in rows if label.startswith("MiniLM"))
    with_master = gpu_check.plan(gpu_check.parser().parse_args(["--master"]), "bert", "minilm")
    assert sum(gpu_check.MASTER_LABEL in label for label, *_ in with_master) == 3
    with_optimizer = gpu_check.plan(gpu_check.parser().parse_args(["--optimizer"]), "bert", "minilm")
    assert [label for label, *_ in with_optimizer][:2] == ["toolkit", gpu_check.OPTIMIZER]
    assert "--compile-optimizer" in with_optimizer[1][3] and "--compile-optimizer" not in with_optimizer[0][3]


def test_cuda_graphs_not_recorded_are_counted_with_their_reasons() -> None:
    """Inductor's reduce-overhead mode runs a step without CUDA graphs, with a warning only, when
    it cannot record them: the toolkit rows count the skips (torch's counter) and keep each
    reason, and the table says so under the rows."""
    from bench.trainer import CudagraphSkips
    from torch._inductor.cudagraph_utils import log_cudagraph_skip_and_bump_counter

    import gpu_check

    with CudagraphSkips() as skipped:
        for _ in range(2):
            log_cudagraph_skip_and_bump_counter("skipping cudagraphs due to cpu device (arg3_1)")
    assert skipped.count == 2 and skipped.reasons == ["skipping cudagraphs due to cpu device (arg3_1)"]
    rows = [{"row": "toolkit", "precision": "bf16", "compile": True, "cudagraph_skips": 2,
             "cudagraph_skip_reasons": skipped.reasons},
            {"row": "toolkit", "precision": "no", "compile": True, "cudagraph_skips": 0, "cudagraph_skip_reasons": []},
            {"row": "toolkit", "precision": "bf16", "compile": False, "cudagraph_skips": 0}]
    text = gpu_check.graph_notes({"cuda": "13.0"}, rows)
    assert "- toolkit, bf16: 2 graphs not recorded (skipping cudagraphs due to cpu device (arg3_1))" in text
    assert "- toolkit, fp32: every graph recorded" in text and text.count("\n- ") == 2
    assert gpu_check.graph_notes({"cuda": None}, rows[1:]) == ""  # a CPU: no graph was asked for


def test_a_spent_budget_starts_no_row_and_still_prints_the_table(tmp_path: Path, capsys) -> None:
    """--budget-s: a device call's limit must not cut the table off; rows that cannot start are
    listed as not run (exit 1), the table and the JSON are still written."""
    import gpu_check

    out = tmp_path / "g.json"
    assert gpu_check.main(["--smoke", "--budget-s", "1", "--json", str(out)]) == 1
    result = json.loads(out.read_text())
    labels = [label for label, *_ in gpu_check.plan(gpu_check.parser().parse_args(["--smoke"]), "a", "b")]
    assert result["rows"] == [] and result["failed"] == labels + list(gpu_check.EXTRA_ROWS)  # other issues' too
    captured = capsys.readouterr()
    assert "# make gpu-check" in captured.out and "s of --budget-s 1.0 left" in captured.err


def test_profiled_steps_are_kept_out_of_the_rates() -> None:
    """The profiled steps run slower (the profiler records every kernel); the row's whole-run and
    steady rates are those of the other steps. A run of 100 steps of 8 at 0.1 s, of which 10 from
    step 60 took 5 s under the profiler: 80 samples/s both ways, not the 57 the log says."""
    from bench.trainer import StepProfile, steady_rate, without_profile

    profiled = StepProfile(60, 10)
    profiled.steps, profiled.span = 10, 5.0
    seconds = [0.1 * s + (5.0 - 1.0 if s > 60 else 0.0) for s in range(1, 101)]  # the 10 steps cost 5 s, not 1
    logged = [{"step": s, "samples_per_second": 8 * s / t} for s, t in zip(range(1, 101), seconds)]
    metrics = {"train_steps": 100, "train_samples_per_second": logged[-1]["samples_per_second"]}
    assert metrics["train_samples_per_second"] == pytest.approx(800 / 14.0)
    assert without_profile(metrics, 8, profiled) == pytest.approx(80.0)
    assert steady_rate(logged, 8, profiled) == pytest.approx(80.0)
    assert steady_rate(logged, 8) < 70  # what the rates were before
    assert without_profile(metrics, 8, StepProfile(60, 0)) == metrics["train_samples_per_second"]


def test_a_compiled_row_compiles_once_and_in_its_measured_run(monkeypatch) -> None:
    """A compiled row's warm-up runs eager, the optimizer too (train.compile_optimizer's row
    compiled its optimizer step in the warm-up, and the measured run's passed its guards: a
    compilation paid outside the row's whole-run rate). torch's own counters: nothing compiled by
    the warm-up, the step's and the optimizer's graphs by the measured run, each once."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    import bench.cli as cli
    from toolkit import compiling, models

    monkeypatch.setattr(compiling, "BACKEND", compiling.BACKEND)  # measure() sets the smoke backend
    torch._dynamo.reset()
    seen = {}
    original = cli.warm_up

    def warm_up(*args, **kwargs):
        before = counters["stats"]["unique_graphs"]
        original(*args, **kwargs)
        seen["warm-up"] = counters["stats"]["unique_graphs"] - before

    monkeypatch.setattr(cli, "warm_up", warm_up)
    checkpoint = models.smoke_checkpoint("bert-base-uncased")
    args = cli.parse(["--steps", "3", "--batch-size", "4", "--max-length", "32", "--eval-samples", "8",
                      "--compile", "true", "--compile-optimizer", "true", "--compile-backend", "aot_eager",
                      "--row", "toolkit", "--resolved-checkpoint", checkpoint])
    try:
        row = cli.measure(args)
    finally:
        compiling.settings_as_found()
        torch._dynamo.reset()
    assert seen == {"warm-up": 0}
    assert row["compiled_graphs"] == 2 and row["step_compilations"] == 1  # the step's and the optimizer's


def test_accuracy_rows_compare_means_over_seeds_against_their_spread() -> None:
    """--accuracy-seeds N: N eager and N compiled MiniLM rows, seed by seed (42, 43, ...), each
    padded as the compiled step pads; the note under the table gives each side's mean and standard
    deviation, and whether the difference is within the 0.5-point target and within the spread."""
    import gpu_check

    args = gpu_check.parser().parse_args(["--accuracy-seeds", "3"])
    accuracy = [flags for label, _, _, flags in gpu_check.plan(args, "bert", "minilm") if label == "MiniLM SST-2 accuracy"]
    assert [(f[f.index("--seed") + 1], f[f.index("--compile") + 1], f[f.index("--pad-multiple") + 1])
            for f in accuracy] == [(s, c, "16") for s in ("42", "43", "44") for c in ("false", "true")]

    def rows(eager: list[float], compiled: list[float]) -> list[dict]:
        return [{"row": "MiniLM SST-2 accuracy", "key": f"accuracy-{how}", "seed": 42 + i, "accuracy": a / 100,
                 "pad_multiple": 16} for how, values in (("eager", eager), ("compiled", compiled))
                for i, a in enumerate(values)]

    note = gpu_check.accuracy_note(rows([85.0, 86.0, 87.0], [86.0, 87.0, 88.0]))
    assert "eager 86.00 ± 1.00 (n 3), compiled 87.00 ± 1.00 (n 3); difference +1.00 points: over the 0.5-point target, " \
           "within the seeds' spread (the larger standard deviation, 1.00)" in note
    note = gpu_check.accuracy_note(rows([85.0, 85.2], [86.5, 86.7]))
    assert "difference +1.50 points: over the 0.5-point target, outside the seeds' spread" in note
    assert "seed 43" in gpu_check.render({"device": "d", "torch": "t", "cuda": None, "transformers": "x", "peft": "p",
                                          "accelerate": "a", "python": "3", "date": "now", "commit": "c"},
                                         rows([85.0, 85.2], [86.5, 86.7]))
    assert gpu_check.accuracy_note(rows([85.0], [])) == ""  # one side only: nothing compared


def test_rows_selects_plan_rows_by_key_and_refuses_unknown_names(tmp_path: Path, capsys) -> None:
    """--rows: the rows no check has reached, in one call; keys (or groups) name rows of the whole
    plan, opt-in rows included, run in the plan's order; an unknown name is one line, exit 2,
    before anything is built."""
    import gpu_check

    every = gpu_check.plan(gpu_check.parser().parse_args(["--master", "--optimizer", "--graph"]), "bert", "minilm")
    keys = [gpu_check.row_key(label, kind, flags) for label, kind, _, flags in every]
    assert sorted(keys) == sorted(gpu_check.ROW_KEYS)  # one key a row
    args = gpu_check.parser().parse_args(["--rows", "mfu,toolkit-fp32-compiled,steps-compiled,toolkit-bf16-compiled"])
    picked = gpu_check.selected(args, "bert", "minilm")
    assert [gpu_check.row_key(label, kind, flags) for label, kind, _, flags in picked] == [
        "toolkit-bf16-compiled", "full-compiled", "lora-compiled", "toolkit-fp32-compiled", "mfu"]
    (optimizer,) = gpu_check.selected(gpu_check.parser().parse_args(["--rows", "optimizer"]), "bert", "minilm")
    assert "--compile-optimizer" in optimizer[3]  # opt-in rows without --optimizer
    assert gpu_check.selected(gpu_check.parser().parse_args([]), "b", "m") == gpu_check.plan(
        gpu_check.parser().parse_args([]), "b", "m")
    out = tmp_path / "g.json"  # a spent budget: what was selected is listed as not run, and nothing else
    assert gpu_check.main(["--smoke", "--rows", "steps-compiled,mfu", "--budget-s", "1", "--json", str(out)]) == 1
    assert json.loads(out.read_text())["failed"] == ["full step (tiny roberta)", "lora step (tiny roberta)",
                                                     "matmul and MFU at 32 x 128, eager and compiled"]
    capsys.readouterr()
    for bad in ("mfu,lora", ",", "toolkit"):
        with pytest.raises(SystemExit) as stop:  # the script's parser: one line naming it, exit 2
            gpu_check.main(["--smoke", "--rows", bad])
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("error: benchmarks/gpu_check.py: --rows: unknown ")
        assert "toolkit-fp32-compiled" in err


def test_a_compiled_row_says_how_many_graphs_came_from_inductors_cache() -> None:
    """Inductor's on-disk caches make a row whose graph an earlier row (or run) compiled pay a
    fraction of a cold compilation: its whole-run rate is then not a first run's. torch's own
    counters, taken per row, and the table's compilations cell says it."""
    from torch._dynamo.utils import counters

    from bench.common import compile_caches

    import gpu_check

    before = compile_caches()
    counters["inductor"]["fxgraph_cache_hit"] += 2
    counters["aot_autograd"]["autograd_cache_miss"] += 1
    assert compile_caches(before) == {"fxgraph_hit": 2, "fxgraph_miss": 0, "autograd_hit": 0, "autograd_miss": 1}
    counters["inductor"]["fxgraph_cache_hit"] -= 2
    counters["aot_autograd"]["autograd_cache_miss"] -= 1
    row = {"compiled_graphs": 1, "step_compilations": 1, "compile_cache": {"fxgraph_hit": 0, "fxgraph_miss": 2}}
    assert gpu_check.compilations(row) == "1; 0 of 2 from cache"  # compiled cold
    assert gpu_check.compilations({**row, "compile_cache": {"fxgraph_hit": 0, "fxgraph_miss": 0}}) == "1"
