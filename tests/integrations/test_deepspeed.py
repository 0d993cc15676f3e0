"""scout in a DeepSpeed loop on real processes: 3 ranks under torchrun, DeepSpeed's CPU accelerator
over gloo, ZeRO stage 1, the tiny language model of the Lightning test, the user's one line
``attach(engine, run_dir=...)`` (tests/integrations/deepspeed_train_job.py;
docs/integrations/deepspeed.md).

One job (spec/frameworks.md FRAME-6..11): the loop's own ``engine.save_checkpoint`` every 3 steps
and scout's at the other cycle ends; an SDC on rank 1 from step 7 is named, the loop's checkpoint
folders of the corrupted cycles are quarantined and marked, torchrun restarts the job, ``attach``
loads the newest recovery-verified folder with ``engine.load_checkpoint`` and the loop resumes
after its step with the LR and the data position; in that attempt a rank asleep for 12 s is named
as a hang."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from scout import reports
from scout.cli import main as scout_main
from scout.scenarios.launcher import launch, torchrun_command, torchrun_env

pytestmark = pytest.mark.torchdist


@pytest.fixture(scope="module", autouse=True)
def _deepspeed() -> None:
    """Imported when the module's tests run, not when pytest collects it (1.9 s on this box, paid
    by every pytest run otherwise)."""
    pytest.importorskip("deepspeed")


REPO = Path(__file__).resolve().parents[2]
JOB = Path(__file__).resolve().parent / "deepspeed_train_job.py"
# Three replicas: the fewest in which one rank is outvoted by a strict majority (2 of 3).
WORLD = 3
ONSET, HANG_AT, STEPS, SAVE_EVERY = 7, 12, 14, 3
Story = tuple[list[dict[str, Any]], Path]
SETTINGS = {"stall_threshold_s": 3, "replay_interval_steps": 1, "checkpoint_every_cycles": 1, "on_sdc": "restart"}


def run_job(out: Path, steps: int, faults: str) -> list[dict[str, Any]]:
    env = torchrun_env(SETTINGS, drop_prefixes=("SCOUT_", "PL_", "DS_"),
                       extra={"DS_SAVE_STEPS": str(SAVE_EVERY), "DS_ZERO_STAGE": "1", "DS_ACCELERATOR": "cpu", "PL_FAULT": faults,
                              "PL_HANG_S": "12"},
                       pythonpath=[REPO])
    run = launch(torchrun_command(JOB, WORLD, [out, out / "run", steps], max_restarts=1), env, cwd=out, timeout_s=600)
    assert run.returncode == 0, run.stderr[-4000:]
    return reports.read_records(out / "run" / reports.REPORTS_FILE)


@pytest.fixture(scope="module")
def story(tmp_path_factory: pytest.TempPathFactory) -> Story:
    out = tmp_path_factory.mktemp("deepspeed")
    return run_job(out, STEPS, f"sdc:1:{ONSET},hang:2:{HANG_AT}:1"), out


def folder(out: Path, step: int) -> Path:
    """The loop's own save of ``step``, or scout's (FRAME-11) at a cycle end the loop did not save."""
    return out / "ckpt" / f"step{step}" if step % SAVE_EVERY == 0 else out / "run" / "checkpoints" / f"global_step{step}"


def test_FRAME_6_FRAME_9_FRAME_11_sdc_named_and_the_loops_deepspeed_checkpoints_quarantined_and_marked(
        story: Story) -> None:
    records, out = story
    (sdc,) = [r for r in records if r["kind"] == "sdc"]
    assert sdc["ranks"] == [1] and sdc["generation"] == 0 and ONSET <= sdc["step"] <= ONSET + 2, sdc
    first = [r for r in records if r["kind"] == "checkpoint" and r["generation"] == 0]
    captured = [r for r in first if r["reason"] in ("captured", "candidate")]
    for record in captured:
        assert record["evidence"]["path"] == str(folder(out, record["step"]).resolve()), record
    assert {r["step"] % SAVE_EVERY == 0 for r in captured} == {True, False}, "the loop's saves and scout's"
    quarantined = {r["step"] for r in first if r["reason"] == "quarantined"}
    verified = {r["step"] for r in first if r["reason"] == "recovery-verified"}
    assert verified and max(verified) < ONSET and not verified & quarantined
    assert {r["step"] for r in captured} - verified == quarantined, "every capture not verified is quarantined"
    assert any(step % SAVE_EVERY == 0 for step in quarantined), "a folder of the loop's own is quarantined"
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
    (hang,) = [r for r in records if r["kind"] == "hang"]
    assert hang["ranks"] == [2] and hang["generation"] == 1 and hang["step"] == HANG_AT, hang
    assert scout_main(["certificate", str(out / "run"), "--list"]) == 0
    listing = capsys.readouterr().out
    assert f"deepspeed {folder(out, 6).resolve()} blake2b-256:" in listing, listing
    assert "QUARANTINED" in listing and "RECOVERY_VERIFIED" in listing


@pytest.mark.slow
def test_FRAME_6_a_healthy_deepspeed_loop_reports_nothing_and_certifies_its_folders(tmp_path: Path) -> None:
    records = run_job(tmp_path, 12, "")
    faults = [r for r in records if r["kind"] not in ("checkpoint", "restart", "finished", "cadence")]
    assert faults == [], faults
    assert [r["reason"] for r in records if r["kind"] == "finished"] == ["closed"]
    assert [r for r in records if r["kind"] == "checkpoint" and r["reason"] == "recovery-verified"]
    assert not [r for r in records if r["kind"] == "checkpoint" and r["reason"] == "quarantined"]
