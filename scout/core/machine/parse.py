"""Turn the parsed TOML mapping of a spec into a :class:`MachineTable`, rejecting anything a
reader of the table could misread: unknown names, unreachable states, ambiguous rows.

Pure: the caller reads the file (``loader``). Every problem found is reported at once, each
line naming the file, the row or value, and what to change.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping
from typing import cast

from scout.core.machine.errors import SpecError
from scout.core.machine.table import (
    EventSpec,
    GuardRef,
    InvariantKind,
    InvariantScope,
    InvariantSpec,
    MachineTable,
    StateSpec,
    TransitionRow,
)

_TOP_KEYS = frozenset({"machine", "states", "events", "transition", "invariant"})
_MACHINE_KEYS = frozenset({"name", "actions", "initial"})
_ROW_KEYS_REQUIRED = ("source", "trigger", "dest", "why")
_ROW_KEYS = frozenset({*_ROW_KEYS_REQUIRED, "guard", "effect"})
_INVARIANT_KEYS_REQUIRED = ("id", "predicate", "text", "kind")
_INVARIANT_KEYS = frozenset({*_INVARIANT_KEYS_REQUIRED, "scope"})
# Ids like OBS-3 stay greppable from test names (test_OBS_3_...), docs/design.md §3.
_INVARIANT_ID = re.compile(r"^[A-Z][A-Z0-9]*-[0-9]+$")
_MODULE_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


class _Problems:
    def __init__(self, source: str) -> None:
        self.source = source
        self.lines: list[str] = []

    def add(self, where: str, message: str) -> None:
        self.lines.append(f"{where}: {message}")

    def raise_if_any(self) -> None:
        if self.lines:
            body = "\n".join(f"  - {line}" for line in self.lines)
            raise SpecError(
                f"{self.source}: invalid machine table ({len(self.lines)} problem(s)):\n{body}"
            )


def _string(problems: _Problems, where: str, table: Mapping[str, object], key: str) -> str:
    value = table.get(key, "")
    if not isinstance(value, str):
        problems.add(where, f"{key} = {value!r} must be a string")
        return ""
    return value


def _unknown_keys(
    problems: _Problems, where: str, table: Mapping[str, object], allowed: frozenset[str]
) -> None:
    for key in table:
        if key not in allowed:
            problems.add(where, f"unknown key {key!r}; allowed keys: {', '.join(sorted(allowed))}")


def _named_meanings(problems: _Problems, section: str, value: object) -> list[tuple[str, str]]:
    if not isinstance(value, Mapping) or not value:
        problems.add(
            f"[{section}]",
            f'missing or empty: declare every {section[:-1]} as NAME = "one-line meaning"',
        )
        return []
    pairs: list[tuple[str, str]] = []
    for name, meaning in cast(Mapping[str, object], value).items():
        if not name.isidentifier():
            problems.add(
                f"[{section}]", f"name {name!r} is not an identifier; use letters, digits and _"
            )
        if not isinstance(meaning, str) or not meaning.strip():
            problems.add(f"[{section}] {name}", "needs a one-line meaning (a non-empty string)")
            meaning = ""
        pairs.append((name, meaning.strip()))
    return pairs


def _tables(problems: _Problems, key: str, value: object) -> list[Mapping[str, object]]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, Mapping) for item in value):
        problems.add(f"[[{key}]]", f"must be an array of tables ([[{key}]] entries), got {value!r}")
        return []
    return cast(list[Mapping[str, object]], value)


def _parse_rows(
    problems: _Problems, raw_rows: list[Mapping[str, object]], states: set[str], triggers: set[str]
) -> list[TransitionRow]:
    rows: list[TransitionRow] = []
    for number, raw in enumerate(raw_rows, start=1):
        where = f"[[transition]] row {number}"
        _unknown_keys(problems, where, raw, _ROW_KEYS)
        for key in _ROW_KEYS_REQUIRED:
            if not raw.get(key):
                problems.add(where, f"missing {key!r}")
        source, trigger, dest = (
            _string(problems, where, raw, k) for k in ("source", "trigger", "dest")
        )
        guard_text = _string(problems, where, raw, "guard")
        effect = _string(problems, where, raw, "effect")
        why = _string(problems, where, raw, "why").strip()
        where = f"{where} ({source} --{trigger}--> {dest})"
        if source and source not in states:
            problems.add(where, f"source state {source!r} is not declared in [states]")
        if dest and dest not in states:
            problems.add(where, f"dest state {dest!r} is not declared in [states]")
        if trigger and trigger not in triggers:
            problems.add(where, f"trigger {trigger!r} is not declared in [events]")
        guard = GuardRef.parse(guard_text)
        if guard is not None and not guard.name.isidentifier():
            problems.add(
                where, f"guard {guard_text!r} must be a function name, optionally prefixed by '!'"
            )
        if effect and not effect.isidentifier():
            problems.add(where, f"effect {effect!r} must be a function name")
        rows.append(TransitionRow(number, source, trigger, dest, guard, effect, why))
    return rows


def _check_static_determinism(problems: _Problems, rows: list[TransitionRow]) -> None:
    """Rows sharing (source, trigger) must be told apart by guards; two rows that cannot be
    (an unguarded sibling, or the same guard twice) are ambiguous whatever the context."""
    groups: defaultdict[tuple[str, str], list[TransitionRow]] = defaultdict(list)
    for row in rows:
        groups[(row.source, row.trigger)].append(row)
    for (source, trigger), group in groups.items():
        if len(group) < 2:
            continue
        numbers = ", ".join(str(row.number) for row in group)
        unguarded = [row.number for row in group if row.guard is None]
        if unguarded:
            problems.add(
                f"[[transition]] rows {numbers} ({source} --{trigger}-->)",
                f"row(s) {unguarded} have no guard but share (source, trigger) with other rows, "
                "so two rows could fire at once; give every row of the group a guard",
            )
        seen: dict[GuardRef, int] = {}
        for row in group:
            if row.guard is not None and row.guard in seen:
                problems.add(
                    f"[[transition]] rows {seen[row.guard]} and {row.number} ({source} --{trigger}-->)",
                    f"both use guard {str(row.guard)!r}, so both fire together; merge them or change a guard",
                )
            elif row.guard is not None:
                seen[row.guard] = row.number


def _check_reachability(
    problems: _Problems, initial: str, state_names: list[str], rows: list[TransitionRow]
) -> None:
    # Guards can only remove edges, so a state no chain of rows reaches is dead in every run.
    successors: defaultdict[str, set[str]] = defaultdict(set)
    for row in rows:
        successors[row.source].add(row.dest)
    reached = {initial}
    frontier = [initial]
    while frontier:
        state = frontier.pop()
        for dest in successors[state] - reached:
            reached.add(dest)
            frontier.append(dest)
    for name in state_names:
        if name not in reached:
            problems.add(
                f"[states] {name}",
                f"unreachable from initial state {initial!r}: no chain of rows leads to it; "
                "add a row into it or remove the state",
            )


def _parse_invariants(
    problems: _Problems, raw_invariants: list[Mapping[str, object]]
) -> list[InvariantSpec]:
    invariants: list[InvariantSpec] = []
    seen_ids: dict[str, int] = {}
    for number, raw in enumerate(raw_invariants, start=1):
        where = f"[[invariant]] {number}"
        _unknown_keys(problems, where, raw, _INVARIANT_KEYS)
        for key in _INVARIANT_KEYS_REQUIRED:
            if not raw.get(key):
                problems.add(where, f"missing {key!r}")
        invariant_id = _string(problems, where, raw, "id")
        where = f"[[invariant]] {number} ({invariant_id})"
        predicate = _string(problems, where, raw, "predicate")
        text = _string(problems, where, raw, "text").strip()
        kind = _string(problems, where, raw, "kind")
        scope = _string(problems, where, raw, "scope") or "state"
        if invariant_id and not _INVARIANT_ID.match(invariant_id):
            problems.add(
                where, f"id {invariant_id!r} must look like OBS-3 (capitals, dash, number)"
            )
        if invariant_id in seen_ids:
            problems.add(
                where,
                f"duplicate id {invariant_id!r}, first used by [[invariant]] {seen_ids[invariant_id]}",
            )
        elif invariant_id:
            seen_ids[invariant_id] = number
        if predicate and not predicate.isidentifier():
            problems.add(where, f"predicate {predicate!r} must be a function name")
        if kind and kind not in ("always", "sometimes"):
            problems.add(where, f"kind {kind!r} must be 'always' or 'sometimes'")
        if scope not in ("state", "step"):
            problems.add(where, f"scope {scope!r} must be 'state' (default) or 'step'")
        invariants.append(
            InvariantSpec(
                invariant_id,
                predicate,
                text,
                cast(InvariantKind, kind),
                cast(InvariantScope, scope),
            )
        )
    return invariants


def parse_table(data: Mapping[str, object], source: str) -> MachineTable:
    """Validate a parsed spec TOML. ``source`` names the file in every error message."""
    problems = _Problems(source)
    _unknown_keys(problems, "top level", data, _TOP_KEYS)
    machine = data.get("machine")
    if not isinstance(machine, Mapping):
        problems.add(
            "[machine]", "missing: a spec needs a [machine] table with name, actions, initial"
        )
        problems.raise_if_any()
    machine = cast(Mapping[str, object], machine)
    _unknown_keys(problems, "[machine]", machine, _MACHINE_KEYS)
    for key in sorted(_MACHINE_KEYS):
        if not machine.get(key):
            problems.add("[machine]", f"missing {key!r}")
    name, actions, initial = (
        _string(problems, "[machine]", machine, k) for k in ("name", "actions", "initial")
    )
    if name and not name.isidentifier():
        problems.add(
            "[machine]", f"name = {name!r} must be an identifier (it names spec/<name>.md)"
        )
    if actions and not _MODULE_PATH.match(actions):
        problems.add("[machine]", f"actions = {actions!r} must be a dotted Python module path")

    states = _named_meanings(problems, "states", data.get("states"))
    events = _named_meanings(problems, "events", data.get("events"))
    state_names = [state for state, _ in states]
    triggers = {trigger for trigger, _ in events}
    if states and initial and initial not in state_names:
        problems.add("[machine]", f"initial = {initial!r} is not declared in [states]")

    rows = _parse_rows(
        problems,
        _tables(problems, "transition", data.get("transition")),
        set(state_names),
        triggers,
    )
    if not rows:
        problems.add("[[transition]]", "the table has no rows")
    _check_static_determinism(problems, rows)
    used_triggers = {row.trigger for row in rows}
    for trigger, _ in events:
        if trigger not in used_triggers:
            problems.add(
                f"[events] {trigger}", "no row uses this trigger; add its rows or remove the event"
            )
    if initial in state_names:
        _check_reachability(problems, initial, state_names, rows)
    invariants = _parse_invariants(problems, _tables(problems, "invariant", data.get("invariant")))

    problems.raise_if_any()
    return MachineTable(
        name=name,
        actions=actions,
        initial=initial,
        states=tuple(StateSpec(n, m) for n, m in states),
        events=tuple(EventSpec(t, m) for t, m in events),
        rows=tuple(rows),
        invariants=tuple(invariants),
        source=source,
    )
