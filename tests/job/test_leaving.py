"""A real 4-rank torchrun job of the example (examples/train_gpt.py) that leaves by an exception
or by Ctrl-C: its observers never read the way out as a stall, rank 0 says the step it reached,
and no progress record stays in /dev/shm (spec/observer.md PROGRESS-11, PROGRESS-12)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from scout import reports
from scout.observer.progress import SHM_DIR, record_name
from scout.reports.summary import load_run

pytestmark = pytest.mark.torchdist

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train_gpt.py"
TORCHRUN = Path(sys.executable).with_name("torchrun")
FAULT_KINDS = {"hang", "data_stall", "checkpoint_stall", "desync", "group_stall", "unresponsive", "inconclusive"}
THRESHOLD_S = 2.0
# Three replicas: the fewest in which one rank is outvoted by a strict majority (2 of 3).
WORLD = 3


def _command(run_dir: Path, steps: int, fault: str = "") -> list[str]:
    return [str(TORCHRUN), "--nproc-per-node", str(WORLD), "--standalone", str(EXAMPLE), "--steps", str(steps),
            "--run-dir", str(run_dir), "--fault", fault]


def _environment(job_id: str) -> dict[str, str]:
    # Every setting of the shell left out but the suite's replay cadence (tests/conftest.py).
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("SCOUT_") or key == "SCOUT_REPLAY_INTERVAL_STEPS"}
    env.update({"OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "SCOUT_JOB_ID": job_id,
                "SCOUT_STALL_THRESHOLD_S": str(THRESHOLD_S), "SCOUT_RECHECK_INTERVAL_S": "1.0",
                "SCOUT_ROUND_DEADLINE_S": "0.5"})
    return env


def _left_in_shm(job_id: str) -> list[str]:
    return [name for rank in range(WORLD) if os.path.exists(os.path.join(SHM_DIR, name := record_name(job_id, 0, rank)))]


def _faults(records: list[dict[str, Any]]) -> list[str]:
    return [reports.record_line(r) for r in records if r["kind"] in FAULT_KINDS]


def test_PROGRESS_11_an_exception_exit_that_takes_seconds_is_no_stall_and_says_its_step(tmp_path: Path) -> None:
    """Every rank raises at step 6 and then takes THRESHOLD_S + 3 s to exit (the example's
    ``raise`` and ``slow-exit`` faults: a slow exit handler); before PROGRESS-11 every observer
    reported the group stuck at one point (group_stall)."""
    job_id, run_dir = f"leaving-{uuid.uuid4().hex[:12]}", tmp_path / "run"
    run = subprocess.run(_command(run_dir, 10, f"raise:-1:6,slow-exit:-1:{THRESHOLD_S + 3}"), cwd=tmp_path,
                         env=_environment(job_id), capture_output=True, text=True, timeout=180)
    assert run.returncode != 0 and "EXAMPLE-FAULT raise" in run.stderr, run.stderr[-3000:]
    records = reports.read_records(run_dir / reports.REPORTS_FILE)
    assert _faults(records) == []
    (finished,) = [r for r in records if r["kind"] == "finished"]
    assert (finished["reason"], finished["step"]) == ("exception", 5), finished
    assert "RuntimeError: EXAMPLE-FAULT raise" in finished["evidence"]["error"]
    assert _left_in_shm(job_id) == []


def test_PROGRESS_12_ctrl_c_to_torchrun_leaves_no_record_and_the_report_reads_the_steps_that_ran(
        tmp_path: Path) -> None:
    job_id, run_dir = f"leaving-{uuid.uuid4().hex[:12]}", tmp_path / "run"
    with subprocess.Popen(_command(run_dir, 100_000), cwd=tmp_path, env=_environment(job_id), text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True) as process:
        try:
            assert process.stdout is not None
            for line in process.stdout:  # rank 0 prints every 10 steps
                if line.startswith("step 10 "):
                    break
            time.sleep(0.5)
            process.send_signal(signal.SIGINT)  # Ctrl-C: torchrun passes it to every worker's group
            _, stderr = process.communicate(timeout=90)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
    assert _left_in_shm(job_id) == [], stderr[-3000:]
    records = reports.read_records(run_dir / reports.REPORTS_FILE)
    assert _faults(records) == []
    (finished,) = [r for r in records if r["kind"] == "finished"]
    assert finished["reason"] == "interrupted" and finished["step"] >= 10, finished
    assert load_run(run_dir).last_step == finished["step"]
