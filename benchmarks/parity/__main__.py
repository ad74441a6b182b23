"""`python benchmarks/parity TASK [flags]`: one task type's table (see parity/__init__.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, where the package lives

from parity.cli import main  # noqa: E402

sys.exit(main())
