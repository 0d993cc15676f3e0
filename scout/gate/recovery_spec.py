"""The recovery decision table as data: parse ``spec/recovery.toml`` and render what is derived
from it -- the Markdown block in ``spec/recovery.md`` and the Python module
``scout/gate/recovery_table.py`` -- so neither is written by hand (docs/design.md §3).

Pure string functions over the parsed TOML mapping; ``scout spec`` reads and writes the files
and ``scout spec --check`` proves both current.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path, PurePath
from typing import Any, Final

import attrs

from scout.core.machine import splice

__all__ = [
    "CHOICES",
    "EMERGENCY_REPLAYS",
    "DecisionTableError",
    "DecisionRow",
    "DecisionTable",
    "generated_files",
    "parse_decision_table",
    "render_markdown_block",
    "render_python",
]

CHOICES: Final = ("verified", "latest", "none")
EMERGENCY_REPLAYS: Final = ("clean", "unclean", "not-run")
_CONDITIONS: Final = ("sdc_since_restart", "verified", "latest")
_ROW_KEYS: Final = frozenset({"failures", "emergency_replay", "choose", "reason", "why", *_CONDITIONS})
_TOP_KEYS: Final = frozenset({"decision", "failures", "inputs", "rule"})
_DECISION_KEYS: Final = frozenset({"name", "renderer", "python"})


class DecisionTableError(ValueError):
    """The decision table is malformed; the message names the file, the row and the value."""


@attrs.frozen
class DecisionRow:
    number: int
    failures: tuple[str, ...]  # empty: any failure
    sdc_since_restart: bool | None
    verified: bool | None
    latest: bool | None
    emergency_replay: str | None
    choose: str
    reason: str
    why: str


@attrs.frozen
class DecisionTable:
    name: str
    source: str
    python_path: str
    failures: tuple[tuple[str, str], ...]  # (id, meaning)
    inputs: tuple[tuple[str, str], ...]
    rows: tuple[DecisionRow, ...]


def _meanings(problems: list[str], data: Mapping[str, Any], key: str) -> tuple[tuple[str, str], ...]:
    table = data.get(key)
    if not isinstance(table, dict) or not table:
        problems.append(f"[{key}] must be a non-empty table of NAME = \"meaning\"")
        return ()
    items = []
    for name, meaning in table.items():
        if not isinstance(meaning, str) or not meaning.strip():
            problems.append(f"[{key}] {name} needs a one-line meaning, got {meaning!r}")
        items.append((str(name), str(meaning)))
    return tuple(items)


def parse_decision_table(data: Mapping[str, Any], source: str) -> DecisionTable:
    """Validate the TOML mapping of a decision table. Raises :class:`DecisionTableError` listing
    every problem at once."""
    problems: list[str] = []
    for key in data:
        if key not in _TOP_KEYS:
            problems.append(f"unknown top-level table [{key}]; allowed: {', '.join(sorted(_TOP_KEYS))}")
    decision = data.get("decision")
    if not isinstance(decision, dict):
        raise DecisionTableError(f"{source}: missing [decision] table")
    for key in decision:
        if key not in _DECISION_KEYS:
            problems.append(f"[decision] unknown key {key!r}")
    name = decision.get("name")
    python_path = decision.get("python")
    if not isinstance(name, str) or name != PurePath(source).stem:
        problems.append(f"[decision] name = {name!r} must equal the file's stem {PurePath(source).stem!r}")
    if not isinstance(python_path, str) or not python_path.endswith(".py"):
        problems.append(f"[decision] python = {python_path!r} must name the generated .py file")
    failures = _meanings(problems, data, "failures")
    inputs = _meanings(problems, data, "inputs")
    failure_ids = {failure for failure, _ in failures}
    rows: list[DecisionRow] = []
    raw_rows = data.get("rule", [])
    if not isinstance(raw_rows, list) or not raw_rows:
        problems.append("no [[rule]] rows")
        raw_rows = []
    for number, raw in enumerate(raw_rows, start=1):
        where = f"rule {number}"
        if not isinstance(raw, dict):
            problems.append(f"{where}: not a table")
            continue
        for key in raw:
            if key not in _ROW_KEYS:
                problems.append(f"{where}: unknown key {key!r}; allowed: {', '.join(sorted(_ROW_KEYS))}")
        row_failures = raw.get("failures", [])
        if not isinstance(row_failures, list) or not all(isinstance(f, str) for f in row_failures):
            problems.append(f"{where}: failures = {row_failures!r} must be a list of failure ids")
            row_failures = []
        for failure in row_failures:
            if failure not in failure_ids:
                problems.append(f"{where}: unknown failure {failure!r}; declared: {', '.join(sorted(failure_ids))}")
        conditions: dict[str, bool | None] = {}
        for key in _CONDITIONS:
            value = raw.get(key)
            if value is not None and not isinstance(value, bool):
                problems.append(f"{where}: {key} = {value!r} must be true or false (or left out)")
                value = None
            conditions[key] = value
        replay = raw.get("emergency_replay")
        if replay is not None and replay not in EMERGENCY_REPLAYS:
            problems.append(f"{where}: emergency_replay = {replay!r} must be one of {', '.join(EMERGENCY_REPLAYS)}")
            replay = None
        choose = raw.get("choose")
        if choose not in CHOICES:
            problems.append(f"{where}: choose = {choose!r} must be one of {', '.join(CHOICES)}")
        reason = raw.get("reason")
        if not isinstance(reason, str) or not reason or reason != reason.strip():
            problems.append(f"{where}: reason must be a non-empty code, got {reason!r}")
        why = raw.get("why")
        if not isinstance(why, str) or not why.strip():
            problems.append(f"{where}: why must say why, got {why!r}")
        rows.append(
            DecisionRow(
                number,
                tuple(row_failures),
                conditions["sdc_since_restart"],
                conditions["verified"],
                conditions["latest"],
                replay,
                str(choose),
                str(reason),
                str(why),
            )
        )
    reasons = [row.reason for row in rows]
    for reason in sorted({r for r in reasons if reasons.count(r) > 1}):
        problems.append(f"reason code {reason!r} is used by more than one rule; codes must name one rule")
    if problems:
        body = "\n".join(f"  - {line}" for line in problems)
        raise DecisionTableError(f"{source}: invalid decision table ({len(problems)} problem(s)):\n{body}")
    return DecisionTable(str(name), source, str(python_path), failures, inputs, tuple(rows))


def _cell(value: bool | str | None) -> str:
    if value is None:
        return "any"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return f"`{value}`"


def render_markdown_block(table: DecisionTable) -> str:
    """The generated block for ``spec/<name>.md``, markers included (same markers as machines)."""
    source_name = PurePath(table.source).name
    lines = [
        f"<!-- BEGIN GENERATED: {table.name} -->",
        f"<!-- Generated from {source_name} by `scout spec`: edit the table, then run `scout spec`. -->",
        "",
        "**Failure classes**",
        "",
        "| failure | meaning |",
        "|---|---|",
        *(f"| `{failure}` | {meaning} |" for failure, meaning in table.failures),
        "",
        "**Inputs**",
        "",
        "| input | meaning |",
        "|---|---|",
        *(f"| `{name}` | {meaning} |" for name, meaning in table.inputs),
        "",
        "**Rules** (the first row whose conditions all hold decides; `any` matches every value)",
        "",
        "| # | failure | SDC since restart | verified | latest | emergency replay | restore | reason | why |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in table.rows:
        failures = ", ".join(f"`{f}`" for f in row.failures) if row.failures else "any"
        why = row.why.replace("|", "\\|")
        lines.append(
            f"| {row.number} | {failures} | {_cell(row.sdc_since_restart)} | {_cell(row.verified)} | "
            f"{_cell(row.latest)} | {_cell(row.emergency_replay)} | **{row.choose}** | `{row.reason}` | "
            f"{why} |"
        )
    lines += ["", f"<!-- END GENERATED: {table.name} -->"]
    return "\n".join(lines) + "\n"


def render_python(table: DecisionTable) -> str:
    """The generated module holding the rows as literals, read by :mod:`scout.gate.recovery`."""
    source_name = PurePath(table.source).name
    lines = [
        f'"""GENERATED from spec/{source_name} by `scout spec`. Do not edit: edit the table and rerun.',
        "",
        "Rows of the recovery decision, in order; the first whose conditions hold decides. Each row:",
        "(number, failures (empty: any), sdc_since_restart, verified, latest, emergency_replay,",
        "choose, reason, why); None matches any value.",
        '"""',
        "",
        "from __future__ import annotations",
        "",
        "from typing import Final",
        "",
        "RowLiteral = tuple[int, tuple[str, ...], bool | None, bool | None, bool | None, str | None, str, str, str]",
        "",
        f"FAILURES: Final[tuple[str, ...]] = {tuple(f for f, _ in table.failures)!r}",
        "",
        "ROWS: Final[tuple[RowLiteral, ...]] = (",
    ]
    for row in table.rows:
        literal = (
            row.number,
            row.failures,
            row.sdc_since_restart,
            row.verified,
            row.latest,
            row.emergency_replay,
            row.choose,
            row.reason,
            row.why,
        )
        lines.append(f"    {literal!r},")
    lines.append(")")
    return "\n".join(lines) + "\n"


def generated_files(
    data: Mapping[str, Any], table_path: Path
) -> list[tuple[Path, Callable[[str | None], str]]]:
    """For ``scout spec``: each derived file and how to compute its expected text from its
    current text (the Markdown keeps the prose outside its markers; the module is all generated).
    The module path in ``[decision] python`` is relative to the spec directory's parent."""
    table = parse_decision_table(data, str(table_path))
    document = table_path.with_suffix(".md")
    module = table_path.parent.parent / table.python_path
    block = render_markdown_block(table)

    def markdown(current: str | None) -> str:
        if current is None:
            return (
                f"# Decision table `{table.name}`\n\nThe normative table is `{table_path.name}`; the block "
                "below is generated from it. Write the prose outside the block.\n\n" + block
            )
        return splice(current, block, table.name, str(document))

    return [(document, markdown), (module, lambda current: render_python(table))]
