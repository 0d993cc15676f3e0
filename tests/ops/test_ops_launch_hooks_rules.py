"""The trainer's side of the ops (spec/ops.md OPS-1, OPS-2, OPS-9) and the on_report runner
(OPS-4) compared whole, in-process (issue 41's mutation run over scout/ops/launch.py and
scout/ops/hooks.py).

The attach collective is answered by a scripted stand-in for ``torch.distributed`` (the node's
other ranks as they would answer), and the sidecar by a scripted sidecar: a short shell script
started where ``python -m scout.ops.sidecar`` would be, which writes down what the trainer gave
it (its spec line, its environment, its descriptors) and answers as the test tells it. The hooks
are real short commands. Each test names what an operator sees: the trainer's log line, the
hook's log line and counts, what the sidecar or the command was given."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scout.job.config import load_config
from scout.observer.launch import _environment
from scout.observer.progress import ProgressPublisher, RecordIdentity, process_start_ticks
from scout.ops import hooks, launch
from scout.ops.hooks import OUTCOMES, OnReportRunner, OutputTail
from scout.ops.launch import NodeOps

pytestmark = pytest.mark.processes

# -- NodeOps.start: the attach collective and the sidecar's spec (OPS-1) -------------------------


class ScriptedCollective:
    """Stands in for ``torch.distributed`` at attach: the other ranks of ``group`` answer with
    the entries given (a rank on this node carries this node's key). Refuses any other group."""

    def __init__(self, group: object, others: dict[int, dict[str, Any]]) -> None:
        self.group = group
        self.others = others
        self.mine: dict[str, Any] | None = None

    def get_world_size(self, group: object = None) -> int:
        assert group is self.group, f"the world size of {group!r}, not of the control group"
        return len(self.others) + 1

    def all_gather_object(self, out: list[Any], obj: dict[str, Any], group: object = None) -> None:
        assert group is self.group, f"a gather over {group!r}, not over the control group"
        assert len(out) == len(self.others) + 1
        self.mine = obj
        for rank in range(len(out)):
            out[rank] = obj if rank == obj["rank"] else self.others[rank]


@pytest.fixture
def publisher() -> Iterator[ProgressPublisher]:
    value = ProgressPublisher(RecordIdentity(f"ops-launch-rules-{os.getpid()}", 5, 0))
    try:
        yield value
    finally:
        value.close()


def _peer(rank: int, node: str) -> dict[str, Any]:
    return {"rank": rank, "host": "peer", "node": node, "record_name": f"r{rank}", "record_token": "00",
            "pid": 10 + rank, "start_ticks": 7}


def _start_recording(monkeypatch: pytest.MonkeyPatch, others: dict[int, dict[str, Any]]
                     ) -> tuple[ScriptedCollective, object, list[dict[str, Any]]]:
    group = object()
    collective = ScriptedCollective(group, others)
    specs: list[dict[str, Any]] = []

    def start_sidecar(spec: dict[str, Any]) -> tuple[None, tuple[str, int]]:
        specs.append(spec)
        return None, ("127.0.0.1", 9999)

    monkeypatch.setattr(launch, "dist", collective)
    monkeypatch.setattr(launch, "_start_sidecar", start_sidecar)
    return collective, group, specs


def test_OPS_1_the_nodes_lowest_rank_starts_its_sidecar_with_its_nodes_ranks_in_order(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, publisher: ProgressPublisher) -> None:
    config = load_config(None, None, environ={"SCOUT_METRICS_PORT": "0", "SCOUT_ON_REPORT": "notify"})
    here = launch._node_key("h")
    others = {0: _peer(0, "elsewhere"), 2: _peer(2, here), 3: _peer(3, here), 4: _peer(4, "elsewhere")}
    collective, group, specs = _start_recording(monkeypatch, others)
    ops = NodeOps.start(config, run_dir=str(tmp_path), publisher=publisher, group=group, rank=1, host="h")
    mine = {"rank": 1, "host": "h", "node": here, "record_name": publisher.name,
            "record_token": publisher.token.hex(), "pid": os.getpid(),
            "start_ticks": process_start_ticks(os.getpid())}
    assert collective.mine == mine and mine["start_ticks"]
    assert specs == [{"run_dir": str(tmp_path), "host": "h", "job_id": publisher.identity.job_id,
                      "generation": 5, "ranks": [mine, others[2], others[3]], "has_rank_zero": False,
                      "metrics_port": 0, "metrics_addr": config.metrics_addr, "on_report": "notify",
                      "on_report_timeout_s": config.on_report_timeout_s, "poll_interval_s": launch.POLL_INTERVAL_S}]
    assert ops is not None and ops.run_dir == tmp_path and ops.rank == 1 and ops.write_stats
    assert ops.metrics_address == ("127.0.0.1", 9999)
    # A node holding rank 0 says so (its sidecar counts the reports that name no reporter, OPS-3).
    collective, group, specs = _start_recording(monkeypatch, {1: _peer(1, here), 2: _peer(2, "elsewhere")})
    assert NodeOps.start(config, run_dir=tmp_path, publisher=publisher, group=group, rank=0, host="h") is not None
    assert [entry["rank"] for entry in specs[0]["ranks"]] == [0, 1] and specs[0]["has_rank_zero"] is True


def test_OPS_1_a_rank_that_is_not_its_nodes_lowest_starts_nothing_and_an_unknown_start_is_zero(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, publisher: ProgressPublisher) -> None:
    config = load_config(None, None, environ={"SCOUT_ON_REPORT": "notify"})
    here = launch._node_key("h")
    collective, group, specs = _start_recording(monkeypatch, {0: _peer(0, here), 1: _peer(1, "elsewhere")})
    monkeypatch.setattr(launch, "process_start_ticks", lambda _pid: None)  # the platform cannot tell
    ops = NodeOps.start(config, run_dir=tmp_path, publisher=publisher, group=group, rank=2, host="h")
    assert specs == [] and collective.mine is not None and collective.mine["start_ticks"] == 0
    assert ops is not None and ops.process is None and ops.metrics_address is None and not ops.write_stats


# -- _start_sidecar: what the sidecar is given and what its answer means (OPS-2, OPS-9) ------------


def _scripted_sidecar(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, answer: str, *, fd: int = -1) -> Path:
    """Puts a shell script where ``python -m scout.ops.sidecar`` runs; it writes what it was
    given into ``tmp_path`` and then runs ``answer``."""
    script = tmp_path / "sidecar.sh"
    script.write_text(f"""#!/bin/sh
IFS= read -r spec
printf '%s\\n' "$spec" > {tmp_path}/spec
printf '%s|%s|%s\\n' "$1 $2" "$PYTHONPATH" "$OMP_NUM_THREADS" > {tmp_path}/env
if [ -e /proc/$$/fd/{fd} ]; then echo held > {tmp_path}/fd; fi
{answer}
""", encoding="utf-8")
    script.chmod(0o755)
    monkeypatch.setattr(launch, "sys", types.SimpleNamespace(executable=str(script)))
    return script


def _started(spec: dict[str, Any]) -> tuple[subprocess.Popen[bytes] | None, tuple[str, int] | None]:
    process, address = launch._start_sidecar(spec)
    if process is not None:
        process.wait(10)
        process.stdin.close()  # type: ignore[union-attr]
        process.stdout.close()  # type: ignore[union-attr]
    return process, address


def test_OPS_2_the_sidecar_gets_its_spec_as_one_sorted_json_line_scouts_environment_and_no_descriptor(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    read_end, write_end = os.pipe()
    os.set_inheritable(write_end, True)  # inheritable, as a user's open file may be: not the sidecar's
    try:
        _scripted_sidecar(monkeypatch, tmp_path, """echo '{"ready": true, "metrics_address": ["127.0.0.1", 9100]}'""",
                          fd=write_end)
        spec = {"run_dir": str(tmp_path), "host": "h", "on_report": None, "b": [1], "a": 2}
        with caplog.at_level(logging.INFO, logger="scout"):
            process, address = _started(spec)
    finally:
        os.close(read_end)
        os.close(write_end)
    assert process is not None and process.returncode == 0 and address == ("127.0.0.1", 9100)
    assert (tmp_path / "spec").read_text() == \
        '{"a": 2, "b": [1], "host": "h", "on_report": null, "run_dir": "' + str(tmp_path) + '"}\n'
    environment = _environment()
    assert (tmp_path / "env").read_text() == \
        f"-m scout.ops.sidecar|{environment['PYTHONPATH']}|{environment['OMP_NUM_THREADS']}\n"
    assert not (tmp_path / "fd").exists(), "the sidecar holds a descriptor of the trainer"
    assert caplog.messages == ["scout: metrics of h at http://127.0.0.1:9100/metrics"]


def test_OPS_2_a_ready_sidecar_without_metrics_is_a_process_and_no_address(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    _scripted_sidecar(monkeypatch, tmp_path, """echo '{"ready": true, "metrics_address": null, "metrics_error": null}'""")
    with caplog.at_level(logging.INFO, logger="scout"):
        process, address = _started({"host": "h", "on_report": "notify"})
    assert process is not None and address is None and caplog.messages == []


def test_OPS_9_a_sidecar_without_its_metrics_port_runs_on_and_the_trainer_says_what_still_works(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    why = "cannot serve metrics on 127.0.0.1:9100: [Errno 98] Address already in use"
    _scripted_sidecar(monkeypatch, tmp_path,
                      f"""echo '{{"ready": true, "metrics_address": null, "metrics_error": "{why}"}}'""")
    with caplog.at_level(logging.INFO, logger="scout"):
        assert _started({"host": "h7", "on_report": "notify"})[0] is not None
        assert _started({"host": "h8", "on_report": None})[0] is not None
    assert caplog.messages == [
        f"scout: the ops sidecar on h7 {why}; metrics are off on this node, on_report still runs (pick another "
        "metrics_port, or 0 for any free port)",
        f"scout: the ops sidecar on h8 {why}; metrics are off on this node (pick another metrics_port, or 0 for any "
        "free port)"]
    assert [record.levelno for record in caplog.records] == [logging.WARNING] * 2


def test_OPS_2_a_sidecar_that_says_nothing_useful_in_time_is_killed_and_logged_with_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    prefix = "scout: the ops sidecar on h did not start ("
    suffix = "); metrics and on_report are off on this node"
    _scripted_sidecar(monkeypatch, tmp_path, "echo 'not json'; exec sleep 5")
    with caplog.at_level(logging.WARNING, logger="scout"):
        assert launch._start_sidecar({"host": "h"}) == (None, None)
    assert caplog.messages == [prefix + "Expecting value: line 1 column 1 (char 0)" + suffix]
    caplog.clear()
    _scripted_sidecar(monkeypatch, tmp_path, "exit 3")  # ends without a word
    with caplog.at_level(logging.WARNING, logger="scout"):
        assert launch._start_sidecar({"host": "h"}) == (None, None)
    assert len(caplog.messages) == 1
    assert caplog.messages[0].startswith(prefix + f"no answer within {launch.START_TIMEOUT_S:g} s (exit code ")
    assert caplog.messages[0].endswith(suffix)
    caplog.clear()
    # One that would answer, but only after the start timeout: no process, and it is killed.
    monkeypatch.setattr(launch, "START_TIMEOUT_S", 0.3)
    _scripted_sidecar(monkeypatch, tmp_path, f"""exec {sys.executable} -c 'import time; time.sleep(1.5); print("{{\\"ready\\": true}}")'""")
    with caplog.at_level(logging.WARNING, logger="scout"):
        assert launch._start_sidecar({"host": "h"}) == (None, None)
    assert caplog.messages == [prefix + "no answer within 0.3 s (exit code None)" + suffix]


# -- NodeOps.close (OPS-2) ----------------------------------------------------------------------


def test_OPS_2_close_waits_a_bounded_time_says_so_and_never_raises_on_the_sidecars_pipes(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    slow = subprocess.Popen(["sleep", "3"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        ops = NodeOps(rank=0, run_dir=tmp_path, write_stats=False, process=slow, metrics_address=None)
        started = time.monotonic()
        with caplog.at_level(logging.INFO, logger="scout"):
            ops.close(wait_s=0.3)
        assert time.monotonic() - started < 2.0 and slow.poll() is None
        assert caplog.messages == [f"scout: the ops sidecar (pid {slow.pid}) still runs 0 s after close; it ends "
                                   "once its node's trainers are gone"]
        assert ops.process is None and slow.stdin.closed and slow.stdout.closed  # type: ignore[union-attr]
    finally:
        slow.kill()
        slow.wait(5)
    # A sidecar gone with bytes still buffered for it (its stdin: a broken pipe) and a pipe already
    # closed under it (its stdout): close says nothing and raises nothing.
    gone = subprocess.Popen(["true"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    gone.wait(10)
    gone.stdin.write(b"x")  # type: ignore[union-attr]
    os.close(gone.stdout.fileno())  # type: ignore[union-attr]
    caplog.clear()
    NodeOps(rank=0, run_dir=tmp_path, write_stats=False, process=gone, metrics_address=None).close()
    assert gone.stdin.closed and gone.stdout.closed and caplog.messages == []  # type: ignore[union-attr]


# -- OnReportRunner (OPS-4) ---------------------------------------------------------------------


def _until(runner: OnReportRunner, outcome: str, count: int = 1) -> float:
    """Polls until ``outcome`` is counted ``count`` times; answers the longest single poll (s)."""
    deadline = time.monotonic() + 20
    longest = 0.0
    while runner.counts[outcome] < count:
        assert time.monotonic() < deadline, f"no {outcome} outcome: {runner.counts}"
        started = time.monotonic()
        runner.poll()
        longest = max(longest, time.monotonic() - started)
        time.sleep(0.01)
    return longest


def test_OPS_4_a_failures_log_quotes_its_stderr_too_and_bytes_that_are_not_utf8(tmp_path: Path) -> None:
    logged: list[str] = []
    runner = OnReportRunner(["sh", "-c", "echo oops >&2; exit 2"], timeout_s=5, log=logged.append)
    runner.submit({"kind": "sdc"})
    _until(runner, "failed")
    assert logged == ["on_report: sh -c echo oops >&2; exit 2 for a sdc report exited with code 2; its output "
                      "ended: oops"]
    logged.clear()
    runner = OnReportRunner(["sh", "-c", r"printf '\377bad'; exit 1"], timeout_s=5, log=logged.append)
    runner.submit({"kind": "sdc"})
    _until(runner, "failed")
    assert logged == [r"on_report: sh -c printf '\377bad'; exit 1 for a sdc report exited with code 1; its output "
                      "ended: \ufffdbad"]


def test_OPS_4_a_command_holds_none_of_the_sidecars_descriptors() -> None:
    read_end, write_end = os.pipe()
    os.set_inheritable(write_end, True)
    logged: list[str] = []
    try:
        runner = OnReportRunner(["sh", "-c", f"if [ -e /proc/$$/fd/{write_end} ]; then echo held; fi; exit 1"],
                                timeout_s=5, log=logged.append)
        runner.submit({"kind": "hang"})
        _until(runner, "failed")
    finally:
        os.close(read_end)
        os.close(write_end)
    assert len(logged) == 1 and logged[0].endswith("for a hang report exited with code 1"), logged


def test_OPS_4_every_start_that_fails_is_counted_and_every_drop_adds_up(tmp_path: Path) -> None:
    logged: list[str] = []
    missing = OnReportRunner([str(tmp_path / "nothing")], timeout_s=5, log=logged.append)
    missing.submit({"kind": "sdc"})
    missing.submit({"kind": "hang"})
    missing.poll()
    missing.poll()
    assert missing.idle and missing.counts["not_started"] == 2 and len(logged) == 2
    runner = OnReportRunner(["true"], timeout_s=5, queue_max=1, log=logged.append)
    assert runner.submit({"kind": "sdc"}) and not runner.submit({"kind": "sdc"})
    runner.close(runner.clock())  # the deadline is now: the queued one is dropped too
    assert runner.counts == {**dict.fromkeys(OUTCOMES, 0), "dropped": 2}


def test_OPS_4_close_runs_what_is_queued_one_after_the_other_until_its_deadline() -> None:
    runner = OnReportRunner(["true"], timeout_s=5, log=print)
    for _ in range(3):
        runner.submit({"kind": "sdc"})
    runner.close(runner.clock() + 2.0)
    assert runner.counts == {**dict.fromkeys(OUTCOMES, 0), "succeeded": 3} and runner.idle


def _kill_pid_in(path: Path) -> None:
    deadline = time.monotonic() + 10
    while not path.exists() or not path.read_text().strip():
        assert time.monotonic() < deadline, f"no pid in {path}"
        time.sleep(0.01)
    with contextlib.suppress(ProcessLookupError):
        os.kill(int(path.read_text()), signal.SIGKILL)


def test_OPS_4_output_from_outside_the_session_is_awaited_briefly_and_only_for_a_failure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hooks, "DRAIN_WAIT_S", 5.0)  # wide: a failure waits for the late words below
    logged: list[str] = []
    # The command fails; a process it started in a session of its own says more half a second later.
    failing = OnReportRunner(["sh", "-c", 'setsid sh -c "sleep 0.5; echo late" & echo early; exit 3'],
                             timeout_s=5, log=logged.append)
    failing.submit({"kind": "sdc"})
    _until(failing, "failed")
    assert logged == ['on_report: sh -c setsid sh -c "sleep 0.5; echo late" & echo early; exit 3 for a sdc report '
                      "exited with code 3; its output ended: early\nlate"]
    # The command succeeds; a process outside its session holds its output for 3 s, silent: the
    # sidecar's loop is not held by it (a success's output is not logged).
    pid_file = tmp_path / "pid"
    ok = OnReportRunner(["sh", "-c", f'setsid sh -c "echo \\$\\$ > {pid_file}; exec sleep 3" & exit 0'],
                        timeout_s=5, log=logged.append)
    ok.submit({"kind": "sdc"})
    try:
        longest = _until(ok, "succeeded")
    finally:
        _kill_pid_in(pid_file)
    assert longest < 1.0, f"one poll took {longest:.2f} s"
    assert len(logged) == 1


# -- OutputTail (OPS-4) -------------------------------------------------------------------------


def _new_threads(before: set[threading.Thread]) -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread not in before]


def test_OPS_4_the_tail_keeps_one_byte_if_asked_and_counts_every_read() -> None:
    read_end, write_end = os.pipe()
    before = set(threading.enumerate())
    tail = OutputTail(read_end, keep_bytes=1)
    threads = _new_threads(before)
    assert [(thread.name, thread.daemon) for thread in threads] == [("scout-on-report-output", True)]
    os.write(write_end, b"abc")
    deadline = time.monotonic() + 10
    while tail.total_bytes < 3:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    os.write(write_end, b"de")
    os.close(write_end)
    assert tail.close() == b"e" and tail.total_bytes == 5


def test_OPS_4_the_tail_waits_out_silence_and_stops_when_told_closing_its_pipe() -> None:
    read_end, write_end = os.pipe()
    tail = OutputTail(read_end)
    time.sleep(0.3)  # a command silent for a while, then it speaks
    os.write(write_end, b"late")
    os.close(write_end)
    assert tail.close() == b"late"
    # A writer that holds the pipe open and says nothing: close returns after its wait, the
    # reader is gone and its end of the pipe closed.
    read_end, write_end = os.pipe()
    before = set(threading.enumerate())
    tail = OutputTail(read_end)
    (thread,) = _new_threads(before)
    closed = threading.Lock()  # whoever takes it closes the writer, once

    def close_writer() -> None:
        if closed.acquire(blocking=False):
            os.close(write_end)

    guard = threading.Timer(3.0, close_writer)  # bounds the test whatever close does
    guard.start()
    try:
        os.write(write_end, b"x")
        assert tail.close(wait_s=0.05) == b"x"
        assert not thread.is_alive(), "the reader still runs after close"
        with pytest.raises(OSError):
            os.fstat(read_end)
    finally:
        guard.cancel()
        close_writer()
