"""docs/design.md §3: the table, the compiled step and the ``transitions`` machine are compared in
both directions, so a transition that exists in only one of them is caught."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from scout.core.machine import Machine, SpecError, conformance_problems, load_machine, load_table
from scout.core.machine.reference import BoundGuard, build_transitions_machine
from scout.core.machine.runtime import CompiledRow
from scout.core.machine.table import TransitionRow
from tests.model_check.toy import TOY_TABLE_PATH
from tests.model_check.toy import actions as toy


def fresh_toy() -> Machine[Any]:
    # Each test mutates its own machine, so none can leak drift into another.
    return load_machine(TOY_TABLE_PATH)


def test_toy_table_compiled_step_and_transitions_machine_agree() -> None:
    machine = fresh_toy()
    assert conformance_problems(machine) == []
    reference = machine.transitions_machine
    assert not reference.auto_transitions
    assert list(reference.states) == ["IDLE", "COUNTING", "DONE"]
    assert sum(len(reference.get_transitions(trigger=t)) for t in reference.events) == len(
        machine.table.rows
    )


def test_row_missing_from_transitions_machine_is_reported() -> None:
    machine = fresh_toy()
    machine.transitions_machine.remove_transition("reset", source="DONE", dest="IDLE")
    assert conformance_problems(machine) == [
        "triggers accepted in DONE differ: table ['reset', 'tick'], transitions machine ['tick']",
        "in the table but not the transitions machine: DONE --reset / clear--> IDLE",
    ]


def test_transition_only_in_transitions_machine_is_reported() -> None:
    machine = fresh_toy()
    machine.transitions_machine.add_transition("tick", "IDLE", "DONE")
    assert conformance_problems(machine) == [
        "in the transitions machine but not the table: IDLE --tick--> DONE",
    ]


def test_flipped_guard_polarity_in_transitions_machine_is_reported() -> None:
    machine = fresh_toy()
    (transition,) = machine.transitions_machine.get_transitions(
        "tick", source="COUNTING", dest="DONE"
    )
    transition.conditions[0].target = False
    problems = conformance_problems(machine)
    assert (
        "in the table but not the transitions machine: COUNTING --tick [at_limit] / report--> DONE"
        in problems
    )
    assert (
        "in the transitions machine but not the table: COUNTING --tick [!at_limit] / report--> DONE"
        in problems
    )


def test_foreign_callback_in_transitions_machine_is_reported() -> None:
    machine = fresh_toy()
    (transition,) = machine.transitions_machine.get_transitions("tick", source="IDLE")
    transition.after.append(print)
    assert any("<extra callback <foreign" in problem for problem in conformance_problems(machine))


def test_row_missing_from_compiled_step_is_reported() -> None:
    machine = fresh_toy()
    machine.rows_by_key = {
        key: rows for key, rows in machine.rows_by_key.items() if key != ("IDLE", "tick")
    }
    assert conformance_problems(machine) == [
        "in the table but not the compiled step: IDLE --tick / start_count--> COUNTING",
    ]


def test_row_only_in_compiled_step_is_reported() -> None:
    machine = fresh_toy()
    extra_row = TransitionRow(99, "DONE", "tick", "IDLE", None, "", "not in the table")
    rows = dict(machine.rows_by_key)
    rows[("DONE", "tick")] = (*rows[("DONE", "tick")], CompiledRow(extra_row, None, None, "IDLE"))
    machine.rows_by_key = rows
    assert conformance_problems(machine) == [
        "in the compiled step but not the table: DONE --tick--> IDLE"
    ]


def test_compiled_row_calling_an_unregistered_function_is_reported() -> None:
    machine = fresh_toy()
    ((_, row),) = [
        (k, r)
        for k, rows in machine.rows_by_key.items()
        for r in rows
        if r.guard_name == "at_limit" and not r.negated
    ]
    row.guard = lambda context, event: True
    assert conformance_problems(machine) == [
        "compiled row 3: COUNTING --tick [at_limit] / report--> DONE: guard function is not the registered 'at_limit'"
    ]


def test_transitions_machine_is_read_back_with_guard_names() -> None:
    machine = fresh_toy()
    (transition,) = machine.transitions_machine.get_transitions(
        "tick", source="COUNTING", dest="COUNTING"
    )
    (condition,) = transition.conditions
    assert isinstance(condition.func, BoundGuard)
    assert (condition.func.name, condition.target) == ("at_limit", False)


def test_building_a_transitions_machine_with_an_undeclared_state_fails_at_build_time() -> None:
    # transitions itself accepts such a row and only fails when it fires.
    table = load_table(TOY_TABLE_PATH)
    bad = attrs.evolve(table, rows=(attrs.evolve(table.rows[0], dest="NOWHERE"), *table.rows[1:]))
    with pytest.raises(SpecError, match="dest state 'NOWHERE' is not declared"):
        build_transitions_machine(bad, toy.ACTIONS)
