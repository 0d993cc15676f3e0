"""The overhead budget's pure part (spec/budget.md BUDGET-2..BUDGET-6): a rank's measurement of a
cycle, and the cadence decision -- checked against a deliberately naive reference that tries every
interval and every lane count, and by properties over random measurements."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scout.core.budget import (
    CALIBRATION,
    CALIBRATION_FREE_STEPS_MIN,
    INTERVAL_MAX,
    INTERVAL_MIN,
    LOOP_WINDOW_STEPS_MAX,
    BudgetStatus,
    Cadence,
    CycleMeter,
    RankCost,
    StepSample,
    calibration_window_steps,
    choose_agreement_steps,
    choose_cadence,
    choose_loop_check_steps,
    rank_cost,
    replaces,
    share,
)


def test_BUDGET_3_a_cycle_measured_from_its_steps() -> None:
    # Steps 1, 3, 5 free of replay (40, 42, 50 ms with 0.2-0.4 ms in job.step); 2, 4, 6 replay.
    samples = [StepSample(0.0402, 0.0002, False), StepSample(0.070, 0.020, True), StepSample(0.0424, 0.0004, False),
               StepSample(0.065, 0.015, True), StepSample(0.0503, 0.0003, False), StepSample(0.090, 0.040, True)]
    cost = rank_cost(samples)
    assert cost is not None
    assert cost.step_s == pytest.approx(0.042)  # the median of 40, 42, 50 ms
    assert cost.fixed_s == pytest.approx(0.0003)  # the mean of 0.2, 0.4, 0.3 ms
    assert cost.cycle_s == pytest.approx((0.070 + 0.065 + 0.090) - 3 * (0.042 + 0.0003))


def test_BUDGET_3_no_step_free_of_replay_or_a_figure_that_is_not_a_number_is_no_measurement() -> None:
    assert rank_cost([StepSample(0.05, 0.01, True)] * 4) is None
    assert rank_cost([]) is None
    assert rank_cost([StepSample(0.05, 0.001, False), StepSample(math.nan, 0.01, True)]) is None
    assert rank_cost([StepSample(0.0001, 0.001, False)]) is None  # a step of negative length
    # Noise that makes the due steps look cheaper than the free ones is no negative cost.
    cost = rank_cost([StepSample(0.05, 0.001, False), StepSample(0.04, 0.001, True)])
    assert cost is not None and cost.cycle_s == 0.0


def test_BUDGET_4_worked_example_the_tiny_gpt() -> None:
    """40 ms steps, 0.2 ms of scout at every step, 216 ms of replay a cycle, 3 hidden layers:
    N >= 0.216 / (0.01 x 0.040 - 0.0002) = 1080 steps, i.e. one layer every 360 steps."""
    decision = choose_cadence([RankCost(0.040, 0.0002, 0.216)], budget=0.01, hidden_layers=3)
    assert decision.status is BudgetStatus.WITHIN
    assert decision.cadence == Cadence(360, 1) and decision.cycle_steps == 1080
    assert decision.share is not None and decision.share <= 0.01
    # A 2 % budget: N >= 0.216 / (0.0008 - 0.0002) = 360, every 120 steps.
    assert choose_cadence([RankCost(0.040, 0.0002, 0.216)], budget=0.02, hidden_layers=3).cadence == Cadence(120, 1)


def test_BUDGET_4_cheap_replay_buys_lanes() -> None:
    """A 3.8 s step and 0.4 s of replay a cycle over 12 layers: N >= 0.4 / 0.037 = 10.8, below
    12 layers x 2 steps: lanes every other step, the shortest cycle 12 steps (6 checks of 2
    layers; 3 lanes would give 8 steps, over the budget)."""
    decision = choose_cadence([RankCost(3.8, 0.001, 0.4)], budget=0.01, hidden_layers=12)
    assert decision.status is BudgetStatus.WITHIN
    assert decision.cycle_steps == 12 and decision.cadence == Cadence(2, 2)


def test_BUDGET_4_the_worst_rank_decides_and_order_does_not_matter() -> None:
    fast, slow = RankCost(0.040, 0.0002, 0.1), RankCost(0.040, 0.0002, 0.3)
    one = choose_cadence([fast, slow], budget=0.01, hidden_layers=4)
    assert one == choose_cadence([slow, fast], budget=0.01, hidden_layers=4)
    assert one == choose_cadence([slow], budget=0.01, hidden_layers=4)
    assert one == choose_cadence([None, slow, fast, None], budget=0.01, hidden_layers=4)  # ranks without one


def test_BUDGET_4_over_budget_takes_the_longest_cycle_and_says_why() -> None:
    fixed = choose_cadence([RankCost(0.040, 0.0005, 0.2)], budget=0.01, hidden_layers=4)
    assert fixed.status is BudgetStatus.OVER_BUDGET and fixed.cadence == Cadence(INTERVAL_MAX, 1)
    assert fixed.cycle_steps == 4 * INTERVAL_MAX and "every step alone takes 1.25 %" in fixed.reason
    replay = choose_cadence([RankCost(0.040, 0.0002, 1000.0)], budget=0.01, hidden_layers=4, interval_max=10)
    assert replay.status is BudgetStatus.OVER_BUDGET and replay.cadence == Cadence(10, 1)
    assert "needs a cycle longer than 40 steps" in replay.reason


def test_BUDGET_4_unmeasured_changes_nothing() -> None:
    decision = choose_cadence([None, None], budget=0.01, hidden_layers=4)
    assert decision.status is BudgetStatus.UNMEASURED and decision.cadence is None and decision.share is None
    assert choose_cadence([RankCost(math.nan, 0.0, 0.0)], budget=0.01, hidden_layers=4).status is \
        BudgetStatus.UNMEASURED


@pytest.mark.parametrize(("keywords", "message"), [
    ({"budget": 0.0}, "overhead_budget must be a number in (0, 0.5], got 0.0"),
    ({"budget": 0.6}, "overhead_budget must be a number in (0, 0.5], got 0.6"),
    ({"budget": math.inf}, "overhead_budget must be a number in (0, 0.5], got inf"),
    ({"budget": True}, "overhead_budget must be a number in (0, 0.5], got True"),
    ({"hidden_layers": -1}, "hidden_layers must be an int >= 0, got -1"),
    ({"interval_max": 1}, "interval_max must be an int >= 2, got 1"),
])
def test_BUDGET_4_bad_inputs_are_named(keywords: dict[str, object], message: str) -> None:
    arguments: dict[str, object] = {"budget": 0.01, "hidden_layers": 4, **keywords}
    with pytest.raises(ValueError, match=f"^{message.replace('(', '[(]').replace(')', '[)]')}$"):
        choose_cadence([RankCost(0.04, 0.0, 0.1)], **arguments)  # type: ignore[arg-type]


def _reference(costs: list[RankCost], budget: float, layers: int, interval_max: int) -> tuple[int, int, int] | None:
    """BUDGET-4 read naively: one lane at every interval, and every lane count every other step;
    the shortest cycle inside the budget, then the fewest lanes; None when none is."""
    inside = []
    cadences = [(interval, 1) for interval in range(INTERVAL_MIN, interval_max + 1)]
    cadences += [(INTERVAL_MIN, lanes) for lanes in range(2, max(1, layers) + 1)]
    for interval, lanes in cadences:
        cycle = interval * -(-max(1, layers) // lanes)
        if all((c.fixed_s + c.cycle_s / cycle) / c.step_s <= budget for c in costs):
            inside.append((cycle, lanes, interval))
    return min(inside) if inside else None


costs_strategy = st.lists(st.builds(RankCost, st.floats(0.001, 5.0), st.floats(0.0, 0.01), st.floats(0.0, 2.0)),
                          min_size=1, max_size=4)


@settings(max_examples=300, deadline=None)
@given(costs_strategy, st.sampled_from([0.005, 0.01, 0.02, 0.05, 0.2]), st.integers(0, 9), st.integers(2, 40))
def test_BUDGET_4_the_decision_is_the_naive_readings(costs: list[RankCost], budget: float, layers: int,
                                                     interval_max: int) -> None:
    decision = choose_cadence(costs, budget=budget, hidden_layers=layers, interval_max=interval_max)
    expected = _reference(costs, budget, layers, interval_max)
    if expected is None:
        assert decision.status is BudgetStatus.OVER_BUDGET and decision.cadence == Cadence(interval_max, 1)
    else:
        cycle, lanes, interval = expected
        assert decision.status is BudgetStatus.WITHIN, (decision, expected)
        assert (decision.cycle_steps, decision.cadence) == (cycle, Cadence(interval, lanes)), (decision, expected)
        assert decision.share == max(share(c, cycle) for c in costs) <= budget


@settings(max_examples=200, deadline=None)
@given(costs_strategy, st.integers(1, 24), st.randoms(use_true_random=False))
def test_BUDGET_4_properties_monotone_in_the_budget_and_the_cost_and_blind_to_rank_order(
        costs: list[RankCost], layers: int, rng: random.Random) -> None:
    decisions = [choose_cadence(costs, budget=b, hidden_layers=layers) for b in (0.005, 0.01, 0.02, 0.05)]
    cycles = [d.cycle_steps for d in decisions]
    assert cycles == sorted(cycles, reverse=True)  # more budget, never a longer cycle
    shuffled = list(costs)
    rng.shuffle(shuffled)
    assert choose_cadence(shuffled, budget=0.01, hidden_layers=layers) == decisions[1]
    dearer = [RankCost(c.step_s, c.fixed_s, 2 * c.cycle_s) for c in costs]
    assert choose_cadence(dearer, budget=0.01, hidden_layers=layers).cycle_steps >= decisions[1].cycle_steps
    for decision in decisions:
        assert decision.cadence is not None and decision.cadence.interval_steps >= INTERVAL_MIN
        assert decision.cycle_steps == decision.cadence.cycle_steps(layers)


def test_BUDGET_5_the_calibration_cadence_is_every_other_step_one_layer_each() -> None:
    assert Cadence(2, 1) == CALIBRATION and CALIBRATION.cycle_steps(4) == 8 and CALIBRATION.cycle_steps(0) == 2


def test_BUDGET_6_only_a_cycle_twice_as_long_or_half_as_long_replaces_the_current_one() -> None:
    assert not replaces(100, 100) and not replaces(100, 199) and not replaces(100, 51)
    assert replaces(100, 200) and replaces(100, 50) and replaces(100, 1000) and replaces(100, 2)
    with pytest.raises(ValueError, match="cycles are >= 1 step, got 0 and 5"):
        replaces(0, 5)


def test_BUDGET_3_a_meter_keeps_bounded_memory_over_a_long_cycle() -> None:
    from scout.core.budget import FREE_STEPS_KEPT, CycleMeter

    meter = CycleMeter()
    for step in range(1, 50_001):
        meter.add(StepSample(0.05 if step < 40_000 else 0.04, 0.001, step % 100 == 0))
    assert len(meter.free_steps_s) == FREE_STEPS_KEPT and meter.steps == 50_000
    cost = meter.cost()
    assert cost is not None and cost.step_s == pytest.approx(0.039)  # the most recent free steps
    assert cost.fixed_s == pytest.approx(0.001)


def test_BUDGET_11_worked_example_the_loop_checks_interval() -> None:
    tiny = [RankCost(0.035, 0.0015, 0.02), RankCost(0.0398, 0.0012, 0.02), None]
    assert choose_loop_check_steps(tiny, base_steps=10, interval_s=1.0) == 26  # ceil(1 / 0.0398): the slowest rank's T
    assert choose_loop_check_steps(tiny, base_steps=10, interval_s=0.0) == 10  # 0: off
    assert choose_loop_check_steps([RankCost(0.26, 0.0005, 0.04)], base_steps=10, interval_s=1.0) == 10  # long steps keep it
    assert choose_loop_check_steps([RankCost(0.0005, 0.0, 0.0)], base_steps=10, interval_s=1.0) == LOOP_WINDOW_STEPS_MAX
    assert choose_loop_check_steps([RankCost(0.0005, 0.0, 0.0)], base_steps=300, interval_s=1.0) == 300  # never under it
    assert choose_loop_check_steps([None, None], base_steps=10, interval_s=1.0) == 10  # unmeasured: unchanged
    for bad, message in (({"base_steps": 0}, "loop_check_steps must be"), ({"interval_s": -1.0}, "loop_check_interval_s"),
                         ({"interval_s": math.nan}, "loop_check_interval_s"), ({"steps_max": 0}, "steps_max")):
        with pytest.raises(ValueError, match=message):
            choose_loop_check_steps(tiny, **{"base_steps": 10, "interval_s": 1.0, **bad})  # type: ignore[arg-type]


@pytest.mark.parametrize(("choose", "steps_max"), [(choose_loop_check_steps, LOOP_WINDOW_STEPS_MAX),
                                                   (choose_agreement_steps, INTERVAL_MAX)], ids=["loop", "agreement"])
@settings(max_examples=300, deadline=None)
@given(costs_strategy, st.integers(1, 300), st.floats(0.0, 30.0))
def test_BUDGET_11_BUDGET_13_the_interval_is_the_least_that_spans_interval_s_within_its_bounds(
        choose: Any, steps_max: int, costs: list[RankCost], base: int, interval_s: float) -> None:
    steps = choose(costs, base_steps=base, interval_s=interval_s)
    assert steps == choose(list(reversed(costs)), base_steps=base, interval_s=interval_s)  # alike on every rank
    slowest = max(cost.step_s for cost in costs)
    assert base <= steps <= max(base, steps_max)
    if base < steps < steps_max:  # the least number of the slowest rank's steps that spans interval_s
        assert steps * slowest >= interval_s * (1 - 1e-9) and (steps - 1) * slowest < interval_s * (1 + 1e-9)
    if steps == base and base < steps_max:
        assert base * slowest >= interval_s * (1 - 1e-9) or interval_s == 0


def test_BUDGET_13_worked_example_the_agreements_interval() -> None:
    tiny = [RankCost(0.035, 0.0015, 0.02), RankCost(0.0398, 0.0012, 0.02), None]
    assert choose_agreement_steps(tiny, base_steps=10, interval_s=5.0) == 126  # ceil(5 / 0.0398): the slowest rank's T
    assert choose_agreement_steps(tiny, base_steps=10, interval_s=0.0) == 10  # 0: off
    assert choose_agreement_steps([RankCost(0.6, 0.0005, 0.04)], base_steps=10, interval_s=5.0) == 10  # long steps keep it
    assert choose_agreement_steps([RankCost(1e-6, 0.0, 0.0)], base_steps=10, interval_s=5.0) == INTERVAL_MAX  # its bound
    assert choose_agreement_steps(tiny, base_steps=500, interval_s=5.0) == 500  # never under agreement_interval_steps
    assert choose_agreement_steps([None, None], base_steps=10, interval_s=5.0) == 10  # unmeasured: unchanged
    for bad, message in (({"base_steps": 0}, "agreement_interval_steps must be"),
                         ({"interval_s": -1.0}, "agreement_interval_s"), ({"interval_s": math.inf}, "agreement_interval_s")):
        with pytest.raises(ValueError, match=message):
            choose_agreement_steps(tiny, **{"base_steps": 10, "interval_s": 5.0, **bad})  # type: ignore[arg-type]


def test_BUDGET_12_the_calibration_window_and_a_meter_over_several_cycles() -> None:
    # 8 measured free steps: L - 1 in the first cycle of 2L steps, L in each later one.
    assert [calibration_window_steps(layers) for layers in (0, 1, 2, 3, 4, 8, 9, 12)] == [
        18, 18, 20, 18, 24, 32, 18, 24]
    for layers in range(1, 40):
        cycles = calibration_window_steps(layers) // (2 * layers)
        assert cycles * layers - 1 >= CALIBRATION_FREE_STEPS_MIN > (cycles - 1) * layers - 1
    with pytest.raises(ValueError, match="hidden_layers"):
        calibration_window_steps(-1)
    meter = CycleMeter()
    for cycle in range(3):  # three cycles of one free step (40 ms, 0.2 ms of it scout's) and one replay (90 ms)
        if cycle:
            meter.extend()
        meter.add(StepSample(0.040, 0.0002, False))
        meter.add(StepSample(0.090, 0.0, True))
    cost = meter.cost()
    assert cost is not None and cost.cycle_s == pytest.approx(0.090 - 0.040)  # C: the mean of the cycles'
