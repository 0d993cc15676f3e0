"""A failed checkpoint save is a ``checkpoint`` report ``save-failed`` with the path and the
error, and ``on_checkpoint_error`` decides alike on every rank (spec/gate.md GATE-40): a real
4-rank torchrun job of the example with its checkpoint directory on a small file system this
test mounts (tmpfs; root only) -- too small for the state, or turned read-only mid-run."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scout import reports
from scout.job.config import ConfigError, load_config
from scout.reports.kinds import ReportKind, Source

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train_gpt.py"
TORCHRUN = Path(sys.executable).with_name("torchrun")
OBSERVER_KINDS = {kind.value for kind in ReportKind if kind.source is Source.OBSERVER}


def test_GATE_40_on_checkpoint_error_is_stop_or_continue() -> None:
    assert load_config(None, {}).on_checkpoint_error == "stop"
    assert load_config(None, {"on_checkpoint_error": "continue"}).on_checkpoint_error == "continue"
    with pytest.raises(ConfigError, match="on_checkpoint_error"):
        load_config(None, {"on_checkpoint_error": "ignore"})


@contextlib.contextmanager
def _small_filesystem(path: Path, size: str) -> Iterator[Path]:
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                             capture_output=True, text=True, timeout=30)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small file system here (root only): {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


def _command(tmp_path: Path, checkpoint_dir: Path, steps: int) -> list[str]:
    return [str(TORCHRUN), "--nproc-per-node", "4", "--standalone", str(EXAMPLE), "--steps", str(steps),
            "--run-dir", str(tmp_path / "run"), "--checkpoint-dir", str(checkpoint_dir)]


def _environment(**settings: str) -> dict[str, str]:
    # Every setting of the shell left out but the suite's replay cadence (tests/conftest.py).
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("SCOUT_") or key == "SCOUT_REPLAY_INTERVAL_STEPS"}
    env.update({"OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
                **{f"SCOUT_{key.upper()}": value for key, value in settings.items()}})
    return env


def _save_failed(records: list[dict[str, Any]]) -> dict[str, Any]:
    assert [reports.record_line(r) for r in records if r["kind"] in OBSERVER_KINDS] == []
    (failed,) = [r for r in records if r["kind"] == "checkpoint" and r["reason"] == "save-failed"]
    return failed


@pytest.mark.torchdist
def test_GATE_40_under_torchrun_a_full_checkpoint_disk_is_a_save_failed_report_and_the_job_stops(
        tmp_path: Path) -> None:
    with _small_filesystem(tmp_path / "ckpt", "64k") as checkpoint_dir:
        run = subprocess.run(_command(tmp_path, checkpoint_dir, 12), cwd=tmp_path,
                             env=_environment(checkpoint_every_cycles="1"), capture_output=True, text=True,
                             timeout=180)
    assert run.returncode != 0, run.stderr[-3000:]
    records = reports.read_records(tmp_path / "run" / reports.REPORTS_FILE)
    failed = _save_failed(records)
    assert failed["step"] == 8 and failed["evidence"]["path"] == str(checkpoint_dir / f"t0-s{8:012d}")
    assert "not enough free space" in failed["evidence"]["error"], failed
    assert failed["evidence"]["policy"] == "on_checkpoint_error=stop"
    assert "CheckpointSaveFailed" in run.stderr and "could not be saved to" in run.stderr
    (finished,) = [r for r in records if r["kind"] == "finished"]
    assert (finished["reason"], finished["step"]) == ("exception", 8)
    assert "CheckpointSaveFailed" in finished["evidence"]["error"]


@pytest.mark.torchdist
@pytest.mark.slow  # a second 4-rank torchrun job (36-52 s at load 15 on 2 cores); the full-disk case is the bounded one
def test_GATE_40_under_torchrun_a_save_into_a_read_only_file_system_is_reported_and_training_goes_on(
        tmp_path: Path) -> None:
    with _small_filesystem(tmp_path / "ckpt", "256m") as checkpoint_dir, subprocess.Popen(
            _command(tmp_path, checkpoint_dir, 20), cwd=tmp_path,
            env=_environment(checkpoint_every_cycles="2", on_checkpoint_error="continue"),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True) as process:
        try:
            assert process.stdout is not None
            for line in process.stdout:  # rank 0 prints every 10 steps; the save is at step 16
                if line.startswith("step 10 "):
                    break
            subprocess.run(["mount", "-o", "remount,ro", str(checkpoint_dir)], check=True, timeout=30)
            stdout, stderr = process.communicate(timeout=150)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, 9)
                process.wait(10)
    assert process.returncode == 0, stderr[-3000:]
    records = reports.read_records(tmp_path / "run" / reports.REPORTS_FILE)
    failed = _save_failed(records)
    assert failed["step"] == 16 and failed["evidence"]["path"] == str(checkpoint_dir / f"t0-s{16:012d}")
    assert "Read-only file system" in failed["evidence"]["error"], failed
    assert failed["evidence"]["policy"] == "on_checkpoint_error=continue"
    (finished,) = [r for r in records if r["kind"] == "finished"]
    assert (finished["reason"], finished["step"]) == ("closed", 20)
    assert "step 20 loss" in stdout
