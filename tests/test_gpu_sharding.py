"""benchmarks/gpu_sharding.py --smoke: the rows `make gpu-check` prints for sharded launches, here
on a CPU process: FSDP runs and matches the plain run, DeepSpeed is refused in one line."""

from __future__ import annotations

import sys
from pathlib import Path

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_sharding  # noqa: E402


def test_smoke_rows(tmp_path: Path) -> None:
    rows = gpu_sharding.rows(smoke=True, work=tmp_path, cases=gpu_sharding.CASES[:1])
    by = {r["strategy"]: r for r in rows}
    assert list(by) == gpu_sharding.STRATEGIES
    assert by["plain"]["ran"] == by["fsdp"]["ran"] == "yes", rows
    assert (by["plain"]["distributed_type"], by["fsdp"]["distributed_type"]) == ("NO", "FSDP")
    assert by["fsdp"]["max_rel_loss_diff"] < 1e-4 and by["fsdp"]["same_eval"]
    assert by["plain"]["reloads"] and by["fsdp"]["reloads"]
    assert by["zero2"]["ran"] == by["zero3"]["ran"] == "refused"
    text = gpu_sharding.table(rows)
    assert text.count("\n") == len(rows) + 1 and "| fsdp |" in text
