"""A pytest plugin measuring the suite's time per test in CPU seconds (the test's process and the
children it waited for, user + system) beside its wall seconds: under load, or with 2 workers on 2
cores, wall time says more about the neighbours than about the test. Each process (each xdist
worker) writes `cpuprof-<worker>.json` into $CPUPROF_DIR (default: the working directory):
{"collect_cpu": CPU-s before the first test, "total_cpu": ..., "tests": {nodeid: [cpu_s, wall_s]}}.

    PYTHONPATH=scripts .venv/bin/pytest -q -n 2 --dist worksteal -p pytest_cpuprof
    python scripts/pytest_cpuprof.py [DIR]     # the 40 costliest tests and the files they are in

Module- and session-scoped fixtures are counted in the first test that asks for them. Written for
this project (no maintained plugin reports per-test CPU time with children)."""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path

import pytest

_TESTS: dict[str, list[float]] = {}
_COLLECTED: list[float] = []


def _cpu() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not _COLLECTED:
        _COLLECTED.append(_cpu())
    cpu, wall = _cpu(), time.perf_counter()
    yield
    _TESTS[item.nodeid] = [_cpu() - cpu, time.perf_counter() - wall]


def pytest_sessionfinish(session) -> None:
    if not _TESTS:  # the xdist controller runs no test
        return
    out = Path(os.environ.get("CPUPROF_DIR", ".")) / f"cpuprof-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.json"
    out.write_text(json.dumps({"collect_cpu": _COLLECTED[0], "total_cpu": _cpu(), "tests": _TESTS}))


def summary(folder: Path, top: int = 40) -> str:
    tests: dict[str, list[float]] = {}
    lines = []
    for path in sorted(folder.glob("cpuprof-*.json")):
        data = json.loads(path.read_text())
        tests.update(data["tests"])
        lines.append(f"{path.name}: collection {data['collect_cpu']:.1f} CPU-s, total {data['total_cpu']:.1f}, "
                     f"{len(data['tests'])} tests")
    files: dict[str, float] = {}
    for nodeid, (cpu, _) in tests.items():
        files[nodeid.split("::")[0]] = files.get(nodeid.split("::")[0], 0.0) + cpu
    lines.append(f"all tests: {sum(c for c, _ in tests.values()):.0f} CPU-s")
    lines += [f"{cpu:8.1f}  {name}" for name, cpu in sorted(files.items(), key=lambda kv: -kv[1])[:top]]
    lines += [f"{cpu:8.1f} {wall:7.1f}  {name}" for name, (cpu, wall) in sorted(tests.items(), key=lambda kv: -kv[1][0])[:top]]
    return "\n".join(lines)


if __name__ == "__main__":
    print(summary(Path(sys.argv[1] if len(sys.argv) > 1 else ".")))
