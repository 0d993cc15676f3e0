"""The pure step: table-driven, deterministic, never mutating, and refusing (h11 style, state
unchanged) any event no row accepts or that several rows would accept at once."""

from __future__ import annotations

import copy
import itertools
from typing import ClassVar

import attrs
import pytest

from scout.core.machine import (
    Actions,
    IllegalTransition,
    Machine,
    MachineState,
    NondeterministicStep,
    StepError,
    build_machine,
    load_machine,
    load_table,
    reference_step,
)
from scout.core.machine.table import GuardRef
from tests.model_check.toy import TOY_TABLE_PATH
from tests.model_check.toy import actions as toy
from tests.model_check.toy.actions import (
    Cleared,
    Counted,
    Reported,
    Reset,
    Started,
    Tick,
    ToyContext,
)

TOY: Machine[ToyContext] = load_machine(TOY_TABLE_PATH)


@attrs.frozen
class Pause:
    trigger: ClassVar[str] = "pause"


def counting(count: int, limit: int = 3) -> MachineState[ToyContext]:
    return MachineState("COUNTING", ToyContext(count, limit))


def test_a_count_runs_to_its_limit_reports_once_and_resets() -> None:
    state = TOY.initial_state(ToyContext(limit=2))
    outputs = []
    for event in (Tick(), Tick(), Tick(), Tick(), Reset()):
        state, effects = TOY.step(state, event)
        outputs.append((state.control, state.context.count, effects))
    assert outputs == [
        ("COUNTING", 1, (Started(),)),
        ("COUNTING", 2, (Counted(2),)),
        ("DONE", 2, (Reported(2),)),
        ("DONE", 2, ()),
        ("IDLE", 0, (Cleared(2),)),
    ]


def test_ignore_row_returns_the_state_unchanged_with_no_effects() -> None:
    done = MachineState("DONE", ToyContext(3, 3))
    assert TOY.step(done, Tick()) == (done, ())


def _toy_variant(
    table_change: dict[str, object], extra_guards: tuple[object, ...] = ()
) -> Machine[ToyContext]:
    """The toy machine with its table edited in memory and extra guards registered."""
    registry = Actions()
    registry.guard(toy.at_limit)
    for guard in extra_guards:
        registry.guard(guard)
    for name in ("start_count", "increment", "report", "clear"):
        registry.effect(getattr(toy, name))
    for name in (
        "count_within_limit",
        "report_only_on_reaching_limit",
        "limit_reached",
        "count_abandoned",
    ):
        registry.predicate(getattr(toy, name))
    return build_machine(attrs.evolve(load_table(TOY_TABLE_PATH), **table_change), registry)


def test_event_with_no_row_in_this_state_is_illegal_and_names_state_and_event() -> None:
    table = load_table(TOY_TABLE_PATH)
    without_done_reset = _toy_variant({"rows": tuple(r for r in table.rows if r.number != 7)})
    done = MachineState("DONE", ToyContext(3, 3))
    before = copy.deepcopy(done)
    with pytest.raises(IllegalTransition) as error:
        without_done_reset.step(done, Reset())
    assert (error.value.control, error.value.trigger) == ("DONE", "reset")
    assert (
        "illegal transition" in str(error.value)
        and "'DONE'" in str(error.value)
        and "'reset'" in str(error.value)
    )
    # The caller keeps a valid state and can go on from it.
    assert done == before
    assert without_done_reset.step(done, Tick()) == (done, ())


def test_undeclared_trigger_is_illegal_and_lists_the_declared_ones() -> None:
    state = TOY.initial_state(ToyContext())
    with pytest.raises(
        IllegalTransition, match=r"no trigger 'pause'.*declared triggers: tick, reset"
    ):
        TOY.step(state, Pause())


def test_undeclared_control_state_is_refused() -> None:
    with pytest.raises(StepError, match="no state 'PAUSED'"):
        TOY.step(MachineState("PAUSED", ToyContext()), Tick())


def test_no_guard_holding_is_illegal_and_names_the_rows_tried() -> None:
    def never(context: ToyContext, event: object) -> bool:
        return False

    table = load_table(TOY_TABLE_PATH)
    rows = tuple(
        attrs.evolve(r, guard=GuardRef("never")) if r.number == 2 else r for r in table.rows
    )
    machine = _toy_variant({"rows": rows}, extra_guards=(never,))
    state = counting(1)
    with pytest.raises(
        IllegalTransition, match=r"no row's guard held .*row 2.*\[never\].*row 3.*\[at_limit\]"
    ):
        machine.step(state, Tick())
    assert state == counting(1)


def test_two_guards_holding_at_once_is_a_nondeterminism_error_naming_both_rows() -> None:
    def below_or_at_limit(context: ToyContext, event: object) -> bool:
        return context.count <= context.limit

    table = load_table(TOY_TABLE_PATH)
    rows = tuple(
        attrs.evolve(r, guard=GuardRef("below_or_at_limit")) if r.number == 2 else r
        for r in table.rows
    )
    machine = _toy_variant({"rows": rows}, extra_guards=(below_or_at_limit,))
    assert machine.step(counting(1), Tick())[0] == counting(2)  # one guard holds: fine
    with pytest.raises(
        NondeterministicStep, match=r"row 2.*\[below_or_at_limit\].*row 3.*\[at_limit\]"
    ):
        machine.step(counting(3), Tick())


def test_guard_returning_a_non_bool_is_refused() -> None:
    def at_limit(context: ToyContext, event: object) -> bool:
        return None  # type: ignore[return-value]

    registry = Actions()
    registry.guard(at_limit)
    for name in ("start_count", "increment", "report", "clear"):
        registry.effect(getattr(toy, name))
    for name in (
        "count_within_limit",
        "report_only_on_reaching_limit",
        "limit_reached",
        "count_abandoned",
    ):
        registry.predicate(getattr(toy, name))
    machine = build_machine(load_table(TOY_TABLE_PATH), registry)
    with pytest.raises(TypeError, match="guard 'at_limit' returned None"):
        machine.step(counting(1), Tick())


def _all_toy_states(limit: int) -> list[MachineState[ToyContext]]:
    states = [
        MachineState("IDLE", ToyContext(0, limit)),
        MachineState("DONE", ToyContext(limit, limit)),
    ]
    return states + [counting(count, limit) for count in range(1, limit + 1)]


def test_step_is_deterministic_and_does_not_mutate_its_inputs() -> None:
    for state, event in itertools.product(_all_toy_states(4), (Tick(), Reset())):
        state_before, event_before = copy.deepcopy(state), copy.deepcopy(event)
        first = TOY.step(state, event)
        assert TOY.step(state, event) == first
        assert (state, event) == (state_before, event_before)
        hash(first[0])  # frozen all the way down, so explorable


def test_compiled_step_agrees_with_the_transitions_machine_on_every_reachable_step() -> None:
    # A differential check against the design card's runtime, row selection and effects alike.
    checked = 0
    for state, event in itertools.product(_all_toy_states(4), (Tick(), Reset())):
        assert reference_step(TOY, state, event) == TOY.step(state, event)
        checked += 1
    assert checked == 2 * 6


def test_transitions_machine_refuses_what_the_table_refuses() -> None:
    table = load_table(TOY_TABLE_PATH)
    machine = _toy_variant({"rows": tuple(r for r in table.rows if r.number != 7)})
    with pytest.raises(IllegalTransition):
        reference_step(machine, MachineState("DONE", ToyContext(3, 3)), Reset())
