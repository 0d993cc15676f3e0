"""Expert replay and the canary through ``scout.attach`` (spec/moe.md, spec/canary.md): a toy
MoE trained with DDP under torchrun on 4 gloo ranks, its regime catalog built by
``scout moe-catalog``; what a user reads afterwards (reports, the certificate) is checked."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from scout import reports

pytestmark = pytest.mark.torchdist

REPO = Path(__file__).resolve().parents[2]
TORCHRUN = Path(sys.executable).with_name("torchrun")


def test_MOE_1_MOE_10_REC_8_CANARY_5_CANARY_7_attach_certifies_experts_and_the_canary_blocks_common_mode(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    catalog = tmp_path / "moe.json"
    built = subprocess.run([sys.executable, "-m", "scout.cli", "moe-catalog", "--model",
                            "tests.replay.moe_toy:ToyMoEModel", "--kwargs", '{"experts": 8}', "--n-exec", "2,4,16,32",
                            "--out", str(catalog)], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    run_dir = tmp_path / "run"
    settings = {"SCOUT_MOE_CATALOG": str(catalog), "SCOUT_CANARY": "true", "SCOUT_REPLAY_INTERVAL_STEPS": "8",
                "SCOUT_CHECKPOINT_EVERY_CYCLES": "1", "SCOUT_MAX_EXPERT_REPLAYS_PER_STEP": "1"}
    # The dense recipes (one layer) take 8 steps; 8 experts x 2 regimes = 16 expert recipes, at
    # most one per step by the bound set here (MOE-10; 2 a step by default, tests/job/
    # test_moe_example.py): a cycle is 16 steps, and attach says why.
    run = subprocess.run([str(TORCHRUN), "--nproc-per-node", "4", "--standalone",
                          str(REPO / "tests/integrations/moe_attach_job.py"), "--steps", "64", "--run-dir", str(run_dir),
                          "--checkpoint-dir", str(tmp_path / "ckpt"), "--common-mode-step", "37"],
                         cwd=tmp_path, env={**env, **settings}, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    # REC-8, MOE-10: rank 0 said the cycle, why, and the checkpoint interval, once, on the console.
    said = [line for line in run.stderr.splitlines() if "scout: replay cycle" in line]
    assert len(said) == 1 and said[0].endswith(
        "scout: replay cycle 16 steps (set by 16 expert recipe(s), one every 1 step(s); the dense recipes' cycle is 8 "
        "steps and at most max_expert_replays_per_step=1 expert recipes are replayed per step; a larger "
        "max_expert_replays_per_step, fewer --n-exec values in the MoE catalog or a larger replay_interval_steps bring "
        "it closer); a checkpoint every 16 steps (checkpoint_every_cycles=1), verified one cycle later"), said
    records = reports.read_records(run_dir / reports.REPORTS_FILE)
    # The vote never saw the common-mode fault; the canary did, at the end of its cycle.
    assert not [r for r in records if r["kind"] == "sdc" and r["reason"] == "replay-mismatch"]
    common = [r for r in records if r["kind"] == "sdc" and r["reason"] == "canary-common-mode"]
    assert [(r["step"], r["ranks"]) for r in common] == [(48, [0, 1, 2, 3]), (64, [0, 1, 2, 3])]
    assert common[0]["evidence"]["classes"] == ["hidden"]
    trust = {(r["reason"], r["evidence"]["checkpoint"]) for r in records if r["kind"] == "checkpoint"}
    assert ("recovery-verified", "t0/s16") in trust
    assert ("quarantined", "t0/s32") in trust
    assert not any(reason == "recovery-verified" and ckpt in ("t0/s32", "t0/s48") for reason, ckpt in trust)
    certificate = subprocess.run([sys.executable, "-m", "scout.cli", "certificate", str(run_dir), "16"], cwd=REPO,
                                 env=env, capture_output=True, text=True, timeout=60)
    assert certificate.returncode == 0, certificate.stderr
    assert "expert regimes replayed in cycle" in certificate.stdout
    assert "expert.7@32" in certificate.stdout and "canary" in certificate.stdout
    # MOE-6: the per-expert loop qualifies its templates, and the certificate says which.
    assert "coverage note: heterogeneous MoE routing: covered only for the qualified templates layer0:" in \
        certificate.stdout
