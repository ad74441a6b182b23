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


@pytest.mark.parametrize("change", ["untracked module", "edited tracked file"])
def test_the_recorded_code_changes_with_every_file_the_commit_does_not_hold(tmp_path, change):
    """metrics.json `code.toolkit` is the commit plus a hash of what it does not hold: a new module
    not yet added to git (a plug-in method under development) was left out, so runs before and after
    an edit of it recorded one code and a report pooled them as seeds of one code, exit 0. Ignored
    files (caches) change nothing."""
    from toolkit import checkpoints

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                       check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "core.py").write_text("x = 1\n")
    (tmp_path / ".gitignore").write_text("__pycache__/\n")
    git("add", "-A")
    git("commit", "-qm", "one")
    clean = checkpoints._toolkit_code(tmp_path)
    assert clean is not None and "uncommitted" not in clean
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "core.pyc").write_bytes(b"\0")
    assert checkpoints._toolkit_code(tmp_path) == clean  # ignored: no change
    target = tmp_path / ("mine.py" if change == "untracked module" else "core.py")
    target.write_text("x = 2\n")
    first = checkpoints._toolkit_code(tmp_path)
    target.write_text("x = 3\n")
    second = checkpoints._toolkit_code(tmp_path)
    assert "uncommitted changes" in first and len({clean, first, second}) == 3
