"""What a user can cause: a UserError (one line, exit code 2), Ctrl-C (Interrupted, exit 130), a full disk."""

import errno
import os
import resource
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


class UserError(Exception):
    """A mistake in a recipe, a path or the environment that the user can fix.

    The CLI prints `error: <message>` and exits with code 2; no traceback is shown because the
    message already says what is wrong, where, and what would be right.
    """


class PeerStopped(UserError):
    """Under a launch of several processes: this process stopped because another one stopped
    first (its collective lost the peer). Said in one line as a user error is, but it exits
    STOPPED_WITH_THE_LAUNCH, not 2: the launch's exit code is the cause's (toolkit.launch), and a
    process killed by SIGKILL beside one that said this ended the launch with 2, a user error's."""


# the exit code of a process stopped because another process of its launch stopped first
STOPPED_WITH_THE_LAUNCH = 3


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, with where it stopped: the training loop raises it carrying the step reached; the
    run sets the line to print (what was kept, how to go on). Still a KeyboardInterrupt, so code
    that lets Ctrl-C through keeps doing so."""

    def __init__(self, message: str = "interrupted", step: int | None = None, total: int | None = None,
                 signal: int | None = None) -> None:
        super().__init__(message)
        self.message, self.step, self.total = message, step, total
        self.signal = signal  # what stopped it when not Ctrl-C (SIGPIPE: the reader of the output left)


# What a writer says when the place cannot take what it writes: (errno, the text Rust writers such
# as tokenizers' raise in a bare Exception, the system's own text, what the user is told).
NO_ROOM = [
    (errno.ENOSPC, "os error 28", "No space left on device", "no space left on the device"),
    (errno.EDQUOT, "os error 122", "Disk quota exceeded", "no space left on the device (disk quota exceeded)"),
    (errno.EFBIG, "os error 27", "File too large", "a file larger than the file system or this process's "
     "file size limit (`ulimit -f`) allows"),
]


def no_room(exc: BaseException) -> str | None:
    """Why the place could not take the write (NO_ROOM's words), however the writer said it; None
    for any other failure. A file over the file system's largest size (FAT32's 4 GiB) or over
    `ulimit -f` (Python ignores SIGXFSZ: the write fails with EFBIG) is the disk's limit as a full
    disk is, not a bug: it was a traceback."""
    code, text = getattr(exc, "errno", None), str(exc)
    for number, rust, system, said in NO_ROOM:
        if (isinstance(exc, OSError) and code == number) or rust in text or system in text:
            return said
    return None


def disk_full(exc: BaseException) -> bool:
    """The place could not take the write (no_room)."""
    return no_room(exc) is not None


def nearly_full(place: Path) -> bool:
    """torch's checkpoint writer reports a full disk as an iostream RuntimeError: ask the disk."""
    where = next((p for p in [place, *place.parents] if p.exists()), Path("."))
    return shutil.disk_usage(where).free < (1 << 20)


def _unsaid(exc: BaseException, target: Path) -> str | None:
    """torch's checkpoint writer says neither a full disk nor a file over `ulimit -f` (EFBIG): an
    iostream RuntimeError ("unexpected pos"). The disk is asked how much is free, and a failure
    of that writer under a file size limit is put down to the limit, which is named."""
    if nearly_full(target):
        return "no space left on the device"
    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    if soft != resource.RLIM_INFINITY and "inline_container" in str(exc):
        return f"a file larger than this process's file size limit ({soft} bytes, `ulimit -f`) allows"
    return None


@contextmanager
def writing(target: Path, then: str, ask_the_disk: bool = False) -> Iterator[None]:
    """A full disk while writing `target` is one UserError naming it and saying `then` (what was
    kept, what to do), however the writer said it; `ask_the_disk` also takes any failure on a
    disk with under 1 MiB free as one (writers that do not say it)."""
    try:
        yield
    except Exception as exc:
        said = no_room(exc) or (_unsaid(exc, target) if ask_the_disk else None)
        if said is None:
            raise
        raise UserError(f"{said} while writing {target}; {then}") from None


def user_path(text: str | os.PathLike) -> Path:
    """A path a user gives, read by one rule wherever it is given (a recipe's data file or `run:`,
    a command's RECIPE, --input, --output, RUN, OUT, RUNS_DIR, --runs-dir, --task-from, an API
    argument): environment variables (`$HOME`, `${DATA}`) and a leading `~` expanded, as a shell
    does for an unquoted word. `--input "~/x.csv"` (quoted, or `--input=~/x.csv`, which no shell
    expands) was 'no such file ~/x.csv' where the recipe's `task.train_file: ~/x.csv` was read."""
    return Path(os.path.expandvars(os.fspath(text))).expanduser()


def env_folder(name: str, default: Path | str) -> Path:
    """A TOOLKIT_* folder variable read as recipe.check_environment checks it: empty is unset and
    `~` is expanded. TOOLKIT_CACHE='' (an unset shell variable exported) put the smoke models and
    the run locks in the working directory, so two launches of one run from two folders did not
    see each other's lock; TOOLKIT_CACHE='~/c' or TOOLKIT_RUNS='~/runs' (a .env file, a systemd
    unit: no shell to expand it) made a folder named `~` there."""
    return Path(os.environ.get(name) or default).expanduser()


def beside_checkout(name: str, repo: Path) -> Path:
    """The default `data` or `tokenizers` folder (its TOOLKIT_* variable unset): the first of
    ../shared/NAME, ../NAME and NAME beside the checkout `repo` that is a folder, as the Makefile
    looks (docs/install.md), else ./NAME. The toolkit looked in NAME first (and for tokenizers not
    in ../NAME), so `toolkit run` and `make run` of one recipe read other folders where both were."""
    for candidate in (repo.parent / "shared" / name, repo.parent / name, repo / name):
        if candidate.is_dir():
            return candidate
    return Path(name)


CACHE_FOLDERS = {"locks": "the locks of runs and exports", "smoke": "the small models of --smoke runs"}


def cache_folder(name: str) -> Path:
    """A folder of the cache (CACHE_FOLDERS), made where missing. A file (or a broken link) in its
    place was `error: .../locks: file exists`, which says neither what the folder is nor what to do."""
    folder = cache_dir() / name
    if (folder.exists() or folder.is_symlink()) and not folder.is_dir():
        what = "a file" if folder.is_file() else "a broken link" if not folder.exists() else "no folder"
        raise UserError(f"{folder}: is {what}, where the toolkit keeps {CACHE_FOLDERS[name]} (a folder of "
                        "$TOOLKIT_CACHE); move it away (or remove it), or set TOOLKIT_CACHE to another folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # it said "/proc: this folder takes no new files ...; write elsewhere (--runs-dir,
        # --output)", options that do not move the cache, or a bare permission error
        raise UserError(f"{folder}: cannot be made ({(exc.strerror or str(exc)).lower()}); the toolkit keeps "
                        f"{CACHE_FOLDERS[name]} there, in $TOOLKIT_CACHE (else ~/.cache/toolkit): set TOOLKIT_CACHE "
                        "to a folder this process can write") from None
    return folder


def cache_dir() -> Path:
    """$TOOLKIT_CACHE (env_folder), else ~/.cache/toolkit, the home looked up only then. Looked
    up first, a process with no home to find (HOME unset under a user id with no passwd entry: a
    container run as an arbitrary uid) was a RuntimeError traceback even with TOOLKIT_CACHE set."""
    if os.environ.get("TOOLKIT_CACHE"):
        return env_folder("TOOLKIT_CACHE", "")
    try:
        return Path.home() / ".cache" / "toolkit"
    except RuntimeError:  # what pathlib raises with no HOME and no passwd entry
        raise UserError(f"TOOLKIT_CACHE is not set and this process has no home folder for ~/.cache/toolkit "
                        f"(HOME is unset and user id {os.getuid()} has no passwd entry); set TOOLKIT_CACHE "
                        "(or HOME) to a folder the toolkit may write") from None
