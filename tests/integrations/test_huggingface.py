"""scout in Hugging Face's Trainer on real processes: 3 ranks under torchrun, gloo on CPU, GPT-2
from scratch (2 layers, width 64), the user's one line ``train(trainer, run_dir=...)``
(tests/integrations/hf_train_job.py; docs/integrations/huggingface.md).

One job covers the story (spec/frameworks.md FRAME-6..11): an SDC on rank 1 from step 9 is named,
the Trainer's checkpoints written after its onset are quarantined and marked, torchrun restarts
the job, the Trainer resumes from the newest recovery-verified ``checkpoint-N`` with its LR and
data position, and in that second attempt a rank asleep in its loop (until named, at most 20 s) is named as a hang."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from scout import reports
from scout.cli import main as scout_main

pytestmark = pytest.mark.torchdist

JOB = Path(__file__).resolve().parent / "hf_train_job.py"
# Three replicas: the fewest in which one rank is outvoted by a strict majority (2 of 3).
WORLD = 3
TORCHRUN = Path(sys.executable).with_name("torchrun")
ONSET, HANG_AT, STEPS = 9, 14, 18


@pytest.fixture(scope="module")
def story(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]], Path]:
    out = tmp_path_factory.mktemp("hf")
    env = {key: value for key, value in os.environ.items() if not key.startswith("SCOUT_")}
    env.update({"OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "SCOUT_STALL_THRESHOLD_S": "3",
                "SCOUT_REPLAY_INTERVAL_STEPS": "1", "SCOUT_CHECKPOINT_EVERY_CYCLES": "1", "SCOUT_ON_SDC": "restart",
                "HF_SAVE_STEPS": "1", "HF_FAULT": f"sdc:1:{ONSET},hang:2:{HANG_AT}:1"})
    run = subprocess.run([str(TORCHRUN), "--nproc-per-node", str(WORLD), "--standalone", "--max-restarts", "1", str(JOB),
                          str(out), str(out / "run"), str(STEPS)], cwd=out, env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    return run, reports.read_records(out / "run" / reports.REPORTS_FILE), out


def test_FRAME_6_FRAME_9_sdc_named_and_the_trainers_checkpoints_after_its_onset_quarantined_and_marked(
        story: tuple[subprocess.CompletedProcess[str], list[dict[str, Any]], Path]) -> None:
    _run, records, out = story
    (sdc,) = [r for r in records if r["kind"] == "sdc"]
    assert sdc["ranks"] == [1] and sdc["generation"] == 0 and ONSET <= sdc["step"] <= ONSET + 2, sdc
    first = [r for r in records if r["kind"] == "checkpoint" and r["generation"] == 0]
    after_onset = [r for r in first if r["reason"] == "captured" and r["step"] >= ONSET]
    assert after_onset, "the Trainer saved after the onset, before the detection"
    quarantined = {r["step"] for r in first if r["reason"] == "quarantined"}
    assert {r["step"] for r in after_onset} <= quarantined
    verified = {r["step"] for r in first if r["reason"] == "recovery-verified"}
    assert verified and max(verified) < ONSET and not verified & quarantined
    for record in first:  # every capture names the Trainer's checkpoint-N
        assert record["evidence"]["path"] == str((out / "hf" / f"checkpoint-{record['step']}").resolve())
    # FRAME-9: the mark is in the quarantined ones the second attempt did not write again.
    resumed_at = next(r["step"] for r in records if r["kind"] == "restart" and r["generation"] == 1)
    for step in quarantined:
        mark = out / "hf" / f"checkpoint-{step}" / "SCOUT_QUARANTINED"
        if step <= resumed_at:
            assert json.loads(mark.read_text())["checkpoint"] == f"t0/s{step}"
        else:  # rewritten by the second attempt: its stale mark went
            assert not mark.exists(), step


def test_FRAME_10_FRAME_11_the_trainer_resumes_from_the_newest_verified_checkpoint_with_its_lr_and_data(
        story: tuple[subprocess.CompletedProcess[str], list[dict[str, Any]], Path]) -> None:
    _run, records, out = story
    (restored,) = [r for r in records if r["kind"] == "restart" and r["reason"] == "restored"]
    verified = [r["step"] for r in records if r["kind"] == "checkpoint" and r["reason"] == "recovery-verified"
                and r["generation"] == 0]
    assert restored["generation"] == 1 and restored["evidence"]["choice"] == "verified"
    assert restored["step"] == max(verified) < ONSET
    logged = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    first = {r["step"]: r for r in logged if r["attempt"] == 0}
    second = [r for r in logged if r["attempt"] == 1]
    assert [r["step"] for r in second] == list(range(restored["step"] + 1, STEPS + 1))
    # The steps re-run before the onset: the same LR, the same samples, the same loss, bit for bit.
    rerun = [r for r in second if r["step"] < ONSET]
    assert rerun and all(r == {**first[r["step"]], "attempt": 1} for r in rerun), (rerun, first)


def test_FRAME_8_hang_named_in_the_resumed_attempt_and_the_certificate_lists_the_trainers_checkpoints(
        story: tuple[subprocess.CompletedProcess[str], list[dict[str, Any]], Path],
        capsys: pytest.CaptureFixture[str]) -> None:
    _run, records, out = story
    (hang,) = [r for r in records if r["kind"] == "hang"]
    assert hang["ranks"] == [2] and hang["generation"] == 1 and hang["step"] == HANG_AT, hang
    assert scout_main(["certificate", str(out / "run"), "--list"]) == 0
    listing = capsys.readouterr().out
    assert f"huggingface {out / 'hf'}" in listing.replace(str((out / "hf").resolve()), str(out / "hf")), listing
    assert "t0/s9 " in listing and "QUARANTINED" in listing and "RECOVERY_VERIFIED" in listing
