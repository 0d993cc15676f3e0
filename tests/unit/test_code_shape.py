"""Shape rules a newcomer relies on (issue 40, "a house a newcomer can live in"): no class in
scout/ grows past a size one can read at a sitting; a class that does should be split into parts
with one job each, as the simulator was (``scout/transport/sim``)."""

from __future__ import annotations

import ast
from pathlib import Path

from scout.core.guards import whole_number

SCOUT = Path(__file__).resolve().parents[2] / "scout"
MAX_CLASS_LINES = 400
#: ``scout.attach``'s Job keeps the lifecycle, DCP and the exception boundary; the restore, step
#: and save protocols are rank programs beside it (scout/job/restore.py, pipeline.py, save.py).
MAX_JOB_LINES = 200


def _class_sizes() -> list[tuple[int, str]]:
    sizes = []
    for path in sorted(SCOUT.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno is not None
                where = f"{path.relative_to(SCOUT.parent)}:{node.lineno} class {node.name}"
                sizes.append((node.end_lineno - node.lineno + 1, where))
    return sizes


def test_no_class_in_scout_is_over_400_lines() -> None:
    sizes = _class_sizes()
    assert len(sizes) > 100  # the scan found the package
    too_long = [f"{where}: {lines} lines" for lines, where in sizes if lines > MAX_CLASS_LINES]
    assert not too_long, f"split these into parts of one job each: {too_long}"


def test_class_Job_is_at_most_200_lines() -> None:
    """Counted like every class above: from ``class Job`` to its last line, docstrings and blank
    lines included."""
    (job,) = [lines for lines, where in _class_sizes() if where.endswith("class Job")
              and where.startswith("scout/job/attach.py")]
    assert job <= MAX_JOB_LINES, (f"class Job in scout/job/attach.py is {job} lines: a protocol that grew in it "
                                  "belongs in a rank program (scout/job/restore.py, save.py)")


def test_whole_number_is_an_int_and_never_a_bool() -> None:
    assert [whole_number(value) for value in (0, -3, 2**70)] == [True, True, True]
    assert [whole_number(value) for value in (True, False, 1.0, "1", None)] == [False] * 5


def _isinstance_of(node: ast.expr, type_name: str) -> str | None:
    """The source of ``x`` if ``node`` is ``isinstance(x, type_name)``, possibly negated."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        node = node.operand
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "isinstance"
        and len(node.args) == 2
        and isinstance(node.args[1], ast.Name)
        and node.args[1].id == type_name
    ):
        return ast.unparse(node.args[0])
    return None


def test_an_int_that_is_not_a_bool_is_spelled_whole_number_everywhere() -> None:
    """``isinstance(x, bool) or not isinstance(x, int)`` and its variants, written by hand, are
    what ``scout.core.guards.whole_number`` replaced (one spelling, one place to get it right)."""
    by_hand = []
    for path in sorted(SCOUT.rglob("*.py")):
        if path.name == "guards.py" and path.parent.name == "core":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.BoolOp):
                bools = {_isinstance_of(value, "bool") for value in node.values} - {None}
                ints = {_isinstance_of(value, "int") for value in node.values} - {None}
                if bools & ints:
                    by_hand.append(f"{path.relative_to(SCOUT.parent)}:{node.lineno}")
    assert not by_hand, f"use scout.core.guards.whole_number: {by_hand}"
