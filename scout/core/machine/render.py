"""Show a machine table to people: a Markdown block (states, events, transitions, a Mermaid
``stateDiagram-v2``, invariants) spliced into the machine's spec document between marker
comments. Prose outside the markers is the author's and is kept byte for byte.

Pure string functions; ``scout spec`` reads and writes the files. Output depends only on the
table, so regenerating an unchanged table changes nothing (the ``--check`` in CI relies on it).
"""

from __future__ import annotations

from pathlib import PurePath

from scout.core.machine.errors import SpecError
from scout.core.machine.table import MachineTable, TransitionRow


def begin_marker(name: str) -> str:
    return f"<!-- BEGIN GENERATED: {name} -->"


def end_marker(name: str) -> str:
    return f"<!-- END GENERATED: {name} -->"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _code(text: str) -> str:
    return f"`{text}`" if text else ""


def _effect_cell(row: TransitionRow) -> str:
    return "(ignored)" if row.ignores else _code(row.effect)


def _mermaid(table: MachineTable) -> list[str]:
    lines = ["```mermaid", "stateDiagram-v2", f"    [*] --> {table.initial}"]
    for row in table.rows:
        if row.ignores:
            continue
        label = row.trigger
        if row.guard is not None:
            label += f" [{row.guard}]"
        if row.effect:
            label += f" / {row.effect}"
        lines.append(f"    {row.source} --> {row.dest}: {label}")
    lines.append("```")
    return lines


def render_block(table: MachineTable) -> str:
    """The generated block for ``table``, markers included, ending in a newline."""
    source_name = PurePath(table.source).name
    lines = [
        begin_marker(table.name),
        f"<!-- Generated from {source_name} by `scout spec`: edit the table, then run `scout spec`. -->",
        "",
        f"**States** (initial: `{table.initial}`)",
        "",
        "| state | meaning |",
        "|---|---|",
        *(f"| `{state.name}` | {_cell(state.meaning)} |" for state in table.states),
        "",
        "**Events**",
        "",
        "| trigger | meaning |",
        "|---|---|",
        *(f"| `{event.trigger}` | {_cell(event.meaning)} |" for event in table.events),
        "",
        "**Transitions** (a row whose dest is its source and that has no effect ignores the event)",
        "",
        "| # | source | trigger | guard | dest | effect | why |",
        "|---|---|---|---|---|---|---|",
        *(
            f"| {row.number} | `{row.source}` | `{row.trigger}` | {_code(str(row.guard) if row.guard else '')} "
            f"| `{row.dest}` | {_effect_cell(row)} | {_cell(row.why)} |"
            for row in table.rows
        ),
        "",
        "**Diagram** (ignored events are in the table only)",
        "",
        *_mermaid(table),
        "",
        "**Invariants**",
        "",
    ]
    if table.invariants:
        lines += [
            "| id | kind | scope | predicate | statement |",
            "|---|---|---|---|---|",
            *(
                f"| {inv.id} | {inv.kind} | {inv.scope} | `{inv.predicate}` | {_cell(inv.text)} |"
                for inv in table.invariants
            ),
        ]
    else:
        lines.append("None declared.")
    lines += ["", end_marker(table.name)]
    return "\n".join(lines) + "\n"


def new_document(table: MachineTable) -> str:
    """A first spec document for a machine that has none yet: a title, a place for prose, the block."""
    source_name = PurePath(table.source).name
    return (
        f"# Machine `{table.name}`\n\n"
        f"The normative table is `{source_name}`; the block below is generated from it. "
        "Write the prose (what the machine is for, its theory of operation) outside the block.\n\n"
        + render_block(table)
    )


def splice(document: str, block: str, name: str, document_name: str) -> str:
    """Replace the generated block for ``name`` in ``document``, or append it if the document has
    none. Anything else about the markers (one without the other, two blocks) is refused."""
    begin, end = begin_marker(name), end_marker(name)
    begins, ends = document.count(begin), document.count(end)
    if begins == 0 and ends == 0:
        separator = (
            ""
            if not document or document.endswith("\n\n")
            else ("\n" if document.endswith("\n") else "\n\n")
        )
        return document + separator + block
    start = document.find(begin)
    stop = document.find(end)
    if begins != 1 or ends != 1 or stop < start or not (start == 0 or document[start - 1] == "\n"):
        raise SpecError(
            f"{document_name}: expected one line {begin!r} followed by one {end!r}, found "
            f"{begins} begin and {ends} end marker(s); repair the markers by hand (or delete "
            "both and every line between them) and run `scout spec` again"
        )
    stop += len(end)
    if document[stop : stop + 1] == "\n":
        stop += 1
    return document[:start] + block + document[stop:]
