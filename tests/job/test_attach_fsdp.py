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


@pytest.mark.slow  # 8 ranks on 2 cores; the 4-rank run of the same layout is test_self_check_jobs' FSDP2 case
def test_ATTACH_the_docs_hsdp_layout_on_8_ranks_is_4_replicas_of_2_shards_and_names_a_flipped_rank(
        tmp_path: Path) -> None:
    """docs/attach.md's layout block, run as written (device "cpu"): on 8 ranks a (4, 2) mesh,
    the four replicas of each shard one peer group, so a flip on rank 1 is named in its group."""
    run_dir, checkpoint_dir = tmp_path / "run", tmp_path / "ckpt"
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(Path(__file__).resolve().parents[2]) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    run = subprocess.run([str(TORCHRUN), "--nproc-per-node", "8", "--standalone", str(WORKER), str(run_dir),
                          str(checkpoint_dir), "9", "docs", "flip:1:6"], env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    records = reports.read_records(run_dir / "reports.jsonl")
    (started,) = [r for r in records if r["kind"] == "restart"]
    assert started["evidence"]["groups"] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    named = {rank for r in records if r["kind"] == "sdc" for rank in r["ranks"]}
    assert named == {1}, [reports.record_line(r) for r in records if r["kind"] == "sdc"]
    # Sharded for real (each rank holds half of every block): the flip in rank 1's live output
    # is seen by the self-check alone (SELF-4, on the gathered parameters CAP-7 kept), and no
    # checkpoint trained on it is certified (the same assertions as the 4-rank FSDP2 case).
    sdc = [r for r in records if r["kind"] == "sdc"]
    assert {(r["reason"], r["evidence"]["recipe"], tuple(r["evidence"]["sources"])) for r in sdc} == {
        ("live-mismatch", "hidden.1", ("live",))}, sdc
    assert [r for r in records if r["kind"] == "checkpoint" and r["reason"] == "recovery-verified"
            and int(r["evidence"]["checkpoint"].split("/s")[1]) >= 6] == []
