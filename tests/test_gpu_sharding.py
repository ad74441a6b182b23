"""benchmarks/gpu_sharding.py --smoke: the rows `make gpu-check` prints for sharded launches, here
on a CPU process: ZeRO-3 (the strategy with the most moving parts: the model partitioned as it
loads, gathered to save) runs and matches the plain run; FSDP and ZeRO-2 are tested on two
processes in test_sharding."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_sharding  # noqa: E402


def _in_this_process(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The plain run's `python -m toolkit.cli ...` and the reload's `python -c RELOAD RUN...` run
    in this process, their command lines as the script built them (what is done apart from the
    launch's processes is still apart from them): two interpreters' start-up spared. The
    sharded launch still starts its own processes. Returns the commands run so."""
    import contextlib
    import io
    import subprocess

    from toolkit.cli import main

    ran: list[list[str]] = []
    launch, run = gpu_sharding.run_group, subprocess.run

    def run_group(cmd: list[str], timeout: float, **popen: object) -> subprocess.CompletedProcess:
        if cmd[:3] != [sys.executable, "-m", "toolkit.cli"]:
            return launch(cmd, timeout, **popen)
        ran.append(cmd)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(cmd[3:])
        return subprocess.CompletedProcess(cmd, code, out.getvalue(), err.getvalue())

    def reload(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess:
        if cmd[:3] != [sys.executable, "-c", gpu_sharding.RELOAD]:
            return run(cmd, **kwargs)
        ran.append(cmd)
        with monkeypatch.context() as m:
            m.setattr(sys, "argv", ["-c", *cmd[3:]])
            exec(compile(gpu_sharding.RELOAD, "<reload>", "exec"), {"__name__": "__main__"})
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(gpu_sharding, "run_group", run_group)
    monkeypatch.setattr(gpu_sharding.subprocess, "run", reload)
    return ran


def test_smoke_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ran = _in_this_process(monkeypatch)
    # the plain run comes first, asked for or not: the first GPU call asked for zero3 first and
    # got no loss comparison
    rows = gpu_sharding.rows(smoke=True, work=tmp_path, cases=gpu_sharding.CASES[:1], strategies=["zero3"])
    by = {r["strategy"]: r for r in rows}
    assert list(by) == ["plain", "zero3"]
    assert by["plain"]["ran"] == by["zero3"]["ran"] == "yes", rows
    assert (by["plain"]["distributed_type"], by["zero3"]["distributed_type"]) == ("NO", "DEEPSPEED")
    assert by["zero3"]["max_rel_loss_diff"] < 1e-4 and by["zero3"]["same_eval"]
    assert by["plain"]["reloads"] and by["zero3"]["reloads"]
    text = gpu_sharding.table(rows)
    assert text.count("\n") == len(rows) + 1 and "| zero3 |" in text
    assert [c[1] for c in ran] == ["-m", "-c"]  # the plain run and the reload, both models reloaded
    assert len(ran[1][3:]) == 2


def test_launches_keep_the_callers_python_path(monkeypatch) -> None:
    """`make gpu-check` puts the carried wheels' site on PYTHONPATH (the GPU image's transformers
    is too old and it has no DeepSpeed): every launch keeps it, behind this checkout."""
    monkeypatch.setenv("PYTHONPATH", "/carried/site")
    assert gpu_sharding._pythonpath().split(":") == [str(ROOT), "/carried/site"]


def test_unknown_names_are_refused_in_one_line(capsys) -> None:
    """Before any launch: 'fsdp2' (the strategy is 'fsdp', FSDP2 inside) ran into a traceback
    on the GPU machine."""
    for argv in (["--strategies", "zero3,fsdp2"], ["--cases", "t5"]):
        with pytest.raises(SystemExit) as stop:  # the script's parser: one line naming it, exit 2
            gpu_sharding.main(argv)
        assert stop.value.code == 2
        said = capsys.readouterr().err
        assert said.count("\n") == 1 and said.startswith("error: benchmarks/gpu_sharding.py: ")
        assert ("--strategies: no 'fsdp2'; choose from plain, fsdp, zero2, zero3 " if argv[0] == "--strategies"
                else "--cases: no 't5'; choose from bert-base-uncased, gpt2") in said


def test_deepspeed_buckets_are_sized_from_the_model() -> None:
    """accelerate's YAML route gives DeepSpeed no bucket sizes, and ZeRO-3 then allocated its
    default 5e8-element gradient bucket (2 GB in fp32) for any model: gpt2 LoRA peaked at 2852 MB
    on an H100 against 799-853 MB plain (2026-11-27). They are now "auto", which accelerate fills
    from the model's hidden size as it prepares it; sizes a config gives are kept."""
    from accelerate.utils import DeepSpeedPlugin

    from toolkit import sharding

    for stage, keys in ((3, set(sharding.BUCKETS)), (2, {"reduce_bucket_size"})):
        plugin = DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": stage, "reduce_scatter": True}})
        sharding.buckets_from_the_model(plugin.deepspeed_config)
        zero = plugin.deepspeed_config["zero_optimization"]
        assert {k for k in sharding.BUCKETS if zero.get(k) == "auto"} == keys
        hidden = 768  # what accelerate's _prepare_deepspeed passes for such a model
        plugin.deepspeed_config_process(must_match=False, **{
            "zero_optimization.reduce_bucket_size": hidden * hidden,
            "zero_optimization.stage3_prefetch_bucket_size": int(0.9 * hidden * hidden),
            "zero_optimization.stage3_param_persistence_threshold": 10 * hidden})
        assert zero["reduce_bucket_size"] == hidden * hidden < 5e8
    given = {"zero_optimization": {"stage": 3, "reduce_bucket_size": 12345}}
    sharding.buckets_from_the_model(given)
    assert given["zero_optimization"]["reduce_bucket_size"] == 12345


def test_a_budget_lists_what_it_leaves_out_and_writes_each_row(tmp_path: Path) -> None:
    """--budget-s: a launch with too little left is listed as not run (no launch), each row is
    handed on as it is done (the JSON is written after every launch), and the call says it fell
    short (exit 1). The H200 call of 2026-11-27 ran past its limit and brought back nothing."""
    seen: list[int] = []
    rows = gpu_sharding.rows(smoke=True, work=tmp_path, cases=gpu_sharding.CASES[:1], strategies=["zero3", "fsdp"],
                             budget_s=gpu_sharding.RELOAD_S + gpu_sharding.MIN_LAUNCH_S - 1,
                             on_row=lambda found: seen.append(len(found)))
    assert [(r["strategy"], r["ran"]) for r in rows] == [("plain", "not run"), ("zero3", "not run"), ("fsdp", "not run")]
    assert seen == [1, 2, 3] and "of --budget-s" in rows[0]["note"]
    assert not list(tmp_path.iterdir())  # nothing launched, nothing written
    out = tmp_path / "rows.json"
    assert gpu_sharding.main(["--smoke", "--cases", "gpt2", "--strategies", "zero3", "--budget-s", "1",
                              "--json", str(out)]) == 1
    assert [r["ran"] for r in __import__("json").loads(out.read_text())] == ["not run", "not run"]


def test_a_launch_past_its_time_is_stopped_with_its_children(tmp_path: Path) -> None:
    """accelerate's launcher starts the training process as its child: when the time is up both
    go (killing the launcher alone would leave the child on the GPU)."""
    import subprocess
    import threading

    marker = str(tmp_path / "child-marker")
    raised: list[type] = []

    def stop() -> None:  # a parent waiting on a child, as the launcher does
        try:
            gpu_sharding.run_group(["sh", "-c", f"{sys.executable} -c 'import time; time.sleep(60)' {marker} & wait"],
                                   timeout=1.5)
        except subprocess.TimeoutExpired as exc:
            raised.append(type(exc))

    waiting = threading.Thread(target=stop, daemon=True)
    waiting.start()
    waiting.join(30)  # a child left alive keeps the output pipes open: the call would not return
    left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    subprocess.run(["pkill", "-f", marker])
    assert left == [] and raised == [subprocess.TimeoutExpired]
    assert gpu_sharding.run_group(["sh", "-c", "echo ok"], timeout=30).stdout == "ok\n"
