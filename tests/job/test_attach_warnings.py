"""What `scout.attach` tells a user on the console about a set-up that cannot verify a checkpoint
(issue 24's newcomer got no word): real gloo ranks (tests/job/warnings_job.py) attaching scout,
their standard error read as a user would read it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests import processes

pytestmark = pytest.mark.processes

REPO = Path(__file__).resolve().parents[2]


def _stderr(tmp_path: Path, case: str) -> str:
    out = tmp_path / "ranks.json"
    completed = processes.run_forked(
        "tests.replay._launch:main", ["tests.job.warnings_job:main", "2", json.dumps({"case": case}), str(out)],
        cwd=REPO, env=dict(os.environ, OMP_NUM_THREADS="1", SCOUT_TEST_RANK_DEADLINE_S="120"), timeout=180)
    assert completed.returncode == 0, completed.stderr[-3000:]
    report = json.loads(out.read_text())
    assert [entry["status"] for entry in report["ranks"].values()] == ["ok", "ok"], report
    return completed.stderr


def test_CAP_9_REC_8_attach_warns_once_about_batchnorm_and_says_what_to_do(tmp_path: Path) -> None:
    stderr = _stderr(tmp_path, "batchnorm")
    warned = [line for line in stderr.splitlines() if "keep running statistics" in line]
    assert len(warned) == 1, stderr[-3000:]  # rank 0 only
    assert "hidden.0.norm, hidden.1.norm, hidden.2.norm" in warned[0]
    assert "SyncBatchNorm.convert_sync_batchnorm(model)" in warned[0] and "LayerNorm, GroupNorm" in warned[0]
    assert len([line for line in stderr.splitlines() if "scout: replay cycle 6 steps" in line]) == 1


def test_GATE_1_REC_8_attach_warns_that_replay_groups_of_one_can_never_verify_a_checkpoint(tmp_path: Path) -> None:
    stderr = _stderr(tmp_path, "singleton")
    warned = [line for line in stderr.splitlines() if "no checkpoint can ever become recovery-verified" in line]
    assert warned and all("the replay peer group has one member" in line for line in warned), stderr[-3000:]
