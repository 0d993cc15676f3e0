"""``scout demo``: the real 4-rank CPU job with an injected hang names the rank, within its hard
bound, and leaves no process and no shared-memory record behind; ``--verdicts`` keeps the worked
examples table."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEMO_BOUND_S = 120.0


def _session_processes(session: int) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if int(fields[3]) == session and fields[0] != "Z":  # field 6 of stat: the session id
            found.append(entry.name)
    return found


def _scout(*args: str, timeout_s: float) -> tuple[subprocess.CompletedProcess[str], int]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen([sys.executable, "-m", "scout.cli", *args], cwd=REPO, env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate(timeout=10)
        pytest.fail(f"scout {' '.join(args)} ran past {timeout_s} s:\n{out[-3000:]}\n{err[-3000:]}")
    return subprocess.CompletedProcess(process.args, process.returncode, out, err), process.pid


@pytest.mark.torchdist
def test_demo_runs_a_real_job_names_the_hung_rank_and_cleans_up() -> None:
    pytest.importorskip("torch")
    shm_before = set(os.listdir("/dev/shm"))
    started = time.monotonic()
    completed, session = _scout("demo", "--phase", "hang", "--json", timeout_s=DEMO_BOUND_S)
    wall_s = time.monotonic() - started
    assert completed.returncode == 0, completed.stdout + completed.stderr
    result = json.loads(completed.stdout)
    report = result["report"]
    assert (report["kind"], report["evidence"]["finding"], report["ranks"]) == ("hang", "behind", [2])
    assert report["reporter_rank"] != 2
    assert abs(result["detection_latency_s"]) <= 1.0
    assert wall_s < 60.0
    deadline = time.monotonic() + 5.0
    while _session_processes(session) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _session_processes(session) == []
    new_segments = [name for name in set(os.listdir("/dev/shm")) - shm_before if name.startswith("scout")]
    assert new_segments == []


@pytest.mark.torchdist
def test_full_demo_localizes_hang_sdc_and_straggler_and_certifies_a_checkpoint() -> None:
    """The README's main job: every injected fault localized, the SDC-era candidate not used."""
    pytest.importorskip("torch")
    completed, session = _scout("demo", "--json", timeout_s=2 * DEMO_BOUND_S)
    assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-4000:]
    result = json.loads(completed.stdout)
    assert result["ok"] and result["hang_ok"]
    assert result["hang_report"]["ranks"] == [2]
    assert result["sdc_attributed"] == [[2]]
    assert result["stragglers_confirmed"] == [1]
    recovery = result["recovery"]
    assert recovery["choice"] == "verified", recovery
    deadline = time.monotonic() + 5.0
    while _session_processes(session) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _session_processes(session) == []


def test_demo_verdicts_prints_the_worked_examples() -> None:
    completed, _ = _scout("demo", "--verdicts", timeout_s=60.0)
    assert completed.returncode == 0, completed.stderr
    assert "verdicts match the spec's worked examples" in completed.stdout
