"""``scout report RUN_DIR``: the summary and the picture a user reads after a run, from a run
directory laid out as scout.attach lays it out (reports.jsonl, gate/ manifest)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scout import reports
from scout.cli import main
from scout.core.recipes import RecipeId, RecipeResult
from scout.core.verdict import Status
from scout.gate.model import CheckpointCaptured, CycleBoundary, GateConfig, Restart
from scout.gate.recorder import GateWriter
from scout.gate.results import recipe_verdicts


def _run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    config = GateConfig("run", ("hidden.0",), ("dp",))
    agree = RecipeResult(RecipeId.parse("hidden.0"), 0, Status.AGREE)
    sdc = RecipeResult(RecipeId.parse("hidden.0"), 0, Status.ATTRIBUTED, (1,), ("output",))
    with GateWriter.open(run / "gate", config) as writer:
        writer.apply(CycleBoundary(0))
        for boundary in (8, 16, 24):
            writer.apply(recipe_verdicts(config, "hidden.0", writer.state.context.cycle, boundary, {"dp": agree}))
            writer.apply(CycleBoundary(boundary))
            writer.apply(CheckpointCaptured(boundary))
        writer.apply(recipe_verdicts(config, "hidden.0", writer.state.context.cycle, 30, {"dp": sdc}))
        writer.apply(Restart(16))
    path = run / reports.REPORTS_FILE

    def add(kind: str, reason: str, **fields: object) -> None:
        reports.append_record(path, reports.make_record(kind, job_id="j", reason=reason, **fields))  # type: ignore[arg-type]

    add("restart", "started", source="job", generation=0, step=0, evidence={"world_size": 4})
    add("cadence", "calibrated", source="job", generation=0, step=8, evidence={
        "interval_steps": 40, "lanes": 1, "cycle_steps": 160, "share": 0.0096, "overhead_budget": 0.01,
        "status": "within", "loop_check_steps": 25, "agreement_interval_steps": 130})
    add("straggler", "device-slow", source="replay", generation=0, ranks=[3], hosts=["h3"], step=6)
    add("straggler", "recovered-device", source="replay", generation=0, ranks=[3], hosts=["h3"], step=14)
    add("hang", "behind-majority", source="observer", generation=0, ranks=[2], hosts=["h2"], step=20)
    add("sdc", "replay-mismatch", source="replay", generation=0, ranks=[1], hosts=["h1"], step=30)
    add("restart", "restored", source="job", generation=1, step=16, evidence={"failure": "sdc", "choice": "verified"})
    add("finished", "closed", source="job", generation=1, step=40)
    return run


def test_REPORT_summary_names_every_fault_the_restart_and_checkpoint_trust(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    run = _run_dir(tmp_path)
    assert main(["report", str(run), "--json", "--no-picture"]) == 1  # faults were reported
    summary = json.loads(capsys.readouterr().out)
    assert summary["faults_by_kind"] == {"hang": 1, "sdc": 1, "straggler": 2}
    assert [(f["kind"], f["ranks"], f["step"]) for f in summary["faults"]][2:] == [("hang", [2], 20), ("sdc", [1], 30)]
    assert (summary["world_size"], summary["last_step"]) == (4, 40)
    trust = {c["checkpoint"]: c["trust"] for c in summary["checkpoints"]}
    assert trust == {"t0/s8": "RECOVERY_VERIFIED", "t0/s16": "RECOVERY_VERIFIED", "t0/s24": "QUARANTINED"}
    assert summary["restore_candidate"] == "t0/s16"
    assert summary["cadences"] == [{"generation": 0, "step": 8, "reason": "calibrated", "interval_steps": 40, "lanes": 1,
                                    "cycle_steps": 160, "share": 0.0096, "overhead_budget": 0.01, "status": "within",
                                    "loop_check_steps": 25, "agreement_interval_steps": 130}]
    assert main(["report", str(run), "--no-picture"]) == 1
    text = capsys.readouterr().out
    assert "sdc              [1]" in text and "restored step 16 (verified checkpoint for a sdc failure)" in text
    # BUDGET-7: the cadence the budget chose, and what it bought; BUDGET-11, BUDGET-13: the loop
    # check's and the agreement's intervals.
    assert ("replay cadence from step 8 (calibrated): 1 layer(s) every 40 steps, a cycle (SDC bound) of 160 steps, "
            "scout's work 0.96 % of a step (budget 1 %), a loop check every 25 steps, an agreement on scout's own "
            "failures every 130 steps") in text


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_REPORT_the_picture_is_drawn(tmp_path: Path, suffix: str) -> None:
    run = _run_dir(tmp_path)
    picture = tmp_path / f"picture{suffix}"
    assert main(["report", str(run), "--picture", str(picture)]) == 1
    data = picture.read_bytes()
    assert data.startswith(b"\x89PNG") if suffix == ".png" else b"<svg" in data[:2000]
    assert len(data) > 10_000


def test_REPORT_a_missing_run_directory_is_one_clear_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path / "nowhere")]) == 2
    assert "is not a run directory" in capsys.readouterr().err


def test_CERTIFICATE_accepts_the_run_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _run_dir(tmp_path)
    assert main(["certificate", str(run), "8"]) == 0
    assert "checkpoint t0/s8 (RECOVERY_VERIFIED)" in capsys.readouterr().out


def _story(tmp_path: Path, records: list[tuple[str, str, dict[str, object]]]) -> Path:
    run = tmp_path / "story"
    path = run / reports.REPORTS_FILE
    for kind, reason, fields in records:
        reports.append_record(path, reports.make_record(kind, job_id="j", reason=reason, **fields))  # type: ignore[arg-type]
    return run


PERSISTENT_SDC = [("restart", "started", {"source": "job", "generation": 0, "step": 0, "evidence": {"world_size": 4}}),
                  *[("sdc", "replay-mismatch", {"source": "replay", "generation": g, "ranks": [1], "hosts": ["h1"],
                                                "step": s}) for g, s in ((0, 12), (0, 12), (0, 14))],
                  ("restart", "sdc", {"source": "job", "generation": 0, "ranks": [1], "step": 14,
                                      "evidence": {"policy": "on_sdc=restart"}}),
                  ("restart", "restored", {"source": "job", "generation": 1, "step": 8,
                                           "evidence": {"failure": "sdc", "choice": "verified"}}),
                  ("sdc", "replay-mismatch", {"source": "replay", "generation": 1, "ranks": [1], "hosts": ["h1"],
                                              "step": 12}),
                  ("restart", "exhausted", {"source": "job", "generation": 1, "ranks": [1], "step": 12})]
HANG_AND_STRAGGLER = [
    ("restart", "started", {"source": "job", "generation": 0, "step": 0, "evidence": {"world_size": 4}}),
    ("straggler", "device-slow", {"source": "replay", "generation": 0, "ranks": [3], "step": 6,
                                  "evidence": {"performance_ratio": 1.52}}),
    ("hang", "behind-majority", {"source": "observer", "generation": 0, "ranks": [2], "step": 20,
                                 "evidence": {"peers": [{"rank": 2, "idle_s": 41.5}, {"rank": 0, "idle_s": 40.0}]}}),
]

INTERRUPTED = [("restart", "started", {"source": "job", "generation": 0, "step": 0, "evidence": {"world_size": 4}}),
               ("finished", "interrupted", {"source": "job", "generation": 0, "step": 23,
                                            "evidence": {"error": "KeyboardInterrupt: "}})]
SAVE_FAILED = [("restart", "started", {"source": "job", "generation": 0, "step": 0, "evidence": {"world_size": 4}}),
               ("checkpoint", "save-failed", {"source": "gate", "generation": 0, "step": 8, "ranks": [0, 1, 2, 3],
                                              "evidence": {"checkpoint": "t0/s8", "path": "/ckpt/t0-s000000000008",
                                                           "error": "not enough free space"}}),
               ("finished", "exception", {"source": "job", "generation": 0, "step": 8,
                                          "evidence": {"error": "CheckpointSaveFailed: ..."}})]


@pytest.mark.parametrize(("story", "began", "ended"), [
    (PERSISTENT_SDC, ["fresh start", "restored step 8 (verified checkpoint for a sdc failure)"],
     ["stopped by on_sdc=restart at step 14", "job stopped at step 12: restarts spent"]),
    (HANG_AND_STRAGGLER, ["fresh start"], ["no closing record after step 20: killed or interrupted"]),
    (INTERRUPTED, ["fresh start"], ["left at step 23 (interrupted)"]),  # PROGRESS-11: Ctrl-C says its step
    (SAVE_FAILED, ["fresh start"], ["left at step 8 (exception)"]),  # GATE-40: drawn as "save failed"
], ids=["persistent-sdc-restarts-spent", "hang-and-straggler-interrupted", "ctrl-c", "save-failed"])
def test_REPORT_the_picture_tells_each_attempt_how_it_began_and_ended(
        tmp_path: Path, story: list[tuple[str, str, dict[str, object]]], began: list[str], ended: list[str]) -> None:
    from scout.reports.picture import attempts_of, render_picture
    from scout.reports.summary import load_run

    view = load_run(_story(tmp_path, story))
    attempts = attempts_of(view)
    assert [a.began for a in attempts] == began
    assert [a.ended for a in attempts] == ended
    assert all(a.ended_badly for a in attempts)
    picture = render_picture(view, tmp_path / "story.png")
    assert picture.read_bytes().startswith(b"\x89PNG") and picture.stat().st_size > 10_000
