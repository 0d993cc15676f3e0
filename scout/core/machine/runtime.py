"""The pure face of a machine: ``step(state, event) -> (state, effects)``.

Steps run from a dict compiled from the table, ``(control, trigger) -> rows``, not through the
``transitions`` library: it fires the first row whose conditions pass, so it cannot refuse two
guards holding at once, and it keeps the control state in a mutable model object. (The
compiled step is also about 3.5 times faster.) The ``transitions`` machine is built from the
same table only when a test asks for it (``Machine.transitions_machine``), and
``conformance.conformance_problems`` compares the two in both directions so neither drifts.

Step rules (docs/spec-format.md):
- the event's ``trigger`` selects the rows with this source and trigger; their guards are all
  evaluated, and exactly one must hold. None holding raises :class:`IllegalTransition`; two
  holding raises :class:`NondeterministicStep`. The caller's state is untouched either way.
- the chosen row's effect (if any) maps ``(context, event)`` to ``(new context, effects)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import attrs

from scout.core.machine.actions import Actions, Effect, Guard, expected_arity, positional_arity
from scout.core.machine.errors import IllegalTransition, NondeterministicStep, SpecError, StepError
from scout.core.machine.properties import Property
from scout.core.machine.table import MachineTable, TransitionRow

if TYPE_CHECKING:
    import transitions

C = TypeVar("C")
S = TypeVar("S")


class Event(Protocol):
    """Any frozen value with a ``trigger`` name, usually a class attribute:
    ``@attrs.frozen class Tick: trigger: ClassVar[str] = "tick"; now_s: float``."""

    @property
    def trigger(self) -> str: ...


@attrs.frozen
class MachineState(Generic[C]):
    """Control state (a name from the table) plus the extended data the actions define.
    Both are immutable and hashable, so the explorer can deduplicate states."""

    control: str  # a member of the actions' ``states`` enum (a str) when the table has one
    context: C


@attrs.frozen
class Firing(Generic[S]):
    """What one step produced, plus the labels of the rows that fired (coverage for the explorer)."""

    state: S
    effects: tuple[object, ...]
    labels: tuple[str, ...]


class CompiledRow:
    """One table row with its guard and effect resolved to functions."""

    __slots__ = ("dest", "effect", "effect_name", "guard", "guard_name", "negated", "row")

    def __init__(
        self, row: TransitionRow, guard: Guard | None, effect: Effect | None, dest: str
    ) -> None:
        self.row = row
        self.dest = dest
        self.guard = guard
        self.guard_name = row.guard.name if row.guard else ""
        self.negated = row.guard.negated if row.guard else False
        self.effect = effect
        self.effect_name = row.effect

    def holds(self, context: object, event: Event) -> bool:
        if self.guard is None:
            return True
        result = self.guard(context, event)
        if result is not True and result is not False:
            raise TypeError(
                f"guard {self.guard_name!r} returned {result!r} for event {event!r}; guards must return a bool"
            )
        return result is not self.negated


class Machine(Generic[C]):
    """A machine table bound to its Python functions, not changed after construction; ``step``
    never mutates its inputs and gives the same output for the same input."""

    def __init__(
        self,
        table: MachineTable,
        actions: Actions,
        rows_by_key: Mapping[tuple[str, str], tuple[CompiledRow, ...]],
        properties: tuple[Property, ...],
    ) -> None:
        self.table = table
        self.actions = actions
        self.rows_by_key = rows_by_key
        self.properties = properties
        self._reference: transitions.Machine | None = None
        self.labels = tuple(row.label for row in table.rows)
        self._state_names = frozenset(table.state_names)
        self._triggers = frozenset(table.triggers)

    @property
    def name(self) -> str:
        return self.table.name

    @property
    def transitions_machine(self) -> transitions.Machine:
        """The same table as a ``transitions`` machine: the conformance tests' oracle, built
        the first time a test asks for it and never on the product's path."""
        if self._reference is None:
            from scout.core.machine.reference import build_transitions_machine

            self._reference = build_transitions_machine(self.table, self.actions)
        return self._reference

    def control(self, name: str) -> str:
        """The control state called ``name`` (the enum member when the actions define states).
        Raises ValueError naming the value for a name the table does not have."""
        if name not in self._state_names:
            raise ValueError(
                f"machine {self.name!r} has no state {name!r}; its states are {sorted(self._state_names)}"
            )
        states = self.actions.states
        return name if states is None else states(name)

    def initial_state(self, context: C) -> MachineState[C]:
        return MachineState(self.control(self.table.initial), context)

    def step(
        self, state: MachineState[C], event: Event
    ) -> tuple[MachineState[C], tuple[object, ...]]:
        firing = self.fire(state, event)
        return firing.state, firing.effects

    def fire(self, state: MachineState[C], event: Event) -> Firing[MachineState[C]]:
        rows = self.rows_by_key.get((state.control, event.trigger))
        if rows is None:
            raise self._no_rows(state, event)
        context = state.context
        if len(rows) == 1:
            chosen = rows[0]
            if not chosen.holds(context, event):
                raise self._no_guard_held(state, event, rows)
        else:
            holding = [row for row in rows if row.holds(context, event)]
            if not holding:
                raise self._no_guard_held(state, event, rows)
            if len(holding) > 1:
                raise self._nondeterministic(state, event, holding)
            chosen = holding[0]
        if chosen.effect is None:
            if chosen.dest == state.control:
                return Firing(state, (), (chosen.row.label,))
            return Firing(MachineState(chosen.dest, context), (), (chosen.row.label,))
        outcome = chosen.effect(context, event)
        if not (isinstance(outcome, tuple) and len(outcome) == 2 and isinstance(outcome[1], tuple)):
            raise TypeError(
                f"effect {chosen.effect_name!r} returned {outcome!r}; "
                "effects must return (new_context, tuple_of_effect_values)"
            )
        return Firing(MachineState(chosen.dest, outcome[0]), outcome[1], (chosen.row.label,))

    def _no_rows(self, state: MachineState[C], event: Event) -> StepError:
        trigger = getattr(event, "trigger", None)
        if not isinstance(trigger, str) or trigger not in self._triggers:
            return IllegalTransition(
                f"machine {self.name!r} has no trigger {trigger!r} (event {event!r}); "
                f"declared triggers: {', '.join(self.table.triggers)}",
                control=state.control,
                trigger=str(trigger),
            )
        if state.control not in self._state_names:
            return StepError(
                f"machine {self.name!r} has no state {state.control!r}; "
                f"declared states: {', '.join(self.table.state_names)}"
            )
        return IllegalTransition(
            f"illegal transition in machine {self.name!r}: event {trigger!r} ({event!r}) is not "
            f"accepted in state {state.control!r}; no row of {self.table.source} has source "
            f"{state.control} and trigger {trigger}. State unchanged. If the event can happen "
            "there, add a row for it (dest = source and no effect declares it ignored).",
            control=state.control,
            trigger=trigger,
        )

    def _no_guard_held(
        self, state: MachineState[C], event: Event, rows: tuple[CompiledRow, ...]
    ) -> IllegalTransition:
        tried = "; ".join(row.row.label for row in rows)
        return IllegalTransition(
            f"illegal transition in machine {self.name!r}: event {event.trigger!r} ({event!r}) in "
            f"state {state.control!r}: no row's guard held (tried {tried}) with context "
            f"{state.context!r}. State unchanged. Make the guards of these rows cover this case.",
            control=state.control,
            trigger=event.trigger,
        )

    def _nondeterministic(
        self, state: MachineState[C], event: Event, holding: list[CompiledRow]
    ) -> NondeterministicStep:
        rows = "; ".join(row.row.label for row in holding)
        return NondeterministicStep(
            f"nondeterministic step in machine {self.name!r}: event {event.trigger!r} ({event!r}) in "
            f"state {state.control!r} with context {state.context!r} satisfies the guards of "
            f"several rows ({rows}). The guards of rows sharing (source, trigger) must exclude "
            f"each other; fix them in {self.table.source} or in {self.table.actions}.",
            control=state.control,
            trigger=event.trigger,
        )


def _check_arity(
    problems: list[str], where: str, kind: str, name: str, function: Any, scope: str = "state"
) -> None:
    arity = positional_arity(function)
    wanted = expected_arity(kind, scope)
    if arity is not None and arity != wanted:
        problems.append(
            f"{where}: {kind} {name!r} takes {arity} positional argument(s), a {kind} takes {wanted}"
        )


def build_machine(table: MachineTable, actions: Actions) -> Machine[Any]:
    """Bind a validated table to its functions. Raises :class:`SpecError` naming every row or
    invariant whose name the actions lack, and every action nothing in the table uses."""
    problems: list[str] = []
    states = actions.states
    if states is not None:
        enum_names = {member.value for member in states}
        if enum_names != set(table.state_names):
            problems.append(
                f"{table.actions}: the states enum {states.__name__} names {sorted(enum_names)}, the "
                f"table {sorted(table.state_names)}; make them the same"
            )
            states = None

    def control(name: str) -> str:
        return name if states is None else states(name)

    used: set[str] = set()
    rows_by_key: dict[tuple[str, str], list[CompiledRow]] = {}
    for row in table.rows:
        guard: Guard | None = None
        effect: Effect | None = None
        if row.guard is not None:
            used.add(row.guard.name)
            guard = actions.guards.get(row.guard.name)
            if guard is None:
                problems.append(
                    f"{row.label}: guard {row.guard.name!r} is not registered in {table.actions}"
                )
            else:
                _check_arity(problems, row.label, "guard", row.guard.name, guard)
        if row.effect:
            used.add(row.effect)
            effect = actions.effects.get(row.effect)
            if effect is None:
                problems.append(
                    f"{row.label}: effect {row.effect!r} is not registered in {table.actions}"
                )
            else:
                _check_arity(problems, row.label, "effect", row.effect, effect)
        rows_by_key.setdefault((row.source, row.trigger), []).append(
            CompiledRow(row, guard, effect, control(row.dest))
        )

    properties: list[Property] = []
    for invariant in table.invariants:
        used.add(invariant.predicate)
        where = f"[[invariant]] {invariant.id}"
        predicate = actions.predicates.get(invariant.predicate)
        if predicate is None:
            problems.append(
                f"{where}: predicate {invariant.predicate!r} is not registered in {table.actions}"
            )
            continue
        _check_arity(problems, where, "predicate", invariant.predicate, predicate, invariant.scope)
        properties.append(
            Property(invariant.id, invariant.kind, invariant.scope, invariant.text, predicate)
        )

    for kind, registry in (
        ("guard", actions.guards),
        ("effect", actions.effects),
        ("predicate", actions.predicates),
    ):
        for name in registry:
            if name not in used:
                problems.append(
                    f"{table.actions}: {kind} {name!r} is registered but no row or invariant names it; "
                    "add it to the table or delete it"
                )
    if problems:
        body = "\n".join(f"  - {line}" for line in problems)
        raise SpecError(
            f"{table.source}: actions do not match the table ({len(problems)} problem(s)):\n{body}"
        )

    compiled = {key: tuple(rows) for key, rows in rows_by_key.items()}
    return Machine(table, actions, compiled, tuple(properties))
