"""Programs for tests/unit/test_process_hygiene.py's checks of ``processes.run_forked``: each
reads ``sys.argv`` as a started program would."""

from __future__ import annotations

import os
import subprocess
import sys
import time


def echo() -> int:
    """Says where it runs and what it was given; exits with the code in its last argument."""
    print(f"cwd={os.getcwd()} marker={os.environ.get('SCOUT_TEST_MARKER')} argv={sys.argv[1:]}")
    print("to stderr", file=sys.stderr)
    return int(sys.argv[-1])


def leave_sleeper() -> int:
    """Starts a sleeper (its group's member) and exits at once, leaving it running."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    print(sleeper.pid, flush=True)
    return 0


def hang() -> int:
    """Forks a child that sleeps, then sleeps itself: only the timeout ends it."""
    if os.fork() == 0:
        time.sleep(60)
        os._exit(0)
    time.sleep(60)
    return 0


def fail() -> int:
    raise RuntimeError("the program failed")
