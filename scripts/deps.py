"""Requirement sets for the environments the Makefile builds, from pyproject.toml alone.

    python scripts/deps.py latest   # pyproject's bounds as written: pip picks the newest allowed
    python scripts/deps.py next     # the tracked libraries without their upper bounds
    python scripts/deps.py oldest   # every lower bound pinned (==): the bottom of the tested range

Each prints one requirement a line, for `pip install -r`. The extras are the ones `make install`
installs (EXTRAS). torch stays at the Makefile's TORCH in every set: newer torch builds on the
registry are CUDA builds of several GB, so a torch release is tried on a GPU machine, by hand.
Reads pyproject with tomllib and parses with `packaging` (pip's own copy in a bare venv).
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path

try:
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
except ImportError:  # a bare venv: pip's own copy
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = ("test", "demo", "report", "tensorboard", "deepspeed")
TRACKED = ("torch", "transformers", "peft", "accelerate", "datasets")  # also in toolkit/versions.py


def requirements(extras: tuple[str, ...] = EXTRAS) -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"])
    for extra in extras:
        lines += project["optional-dependencies"][extra]
    return [Requirement(line) for line in lines]


def line(req: Requirement, mode: str, torch: str) -> str:
    if req.name == "torch":
        return torch
    specs = list(req.specifier)
    if mode == "next" and req.name in TRACKED:
        specs = [s for s in specs if s.operator not in ("<", "<=", "==", "~=")]
    if mode == "oldest":
        lower = [s for s in specs if s.operator in (">=", "==", "~=")]
        if not lower:
            raise SystemExit(f"pyproject.toml: {req.name} has no lower bound to pin")
        specs = [next(iter(SpecifierSet(f"=={lower[0].version}")))]
    return f"{req.name}{','.join(str(s) for s in specs)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("latest", "next", "oldest"))
    parser.add_argument("--torch", default="torch==2.13.0", help="the torch requirement (default: %(default)s)")
    args = parser.parse_args(argv)
    for req in requirements():
        print(line(req, args.mode, args.torch))
    return 0


if __name__ == "__main__":
    sys.exit(main())
