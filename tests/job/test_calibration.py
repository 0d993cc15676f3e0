"""scout/job/calibration.py in one process (spec/budget.md BUDGET-5, BUDGET-7..BUDGET-9): a real
replayer (the small model of tests/replay/test_replay_local.py, four scripted peers that agree),
the real pipeline and checks, a clock the test moves and an exchange the test answers. What the
calibration does at an attempt's start and at cycle ends is checked: the schedules, the
pipeline's cycle, what rank 0 reports, and that an explicit cadence exchanges nothing.
tests/job/test_budget_torchrun.py runs the same on real ranks."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from scout.core.budget import CALIBRATION, Cadence
from scout.job.calibration import Calibration
from scout.job.checks import LoopStragglerCheck, ReplayCheck
from scout.job.config import load_config
from scout.job.gate_driver import Reporter
from scout.job.pipeline import Layout, Pipeline, run_step
from scout.replay.arrival import LoopConfig, LoopTimer
from tests.replay.test_replay_local import ScriptedPeers, _setup, _train_step

LAYERS = 2  # the small model's hidden layers


class ListSink:
    def __init__(self) -> None:
        self.records: list[Mapping[str, Any]] = []

    def write(self, record: Mapping[str, Any]) -> None:
        self.records.append(record)

    def exclude_hosts(self, hosts: Sequence[str]) -> None:
        pass

    def timing(self, record: Mapping[str, Any]) -> None:
        pass


class OnePeer:
    position, size, ranks = 0, 1, (0,)


class Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


class Job:
    """The parts of a job the calibration drives, stepped by the test: each step trains, runs the
    pipeline (no exchange: one group), then tells the calibration how long the step took."""

    def __init__(self, gathered: Any = None, **settings: Any) -> None:
        self.model, self.optimizer, replayer = _setup(ScriptedPeers())
        layout = Layout.of([(0, 1, 2, 3)], ("dp",), 0)
        self.check = ReplayCheck("replay", replayer, layout, ("host",) * 4)
        self.sink = ListSink()
        reporter = Reporter(self.sink, job_id="calibration-test", generation=0, hosts=("host",) * 4, rank=0)
        self.pipeline = Pipeline([self.check], rank=0, world_size=4, hosts=("host",) * 4, groups=[(0, 1, 2, 3)],
                                 on_sdc="report", cycle_steps=2 * LAYERS, checkpoint_every_cycles=1,
                                 reporter=reporter, gate=None, timeout_s=10.0)
        self.config = load_config(None, settings, environ={})
        self.gathers: list[Any] = []
        self.gathered = gathered
        self.clock = Clock()
        # BUDGET-11: a loop check for the calibration to set (the pipeline does not run it here).
        self.loop = LoopStragglerCheck(LoopTimer(OnePeer(), LoopConfig(check_every_steps=self.config.loop_check_steps)),
                                       layout, ("host",) * 4)
        self.calibration = Calibration([self.loop, self.check], self.pipeline, config=self.config, all_gather=self.gather,
                                       reporter=reporter, rank=0, checkpoints=True, clock=self.clock)
        self.step = 0

    def gather(self, value: Any) -> list[Any]:
        self.gathers.append(value)
        return [value] * 4 if self.gathered is None else list(self.gathered)

    def begin(self, step: int) -> None:
        self.check.resume_at(step)
        self.calibration.begin(step)
        self.step = step

    def run(self, steps: int, free_s: float = 0.040, due_s: float = 0.090, scout_s: float = 0.0002) -> None:
        """``steps`` steps: those without a replay due take ``free_s``, those with one ``due_s``."""
        for _ in range(steps):
            self.step += 1
            _train_step(self.model, self.optimizer, self.step)
            due = bool(self.check.runner.schedule.due(self.step))
            program = run_step(self.pipeline, self.step)
            with pytest.raises(StopIteration):
                next(program)  # one group: the step yields no exchange
            self.clock.now_s += due_s if due else free_s
            self.calibration.step_ended(self.step, scout_s)


def test_BUDGET_9_an_attempt_starts_at_the_calibration_cadence_counted_from_its_restored_step() -> None:
    job = Job()
    job.begin(40)
    schedule = job.check.runner.schedule
    assert job.calibration.cadence == CALIBRATION and schedule.origin_step == 40
    assert (job.pipeline.cycle_steps, job.pipeline.origin_step, job.pipeline.checkpoint_every_steps) == (4, 40, 4)
    assert [str(d.recipe) for d in schedule.due(42)] == ["hidden.0"]  # its first check: the 2nd step after 40
    explicit = Job(replay_interval_steps=3)
    explicit.begin(40)
    assert explicit.calibration.cadence == Cadence(3) and explicit.pipeline.cycle_steps == 6
    assert explicit.check.runner.schedule.origin_step == 40


def test_BUDGET_5_BUDGET_7_the_decision_at_the_calibration_windows_end_is_applied_and_said() -> None:
    job = Job(overhead_budget=0.05)
    job.begin(0)
    # BUDGET-12: the calibration window lasts until 8 steps free of replay were measured: 2 layers,
    # cycles of 4 steps (replay at the even ones), step 1 the attempt's first (not measured):
    # 1 + 2 + 2 + 2 + 2 = 9 free steps at the end of the 5th cycle, step 20.
    job.run(16)
    assert job.gathers == [None] * 4 and job.calibration.cadence == CALIBRATION and not job.sink.records
    job.run(4)
    # A free step's 40 ms hold 0.2 ms of scout's work: T = 39.8 ms, F = 0.2 ms, and C the mean of
    # the window's 5 cycles, 2 x (90 - 39.8 - 0.2) ms each.
    mine = job.gathers[-1]
    assert mine == pytest.approx((0.0398, 0.0002, 0.100))
    # N >= 0.100 / (0.05 x 0.0398 - 0.0002) = 55.9: one layer every 28 steps, a cycle of 56.
    assert job.calibration.cadence == Cadence(28, 1)
    assert (job.pipeline.cycle_steps, job.pipeline.origin_step) == (56, 20)
    assert job.check.runner.schedule.origin_step == 20 and not job.check.runner.schedule.due(21)
    (report,) = job.sink.records
    assert (report["kind"], report["reason"], report["step"]) == ("cadence", "calibrated", 20)
    evidence = report["evidence"]
    assert (evidence["interval_steps"], evidence["cycle_steps"], evidence["checkpoint_every_steps"]) == (28, 56, 56)
    assert evidence["previous"] == {"interval_steps": 2, "lanes": 1, "cycle_steps": 4}
    # A cycle of the new cadence with the same step time: no change (BUDGET-6), no report; after the
    # first decision each cycle is measured on its own.
    job.run(56)
    assert len(job.gathers) == 6 and job.calibration.cadence == Cadence(28, 1) and len(job.sink.records) == 1
    assert job.gathers[-1] == pytest.approx((0.0398, 0.0002, 0.100))  # this cycle's own two replays


def test_BUDGET_12_a_window_too_short_for_its_figures_is_no_measurement_on_every_rank_alike() -> None:
    # Every rank gives no measurement (None) at the window's cycle ends until 8 free steps are in.
    job = Job(overhead_budget=0.05)
    job.begin(0)
    job.run(4)
    assert job.gathers == [None]  # 1 measured free step of 8
    job.run(8)
    assert job.gathers == [None, None, None]  # 1 + 2 + 2 = 5
    # A restarted attempt's window starts afresh (BUDGET-9) and an explicit cadence has none (BUDGET-8).
    job.begin(100)
    job.run(20)
    assert job.gathers[3:7] == [None] * 4 and job.gathers[7] is not None and job.calibration.decisions
    explicit = Job(replay_interval_steps=2)
    explicit.begin(0)
    explicit.run(4)
    assert explicit.gathers == [] and len(explicit.sink.records) == 1  # said at the first cycle's end


def test_BUDGET_11_each_decision_sets_the_loop_checks_interval_and_an_attempt_starts_at_loop_check_steps() -> None:
    job = Job(overhead_budget=0.05)
    job.begin(0)
    assert job.loop.timer.config.check_every_steps == 10 and job.loop.due(10) and not job.loop.due(126)
    # The window's decision: T = 39.8 ms, so ceil(5 s (the default) / 39.8 ms) = 126 steps between checks.
    job.run(20)
    assert job.loop.timer.config.check_every_steps == 126 and job.loop.due(126) and not job.loop.due(10)
    (report,) = job.sink.records
    assert report["evidence"]["loop_check_steps"] == 126
    job.begin(60)  # BUDGET-9: a restarted attempt checks at loop_check_steps until its decision
    assert job.loop.timer.config.check_every_steps == 10
    slow = Job(overhead_budget=0.05, loop_check_steps=200)  # never under loop_check_steps
    slow.begin(0)
    slow.run(20)
    assert slow.loop.timer.config.check_every_steps == 200 == slow.sink.records[0]["evidence"]["loop_check_steps"]
    off = Job(overhead_budget=0.05, loop_check_interval_s=0)
    off.begin(0)
    off.run(20)
    assert off.loop.timer.config.check_every_steps == 10 and off.calibration.decisions
    explicit = Job(replay_interval_steps=2)  # BUDGET-8: no decision, the interval stays
    explicit.begin(0)
    explicit.run(12)
    assert explicit.loop.timer.config.check_every_steps == 10
    assert explicit.sink.records[0]["evidence"]["loop_check_steps"] == 10


class _Agreement:
    """What BUDGET-13 sets of the job's agreement (scout.job.boundary.Agreement): its interval."""

    interval_steps = 7  # neither the setting nor a decision's, so the test sees who set it


def test_BUDGET_13_each_decision_sets_the_agreements_interval_and_an_attempt_starts_at_agreement_interval_steps(
        ) -> None:
    job = Job(overhead_budget=0.05)
    job.calibration.agreement = agreement = _Agreement()
    job.begin(0)
    assert agreement.interval_steps == 10 == job.calibration.agreement_steps  # BUDGET-9: the setting's
    job.run(20)  # the window's decision: T = 39.8 ms, so ceil(5 s / 39.8 ms) = 126 steps between agreements
    assert agreement.interval_steps == 126
    (report,) = job.sink.records
    assert report["evidence"]["agreement_interval_steps"] == 126
    job.begin(60)  # BUDGET-9: a restarted attempt agrees every agreement_interval_steps until its decision
    assert agreement.interval_steps == 10
    for settings, expected in (({"agreement_interval_steps": 200}, 200), ({"agreement_interval_s": 0}, 10),
                               ({"agreement_interval_s": 1.0}, 26)):
        other = Job(overhead_budget=0.05, **settings)
        other.calibration.agreement = _Agreement()
        other.begin(0)
        other.run(20)
        assert other.calibration.agreement.interval_steps == expected and other.calibration.decisions, settings
    explicit = Job(replay_interval_steps=2)  # BUDGET-8: no decision, the interval stays
    explicit.calibration.agreement = _Agreement()
    explicit.begin(0)
    explicit.run(12)
    assert explicit.calibration.agreement.interval_steps == 10
    assert explicit.sink.records[0]["evidence"]["agreement_interval_steps"] == 10


def test_BUDGET_4_BUDGET_5_no_rank_measured_keeps_calibrating() -> None:
    job = Job(gathered=[None] * 4)
    job.begin(0)
    job.run(8)
    assert len(job.gathers) == 2 and job.calibration.cadence == CALIBRATION and not job.sink.records
    assert job.calibration.decisions == []


def test_BUDGET_8_an_explicit_cadence_exchanges_nothing_and_rank_0_says_what_it_costs() -> None:
    job = Job(replay_interval_steps=2, overhead_budget=0.01)
    job.begin(0)
    job.run(12)
    assert job.gathers == [] and job.calibration.cadence == Cadence(2)
    (report,) = job.sink.records
    evidence = report["evidence"]
    assert (report["kind"], report["reason"], report["step"]) == ("cadence", "explicit", 4)
    assert evidence["set_by"] == "replay_interval_steps" and evidence["status"] == "over-budget"
    assert evidence["share"] == pytest.approx((0.0002 + 0.100 / 4) / 0.0398)
    every_step = Job(replay_interval_steps=1)
    every_step.begin(0)
    every_step.run(2)
    (report,) = every_step.sink.records
    assert report["evidence"]["status"] == "unmeasured" and "every step replays" in report["evidence"]["reason"]


def test_BUDGET_10_job_step_charges_the_training_phases_hook_time_and_not_its_own() -> None:
    """BUDGET-3, BUDGET-10: the scout time a step gives the meter is its time in ``job.step()``
    plus the hooks' time of the training phase before it; what passes through the hooks while
    ``job.step()`` runs (its own collectives go through scout's wrappers) is in its time already."""
    from types import SimpleNamespace

    from scout.job import stepping
    from scout.reports.hook_time import HOOK_TIME

    ended: list[tuple[int, float, float]] = []
    training_hooks_s, own_s, inside_hooks_s = 0.005, 0.002, 0.007

    def control_run(_program: Any) -> Any:
        HOOK_TIME.spent_ns += round(inside_hooks_s * 1e9)  # scout's exchange through the wrappers
        time.sleep(own_s)
        return SimpleNamespace(checkpoint_due=False, stop=None)

    def step_ended(step: int, scout_s: float, excluded_s: float) -> None:
        ended.append((step, scout_s, excluded_s))
        HOOK_TIME.spent_ns += round(inside_hooks_s * 1e9)  # BUDGET-5's exchange at a cycle end, through the wrappers

    job = SimpleNamespace(
        _started=True, _step=6, boundary=SimpleNamespace(step=6), files=None, pipeline=SimpleNamespace(
            step_begins=lambda: None),
        guarded=SimpleNamespace(run_step=lambda step, work: work()),
        parts=SimpleNamespace(control=SimpleNamespace(run=control_run), calibration=SimpleNamespace(
            step_ended=step_ended)))
    HOOK_TIME.take_s()
    HOOK_TIME.spent_ns += round(training_hooks_s * 1e9)  # the forward's, backward's and optimizer's hooks
    stepping.full_step(job)  # type: ignore[arg-type]
    [(step, scout_s, excluded_s)] = ended
    assert step == 7 and excluded_s == 0.0
    assert training_hooks_s + own_s <= scout_s < training_hooks_s + own_s + inside_hooks_s, scout_s
    assert HOOK_TIME.take_s() == 0.0  # the hooks' time inside job.step(), the exchange's too, was discarded
