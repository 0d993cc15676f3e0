"""The same table as a ``transitions`` library machine: the design card's runtime, kept as the
reference the compiled step is checked against (``conformance``) and as a slow second
implementation for differential tests (``reference_step``).

Guards become conditions (``unless`` when negated) and effects ``before`` callbacks, each a
small named callable so the machine can be read back row by row. No model holds extended
state: context and event travel in the trigger's keyword arguments.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs
import transitions

from scout.core.machine.actions import Actions, Effect, Guard
from scout.core.machine.errors import IllegalTransition, SpecError
from scout.core.machine.table import MachineTable

if TYPE_CHECKING:
    from scout.core.machine.runtime import Event, Machine, MachineState


@attrs.frozen
class BoundGuard:
    name: str
    function: Guard

    def __call__(self, event_data: transitions.core.EventData) -> bool:
        return self.function(event_data.kwargs["context"], event_data.kwargs["event"])


@attrs.frozen
class BoundEffect:
    name: str
    function: Effect

    def __call__(self, event_data: transitions.core.EventData) -> None:
        outcome = self.function(event_data.kwargs["context"], event_data.kwargs["event"])
        event_data.kwargs["outcome"].append(outcome)


class _ReferenceModel:
    """The one model object of a reference machine; only its control state lives here."""

    state: str


def build_transitions_machine(table: MachineTable, actions: Actions) -> transitions.Machine:
    machine = transitions.Machine(
        model=None,
        states=list(table.state_names),
        initial=table.initial,
        auto_transitions=False,
        send_event=True,
        ignore_invalid_triggers=False,
        name=table.name,
    )
    for row in table.rows:
        # transitions accepts a transition between undeclared states and fails only when it
        # fires, so an undeclared name is refused here, when the machine is built.
        for role, name in (("source", row.source), ("dest", row.dest)):
            if name not in machine.states:
                raise SpecError(
                    f"{table.source}: {row.label}: {role} state {name!r} is not declared"
                )
        conditions: list[transitions.core.Callback] = []
        unless: list[transitions.core.Callback] = []
        if row.guard is not None:
            bound = BoundGuard(row.guard.name, actions.guards[row.guard.name])
            (unless if row.guard.negated else conditions).append(bound)
        before: list[transitions.core.Callback] = []
        if row.effect:
            before.append(BoundEffect(row.effect, actions.effects[row.effect]))
        machine.add_transition(
            row.trigger, row.source, row.dest, conditions=conditions, unless=unless, before=before
        )
    machine.add_model(_ReferenceModel(), initial=table.initial)
    return machine


def reference_step(
    machine: Machine[Any], state: MachineState[Any], event: Event
) -> tuple[MachineState[Any], tuple[object, ...]]:
    """Take one step through the ``transitions`` machine. Slow and unlike ``Machine.step`` it
    does not detect overlapping guards (``transitions`` takes the first row that passes), so
    it is an oracle for deterministic tables only."""
    from scout.core.machine.runtime import MachineState

    reference = machine.transitions_machine
    (model,) = reference.models
    reference.set_state(state.control, model)
    event_name = event.trigger
    if event_name not in reference.events:
        raise IllegalTransition(
            f"reference machine {machine.name!r} has no trigger {event_name!r}",
            control=state.control,
            trigger=event_name,
        )
    outcome: list[tuple[object, tuple[object, ...]]] = []
    try:
        taken = reference.events[event_name].trigger(
            model, context=state.context, event=event, outcome=outcome
        )
    except transitions.MachineError as error:
        raise IllegalTransition(str(error), control=state.control, trigger=event_name) from error
    if not taken:
        raise IllegalTransition(
            f"reference machine {machine.name!r}: no guard held for {event_name!r} in {state.control!r}",
            control=state.control,
            trigger=event_name,
        )
    new_control: str = model.state
    if not outcome:
        return MachineState(new_control, state.context), ()
    new_context, effects = outcome[0]
    return MachineState(new_control, new_context), effects
