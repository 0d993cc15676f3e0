"""The overhead budget on a job (spec/budget.md): every rank measures what scout costs it over each
replay cycle (BUDGET-3), the ranks exchange their measurements at the cycle's end on scout's
control group, and every rank applies the same pure decision (``scout.core.budget``) to the same
gathered values (BUDGET-4, BUDGET-5): one cadence, at one step, on every rank -- the replay
checks' schedules, the canary's cycle and the pipeline's cycle ends all switch at that boundary,
counted from it. Rank 0 says each cadence and what it buys (BUDGET-7). An explicit
``replay_interval_steps`` wins: no decision, no exchange; rank 0 says what it costs (BUDGET-8).

``Job`` calls :meth:`Calibration.begin` when an attempt starts (after the pipeline's begin, so the
checks already stand at the restored step) and :meth:`Calibration.step_ended` at the end of every
``job.step()`` with the time spent in it.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from scout.core.budget import (
    CALIBRATION,
    CALIBRATION_FREE_STEPS_MIN,
    BudgetStatus,
    Cadence,
    CadenceDecision,
    CycleMeter,
    RankCost,
    StepSample,
    choose_agreement_steps,
    choose_cadence,
    choose_loop_check_steps,
    replaces,
    share,
)
from scout.core.recipes import Intervals, Schedule
from scout.job.checks import (
    CanaryCheck,
    Cycle,
    LoopStragglerCheck,
    ReplayCheck,
    dense_intervals,
    expert_cadence,
)
from scout.job.config import Config
from scout.job.gate_driver import Reporter
from scout.job.pipeline import Pipeline
from scout.reports.kinds import ReportKind

__all__ = ["Calibration", "cadence_line"]


if TYPE_CHECKING:  # the job builds the agreement after the calibration (scout.job.attach._agreement)
    from scout.job.boundary import Agreement

logger = logging.getLogger("scout")


def _ms(seconds: float) -> str:
    return f"{1e3 * seconds:.3g} ms"


def cadence_line(cadence: Cadence, cycle_steps: int, *, rows: int, checkpoint_every_cycles: int | None,
                 share_of_step: float | None, budget: float, set_by: str) -> str:
    """BUDGET-7: the cadence in words and what it buys (rank 0's standard error)."""
    lanes = "one hidden layer" if cadence.lanes == 1 else f"{cadence.lanes} hidden layers"
    line = (f"scout: replay cadence {lanes} every {cadence.interval_steps} steps, {rows or 'all'} row(s) "
            f"(set by {set_by}): a cycle of {cycle_steps} steps -- an SDC recurring in replayed work is found "
            f"within {cycle_steps} steps")
    if checkpoint_every_cycles is not None:
        line += (f", a checkpoint every {cycle_steps * checkpoint_every_cycles} steps, verified {cycle_steps} steps "
                 "after it is written")
    if share_of_step is not None:
        line += f"; scout's work {100 * share_of_step:.2f} % of a step (overhead_budget {100 * budget:g} %)"
    return line


class Calibration:
    """One rank's part of the overhead budget (module docstring)."""

    def __init__(self, checks: Sequence[Any], pipeline: Pipeline, *, config: Config,
                 all_gather: Callable[[Any], list[Any]], reporter: Reporter, rank: int, checkpoints: bool,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        replay = [check for check in checks if isinstance(check, ReplayCheck)]
        self.dense = next((check for check in replay if check.name == "replay"), None)
        self.experts = next((check for check in replay if check.name == "experts"), None)
        self.canaries = [check for check in checks if isinstance(check, CanaryCheck)]
        self.loop = next((check for check in checks if isinstance(check, LoopStragglerCheck)), None)
        #: BUDGET-13: the agreement (spec/guard.md GUARD-4) whose interval each decision sets; the
        #: job gives it once it is built (None: no agreement to space, as in a test of this alone).
        self.agreement: Agreement | None = None
        self.pipeline = pipeline
        self.config = config
        self.all_gather = all_gather
        self.reporter = reporter
        self.rank = rank
        self.checkpoints = checkpoints
        self.clock = clock
        self.explicit = config.replay_interval_steps
        # LAYOUT-2: the deepest stage's layer count, alike on every rank (build_checks exchanged it),
        # so every stage's schedule and the budget's decision (BUDGET-4) are the job's one.
        own = 0 if self.dense is None else self.dense.runner.catalog.hidden_layer_count
        self.hidden_layers = max(own, 0 if self.dense is None else self.dense.job_hidden_layers)
        self.cadence = CALIBRATION if self.explicit is None else Cadence(self.explicit)
        self.origin_step = 0
        #: The decisions of the current attempt (BUDGET-5: the first one is ``calibrated``).
        self.decisions: list[CadenceDecision] = []
        self._meter = CycleMeter()
        self._last_end_s: float | None = None
        self._measuring = self.dense is not None

    @property
    def enabled(self) -> bool:
        return self.dense is not None

    def begin(self, step: int) -> None:
        """BUDGET-5, BUDGET-9: an attempt starts at ``step`` (0 on a fresh run): the calibration
        cadence (or the explicit one), counted from ``step``, where the gate opens a cycle."""
        if self.dense is None:
            return
        self.decisions = []
        self._meter, self._last_end_s, self._measuring = CycleMeter(), None, True
        self._set_loop_check_steps(self.config.loop_check_steps)  # BUDGET-9, BUDGET-11: afresh
        self._set_agreement_steps(self.config.agreement_interval_steps)  # BUDGET-9, BUDGET-13: afresh
        self.apply(CALIBRATION if self.explicit is None else Cadence(self.explicit), step)

    def apply(self, cadence: Cadence, origin_step: int) -> int:
        """Every replay check's schedule, the canary's cycle and the pipeline's cycle ends to
        ``cadence`` counted from ``origin_step`` (a boundary); returns the cycle in steps."""
        assert self.dense is not None
        schedule = Schedule(self.dense.runner.catalog, dense_intervals(cadence, self.hidden_layers), origin_step)
        self.dense.runner.set_schedule(schedule)
        cycle = Cycle.of(schedule)
        if self.experts is not None:  # MOE-10: the experts share the dense cycle
            catalog = self.experts.runner.catalog
            interval, per_check = expert_cadence(cycle.steps, len(catalog.expert_keys),
                                                 self.config.max_expert_replays_per_step)
            experts = Schedule(catalog, Intervals(expert_steps=interval, expert_recipes_per_check=per_check),
                               origin_step)
            self.experts.runner.set_schedule(experts)
            cycle = cycle.longest(Cycle.of(experts))
        for canary in self.canaries:
            canary.cycle_steps, canary.origin_step = cycle.steps, origin_step
        self.pipeline.set_cycle(cycle.steps, origin_step)
        self.cadence, self.origin_step = cadence, origin_step
        return cycle.steps

    def _replay_due(self, step: int) -> bool:
        return any(check.runner.schedule.due(step) for check in (self.dense, self.experts) if check is not None)

    def step_ended(self, step: int, scout_s: float, excluded_s: float = 0.0) -> None:
        """BUDGET-3: step ``step`` ended now, ``scout_s`` of it scout's time (in ``job.step()`` and,
        BUDGET-10, in its hooks; a checkpoint save, ``excluded_s``, left out of both); at a cycle
        end, BUDGET-5's exchange and decision."""
        if not self._measuring:
            return
        now_s = self.clock()
        if self._last_end_s is not None:  # an attempt's first step (its warm-up) is not measured
            self._meter.add(StepSample(now_s - self._last_end_s - excluded_s, scout_s, self._replay_due(step)))
        if self.pipeline.cycle_ends(step):
            self._cycle_ended(step)
        self._last_end_s = self.clock()  # the exchange is not the next step's

    def _cycle_ended(self, step: int) -> None:
        if (self.explicit is None and not self.decisions and not self._meter.invalid
                and self._meter.free_count < CALIBRATION_FREE_STEPS_MIN):
            # BUDGET-12: the window goes on (every rank alike); no measurement from this rank yet.
            self._meter.extend()
            mine = None
        else:
            mine = self._meter.cost()
            self._meter = CycleMeter()
        if self.explicit is not None:  # BUDGET-8: no decision, no exchange; rank 0 says what it costs
            if self._said_explicit(step, mine):
                self._measuring = False
            return
        gathered = self.all_gather(None if mine is None else (mine.step_s, mine.fixed_s, mine.cycle_s))
        costs = [None if value is None else RankCost(*value) for value in gathered]
        decision = choose_cadence(costs, budget=self.config.overhead_budget, hidden_layers=self.hidden_layers)
        if decision.cadence is None:  # unmeasured: calibrate (or keep the cadence) another cycle
            return
        first = not self.decisions
        current = self.pipeline.cycle_steps
        if not first and not replaces(current, decision.cycle_steps):
            return
        previous = self.cadence
        self.decisions.append(decision)
        cycle = self.apply(decision.cadence, step)  # BUDGET-5: counted from this boundary, even if unchanged
        if self.loop is not None:  # BUDGET-11: from the same gathered values, from this step on
            self._set_loop_check_steps(choose_loop_check_steps(
                costs, base_steps=self.config.loop_check_steps, interval_s=self.config.loop_check_interval_s,
                steps_max=self.loop.timer.config.window_steps_max))
        self._set_agreement_steps(choose_agreement_steps(  # BUDGET-13: likewise
            costs, base_steps=self.config.agreement_interval_steps, interval_s=self.config.agreement_interval_s))
        self._say(step, decision, costs, "calibrated" if first else "recalibrated", previous, current, cycle)

    @property
    def loop_check_steps(self) -> int | None:
        """BUDGET-11: the loop check's current interval (None without a loop check)."""
        return None if self.loop is None else self.loop.timer.config.check_every_steps

    def _set_loop_check_steps(self, steps: int) -> None:
        if self.loop is not None:
            self.loop.timer.set_check_every_steps(steps)

    @property
    def agreement_steps(self) -> int | None:
        """BUDGET-13: the agreement's current interval (None without an agreement)."""
        return None if self.agreement is None else self.agreement.interval_steps

    def _set_agreement_steps(self, steps: int) -> None:
        if self.agreement is not None:
            self.agreement.interval_steps = steps

    def _checkpoint_cycles(self) -> int | None:
        return self.pipeline.checkpoint_every_cycles if self.checkpoints else None

    def _say(self, step: int, decision: CadenceDecision, costs: Sequence[RankCost | None], reason: str,
             previous: Cadence, previous_cycle: int, cycle: int) -> None:
        """BUDGET-7: a ``cadence`` report and a line on standard error, from rank 0."""
        if self.rank != 0:
            return
        assert decision.cadence is not None
        line = cadence_line(decision.cadence, cycle, rows=self.config.replay_rows,
                            checkpoint_every_cycles=self._checkpoint_cycles(), share_of_step=decision.share,
                            budget=self.config.overhead_budget, set_by="overhead_budget")
        measured = [c for c in costs if c is not None]
        if self.loop_check_steps is not None:
            line += f"; loop-straggler check every {self.loop_check_steps} steps"
        if self.agreement_steps is not None:
            line += f"; agreement on scout's own failures every {self.agreement_steps} steps"
        line += (f" [{reason} at step {step}: step {_ms(max(c.step_s for c in measured))} without scout's work, "
                 f"its work {_ms(max(c.fixed_s for c in measured))} a step and {_ms(max(c.cycle_s for c in measured))}"
                 " a cycle for replay (the worst rank's)]")
        if decision.status is BudgetStatus.OVER_BUDGET:
            line += (f"; OVER BUDGET: {decision.reason} -- a larger overhead_budget, or fewer ranks per host, "
                     "would let replay run more often")
        # Logged at info: a warning would reach the console a second time through logging's
        # last-resort handler where the job configured no logging; the print is the console's.
        logger.info("%s", line)
        print(line, file=sys.stderr, flush=True)
        self.reporter.record(ReportKind.CADENCE, reason, step=step, evidence=self._evidence(
            decision.cadence, cycle, decision.share, decision.status.value, decision.reason, "overhead_budget",
            costs) | {"previous": {"interval_steps": previous.interval_steps, "lanes": previous.lanes,
                                   "cycle_steps": previous_cycle}})

    def _said_explicit(self, step: int, mine: RankCost | None) -> bool:
        """BUDGET-8 on rank 0 (the others only stop measuring): what the user's cadence costs,
        once a cycle measured it (True), or never if every step replays (True: nothing to wait for)."""
        cycle = self.pipeline.cycle_steps
        if mine is None and self.cadence.interval_steps >= 2:
            return False  # a cycle without a step free of replay: measure the next one
        if self.rank != 0:
            return True
        budget = self.config.overhead_budget
        fraction = None if mine is None else share(mine, cycle)
        status = "unmeasured" if fraction is None else ("within" if fraction <= budget else "over-budget")
        reason = "every step replays: no step measures the step without it" if mine is None else ""
        line = cadence_line(self.cadence, cycle, rows=self.config.replay_rows,
                            checkpoint_every_cycles=self._checkpoint_cycles(), share_of_step=fraction, budget=budget,
                            set_by="replay_interval_steps")
        if status == "over-budget":
            line += " -- over overhead_budget; unset replay_interval_steps to let the budget choose"
        print(line, file=sys.stderr, flush=True)
        self.reporter.record(ReportKind.CADENCE, "explicit", step=step, evidence=self._evidence(
            self.cadence, cycle, fraction, status, reason, "replay_interval_steps", [mine]))
        return True

    def _evidence(self, cadence: Cadence, cycle: int, fraction: float | None, status: str, reason: str,
                  set_by: str, costs: Sequence[RankCost | None]) -> dict[str, Any]:
        checkpoint_cycles = self._checkpoint_cycles()
        return {
            "set_by": set_by, "interval_steps": cadence.interval_steps, "lanes": cadence.lanes,
            "replay_rows": self.config.replay_rows, "cycle_steps": cycle, "sdc_detection_steps": cycle,
            "checkpoint_every_steps": None if checkpoint_cycles is None else cycle * checkpoint_cycles,
            "verified_after_steps": cycle if checkpoint_cycles is not None else None,
            "overhead_budget": self.config.overhead_budget, "share": fraction, "status": status, "reason": reason,
            "loop_check_steps": self.loop_check_steps,
            "agreement_interval_steps": self.agreement_steps,
            "measured": [None if c is None else c.to_json() for c in costs],
        }
