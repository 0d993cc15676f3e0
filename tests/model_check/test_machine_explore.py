"""Bounded breadth-first model checking over the real step (docs/design.md §3): every ``always``
in every reached state, every ``sometimes`` witnessed, shortest failing traces, honest bounds."""

from __future__ import annotations

import itertools

import attrs
import pytest

from scout.core.machine import (
    Actions,
    Machine,
    MachineState,
    ModelCheckFailure,
    NondeterministicStep,
    Property,
    build_machine,
    explore,
    load_machine,
    load_table,
)
from scout.core.machine.table import GuardRef
from tests.model_check.toy import TOY_TABLE_PATH, buggy_actions
from tests.model_check.toy.actions import Counted, Reset, Tick, ToyContext, ToyState, every_event

TOY: Machine[ToyContext] = load_machine(TOY_TABLE_PATH)
BUGGY: Machine[ToyContext] = build_machine(load_table(TOY_TABLE_PATH), buggy_actions.ACTIONS)


def idle(limit: int) -> ToyState:
    return TOY.initial_state(ToyContext(limit=limit))


def only_resets(state: ToyState) -> tuple[Reset, ...]:
    return (Reset(),)


def test_TOY_1_to_4_hold_exhaustively_and_every_row_fires() -> None:
    result = explore(
        TOY, [idle(3)], every_event, depth_max=20, states_max=1000, require_exhaustive=True
    )
    # IDLE, COUNTING with counts 1..3, DONE: 5 states, each with 2 events.
    assert (result.states_count, result.transitions_count, result.depth_reached) == (5, 10, 4)
    assert not result.truncated
    assert result.labels_unfired == ()
    assert set(result.witnesses) == {"TOY-3", "TOY-4"}
    # Witnesses are shortest: DONE needs 4 ticks at limit 3; abandoning needs tick, reset.
    assert result.witnesses["TOY-3"].events == (Tick(),) * 4
    assert result.witnesses["TOY-4"].events == (Tick(), Reset())
    assert "not cut: exhaustive" in result.summary()


def test_exploration_is_deterministic() -> None:
    first = explore(TOY, [idle(5), idle(2)], every_event, depth_max=20, states_max=1000)
    assert explore(TOY, [idle(5), idle(2)], every_event, depth_max=20, states_max=1000) == first


def test_planted_bug_is_found_with_a_shortest_trace() -> None:
    # buggy_actions.increment jumps from odd counts: 1 -> 3 -> 5 overshoots limit 4.
    with pytest.raises(ModelCheckFailure) as failure:
        explore(BUGGY, [idle(4)], every_event, depth_max=30, states_max=1000)
    trace = failure.value.trace
    assert failure.value.property_id == "TOY-1"
    assert trace is not None and trace.events == (Tick(), Tick(), Tick())
    assert trace.states[-1] == MachineState("COUNTING", ToyContext(count=5, limit=4))
    message = str(failure.value)
    assert (
        "TOY-1 (always, state): The count never exceeds the limit. violated after 3 events"
        in message
    )
    assert "shortest failing trace (3 events)" in message and "count=5" in message
    # Shortest indeed: no sequence of fewer events breaks TOY-1.
    for length in range(3):
        for events in itertools.product((Tick(), Reset()), repeat=length):
            state = idle(4)
            for event in events:
                state, _ = BUGGY.step(state, event)
            assert state.context.count <= state.context.limit


def test_step_scope_always_violation_reports_the_violating_step() -> None:
    def never_counts_to_three(
        previous: ToyState, event: object, state: ToyState, effects: tuple[object, ...]
    ) -> bool:
        return Counted(3) not in effects

    planted = Property.always(
        "PLANTED-1", "no Counted(3) effect", never_counts_to_three, scope="step"
    )
    with pytest.raises(ModelCheckFailure) as failure:
        explore(
            TOY, [idle(5)], every_event, depth_max=30, states_max=1000, extra_properties=[planted]
        )
    trace = failure.value.trace
    assert trace is not None and trace.events == (Tick(),) * 3
    assert trace.steps[-1].effects == (Counted(3),)
    assert "PLANTED-1 (always, step): no Counted(3) effect violated by event 3" in str(
        failure.value
    )


def test_unreachable_sometimes_fails_instead_of_passing_vacuously() -> None:
    with pytest.raises(ModelCheckFailure) as failure:
        explore(TOY, [idle(3)], only_resets, depth_max=20, states_max=1000)
    message = str(failure.value)
    assert (
        "sometimes property never witnessed" in message and "exploration was exhaustive" in message
    )
    assert "TOY-3 (sometimes, state): Some run reaches the limit." in message
    assert "TOY-4 (sometimes, step)" in message
    assert failure.value.result.states_count == 1 and not failure.value.result.truncated


def test_sometimes_beyond_the_depth_bound_fails_and_says_the_bound_cut_it() -> None:
    with pytest.raises(ModelCheckFailure) as failure:
        explore(TOY, [idle(10)], every_event, depth_max=3, states_max=1000)
    result = failure.value.result
    assert result.cut_by_depth and not result.cut_by_states
    assert (result.states_count, result.depth_reached) == (4, 3)  # IDLE and counts 1..3
    assert "TOY-3" in str(failure.value) and "raise the bound" in str(failure.value)


def test_depth_bound_cut_is_reported_on_success() -> None:
    # Limit 1 witnesses everything within 2 events; the limit-50 count is cut at depth 3.
    result = explore(TOY, [idle(1), idle(50)], every_event, depth_max=3, states_max=1000)
    assert result.cut_by_depth and result.truncated and result.depth_reached == 3
    assert "cut by depth_max" in result.summary()
    with pytest.raises(ModelCheckFailure, match="require_exhaustive"):
        explore(
            TOY,
            [idle(1), idle(50)],
            every_event,
            depth_max=3,
            states_max=1000,
            require_exhaustive=True,
        )


def test_depth_bound_that_leaves_nothing_unexplored_is_not_a_cut() -> None:
    result = explore(TOY, [idle(3)], every_event, depth_max=4, states_max=1000)
    assert result.depth_reached == 4 and not result.cut_by_depth


def test_state_bound_cut_is_reported() -> None:
    with pytest.raises(ModelCheckFailure) as failure:
        explore(TOY, [idle(1), idle(50)], every_event, depth_max=100, states_max=4)
    result = failure.value.result
    assert result.cut_by_states and result.states_count == 4
    assert "cut by states_max" in str(failure.value)


def test_a_step_that_raises_is_a_failure_with_its_shortest_trace() -> None:
    def below_or_at_limit(context: ToyContext, event: object) -> bool:
        return context.count <= context.limit

    table = load_table(TOY_TABLE_PATH)
    rows = tuple(
        attrs.evolve(r, guard=GuardRef("below_or_at_limit")) if r.number == 2 else r
        for r in table.rows
    )
    registry = Actions()
    for function in (below_or_at_limit, *TOY.actions.guards.values()):
        registry.guard(function)
    for function in TOY.actions.effects.values():
        registry.effect(function)
    for function in TOY.actions.predicates.values():
        registry.predicate(function)
    overlapping = build_machine(attrs.evolve(table, rows=rows), registry)
    with pytest.raises(ModelCheckFailure) as failure:
        explore(overlapping, [idle(2)], every_event, depth_max=10, states_max=100)
    trace = failure.value.trace
    assert trace is not None and trace.events == (Tick(),) * 3
    assert isinstance(failure.value.__cause__, NondeterministicStep)
    assert "step raised on event 3" in str(failure.value) and "NondeterministicStep" in str(
        failure.value
    )


def test_unhashable_state_is_refused_with_advice() -> None:
    with pytest.raises(TypeError, match="not hashable; make the context a frozen attrs class"):
        explore(TOY, [MachineState("IDLE", [0])], every_event, depth_max=1, states_max=10)


def test_bad_bounds_and_missing_initial_states_are_refused() -> None:
    with pytest.raises(ValueError, match="depth_max >= 0 and states_max >= 1"):
        explore(TOY, [idle(3)], every_event, depth_max=-1, states_max=10)
    with pytest.raises(ValueError, match="no initial state"):
        explore(TOY, [], every_event, depth_max=1, states_max=10)
