"""The spec audit stays complete (docs/spec-audit.md).

Every normative clause id defined in spec/*.md (a bold ``**ID ...**`` clause or a row of a
generated invariant table) must be proved somewhere: it is an invariant of a machine table
(checked in every explored state or step), or some test names it (``test_GATE_4_...``, or the id
written in the test's code or docstring). docs/spec-audit.md lists every id with where it is
proved, and the few that are not, as gaps with the reason. ``python -m tests.unit.test_spec_audit``
prints the table rows for the audit document.
"""

from __future__ import annotations

import re
import sys
from collections import OrderedDict
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
AUDIT = REPO / "docs" / "spec-audit.md"
CLAUSE_ID = r"[A-Z][A-Z]+-[0-9]+"
_BOLD = re.compile(rf"^(?:- |\d+\. )?\*\*((?:{CLAUSE_ID})(?:, (?:{CLAUSE_ID}))*)")
_ROW = re.compile(rf"^\| ({CLAUSE_ID}) \| (?:always|sometimes) ")
_TEST = re.compile(r"^def (test_\w+)\(.*?(?=^def |^@|^class |\Z)", re.M | re.S)


def defined_clauses() -> OrderedDict[str, str]:
    """Clause id -> the spec file that defines it."""
    found: OrderedDict[str, str] = OrderedDict()
    for spec in sorted((REPO / "spec").glob("*.md")):
        for line in spec.read_text(encoding="utf-8").splitlines():
            bold = _BOLD.match(line)
            ids = re.findall(CLAUSE_ID, bold.group(1)) if bold else []
            row = _ROW.match(line)
            if row:
                ids.append(row.group(1))
            for clause in ids:
                found.setdefault(clause, spec.name)
    return found


def invariant_ids() -> dict[str, str]:
    found = {}
    for table in (REPO / "spec").glob("*.toml"):
        for invariant in tomllib.loads(table.read_text(encoding="utf-8")).get("invariant", []):
            found[invariant["id"]] = f"{table.name} {invariant['kind']} `{invariant['predicate']}`"
    return found


def _cited(name: str, body: str) -> set[str]:
    """Clause ids a test cites: in its name (``GATE_4``, ``RECOVERY_1_and_2``) or its code."""
    found = {f"{prefix}-{number}" for prefix, number in re.findall(r"(?<![A-Za-z0-9])([A-Z][A-Z]+)_([0-9]+)(?![0-9])", name)}
    for prefix, first, second in re.findall(r"([A-Z][A-Z]+)_([0-9]+)_and_([0-9]+)(?![0-9])", name):
        found |= {f"{prefix}-{first}", f"{prefix}-{second}"}
    found |= set(re.findall(r"(?<![A-Za-z0-9-])(" + CLAUSE_ID + r")(?![0-9])", body))
    return found


def naming_tests() -> dict[str, list[str]]:
    """Clause id -> tests that name it."""
    found: dict[str, list[str]] = {clause: [] for clause in defined_clauses()}
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        text = path.read_text(encoding="utf-8")
        for match in _TEST.finditer(text):
            name = match.group(1)
            for clause in _cited(name, match.group(0)):
                if clause in found:
                    found[clause].append(f"{path.relative_to(REPO).as_posix()}::{name}")
    return found


def audit_gaps() -> set[str]:
    """Ids the audit document lists under its Gaps section."""
    text = AUDIT.read_text(encoding="utf-8")
    gaps = text.split("## Gaps", 1)[1] if "## Gaps" in text else ""
    gaps = gaps.split("\n## ", 1)[0]
    return set(re.findall(rf"^- \*\*({CLAUSE_ID})\*\*", gaps, re.M))


def test_every_spec_clause_is_an_invariant_or_named_by_a_test() -> None:
    invariants, tests, gaps = invariant_ids(), naming_tests(), audit_gaps()
    unproved = [c for c in defined_clauses() if c not in invariants and not tests[c] and c not in gaps]
    assert unproved == [], f"clauses with no invariant, no named test and no documented gap: {unproved}"


def test_the_audit_lists_every_clause_and_no_stale_gap() -> None:
    text = AUDIT.read_text(encoding="utf-8")
    missing = [c for c in defined_clauses() if not re.search(rf"(?<![A-Z0-9-]){re.escape(c)}(?![0-9])", text)]
    assert missing == [], f"docs/spec-audit.md does not list {missing}; rerun python -m tests.unit.test_spec_audit"
    tests = naming_tests()
    stale = sorted(c for c in audit_gaps() if tests.get(c) or c in invariant_ids())
    assert stale == [], f"{stale} are listed as gaps but are now proved: move them to the table"


def main() -> None:
    invariants, tests = invariant_ids(), naming_tests()
    print("| clause | spec | invariant | tests naming it |")
    print("|---|---|---|---|")
    for clause, spec in defined_clauses().items():
        named = tests[clause]
        shown = ", ".join(f"`{t.split('::')[1]}`" for t in named[:2]) + (f" (+{len(named) - 2})" if len(named) > 2 else "")
        print(f"| {clause} | {spec} | {invariants.get(clause, '')} | {shown or '**none**'} |")


if __name__ == "__main__":
    main()
