"""`python benchmarks/bench [flags]`: the sections' Markdown tables (see bench/__init__.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, where the package lives

from bench.cli import main  # noqa: E402

main()
