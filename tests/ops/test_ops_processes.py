"""The sidecar as a real process beside a real progress record (spec/ops.md OPS-1, OPS-2,
OPS-5), and the page server over real HTTP on loopback (OPS-6)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scout import reports
from scout.core.recipes import RecipeId, RecipeResult
from scout.core.verdict import Status
from scout.gate.model import CheckpointCaptured, CycleBoundary, GateConfig
from scout.gate.recorder import GateWriter
from scout.gate.results import recipe_verdicts
from scout.ops import paths, web
from scout.ops.web import CONTENT_SECURITY_POLICY, RunPage, make_server

pytestmark = pytest.mark.processes

pytest.importorskip("prometheus_client", reason="the metrics extra (prometheus_client) is not installed")

TRAINER = textwrap.dedent("""
    import json, sys, time
    from scout.observer.progress import ProgressPublisher, RecordIdentity, process_start_ticks
    import os
    publisher = ProgressPublisher(RecordIdentity("ops-test-" + sys.argv[1], 0, 5))
    publisher.begin_step(12)
    print(json.dumps({"name": publisher.name, "token": publisher.token.hex(), "pid": os.getpid(),
                      "start_ticks": process_start_ticks(os.getpid()) or 0}), flush=True)
    for _ in range(1200):   # at most a minute; the test stops or kills it long before
        publisher.advance()
        time.sleep(0.05)
""")


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return answer.read().decode()


def _sample(text: str, name: str, **labels: str) -> float | None:
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    pattern = re.escape(name) + (r"\{" + re.escape(wanted) + r"\}" if labels else "") + r" (\S+)"
    found = re.search(r"^" + pattern + "$", text, re.M)
    return float(found.group(1)) if found else None


@pytest.fixture
def trainer(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], dict[str, Any]]]:
    process = subprocess.Popen([sys.executable, "-c", TRAINER, tmp_path.name], stdout=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        assert process.stdout is not None
        yield process, json.loads(process.stdout.readline())
    finally:
        process.send_signal(signal.SIGCONT)
        process.kill()
        process.wait(10)


def test_OPS_1_OPS_2_OPS_5_a_frozen_trainer_does_not_freeze_the_metrics(
        tmp_path: Path, trainer: tuple[subprocess.Popen[str], dict[str, Any]]) -> None:
    process, record = trainer
    run_dir = tmp_path / "run"
    hooks_out = tmp_path / "hooks.jsonl"
    spec = {"run_dir": str(run_dir), "host": "node-a", "job_id": "ops-test", "generation": 0,
            "ranks": [{"rank": 5, "host": "node-a", "record_name": record["name"], "record_token": record["token"],
                       "pid": record["pid"], "start_ticks": record["start_ticks"]}],
            "has_rank_zero": False, "metrics_port": 0, "metrics_addr": "127.0.0.1",
            "on_report": f"{sys.executable} -c \"import sys; open({str(hooks_out)!r}, 'a').write(sys.stdin.read())\"",
            "on_report_timeout_s": 10.0, "poll_interval_s": 0.25}
    sidecar = subprocess.Popen([sys.executable, "-m", "scout.ops.sidecar"], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert sidecar.stdin is not None and sidecar.stdout is not None
        sidecar.stdin.write(json.dumps(spec) + "\n")
        sidecar.stdin.flush()
        ready = json.loads(sidecar.stdout.readline())
        assert ready["ready"] is True
        url = "http://{}:{}/metrics".format(*ready["metrics_address"])
        text = _get(url)
        assert _sample(text, "scout_progress_step", rank="5") == 12
        assert _sample(text, "scout_trainer_up", rank="5") == 1
        assert _sample(text, "scout_progress_age_seconds", rank="5") < 1.0

        process.send_signal(signal.SIGSTOP)  # OPS-1: frozen, and still a process
        time.sleep(1.5)
        text = _get(url)
        first = _sample(text, "scout_progress_age_seconds", rank="5")
        time.sleep(1.0)
        second = _sample(_get(url), "scout_progress_age_seconds", rank="5")
        assert first is not None and second is not None and first >= 1.0 and second >= first + 0.8, (first, second)

        # OPS-5: a report appended before a scrape is in that scrape; OPS-3: this node counts it
        # (its reporter is one of the node's ranks), and its hook runs (OPS-4).
        hang = reports.make_record("hang", source="observer", reason="behind-majority", job_id="ops-test",
                                   generation=0, ranks=[5], hosts=["node-a"], step=12, reporter_rank=5)
        reports.append_record(run_dir / reports.REPORTS_FILE, hang)
        text = _get(url)
        assert _sample(text, "scout_reports_total", kind="hang", reason="behind-majority") == 1
        assert _sample(text, "scout_rank_reports_total", host="node-a", kind="hang", rank="5") == 1
        node = paths.read_state(paths.node_status_path(run_dir, "node-a", 5))
        assert node is not None and node["ranks"]["5"]["step"] == 12 and node["metrics_address"] == ready["metrics_address"]

        process.send_signal(signal.SIGCONT)
        process.kill()  # OPS-2: the node's only trainer is gone
        gone = time.monotonic()
        assert sidecar.wait(15) == 0
        assert time.monotonic() - gone < 5.0
        assert [json.loads(line)["kind"] for line in hooks_out.read_text().splitlines()] == ["hang"]
    finally:
        if sidecar.poll() is None:
            sidecar.kill()
            sidecar.wait(10)


def test_OPS_9_a_sidecar_that_cannot_serve_metrics_says_why_and_runs_on(
        tmp_path: Path, trainer: tuple[subprocess.Popen[str], dict[str, Any]]) -> None:
    process, record = trainer
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        spec = {"run_dir": str(tmp_path), "host": "h", "job_id": "j", "generation": 0,
                "ranks": [{"rank": 0, "record_name": record["name"], "record_token": record["token"],
                           "pid": record["pid"], "start_ticks": record["start_ticks"]}],
                "metrics_port": taken.getsockname()[1], "metrics_addr": "127.0.0.1", "on_report": None,
                "on_report_timeout_s": 10.0}
        sidecar = subprocess.Popen([sys.executable, "-m", "scout.ops.sidecar"], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            assert sidecar.stdin is not None and sidecar.stdout is not None
            sidecar.stdin.write(json.dumps(spec) + "\n")
            sidecar.stdin.flush()
            ready = json.loads(sidecar.stdout.readline())
            # OPS-9: only the metrics are off; the sidecar runs on (its node file, its hooks).
            assert ready["ready"] is True and ready["metrics_address"] is None
            assert "cannot serve metrics" in ready["metrics_error"] and "in use" in ready["metrics_error"]
            assert _eventually_file(paths.node_status_path(tmp_path, "h", 0))
            process.kill()
            _out, err = sidecar.communicate(timeout=30)
            assert sidecar.returncode == 0 and "metrics are off on this node" in err, err
        finally:
            if sidecar.poll() is None:
                sidecar.kill()
                sidecar.communicate(timeout=10)


def _eventually_file(path: Path, timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


# -- the page server (OPS-6) ------------------------------------------------------------------


def _gate_with_a_verified_checkpoint(run_dir: Path) -> None:
    """Checkpoints at steps 8 and 16 after clean cycles: t0/s8 recovery-verified, t0/s16 candidate."""
    config = GateConfig("run", ("hidden.0",), ("dp",))
    agree = RecipeResult(RecipeId.parse("hidden.0"), 0, Status.AGREE)
    with GateWriter.open(run_dir / "gate", config) as writer:
        writer.apply(CycleBoundary(0))
        for boundary in (8, 16):
            writer.apply(recipe_verdicts(config, "hidden.0", writer.state.context.cycle, boundary, {"dp": agree}))
            writer.apply(CycleBoundary(boundary))
            writer.apply(CheckpointCaptured(boundary))


def test_OPS_6_the_page_is_read_only_self_contained_and_incremental(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    _gate_with_a_verified_checkpoint(run_dir)
    path = run_dir / reports.REPORTS_FILE
    for step in (1, 2):
        reports.append_record(path, reports.make_record("straggler", source="replay", reason="device-slow",
                                                        job_id="j", generation=0, ranks=[3], step=step,
                                                        reporter_rank=0))
    server = make_server(run_dir, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with urllib.request.urlopen(base + "/", timeout=10) as answer:
            page = answer.read().decode()
            assert answer.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
        # No external asset: nothing is loaded from a URL (the SVG namespace is a name, not a load).
        assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.I)
        assert not re.search(r"@import|url\(", page)
        assert "default-src 'none'" in CONTENT_SECURITY_POLICY
        state = json.loads(_get(base + "/api/state?since=0"))
        assert [r["step"] for r in state["reports"]] == [1, 2] and state["next"] == 2
        trust = {c["checkpoint"]: (c["trust"], c["certificate"] is not None) for c in state["checkpoints"]}
        assert trust == {"t0/s8": ("RECOVERY_VERIFIED", True), "t0/s16": ("CANDIDATE", False)}
        certificate = state["checkpoints"][0]["certificate"]
        assert (certificate["checkpoint"], certificate["catalog"]) == ({"timeline": 0, "step": 8}, ["hidden.0"])
        reports.append_record(path, reports.make_record("hang", source="observer", reason="behind-majority",
                                                        job_id="j", generation=0, ranks=[2], step=9, reporter_rank=1))
        state = json.loads(_get(base + f"/api/state?since={state['next']}"))
        assert [r["kind"] for r in state["reports"]] == ["hang"] and state["next"] == 3
        for method in ("POST", "PUT", "DELETE"):
            request = urllib.request.Request(base + "/api/state", data=b"{}", method=method)
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=10)
            assert refused.value.code == 405
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(base + "/../reports.jsonl", timeout=10)
        assert missing.value.code == 404
        with pytest.raises(urllib.error.HTTPError) as bad:
            urllib.request.urlopen(base + "/api/state?since=x", timeout=10)
        assert bad.value.code == 400
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    with pytest.raises(FileNotFoundError):
        make_server(tmp_path / "nothing", "127.0.0.1", 0)


def test_OPS_6_a_gate_file_gone_between_listing_and_reading_is_skipped(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # The race CI met: the page listed the gate while the job's manifest writer renamed its
    # temporary file into place; the stat of the listed name failed and the answer was empty.
    run_dir = tmp_path / "run"
    _gate_with_a_verified_checkpoint(run_dir)
    temporary = run_dir / "gate" / ".manifest.head.28505.tmp"
    temporary.write_bytes(b"being written")
    listed = web.os.scandir

    def listing_then_rename(path: Any) -> Iterator[Any]:
        entries = list(listed(path))
        temporary.unlink(missing_ok=True)  # gone after the listing, before the stat
        return iter(entries)

    monkeypatch.setattr(web.os, "scandir", listing_then_rename)
    state = RunPage(run_dir).state(0)
    assert not temporary.exists()
    assert {c["checkpoint"]: c["trust"] for c in state["checkpoints"]} == {
        "t0/s8": "RECOVERY_VERIFIED", "t0/s16": "CANDIDATE"}
    assert state["manifest_problem"] is None
