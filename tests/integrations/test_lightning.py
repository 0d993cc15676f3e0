"""scout in PyTorch Lightning on real processes: 3 ranks under torchrun, strategy ddp over gloo on
CPU, a tiny language model, the user's one line ``fit(trainer, model, run_dir=...)``
(tests/integrations/lightning_train_job.py; docs/integrations/lightning.md).

One job covers the story (spec/frameworks.md FRAME-6..12): the user's ``ModelCheckpoint`` saves
every 4 steps and scout asks the Trainer for ``scout-step=N.ckpt`` at the other cycle ends; an SDC
on rank 1 from step 7 is named, every ``.ckpt`` written after its onset -- the ``ModelCheckpoint``'s
of the very step it was detected at included -- is quarantined and marked, torchrun restarts the
job, Lightning resumes from the newest recovery-verified ``.ckpt`` with its LR and the data position
(which Lightning 2.6 alone would restart at the epoch's first batch), and in that second attempt a
rank asleep for 12 s is named as a hang. A healthy run (slow tier) reports nothing."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from scout import reports
from scout.cli import main as scout_main
from scout.scenarios.launcher import launch, torchrun_command, torchrun_env

pytestmark = pytest.mark.torchdist

JOB = Path(__file__).resolve().parent / "lightning_train_job.py"
# Three replicas: the fewest in which one rank is outvoted by a strict majority (2 of 3).
WORLD = 3
ONSET, HANG_AT, STEPS, SAVE_EVERY = 7, 12, 14, 4
Story = tuple[list[dict[str, Any]], Path]
SETTINGS = {"stall_threshold_s": 3, "replay_interval_steps": 1, "checkpoint_every_cycles": 1, "on_sdc": "restart"}


def run_job(out: Path, steps: int, faults: str) -> list[dict[str, Any]]:
    env = torchrun_env(SETTINGS, drop_prefixes=("SCOUT_", "PL_"),
                       extra={"PL_SAVE_STEPS": str(SAVE_EVERY), "PL_FAULT": faults, "PL_HANG_S": "12"})
    run = launch(torchrun_command(JOB, WORLD, [out, out / "run", steps], max_restarts=1), env, cwd=out, timeout_s=600)
    assert run.returncode == 0, run.stderr[-4000:]
    return reports.read_records(out / "run" / reports.REPORTS_FILE)


@pytest.fixture(scope="module")
def story(tmp_path_factory: pytest.TempPathFactory) -> Story:
    out = tmp_path_factory.mktemp("lightning")
    return run_job(out, STEPS, f"sdc:1:{ONSET},hang:2:{HANG_AT}:1"), out


def test_FRAME_6_FRAME_8_FRAME_9_sdc_named_and_every_ckpt_after_its_onset_quarantined_and_marked(story: Story) -> None:
    records, out = story
    (sdc,) = [r for r in records if r["kind"] == "sdc"]
    assert sdc["ranks"] == [1] and sdc["generation"] == 0 and ONSET <= sdc["step"] <= ONSET + 2, sdc
    first = [r for r in records if r["kind"] == "checkpoint" and r["generation"] == 0]
    captured = [r for r in first if r["reason"] in ("captured", "candidate")]
    for record in captured:  # every capture names the Trainer's .ckpt of its step: the user's or scout's
        name = Path(record["evidence"]["path"]).name
        assert Path(record["evidence"]["path"]).parent == (out / "ckpt").resolve(), record
        expected = f"step={record['step']}.ckpt" if record["step"] % SAVE_EVERY == 0 else f"scout-step={record['step']}.ckpt"
        assert name == expected, record
    assert {r["step"] % SAVE_EVERY == 0 for r in captured} == {True, False}, "ModelCheckpoint's and scout's (FRAME-11)"
    # FRAME-8: the ModelCheckpoint's .ckpt of the detection step itself is recorded, at capture quarantined.
    quarantined = {r["step"] for r in first if r["reason"] == "quarantined"}
    assert sdc["step"] % SAVE_EVERY == 0 and sdc["step"] in quarantined
    assert {r["step"] for r in captured if r["step"] >= ONSET} <= quarantined
    verified = {r["step"] for r in first if r["reason"] == "recovery-verified"}
    assert verified and max(verified) < ONSET and not verified & quarantined
    # FRAME-9: a mark beside each quarantined .ckpt; the one the second attempt wrote again lost it.
    rewritten = {r["step"] for r in records if r["kind"] == "checkpoint" and r["generation"] == 1
                 and r["reason"] in ("captured", "candidate") and Path(r["evidence"]["path"]).name.startswith("scout-")}
    for step in quarantined:
        name = f"step={step}.ckpt" if step % SAVE_EVERY == 0 else f"scout-step={step}.ckpt"
        mark = out / "ckpt" / f"{name}.SCOUT_QUARANTINED"
        if step in rewritten:
            assert not mark.exists(), step
        else:
            assert json.loads(mark.read_text())["checkpoint"] == f"t0/s{step}", step


def test_FRAME_10_FRAME_12_lightning_resumes_from_the_newest_verified_ckpt_with_its_lr_and_data_position(
        story: Story) -> None:
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
    # FRAME-12: the first step after the restore trains on the batch after the checkpoint's, not on
    # the epoch's first batch again (Lightning 2.6's own resume of a plain DataLoader).
    assert second[0]["samples"] == first[restored["step"] + 1]["samples"] != first[1]["samples"]
    # The steps re-run before the onset: the same LR, the same samples, the same loss, bit for bit.
    rerun = [r for r in second if r["step"] < ONSET]
    assert rerun and all(r == {**first[r["step"]], "attempt": 1} for r in rerun), (rerun, first)


def test_FRAME_6_hang_named_in_the_resumed_attempt_and_the_certificate_lists_the_lightning_ckpts(
        story: Story, capsys: pytest.CaptureFixture[str]) -> None:
    records, out = story
    (hang,) = [r for r in records if r["kind"] == "hang"]
    assert hang["ranks"] == [2] and hang["generation"] == 1 and hang["step"] == HANG_AT, hang
    assert scout_main(["certificate", str(out / "run"), "--list"]) == 0
    listing = capsys.readouterr().out
    directory = str((out / "ckpt").resolve())
    assert re.search(rf"t0/s{ONSET + 1} +QUARANTINED", listing), listing
    assert f"lightning {directory}/step={ONSET + 1}.ckpt blake2b-256:" in listing, listing
    assert "RECOVERY_VERIFIED" in listing and f"lightning {directory}/scout-step=" in listing


@pytest.mark.slow
def test_FRAME_6_a_healthy_lightning_run_reports_nothing_and_certifies_its_ckpts(tmp_path: Path) -> None:
    records = run_job(tmp_path, 12, "")
    faults = [r for r in records if r["kind"] not in ("checkpoint", "restart", "finished", "cadence")]
    assert faults == [], faults
    assert [r["reason"] for r in records if r["kind"] == "finished"] == ["closed"]
    assert [r for r in records if r["kind"] == "checkpoint" and r["reason"] == "recovery-verified"]
    assert not [r for r in records if r["kind"] == "checkpoint" and r["reason"] == "quarantined"]
