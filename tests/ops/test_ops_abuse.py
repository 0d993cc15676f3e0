"""scout's operator surfaces under abuse (spec/ops.md OPS-4, OPS-9, OPS-11..OPS-15; issue 39):
each test re-runs one attack of the issue against the real thing -- the sidecar and ``scout
serve`` as processes, real HTTP on loopback, a real full file system (a small tmpfs), ``scout
report`` as a command -- and checks that it holds."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scout import reports
from scout.reports.timing import (
    TIMING_FILE,
    TimingLog,
    make_timing_record,
    read_timing,
    timing_arguments,
)
from tests.ops import services

pytestmark = [pytest.mark.processes, pytest.mark.light]

REPO = Path(__file__).resolve().parents[2]
#: How long a test waits for a hook, a count or a log line (each a bounded poll).
WAIT_S = 30.0


def _hang(step: int, rank: int = 5, **extra: Any) -> dict[str, Any]:
    return reports.make_record("hang", source="observer", reason="behind-majority", job_id="ops-abuse",
                               generation=0, ranks=[rank], hosts=["node-a"], step=step, reporter_rank=rank, **extra)


def _peak_rss_mb(pid: int) -> float:
    """The process's peak resident memory (VmHWM), MiB."""
    found = re.search(r"^VmHWM:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.M)
    assert found is not None
    return int(found.group(1)) / 1024


def _threads(pid: int) -> int:
    found = re.search(r"^Threads:\s+(\d+)", Path(f"/proc/{pid}/status").read_text(), re.M)
    assert found is not None
    return int(found.group(1))


def _until(probe: Any, timeout_s: float = WAIT_S, what: str = "") -> Any:
    deadline = time.monotonic() + timeout_s
    while not (found := probe()):
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(0.1)
    return found


# -- the sidecar (OPS-4, OPS-9, OPS-12) --------------------------------------------------------


@pytest.fixture
def trainer(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], dict[str, Any]]]:
    with services.fake_trainer(f"abuse-{tmp_path.name}") as found:
        yield found


def _spec(run_dir: Path, record: dict[str, Any], **settings: Any) -> dict[str, Any]:
    return {"run_dir": str(run_dir), "host": "node-a", "job_id": "ops-abuse", "generation": 0,
            "ranks": [{"rank": 5, "host": "node-a", "record_name": record["name"], "record_token": record["token"],
                       "pid": record["pid"], "start_ticks": record["start_ticks"]}],
            "has_rank_zero": False, "metrics_port": None, "metrics_addr": "127.0.0.1", "on_report": None,
            "on_report_timeout_s": 30.0, "poll_interval_s": 0.1, **settings}


def _hook_writing_to(path: Path) -> str:
    return f"{sys.executable} -c \"import sys; open({str(path)!r}, 'a').write(sys.stdin.read())\""


def _steps_in(path: Path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines()] if path.exists() else []


def test_OPS_4_a_hook_that_prints_300_MB_costs_the_sidecar_no_memory(
        tmp_path: Path, trainer: tuple[subprocess.Popen[str], dict[str, Any]]) -> None:
    # Issue 39, attack 1: a hook printing 400 MB took the sidecar from 10 MB to a 454 MB peak
    # (its whole output read into memory, from an uncapped temporary file).
    process, record = trainer
    run_dir = tmp_path / "run"
    command = "sh -c 'yes scout-hook-output | head -c 300000000; echo END-OF-HOOK-OUTPUT; exit 3'"
    with services.sidecar(_spec(run_dir, record, on_report=command), tmp_path / "sidecar.log") as (sidecar, ready):
        assert ready["ready"] is True
        before_mb = _peak_rss_mb(sidecar.pid)
        reports.append_record(run_dir / reports.REPORTS_FILE, _hang(1))
        log = _until(lambda: "its output ended" in (text := (tmp_path / "sidecar.log").read_text()) and text,
                     60.0, "the hook's failure logged")
        peak_mb = _peak_rss_mb(sidecar.pid)
        # Its output was read to the end (the last line is quoted), and kept as a tail only.
        assert "exited with code 3" in log and "END-OF-HOOK-OUTPUT" in log.splitlines()[-1], log[-600:]
        assert len(log.splitlines()[-1]) < 1000
        assert peak_mb < before_mb + 32, (before_mb, peak_mb)
        process.kill()
        assert sidecar.wait(30) == 0


def test_OPS_9_a_taken_metrics_port_leaves_the_alerts_on(
        tmp_path: Path, trainer: tuple[subprocess.Popen[str], dict[str, Any]],
        caplog: pytest.LogCaptureFixture) -> None:
    # Issue 39, attack 2: a second job on the host with the same metrics_port: "metrics and
    # on_report are off on this node", and its hang ran no hook.
    from scout.ops.launch import _start_sidecar

    process, record = trainer
    run_dir = tmp_path / "run"
    hooked = tmp_path / "hooked.jsonl"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        spec = _spec(run_dir, record, metrics_port=taken.getsockname()[1], on_report=_hook_writing_to(hooked))
        with caplog.at_level(logging.WARNING, logger="scout"):
            sidecar, address = _start_sidecar(spec)
    try:
        assert sidecar is not None, caplog.text
        assert address is None
        assert "metrics are off on this node, on_report still runs" in caplog.text, caplog.text
        reports.append_record(run_dir / reports.REPORTS_FILE, _hang(7))
        assert _until(lambda: _steps_in(hooked), what="the hook ran") == [7]
        process.kill()
        assert sidecar.wait(30) == 0
    finally:
        if sidecar is not None and sidecar.poll() is None:
            sidecar.kill()
            sidecar.wait(10)
        if sidecar is not None:
            for stream in (sidecar.stdin, sidecar.stdout):
                if stream is not None:
                    stream.close()


def test_OPS_12_a_report_of_the_wrong_types_costs_the_sidecar_only_itself(
        tmp_path: Path, trainer: tuple[subprocess.Popen[str], dict[str, Any]]) -> None:
    # Issue 39, attack 10: one record with a non-integer rank left the rest of that read
    # uncounted and unhooked.
    process, record = trainer
    run_dir = tmp_path / "run"
    hooked = tmp_path / "hooked.jsonl"
    spec = _spec(run_dir, record, metrics_port=0, on_report=_hook_writing_to(hooked))
    with services.sidecar(spec, tmp_path / "sidecar.log") as (sidecar, ready):
        forged = {**_hang(2), "ranks": ["five"]}
        lines = [_hang(1), forged, {**_hang(3), "step": "3"}, _hang(4)]
        run_dir.mkdir(parents=True, exist_ok=True)
        with (run_dir / reports.REPORTS_FILE).open("a") as file:  # one write: one read of the sidecar
            file.write("".join(json.dumps(line) + "\n" for line in lines))
        url = "http://{}:{}/metrics".format(*ready["metrics_address"])
        assert _until(lambda: sorted(_steps_in(hooked)) == [1, 4], what="the hooks of the good reports")
        with urllib.request.urlopen(url, timeout=10) as answer:
            text = answer.read().decode()
        assert re.search(r'^scout_reports_total\{kind="hang",reason="behind-majority"\} 2\.0$', text, re.M), text
        process.kill()
        assert sidecar.wait(30) == 0


# -- scout serve (OPS-12, OPS-14, OPS-15) ------------------------------------------------------


def _raw_get(port: int, host_header: str | None, path: str = "/api/state?since=0") -> tuple[int, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        head = f"GET {path} HTTP/1.1\r\n" + (f"Host: {host_header}\r\n" if host_header is not None else "")
        connection.sendall((head + "Connection: close\r\n\r\n").encode())
        data = b""
        while chunk := connection.recv(65536):
            data += chunk
    status = int(data.split(b" ", 2)[1])
    return status, data.split(b"\r\n\r\n", 1)[1]


def _port(url: str) -> int:
    return int(url.rstrip("/").rsplit(":", 1)[1])


def test_OPS_14_scout_serve_answers_only_requests_for_its_own_address(tmp_path: Path) -> None:
    # Issue 39, attack 4: "Host: attacker.example" got 200 and the whole state, so a page whose
    # name rebinds to 127.0.0.1 could read the run.
    run_dir = tmp_path / "run"
    reports.append_record(run_dir / reports.REPORTS_FILE, _hang(3))
    with services.serve(run_dir) as (url, _pid):
        port = _port(url)
        for rebound in (f"attacker.example:{port}", "attacker.example", f"127.0.0.1.nip.io:{port}", ""):
            status, body = _raw_get(port, rebound)
            assert status == 421 and b"behind-majority" not in body, (rebound, status, body[:200])
        assert _raw_get(port, None)[0] == 421  # no Host at all: not a browser's request for this page
        for own in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost:9000", "LOCALHOST"):  # 9000: an ssh -L port
            status, body = _raw_get(port, own)
            assert status == 200 and json.loads(body)["reports"][0]["step"] == 3, (own, status)


def test_OPS_14_allow_host_adds_a_name(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with services.serve(run_dir, "--allow-host", "head.cluster.example") as (url, _pid):
        port = _port(url)
        assert _raw_get(port, f"head.cluster.example:{port}", "/")[0] == 200
        assert _raw_get(port, "other.example", "/")[0] == 421


def _long_reports_file(path: Path, lines: int) -> None:
    """``lines`` straggler reports, written fast (one template, the step varied)."""
    template = json.dumps(reports.make_record(
        "straggler", source="replay", reason="device-slow", job_id="ops-abuse", generation=0, ranks=[3],
        hosts=["node-b"], step=999_999_999, reporter_rank=0,
        evidence={"performance_ratio": 1.5, "peers": [{"rank": r, "time_ms": 10.0 + r} for r in range(8)]}),
        sort_keys=True)
    head, tail = template.split("999999999")
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as file:
        for start in range(0, lines, 10_000):
            file.write("".join(f"{head}{step}{tail}\n" for step in range(start, min(lines, start + 10_000))))


def test_OPS_15_scout_serve_reads_a_long_reports_file_from_its_end_and_says_what_its_counts_cover(
        tmp_path: Path) -> None:
    # Issue 39, attack 5: 100k lines were all parsed under the request lock (474 MB peak, 12.8 s
    # to the first answer) before the newest 20k were kept, and the counts did not say so.
    from scout.ops.web import RECORDS_KEPT

    run_dir = tmp_path / "run"
    lines = 100_000
    _long_reports_file(run_dir / reports.REPORTS_FILE, lines)
    with services.serve(run_dir) as (url, pid):
        started = time.monotonic()
        with urllib.request.urlopen(url + "api/state?since=0", timeout=60) as answer:
            first = json.loads(answer.read())
        first_answer_s = time.monotonic() - started
        assert (first["kept_from"], first["total"], first["records_kept"]) == (lines - RECORDS_KEPT, lines, RECORDS_KEPT)
        assert first["since"] == lines - RECORDS_KEPT and first["reports"][0]["step"] == lines - RECORDS_KEPT
        # Polled to the end, the page gets the newest RECORDS_KEPT, the last one last.
        answer_json = first
        while answer_json["next"] < answer_json["total"]:
            with urllib.request.urlopen(url + f"api/state?since={answer_json['next']}", timeout=60) as answer:
                answer_json = json.loads(answer.read())
        assert answer_json["reports"][-1]["step"] == lines - 1 and answer_json["next"] == lines
        peak_mb = _peak_rss_mb(pid)
    print(f"scout serve, {lines} lines: first answer {first_answer_s:.2f} s, peak {peak_mb:.0f} MiB")
    # Bounded by what it keeps, not by the file: a fifth of the file parsed and held.
    assert peak_mb < 300, peak_mb
    assert first_answer_s < 20, first_answer_s


def test_OPS_15_scout_serve_bounds_its_connections_and_their_reads(tmp_path: Path) -> None:
    # Issue 39, attack 7: 2000 idle connections were 2001 threads, a half-sent request was still
    # open after 75 s, and the listen backlog was 5.
    from scout.ops.web import CONNECTIONS_MAX, LISTEN_BACKLOG

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with services.serve(run_dir, "--read-timeout-s", "2") as (url, pid):
        port = _port(url)
        if shutil.which("ss"):
            listening = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True,
                                       timeout=10).stdout.split()
            assert listening and int(listening[2]) == LISTEN_BACKLOG, listening
        half = socket.create_connection(("127.0.0.1", port), timeout=10)
        half.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # and never the blank line
        idle = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(3 * CONNECTIONS_MAX)]
        try:
            time.sleep(0.5)
            assert _threads(pid) <= CONNECTIONS_MAX + 4, _threads(pid)
            # Every connection ends by the server: past the cap at once with a 503, the others
            # (and the half-sent request) when the read timeout (2 s) ran out -- none left open.
            answers: list[bytes] = []
            for connection in [half, *idle]:
                connection.settimeout(10)
                try:
                    answers.append(connection.recv(64))
                except ConnectionResetError:
                    answers.append(b"reset")
            busy = sum(answer.startswith(b"HTTP/1.0 503") for answer in answers)
            assert busy >= CONNECTIONS_MAX and all(a == b"" or a == b"reset" or a.startswith(b"HTTP/1.0 503")
                                                   for a in answers), answers[:5]
            assert answers[0] in (b"", b"reset"), answers[0]  # the half-sent request: closed, never answered
            # Then the page answers again, and the threads of those connections are gone.
            assert _raw_get(port, f"127.0.0.1:{port}", "/")[0] == 200
            assert _until(lambda: _threads(pid) <= 3, 10.0, "the connection threads ended")
        finally:
            half.close()
            for connection in idle:
                connection.close()


def _odd_evidence_run(run_dir: Path) -> None:
    """A run whose reports pass the schema's types but whose evidence holds other types than
    each kind writes; and, before them, schema-tagged lines of the wrong types."""
    path = run_dir / reports.REPORTS_FILE
    started = reports.make_record("restart", source="job", reason="started", job_id="ops-abuse", generation=0,
                                  step=0, evidence={"hosts": ["node-a"], "lost": 5})
    reports.append_record(path, started)
    with path.open("a") as file:
        for forged in ({**_hang(2), "ranks": "2"}, {**_hang(2), "reason": 7}, {**_hang(2), "evidence": []},
                       {**_hang(2), "step": -4}, {**_hang(2), "generation": "0"}, {**_hang(2), "hosts": [None]}):
            file.write(json.dumps(forged) + "\n")
    reports.append_record(path, _hang(4, rank=1, evidence={"peers": 5, "world_size": "many", "idle_s": "long"}))
    reports.append_record(path, reports.make_record(
        "group_stall", source="observer", reason="group-stuck", job_id="ops-abuse", generation=0, step=5,
        reporter_rank=0, evidence={"group_ranks": "0,1,2", "peers": [7, {"rank": "x"}]}))


def test_OPS_12_scout_report_skips_lines_of_the_wrong_types_and_exits_as_documented(tmp_path: Path) -> None:
    # Issue 39, attack 9: a schema-tagged record with wrong types gave a traceback and exit 1,
    # which scout report documents as "faults reported".
    run_dir = tmp_path / "run"
    _odd_evidence_run(run_dir)
    done = subprocess.run([sys.executable, "-m", "scout.cli", "report", str(run_dir), "--picture",
                           str(tmp_path / "picture.png")], capture_output=True, text=True, timeout=120)
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.returncode == 1, done.stderr[-2000:]  # the hang and the group stall are faults
    assert "6 line(s) of reports.jsonl skipped" in done.stdout, done.stdout
    assert re.search(r"^hang +\[1\]", done.stdout, re.M) and (tmp_path / "picture.png").stat().st_size > 0

    # Only forged lines and a clean start and end: no fault, and exit 3 (not 0, not 1) because
    # lines could not be read.
    quiet = tmp_path / "quiet"
    path = quiet / reports.REPORTS_FILE
    reports.append_record(path, reports.make_record("restart", source="job", reason="started", job_id="j",
                                                    generation=0, step=0))
    with path.open("a") as file:
        file.write(json.dumps({**_hang(2), "ranks": [1.5]}) + "\n")
    reports.append_record(path, reports.make_record("finished", source="job", reason="closed", job_id="j",
                                                    generation=0, step=9))
    done = subprocess.run([sys.executable, "-m", "scout.cli", "report", str(quiet), "--no-picture", "--json"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, (done.returncode, done.stderr[-2000:])
    summary = json.loads(done.stdout)
    assert (summary["skipped_lines"], summary["faults"], summary["unclean_attempts"]) == (1, [], [])


def test_OPS_12_the_live_page_keeps_drawing_after_a_report_it_cannot_draw(tmp_path: Path) -> None:
    # Issue 39, attack 9: the page stopped drawing for every later poll after one such record.
    reason = services.missing_browser()
    if reason:
        pytest.skip(reason)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with services.page_server(run_dir) as url, services.browser() as driver:
        driver.get(url)
        _until(lambda: "no fault reported" in driver.find_element("id", "counts").text, what="the page's first poll")
        _odd_evidence_run(run_dir)
        reports.append_record(run_dir / reports.REPORTS_FILE, _hang(9, rank=2))
        # The hang after the odd ones is drawn on the timeline, and the page says what it skipped.
        _until(lambda: driver.find_elements("css selector", "#timeline circle[data-kind=hang]"),
               what="the hangs drawn on the timeline")
        circles = driver.find_elements("css selector", "#timeline circle[data-kind=hang]")
        assert len(circles) == 2, len(circles)  # rank 1 at step 4 and rank 2 at step 9
        assert _until(lambda: "6 line(s) of reports.jsonl skipped" in driver.find_element("id", "coverage").text,
                      what="the skipped lines said")
        assert "hang 2" in driver.find_element("id", "counts").text
        assert "cannot reach" not in driver.find_element("id", "status").text


# -- the files (OPS-11, OPS-13) ---------------------------------------------------------------


def test_OPS_11_a_report_appended_after_a_torn_line_is_kept(tmp_path: Path) -> None:
    # Issue 39, attack 8: a record appended right after a crash-torn line was glued to it and lost.
    path = tmp_path / reports.REPORTS_FILE
    reports.append_record(path, _hang(1))
    torn = json.dumps(_hang(2))[:57]
    with path.open("a") as file:  # what a writer killed mid-line (or a full disk) leaves
        file.write(torn)
    reports.append_record(path, _hang(3))
    found = reports.read_reports(path)
    assert ([r["step"] for r in found.records], found.skipped) == ([1, 3], 1)
    assert path.read_text().splitlines()[1] == torn

    timing = tmp_path / TIMING_FILE
    log = TimingLog(timing)

    def line(step: int) -> dict[str, Any]:
        return make_timing_record(timing_arguments(
            "loop", step=step, group="dp", ranks=[0, 1], times_ms=[1.0, 1.1], evidence=[0.0, 0.1], confirmed=[],
            status="AGREE", reason=None, slow_ratio=1.5), job_id="j", generation=0, reporter_rank=0)

    assert log.write(line(10))
    with timing.open("a") as file:
        file.write(json.dumps(line(20))[:40])
    assert TimingLog(timing).write(line(30))
    reading = read_timing(timing)
    assert ([r["step"] for r in reading.records], reading.skipped) == ([10, 30], 1)


@pytest.fixture
def full_disk() -> Iterator[Path]:
    """A 256 KiB tmpfs: a real file system that fills up (ENOSPC). Needs root (mount)."""
    folder = Path(tempfile.mkdtemp(prefix="scout-full-"))
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(folder)], capture_output=True,
                          text=True, timeout=30) if shutil.which("mount") and os.geteuid() == 0 else None
    if done is None or done.returncode != 0:
        folder.rmdir()
        pytest.skip("cannot mount a small tmpfs here (needs root): " + (done.stderr.strip() if done else "not root"))
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True, timeout=30, check=False)
        with contextlib.suppress(OSError):
            folder.rmdir()


def _fill(folder: Path) -> None:
    with contextlib.suppress(OSError), (folder / "filler").open("wb") as file:
        while True:
            file.write(b"x" * 4096)
            file.flush()


def test_OPS_13_a_full_run_dir_is_named_and_scout_report_shows_the_attempt_did_not_end(
        tmp_path: Path, full_disk: Path) -> None:
    # Issue 39, attack 6: a full run_dir stopped the job with a raw "OSError: [Errno 28]" from
    # the manifest commit, no path named; scout report then said "no fault reported", exit 0.
    from scout.gate.model import CycleBoundary, GateConfig
    from scout.gate.recorder import GateWriter

    run_dir = full_disk / "run"
    reports.append_record(run_dir / reports.REPORTS_FILE, reports.make_record(
        "restart", source="job", reason="started", job_id="run", generation=0, step=0))
    writer = GateWriter.open(run_dir / "gate", GateConfig("run", ("hidden.0",), ("dp",)))
    with writer:
        _fill(full_disk)
        with pytest.raises(OSError) as raised:
            for boundary in range(1, 10_000):
                writer.apply(CycleBoundary(boundary * 8))
        text = str(raised.value)
        assert raised.value.errno == 28 and str(run_dir / "gate") in text and "is full" in text, text
    with pytest.raises(OSError) as raised:  # larger than a page: it cannot fit in what is left
        reports.append_record(run_dir / reports.REPORTS_FILE, _hang(3, evidence={"detail": "x" * 6000}))
    assert raised.value.errno == 28 and str(run_dir / reports.REPORTS_FILE) in str(raised.value), str(raised.value)
    with pytest.raises(OSError) as raised:
        reports.append_hosts(run_dir / "exclude_hosts.txt", ["node-a"])
    assert str(run_dir / "exclude_hosts.txt") in str(raised.value), str(raised.value)

    done = subprocess.run([sys.executable, "-m", "scout.cli", "report", str(run_dir), "--no-picture"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, (done.returncode, done.stdout, done.stderr[-2000:])
    assert "no fault reported, but the run did not end cleanly" in done.stdout, done.stdout
    assert "attempt 0 did not end cleanly: no finished report" in done.stdout, done.stdout


def test_OPS_13_scout_report_shows_an_attempt_that_ended_with_an_exception(tmp_path: Path) -> None:
    path = tmp_path / reports.REPORTS_FILE
    for kind, reason, step, evidence in (("restart", "started", 0, {}),
                                         ("finished", "exception", 41, {"error": "OSError: [Errno 28] No space left"})):
        reports.append_record(path, reports.make_record(kind, source="job", reason=reason, job_id="j", generation=0,
                                                        step=step, evidence=evidence))
    done = subprocess.run([sys.executable, "-m", "scout.cli", "report", str(tmp_path), "--no-picture"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stdout
    assert "attempt 0 ended by exception at step 41: OSError: [Errno 28] No space left" in done.stdout, done.stdout


@pytest.mark.slow  # a 4-rank torchrun job (about a minute); the tmpfs test above bounds each writer
@pytest.mark.torchdist
def test_OPS_13_under_torchrun_a_run_dir_that_fills_up_names_itself_and_scout_report_says_so(
        tmp_path: Path, full_disk: Path) -> None:
    # Issue 39, attack 6, on a real job: its run_dir fills up mid-run (a 256 KiB tmpfs, filled by
    # this test once the job trains). Whatever the job then does -- stops, or trains on if its
    # exception boundary keeps it going -- no "No space left on device" may go without the path,
    # and scout report must not say "no fault reported" with exit 0.
    subprocess.run(["umount", "-l", str(full_disk)], capture_output=True, timeout=30, check=False)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(full_disk)], capture_output=True,
                             text=True, timeout=30)
    assert mounted.returncode == 0, mounted.stderr
    run_dir = full_disk / "run"
    env = {key: value for key, value in os.environ.items() if not key.startswith("SCOUT_")}
    env.update(OMP_NUM_THREADS="1", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", SCOUT_CHECKPOINT_EVERY_CYCLES="1")
    command = [str(Path(sys.executable).with_name("torchrun")), "--nproc-per-node", "4", "--standalone",
               str(REPO / "examples" / "train_gpt.py"), "--steps", "60", "--run-dir", str(run_dir),
               "--checkpoint-dir", str(tmp_path / "ckpt")]
    with subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as job:
        try:
            assert job.stdout is not None
            for line in job.stdout:  # rank 0 prints every 10 steps
                if line.startswith("step 10 "):
                    break
            _fill(full_disk)
            stdout, stderr = job.communicate(timeout=240)
        finally:
            if job.poll() is None:
                os.killpg(job.pid, 9)
                job.wait(10)
    output = stdout + stderr
    for line in output.splitlines():
        if "No space left on device" in line or "Errno 28" in line:
            assert str(full_disk) in line, f"a full disk without its path: {line}"
    assert job.returncode == 0 or str(run_dir) in stderr, stderr[-3000:]
    done = subprocess.run([sys.executable, "-m", "scout.cli", "report", str(run_dir), "--no-picture"],
                          capture_output=True, text=True, timeout=120)
    print(f"job exit {job.returncode}; scout report exit {done.returncode}:\n{done.stdout}")
    if job.returncode != 0:
        assert done.returncode == 3, (done.returncode, done.stdout, done.stderr[-2000:])
        assert "did not end cleanly" in done.stdout or "ended by exception" in done.stdout, done.stdout
