"""Run one command as a child subreaper that reaps every orphan below it:
``python -m tests.ops.reaper COMMAND...``.

pytest is a child subreaper for the whole session (tests/processes.py), so a process that a
daemon double-forks -- slurmd's slurmstepd, the batch script's orphans -- would be re-parented
to pytest, which does not wait for it during the test: it stays a zombie, and Slurm's process
tracking (proctrack/pgid) then sees a job whose processes never end and drains the node. Under
this wrapper they are re-parented here and reaped at once. On SIGTERM it passes the signal on;
when its command ends it kills whatever is left below it (bounded), reaps it, and exits with the
command's status."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

from tests.processes import PR_SET_CHILD_SUBREAPER, _children, _prctl, die_with_parent

LEFTOVER_WAIT_S = 10.0


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m tests.ops.reaper COMMAND...", file=sys.stderr)
        return 2
    die_with_parent(signal.SIGTERM)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    command = subprocess.Popen(argv)

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            command.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    status = 0
    while True:
        try:
            pid, raw = os.wait()
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        if pid == command.pid:
            status = os.waitstatus_to_exitcode(raw)
            command.returncode = status
            break
    # The command is gone: end what it left below us, then reap it.
    deadline = time.monotonic() + LEFTOVER_WAIT_S
    while (left := _children(os.getpid())) and time.monotonic() < deadline:
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        time.sleep(0.05)
    return status if status >= 0 else 128 - status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
