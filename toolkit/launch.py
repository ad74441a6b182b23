"""`make run NPROC=N` (N > 1): accelerate's own `accelerate launch`, with one difference.

When a process of the launch stops on a user error it says its one line (`error: ...`) and exits
2; the launcher (torch elastic, inside `accelerate launch`) then raised `ChildFailedError`, whose
traceback and report box (40 lines) followed that line and ended the launch with exit 1: the
user's line buried under what reads as a crash. Here the same `launch_command` runs (accelerate's
parser, config file and launchers, unchanged); a `ChildFailedError` ends the launch with the
failed processes' own exit code (2 for a user error; 1 where a process was killed by a signal)
and no traceback. Written here because accelerate offers no switch for it.

The same for a signal to the launch (Ctrl-C, SIGTERM from a scheduler or `kill`): torch elastic's
handler raised `SignalException` in the launcher after it had passed the signal to the processes
and waited for them (rank 0 said its one line: the step reached, the checkpoint kept); its
traceback (25 lines) followed that line and the launch exited 1. It now exits 128 + the signal's
number (130 for Ctrl-C, 143 for SIGTERM), as the one-process `toolkit run` does.
"""

from __future__ import annotations

import sys


def exit_code(failures: dict) -> int:
    """The launch's exit code from torch elastic's failures ({rank: ProcessFailure}): the first
    positive exit code of a process (by rank), else 1 (a signal, as torchrun exits)."""
    codes = [getattr(failures[rank], "exitcode", 1) for rank in sorted(failures)]
    return next((code for code in codes if isinstance(code, int) and code > 0), 1)


def main(argv: list[str] | None = None) -> int:
    from accelerate.commands.launch import launch_command, launch_command_parser
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    args = launch_command_parser().parse_args(argv)
    try:
        launch_command(args)
    except ChildFailedError as failed:
        return exit_code(failed.failures)
    except SignalException as stopped:  # the processes were stopped with it, and said so
        return 128 + int(stopped.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
