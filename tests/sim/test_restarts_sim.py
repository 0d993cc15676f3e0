"""Restarts with storage faults on the simulator (issue 40): the simulated job runs the product's
restore and save programs (scout/job/restore.py, scout/job/save.py) -- the same function objects
``scout.attach``'s Job runs on its control group -- with simulated files, so a restart from a
lost checkpoint (spec/recovery.md RECOVERY-7, spec/gate.md GATE-42) and a failed save (GATE-40)
run at 256 ranks in CI. The real jobs are tests/job/test_checkpoint_lost.py and
test_checkpoint_errors.py; the campaign's restarts part runs the scenarios at 256-1024 ranks."""

from __future__ import annotations

from typing import Any

import pytest

from scout.core.failure import FailureClass
from scout.gate.model import (
    Artifact,
    CheckpointCaptured,
    CheckpointId,
    CycleBoundary,
    GateConfig,
    Trust,
)
from scout.gate.recorder import GateWriter, MemoryRecorder
from scout.gate.step import initial_state, step
from scout.job import framework, restore, save
from scout.job.gate_driver import GateDriver, Reporter
from scout.reports.kinds import CheckpointReason, FinishedReason, ReportKind, RestartReason
from scout.scenarios import replay_job, restarts, sim_storage
from scout.scenarios.registry import ScenarioParams, run_scenario
from scout.scenarios.replay_job import AttemptEnd, Faults, JobRun, run_replay_job
from scout.scenarios.sim_storage import FilesGone, WriteFails
from scout.transport.sim import SimCluster

RANKS = 256


def _of(run: JobRun, kind: ReportKind, reason: str | None = None, generation: int | None = None) -> list[dict[str, Any]]:
    return [r for r in run.records if r["kind"] == kind and (reason is None or r["reason"] == reason)
            and (generation is None or r["generation"] == generation)]


def _trust(run: JobRun, name: str) -> Trust | None:
    entries = run.storage.generations[-1].context.checkpoints
    return next((e.trust for e in entries if str(e.id) == name), None)


def test_PIPELINE_the_simulator_runs_the_products_restore_and_save_programs() -> None:
    from scout.job import attach, stepping

    assert attach.run_restore is restore.run_restore is replay_job.run_restore
    assert stepping.run_save is save.run_save is replay_job.run_save


def test_RECOVERY_7_GATE_42_at_256_ranks_the_restart_loses_the_chosen_checkpoint_and_restores_the_older_one() -> None:
    """An SDC on rank 100 stops every rank at step 9 (t0/s2, s4, s6 verified); before the restart
    the files of the checkpoint it chooses, t0/s6, are gone on ranks 7 and 200."""
    run = run_replay_job(ranks=RANKS, group_size=8, seed=11, steps=restarts.STEPS, scenario="lost-at-256",
                         faults=Faults(sdc_rank=100, sdc_step=9, sdc_bit=3, attempt=0),
                         storage_faults=[FilesGone(1, 1, (7, 200))], max_restarts=1)
    (sdc,) = _of(run, ReportKind.SDC)
    assert (sdc["ranks"], sdc["step"], sdc["generation"]) == ([100], 9, 0)
    (lost,) = _of(run, ReportKind.CHECKPOINT, CheckpointReason.LOST)
    assert (lost["generation"], lost["evidence"]["checkpoint"], lost["evidence"]["before"]) == (
        1, "t0/s6", Trust.RECOVERY_VERIFIED.value)
    assert "no complete checkpoint at /sim/ckpt/t0-s000000000006 on rank(s) [7, 200]" in lost["evidence"]["detail"]
    (restart,) = [r for r in _of(run, ReportKind.RESTART, generation=1)]
    assert (restart["reason"], restart["step"], restart["evidence"]["lost"]) == (RestartReason.RESTORED, 4, ["t0/s6"])
    assert (restart["evidence"]["failure"], restart["evidence"]["choice"]) == ("sdc", "verified")
    for rank, (first, second) in enumerate(run.attempts):  # every rank alike, and only two attempts
        assert (first.ended, first.outcome and first.outcome.step) == (AttemptEnd.STOPPED, 9), rank
        assert second.restored is not None and second.restored.lost == ("t0/s6",), rank
        assert second.restored.decision.checkpoint == CheckpointId(0, 4), rank
        assert (second.ended, second.outcome and second.outcome.step) == (AttemptEnd.FINISHED, restarts.STEPS), rank
    assert run.files is not None
    gone = CheckpointId(0, 6)
    assert [rank for rank in range(RANKS) if gone not in run.files.held[rank]] == [7, 200]
    assert _trust(run, "t0/s6") is Trust.LOST and _trust(run, "t0/s4") is Trust.RECOVERY_VERIFIED
    assert _trust(run, "t1/s8") is Trust.RECOVERY_VERIFIED, "the restarted timeline certifies again"


def test_GATE_40_at_256_ranks_a_failed_write_is_reported_naming_its_rank_every_rank_stops_and_the_restart_restores() -> None:
    run = run_replay_job(ranks=RANKS, group_size=8, seed=12, steps=restarts.STEPS, scenario="save-at-256",
                         faults=Faults(), storage_faults=[WriteFails(131, 6)], max_restarts=1)
    (failed,) = _of(run, ReportKind.CHECKPOINT, CheckpointReason.SAVE_FAILED)
    assert (failed["generation"], failed["step"], failed["ranks"]) == (0, 6, [131])
    assert failed["evidence"]["path"] == "/sim/ckpt/t0-s000000000006"
    assert "No space left on device" in failed["evidence"]["error"]
    assert (failed["evidence"]["policy"], failed["evidence"]["manifest"]) == ("on_checkpoint_error=stop", False)
    (finished,) = _of(run, ReportKind.FINISHED, FinishedReason.EXCEPTION)
    assert finished["step"] == 6 and "CheckpointSaveFailed" in finished["evidence"]["error"]
    (restart,) = _of(run, ReportKind.RESTART, generation=1)
    assert (restart["reason"], restart["step"], restart["evidence"]["failure"]) == (RestartReason.RESTORED, 4,
                                                                                   FailureClass.UNCERTAIN.value)
    assert {tuple(a.ended for a in attempts) for attempts in run.attempts} == {(AttemptEnd.SAVE_FAILED,
                                                                                AttemptEnd.FINISHED)}
    assert _trust(run, "t0/s6") is None, "never recorded, so never a candidate"
    assert run.files is not None and CheckpointId(0, 6) not in run.files.held[131]
    assert _trust(run, "t1/s6") is Trust.RECOVERY_VERIFIED, "the next attempt saves step 6 again"


def test_RECOVERY_7_on_missing_checkpoint_stop_refuses_on_every_rank_and_marks_nothing() -> None:
    run = run_replay_job(ranks=16, group_size=4, seed=3, steps=restarts.STEPS, scenario="refuse",
                         faults=Faults(sdc_rank=5, sdc_step=9, sdc_bit=1, attempt=0),
                         storage_faults=[FilesGone(1, 1, (2,))], max_restarts=1, on_missing_checkpoint="stop")
    assert {tuple(a.ended for a in attempts) for attempts in run.attempts} == {(AttemptEnd.STOPPED,
                                                                                AttemptEnd.REFUSED)}
    assert not _of(run, ReportKind.CHECKPOINT, CheckpointReason.LOST)
    (finished,) = _of(run, ReportKind.FINISHED, FinishedReason.EXCEPTION, generation=1)
    assert "FileNotFoundError" in finished["evidence"]["error"] and "rank(s) [2] lack it" in finished["evidence"]["error"]
    assert "on_missing_checkpoint=stop" in finished["evidence"]["error"]
    assert _trust(run, "t0/s6") is Trust.RECOVERY_VERIFIED


@pytest.mark.parametrize("name", ["restart-lost-checkpoint", "restart-nothing-left", "save-failed-stop",
                                  "save-failed-continue", "save-no-space", "manifest-failed", "saves-healthy"])
def test_the_restart_scenarios_hold_every_check(name: str) -> None:
    report = run_scenario(name, ScenarioParams(ranks=16, seed=5, group_size=4))
    assert report.ok, [(check.name, check.detail) for check in report.checks if not check.ok]


def test_the_restart_checks_fail_when_the_storage_fault_is_not_what_they_expect(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not vacuous: the same scenario with files that never go (the fault injected is not the one
    its checks expect) fails the checks that name the loss and the fallback."""
    monkeypatch.setattr(restarts, "FilesGone", lambda attempt, count, ranks: sim_storage.FilesGone(attempt, 0, ranks))
    report = run_scenario("restart-lost-checkpoint", ScenarioParams(ranks=16, seed=5, group_size=4))
    failed = [check.name for check in report.checks if not check.ok]
    assert not report.ok and any("marks exactly" in name for name in failed) and any("starts from" in name
                                                                                    for name in failed), failed


def test_FRAME_10_the_framework_resume_plan_is_a_rank_program_the_simulator_runs() -> None:
    """run_plan (scout/job/framework.py) on 8 simulated ranks: the newest captured checkpoint is
    missing on rank 3 and is lost, the next one's content is what the gate recorded: every rank
    gets the same plan."""
    config = GateConfig("plan", ["hidden.0"], ["dp"])
    newest, older = Artifact("huggingface", "/out/checkpoint-6", "d6"), Artifact("huggingface", "/out/checkpoint-4", "d4")
    state, _ = step(initial_state(config), CycleBoundary(2))
    state, _ = step(state, CheckpointCaptured(4, older))
    state, _ = step(state, CheckpointCaptured(6, newest))

    def program(ctx: Any) -> Any:
        driver = None
        if ctx.rank == 0:
            driver = GateDriver(GateWriter(MemoryRecorder(), state), Reporter(None, job_id="plan", generation=0,
                                                                             hosts=(), rank=0))
        plan = yield from framework.run_plan(
            driver, FailureClass.STRAGGLER if ctx.rank == 0 else None, rank=ctx.rank,
            exists=lambda path: not (ctx.rank == 3 and path == newest.path),
            digest=lambda path: {newest.path: "d6", older.path: "d4"}[path])
        return plan

    cluster = SimCluster(8, seed=1)
    cluster.spawn(program)
    plans = cluster.run().values()
    assert len(set(plans)) == 1
    (plan,) = set(plans)
    assert (plan.path, plan.step, plan.checkpoint, plan.failure) == (older.path, 4, CheckpointId(0, 4),
                                                                    FailureClass.STRAGGLER)
    assert plan.lost == ((CheckpointId(0, 6), "no checkpoint at /out/checkpoint-6 on rank(s) [3]"),)
