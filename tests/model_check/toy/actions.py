"""Guards, effects and predicates of the toy machine (toy.toml)."""

from __future__ import annotations

from typing import ClassVar

import attrs

from scout.core.machine import Actions, MachineState


@attrs.frozen
class ToyContext:
    count: int = 0
    limit: int = 3


@attrs.frozen
class Tick:
    trigger: ClassVar[str] = "tick"


@attrs.frozen
class Reset:
    trigger: ClassVar[str] = "reset"


@attrs.frozen
class Started:
    pass


@attrs.frozen
class Counted:
    count: int


@attrs.frozen
class Reported:
    count: int


@attrs.frozen
class Cleared:
    count: int


ToyState = MachineState[ToyContext]
ToyOutcome = tuple[ToyContext, tuple[object, ...]]

ACTIONS = Actions()


@ACTIONS.guard
def at_limit(context: ToyContext, event: Tick) -> bool:
    return context.count >= context.limit


@ACTIONS.effect
def start_count(context: ToyContext, event: Tick) -> ToyOutcome:
    return attrs.evolve(context, count=1), (Started(),)


@ACTIONS.effect
def increment(context: ToyContext, event: Tick) -> ToyOutcome:
    count = context.count + 1
    return attrs.evolve(context, count=count), (Counted(count),)


@ACTIONS.effect
def report(context: ToyContext, event: Tick) -> ToyOutcome:
    return context, (Reported(context.count),)


@ACTIONS.effect
def clear(context: ToyContext, event: Reset) -> ToyOutcome:
    return attrs.evolve(context, count=0), (Cleared(context.count),)


@ACTIONS.predicate
def count_within_limit(state: ToyState) -> bool:
    return 0 <= state.context.count <= state.context.limit


@ACTIONS.predicate
def report_only_on_reaching_limit(
    previous: ToyState, event: object, state: ToyState, effects: tuple[object, ...]
) -> bool:
    reports = [effect for effect in effects if isinstance(effect, Reported)]
    reached = previous.control == "COUNTING" and state.control == "DONE"
    return len(reports) == (1 if reached else 0)


@ACTIONS.predicate
def limit_reached(state: ToyState) -> bool:
    return state.control == "DONE"


@ACTIONS.predicate
def count_abandoned(
    previous: ToyState, event: object, state: ToyState, effects: tuple[object, ...]
) -> bool:
    return previous.control == "COUNTING" and isinstance(event, Reset)


def every_event(state: ToyState) -> tuple[Tick | Reset, ...]:
    """The toy's environment: the world can tick or reset in any state."""
    return (Tick(), Reset())
