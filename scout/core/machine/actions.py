"""The Python half of a machine: guards, effects and invariant predicates, registered by name.

An actions module creates one :class:`Actions` named ``ACTIONS`` and decorates its functions::

    ACTIONS = Actions(states=ObserverState)     # the table's control states as an enum

    @ACTIONS.guard
    def idle_over_threshold(context: ObserverContext, event: Tick) -> bool: ...

    @ACTIONS.effect
    def start_round(context: ObserverContext, event: Tick) -> tuple[ObserverContext, tuple[Effect, ...]]: ...

    @ACTIONS.predicate
    def one_report_per_position(state: MachineState[ObserverContext]) -> bool: ...

The table names these functions; registering each by its kind lets the loader reject a guard
named where an effect belongs, and a function that no row or invariant uses (code that exists
only in code; docs/spec-format.md). Guards and effects must be pure: same inputs, same outputs, inputs
not mutated. Effects return the new context and a tuple of frozen effect values.
"""

from __future__ import annotations

import enum
import inspect
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, TypeVar

from scout.core.machine.errors import SpecError

# The context and event types are the actions module's own; the machinery only passes them through.
Guard = Callable[[Any, Any], bool]
Effect = Callable[[Any, Any], tuple[Any, tuple[object, ...]]]
# state scope: (state) -> bool; step scope: (previous, event, next, effects) -> bool
Predicate = Callable[..., bool]

F = TypeVar("F", bound=Callable[..., Any])

_KIND_PARAMETERS = {"guard": 2, "effect": 2}


class Actions:
    """Name -> function registries for one machine, filled by decorators at import time."""

    def __init__(self, states: type[enum.Enum] | None = None) -> None:
        # The table's control states as a ``str``-valued enum (one member per state, value =
        # the table's name): steps then carry members, so code compares ``state.control is
        # ObserverState.STOPPED`` and never a string literal. The loader checks that the enum
        # and the table name the same states.
        if states is not None and not (issubclass(states, enum.Enum) and issubclass(states, str)):
            raise SpecError(f"Actions(states={states!r}): the states must be a (str, enum.Enum) class")
        self.states = states
        self._guards: dict[str, Guard] = {}
        self._effects: dict[str, Effect] = {}
        self._predicates: dict[str, Predicate] = {}

    def guard(self, function: F) -> F:
        self._register("guard", self._guards, function)
        return function

    def effect(self, function: F) -> F:
        self._register("effect", self._effects, function)
        return function

    def predicate(self, function: F) -> F:
        self._register("predicate", self._predicates, function)
        return function

    @property
    def guards(self) -> Mapping[str, Guard]:
        return MappingProxyType(self._guards)

    @property
    def effects(self) -> Mapping[str, Effect]:
        return MappingProxyType(self._effects)

    @property
    def predicates(self) -> Mapping[str, Predicate]:
        return MappingProxyType(self._predicates)

    def _register(self, kind: str, registry: dict[str, Any], function: Callable[..., Any]) -> None:
        name = getattr(function, "__name__", "")
        if not name.isidentifier():
            raise SpecError(
                f"cannot register {function!r} as a {kind}: it has no plain function name"
            )
        for other_kind, other in (
            ("guard", self._guards),
            ("effect", self._effects),
            ("predicate", self._predicates),
        ):
            if name in other:
                raise SpecError(
                    f"{kind} {name!r} is already registered as a {other_kind}; "
                    "names are shared by all kinds, so rename one of them"
                )
        registry[name] = function


def positional_arity(function: Callable[..., Any]) -> int | None:
    """How many positional arguments ``function`` takes, or None when it cannot be told
    (builtins, ``*args``); the loader then skips the arity check rather than guess."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return None
    count = 0
    for parameter in signature.parameters.values():
        if parameter.kind is parameter.VAR_POSITIONAL:
            return None
        if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD) and (
            parameter.default is parameter.empty
        ):
            count += 1
    return count


def expected_arity(kind: str, scope: str = "state") -> int:
    if kind == "predicate":
        return 1 if scope == "state" else 4
    return _KIND_PARAMETERS[kind]
