"""scout.attach on an FSDP2 model: HSDP on a 2 x 2 CPU mesh, the replicas of each shard as the
peer groups (TorchPeerGroup.from_mesh), checkpoints through DCP, under torchrun."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from scout import reports
from tests.job.test_attach_torchrun import FAULT_KINDS, TORCHRUN

pytestmark = pytest.mark.torchdist
WORKER = Path(__file__).resolve().parent / "hsdp_job.py"


def test_ATTACH_fsdp2_hsdp_job_verifies_its_checkpoints_per_replica_group(tmp_path: Path) -> None:
    run_dir, checkpoint_dir = tmp_path / "run", tmp_path / "ckpt"
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(Path(__file__).resolve().parents[2]) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    run = subprocess.run([str(TORCHRUN), "--nproc-per-node", "4", "--standalone", str(WORKER), str(run_dir),
                          str(checkpoint_dir), "8"], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    records = reports.read_records(run_dir / "reports.jsonl")
    assert [r for r in records if r["kind"] in FAULT_KINDS or r["kind"] == "unchecked"] == []
    (started,) = [r for r in records if r["kind"] == "restart"]
    assert started["evidence"]["groups"] == [[0, 2], [1, 3]]  # the replicas of shard 0 and of shard 1
    verified = [r["evidence"]["checkpoint"] for r in records if r["reason"] == "recovery-verified"]
    assert verified == ["t0/s4"]
