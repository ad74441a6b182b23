"""The tested range: pyproject's bounds, read back from package metadata by `toolkit run`."""

from __future__ import annotations

import subprocess
import tomllib

import pytest

from conftest import PYTHON, ROOT
from toolkit import versions

RANGE = ["transformers>=5.23.0,<5.25", "torch>=2.13.0,<2.14", "peft>=0.21.2,<0.22", "numpy>=2",
         "pytest>=9; extra == 'test'"]
INSTALLED = {"transformers": "5.25.0", "torch": "2.13.0+cpu", "peft": "0.21.2", "numpy": "1.0",
             "pytest": "1.0"}


@pytest.fixture
def fake_metadata(monkeypatch):
    monkeypatch.setattr(versions, "requires", lambda name: RANGE)
    monkeypatch.setattr(versions, "version", lambda name: INSTALLED[name])


def test_one_line_per_tracked_library_outside_its_range(fake_metadata):
    # torch's local build tag is ignored, untracked numpy and extras are not checked
    assert versions.outside_tested_range() == [
        "warning: transformers 5.25.0 is outside the tested range >=5.23.0,<5.25 (pyproject.toml); "
        "results may differ, and `make install` sets up the tested versions"]


def test_toolkit_run_warns_before_anything_else(fake_metadata, cli, tmp_path):
    code, _, err = cli("run", tmp_path / "missing.yaml")
    lines = err.splitlines()
    assert code == 2 and lines[0].startswith("warning: transformers 5.25.0 is outside the tested range")
    assert lines[1].startswith("error:") and len(lines) == 2


def test_installed_metadata_is_pyproject_and_the_lock_is_inside_its_range():
    """The editable install is current (else: make install), and every locked version of a
    declared dependency lies inside its declared range."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import Version

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    def ranges(lines):
        return {(canonicalize_name(r.name), r.specifier) for r in map(Requirement, lines) if r.marker is None}

    assert ranges(versions.requires("toolkit")) == ranges(project["dependencies"]), \
        "installed metadata is stale: run make install"
    locked = {canonicalize_name(name): Version(v).public for name, v in
              (line.split("==", 1) for line in (ROOT / "requirements.lock").read_text().splitlines()
               if line and not line.startswith("#"))}
    wanted = project["dependencies"] + [r for extra in ("test", "demo", "report", "tensorboard")
                                        for r in project["optional-dependencies"][extra]]
    for line in wanted:
        req = Requirement(line)
        assert req.specifier.contains(locked[canonicalize_name(req.name)]), (line, locked[canonicalize_name(req.name)])


def test_version_check_imports_no_library():
    code = ("import sys; from toolkit.versions import outside_tested_range; outside_tested_range(); "
            "print([m for m in ('torch', 'transformers', 'peft', 'accelerate', 'datasets') if m in sys.modules])")
    out = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
