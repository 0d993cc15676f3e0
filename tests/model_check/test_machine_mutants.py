"""The spec machinery's runtime, pinned where the toy's tests only look for a word (scout/core/
machine/; docs/spec-format.md). Written from the ``core-machine`` mutation run's survivors
(tests/mutation/survivors.md).

Two habits of the earlier tests let one-line changes through: the toy machine's guards and
effects never read the event, and its machine is built when the test module is imported -- so
in mutmut's forked children the loader, the registries and ``build_machine`` never ran again.
Here a second machine, the *probe* (a lamp: a push brightens it by the push's amount, a push of
5 or more breaks it), is parsed, registered and built inside each test, from a table in this
file; its guards and effects read the event; and every error is compared whole."""

from __future__ import annotations

import enum
import functools
import importlib.resources
import locale
import sys
from collections import Counter
from pathlib import Path
from typing import Any, ClassVar

import attrs
import pytest

from scout.core.machine import (
    Actions,
    IllegalTransition,
    Machine,
    MachineState,
    ModelCheckFailure,
    NondeterministicStep,
    Property,
    SpecError,
    StepError,
    build_machine,
    conformance_problems,
    explore,
    load_actions,
    new_document,
    parse_table,
    reference_step,
    render_block,
    splice,
)
from scout.core.machine import loader as loader_module
from scout.core.machine.actions import expected_arity, positional_arity
from scout.core.machine.conformance import compiled_edges
from scout.core.machine.explore import Trace, TraceStep
from scout.core.machine.reference import BoundEffect, BoundGuard, build_transitions_machine
from scout.core.machine.runtime import CompiledRow

REPO = Path(__file__).resolve().parents[2]


class Lamp(str, enum.Enum):
    OFF = "OFF"
    ON = "ON"
    BROKEN = "BROKEN"


@attrs.frozen
class Level:
    level: int = 0


@attrs.frozen
class Push:
    trigger: ClassVar[str] = "push"
    amount: int = 1


@attrs.frozen
class Kick:
    trigger: ClassVar[str] = "kick"


@attrs.frozen
class Zap:
    trigger: ClassVar[str] = "zap"


@attrs.frozen
class Brightened:
    by: int


PROBE: dict[str, Any] = {
    "machine": {"name": "probe", "actions": "tests.model_check.test_machine_mutants", "initial": "OFF"},
    "states": {"OFF": "dark", "ON": "lit", "BROKEN": "pushed too hard"},
    "events": {"push": "press the switch by an amount", "kick": "knock it"},
    "transition": [
        {"source": "OFF", "trigger": "push", "guard": "!strong", "dest": "ON", "effect": "brighten", "why": "PROBE-1"},
        {"source": "OFF", "trigger": "push", "guard": "strong", "dest": "BROKEN", "why": "PROBE-2: no effect, a move"},
        {"source": "ON", "trigger": "push", "guard": "!full", "dest": "ON", "effect": "brighten", "why": "brighter"},
        {"source": "ON", "trigger": "kick", "dest": "OFF", "why": "off, no effect"},
        {"source": "OFF", "trigger": "kick", "dest": "OFF", "why": "ignored"},
        {"source": "BROKEN", "trigger": "kick", "dest": "BROKEN", "why": "ignored"},
    ],
    "invariant": [
        {"id": "PROBE-1", "predicate": "bounded", "text": "The level stays at most 9.", "kind": "always"},
        {"id": "PROBE-2", "predicate": "broken", "text": "A lamp can break.", "kind": "sometimes"},
        {"id": "PROBE-3", "predicate": "brightens_by_the_push", "text": "A push brightens by its amount.",
         "kind": "always", "scope": "step"},
    ],
}


def strong(context: Level, event: Push) -> bool:
    return event.amount >= 5


def full(context: Level, event: Push) -> bool:
    return context.level + event.amount > 9


def brighten(context: Level, event: Push) -> tuple[Level, tuple[object, ...]]:
    return Level(context.level + event.amount), (Brightened(event.amount),)


def bounded(state: MachineState[Level]) -> bool:
    return state.context.level <= 9


def broken(state: MachineState[Level]) -> bool:
    return state.control is Lamp.BROKEN


def brightens_by_the_push(previous: Any, event: Any, state: Any, effects: tuple[object, ...]) -> bool:
    return effects == () or effects == (Brightened(event.amount),)


def probe_actions(states: type[enum.Enum] | None = Lamp) -> Actions:
    """A fresh registry each call: registering runs inside the test, not at import."""
    actions = Actions(states=states)
    for guard in (strong, full):
        actions.guard(guard)
    actions.effect(brighten)
    for predicate in (bounded, broken, brightens_by_the_push):
        actions.predicate(predicate)
    return actions


def probe(table: dict[str, Any] | None = None, actions: Actions | None = None) -> Machine[Level]:
    return build_machine(parse_table(table or PROBE, "spec/probe.toml"), actions or probe_actions())


def pushes(state: MachineState[Level]) -> tuple[object, ...]:
    """The probe's environment: it reads the state (a broken lamp is only kicked, a lit one is
    pushed only as far as 9)."""
    if state.control is Lamp.BROKEN:
        return (Kick(),)
    fits = [Push(a) for a in (1, 5) if state.context.level + a <= 9 or (a == 5 and state.control is Lamp.OFF)]
    return (*fits, Kick())


def careless(state: MachineState[Level]) -> tuple[object, ...]:
    """An environment that pushes a lit lamp past 9, which no row accepts."""
    return (Kick(),) if state.control is Lamp.BROKEN else (Push(1), Push(5), Kick())


def _error(kind: type[Exception], call: Any, *args: Any, **kwargs: Any) -> Exception:
    with pytest.raises(kind) as error:
        call(*args, **kwargs)
    return error.value


# ------------------------------------------------------------------------------------------
# Actions: the registries
# ------------------------------------------------------------------------------------------


def test_actions_states_must_be_a_str_enum() -> None:
    class Plain(enum.Enum):
        A = "A"

    class Text(str):
        pass

    for states in (Plain, Text, int):
        assert str(_error(SpecError, Actions, states=states)) == (
            f"Actions(states={states!r}): the states must be a (str, enum.Enum) class")
    assert Actions(states=Lamp).states is Lamp and Actions().states is None


def test_actions_register_each_kind_under_its_name_and_return_the_function() -> None:
    actions = Actions()
    assert actions.guard(strong) is strong and actions.effect(brighten) is brighten
    assert actions.predicate(bounded) is bounded
    assert (dict(actions.guards), dict(actions.effects), dict(actions.predicates)) == (
        {"strong": strong}, {"brighten": brighten}, {"bounded": bounded})
    with pytest.raises(TypeError):
        actions.guards["full"] = full  # type: ignore[index]


def test_actions_a_name_is_shared_by_all_kinds() -> None:
    cases = [("guard", "effect"), ("effect", "predicate"), ("predicate", "guard"), ("guard", "guard")]
    for first, second in cases:
        actions = Actions()
        getattr(actions, first)(strong)
        assert str(_error(SpecError, getattr(actions, second), strong)) == (
            f"{second} 'strong' is already registered as a {first}; names are shared by all kinds, so rename one of them")


def test_actions_refuse_a_callable_without_a_plain_name() -> None:
    for function in (functools.partial(strong), lambda context, event: True):
        for kind in ("guard", "effect", "predicate"):
            assert str(_error(SpecError, getattr(Actions(), kind), function)) == (
                f"cannot register {function!r} as a {kind}: it has no plain function name")


def test_arity_counts_required_positional_parameters_only() -> None:
    def keyword_only(a: int, *, b: int) -> None: ...
    def defaulted(a: int, b: int = 1) -> None: ...
    def positional_only(a: int, /, b: int) -> None: ...
    def star(*args: int) -> None: ...

    assert [positional_arity(f) for f in (keyword_only, defaulted, positional_only, star, len)] == [1, 1, 2, None, 1]
    assert positional_arity(print) is None  # no signature to read
    assert [expected_arity("guard"), expected_arity("effect"), expected_arity("predicate"),
            expected_arity("predicate", "step")] == [2, 2, 1, 4]


def test_properties_made_in_code() -> None:
    assert Property.always("X-1", "t", bounded) == Property("X-1", "always", "state", "t", bounded)
    assert Property.sometimes("X-2", "u", broken) == Property("X-2", "sometimes", "state", "u", broken)
    assert Property.sometimes("X-3", "v", brightens_by_the_push, scope="step") == Property(
        "X-3", "sometimes", "step", "v", brightens_by_the_push)
    assert Property.always("X-1", "t", bounded).describe() == "X-1 (always, state): t"


# ------------------------------------------------------------------------------------------
# parse_table: every problem at once, each naming its place
# ------------------------------------------------------------------------------------------

BAD_TABLE: dict[str, Any] = {
    "machine": {"name": "bad name", "actions": "not a path!", "initial": "NOWHERE", "colour": "red"},
    "states": {"A": "the first", "B": "  ", "2x": "not an identifier", "C": 5},
    "events": {"go": "go on", "unused": "never used"},
    "transition": [
        {"source": "A", "trigger": "go", "dest": "B", "why": "fine"},
        {"source": "Z", "trigger": "go", "dest": "Y", "why": "w", "guard": "a b", "effect": "x-y", "colour": 1},
        {"source": "A", "trigger": "stop", "dest": "A", "why": ""},
        {"source": 5, "trigger": "go", "dest": "A", "why": "w"},
        {"source": "B", "trigger": "go", "dest": "A", "why": "g1", "guard": "g"},
        {"source": "B", "trigger": "go", "dest": "C", "why": "g2", "guard": "g"},
        {"source": "B", "trigger": "go", "dest": "B", "why": "g3"},
    ],
    "invariant": [
        {"id": "BAD-1", "predicate": "p1", "text": "t", "kind": "always"},
        {"id": "bad1", "predicate": "not an identifier", "text": "u", "kind": "eventually", "scope": "trace", "colour": 1},
        {"id": "BAD-1", "predicate": "p3", "text": "t3", "kind": "sometimes", "scope": "step"},
        {"predicate": 7},
    ],
    "extras": {},
}

BAD_TABLE_ERROR = """spec/bad.toml: invalid machine table (29 problem(s)):
  - top level: unknown key 'extras'; allowed keys: events, invariant, machine, states, transition
  - [machine]: unknown key 'colour'; allowed keys: actions, initial, name
  - [machine]: name = 'bad name' must be an identifier (it names spec/<name>.md)
  - [machine]: actions = 'not a path!' must be a dotted Python module path
  - [states] B: needs a one-line meaning (a non-empty string)
  - [states]: name '2x' is not an identifier; use letters, digits and _
  - [states] C: needs a one-line meaning (a non-empty string)
  - [machine]: initial = 'NOWHERE' is not declared in [states]
  - [[transition]] row 2: unknown key 'colour'; allowed keys: dest, effect, guard, source, trigger, why
  - [[transition]] row 2 (Z --go--> Y): source state 'Z' is not declared in [states]
  - [[transition]] row 2 (Z --go--> Y): dest state 'Y' is not declared in [states]
  - [[transition]] row 2 (Z --go--> Y): guard 'a b' must be a function name, optionally prefixed by '!'
  - [[transition]] row 2 (Z --go--> Y): effect 'x-y' must be a function name
  - [[transition]] row 3: missing 'why'
  - [[transition]] row 3 (A --stop--> A): trigger 'stop' is not declared in [events]
  - [[transition]] row 4: source = 5 must be a string
  - [[transition]] rows 5, 6, 7 (B --go-->): row(s) [7] have no guard but share (source, trigger) with other rows, so two rows could fire at once; give every row of the group a guard
  - [[transition]] rows 5 and 6 (B --go-->): both use guard 'g', so both fire together; merge them or change a guard
  - [events] unused: no row uses this trigger; add its rows or remove the event
  - [[invariant]] 2: unknown key 'colour'; allowed keys: id, kind, predicate, scope, text
  - [[invariant]] 2 (bad1): id 'bad1' must look like OBS-3 (capitals, dash, number)
  - [[invariant]] 2 (bad1): predicate 'not an identifier' must be a function name
  - [[invariant]] 2 (bad1): kind 'eventually' must be 'always' or 'sometimes'
  - [[invariant]] 2 (bad1): scope 'trace' must be 'state' (default) or 'step'
  - [[invariant]] 3 (BAD-1): duplicate id 'BAD-1', first used by [[invariant]] 1
  - [[invariant]] 4: missing 'id'
  - [[invariant]] 4: missing 'text'
  - [[invariant]] 4: missing 'kind'
  - [[invariant]] 4 (): predicate = 7 must be a string"""


def test_a_table_with_every_kind_of_problem_lists_each_at_once_naming_its_place() -> None:
    assert str(_error(SpecError, parse_table, BAD_TABLE, "spec/bad.toml")) == BAD_TABLE_ERROR


def test_a_table_without_its_sections_says_what_is_missing() -> None:
    machine_missing = ("m.toml: invalid machine table (1 problem(s)):\n  - [machine]: missing: a spec needs a [machine] "
                       "table with name, actions, initial")
    for data in ({}, {"machine": "probe"}):
        assert str(_error(SpecError, parse_table, data, "m.toml")) == machine_missing
    data = {"machine": {"name": "m", "actions": "a.b"}, "states": {}, "events": ["go"], "transition": {"a": 1},
            "invariant": [1]}
    assert str(_error(SpecError, parse_table, data, "m.toml")) == (
        "m.toml: invalid machine table (6 problem(s)):\n"
        "  - [machine]: missing 'initial'\n"
        '  - [states]: missing or empty: declare every state as NAME = "one-line meaning"\n'
        '  - [events]: missing or empty: declare every event as NAME = "one-line meaning"\n'
        "  - [[transition]]: must be an array of tables ([[transition]] entries), got {'a': 1}\n"
        "  - [[transition]]: the table has no rows\n"
        "  - [[invariant]]: must be an array of tables ([[invariant]] entries), got [1]")


def test_every_field_that_is_not_a_string_is_named_with_its_place() -> None:
    data = {
        "machine": {"name": 1, "actions": 2, "initial": 3},
        "states": {"A": "a"},
        "events": {"go": "g"},
        "transition": [{"source": "A", "trigger": "go", "dest": "A", "guard": 4, "effect": 5, "why": 6}],
        "invariant": [{"id": 7, "predicate": "p", "text": 8, "kind": 9, "scope": 10}],
    }
    assert str(_error(SpecError, parse_table, data, "n.toml")) == (
        "n.toml: invalid machine table (10 problem(s)):\n"
        "  - [machine]: name = 1 must be a string\n"
        "  - [machine]: actions = 2 must be a string\n"
        "  - [machine]: initial = 3 must be a string\n"
        "  - [[transition]] row 1: guard = 4 must be a string\n"
        "  - [[transition]] row 1: effect = 5 must be a string\n"
        "  - [[transition]] row 1: why = 6 must be a string\n"
        "  - [[invariant]] 1: id = 7 must be a string\n"
        "  - [[invariant]] 1 (): text = 8 must be a string\n"
        "  - [[invariant]] 1 (): kind = 9 must be a string\n"
        "  - [[invariant]] 1 (): scope = 10 must be a string")


def test_an_unreachable_state_is_named_with_the_initial_state() -> None:
    table = {**PROBE, "states": {**PROBE["states"], "LOST": "nothing leads here"}}
    assert str(_error(SpecError, parse_table, table, "spec/probe.toml")) == (
        "spec/probe.toml: invalid machine table (1 problem(s)):\n  - [states] LOST: unreachable from initial state "
        "'OFF': no chain of rows leads to it; add a row into it or remove the state")


def test_the_parsed_probe_table_keeps_every_row_and_invariant() -> None:
    table = parse_table(PROBE, "spec/probe.toml")
    assert [row.label for row in table.rows] == [
        "row 1: OFF --push [!strong] / brighten--> ON", "row 2: OFF --push [strong]--> BROKEN",
        "row 3: ON --push [!full] / brighten--> ON", "row 4: ON --kick--> OFF", "row 5: OFF --kick--> OFF",
        "row 6: BROKEN --kick--> BROKEN"]
    assert [(i.id, i.predicate, i.text, i.kind, i.scope) for i in table.invariants] == [
        ("PROBE-1", "bounded", "The level stays at most 9.", "always", "state"),
        ("PROBE-2", "broken", "A lamp can break.", "sometimes", "state"),
        ("PROBE-3", "brightens_by_the_push", "A push brightens by its amount.", "always", "step")]
    assert (table.name, table.actions, table.initial, table.source) == (
        "probe", "tests.model_check.test_machine_mutants", "OFF", "spec/probe.toml")


# ------------------------------------------------------------------------------------------
# build_machine: the actions against the table
# ------------------------------------------------------------------------------------------


class Dim(str, enum.Enum):
    OFF = "OFF"
    ON = "ON"
    DIM = "DIM"


def test_actions_that_do_not_match_the_table_are_listed_at_once() -> None:
    def strong(context: Level) -> bool:  # one argument short
        return True

    def brighten(context: Level, event: Push, extra: int) -> tuple[Level, tuple[object, ...]]:
        return context, ()

    def spare(context: Level, event: Push) -> bool:
        return True

    def bounded(state: Any, extra: Any) -> bool:
        return True

    def brightens_by_the_push(state: Any) -> bool:
        return True

    def leftover(state: Any) -> bool:
        return True

    def unused_effect(context: Level, event: Push) -> tuple[Level, tuple[object, ...]]:
        return context, ()

    actions = Actions(states=Dim)
    actions.guard(strong)
    actions.guard(spare)
    actions.effect(brighten)
    actions.effect(unused_effect)
    for predicate in (bounded, brightens_by_the_push, leftover):
        actions.predicate(predicate)
    module = "tests.model_check.test_machine_mutants"
    assert str(_error(SpecError, build_machine, parse_table(PROBE, "spec/probe.toml"), actions)) == (
        "spec/probe.toml: actions do not match the table (12 problem(s)):\n"
        f"  - {module}: the states enum Dim names ['DIM', 'OFF', 'ON'], the table ['BROKEN', 'OFF', 'ON']; make them the same\n"
        "  - row 1: OFF --push [!strong] / brighten--> ON: guard 'strong' takes 1 positional argument(s), a guard takes 2\n"
        "  - row 1: OFF --push [!strong] / brighten--> ON: effect 'brighten' takes 3 positional argument(s), a effect takes 2\n"
        "  - row 2: OFF --push [strong]--> BROKEN: guard 'strong' takes 1 positional argument(s), a guard takes 2\n"
        f"  - row 3: ON --push [!full] / brighten--> ON: guard 'full' is not registered in {module}\n"
        "  - row 3: ON --push [!full] / brighten--> ON: effect 'brighten' takes 3 positional argument(s), a effect takes 2\n"
        "  - [[invariant]] PROBE-1: predicate 'bounded' takes 2 positional argument(s), a predicate takes 1\n"
        f"  - [[invariant]] PROBE-2: predicate 'broken' is not registered in {module}\n"
        "  - [[invariant]] PROBE-3: predicate 'brightens_by_the_push' takes 1 positional argument(s), a predicate takes 4\n"
        f"  - {module}: guard 'spare' is registered but no row or invariant names it; add it to the table or delete it\n"
        f"  - {module}: effect 'unused_effect' is registered but no row or invariant names it; add it to the table or delete it\n"
        f"  - {module}: predicate 'leftover' is registered but no row or invariant names it; add it to the table or delete it")
    missing_effect = Actions(states=Lamp)
    for guard in (globals()["strong"], full):
        missing_effect.guard(guard)
    for predicate in (globals()["bounded"], broken, globals()["brightens_by_the_push"]):
        missing_effect.predicate(predicate)
    assert str(_error(SpecError, build_machine, parse_table(PROBE, "spec/probe.toml"), missing_effect)).endswith(
        f"  - row 1: OFF --push [!strong] / brighten--> ON: effect 'brighten' is not registered in {module}\n"
        f"  - row 3: ON --push [!full] / brighten--> ON: effect 'brighten' is not registered in {module}")


def test_the_built_probe_has_its_properties_and_enum_states() -> None:
    machine = probe()
    assert machine.properties == (
        Property("PROBE-1", "always", "state", "The level stays at most 9.", bounded),
        Property("PROBE-2", "sometimes", "state", "A lamp can break.", broken),
        Property("PROBE-3", "always", "step", "A push brightens by its amount.", brightens_by_the_push))
    assert machine.name == "probe" and machine.labels == tuple(row.label for row in machine.table.rows)
    assert machine.initial_state(Level()).control is Lamp.OFF
    assert machine.control("BROKEN") is Lamp.BROKEN
    assert str(_error(ValueError, machine.control, "DIM")) == (
        "machine 'probe' has no state 'DIM'; its states are ['BROKEN', 'OFF', 'ON']")
    assert {key: [row.dest for row in rows] for key, rows in machine.rows_by_key.items()} == {
        ("OFF", "push"): [Lamp.ON, Lamp.BROKEN], ("ON", "push"): [Lamp.ON], ("ON", "kick"): [Lamp.OFF],
        ("OFF", "kick"): [Lamp.OFF], ("BROKEN", "kick"): [Lamp.BROKEN]}
    plain = probe(actions=probe_actions(states=None))
    # A machine built without a states enum keeps its control states as the table's strings: the
    # one place a control state is a literal (test_layout's rule is about machines with enums).
    assert (plain.initial_state(Level()).control, plain.control("ON")) == ("OFF", "ON")
    assert type(plain.control("ON")) is str


# ------------------------------------------------------------------------------------------
# Machine.fire: what a step does, and each refusal whole
# ------------------------------------------------------------------------------------------


def test_a_step_runs_the_guard_and_the_effect_on_the_event() -> None:
    machine = probe()
    off = machine.initial_state(Level())
    assert machine.step(off, Push(2)) == (MachineState(Lamp.ON, Level(2)), (Brightened(2),))
    assert machine.step(off, Push(5)) == (MachineState(Lamp.BROKEN, Level(0)), ())
    lit = MachineState(Lamp.ON, Level(3))
    assert machine.fire(lit, Push(4)).labels == ("row 3: ON --push [!full] / brighten--> ON",)
    assert machine.step(lit, Push(4)) == (MachineState(Lamp.ON, Level(7)), (Brightened(4),))
    assert machine.step(lit, Kick()) == (MachineState(Lamp.OFF, Level(3)), ())
    # An ignored event (a self-loop with no effect) returns the very state it was given.
    assert machine.fire(off, Kick()).state is off and machine.fire(off, Kick()).effects == ()


def test_each_refused_step_says_why_and_keeps_the_control_and_trigger() -> None:
    machine = probe()
    off = machine.initial_state(Level())
    refused = _error(IllegalTransition, machine.step, off, Zap())
    assert str(refused) == "machine 'probe' has no trigger 'zap' (event Zap()); declared triggers: push, kick"
    assert (refused.control, refused.trigger) == (Lamp.OFF, "zap")  # type: ignore[attr-defined]
    unknown = _error(StepError, machine.step, MachineState("NOWHERE", Level()), Push())
    assert str(unknown) == "machine 'probe' has no state 'NOWHERE'; declared states: OFF, ON, BROKEN"
    no_row = _error(IllegalTransition, machine.step, MachineState(Lamp.BROKEN, Level()), Push())
    assert str(no_row) == (
        "illegal transition in machine 'probe': event 'push' (Push(amount=1)) is not accepted in state "
        "<Lamp.BROKEN: 'BROKEN'>; no row of spec/probe.toml has source Lamp.BROKEN and trigger push. State unchanged. "
        "If the event can happen there, add a row for it (dest = source and no effect declares it ignored).")
    assert (no_row.control, no_row.trigger) == (Lamp.BROKEN, "push")  # type: ignore[attr-defined]
    held = _error(IllegalTransition, machine.step, MachineState(Lamp.ON, Level(8)), Push(3))
    assert str(held) == (
        "illegal transition in machine 'probe': event 'push' (Push(amount=3)) in state <Lamp.ON: 'ON'>: no row's guard "
        "held (tried row 3: ON --push [!full] / brighten--> ON) with context Level(level=8). State unchanged. Make the "
        "guards of these rows cover this case.")
    assert (held.control, held.trigger) == (Lamp.ON, "push")  # type: ignore[attr-defined]


def test_two_guards_holding_is_a_nondeterministic_step_naming_both_rows() -> None:
    table = {**PROBE, "transition": [dict(row) for row in PROBE["transition"]]}
    table["transition"][1]["guard"] = "full"
    machine = probe(table)
    error = _error(NondeterministicStep, machine.step, MachineState(Lamp.OFF, Level(9)), Push(1))
    assert str(error) == (
        "nondeterministic step in machine 'probe': event 'push' (Push(amount=1)) in state <Lamp.OFF: 'OFF'> with "
        "context Level(level=9) satisfies the guards of several rows (row 1: OFF --push [!strong] / brighten--> ON; "
        "row 2: OFF --push [full]--> BROKEN). The guards of rows sharing (source, trigger) must exclude each other; fix "
        "them in spec/probe.toml or in tests.model_check.test_machine_mutants.")
    assert (error.control, error.trigger) == (Lamp.OFF, "push")  # type: ignore[attr-defined]
    # With two rows and neither guard holding, both are named.
    none_held = _error(IllegalTransition, machine.step, MachineState(Lamp.OFF, Level(0)), Push(5))
    assert "(tried row 1: OFF --push [!strong] / brighten--> ON; row 2: OFF --push [full]--> BROKEN)" in str(none_held)


@pytest.mark.parametrize(
    "outcome", [None, (Level(), [Brightened(1)]), (Level(), (), ()), Level()], ids=["none", "list", "three", "bare"])
def test_an_effect_that_returns_something_else_is_refused_naming_it(outcome: object) -> None:
    actions = probe_actions()
    actions._effects["brighten"] = lambda context, event: outcome  # the registry, bypassing the name check
    machine = probe(actions=actions)
    error = _error(TypeError, machine.step, machine.initial_state(Level()), Push(1))
    assert str(error) == (f"effect 'brighten' returned {outcome!r}; effects must return "
                          "(new_context, tuple_of_effect_values)")


def test_a_guard_that_returns_a_non_bool_is_refused_naming_it() -> None:
    actions = probe_actions()
    actions._guards["full"] = lambda context, event: event.amount
    machine = probe(actions=actions)
    error = _error(TypeError, machine.step, MachineState(Lamp.ON, Level()), Push(3))
    assert str(error) == "guard 'full' returned 3 for event Push(amount=3); guards must return a bool"


# ------------------------------------------------------------------------------------------
# explore: counts, bounds, summaries and every failure whole
# ------------------------------------------------------------------------------------------

OFF0 = "MachineState(control=<Lamp.OFF: 'OFF'>, context=Level(level=0))"
NOT_FIRED_AFTER_ONE_PUSH = ("row 2: OFF --push [strong]--> BROKEN; row 3: ON --push [!full] / brighten--> ON; row 4: ON "
                            "--kick--> OFF; row 5: OFF --kick--> OFF; row 6: BROKEN --kick--> BROKEN")


def _explore(**kwargs: Any) -> Any:
    machine = probe()
    environment = kwargs.pop("environment", pushes)
    return explore(machine, [machine.initial_state(Level())], environment, **kwargs)


def test_explore_counts_and_summaries_for_each_bound() -> None:
    cases = [
        (dict(depth_max=20, states_max=100), (29, 60, 7, False, False), "explored 29 states and 60 transitions to depth 7 "
         "(depth_max=20, states_max=100; not cut: exhaustive); witnessed: PROBE-2; never fired: none"),
        (dict(depth_max=2, states_max=100), (6, 7, 2, True, False), "explored 6 states and 7 transitions to depth 2 "
         "(depth_max=2, states_max=100; cut by depth_max); witnessed: PROBE-2; never fired: none"),
        (dict(depth_max=20, states_max=3), (3, 4, 1, False, True), "explored 3 states and 4 transitions to depth 1 "
         "(depth_max=20, states_max=3; cut by states_max); witnessed: PROBE-2; never fired: row 4: ON --kick--> OFF; "
         "row 6: BROKEN --kick--> BROKEN"),
    ]
    for kwargs, counts, summary in cases:
        result = _explore(**kwargs)
        assert (result.states_count, result.transitions_count, result.depth_reached, result.cut_by_depth,
                result.cut_by_states) == counts
        assert (result.depth_max, result.states_max) == (kwargs["depth_max"], kwargs["states_max"])
        assert result.summary() == summary
    two = _explore(depth_max=20, states_max=100, extra_properties=[Property.sometimes("X-9", "lit", lambda s: s.control is Lamp.ON)])
    assert "; witnessed: PROBE-2, X-9; " in two.summary()
    witness = _explore(depth_max=20, states_max=100).witnesses["PROBE-2"]
    assert witness.events == (Push(5),) and witness.states[-1] == MachineState(Lamp.BROKEN, Level(0))


def test_explore_refuses_bad_bounds_repeated_ids_and_no_initial_state() -> None:
    machine = probe()
    initial = [machine.initial_state(Level())]
    for depth_max, states_max in ((-1, 1), (0, 0)):
        assert str(_error(ValueError, explore, machine, initial, pushes, depth_max=depth_max, states_max=states_max)) == (
            f"bounds must be depth_max >= 0 and states_max >= 1, got {depth_max} and {states_max}")
    repeated = [Property.always("PROBE-1", "x", bounded), *(Property.always("Z-1", "y", bounded),) * 3,
                Property.always("Z-2", "z", bounded)]
    assert str(_error(ValueError, explore, machine, initial, pushes, depth_max=1, states_max=5,
                      extra_properties=repeated)) == "property ids must be unique, repeated: PROBE-1, Z-1"
    twice = [Property.always("Z-3", "y", bounded)] * 2
    assert str(_error(ValueError, explore, machine, initial, pushes, depth_max=1, states_max=5,
                      extra_properties=twice)) == "property ids must be unique, repeated: Z-3"
    assert str(_error(ValueError, explore, machine, [], pushes, depth_max=1, states_max=5)) == (
        "no initial state given: exploration needs at least one (and states_max >= 1)")


def _failure(**kwargs: Any) -> ModelCheckFailure:
    with pytest.raises(ModelCheckFailure) as error:
        _explore(depth_max=20, states_max=100, **kwargs)
    return error.value


def test_a_step_that_raises_fails_with_its_trace_and_the_error() -> None:
    failure = _failure(environment=careless)
    raised = ("IllegalTransition: illegal transition in machine 'probe': event 'push' (Push(amount=5)) in state <Lamp.ON: "
              "'ON'>: no row's guard held (tried row 3: ON --push [!full] / brighten--> ON) with context Level(level=6). "
              "State unchanged. Make the guards of these rows cover this case.")
    assert str(failure) == (
        f"step raised on event 3 (Push(amount=5)): {raised}\nshortest failing trace (3 events):\n  initial: {OFF0}\n"
        "  1. Push(amount=1)\n     -> MachineState(control=<Lamp.ON: 'ON'>, context=Level(level=1))\n"
        "     effects: (Brightened(by=1),)\n  2. Push(amount=5)\n"
        "     -> MachineState(control=<Lamp.ON: 'ON'>, context=Level(level=6))\n     effects: (Brightened(by=5),)\n"
        f"  3. Push(amount=5)\n     raised {raised}\nexplored 9 states and 11 transitions to depth 2 (depth_max=20, "
        "states_max=100; not cut: exhaustive); witnessed: PROBE-2; never fired: none")
    assert failure.trace is not None and failure.trace.initial == MachineState(Lamp.OFF, Level(0))
    assert failure.trace.steps[-1] == TraceStep(Push(5), MachineState(Lamp.ON, Level(6)), (), raised)
    assert failure.property_id is None


def test_a_predicate_that_raises_or_answers_a_non_bool_fails_naming_it_with_its_trace() -> None:
    def raises(state: MachineState[Level]) -> bool:
        if state.context.level >= 2:
            raise RuntimeError("predicate broke")
        return True

    def raises_unwitnessed(state: MachineState[Level]) -> bool:
        if state.context.level >= 2:
            raise RuntimeError("predicate broke")
        return False

    def step_raises(previous: Any, event: Any, state: Any, effects: Any) -> bool:
        if state.control is Lamp.BROKEN:
            raise RuntimeError("step predicate broke")
        return False

    cases = [
        (Property.always("X-1", "raises", raises), "predicate of X-1 (always, state): raises raised "
         "RuntimeError('predicate broke')", MachineState(Lamp.ON, Level(2))),
        (Property.always("X-2", "non-bool", lambda s: 1 if s.control is Lamp.BROKEN else True),
         "predicate of X-2 (always, state): non-bool returned 1, not a bool", MachineState(Lamp.BROKEN, Level(0))),
        (Property.always("X-3", "step non-bool", lambda p, e, s, f: 1, scope="step"),
         "predicate of X-3 (always, step): step non-bool returned 1, not a bool", MachineState(Lamp.ON, Level(1))),
        (Property.sometimes("X-4", "step raises", step_raises, scope="step"),
         "predicate of X-4 (sometimes, step): step raises raised RuntimeError('step predicate broke')",
         MachineState(Lamp.BROKEN, Level(0))),
        (Property.sometimes("X-5", "state raises", raises_unwitnessed), "predicate of X-5 (sometimes, state): state raises raised "
         "RuntimeError('predicate broke')", MachineState(Lamp.ON, Level(2))),
    ]
    for prop, headline, last in cases:
        failure = _failure(extra_properties=[prop])
        assert str(failure).startswith(headline + "\nshortest failing trace ("), prop
        assert failure.property_id == prop.id and failure.trace is not None and failure.trace.states[-1] == last
    one_push = _failure(extra_properties=[Property.always("X-3", "step non-bool", lambda p, e, s, f: 1, scope="step")])
    assert str(one_push) == (
        f"predicate of X-3 (always, step): step non-bool returned 1, not a bool\nshortest failing trace (1 events):\n"
        f"  initial: {OFF0}\n  1. Push(amount=1)\n     -> MachineState(control=<Lamp.ON: 'ON'>, context=Level(level=1))\n"
        "     effects: (Brightened(by=1),)\nexplored 1 states and 1 transitions to depth 0 (depth_max=20, states_max=100; "
        f"not cut: exhaustive); witnessed: none; never fired: {NOT_FIRED_AFTER_ONE_PUSH}")


def test_a_violated_step_property_names_the_event_and_its_state() -> None:
    failure = _failure(extra_properties=[Property.always("X-6", "never", lambda p, e, s, f: False, scope="step")])
    assert str(failure) == (
        f"X-6 (always, step): never violated by event 1\nshortest failing trace (1 events):\n  initial: {OFF0}\n"
        "  1. Push(amount=1)\n     -> MachineState(control=<Lamp.ON: 'ON'>, context=Level(level=1))\n"
        "     effects: (Brightened(by=1),)\nexplored 1 states and 1 transitions to depth 0 (depth_max=20, "
        f"states_max=100; not cut: exhaustive); witnessed: none; never fired: {NOT_FIRED_AFTER_ONE_PUSH}")
    assert failure.property_id == "X-6" and failure.trace is not None
    assert failure.trace.states[-1] == MachineState(Lamp.ON, Level(1))


def test_unwitnessed_sometimes_properties_are_all_listed_with_the_advice_that_fits() -> None:
    never = [Property.sometimes("X-7", "never state", lambda s: False),
             Property.sometimes("X-8", "never step", lambda p, e, s, f: False, scope="step")]
    failure = _failure(extra_properties=never)
    assert str(failure) == (
        "sometimes property never witnessed (exploration was exhaustive, so no reachable state or step satisfies it: "
        "the property, the machine or the environment is wrong):\n  - X-7 (sometimes, state): never state\n"
        "  - X-8 (sometimes, step): never step\nexplored 29 states and 60 transitions to depth 7 (depth_max=20, "
        "states_max=100; not cut: exhaustive); witnessed: PROBE-2; never fired: none")
    assert (failure.property_id, failure.trace) == ("X-7", None)
    with pytest.raises(ModelCheckFailure) as cut:
        _explore(depth_max=0, states_max=3)
    assert str(cut.value) == (
        "sometimes property never witnessed (exploration was cut by a bound, so a witness may lie beyond it: raise the "
        "bound):\n  - PROBE-2 (sometimes, state): A lamp can break.\nexplored 1 states and 0 transitions to depth 0 "
        "(depth_max=0, states_max=3; cut by depth_max); witnessed: none; never fired: row 1: OFF --push [!strong] / "
        "brighten--> ON; row 2: OFF --push [strong]--> BROKEN; row 3: ON --push [!full] / brighten--> ON; row 4: ON "
        "--kick--> OFF; row 5: OFF --kick--> OFF; row 6: BROKEN --kick--> BROKEN")
    assert cut.value.property_id == "PROBE-2"


def test_require_exhaustive_turns_a_cut_into_a_failure() -> None:
    with pytest.raises(ModelCheckFailure) as error:
        _explore(depth_max=2, states_max=100, require_exhaustive=True)
    assert str(error.value) == (
        "exploration was cut by a bound but require_exhaustive=True; raise the bound\nexplored 6 states and 7 "
        "transitions to depth 2 (depth_max=2, states_max=100; cut by depth_max); witnessed: PROBE-2; never fired: none")
    assert (error.value.property_id, error.value.trace) == (None, None)
    assert _explore(depth_max=20, states_max=100, require_exhaustive=True).truncated is False


def test_a_trace_reads_event_by_event() -> None:
    trace = Trace(1, (TraceStep("a", 2, ("e",)), TraceStep("b", 3, ()), TraceStep("c", 3, (), "ValueError: no"),
                      TraceStep("d", 4, ())))
    assert trace.format() == ("  initial: 1\n  1. 'a'\n     -> 2\n     effects: ('e',)\n  2. 'b'\n     -> 3\n  3. 'c'\n"
                              "     raised ValueError: no\n  4. 'd'\n     -> 4")
    assert trace.events == ("a", "b", "c", "d") and trace.states == (1, 2, 3, 3, 4)


@attrs.frozen
class Chain:
    """A system of integer states for the explorer alone: ``go`` from n leads to ``successor[n]``,
    or raises where ``successor`` has no entry."""

    successor: dict[int, int]
    properties: tuple[Property, ...] = ()
    labels: tuple[str, ...] = ("go",)

    def fire(self, state: int, event: str) -> Any:
        from scout.core.machine import Firing

        if state not in self.successor:
            raise RuntimeError(f"no successor of {state}")
        return Firing(self.successor[state], (), ("go",))


def _go(state: int) -> tuple[str, ...]:
    return ("go",)


def test_a_depth_bound_is_a_cut_only_if_something_is_left_beyond_it() -> None:
    # 0 -> 1, and 1 raises: at depth_max 1 the raising step lies beyond the bound, unchecked.
    assert explore(Chain({0: 1}), [0], _go, depth_max=1, states_max=10).cut_by_depth is True
    # 0 -> 1 -> 0: nothing new beyond the bound.
    closed = explore(Chain({0: 1, 1: 0}), [0], _go, depth_max=1, states_max=10)
    assert (closed.cut_by_depth, closed.cut_by_states, closed.depth_reached) == (False, False, 1)
    # 0 -> 1 -> 2 at depth_max 1: the new state 2 lies beyond.
    assert explore(Chain({0: 1, 1: 2, 2: 2}), [0], _go, depth_max=1, states_max=10).cut_by_depth is True


def test_an_exploration_ends_when_nothing_is_new_whatever_the_depth_bound() -> None:
    result = explore(Chain({0: 1, 1: 0}), [0], _go, depth_max=10**12, states_max=10)
    assert (result.states_count, result.transitions_count, result.depth_reached) == (2, 2, 1)
    only = explore(Chain({0: 0}), [0], _go, depth_max=0, states_max=1)
    assert (only.depth_reached, only.cut_by_depth, only.cut_by_states, only.transitions_count) == (0, False, False, 0)
    assert only.depth_reached == 0 and only.cut_by_depth is False and only.cut_by_states is False


# ------------------------------------------------------------------------------------------
# The transitions machine (reference) and conformance
# ------------------------------------------------------------------------------------------


def test_the_reference_machine_is_built_as_the_table_says() -> None:
    reference = probe().transitions_machine
    assert (reference.name, reference.auto_transitions, reference.send_event, reference.ignore_invalid_triggers) == (
        "probe: ", False, True, False)
    assert list(reference.states) == ["OFF", "ON", "BROKEN"] and reference.initial == "OFF"
    table = parse_table(PROBE, "spec/probe.toml")
    for role in ("source", "dest"):
        row = attrs.evolve(table.rows[0], **{role: "NOWHERE"})
        broken_table = attrs.evolve(table, rows=(row, *table.rows[1:]))
        assert str(_error(SpecError, build_transitions_machine, broken_table, probe_actions())) == (
            f"spec/probe.toml: {row.label}: {role} state 'NOWHERE' is not declared")


def test_the_reference_step_takes_the_rows_guards_and_effects_on_the_event() -> None:
    machine = probe()
    off = MachineState(Lamp.OFF, Level())
    assert reference_step(machine, off, Push(2)) == (MachineState("ON", Level(2)), (Brightened(2),))
    assert reference_step(machine, off, Push(7)) == (MachineState("BROKEN", Level(0)), ())
    assert reference_step(machine, MachineState(Lamp.ON, Level(3)), Push(4)) == (MachineState("ON", Level(7)),
                                                                                  (Brightened(4),))
    cases = [
        (MachineState(Lamp.BROKEN, Level()), Push(), '"probe: Can\'t trigger event push from state BROKEN!"'),
        (MachineState(Lamp.ON, Level(8)), Push(3), "reference machine 'probe': no guard held for 'push' in "
                                                   "<Lamp.ON: 'ON'>"),
        (off, Zap(), "reference machine 'probe' has no trigger 'zap'"),
    ]
    for state, event, message in cases:
        error = _error(IllegalTransition, reference_step, machine, state, event)
        assert str(error) == message
        assert (error.control, error.trigger) == (state.control, event.trigger)  # type: ignore[attr-defined]
    guard, effect = BoundGuard("strong", strong), BoundEffect("brighten", brighten)
    assert (guard.name, guard.function, effect.name, effect.function) == ("strong", strong, "brighten", brighten)


def test_conformance_names_every_difference_of_the_reference_machine() -> None:
    machine = probe()
    assert conformance_problems(machine) == []
    reference = machine.transitions_machine
    reference.add_state("EXTRA")
    reference.add_transition(
        "zap", "ON", "OFF", conditions=[BoundGuard("strong", strong), BoundGuard("full", full)],
        before=[BoundEffect("brighten", brighten), BoundEffect("brighten", brighten)],
        after=[BoundEffect("after", brighten), print])
    reference.add_transition("kick", "ON", "OFF")  # a second copy of row 4
    reference.add_transition("kick", "BROKEN", None)  # internal: no dest
    reference.auto_transitions = True
    reference.initial = "ON"
    assert conformance_problems(machine) == [
        "states differ: table ['OFF', 'ON', 'BROKEN'], transitions machine ['OFF', 'ON', 'BROKEN', 'EXTRA']",
        "initial differs: table 'OFF', transitions machine 'ON'",
        "the transitions machine has auto_transitions on: it adds to_<state> triggers no row declares",
        "triggers differ: table ['kick', 'push'], transitions machine ['kick', 'push', 'zap']",
        "triggers accepted in ON differ: table ['kick', 'push'], transitions machine ['kick', 'push', 'zap']",
        "in the transitions machine but not the table: BROKEN --kick--> <internal: no dest>",
        "in the transitions machine but not the table: ON --kick--> OFF",
        "in the transitions machine but not the table: ON --zap [strong & full] / brighten & brighten & <extra "
        "callback after> & <extra callback <foreign <built-in function print>>>--> OFF",
    ]


def test_conformance_names_a_doubled_compiled_row_and_functions_that_are_not_the_registered_ones() -> None:
    machine = probe()
    doubled = machine.rows_by_key[("OFF", "push")]
    lit = machine.rows_by_key[("ON", "push")][0]
    machine.rows_by_key = {
        **machine.rows_by_key,
        ("OFF", "push"): (*doubled, doubled[1]),
        ("ON", "push"): (CompiledRow(lit.row, lambda context, event: True, lambda context, event: (context, ()), Lamp.ON),),
    }
    assert conformance_problems(machine) == [
        "in the compiled step but not the table: OFF --push [strong]--> Lamp.BROKEN",
        "compiled row 3: ON --push [!full] / brighten--> ON: guard function is not the registered 'full'",
        "compiled row 3: ON --push [!full] / brighten--> ON: effect function is not the registered 'brighten'",
    ]
    assert sum(compiled_edges(machine).values()) == 7 and isinstance(compiled_edges(machine), Counter)


# ------------------------------------------------------------------------------------------
# Rendering and the loader
# ------------------------------------------------------------------------------------------


def test_a_table_without_invariants_says_so_and_a_new_document_names_its_source() -> None:
    table = parse_table({**PROBE, "invariant": []}, "spec/deep/probe.toml")
    block = render_block(table)
    assert "\nNone declared.\n" in block
    assert new_document(table) == (
        "# Machine `probe`\n\nThe normative table is `probe.toml`; the block below is generated from it. Write the "
        "prose (what the machine is for, its theory of operation) outside the block.\n\n" + block)


BEGIN, END = "<!-- BEGIN GENERATED: probe -->", "<!-- END GENERATED: probe -->"


def test_splice_accepts_a_block_at_the_start_or_after_one_line_of_prose() -> None:
    block = f"{BEGIN}\nnew\n{END}\n"
    assert splice(f"{BEGIN}\nold\n{END}", block, "probe", "doc.md") == block
    assert splice(f"prose\n{BEGIN}\nold\n{END}\ntail", block, "probe", "doc.md") == f"prose\n{block}tail"


@pytest.mark.parametrize("document", [
    f"{BEGIN}\n{BEGIN}\n{END}\n",
    f"x {BEGIN}\n{END}\n",
    f"{END}\n{BEGIN}\n",
])
def test_splice_refuses_markers_it_cannot_trust_saying_how_to_repair_them(document: str) -> None:
    error = str(_error(SpecError, splice, document, f"{BEGIN}\n{END}\n", "probe", "doc.md"))
    assert error.startswith(f"doc.md: expected one line {BEGIN!r} followed by one {END!r}, found ")
    assert error.endswith("repair the markers by hand (or delete both and every line between them) and run "
                          "`scout spec` again")


def test_loader_errors_name_the_file_and_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "absent.toml"
    assert str(_error(SpecError, loader_module.read_toml, missing)) == (
        f"{missing}: cannot read the spec file: [Errno 2] No such file or directory: '{missing}'")
    table = parse_table({**PROBE, "machine": {**PROBE["machine"], "actions": "no_such_module_for_scout"}}, "p.toml")
    assert str(_error(SpecError, load_actions, table)) == (
        "p.toml: [machine] actions = 'no_such_module_for_scout' cannot be imported (No module named "
        "'no_such_module_for_scout'); name an importable module")
    (tmp_path / "scout_failing_actions.py").write_text(
        "from scout.core.machine import SpecError\nraise SpecError('a registration failed')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    failing = attrs.evolve(table, actions="scout_failing_actions")
    assert str(_error(SpecError, load_actions, failing)) == (
        "p.toml: importing actions 'scout_failing_actions' failed: a registration failed")
    sys.modules.pop("scout_failing_actions", None)


def test_packaged_tables_are_the_spec_tables_and_an_unknown_or_unreadable_one_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in loader_module.PACKAGED_TABLES:
        assert loader_module.packaged_table_text(name) == (REPO / "spec" / f"{name}.toml").read_text(encoding="utf-8")
    assert str(_error(SpecError, loader_module.packaged_table_text, "toy")) == (
        "no packaged machine table 'toy'; the packaged tables are ['gate', 'observer', 'straggler']")

    class Unreadable:
        def joinpath(self, name: str) -> Unreadable:
            return self

        def read_text(self, encoding: str) -> str:
            raise OSError(5, "Input/output error")

    # Read as UTF-8 whatever the locale (two tables hold non-ASCII text).
    previous = locale.setlocale(locale.LC_CTYPE)
    try:
        locale.setlocale(locale.LC_CTYPE, "C")
        assert loader_module.packaged_table_text("gate") == (REPO / "spec" / "gate.toml").read_text(encoding="utf-8")
    finally:
        locale.setlocale(locale.LC_CTYPE, previous)
    monkeypatch.setattr(importlib.resources, "files", lambda package: Unreadable())
    assert str(_error(SpecError, loader_module.packaged_table_text, "gate")) == (
        "the packaged machine table scout.core.tables/gate.toml cannot be read ([Errno 5] Input/output error); "
        "reinstall scout (the wheel ships it as package data)")


def test_the_oracles_entry_points_are_imported_on_first_use_and_an_unknown_name_is_named() -> None:
    import scout.core.machine as package
    from scout.core.machine import conformance, reference

    assert package.conformance_problems is conformance.conformance_problems
    assert package.reference_step is reference.reference_step
    with pytest.raises(AttributeError) as error:
        package.no_such_name  # noqa: B018
    assert str(error.value) == "module 'scout.core.machine' has no attribute 'no_such_name'"
