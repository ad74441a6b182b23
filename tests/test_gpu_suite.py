"""`make gpu-check ARGS="--suite --budget-s N"`: the suite on a lent GPU within a device call.

A device call's limit kills whatever runs past it and brings back only the output's tail: a
suite cut there says nothing of what failed. With --budget-s the suite is interrupted as Ctrl-C
would (pytest and its xdist workers), so pytest prints its summary and the failures so far, and
the JSON records them with `interrupted`."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import gpu_check  # noqa: E402

TESTS = {
    "test_passes.py": "def test_passes():\n    assert 1 + 1 == 2\n",
    "test_fails.py": "def test_fails():\n    assert 1 + 1 == 3\n",
    "test_slow.py": "import time\n\ndef test_slow():\n    time.sleep(120)\n",
}


def test_a_suite_past_its_budget_is_interrupted_and_still_reports_its_failures(tmp_path: Path, capsys) -> None:
    tests = tmp_path / "tests"
    tests.mkdir()
    for name, text in TESTS.items():
        (tests / name).write_text(text)
    out = tmp_path / "suite.json"
    args = argparse.Namespace(json=str(out), budget_s=6.0)
    start = time.monotonic()
    code = gpu_check.suite(args, tests)
    assert time.monotonic() - start < 6.0 + gpu_check.SUITE_GRACE_S
    record = json.loads(out.read_text())
    assert code != 0 and record["suite_exit_code"] == code and record["interrupted"] is True
    assert any("test_fails.py::test_fails" in line for line in record["failures"]), record
    assert "passed" in capsys.readouterr().out


def test_a_suite_within_its_budget_is_not_interrupted(tmp_path: Path) -> None:
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_passes.py").write_text(TESTS["test_passes.py"])
    out = tmp_path / "suite.json"
    code = gpu_check.suite(argparse.Namespace(json=str(out), budget_s=120.0), tests)
    record = json.loads(out.read_text())
    assert code == 0 and record["interrupted"] is False and record["failures"] == []
    assert "1 passed" in record["summary"]
