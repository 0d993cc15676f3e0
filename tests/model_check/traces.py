"""Trace files for the finite machines (as etcd-io/raft's ``testdata/*.txt``): event scripts
with the transitions and effects they must produce, run by one runner for every machine.

A trace file (``tests/model_check/traces/<machine>.txt``) is a list of stanzas separated by
blank lines; ``#`` starts a comment line. A stanza is a command, a ``----`` line, and the
expected output::

    init GateContext(GateConfig("job", ("embedding", "hidden"), ("dp0", "dp1")))
    ----
    IDLE

    boundary step=0
    ----
    row 1: IDLE --boundary / open_cycle--> CHECKING
      Persist

Commands: ``init EXPR`` (the initial context), ``TRIGGER name=EXPR ...`` (one event; ``EXPR``
is a Python expression over the machine's model names, e.g. ``Progress(3, 7)``) and ``state``
(the control state and the context fields the machine's trace shows). A refused event prints
``error: <Type>: <message>`` and leaves the state as it was. ``pytest --rewrite-traces``
rewrites every expected output with what the machines do now (review the diff like code).
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs

from scout.core.machine import Machine, MachineState
from scout.core.machine.errors import StepError

TRACES = Path(__file__).resolve().parent / "traces"
SEPARATOR = "----"


@attrs.frozen
class TraceMachine:
    """How the runner drives one machine."""

    name: str
    machine: Callable[[], Machine[Any]]
    namespace: Mapping[str, Any]  # names an EXPR may use
    events: Mapping[str, type]  # trigger -> event class
    initial: Callable[[Any], MachineState[Any]]
    check: Callable[[MachineState[Any], Any], None] | None = None  # input validation before the step
    show: Callable[[MachineState[Any]], str] = lambda state: ""
    effect: Callable[[object], str] = repr


@attrs.frozen
class Stanza:
    command: str
    expected: tuple[str, ...]
    comments: tuple[str, ...] = ()


def parse(text: str) -> list[Stanza]:
    stanzas: list[Stanza] = []
    comments: list[str] = []
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        if not line.strip():
            index += 1
            continue
        if line.startswith("#"):
            comments.append(line)
            index += 1
            continue
        if index + 1 >= len(lines) or lines[index + 1] != SEPARATOR:
            raise ValueError(f"trace line {index + 1}: {line!r} must be followed by a {SEPARATOR!r} line")
        expected = []
        index += 2
        while index < len(lines) and lines[index].strip():
            expected.append(lines[index])
            index += 1
        stanzas.append(Stanza(line, tuple(expected), tuple(comments)))
        comments = []
    return stanzas


def render(stanzas: list[Stanza], outputs: list[tuple[str, ...]], header: str) -> str:
    parts = [header.rstrip("\n")] if header else []
    for stanza, output in zip(stanzas, outputs, strict=True):
        parts.append("\n".join([*stanza.comments, stanza.command, SEPARATOR, *output]))
    return "\n\n".join(parts) + "\n"


def _arguments(text: str) -> Iterator[tuple[str, str]]:
    """``a=1 b=Progress(1, 2) c="x y"`` -> (name, expression) pairs, split at top-level spaces."""
    depth, quote, start = 0, "", 0
    pieces = []
    for position, char in enumerate(text + " "):
        if quote:
            quote = "" if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == " " and depth == 0:
            if text[start:position].strip():
                pieces.append(text[start:position].strip())
            start = position + 1
    for piece in pieces:
        name, _, expression = piece.partition("=")
        if not name.isidentifier() or not expression:
            raise ValueError(f"trace argument {piece!r} is not name=EXPR")
        yield name, expression


def _evaluate(expression: str, namespace: Mapping[str, Any]) -> Any:
    tree = ast.parse(expression, mode="eval")
    for node in ast.walk(tree):  # names, literals and calls of the model's constructors only
        if isinstance(node, (ast.Attribute, ast.Lambda, ast.NamedExpr)):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in namespace:
                continue
            raise ValueError(f"trace expression {expression!r}: only names, literals and calls are allowed")
    return eval(compile(tree, "<trace>", "eval"), {"__builtins__": {}}, dict(namespace))  # noqa: S307


def run(spec: TraceMachine, stanzas: list[Stanza]) -> list[tuple[str, ...]]:
    """Every stanza's actual output, in order."""
    machine = spec.machine()
    state: MachineState[Any] | None = None
    outputs: list[tuple[str, ...]] = []
    for stanza in stanzas:
        verb, _, rest = stanza.command.partition(" ")
        if verb == "init":
            state = spec.initial(_evaluate(rest, spec.namespace))
            outputs.append((str(_name(state.control)),))
            continue
        if state is None:
            raise ValueError(f"trace {spec.name}: {stanza.command!r} before init")
        if verb == "state":
            outputs.append((f"{_name(state.control)} {spec.show(state)}".rstrip(),))
            continue
        event_type = spec.events.get(verb)
        if event_type is None:
            raise ValueError(f"trace {spec.name}: unknown command {verb!r}; triggers are {sorted(spec.events)}")
        try:
            event = event_type(**{name: _evaluate(value, spec.namespace) for name, value in _arguments(rest)})
            if spec.check is not None:
                spec.check(state, event)
            firing = machine.fire(state, event)
        except (StepError, ValueError, TypeError) as error:
            outputs.append((f"error: {type(error).__name__}: {str(error).splitlines()[0]}",))
            continue
        lines = [*firing.labels, *(f"  {spec.effect(effect)}" for effect in firing.effects)]
        state = firing.state
        outputs.append(tuple(lines))
    return outputs


def _name(control: Any) -> str:
    return str(getattr(control, "value", control))


def check_file(spec: TraceMachine, *, rewrite: bool) -> list[str]:
    """Run ``traces/<name>.txt``; returns every mismatch (empty: it holds). ``rewrite`` writes
    the actual outputs back instead."""
    path = TRACES / f"{spec.name}.txt"
    text = path.read_text(encoding="utf-8")
    header = text[: text.index("\n\n") + 1] if text.startswith("#") else ""
    stanzas = parse(text[len(header):])
    outputs = run(spec, stanzas)
    if rewrite:
        path.write_text(render(stanzas, outputs, header), encoding="utf-8")
        return []
    return [
        f"{path.name}: {stanza.command!r}\n  expected: {list(stanza.expected)}\n  actual:   {list(output)}"
        for stanza, output in zip(stanzas, outputs, strict=True)
        if tuple(stanza.expected) != output
    ]
