"""scout never kills training (spec/guard.md), on real ranks: 4 forked gloo ranks train a DDP
model with ``scout.attach`` (tests/job/guard_job.py) while ``SCOUT_TEST_INJECT`` makes parts of
scout raise on one rank each. Every rank must train to its last step with no collective left
waiting (a mismatched one would wait ``collective_timeout_s`` = 30 s), ``reports.jsonl`` must say
what failed -- part, rank, step -- and each part must be off on every rank from one step.

One job serves the non-slow tests (six parts: the completion thread, DDP's hook, a layer hook, a
loop hook, the gate's writer, replay); the other parts, the control group's own failure
(GUARD-7) and the issue's pipeline-stage layout are in the slow tier."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from scout import reports
from scout.job.boundary import off_step
from scout.reports.summary import load_run, summary_text
from tests import processes

pytestmark = pytest.mark.torchdist

REPO = Path(__file__).resolve().parents[2]
WORLD = 4
#: The collective timeout of the jobs: a collective left waiting makes a step at least this long.
TIMEOUT_S = 30.0


def _job(directory: Path, *, steps: int, inject: str, **kwargs: Any) -> dict[str, Any]:
    """Run tests/job/guard_job.py on WORLD ranks; every rank's payload, the reports, the summary."""
    out = directory / "ranks.json"
    completed = processes.run_forked(
        "tests.replay._launch:main",
        ["tests.job.guard_job:main", str(WORLD), json.dumps({"steps": steps, "directory": str(directory), **kwargs}),
         str(out)],
        cwd=REPO, env=dict(os.environ, OMP_NUM_THREADS="1", SCOUT_TEST_RANK_DEADLINE_S="240",
                           SCOUT_TEST_INJECT=inject), timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = json.loads(out.read_text())
    statuses = {rank: entry["status"] for rank, entry in result["ranks"].items()}
    assert not result["late_ranks"] and set(statuses.values()) == {"ok"}, (result, completed.stderr[-3000:])
    ranks = [result["ranks"][str(rank)]["payload"] for rank in range(WORLD)]
    run_dir = directory / "run"
    return {"ranks": ranks, "records": reports.read_records(run_dir / reports.REPORTS_FILE),
            "summary": summary_text(load_run(run_dir)), "stderr": completed.stderr,
            "checkpoints": sorted(path.name for path in (directory / "ckpt").glob("t*"))}


def _errors(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The ``internal_error`` reports by part (one each)."""
    found: dict[str, dict[str, Any]] = {}
    for record in job["records"]:
        if record["kind"] == "internal_error":
            assert record["evidence"]["part"] not in found, record
            found[record["evidence"]["part"]] = record
    return found


def _trained_to_the_end(job: dict[str, Any], steps: int, slowest_s: float = TIMEOUT_S / 2) -> None:
    """GUARD-1: every rank trained every step and no step waited on a collective left waiting."""
    assert [rank["last_step"] for rank in job["ranks"]] == [steps] * WORLD
    assert max(rank["slowest_step_s"] for rank in job["ranks"]) < slowest_s, job["ranks"]


def _replicas_equal(job: dict[str, Any], groups: tuple[tuple[int, ...], ...] = (tuple(range(WORLD)),)) -> None:
    """Every DDP replica ends with the same parameters: each gradient bucket was averaged."""
    for group in groups:
        assert len({job["ranks"][rank]["parameters"] for rank in group}) == 1, job["ranks"]


def _off_alike(job: dict[str, Any]) -> dict[str, int]:
    """GUARD-4: the same parts off from the same steps on every rank; that map."""
    offs = [rank["parts_off"] for rank in job["ranks"]]
    assert all(off == offs[0] for off in offs), offs
    return dict(offs[0])


# -- six parts fail in one job ----------------------------------------------------------------

STEPS = 14
#: The six parts' job agrees every 3 steps (GUARD-4's agreement_interval_steps; the slow tier's
#: jobs every step): each part is off from the multiple of 3 after the step it failed in.
AGREE_EVERY = 3
#: point, step, rank: the step each fires at (a hook fires in that step's training phase).
INJECTED = (("completion.poll", 2, 3), ("ddp_hook.bucket", 4, 1), ("instrumentation.layer_hook", 5, 2),
            ("loop.forward_hook", 6, 3), ("gate.feed", 10, 0), ("replay.prepare", 11, 1))


@pytest.fixture(scope="module")
def six(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _job(tmp_path_factory.mktemp("guard"), steps=STEPS,
                inject=",".join(f"{point}@{step}:{rank}" for point, step, rank in INJECTED),
                settings={"agreement_interval_steps": AGREE_EVERY})


def test_GUARD_1_every_rank_trains_to_its_last_step_while_six_parts_of_scout_fail(six: dict[str, Any]) -> None:
    _trained_to_the_end(six, STEPS)
    _replicas_equal(six)  # DDP's hook failed on rank 1 at step 4, and still averaged every bucket
    # The user's own failing collective, called through scout's wrapper, reached the user as it
    # was raised (torch's TypeError for an unknown reduce op), on every rank.
    assert all(rank["user_error"].startswith("TypeError: ") for rank in six["ranks"]), six["ranks"]
    # A failure is never evidence against a rank, and nothing here left a replay unchecked.
    assert not [r for r in six["records"] if r["kind"] in ("unchecked", "sdc")], \
        [reports.record_line(r) for r in six["records"]]


def test_GUARD_3_GUARD_5_each_failure_is_one_internal_error_report_naming_its_part_rank_and_step(
    six: dict[str, Any],
) -> None:
    errors = _errors(six)
    assert set(errors) == {point.split(".")[0] for point, _, _ in INJECTED}
    for point, step, rank in INJECTED:
        part = point.split(".")[0]
        record = errors[part]
        evidence = record["evidence"]
        assert (record["reason"], record["ranks"], record["source"]) == (f"{part}-failed", [rank], "job"), record
        assert (evidence["error_type"], evidence["count"]) == ("InjectedFailure", 1), record
        assert f"injected at {point} on rank {rank}" in evidence["message"]
        assert 0 < len(evidence["frames"]) <= 5 and evidence["consequence"], record
        if part == "completion":  # the watcher's thread polls on its own clock: at the step or after
            assert record["step"] >= step and evidence["off_step"] > record["step"], record
        else:  # recorded in the step it happened in, off on every rank from the next agreement
            assert (record["step"], evidence["off_step"]) == (step, off_step(step, AGREE_EVERY)), record
    where = {part: record["evidence"]["where"] for part, record in errors.items()}
    assert where == {"completion": "completion thread", "ddp_hook": "ddp comm hook", "instrumentation": "layer hook",
                     "loop": "forward hook", "gate": "job.step", "replay": "job.step"}


def test_GUARD_4_each_part_is_off_from_the_same_step_on_every_rank(six: dict[str, Any]) -> None:
    off = _off_alike(six)
    assert off == {part: record["evidence"]["off_step"] for part, record in _errors(six).items()}
    # The loop check ran (every loop_check_steps = 2) until its part was off, and never after.
    finished = [r for r in six["records"] if r["kind"] == "finished"]
    assert [r["evidence"]["parts_off"] for r in finished] == [off]


def test_GUARD_6_nothing_is_certified_or_saved_after_the_gate_stopped(six: dict[str, Any]) -> None:
    """A cycle is 3 steps (3 hidden layers, one a step) and a checkpoint comes at every cycle end:
    s3 and s6 are verified before the gate's writer fails at step 10, s9 stays a candidate, and no
    checkpoint is saved after it (none at step 12)."""
    trust = [(r["evidence"]["checkpoint"], r["reason"]) for r in six["records"] if r["kind"] == "checkpoint"]
    assert trust == [("t0/s3", "candidate"), ("t0/s3", "recovery-verified"), ("t0/s6", "candidate"),
                     ("t0/s6", "recovery-verified"), ("t0/s9", "candidate")], trust
    assert six["checkpoints"] == ["t0-s000000000003", "t0-s000000000006", "t0-s000000000009"]


def test_GUARD_8_scout_report_names_every_part_that_is_off(six: dict[str, Any]) -> None:
    summary = six["summary"]
    assert "scout parts off after errors of their own (training went on; spec/guard.md):" in summary, summary
    for point, _, rank in INJECTED:
        part = point.split(".")[0]
        assert any(line.strip().startswith(part) and f"rank(s) [{rank}]" in line for line in summary.splitlines()), \
            (part, summary)
    assert "restore would use: t0/s6" in summary and "no fault reported" in summary


# -- the slow tier: every other part, the control group, the issue's layout ---------------------


@pytest.mark.slow
def test_GUARD_2_GUARD_6_GATE_40_the_checkpoint_path_a_check_after_its_exchange_the_canary_and_ops_fail(
    tmp_path: Path,
) -> None:
    """At step 3's save rank 0's free-space check and then the gate's record of the capture
    raise: the save goes ahead without the check, the record's failure is a ``save-failed``
    checkpoint report (on_checkpoint_error = continue) and the gate is off -- nothing more is
    saved. Then the loop check after its exchange, a publish of the instrumentation, the canary
    after its exchange, the ops stats and replay after its round fail, one rank each."""
    injected = (("checkpoint.space", 3, 0), ("gate.capture", 3, 0), ("loop.check", 4, 1),
                ("instrumentation.publish", 5, 1), ("canary.check", 6, 1), ("ops.after_step", 7, 2),
                ("replay.report", 8, 3))
    job = _job(tmp_path, steps=12, inject=",".join(f"{p}@{s}:{r}" for p, s, r in injected),
               settings={"canary": True, "on_report": "true", "on_checkpoint_error": "continue"})
    _trained_to_the_end(job, 12)
    errors = _errors(job)
    assert set(errors) == {point.split(".")[0] for point, _, _ in injected}
    for point, step, rank in injected:
        record = errors[point.split(".")[0]]
        assert (record["step"], record["ranks"], record["evidence"]["off_step"]) == (step, [rank], step + 1), record
    assert _off_alike(job) == {part: record["evidence"]["off_step"] for part, record in errors.items()}
    (failed,) = [r for r in job["records"] if r["kind"] == "checkpoint"]
    assert (failed["reason"], failed["step"], failed["evidence"]["manifest"]) == ("save-failed", 3, True), failed
    assert failed["evidence"]["policy"] == "on_checkpoint_error=continue"
    assert job["checkpoints"] == ["t0-s000000000003"], "saved, never recorded, and nothing after the gate stopped"


@pytest.mark.slow
def test_GUARD_7_the_merge_fails_then_the_control_group_and_scout_goes_quiet_on_every_rank(tmp_path: Path) -> None:
    """A capture hook fails (replay off, nothing certified from then), the merge of the step's
    results fails on rank 2 (every check and the gate off), then rank 1 breaks its own sequence of
    control collectives: it stops agreeing at once, and the others find the agreement missing at
    their next step, after collective_timeout_s (6 s here), and go quiet too. Training goes on."""
    injected = "replay.capture@2:1,aggregate.merge@5:2,control.exchange@9:1"
    job = _job(tmp_path, steps=12, inject=injected, settings={"collective_timeout_s": 6.0})
    _trained_to_the_end(job, 12, slowest_s=6.0 + 5.0)
    errors = _errors(job)
    assert (errors["replay"]["step"], errors["replay"]["evidence"]["where"]) == (2, "forward hook")
    # The loop check runs every 2 steps: the merge's first run at or after step 5 is step 6.
    assert (errors["aggregate"]["step"], errors["aggregate"]["evidence"]["off_step"]) == (6, 7)
    offs = [rank["parts_off"] for rank in job["ranks"]]
    assert [off["control"] for off in offs] == [10, 9, 10, 10], offs
    assert all(off["aggregate"] == 7 and off["loop"] == 7 and off["gate"] == 7 and off["replay"] == 3
               for off in offs), offs
    assert errors["control"]["ranks"] == [0] and errors["control"]["evidence"]["error_type"] == "ControlFailed"
    assert job["checkpoints"] == [], "replay was off from step 3: no checkpoint could ever be verified"


@pytest.mark.slow
def test_GUARD_2_a_cycle_boundary_of_the_gate_and_the_optimizer_capture_hook_fail(tmp_path: Path) -> None:
    injected = (("gate.boundary", 4, 0), ("replay.optimizer_hook", 7, 2))
    job = _job(tmp_path, steps=12, inject=",".join(f"{p}@{s}:{r}" for p, s, r in injected))
    _trained_to_the_end(job, 12)
    errors = _errors(job)
    # The gate takes a boundary at each cycle end (every 3 steps), the optimizer capture hook
    # fires at the steps an optimizer recipe is due (a cycle's last step).
    assert (errors["gate"]["step"], errors["gate"]["evidence"]["off_step"]) == (6, 7), errors["gate"]
    assert (errors["replay"]["step"], errors["replay"]["evidence"]["where"]) == (9, "optimizer hook")
    assert _off_alike(job) == {"gate": 7, "replay": 10}
    assert job["checkpoints"] == ["t0-s000000000003"], "the save at step 6 was refused: the writer had stopped"


@pytest.mark.slow
def test_GUARD_1_the_issues_pipeline_stages_layout_trains_on_when_the_gate_meets_a_recipe_it_does_not_know(
    tmp_path: Path,
) -> None:
    """Issue 36: two groups of replicas, the first without an output head (a pipeline's stage 0).
    Rank 0's gate was configured with its own recipes, so the head's results from the other
    group raised ``KeyError: 'output'`` inside ``job.step()`` and ended the job. Whatever the
    gate learns of stages, no rank may stop: an error there is a report and the gate is off."""
    job = _job(tmp_path, steps=8, inject="", stages=True)
    _trained_to_the_end(job, 8)
    _replicas_equal(job, ((0, 1), (2, 3)))
    errors = _errors(job)
    assert set(errors) <= {"gate"}, errors
    if errors:
        evidence = errors["gate"]["evidence"]
        assert (evidence["error_type"], evidence["message"]) == ("KeyError", "'output'"), evidence
        assert any("groups_of" in frame for frame in evidence["frames"]), evidence
        assert _off_alike(job) == {"gate": evidence["off_step"]}
