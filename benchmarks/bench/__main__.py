"""`python benchmarks/bench [flags]`: the sections' Markdown tables (see bench/__init__.py)."""

import os
import sys
from pathlib import Path

# Everything a benchmark reads is here (the data, the tokenizers, random-weight or packaged
# models): off-line, a Hub id is not looked up on the network first (a machine without one, as the
# lent GPU machines are, spent ~3 s of retries per row process on it), and every row's process
# inherits this.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, where the package lives

from bench.cli import main  # noqa: E402

main()
