"""scout in a Megatron-Core loop on real processes: 4 ranks under torchrun, torch DDP over gloo on
CPU, Megatron-Core's GPTModel (2 layers, width 64), the user's one line ``attach(model, optimizer,
run_dir=..., checkpoint_dir=..., state=...)`` (tests/integrations/megatron_train_job.py;
docs/integrations/megatron.md).

One job (spec/frameworks.md FRAME-6..11): scout writes Megatron-Core ``dist_checkpointing`` folders
at its cycle ends; an SDC on rank 1 from step 7 is named, the folder of the corrupted cycle is
quarantined and marked, torchrun restarts the job, ``attach`` loads the newest recovery-verified
folder (model, optimizer, LR schedule) and the loop resumes after its step with the LR and the data
position; in that attempt a rank asleep for 12 s is named as a hang -- and the slow checkpoint
writes (Megatron-Core starts a helper process at the first) are no hang."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from scout import reports
from scout.cli import main as scout_main
from scout.scenarios.launcher import launch, torchrun_command, torchrun_env

# 130 s on this box (Megatron-Core's imports and the helper process of its first checkpoint write,
# in 4 ranks and 2 attempts): the slow tier.
pytestmark = [pytest.mark.torchdist, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
JOB = Path(__file__).resolve().parent / "megatron_train_job.py"
ONSET, HANG_AT, STEPS = 7, 12, 14
Story = tuple[list[dict[str, Any]], Path]
SETTINGS = {"stall_threshold_s": 5, "replay_interval_steps": 1, "checkpoint_every_cycles": 1, "on_sdc": "restart"}


@pytest.fixture(scope="module", autouse=True)
def _megatron_core() -> None:
    """Imported when the module's tests run, not when pytest collects it: Megatron-Core's import
    takes 3.4 s on this box, which every pytest run would pay for a module of the slow tier."""
    pytest.importorskip("megatron.core")


def run_job(out: Path, steps: int, faults: str) -> list[dict[str, Any]]:
    env = torchrun_env(SETTINGS, drop_prefixes=("SCOUT_", "PL_"),
                       extra={"PL_FAULT": faults, "PL_HANG_S": "12"},
                       pythonpath=[REPO])
    run = launch(torchrun_command(JOB, 4, [out, out / "run", steps], max_restarts=1), env, cwd=out, timeout_s=600)
    assert run.returncode == 0, run.stderr[-4000:]
    return reports.read_records(out / "run" / reports.REPORTS_FILE)


@pytest.fixture(scope="module")
def story(tmp_path_factory: pytest.TempPathFactory) -> Story:
    out = tmp_path_factory.mktemp("megatron")
    return run_job(out, STEPS, f"sdc:1:{ONSET},hang:2:{HANG_AT}:1"), out


def folder(out: Path, step: int) -> Path:
    """scout's Megatron-Core checkpoint of ``step`` (FRAME-11)."""
    return out / "ckpt" / f"iter_{step:07d}"


def test_FRAME_6_FRAME_9_FRAME_11_sdc_named_and_the_megatron_checkpoints_after_its_onset_quarantined_and_marked(
        story: Story) -> None:
    records, out = story
    (sdc,) = [r for r in records if r["kind"] == "sdc"]
    assert sdc["ranks"] == [1] and sdc["generation"] == 0 and ONSET <= sdc["step"] <= ONSET + 2, sdc
    first = [r for r in records if r["kind"] == "checkpoint" and r["generation"] == 0]
    captured = [r for r in first if r["reason"] in ("captured", "candidate")]
    for record in captured:
        assert record["evidence"]["path"] == str(folder(out, record["step"]).resolve()), record
    assert {"common.pt", "metadata.json"} <= {p.name for p in folder(out, captured[0]["step"]).iterdir()}
    quarantined = {r["step"] for r in first if r["reason"] == "quarantined"}
    verified = {r["step"] for r in first if r["reason"] == "recovery-verified"}
    assert verified and max(verified) < ONSET and not verified & quarantined
    assert {r["step"] for r in captured} - verified == quarantined, "every capture not verified is quarantined"
    assert quarantined
    resumed_at = next(r["step"] for r in records if r["kind"] == "restart" and r["generation"] == 1)
    for step in quarantined:  # FRAME-9: marked inside; a folder the second attempt wrote again lost it
        mark = folder(out, step) / "SCOUT_QUARANTINED"
        if step <= resumed_at:
            assert json.loads(mark.read_text())["checkpoint"] == f"t0/s{step}", step
        else:
            assert not mark.exists(), step


def test_FRAME_10_the_loop_resumes_from_the_newest_verified_folder_with_its_lr_and_data_position(story: Story) -> None:
    records, out = story
    (restored,) = [r for r in records if r["kind"] == "restart" and r["reason"] == "restored"]
    verified = [r["step"] for r in records if r["kind"] == "checkpoint" and r["reason"] == "recovery-verified"
                and r["generation"] == 0]
    assert restored["generation"] == 1 and restored["evidence"]["choice"] == "verified"
    assert restored["step"] == max(verified) < ONSET
    logged = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    first = {r["step"]: r for r in logged if r["attempt"] == 0}
    second = [r for r in logged if r["attempt"] == 1]
    assert [r["step"] for r in second] == list(range(restored["step"] + 1, STEPS + 1))
    assert second[0]["samples"] == first[restored["step"] + 1]["samples"] != first[1]["samples"]
    rerun = [r for r in second if r["step"] < ONSET]
    assert rerun and all(r == {**first[r["step"]], "attempt": 1} for r in rerun), (rerun, first)


def test_FRAME_6_hang_named_in_the_resumed_attempt_and_the_certificate_lists_the_folders(
        story: Story, capsys: pytest.CaptureFixture[str]) -> None:
    records, out = story
    assert not [r for r in records if r["kind"] == "group_stall"], "a checkpoint write is no stall"
    (hang,) = [r for r in records if r["kind"] == "hang"]
    assert hang["ranks"] == [2] and hang["generation"] == 1 and hang["step"] == HANG_AT, hang
    assert scout_main(["certificate", str(out / "run"), "--list"]) == 0
    listing = capsys.readouterr().out
    assert f"megatron {folder(out, 6).resolve()} blake2b-256:" in listing, listing
    assert "QUARANTINED" in listing and "RECOVERY_VERIFIED" in listing


def test_FRAME_6_a_healthy_megatron_loop_reports_nothing_and_certifies_its_folders(tmp_path: Path) -> None:
    records = run_job(tmp_path, 12, "")
    faults = [r for r in records if r["kind"] not in ("checkpoint", "restart", "finished", "cadence")]
    assert faults == [], faults
    assert [r["reason"] for r in records if r["kind"] == "finished"] == ["closed"]
    assert [r for r in records if r["kind"] == "checkpoint" and r["reason"] == "recovery-verified"]
    assert not [r for r in records if r["kind"] == "checkpoint" and r["reason"] == "quarantined"]
