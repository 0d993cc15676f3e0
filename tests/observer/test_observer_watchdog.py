"""OBS-8 in a real process: an observer whose loop is blocked still ends soon after its trainer
dies. The block is one that happens in life: the report file is a FIFO nobody reads (as a report
path on a hung mount would be), so appending the observer's failure report waits in ``open``.
No torch: the "trainer" is a small Python process that starts the real observer
(``python -m scout.observer.process``) and hands it a spec the way the launcher does."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from scout.observer.process import EXIT_DEADLINE_S
from tests import processes

pytestmark = [pytest.mark.processes, pytest.mark.light]

WAIT_S = 30.0

# The trainer: start the observer, give it a spec whose rendezvous can never complete (it has
# no peers), so it fails at join_deadline_s and blocks appending that failure to the FIFO.
TRAINER = textwrap.dedent("""
    import json, os, subprocess, sys, time
    from scout.observer.progress import process_start_ticks
    from scout.observer.rendezvous import group_id, group_key
    report_path, stderr_path = sys.argv[1], sys.argv[2]
    gid = group_id("watchdog-job", 0, [0, 1])
    spec = {
        "job_id": "watchdog-job", "generation": 0, "rank": 0, "group_ranks": [0, 1],
        "group_id": gid.hex(), "group_key": group_key(b"s" * 32, gid).hex(),
        "record_name": "scout-watchdog-never-created", "record_token": "00" * 16,
        "config": {"join_deadline_s": 0.5, "attach_deadline_s": 30.0},
        "trainer_pid": os.getpid(), "trainer_start_ticks": process_start_ticks(os.getpid()) or 0,
        "report_path": report_path, "stats_path": None, "exclude_hosts_path": None,
        "poll_interval_s": 0.05, "bind_host": "127.0.0.1", "hostname": "watchdog-host",
        "on_hang": "report", "kill_grace_s": 5.0,
    }
    with open(stderr_path, "wb") as stderr:
        observer = subprocess.Popen([sys.executable, "-m", "scout.observer.process"], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=stderr, close_fds=True)
    observer.stdin.write((json.dumps(spec) + "\\n").encode())
    observer.stdin.flush()
    print(json.dumps({"observer_pid": observer.pid, "address": json.loads(observer.stdout.readline())}), flush=True)
    time.sleep(60)  # killed by the test long before
""")


def wait_gone(pid: int, timeout_s: float) -> float | None:
    """Seconds until ``pid`` is gone or a zombie (reaped here when it is our child), or None."""
    started = time.monotonic()
    while True:
        processes.reap_zombies([pid])
        try:
            with open(f"/proc/{pid}/stat", encoding="utf-8") as file:
                stat = file.read()
        except FileNotFoundError:
            return time.monotonic() - started
        if stat[stat.rindex(")") + 2] == "Z":
            processes.reap_zombies([pid])
            return time.monotonic() - started
        if time.monotonic() - started >= timeout_s:
            return None
        time.sleep(0.02)


def test_OBS_8_observer_blocked_on_its_report_file_ends_within_the_deadline_after_its_trainer_dies(
        tmp_path: Path) -> None:
    fifo = tmp_path / "reports.fifo"
    os.mkfifo(fifo)
    stderr_path = tmp_path / "observer.stderr"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                        os.environ.get("PYTHONPATH", "")]))
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER, str(fifo), str(stderr_path)], stdout=subprocess.PIPE,
                               env=env)
    observer_pid = 0
    try:
        assert trainer.stdout is not None
        started = json.loads(trainer.stdout.readline())
        observer_pid = started["observer_pid"]
        # The join deadline passes at 0.5 s; then the observer blocks opening the FIFO for writing
        # (the kernel sleeps it in wait_for_partner; where /proc hides that, give it 3 s).
        blocked = wait_blocked_on_fifo(observer_pid, WAIT_S)
        assert blocked, f"the observer of the test never blocked on the FIFO (wchan {_wchan(observer_pid)!r})"
        trainer.kill()
        trainer.wait(WAIT_S)
        gone_after_s = wait_gone(observer_pid, WAIT_S)
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait(WAIT_S)
        if observer_pid and wait_gone(observer_pid, 0.0) is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(observer_pid, signal.SIGKILL)
            wait_gone(observer_pid, WAIT_S)
    stderr = stderr_path.read_text(encoding="utf-8")
    assert gone_after_s is not None, f"the observer outlived its trainer by {WAIT_S} s:\n{stderr}"
    # Not before the deadline (the watchdog gives the loop its chance), and soon after it.
    assert EXIT_DEADLINE_S - 0.2 <= gone_after_s <= EXIT_DEADLINE_S + 1.5, (gone_after_s, stderr)
    assert f"did not stop within {EXIT_DEADLINE_S} s" in stderr, stderr
    # Where it was stuck is named: the append of the failure report.
    assert "append_record" in stderr, stderr


def _wchan(pid: int) -> str:
    """The kernel function ``pid`` sleeps in, "" if gone."""
    try:
        with open(f"/proc/{pid}/wchan", encoding="utf-8") as file:
            return file.read()
    except (FileNotFoundError, ProcessLookupError):
        return ""


def wait_blocked_on_fifo(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        wchan = _wchan(pid)
        if wchan == "wait_for_partner":
            return True
        if wchan in ("", "0"):  # gone, or a kernel that hides wchan: fall back to the timing
            time.sleep(3.0)
            return bool(_wchan(pid) or os.path.exists(f"/proc/{pid}"))
        time.sleep(0.05)
    return False
