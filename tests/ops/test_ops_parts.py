"""The parts of scout's ops, each on its own with real files and real processes: the reports
tail, the on_report runner (OPS-4), the configuration keys, Slurm host names and the requeue
order (OPS-7, OPS-8, against a scripted scontrol), the alert webhook example against a local
HTTP server."""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest

from scout import reports
from scout.job.config import ConfigError, load_config
from scout.ops.hooks import OnReportRunner
from scout.ops.slurm import SlurmError, excluded_hosts, host_name, requeue_excluding
from scout.ops.tail import ReportTail
from tests import processes

pytestmark = pytest.mark.processes

REPO = Path(__file__).resolve().parents[2]


def _record(kind: str = "hang", step: int = 3) -> dict[str, Any]:
    return reports.make_record(kind, source="observer", reason="behind-majority", job_id="j", generation=0,
                               ranks=[2], hosts=["h"], step=step, reporter_rank=0)


# -- the tail ---------------------------------------------------------------------------------


def test_tail_returns_complete_lines_once_and_follows_a_replaced_file(tmp_path: Path) -> None:
    path = tmp_path / "reports.jsonl"
    reports.append_record(path, _record(step=1))
    tail = ReportTail(path, from_end=True)
    assert tail.read() == []
    line = json.dumps(_record(step=2), sort_keys=True)
    with path.open("a") as file:  # a writer caught mid-line: nothing until the line is whole
        file.write(line[:20])
    assert tail.read() == []
    with path.open("a") as file:
        file.write(line[20:] + "\nnot json\n")
    assert [r["step"] for r in tail.read()] == [2]
    assert tail.read() == []
    replacement = tmp_path / "new.jsonl"
    reports.append_record(replacement, _record(step=7))
    os.replace(replacement, path)
    assert [r["step"] for r in tail.read()] == [7]
    assert [r["step"] for r in ReportTail(path, from_end=False).read()] == [7]
    assert ReportTail(tmp_path / "missing.jsonl", from_end=True).read() == []


# -- on_report (OPS-4) ------------------------------------------------------------------------


def _drive(runner: OnReportRunner, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not runner.idle:
        assert time.monotonic() < deadline, "the runner did not finish its queue"
        runner.poll()
        time.sleep(0.02)


def test_OPS_4_each_report_runs_the_command_once_in_order_with_the_record_on_stdin(tmp_path: Path) -> None:
    out = tmp_path / "seen.jsonl"
    logged: list[str] = []
    script = f"import sys; open({str(out)!r}, 'a').write(sys.stdin.read())"
    runner = OnReportRunner([sys.executable, "-c", script], timeout_s=20, log=logged.append)
    records = [_record(step=s) for s in (1, 2, 3)]
    for record in records:
        assert runner.submit(record)
    _drive(runner)
    assert [json.loads(line) for line in out.read_text().splitlines()] == records
    assert runner.counts["succeeded"] == 3 and logged == []


def test_OPS_4_a_failing_or_overrunning_command_is_killed_logged_and_counted(tmp_path: Path) -> None:
    logged: list[str] = []
    failing = OnReportRunner([sys.executable, "-c", "import sys; print('webhook said 500'); sys.exit(4)"],
                             timeout_s=20, log=logged.append)
    failing.submit(_record())
    _drive(failing)
    assert failing.counts["failed"] == 1 and "exited with code 4" in logged[0] and "webhook said 500" in logged[0]

    marker = tmp_path / "child.pid"
    # The command starts a child and hangs: the timeout ends both (its session is killed whole).
    script = (f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
              f"open({str(marker)!r}, 'w').write(str(p.pid)); time.sleep(60)")
    hanging = OnReportRunner([sys.executable, "-c", script], timeout_s=1.5, log=logged.append)
    hanging.submit(_record())
    started = time.monotonic()
    _drive(hanging)
    assert time.monotonic() - started < 10
    assert hanging.counts["timed_out"] == 1 and "killed" in logged[-1]
    child = int(marker.read_text())
    deadline = time.monotonic() + 5
    while Path(f"/proc/{child}").exists() and processes._info(child) is not None and processes._info(child).state != "Z":
        assert time.monotonic() < deadline, "the command's child outlived the timeout"
        time.sleep(0.05)

    missing = OnReportRunner([str(tmp_path / "no-such-command")], timeout_s=5, log=logged.append)
    missing.submit(_record())
    _drive(missing)
    assert missing.counts["not_started"] == 1 and "could not start" in logged[-1]


def test_OPS_4_the_queue_is_bounded_and_what_is_dropped_is_counted() -> None:
    logged: list[str] = []
    runner = OnReportRunner([sys.executable, "-c", "pass"], timeout_s=5, queue_max=2, log=logged.append)
    accepted = [runner.submit(_record(step=s)) for s in range(5)]
    assert accepted == [True, True, False, False, False] and runner.counts["dropped"] == 3
    runner.close(time.monotonic() + 20)
    assert runner.idle and runner.counts["succeeded"] + runner.counts["dropped"] == 5


def test_OPS_1_a_node_is_a_host_a_launcher_agent_and_a_boot(monkeypatch: pytest.MonkeyPatch) -> None:
    from scout.ops.launch import _node_key

    monkeypatch.setenv("GROUP_RANK", "0")
    first = _node_key("h1")
    assert _node_key("h1") == first and _node_key("h2") != first
    monkeypatch.setenv("GROUP_RANK", "1")
    assert _node_key("h1") != first, "two torchrun agents on one host are two nodes"


# -- configuration ----------------------------------------------------------------------------


def test_CONFIG_ops_keys_are_checked_and_read_from_the_environment() -> None:
    config = load_config(None, None, environ={"SCOUT_METRICS_PORT": "9464", "SCOUT_ON_REPORT": "notify --x 'a b'"})
    assert (config.metrics_port, config.metrics_addr, config.on_report) == (9464, "127.0.0.1", "notify --x 'a b'")
    assert load_config(None, None, environ={}).metrics_port is None
    for bad in ({"metrics_port": 70000}, {"metrics_port": True}, {"metrics_port": "9464"}, {"on_report": "a 'b"},
                {"on_report": ""}, {"on_report_timeout_s": 0}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            load_config(None, bad, environ={})
    with pytest.raises(ConfigError, match="SCOUT_METRICS_PORT"):
        load_config(None, None, environ={"SCOUT_METRICS_PORT": "many"})


# -- Slurm (OPS-7, OPS-8) ---------------------------------------------------------------------


def test_OPS_7_under_slurm_the_host_is_the_slurm_node_name(tmp_path: Path) -> None:
    assert host_name({"SLURMD_NODENAME": "gpu17"}) == "gpu17"
    assert host_name({}) == socket.gethostname()
    path = tmp_path / "exclude_hosts.txt"
    reports.append_hosts(path, ["gpu17", "gpu3", "gpu17"])
    assert excluded_hosts(path) == ["gpu17", "gpu3"] and excluded_hosts(tmp_path / "none") == []


class ScriptedSlurm:
    """scontrol as a job's state machine: enough to check the order requeue_excluding keeps."""

    def __init__(self, state: str = "FAILED", excluded: str = "(null)", ignore_update: bool = False) -> None:
        self.state, self.excluded, self.held, self.ignore_update = state, excluded, False, ignore_update
        self.calls: list[tuple[str, ...]] = []
        self.began_at = "later"

    def __call__(self, arguments: Sequence[str]) -> str:
        self.calls.append(tuple(arguments))
        verb = arguments[0]
        if verb == "show" and arguments[1] == "job":
            state, self.state = self.state, ("PENDING" if self.state == "COMPLETING" else self.state)
            return f"JobId=42 JobState={state} BatchFlag=1 ExcNodeList={self.excluded} Requeue=1\n"
        if verb == "show" and arguments[1] == "hostnames":
            return "\n".join(arguments[2].split(",")) + "\n"
        if verb == "requeuehold":
            self.state, self.held = "COMPLETING", True
        elif verb == "hold":
            self.held = True
        elif verb == "update":
            fields = dict(a.split("=", 1) for a in arguments[1:])
            if "ExcNodeList" in fields and not self.ignore_update:
                assert self.held and self.state == "PENDING", "ExcNodeList changed while the job could start"
                self.excluded = fields["ExcNodeList"]
            if "StartTime" in fields:
                self.began_at = fields["StartTime"]
        elif verb == "release":
            assert set(excluded_list(self.excluded)) >= {"node2"}, "released before the host was excluded"
            self.held = False
        return ""


def excluded_list(text: str) -> list[str]:
    return [] if text == "(null)" else text.split(",")


def test_OPS_8_requeue_holds_excludes_checks_then_releases() -> None:
    slurm = ScriptedSlurm(excluded="node9")
    result = requeue_excluding("42", ["node2"], run=slurm, sleep=lambda _s: None)
    verbs = [call[0] if call[0] != "update" else "update:" + call[2].split("=")[0] for call in slurm.calls
             if call[:2] != ("show", "hostnames")]
    assert verbs[0:2] == ["show", "requeuehold"]
    assert verbs.index("update:ExcNodeList") < verbs.index("update:StartTime") < verbs.index("release")
    assert (result.excluded, result.added, slurm.held, slurm.began_at) == (("node9", "node2"), ("node2",), False, "now")


def test_OPS_8_a_job_whose_exclusion_does_not_hold_stays_held() -> None:
    slurm = ScriptedSlurm(ignore_update=True)
    with pytest.raises(SlurmError, match=r"without \['node2'\].*scontrol release 42"):
        requeue_excluding("42", ["node2"], run=slurm, sleep=lambda _s: None)
    assert slurm.held and not any(call[0] == "release" for call in slurm.calls)
    stuck = ScriptedSlurm()

    def completing_for_ever(arguments: Sequence[str]) -> str:
        stuck(arguments)
        return "JobId=42 JobState=COMPLETING BatchFlag=1 ExcNodeList=(null)\n" if tuple(arguments[:2]) == ("show", "job") else ""

    clock = iter(range(0, 1000, 10))
    with pytest.raises(SlurmError, match="was not pending"):
        requeue_excluding("42", ["node2"], run=completing_for_ever, timeout_s=30, clock=lambda: float(next(clock)),
                          sleep=lambda _s: None)
    assert stuck.held and not any(call[0] in ("update", "release") for call in stuck.calls)
    for bad_id, bad_hosts in (("42;rm", ["n"]), ("42", ["a,b"])):
        with pytest.raises(SlurmError):
            requeue_excluding(bad_id, bad_hosts, run=ScriptedSlurm())


# -- the alert webhook example ----------------------------------------------------------------


@pytest.fixture
def webhook() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    received: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook", received
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_OPS_4_the_webhook_example_posts_faults_and_ignores_the_rest(webhook: tuple[str, list[dict[str, Any]]]) -> None:
    url, received = webhook
    env = {**os.environ, "ALERT_WEBHOOK_URL": url}
    example = [sys.executable, str(REPO / "examples" / "alert_webhook.py")]
    done = processes.run(example, input=json.dumps(_record()), env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert received == [{"text": "scout: hang rank(s) 2 on h at step 3: behind-majority (job j, attempt 0)"}]
    finished = reports.make_record("finished", source="job", reason="closed", job_id="j", generation=0)
    done = processes.run(example, input=json.dumps(finished), env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and len(received) == 1
    closed = {**env, "ALERT_WEBHOOK_URL": "http://127.0.0.1:9/nothing-listens"}
    done = processes.run(example, input=json.dumps(_record()), env=closed, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "posting the hang report failed" in done.stderr


def test_OPS_10_a_scontrol_that_cannot_start_is_a_slurm_error_and_a_held_job_says_how_to_release_it() -> None:
    from scout.ops.slurm import run_scontrol

    # The kernel refuses one argument over 128 KiB (E2BIG): a SlurmError naming it, no traceback.
    with pytest.raises(SlurmError, match="could not be started: Argument list too long"):
        run_scontrol(["update", "x" * 200_000], scontrol="true")
    slurm = ScriptedSlurm()

    def failing_update(arguments: Sequence[str]) -> str:
        if arguments[0] == "update":
            raise SlurmError("scontrol update ... could not be started: Argument list too long")
        return slurm(arguments)

    with pytest.raises(SlurmError, match=r"could not be started.*job 42 is held; release it by hand with: "
                                         r"scontrol release 42"):
        requeue_excluding("42", ["node2"], run=failing_update, sleep=lambda _s: None)
    assert slurm.held


def test_OPS_10_an_exclude_file_that_cannot_be_used_is_named(tmp_path: Path) -> None:
    from scout.ops.slurm import read_exclude_file

    path = tmp_path / "exclude_hosts.txt"
    with pytest.raises(FileNotFoundError):
        read_exclude_file(path)
    path.write_bytes(b"gpu1\n\xffgpu2\n")
    with pytest.raises(SlurmError, match=r"exclude_hosts.txt is not UTF-8 text \(byte 5"):
        read_exclude_file(path)
    path.unlink()
    path.mkdir()
    with pytest.raises(SlurmError, match="is a directory"):
        read_exclude_file(path)
