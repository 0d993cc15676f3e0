"""Bounded breadth-first exploration of the real step function (docs/design.md §3).

From the initial states, every event the environment enables is stepped, states are
deduplicated by hash, and every property is checked: ``always`` in every reached state (or
every executed step), ``sometimes`` must be witnessed at least once. Breadth-first order makes
the first failure found one with the fewest events, so the reported trace is a shortest one.

A step that raises (an illegal transition, overlapping guards, a crashing effect) is a failure
too: the environment offers what the world can do, and the machine must handle all of it.

Bounds: ``depth_max`` (events per trace) and ``states_max`` (distinct states stored); the result
says whether either cut exploration short, and ``require_exhaustive=True`` turns a cut into a
failure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Generic, Protocol, TypeVar

import attrs

from scout.core.machine.errors import ModelCheckFailure
from scout.core.machine.properties import Property
from scout.core.machine.runtime import Firing

S = TypeVar("S")
E = TypeVar("E")
E_contra = TypeVar("E_contra", contravariant=True)


class Explorable(Protocol[S, E_contra]):
    """What the explorer needs: a step that reports the labels of what fired, the properties
    to check, and every label it can fire (for coverage). :class:`Machine` is one; a composed
    system of several machines and a network can be another."""

    @property
    def properties(self) -> Sequence[Property]: ...

    @property
    def labels(self) -> Sequence[str]: ...

    def fire(self, state: S, event: E_contra) -> Firing[S]: ...


@attrs.frozen
class TraceStep(Generic[S, E]):
    event: E
    state: S  # after the event; unchanged when the step raised
    effects: tuple[object, ...]
    error: str = ""  # what the step raised, for the last step of a failing trace


@attrs.frozen
class Trace(Generic[S, E]):
    initial: S
    steps: tuple[TraceStep[S, E], ...]

    @property
    def events(self) -> tuple[E, ...]:
        return tuple(step.event for step in self.steps)

    @property
    def states(self) -> tuple[S, ...]:
        return (self.initial, *(step.state for step in self.steps))

    def format(self) -> str:
        lines = [f"  initial: {self.initial!r}"]
        for number, step in enumerate(self.steps, start=1):
            lines.append(f"  {number}. {step.event!r}")
            if step.error:
                lines.append(f"     raised {step.error}")
                continue
            lines.append(f"     -> {step.state!r}")
            if step.effects:
                lines.append(f"     effects: {step.effects!r}")
        return "\n".join(lines)


@attrs.frozen
class ExplorationResult(Generic[S, E]):
    states_count: int
    transitions_count: int  # steps executed, including those into already-seen states
    depth_reached: int
    depth_max: int
    states_max: int
    cut_by_depth: bool  # some state at depth_max had a successor left unexplored
    cut_by_states: bool  # a new state was found when states_max were already stored
    witnesses: Mapping[str, Trace[S, E]]  # sometimes-property id -> shortest witness
    labels_unfired: tuple[str, ...]  # e.g. table rows no explored step fired

    @property
    def truncated(self) -> bool:
        return self.cut_by_depth or self.cut_by_states

    def summary(self) -> str:
        cuts = [
            name
            for name, cut in (("depth_max", self.cut_by_depth), ("states_max", self.cut_by_states))
            if cut
        ]
        cut_text = f"cut by {' and '.join(cuts)}" if cuts else "not cut: exhaustive"
        return (
            f"explored {self.states_count} states and {self.transitions_count} transitions to depth "
            f"{self.depth_reached} (depth_max={self.depth_max}, states_max={self.states_max}; {cut_text}); "
            f"witnessed: {', '.join(sorted(self.witnesses)) or 'none'}; "
            f"never fired: {'; '.join(self.labels_unfired) or 'none'}"
        )


class _Search(Generic[S, E]):
    def __init__(
        self,
        system: Explorable[S, E],
        enabled_events: Callable[[S], Iterable[E]],
        properties: Sequence[Property],
        depth_max: int,
        states_max: int,
    ) -> None:
        self.system = system
        self.enabled_events = enabled_events
        self.depth_max = depth_max
        self.states_max = states_max
        self.state_always = [p for p in properties if p.kind == "always" and p.scope == "state"]
        self.step_always = [p for p in properties if p.kind == "always" and p.scope == "step"]
        self.state_sometimes = [
            p for p in properties if p.kind == "sometimes" and p.scope == "state"
        ]
        self.step_sometimes = [p for p in properties if p.kind == "sometimes" and p.scope == "step"]
        # Each stored state maps to how it was first reached; None marks an initial state.
        self.parents: dict[S, tuple[S, E, tuple[object, ...]] | None] = {}
        self.witnesses: dict[str, Trace[S, E]] = {}
        self.fired: set[str] = set()
        self.transitions_count = 0
        self.depth_reached = 0
        self.cut_by_depth = False
        self.cut_by_states = False

    def result(self) -> ExplorationResult[S, E]:
        return ExplorationResult(
            states_count=len(self.parents),
            transitions_count=self.transitions_count,
            depth_reached=self.depth_reached,
            depth_max=self.depth_max,
            states_max=self.states_max,
            cut_by_depth=self.cut_by_depth,
            cut_by_states=self.cut_by_states,
            witnesses=dict(self.witnesses),
            labels_unfired=tuple(label for label in self.system.labels if label not in self.fired),
        )

    def trace_to(self, state: S) -> Trace[S, E]:
        steps: list[TraceStep[S, E]] = []
        link = self.parents[state]
        while link is not None:
            previous, event, effects = link
            steps.append(TraceStep(event, state, effects))
            state = previous
            link = self.parents[state]
        return Trace(state, tuple(reversed(steps)))

    def trace_through(
        self, previous: S, event: E, state: S, effects: tuple[object, ...]
    ) -> Trace[S, E]:
        before = self.trace_to(previous)
        return Trace(before.initial, (*before.steps, TraceStep(event, state, effects)))

    def fail(
        self, headline: str, trace: Trace[S, E] | None, property_id: str | None = None
    ) -> ModelCheckFailure:
        result = self.result()
        message = headline
        if trace is not None:
            message += f"\nshortest failing trace ({len(trace.steps)} events):\n{trace.format()}"
        message += f"\n{result.summary()}"
        return ModelCheckFailure(message, result=result, trace=trace, property_id=property_id)

    def check(
        self, prop: Property, arguments: tuple[object, ...], trace: Callable[[], Trace[S, E]]
    ) -> bool:
        try:
            verdict = prop.predicate(*arguments)
        except Exception as error:
            raise self.fail(
                f"predicate of {prop.describe()} raised {error!r}", trace(), prop.id
            ) from error
        if verdict is not True and verdict is not False:
            raise self.fail(
                f"predicate of {prop.describe()} returned {verdict!r}, not a bool", trace(), prop.id
            )
        return verdict

    def check_state(self, state: S) -> None:
        for prop in self.state_always:
            if not self.check(prop, (state,), lambda: self.trace_to(state)):
                trace = self.trace_to(state)
                raise self.fail(
                    f"{prop.describe()} violated after {len(trace.steps)} events", trace, prop.id
                )
        for prop in self.state_sometimes:
            if prop.id not in self.witnesses and self.check(
                prop, (state,), lambda: self.trace_to(state)
            ):
                self.witnesses[prop.id] = self.trace_to(state)

    def check_step(self, previous: S, event: E, firing: Firing[S]) -> None:
        arguments = (previous, event, firing.state, firing.effects)

        def trace() -> Trace[S, E]:
            return self.trace_through(previous, event, firing.state, firing.effects)

        for prop in self.step_always:
            if not self.check(prop, arguments, trace):
                failing = trace()
                raise self.fail(
                    f"{prop.describe()} violated by event {len(failing.steps)}", failing, prop.id
                )
        for prop in self.step_sometimes:
            if prop.id not in self.witnesses and self.check(prop, arguments, trace):
                self.witnesses[prop.id] = trace()

    def store(self, state: S, link: tuple[S, E, tuple[object, ...]] | None) -> bool:
        """Record a state the first time it is seen; False when it was known or the bound is full."""
        try:
            if state in self.parents:
                return False
        except TypeError as error:
            raise TypeError(
                f"state {state!r} is not hashable; make the context a frozen attrs class with hashable fields"
            ) from error
        if len(self.parents) >= self.states_max:
            self.cut_by_states = True
            return False
        self.parents[state] = link
        return True

    def fire(self, state: S, event: E) -> Firing[S]:
        try:
            return self.system.fire(state, event)
        except Exception as error:
            trace = self.trace_to(state)
            raised = f"{type(error).__name__}: {error}"
            raise self.fail(
                f"step raised on event {len(trace.steps) + 1} ({event!r}): {raised}",
                Trace(trace.initial, (*trace.steps, TraceStep(event, state, (), raised))),
            ) from error

    def has_unexplored_successor(self, frontier: list[S]) -> bool:
        for state in frontier:
            for event in self.enabled_events(state):
                try:
                    successor = self.system.fire(state, event).state
                except Exception:
                    return True  # behaviour beyond the bound that was not checked
                if successor not in self.parents:
                    return True
        return False

    def run(self, initial_states: Iterable[S]) -> None:
        frontier: list[S] = []
        for state in initial_states:
            if self.store(state, None):
                self.check_state(state)
                frontier.append(state)
        if not self.parents:
            raise ValueError(
                "no initial state given: exploration needs at least one (and states_max >= 1)"
            )
        depth = 0
        while frontier and not self.cut_by_states:
            if depth >= self.depth_max:
                self.cut_by_depth = self.has_unexplored_successor(frontier)
                return
            next_frontier: list[S] = []
            for state in frontier:
                for event in self.enabled_events(state):
                    firing = self.fire(state, event)
                    self.transitions_count += 1
                    self.fired.update(firing.labels)
                    self.check_step(state, event, firing)
                    if self.store(firing.state, (state, event, firing.effects)):
                        self.check_state(firing.state)
                        next_frontier.append(firing.state)
                    elif self.cut_by_states:
                        return
            depth += 1
            if next_frontier:
                self.depth_reached = depth
            frontier = next_frontier


def explore(
    system: Explorable[S, E],
    initial_states: Iterable[S],
    enabled_events: Callable[[S], Iterable[E]],
    *,
    depth_max: int,
    states_max: int,
    extra_properties: Sequence[Property] = (),
    require_exhaustive: bool = False,
) -> ExplorationResult[S, E]:
    """Explore ``system`` breadth-first and check its properties plus ``extra_properties``.

    ``enabled_events(state)`` is the environment: every event the world can deliver in that
    state, in a fixed order (the order makes traces reproducible). Returns counts and witnesses;
    raises :class:`ModelCheckFailure` with the shortest failing trace on any violation, on a
    ``sometimes`` never witnessed, and (with ``require_exhaustive``) on a cut bound.
    """
    if depth_max < 0 or states_max < 1:
        raise ValueError(
            f"bounds must be depth_max >= 0 and states_max >= 1, got {depth_max} and {states_max}"
        )
    properties = (*system.properties, *extra_properties)
    ids = [prop.id for prop in properties]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise ValueError(f"property ids must be unique, repeated: {', '.join(duplicates)}")
    search: _Search[S, E] = _Search(system, enabled_events, properties, depth_max, states_max)
    search.run(initial_states)
    result = search.result()
    missing = [
        prop for prop in properties if prop.kind == "sometimes" and prop.id not in search.witnesses
    ]
    if missing:
        if result.truncated:
            advice = (
                "exploration was cut by a bound, so a witness may lie beyond it: raise the bound"
            )
        else:
            advice = (
                "exploration was exhaustive, so no reachable state or step satisfies it: "
                "the property, the machine or the environment is wrong"
            )
        listed = "\n".join(f"  - {prop.describe()}" for prop in missing)
        raise search.fail(
            f"sometimes property never witnessed ({advice}):\n{listed}", None, missing[0].id
        )
    if require_exhaustive and result.truncated:
        raise search.fail(
            "exploration was cut by a bound but require_exhaustive=True; raise the bound", None
        )
    return result
