"""What a user can cause: a UserError (one line, exit code 2), Ctrl-C (Interrupted, exit 130), a full disk."""

import errno
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


class UserError(Exception):
    """A mistake in a recipe, a path or the environment that the user can fix.

    The CLI prints `error: <message>` and exits with code 2; no traceback is shown because the
    message already says what is wrong, where, and what would be right.
    """


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, with where it stopped: the training loop raises it carrying the step reached; the
    run sets the line to print (what was kept, how to go on). Still a KeyboardInterrupt, so code
    that lets Ctrl-C through keeps doing so."""

    def __init__(self, message: str = "interrupted", step: int | None = None, total: int | None = None) -> None:
        super().__init__(message)
        self.message, self.step, self.total = message, step, total


def disk_full(exc: BaseException) -> bool:
    """A full disk, however the writer said it (tokenizers' Rust writer raises a bare Exception
    carrying `os error 28`)."""
    return (isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)) or \
        "os error 28" in str(exc) or "No space left on device" in str(exc)


def nearly_full(place: Path) -> bool:
    """torch's checkpoint writer reports a full disk as an iostream RuntimeError: ask the disk."""
    where = next((p for p in [place, *place.parents] if p.exists()), Path("."))
    return shutil.disk_usage(where).free < (1 << 20)


@contextmanager
def writing(target: Path, then: str, ask_the_disk: bool = False) -> Iterator[None]:
    """A full disk while writing `target` is one UserError naming it and saying `then` (what was
    kept, what to do), however the writer said it; `ask_the_disk` also takes any failure on a
    disk with under 1 MiB free as one (writers that do not say it)."""
    try:
        yield
    except Exception as exc:
        if not (disk_full(exc) or (ask_the_disk and nearly_full(target))):
            raise
        raise UserError(f"no space left on the device while writing {target}; {then}") from None
