"""`python -m toolkit ...`: the `toolkit` command (toolkit.cli.main), for environments where the
console script is not on PATH (a venv not activated, a notebook's `!python -m toolkit`)."""

import sys

from toolkit.cli import main

sys.exit(main())
