"""The overhead budget on real ranks (spec/budget.md): tests/job/budget_job.py -- the example GPT,
DDP, DCP checkpoints -- under ``torchrun`` with 4 gloo ranks, the cadence left to
``overhead_budget``. One job (module-scoped) is calibrated, runs two cycles at the cadence it
chose, then every rank's step grows by a quarter of a second (a new phase of training) and the
budget follows at a cycle boundary. What every rank saw of its cadence, what rank 0 reported and
what the gate certified are checked.

The budget is 50 % (its largest value) so that the cycles stay short enough for a test on a
loaded 2-core box; the decision rule itself is tests/unit/test_budget.py's."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import pytest

from scout import reports
from scout.job.config import Config
from scout.reports.timing import TIMING_FILE, read_timing
from scout.scenarios.launcher import launch, torchrun_command, torchrun_env

pytestmark = pytest.mark.torchdist

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "tests" / "job" / "budget_job.py"
RANKS = 4
LAYERS = 4  # the example GPT's
CALIBRATION_CYCLE = 2 * LAYERS  # BUDGET-5: one layer every 2 steps
CALIBRATION_STEPS = 3 * CALIBRATION_CYCLE  # BUDGET-12: 3 + 4 + 4 measured steps free of replay >= 8


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("budget")
    run_dir, checkpoint_dir = work / "run", work / "ckpt"
    env = torchrun_env()
    env.pop("SCOUT_REPLAY_INTERVAL_STEPS", None)  # BUDGET-8 off
    command = torchrun_command(JOB, RANKS, [run_dir, checkpoint_dir, "--budget", "0.5", "--cycles-after", "3",
                                            "--slow-after-cycles", "2", "--slow-s", "0.25", "--steps-max", "400"])
    run = launch(command, env, cwd=work, timeout_s=600)
    assert run.returncode == 0, run.stderr[-4000:]
    return {"run": run, "records": reports.read_records(run_dir / reports.REPORTS_FILE),
            "timing": read_timing(run_dir / TIMING_FILE).records,
            "ranks": [json.loads((run_dir / f"rank{r}.json").read_text()) for r in range(RANKS)]}


def test_BUDGET_5_every_rank_switches_to_the_same_cadence_at_the_same_step(job: dict[str, Any]) -> None:
    ranks = job["ranks"]
    assert all(r["changes"] == ranks[0]["changes"] for r in ranks), [r["changes"] for r in ranks]
    assert all(r["decisions"] == ranks[0]["decisions"] for r in ranks)
    calibrating, calibrated, *later = ranks[0]["changes"]
    # The calibration window: one layer every 2 steps from the start, one cycle of 2 x layers steps.
    assert (calibrating["interval_steps"], calibrating["lanes"], calibrating["origin_step"],
            calibrating["cycle_steps"]) == (2, 1, 0, CALIBRATION_CYCLE)
    # Decided at its end (BUDGET-12: its third cycle's), in effect from there: the schedule counts
    # from that boundary.
    assert calibrated["step"] == calibrated["origin_step"] == CALIBRATION_STEPS
    first = ranks[0]["decisions"][0]
    assert (calibrated["interval_steps"], calibrated["lanes"], calibrated["cycle_steps"]) == (
        first["interval_steps"], first["lanes"], first["cycle_steps"])
    assert calibrated["digest"] != calibrating["digest"] or calibrated["cycle_steps"] == CALIBRATION_CYCLE


def test_BUDGET_6_a_longer_step_moves_the_cadence_at_a_cycle_boundary(job: dict[str, Any]) -> None:
    changes, slow_from = job["ranks"][0]["changes"], job["ranks"][0]["slow_from"]
    assert slow_from is not None and len(job["ranks"][0]["decisions"]) == len(changes) - 1 >= 2, changes
    # Every change at a boundary of the cadence before it, and only when the cycle at least halves
    # or doubles (BUDGET-6). A loaded box may move it again after the slow phase's first change.
    for before, after in itertools.pairwise(changes[1:]):
        assert after["step"] == after["origin_step"], changes
        assert (after["step"] - before["origin_step"]) % before["cycle_steps"] == 0, changes
        assert (2 * after["cycle_steps"] <= before["cycle_steps"]
                or after["cycle_steps"] >= 2 * before["cycle_steps"]), changes
    # The slow phase moved it: a cycle at most half as long as the calibrated one, after it began.
    first_slow = next(change for change in changes[2:] if change["step"] > slow_from)
    assert 2 * first_slow["cycle_steps"] <= changes[1]["cycle_steps"], changes


def test_BUDGET_7_rank_0_reports_each_cadence_and_what_it_buys(job: dict[str, Any]) -> None:
    cadence = [r for r in job["records"] if r["kind"] == "cadence"]
    assert [r["reason"] for r in cadence] == ["calibrated"] + ["recalibrated"] * (len(cadence) - 1), cadence
    assert len(cadence) >= 2, cadence  # the slow phase's change at least (BUDGET-6)
    changes = job["ranks"][0]["changes"]
    for record, change in zip(cadence, changes[1:], strict=True):
        evidence = record["evidence"]
        assert record["step"] == change["step"] and record["reporter_rank"] == 0 and record["ranks"] == []
        assert (evidence["interval_steps"], evidence["lanes"], evidence["cycle_steps"]) == (
            change["interval_steps"], change["lanes"], change["cycle_steps"])
        assert evidence["sdc_detection_steps"] == evidence["cycle_steps"] == evidence["verified_after_steps"]
        assert evidence["checkpoint_every_steps"] == evidence["cycle_steps"]  # checkpoint_every_cycles=1
        assert evidence["status"] == "within" and evidence["share"] <= evidence["overhead_budget"] == 0.5
        assert len(evidence["measured"]) == RANKS and all(m is not None for m in evidence["measured"])
        assert evidence["set_by"] == "overhead_budget" and evidence["replay_rows"] == 1
    assert cadence[1]["evidence"]["previous"]["cycle_steps"] == changes[1]["cycle_steps"]
    said = [line for line in job["run"].stderr.splitlines() if line.startswith("scout: replay cadence")]
    assert len(said) == len(cadence) and "(set by overhead_budget)" in said[0] and f"[calibrated at step {CALIBRATION_STEPS}" in said[0], said


def _each_decision_sets(job: dict[str, Any], seen_key: str, evidence_key: str, *, interval_s: float,
                        steps_max: int) -> list[dict[str, Any]]:
    """BUDGET-11, BUDGET-13: the interval starts at its setting's 10 steps (the calibration
    window) and each decision sets ``max(10, min(steps_max, ceil(interval_s / T)))`` from the
    slowest rank's ``T``, as rank 0 saw it and as its ``cadence`` report says; rank 0's changes."""
    changes: list[dict[str, Any]] = job["ranks"][0]["changes"]
    cadence = [r for r in job["records"] if r["kind"] == "cadence"]
    assert changes[0][seen_key] == 10
    for record, change in zip(cadence, changes[1:], strict=True):
        slowest_s = max(measured["step_s"] for measured in record["evidence"]["measured"])
        expected = max(10, min(steps_max, math.ceil(interval_s / slowest_s)))
        assert change[seen_key] == record["evidence"][evidence_key] == expected, (record, change)
    return changes


def test_BUDGET_11_each_decision_sets_the_loop_checks_interval_from_the_slowest_ranks_step(
        job: dict[str, Any]) -> None:
    # loop_check_interval_s at its default, 5 s: on this box ~100 steps of the first phase (~50 ms),
    # ~17 in the slow one (+0.25 s a step).
    assert Config().loop_check_interval_s == 5.0
    changes = _each_decision_sets(job, "loop_check_steps", "loop_check_steps", interval_s=5.0, steps_max=256)
    # Rank 0's loop checks ran at the multiples of the interval in force (set at a decision's
    # step, so from the step after it), the same steps on every rank or none would have a line.
    loops = [r["step"] for r in job["timing"] if r["kind"] == "loop"]
    assert loops, job["timing"]
    for step in loops:
        in_force = [c for c in changes if c["step"] < step][-1]
        assert step % in_force["loop_check_steps"] == 0, (step, changes)
    said = [line for line in job["run"].stderr.splitlines() if line.startswith("scout: replay cadence")]
    assert all(f"loop-straggler check every {c['loop_check_steps']} steps" in line
               for line, c in zip(said, changes[1:], strict=True)), said


def test_BUDGET_13_GUARD_4_each_decision_spaces_the_agreements_by_the_slowest_ranks_step(
        job: dict[str, Any]) -> None:
    # agreement_interval_s = 5 s: ~100 steps of the first phase (~50 ms), ~17 in the slow one.
    changes = _each_decision_sets(job, "agreement_steps", "agreement_interval_steps", interval_s=5.0,
                                  steps_max=1_000_000)
    # Every rank launched its agreements at the same steps (a launch no peer joins would time out),
    # each where the interval in force after that step's decision says: s + 1 a multiple of it.
    launches = job["ranks"][0]["agreement_launches"]
    assert launches and all(rank["agreement_launches"] == launches for rank in job["ranks"]), launches
    for step in launches:
        in_force = [c for c in changes if c["step"] <= step][-1]
        assert (step + 1) % in_force["agreement_steps"] == 0, (step, changes)
    assert any(change["agreement_steps"] != 10 for change in changes), changes  # a decision moved it
    said = [line for line in job["run"].stderr.splitlines() if line.startswith("scout: replay cadence")]
    assert all(f"agreement on scout's own failures every {c['agreement_steps']} steps" in line
               for line, c in zip(said, changes[1:], strict=True)), said


def test_BUDGET_14_every_rank_finds_the_same_steps_quiet_and_each_had_nothing_due(job: dict[str, Any]) -> None:
    """BUDGET-14: the quiet path is taken at the same steps on every rank, at exactly the steps
    where no cycle ends, no check is due and no agreement is collected or launched -- and those are
    most of a job's steps (the rest of this module checks that the cadences, the agreements and the
    gate's certificates are what they were)."""
    ranks = job["ranks"]
    quiet = ranks[0]["quiet_steps"]
    assert all(rank["quiet_steps"] == quiet for rank in ranks)
    changes, last = ranks[0]["changes"], ranks[0]["last_step"]
    launches = set(ranks[0]["agreement_launches"])
    due = {step for steps in ranks[0]["due_steps"].values() for step in steps}

    def cycle_end(step: int) -> bool:
        in_force = [c for c in changes if c["step"] < step][-1]  # a decision at step s holds from s + 1
        return (step - in_force["origin_step"]) % in_force["cycle_steps"] == 0

    # Every agreement launched at s is collected at s + 1.
    expected = [s for s in range(1, last + 1)
                if not cycle_end(s) and s not in due and s not in launches and s - 1 not in launches]
    assert quiet == expected, sorted(set(quiet) ^ set(expected))
    assert len(quiet) > last / 2, (len(quiet), last)


def test_BUDGET_5_GATE_1_the_gate_certifies_checkpoints_taken_at_the_chosen_cadence(job: dict[str, Any]) -> None:
    records, changes = job["records"], job["ranks"][0]["changes"]
    assert not [r for r in records if r["kind"] in ("unchecked", "sdc")], records
    verified = [int(r["evidence"]["checkpoint"].split("/s")[1]) for r in records
                if r["kind"] == "checkpoint" and r["reason"] == "recovery-verified"]
    calibrated, recalibrated = changes[1], changes[2]
    # A checkpoint captured at a boundary of each chosen cadence became recovery-verified.
    for change, until in ((calibrated, recalibrated["step"]), (recalibrated, job["ranks"][0]["last_step"])):
        at_its_boundaries = [s for s in verified if change["origin_step"] < s <= until
                             and (s - change["origin_step"]) % change["cycle_steps"] == 0]
        assert at_its_boundaries, (verified, changes)
