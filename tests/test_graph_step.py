"""benchmarks/bench/graph_step.py: the whole-step CUDA-graph lever (issue 35), on the CPU.

The capture itself needs CUDA; what makes a step capturable can be checked here: the step reads
nothing back to the host (a read inside a capture is an error on a GPU), it trains (the update
happens inside the function, no host-side step counter), and the row runs through the bench's
own row dispatch for full fine-tuning and LoRA alike."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench  # noqa: E402
from bench import graph_step  # noqa: E402
from test_host_sync import HostReads  # noqa: E402


def tiny_args() -> object:
    args = bench.parse(["--lora-model", "tiny", "--lora-steps", "2", "--lora-length", "8"])
    args.lora_batch = 2
    return args


@pytest.mark.parametrize("method", ["full", "lora"])
def test_the_whole_step_reads_nothing_to_the_host_and_trains(method: str) -> None:
    model, vocab = graph_step.graph_model(tiny_args(), method)
    batch = bench.random_batch(2, 8, vocab)
    step, optimizers = graph_step.whole_step(model, batch, "no")
    trained = [p for p in model.parameters() if p.requires_grad]
    frozen = [p.detach().clone() for p in model.parameters() if not p.requires_grad]
    before = [p.detach().clone() for p in trained]
    counter = HostReads()
    with counter:
        for _ in range(2):
            for optimizer in optimizers:
                optimizer.zero_grad(set_to_none=True)
            loss = step()
    assert counter.reads == []
    assert loss.dim() == 0 and torch.isfinite(loss)
    assert all(not torch.equal(a, p.detach()) for a, p in zip(before, trained) if p.dim() > 1)
    assert all(torch.equal(a, p.detach()) for a, p in zip(frozen, (p for p in model.parameters() if not p.requires_grad)))
    assert (method == "lora") == (len(frozen) > 0)


def test_the_row_runs_through_the_bench_dispatch_without_a_capture_on_cpu() -> None:
    from bench import cli

    args = tiny_args()
    args.row = "graph:lora"
    row = cli.measure(args)
    assert row["method"] == "lora" and row["captured"] is False and row["graph_step_s"] is None
    assert row["eager_step_s"] > 0 and len(row["times"]["eager"]) == 2


def test_fp16_is_refused_in_one_line() -> None:
    args = tiny_args()
    args.precision = "fp16"
    with pytest.raises(SystemExit, match="fp16"):
        graph_step.graph_row(args, "full")


def test_gpu_check_runs_the_graph_rows_by_name_with_their_lora_ratio(tmp_path: Path, capsys) -> None:
    import json

    import gpu_check

    out = tmp_path / "gpu-check.json"
    assert gpu_check.main(["--smoke", "--rows", "graph", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["key"], r["method"], r["captured"]) for r in rows] == [("full-graph", "full", False),
                                                                       ("lora-graph", "lora", False)]
    table = capsys.readouterr().out
    assert "lora step (tiny roberta), one CUDA graph (not captured: no CUDA)" in table
    assert "| LoRA / full, one CUDA graph |" in table
