"""The suite's process hygiene (tests/processes.py, tests/conftest.py): an orphaned grandchild is
still found, leftovers are killed whole (stopped ones too), and ``processes.run`` kills
everything a command forked at its timeout and at its exit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests import processes

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc and prctl (Linux)"), pytest.mark.processes]

# A child that starts a grandchild in a new session (ignoring SIGTERM and stopping itself, as the
# stray processes seen in CI did), prints its pid, and exits: the grandchild is an orphan.
ORPHAN = (
    "import os, signal, subprocess, sys\n"
    "grandchild = subprocess.Popen([sys.executable, '-c', "
    "'import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(os.getpid(), flush=True); "
    "os.kill(os.getpid(), signal.SIGSTOP); time.sleep(60)'], start_new_session=True, stdout=subprocess.PIPE, "
    "stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)\n"
    "print(grandchild.stdout.readline().decode().strip(), flush=True)\n"
    "os._exit(0)\n"
)


def wait_until(condition, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


def test_an_orphaned_stopped_grandchild_is_found_and_killed() -> None:
    before = set(processes.descendants())
    child = subprocess.run([sys.executable, "-c", ORPHAN], capture_output=True, text=True, timeout=30)
    grandchild = int(child.stdout.split()[-1])
    # pytest is a subreaper, so the orphan is re-parented to it, not to init.
    assert wait_until(lambda: grandchild in processes.descendants())
    assert processes.descendants()[grandchild].ppid == os.getpid()
    left = processes.leftovers(before, grace_s=0.2)
    assert [info.pid for info in left] == [grandchild]
    processes.kill(left)
    assert grandchild not in processes.descendants()
    assert processes.leftovers(before, grace_s=0.0) == []


def test_run_kills_the_whole_group_at_the_timeout() -> None:
    before = set(processes.descendants())
    script = ("import subprocess, sys, time\n"
              "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
              "time.sleep(60)\n")
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        processes.run([sys.executable, "-c", script], timeout=1.0, capture_output=True)
    assert time.monotonic() - started < 15
    assert processes.leftovers(before, grace_s=2.0) == []


def test_run_kills_what_the_command_left_running_at_its_exit() -> None:
    before = set(processes.descendants())
    script = ("import subprocess, sys\n"
              "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n")
    completed = processes.run([sys.executable, "-c", script], timeout=30, capture_output=True, text=True)
    assert completed.returncode == 0
    assert processes.leftovers(before, grace_s=2.0) == []


def test_die_with_parent_kills_a_child_whose_parent_dies() -> None:
    before = set(processes.descendants())
    script = (
        "import os, subprocess, sys, time\n"
        f"sys.path.insert(0, {os.getcwd()!r})\n"
        "code = 'import sys, time; sys.path.insert(0, sys.argv[1]); from tests import processes; "
        "processes.die_with_parent(); print(flush=True); time.sleep(60)'\n"
        "child = subprocess.Popen([sys.executable, '-c', code, sys.argv[1]], stdout=subprocess.PIPE)\n"
        "child.stdout.readline()\n"
        "print(child.pid, flush=True)\n"
        "os.kill(os.getpid(), 9)\n"
    )
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parent = subprocess.run([sys.executable, "-c", script, repo], capture_output=True, text=True, timeout=30)
    assert parent.returncode == -signal.SIGKILL
    orphan = int(parent.stdout.split()[-1])
    assert wait_until(lambda: orphan not in {p for p, i in processes.descendants().items() if i.state != "Z"})
    processes.reap_zombies([orphan])
    assert processes.leftovers(before, grace_s=1.0) == []


def test_run_forked_gives_the_programs_exit_code_output_environment_and_directory(tmp_path) -> None:
    before = set(processes.descendants())
    env = dict(os.environ, SCOUT_TEST_MARKER="here")
    completed = processes.run_forked("tests.unit.forked_program:echo", ["a", "3"], timeout=30, env=env,
                                     cwd=tmp_path)
    assert completed.returncode == 3
    assert completed.stdout == f"cwd={tmp_path} marker=here argv=['a', '3']\n" and completed.stderr == "to stderr\n"
    failed = processes.run_forked("tests.unit.forked_program:fail", [], timeout=30)
    assert failed.returncode == 1 and "RuntimeError: the program failed" in failed.stderr
    assert processes.leftovers(before, grace_s=2.0) == []
    with pytest.raises(ValueError, match="'module:function'"):
        processes.run_forked("tests.unit.forked_program", [], timeout=30)
    with pytest.raises(ValueError, match="bounded"):
        processes.run_forked("tests.unit.forked_program:echo", ["0"], timeout=0)


def test_run_forked_kills_the_whole_session_at_the_timeout_and_at_the_programs_exit() -> None:
    before = set(processes.descendants())
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        processes.run_forked("tests.unit.forked_program:hang", [], timeout=1.0)
    assert time.monotonic() - started < 15
    assert processes.leftovers(before, grace_s=2.0) == []
    completed = processes.run_forked("tests.unit.forked_program:leave_sleeper", [], timeout=30)
    assert completed.returncode == 0 and int(completed.stdout)
    assert processes.leftovers(before, grace_s=2.0) == []


def test_a_rank_forked_by_the_forkserver_is_not_taken_for_the_forkserver() -> None:
    """Forked ranks carry the forkserver's command line; only the server itself is exempt."""
    import multiprocessing

    context = multiprocessing.get_context("forkserver")
    before = set(processes.descendants())
    rank = context.Process(target=time.sleep, args=(30,), daemon=True)
    rank.start()
    try:
        left = processes.leftovers(before, grace_s=0.2)
        assert [info.pid for info in left] == [rank.pid]
        assert "multiprocessing.forkserver" in left[0].command
    finally:
        rank.kill()
        rank.join(10)
    assert processes.leftovers(before, grace_s=2.0) == []
