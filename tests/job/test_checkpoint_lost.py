"""A chosen checkpoint whose files are gone (spec/recovery.md RECOVERY-7, spec/gate.md GATE-42),
on the example GPT under ``torchrun`` with 4 gloo ranks: the files are removed between two
launches of one job, the way a retention script or an operator's ``rm`` does it. The restart
marks the checkpoint lost, says so once, and starts from the next checkpoint the recovery rules
choose -- or refuses, with ``on_missing_checkpoint = "stop"``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from scout import reports
from scout.gate.dcp import checkpoint_path
from scout.gate.model import CheckpointId

pytestmark = pytest.mark.torchdist

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train_gpt.py"
TORCHRUN = Path(sys.executable).with_name("torchrun")
# Three replicas: the fewest in which one rank is outvoted by a strict majority (2 of 3).
WORLD = 3


def _launch(tmp_path: Path, steps: int, **settings: str) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]:
    """One launch of the job ``lost-job`` (the same job id every time: a restart of it)."""
    # Every setting of the shell left out but the suite's replay cadence (tests/conftest.py).
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("SCOUT_") or key == "SCOUT_REPLAY_INTERVAL_STEPS"}
    env.update({"OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "SCOUT_JOB_ID": "lost-job",
                # A checkpoint every cycle (8 steps): t0/s8 and t0/s16 are verified by step 24.
                "SCOUT_CHECKPOINT_EVERY_CYCLES": "1",
                **{f"SCOUT_{key.upper()}": value for key, value in settings.items()}})
    command = [str(TORCHRUN), "--nproc-per-node", str(WORLD), "--standalone", str(EXAMPLE), "--steps", str(steps),
               "--run-dir", str(tmp_path / "run"), "--checkpoint-dir", str(tmp_path / "ckpt")]
    run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    return run, reports.read_records(tmp_path / "run" / reports.REPORTS_FILE)


def _verified(records: list[dict[str, Any]]) -> list[str]:
    return [r["evidence"]["checkpoint"] for r in records if r["kind"] == "checkpoint" and r["reason"] == "recovery-verified"]


def _restarts(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r["kind"] == "restart"]


def _remove(tmp_path: Path, checkpoint: CheckpointId) -> Path:
    path = checkpoint_path(tmp_path / "ckpt", checkpoint)
    shutil.rmtree(path)
    return path


def test_RECOVERY_7_GATE_42_under_torchrun_a_verified_checkpoint_whose_files_are_gone_is_lost_and_the_older_one_restored(
        tmp_path: Path) -> None:
    first, records = _launch(tmp_path, 25)
    assert first.returncode == 0, first.stderr[-3000:]
    assert _verified(records)[:2] == ["t0/s8", "t0/s16"], _verified(records)
    gone = _remove(tmp_path, CheckpointId(0, 16))

    second, records = _launch(tmp_path, 30)
    assert second.returncode == 0, second.stderr[-3000:]
    (lost,) = [r for r in records if r["kind"] == "checkpoint" and r["reason"] == "lost"]
    assert lost["evidence"]["checkpoint"] == "t0/s16" and lost["evidence"]["before"] == "RECOVERY_VERIFIED"
    assert str(gone) in lost["evidence"]["detail"] and f"rank(s) {list(range(WORLD))}" in lost["evidence"]["detail"]
    restart = _restarts(records)[-1]
    assert (restart["reason"], restart["step"], restart["evidence"]["lost"]) == ("restored", 8, ["t0/s16"]), restart
    output = second.stdout + second.stderr
    assert output.count("checkpoint(s) t0/s16 have no files under checkpoint_dir") == 1, output[-3000:]
    assert "this attempt starts from verified checkpoint t0/s8" in output, output[-3000:]
    finished = [r["step"] for r in records if r["kind"] == "finished"]
    assert finished == [25, 30], finished  # one per launch; the second trained 8 -> 30
    # What an operator reads: the restore, with what was lost on the way, and the checkpoints.
    report = subprocess.run([sys.executable, "-m", "scout.cli", "report", str(tmp_path / "run"), "--no-picture"],
                            capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr[-2000:]
    assert "restored step 8 (verified checkpoint for an uncertain failure; t0/s16 lost: no files)" in report.stdout
    assert "t0/s16 LOST" in report.stdout, report.stdout


@pytest.mark.slow  # two more launches; the unit tests of tests/unit/test_gate.py bound the rules
def test_RECOVERY_7_under_torchrun_stop_refuses_and_fallback_with_nothing_left_starts_afresh(tmp_path: Path) -> None:
    first, records = _launch(tmp_path, 25)
    assert first.returncode == 0, first.stderr[-3000:]
    for name in _verified(records):
        timeline, step = name[1:].split("/s")
        _remove(tmp_path, CheckpointId(int(timeline), int(step)))

    refused, records_after = _launch(tmp_path, 30, on_missing_checkpoint="stop")
    assert refused.returncode != 0
    assert "on_missing_checkpoint=stop" in refused.stderr and "FileNotFoundError" in refused.stderr, refused.stderr[-3000:]
    assert not [r for r in records_after if r["kind"] == "checkpoint" and r["reason"] == "lost"]

    fresh, records = _launch(tmp_path, 30)
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    lost = [r["evidence"]["checkpoint"] for r in records if r["kind"] == "checkpoint" and r["reason"] == "lost"]
    assert lost == ["t0/s16", "t0/s8"], lost
    restart = _restarts(records)[-1]
    assert (restart["reason"], restart["step"], restart["evidence"]["lost"]) == ("started", 0, ["t0/s16", "t0/s8"])
    assert "this attempt starts from initialization (nothing left that the recovery rules allow)" in fresh.stdout + fresh.stderr
