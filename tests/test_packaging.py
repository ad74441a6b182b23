"""The wheel `pip install` users get: every shipped recipe inside it, and no setuptools warning
about the project's own packaging while building it (recipes are data of `toolkit`, reached
through the toolkit/recipes link, not namespace packages of their own)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_ships_every_recipe_without_packaging_warnings(tmp_path: Path) -> None:
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(ROOT)],
        capture_output=True, text=True, check=True,
    )
    output = build.stdout + build.stderr
    for warning in ("would be ignored", "absent from the `packages`", "BuildBackendWarning"):
        assert warning not in output, output
    (wheel,) = tmp_path.glob("toolkit-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    recipes = {f"toolkit/recipes/{p.relative_to(ROOT / 'recipes').as_posix()}" for p in (ROOT / "recipes").rglob("*.yaml")}
    assert len(recipes) > 100 and recipes <= names, sorted(recipes - names)[:5]
    assert "toolkit/data/" in "".join(names) and not any(n.startswith("recipes/") for n in names)
