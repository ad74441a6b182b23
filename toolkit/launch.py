"""`make run NPROC=N` (N > 1): accelerate's own `accelerate launch`, with one difference.

When a process of the launch stops on a user error it says its one line (`error: ...`) and exits
2; the launcher (torch elastic, inside `accelerate launch`) then raised `ChildFailedError`, whose
traceback and report box (40 lines) followed that line and ended the launch with exit 1: the
user's line buried under what reads as a crash. Here the same `launch_command` runs (accelerate's
parser, config file and launchers, unchanged); a `ChildFailedError` ends the launch with the
failed process's own exit code (2 for a user error; 1 where a process was killed by a signal),
not that of one stopped after it, and no traceback. Written here because accelerate offers no switch for it.

The same for a signal to the launch (Ctrl-C, SIGTERM from a scheduler or `kill`): torch elastic's
handler raised `SignalException` in the launcher after it had passed the signal to the processes
and waited for them (rank 0 said its one line: the step reached, the checkpoint kept); its
traceback (25 lines) followed that line and the launch exited 1. It now exits 128 + the signal's
number (130 for Ctrl-C, 143 for SIGTERM), as the one-process `toolkit run` does.
"""

from __future__ import annotations

import importlib
import logging
import signal
import sys

from toolkit.errors import STOPPED_WITH_THE_LAUNCH

# torch elastic's own lines on a failed or stopped launch (`Sending process N closing signal
# SIGTERM`, `failed (exitcode: 2) local_rank: 1 (pid: N) of binary: ...`, `Received 2 death signal,
# shutting down workers`), which followed the processes' own `error:` line
LAUNCHER_LOGGERS = ("torch.distributed.elastic.multiprocessing.api", "torch.distributed.elastic.agent.server.api")


# how a process ends when the launcher stops it with SIGTERM after another failed: the toolkit's
# own stop (128 + 15) or, outside its command, the signal itself
STOPPED_BY_THE_LAUNCHER = (128 + 15, -15)


def exit_code(failures: dict) -> int:
    """The launch's exit code from torch elastic's failures ({rank: ProcessFailure}): that of the
    process whose failure stopped the launch, the others' being the launcher's SIGTERM after it,
    or their own stop when their collective lost the stopped peer (`error: process N of M stopped
    with the launch: ...`, exit errors.STOPPED_WITH_THE_LAUNCH). A user error in process 1 alone
    (exit 2) ended the launch with 143 where process 0, stopped by the launcher's SIGTERM before
    its collective failed, exited so; and a process killed by SIGKILL beside one that stopped with
    it ended the launch with that one's 2 (it exited 2 too), a user error's code for a kill. Now
    the first positive exit code by rank among the processes that neither the launcher nor a lost
    peer stopped, else 1 (a signal, as torchrun exits: a process killed, SIGKILL of the
    out-of-memory killer); 143 where every process was stopped by SIGTERM (sent to the processes
    themselves); 1 where every process says another stopped first (the cause left no code)."""
    codes = [getattr(failures[rank], "exitcode", 1) for rank in sorted(failures)]
    codes = [code if isinstance(code, int) else 1 for code in codes]
    causes = [code for code in codes if code not in (*STOPPED_BY_THE_LAUNCHER, STOPPED_WITH_THE_LAUNCH)]
    if not causes:
        return 128 + 15 if all(code in STOPPED_BY_THE_LAUNCHER for code in codes) else 1
    return next((code for code in causes if code > 0), 1)


def killed(failures: dict) -> list[str]:
    """One line for each process killed by a signal other than the launcher's SIGTERM (the
    out-of-memory killer's SIGKILL, a crash's SIGSEGV): such a process said nothing, and torch
    elastic's `failed (exitcode: -9)` line, the one word of it, is not shown."""
    lines = []
    for rank in sorted(failures):
        code = getattr(failures[rank], "exitcode", None)
        if isinstance(code, int) and code < 0 and code not in STOPPED_BY_THE_LAUNCHER:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            hint = " (what the out-of-memory killer sends)" if -code == signal.SIGKILL else ""
            lines.append(f"error: process {rank} of the launch was killed by {name}{hint}, and the launch "
                         "stopped with it")
    return lines


def main(argv: list[str] | None = None) -> int:
    from accelerate.commands.launch import launch_command, launch_command_parser
    importlib.import_module("torch.distributed.elastic.agent.server.api")  # sets its logger's level as it loads
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    args = launch_command_parser().parse_args(argv)
    for name in LAUNCHER_LOGGERS:  # the processes say what stopped them; the exit code says the rest
        logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        launch_command(args)
    except ChildFailedError as failed:
        for line in killed(failed.failures):
            print(line, file=sys.stderr, flush=True)
        return exit_code(failed.failures)
    except SignalException as stopped:  # the processes were stopped with it, and said so
        return 128 + int(stopped.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
