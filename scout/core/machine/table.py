"""The machine table as plain data: what a spec TOML says, before any Python is bound to it.

Everything that shows the machine (the compiled step, the ``transitions`` machine, the
Markdown table, the Mermaid diagram) is derived from a :class:`MachineTable`, so it is the
one home of every transition (docs/design.md §3).
"""

from __future__ import annotations

from typing import Literal

import attrs

InvariantKind = Literal["always", "sometimes"]
# "state" predicates see one state; "step" predicates see (previous, event, next, effects),
# which is how a property about emitted effects ("one report per stuck position") is stated.
InvariantScope = Literal["state", "step"]


@attrs.frozen
class StateSpec:
    name: str
    meaning: str


@attrs.frozen
class EventSpec:
    trigger: str
    meaning: str


@attrs.frozen
class GuardRef:
    """A guard name as written in a row; ``negated`` for a leading ``!``."""

    name: str
    negated: bool = False

    @classmethod
    def parse(cls, text: str) -> GuardRef | None:
        if not text:
            return None
        if text.startswith("!"):
            return cls(text[1:], negated=True)
        return cls(text)

    def __str__(self) -> str:
        return f"!{self.name}" if self.negated else self.name


@attrs.frozen
class TransitionRow:
    number: int  # 1-based position in the file, so errors and docs can point at the row
    source: str
    trigger: str
    dest: str
    guard: GuardRef | None
    effect: str  # empty: no effect
    why: str

    @property
    def ignores(self) -> bool:
        """A self-loop with no effect is how a table says "this event is ignored here"."""
        return self.dest == self.source and not self.effect

    @property
    def label(self) -> str:
        guard = f" [{self.guard}]" if self.guard else ""
        effect = f" / {self.effect}" if self.effect else ""
        return f"row {self.number}: {self.source} --{self.trigger}{guard}{effect}--> {self.dest}"


@attrs.frozen
class InvariantSpec:
    id: str
    predicate: str
    text: str
    kind: InvariantKind
    scope: InvariantScope


@attrs.frozen
class MachineTable:
    name: str
    actions: str  # dotted module path of the Python that guards, effects and predicates live in
    initial: str
    states: tuple[StateSpec, ...]
    events: tuple[EventSpec, ...]
    rows: tuple[TransitionRow, ...]
    invariants: tuple[InvariantSpec, ...]
    source: str  # where the table came from, for error messages

    @property
    def state_names(self) -> tuple[str, ...]:
        return tuple(state.name for state in self.states)

    @property
    def triggers(self) -> tuple[str, ...]:
        return tuple(event.trigger for event in self.events)
