"""The overhead budget, pure part (spec/budget.md BUDGET-*): what one rank's measurements of a
replay cycle say it costs (:func:`rank_cost`), and the replay cadence that keeps every rank's
share of a step inside the budget (:func:`choose_cadence`). No torch, no clock, no I/O:
``scout.job.calibration`` measures and exchanges, every rank decides with these functions from
the same gathered values.

Theory of operation. Replay's work over a cycle is about fixed by the model: every recipe is
replayed once, each round with its collectives, whatever the cadence. Spreading it over a cycle of
``N`` steps costs ``C / N`` a step; scout's other work in ``job.step()`` costs ``F`` at every step;
the step itself takes ``T``. The share ``(F + C / N) / T`` falls as ``N`` grows, so the shortest
cycle inside the budget is the one that detects soonest (an SDC is found within one cycle) at the
cost the user allowed.
"""

from __future__ import annotations

import enum
import math
import statistics
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Final

import attrs

from scout.core.guards import whole_number

__all__ = [
    "CALIBRATION",
    "CALIBRATION_FREE_STEPS_MIN",
    "DRIFT_FACTOR",
    "INTERVAL_MAX",
    "INTERVAL_MIN",
    "LOOP_WINDOW_STEPS_MAX",
    "BudgetStatus",
    "Cadence",
    "CadenceDecision",
    "CycleMeter",
    "RankCost",
    "StepSample",
    "calibration_window_steps",
    "choose_agreement_steps",
    "choose_cadence",
    "choose_loop_check_steps",
    "rank_cost",
    "replaces",
    "share",
]

#: BUDGET-2: at least every other step runs no replay (the step is measured in every cycle).
INTERVAL_MIN: Final = 2
#: BUDGET-4: the longest interval (``replay_interval_steps``' bound).
INTERVAL_MAX: Final = 1_000_000
#: BUDGET-6: a new decision replaces the cadence only when its cycle is this many times longer or
#: shorter.
DRIFT_FACTOR: Final = 2.0
#: BUDGET-3: the steps free of replay whose step time is kept for ``T`` (the most recent): a
#: cycle may be a million steps, a meter's memory is bounded.
FREE_STEPS_KEPT: Final = 1024
#: BUDGET-12: the calibration window lasts until every rank measured this many steps free of replay.
CALIBRATION_FREE_STEPS_MIN: Final = 8
#: BUDGET-11: the loop timer's window (``scout.replay.arrival.LoopConfig.window_steps_max``): an
#: interval longer than it would drop steps from the window.
LOOP_WINDOW_STEPS_MAX: Final = 256


def _positive_int(_instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if not whole_number(value) or value < 1:
        raise ValueError(f"{attribute.name} must be an int >= 1, got {value!r}")


@attrs.frozen
class Cadence:
    """BUDGET-2: a replay check every ``interval_steps`` steps replaying ``lanes`` hidden recipes."""

    interval_steps: int = attrs.field(validator=_positive_int)
    lanes: int = attrs.field(default=1, validator=_positive_int)

    def cycle_steps(self, hidden_layers: int) -> int:
        """REC-4: the dense cycle, ``interval · ceil(L / lanes)`` steps (``interval`` without layers)."""
        return self.interval_steps * max(1, -(-hidden_layers // self.lanes))


#: BUDGET-5: the cadence of an attempt's calibration window.
CALIBRATION: Final = Cadence(INTERVAL_MIN, 1)


@attrs.frozen
class StepSample:
    """BUDGET-3: one step of one rank: its period (end of one ``job.step()`` to the end of the
    next), scout's time in it (inside ``job.step()``, a checkpoint save left out, and in scout's
    hooks: BUDGET-10), and whether a replay was due."""

    period_s: float
    scout_s: float
    replay_due: bool


@attrs.frozen
class RankCost:
    """BUDGET-3: one rank's measurement of a cycle: the step without scout's work (``step_s``,
    T), scout's work at every step (``fixed_s``, F), replay's work over the cycle (``cycle_s``, C)."""

    step_s: float
    fixed_s: float
    cycle_s: float

    def valid(self) -> bool:
        return (all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                    for v in (self.step_s, self.fixed_s, self.cycle_s))
                and self.step_s > 0 and self.fixed_s >= 0 and self.cycle_s >= 0)

    def to_json(self) -> dict[str, float]:
        return {"step_s": self.step_s, "fixed_s": self.fixed_s, "cycle_s": self.cycle_s}


class CycleMeter:
    """BUDGET-3 over one cycle, in bounded memory: the last :data:`FREE_STEPS_KEPT` step times
    free of replay (for ``T``'s median), and sums for ``F`` and for the due steps' periods. In the
    calibration window it may span several cycles (:meth:`extend`, BUDGET-12): ``C`` is then their
    mean."""

    def __init__(self) -> None:
        self.cycles = 1
        self.free_steps_s: deque[float] = deque(maxlen=FREE_STEPS_KEPT)
        self.free_count = 0
        self.fixed_sum_s = 0.0
        self.due_count = 0
        self.due_period_sum_s = 0.0
        self.invalid = False  # a figure that is not a finite number was seen

    def add(self, sample: StepSample) -> None:
        if not (math.isfinite(sample.period_s) and math.isfinite(sample.scout_s)):
            self.invalid = True
        elif sample.replay_due:
            self.due_count += 1
            self.due_period_sum_s += sample.period_s
        else:
            self.free_steps_s.append(sample.period_s - sample.scout_s)
            self.free_count += 1
            self.fixed_sum_s += sample.scout_s

    @property
    def steps(self) -> int:
        return self.free_count + self.due_count

    def extend(self) -> None:
        """BUDGET-12: the meter goes on over the next cycle (its measurement is still too short)."""
        self.cycles += 1

    def cost(self) -> RankCost | None:
        """The cycle's measurement; None without a step free of replay or after a figure that
        was not a finite number."""
        if self.invalid or not self.free_count:
            return None
        step_s = statistics.median(self.free_steps_s)
        fixed_s = self.fixed_sum_s / self.free_count
        cycle_s = max(0.0, self.due_period_sum_s - self.due_count * (step_s + fixed_s)) / self.cycles
        cost = RankCost(step_s, fixed_s, cycle_s)
        return cost if cost.valid() else None


def rank_cost(samples: Iterable[StepSample]) -> RankCost | None:
    """BUDGET-3: a rank's measurement of one cycle from its steps; None without a step free of
    replay or with a figure that is not a finite number."""
    meter = CycleMeter()
    for sample in samples:
        meter.add(sample)
    return meter.cost()


def share(cost: RankCost, cycle_steps: int) -> float:
    """BUDGET-4: ``s(N) = (F + C / N) / T``, the rank's share of a step at a cycle of ``N`` steps."""
    return (cost.fixed_s + cost.cycle_s / cycle_steps) / cost.step_s


class BudgetStatus(enum.Enum):
    WITHIN = "within"  # the cadence keeps every measured rank inside the budget
    OVER_BUDGET = "over-budget"  # no cadence does: the longest was chosen (``reason`` says why)
    UNMEASURED = "unmeasured"  # no rank measured anything: the cadence stays as it is


@attrs.frozen
class CadenceDecision:
    """BUDGET-4's answer: the cadence (None when unmeasured), its cycle, the worst rank's share
    there (None when unmeasured), the status and, when over budget, why."""

    cadence: Cadence | None
    cycle_steps: int
    share: float | None
    status: BudgetStatus
    reason: str = ""


def _check(budget: float, hidden_layers: int, interval_max: int) -> None:
    if not (isinstance(budget, (int, float)) and not isinstance(budget, bool) and math.isfinite(budget)
            and 0 < budget <= 0.5):
        raise ValueError(f"overhead_budget must be a number in (0, 0.5], got {budget!r}")
    if not whole_number(hidden_layers) or hidden_layers < 0:
        raise ValueError(f"hidden_layers must be an int >= 0, got {hidden_layers!r}")
    if not whole_number(interval_max) or interval_max < INTERVAL_MIN:
        raise ValueError(f"interval_max must be an int >= {INTERVAL_MIN}, got {interval_max!r}")


def _candidates(hidden_layers: int, interval_max: int) -> list[tuple[int, int]]:
    """BUDGET-4's cadences as (interval, lanes): one lane at any interval, and at the shortest
    interval every lane count that shortens the cycle (the fewest lanes for each cycle)."""
    layers = max(1, hidden_layers)
    fewest: dict[int, int] = {}
    for lanes in range(1, layers + 1):
        fewest.setdefault(-(-layers // lanes), lanes)
    return [(INTERVAL_MIN, lanes) for lanes in fewest.values() if lanes > 1] + [(interval_max, 1)]


def choose_cadence(costs: Sequence[RankCost | None], *, budget: float, hidden_layers: int,
                   interval_max: int = INTERVAL_MAX) -> CadenceDecision:
    """BUDGET-4: the shortest cycle inside ``budget`` on every measured rank -- one lane every
    ``k`` steps (``2 <= k <= interval_max``), or, when every other step is inside it, ``m``
    lanes every other step -- the fewest lanes among equal cycles; the longest cycle, over
    budget, when none is; unmeasured when no rank measured."""
    _check(budget, hidden_layers, interval_max)
    measured = [c for c in costs if c is not None and c.valid()]
    if not measured:
        return CadenceDecision(None, 0, None, BudgetStatus.UNMEASURED, "no rank measured a step free of replay")
    # s_r(N) <= b  <=>  N >= C_r / (b T_r - F_r) when b T_r > F_r; never otherwise.
    needed = 0.0
    for cost in measured:
        room = budget * cost.step_s - cost.fixed_s
        if room <= 0:
            needed = math.inf
            break
        needed = max(needed, cost.cycle_s / room)
    best: tuple[int, int, int] | None = None  # (cycle, lanes, interval)
    if math.isfinite(needed):
        for interval_limit, lanes in _candidates(hidden_layers, interval_max):
            checks = max(1, -(-max(1, hidden_layers) // lanes))
            interval = max(INTERVAL_MIN, math.ceil(needed / checks))
            # Rounding can leave a hair over the bound: step up until the shares agree.
            while interval <= interval_limit and max(share(c, interval * checks) for c in measured) > budget:
                interval += 1
            if interval > interval_limit:
                continue
            cycle = interval * checks
            if best is None or (cycle, lanes) < best[:2]:
                best = (cycle, lanes, interval)
    if best is not None:
        cycle, lanes, interval = best
        return CadenceDecision(Cadence(interval, lanes), cycle, max(share(c, cycle) for c in measured),
                               BudgetStatus.WITHIN)
    longest = Cadence(interval_max, 1)
    cycle = longest.cycle_steps(hidden_layers)
    worst = max(range(len(measured)), key=lambda i: measured[i].fixed_s / measured[i].step_s)
    fixed_share = measured[worst].fixed_s / measured[worst].step_s
    if fixed_share >= budget:
        reason = (f"scout's work at every step alone takes {100 * fixed_share:.2f} % of a step on a rank "
                  f"(overhead_budget {100 * budget:g} %)")
    else:
        reason = f"replay's work needs a cycle longer than {cycle} steps to fit {100 * budget:g} %"
    return CadenceDecision(longest, cycle, max(share(c, cycle) for c in measured), BudgetStatus.OVER_BUDGET, reason)


def replaces(current_cycle_steps: int, decided_cycle_steps: int, factor: float = DRIFT_FACTOR) -> bool:
    """BUDGET-6: a decided cycle replaces the current one when it is at least ``factor`` times
    longer or at most ``1 / factor`` of it."""
    if current_cycle_steps < 1 or decided_cycle_steps < 1:
        raise ValueError(f"cycles are >= 1 step, got {current_cycle_steps} and {decided_cycle_steps}")
    return (decided_cycle_steps >= factor * current_cycle_steps
            or decided_cycle_steps * factor <= current_cycle_steps)


def _steps_apart(costs: Sequence[RankCost | None], *, base_steps: int, interval_s: float, steps_max: int,
                 base_name: str, interval_name: str) -> int:
    """BUDGET-11, BUDGET-13: the least number of steps that keeps about ``interval_s`` of the
    slowest measured rank's step time ``T`` between two of a per-event cost, never under
    ``base_steps`` nor over ``steps_max`` unless ``base_steps`` is; ``base_steps`` where no rank
    measured or ``interval_s`` is 0. The same on every rank for the same gathered values. The
    names are the settings' (for the errors)."""
    if not whole_number(base_steps) or base_steps < 1:
        raise ValueError(f"{base_name} must be an int >= 1, got {base_steps!r}")
    if not whole_number(steps_max) or steps_max < 1:
        raise ValueError(f"steps_max must be an int >= 1, got {steps_max!r}")
    if not (isinstance(interval_s, (int, float)) and not isinstance(interval_s, bool) and math.isfinite(interval_s)
            and interval_s >= 0):
        raise ValueError(f"{interval_name} must be a finite number of seconds >= 0, got {interval_s!r}")
    measured = [cost.step_s for cost in costs if cost is not None and cost.valid()]
    if not measured or interval_s == 0:
        return base_steps
    wanted = math.ceil(interval_s / max(measured))
    return max(base_steps, min(steps_max, wanted))


def choose_loop_check_steps(costs: Sequence[RankCost | None], *, base_steps: int, interval_s: float,
                            steps_max: int = LOOP_WINDOW_STEPS_MAX) -> int:
    """BUDGET-11: the loop check's interval in steps from the gathered measurements -- about
    ``interval_s`` (``loop_check_interval_s``) of the slowest rank's step time apart, never under
    ``base_steps`` (``loop_check_steps``) nor over ``steps_max`` (the loop window)."""
    return _steps_apart(costs, base_steps=base_steps, interval_s=interval_s, steps_max=steps_max,
                        base_name="loop_check_steps", interval_name="loop_check_interval_s")


def choose_agreement_steps(costs: Sequence[RankCost | None], *, base_steps: int, interval_s: float) -> int:
    """BUDGET-13: the agreement's interval in steps (spec/guard.md GUARD-4) from the gathered
    measurements -- about ``interval_s`` (``agreement_interval_s``) of the slowest rank's step time
    apart, never under ``base_steps`` (``agreement_interval_steps``) nor over
    :data:`INTERVAL_MAX` (the setting's own bound)."""
    return _steps_apart(costs, base_steps=base_steps, interval_s=interval_s, steps_max=INTERVAL_MAX,
                        base_name="agreement_interval_steps", interval_name="agreement_interval_s")


def calibration_window_steps(hidden_layers: int) -> int:
    """BUDGET-12: the calibration window's length in steps at the calibration cadence (one hidden
    layer every 2 steps, cycles of ``2 * L`` steps holding ``L`` steps free of replay, ``L - 1``
    measured in the first): the cycles until :data:`CALIBRATION_FREE_STEPS_MIN` are measured."""
    if not whole_number(hidden_layers) or hidden_layers < 0:
        raise ValueError(f"hidden_layers must be an int >= 0, got {hidden_layers!r}")
    layers = max(1, hidden_layers)
    cycles = -(-(CALIBRATION_FREE_STEPS_MIN + 1) // layers)
    return cycles * INTERVAL_MIN * layers
