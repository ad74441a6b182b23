"""Is the environment inside the tested range? One warning line per library when it is not.

The range is pyproject.toml's bounds, read back from the installed package's metadata
(`importlib.metadata.requires`), and the installed versions from the libraries' metadata, so
no library is imported: `toolkit run` pays a few milliseconds and `toolkit ls` nothing.
"""

from __future__ import annotations

import os
import sys
from importlib.metadata import PackageNotFoundError, requires, version

TRACKED = ("torch", "transformers", "peft", "accelerate", "datasets")  # also in scripts/deps.py
# the libraries a task's scores are computed by (GLUE's correlations, seqeval, ROUGE, sacreBLEU, the
# paired t interval): recorded beside TRACKED with every run's code (checkpoints.code_versions), so
# that seeds scored under two versions of one are marked where a report pools them
SCORING = ("scikit-learn", "scipy", "seqeval", "rouge-score", "sacrebleu")


def outside_tested_range() -> list[str]:
    """One line per tracked library whose installed version the toolkit was not tested with."""
    from packaging.requirements import Requirement
    from packaging.version import InvalidVersion, Version

    try:
        declared = [Requirement(r) for r in requires("toolkit") or []]
    except PackageNotFoundError:  # run from a source tree that was never installed
        return []
    lines = []
    for req in declared:
        if req.name not in TRACKED or req.marker is not None:
            continue
        try:
            have = version(req.name)
        except PackageNotFoundError:
            continue  # a missing library fails on import with its own message
        try:
            public = Version(have).public  # torch's "2.13.0+cpu" is 2.13.0 in the range
        except InvalidVersion:
            public = have
        if not req.specifier.contains(public, prereleases=True):
            tested = ",".join(sorted(map(str, req.specifier), key=lambda s: not s.startswith(">")))
            lines.append(f"warning: {req.name} {have} is outside the tested range {tested} "
                         "(pyproject.toml); results may differ, and `make install` sets up the tested versions")
    return lines


def warn_if_untested() -> None:
    """Print the lines on stderr, once per launch (rank 0 of a distributed run only)."""
    if os.environ.get("RANK", "0") != "0":
        return
    for line in outside_tested_range():
        print(line, file=sys.stderr)
