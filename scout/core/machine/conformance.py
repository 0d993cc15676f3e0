"""Read the three forms of a machine back as edges and compare them in both directions:
the table (the spec), the compiled step dict (what runs), and the ``transitions`` machine
(the design card's runtime). A row missing from one form, or present only in one, is a
problem; so are differing states, triggers or initial state. No transition exists only in
code (docs/design.md §3).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import attrs
import transitions

from scout.core.machine.reference import BoundEffect, BoundGuard
from scout.core.machine.runtime import Machine


@attrs.frozen(order=True)
class Edge:
    source: str
    trigger: str
    dest: str
    guard: str  # "" for none, "!name" when negated
    effect: str  # "" for none

    def __str__(self) -> str:
        guard = f" [{self.guard}]" if self.guard else ""
        effect = f" / {self.effect}" if self.effect else ""
        return f"{self.source} --{self.trigger}{guard}{effect}--> {self.dest}"


def table_edges(machine: Machine[Any]) -> Counter[Edge]:
    return Counter(
        Edge(row.source, row.trigger, row.dest, str(row.guard) if row.guard else "", row.effect)
        for row in machine.table.rows
    )


def compiled_edges(machine: Machine[Any]) -> Counter[Edge]:
    edges: Counter[Edge] = Counter()
    for (source, trigger), rows in machine.rows_by_key.items():
        for row in rows:
            guard = ("!" if row.negated else "") + row.guard_name if row.guard is not None else ""
            edges[
                Edge(source, trigger, row.dest, guard, row.effect_name if row.effect else "")
            ] += 1
    return edges


def _callback_name(callback: object, kind: type[BoundGuard] | type[BoundEffect]) -> str:
    # A callback that is not one of ours was added outside the table: name it so it shows up.
    return callback.name if isinstance(callback, kind) else f"<foreign {callback!r}>"


def transitions_edges(machine: transitions.Machine) -> Counter[Edge]:
    edges: Counter[Edge] = Counter()
    for trigger in machine.events:
        for transition in machine.get_transitions(trigger=trigger):
            guards = [
                ("" if condition.target else "!") + _callback_name(condition.func, BoundGuard)
                for condition in transition.conditions
            ]
            effects = [_callback_name(callback, BoundEffect) for callback in transition.before]
            extra = [
                _callback_name(c, BoundEffect) for c in (*transition.prepare, *transition.after)
            ]
            effect = " & ".join(effects + [f"<extra callback {name}>" for name in extra])
            # An internal transition (dest None) has no row form; name it so it cannot pass as a self-loop.
            dest = transition.dest if transition.dest is not None else "<internal: no dest>"
            edges[Edge(transition.source, trigger, dest, " & ".join(guards), effect)] += 1
    return edges


def _compare(
    problems: list[str], left_name: str, left: Counter[Edge], right_name: str, right: Counter[Edge]
) -> None:
    for edge in sorted((left - right).elements()):
        problems.append(f"in the {left_name} but not the {right_name}: {edge}")
    for edge in sorted((right - left).elements()):
        problems.append(f"in the {right_name} but not the {left_name}: {edge}")


def _check_function_identity(problems: list[str], machine: Machine[Any]) -> None:
    """The compiled rows must call exactly the functions the actions registered."""
    for rows in machine.rows_by_key.values():
        for row in rows:
            if (
                row.guard is not None
                and machine.actions.guards.get(row.guard_name) is not row.guard
            ):
                problems.append(
                    f"compiled {row.row.label}: guard function is not the registered {row.guard_name!r}"
                )
            if (
                row.effect is not None
                and machine.actions.effects.get(row.effect_name) is not row.effect
            ):
                problems.append(
                    f"compiled {row.row.label}: effect function is not the registered {row.effect_name!r}"
                )


def conformance_problems(machine: Machine[Any]) -> list[str]:
    """Every difference between the table, the compiled step and the ``transitions`` machine;
    empty when they agree."""
    problems: list[str] = []
    reference = machine.transitions_machine
    table = machine.table
    if list(reference.states) != list(table.state_names):
        problems.append(
            f"states differ: table {list(table.state_names)}, transitions machine {list(reference.states)}"
        )
    if reference.initial != table.initial:
        problems.append(
            f"initial differs: table {table.initial!r}, transitions machine {reference.initial!r}"
        )
    if reference.auto_transitions:
        problems.append(
            "the transitions machine has auto_transitions on: it adds to_<state> triggers no row declares"
        )
    if sorted(reference.events) != sorted(table.triggers):
        problems.append(
            f"triggers differ: table {sorted(table.triggers)}, transitions machine {sorted(reference.events)}"
        )
    for state in table.state_names:
        declared = sorted({row.trigger for row in table.rows if row.source == state})
        built = sorted(reference.get_triggers(state))
        if declared != built:
            problems.append(
                f"triggers accepted in {state} differ: table {declared}, transitions machine {built}"
            )
    expected = table_edges(machine)
    _compare(problems, "table", expected, "transitions machine", transitions_edges(reference))
    _compare(problems, "table", expected, "compiled step", compiled_edges(machine))
    _check_function_identity(problems, machine)
    return problems
