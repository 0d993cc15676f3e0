"""spec/budget.md BUDGET-14: a quiet step -- no cycle ends, no check that is on is due, no
agreement is collected or launched -- runs only its bookkeeping in ``job.step()``. Here, in one
process: which steps the pipeline and the agreement find quiet (exhaustively over a range of
steps and cadences), the checks' step-keeping under GUARD-3, and ``Job.step`` taking the quiet path
at exactly those steps. On real ranks (the same steps on every rank, each with nothing due):
tests/job/test_budget_torchrun.py."""

from __future__ import annotations

import itertools
import time
from collections.abc import Generator, Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from scout.job import stepping
from scout.job.attach import Job
from scout.job.boundary import Agreement, GuardedJob, agreement_due
from scout.job.checks import CanaryCheck
from scout.job.gate_driver import Reporter
from scout.job.pipeline import CheckOutput, Layout, Pipeline, run_step
from scout.reports.guard import Boundary, Part
from scout.reports.hook_time import HOOK_TIME

LAYOUT = Layout.of([(0,)], ["dp"], 0)


class Check:
    """A check due every ``every`` steps, that records its step-keeping."""

    def __init__(self, name: str, every: int, *, keeps_steps: bool = True, error: Exception | None = None) -> None:
        self.name, self.every, self.error = name, every, error
        self.layout = LAYOUT
        self.kept: list[int] = []
        if keeps_steps:
            self.quiet_step = self._keep

    def gate_recipes(self) -> list[Any]:
        return []

    def due(self, step: int) -> bool:
        return step % self.every == 0

    def _keep(self, step: int) -> None:
        if self.error is not None:
            raise self.error
        self.kept.append(step)

    def run(self, step: int) -> Generator[Any, Any, CheckOutput | None]:
        return None
        yield

    def resume_at(self, step: int) -> None:
        pass

    def step_begins(self) -> None:
        pass

    def straggler_trackers(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass


def _pipeline(checks: Sequence[Any], cycle_steps: int, origin_step: int = 0) -> Pipeline:
    pipeline = Pipeline(checks, rank=0, world_size=1, hosts=("h",), groups=[(0,)], on_sdc="report",
                        cycle_steps=cycle_steps, checkpoint_every_cycles=1,
                        reporter=Reporter(None, job_id="job", generation=0, hosts=("h",), rank=0), gate=None,
                        timeout_s=1.0, boundary=Boundary(rank=0))
    pipeline.set_cycle(cycle_steps, origin_step)
    return pipeline


@pytest.mark.parametrize(("cycle_steps", "origin_step", "replay_every", "loop_every"),
                         list(itertools.product((0, 4, 6), (0, 3), (2, 5), (7, 1_000_000))))
def test_BUDGET_14_a_step_is_quiet_exactly_where_no_cycle_ends_and_no_check_that_is_on_is_due(
        cycle_steps: int, origin_step: int, replay_every: int, loop_every: int) -> None:
    replay, loop = Check("replay", replay_every), Check("loop", loop_every)
    pipeline = _pipeline([replay, loop], cycle_steps, origin_step)
    for step in range(origin_step + 1, origin_step + 61):
        cycle_end = cycle_steps > 0 and (step - origin_step) % cycle_steps == 0
        assert pipeline.quiet(step) is (not cycle_end and step % replay_every != 0 and step % loop_every != 0), step
    # GUARD-4: a check that is off is not run, so its due steps no longer keep a step busy.
    assert pipeline.boundary is not None
    pipeline.boundary.off[Part.REPLAY] = origin_step
    for step in range(origin_step + 1, origin_step + 61):
        cycle_end = cycle_steps > 0 and (step - origin_step) % cycle_steps == 0
        assert pipeline.quiet(step) is (not cycle_end and step % loop_every != 0), step


def test_BUDGET_14_the_full_path_at_a_quiet_step_runs_no_collective_either() -> None:
    """A rank with fault injection on takes the full path at every step: at the steps the others
    find quiet, its pipeline yields no transport op (no exchange), so it keeps in step with them."""
    pipeline = _pipeline([Check("replay", 4), Check("loop", 10)], cycle_steps=12)
    quiet = [step for step in range(1, 49) if pipeline.quiet(step)]
    assert quiet and len(quiet) < 48
    for step in quiet:
        program = run_step(pipeline, step)
        with pytest.raises(StopIteration) as done:
            next(program)
        assert done.value.value.checkpoint_due is False and done.value.value.stop is None


def test_BUDGET_14_a_check_without_step_keeping_of_its_own_makes_no_step_quiet() -> None:
    pipeline = _pipeline([Check("replay", 1_000), Check("loop", 1_000, keeps_steps=False)], cycle_steps=0)
    assert not any(pipeline.quiet(step) for step in range(1, 100))


def test_BUDGET_14_GUARD_3_a_check_whose_step_keeping_raises_is_recorded_and_the_others_keep_theirs() -> None:
    broken, loop = Check("replay", 1_000, error=RuntimeError("runner broke")), Check("loop", 1_000)
    pipeline = _pipeline([broken, loop], cycle_steps=0)
    pipeline.quiet_step(3)
    assert loop.kept == [3]
    assert pipeline.boundary is not None
    (failure,) = pipeline.boundary.failures([Part.REPLAY])
    assert (failure.error_type, failure.where) == ("RuntimeError", "job.step")


@pytest.mark.parametrize("interval_steps", [1, 5, 7])
def test_BUDGET_14_GUARD_4_no_step_is_quiet_that_collects_or_launches_an_agreement(interval_steps: int) -> None:
    agreement = Agreement(SimpleNamespace(), Boundary(rank=0), 1.0, interval_steps)  # type: ignore[arg-type]
    guarded = GuardedJob(Boundary(rank=0), agreement, _pipeline([], cycle_steps=0), rank=0, ops=None)
    for step in range(1, 40):
        assert guarded.quiet(step) is not agreement_due(step, interval_steps), step
    agreement._pending = (SimpleNamespace(), None)  # type: ignore[assignment]  # launched: the next step collects it
    assert not any(guarded.quiet(step) for step in range(1, 40))
    agreement._pending, agreement.stopped = None, True  # GUARD-7: no agreement any more on this rank
    assert all(guarded.quiet(step) for step in range(1, 40))


def test_BUDGET_14_CANARY_the_canary_is_due_at_its_cycles_ends_counted_from_their_origin() -> None:
    """The canary's ``due`` and ``run`` agree on its steps after a decision moved the origin (BUDGET-5):
    GUARD-3's empty output at a due step keeps the exchange's shape only where they agree, and
    BUDGET-14's quiet steps are those where it is not due."""
    canary = CanaryCheck(SimpleNamespace(), LAYOUT, cycle_steps=8)  # type: ignore[arg-type]
    canary.origin_step = 18
    assert [step for step in range(19, 60) if canary.due(step)] == [26, 34, 42, 50, 58]
    for step in range(19, 60):
        if not canary.due(step):
            program = canary.run(step)
            with pytest.raises(StopIteration) as done:
                next(program)
            assert done.value.value is None, step


def _job(pipeline: Pipeline, guarded: Any, calibration: Any,
         monkeypatch: pytest.MonkeyPatch) -> tuple[Job, list[str]]:
    """A Job over ``pipeline`` without torch.distributed: the full path is recorded, not run."""
    calls: list[str] = []
    job = Job.__new__(Job)
    job.pipeline, job.guarded = pipeline, guarded
    job.boundary = Boundary(rank=0)
    job._closed = job._leaving = job._said_left = False
    job._started, job._step, job.checkpoint_due = True, 0, True
    job.parts = SimpleNamespace(calibration=calibration, idle_loops=SimpleNamespace(awake=_awake(calls)))

    def full_path(of: Job) -> None:
        of._step += 1
        calls.append(f"full {of._step}")

    monkeypatch.setattr(stepping, "full_step", full_path)
    return job, calls


def _awake(calls: list[str]) -> Any:
    import contextlib

    @contextlib.contextmanager
    def awake() -> Any:
        calls.append("awake")
        yield

    return awake


def test_BUDGET_14_job_step_takes_the_quiet_path_exactly_at_the_quiet_steps_and_measures_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    replay, loop = Check("replay", 4), Check("loop", 10)
    pipeline = _pipeline([replay, loop], cycle_steps=12)
    agreement = Agreement(SimpleNamespace(), Boundary(rank=0), 1.0, 7)  # type: ignore[arg-type]
    marks: list[int] = []
    guarded = SimpleNamespace(quiet=GuardedJob(Boundary(rank=0), agreement, pipeline, rank=0, ops=None).quiet,
                              step_ended=marks.append)
    ended: list[tuple[int, float]] = []
    calibration = SimpleNamespace(step_ended=lambda step, scout_s: ended.append((step, scout_s)))
    job, calls = _job(pipeline, guarded, calibration, monkeypatch)
    hooks_s = 0.003
    for step in range(1, 37):
        HOOK_TIME.take_s()
        HOOK_TIME.spent_ns += round(hooks_s * 1e9)  # the training phase's hooks (BUDGET-10)
        started = time.perf_counter()
        job.step()
        spent_s = time.perf_counter() - started
        quiet = step % 4 and step % 10 and step % 12 and not agreement_due(step, 7)
        if quiet:
            assert calls[-1:] != [f"full {step}"] and marks[-1] == step and loop.kept[-1] == replay.kept[-1] == step
            (at, scout_s), = ended[-1:]
            assert at == step and hooks_s <= scout_s <= hooks_s + spent_s  # BUDGET-3: its time and its hooks'
            assert HOOK_TIME.take_s() == 0.0 and job.checkpoint_due is False
            assert job.boundary.step == step + 1
        else:
            assert calls[-2:] == ["awake", f"full {step}"], (step, calls)  # WAIT-5's wake-up, then the full path
        assert job._step == step
    quiet_steps = [s for s in range(1, 37) if s % 4 and s % 10 and s % 12 and not agreement_due(s, 7)]
    assert replay.kept == loop.kept == marks == quiet_steps and len(ended) == len(quiet_steps)


def test_BUDGET_14_GUARD_1_a_failure_in_the_quiet_path_or_its_decision_never_reaches_training(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A check whose ``due`` raises sends the step to the full path (whose boundary, GUARD-7,
    reports it); the budget's measurement raising at a quiet step is GUARD-7's control failure, as
    inside the full path's control work -- ``job.step()`` returns either way."""
    broken = Check("replay", 1_000)

    def due(step: int) -> bool:
        raise RuntimeError("a schedule broke")

    broken.due = due  # type: ignore[method-assign]
    failed: list[tuple[str, int]] = []
    guarded = SimpleNamespace(quiet=lambda step: True, step_ended=lambda step: None,
                              control_failed=lambda error, step: failed.append((str(error), step)))

    def measure(step: int, scout_s: float) -> None:
        raise ValueError("a meter broke")

    job, calls = _job(_pipeline([broken], cycle_steps=0), guarded, SimpleNamespace(step_ended=measure), monkeypatch)
    job.step()
    assert calls == ["awake", "full 1"] and failed == []
    job.pipeline = _pipeline([Check("replay", 1_000)], cycle_steps=0)
    job.step()
    assert calls == ["awake", "full 1"] and failed == [("a meter broke", 2)] and job._step == 2
