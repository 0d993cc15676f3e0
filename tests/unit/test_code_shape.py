"""Shape rules a newcomer relies on (issue 40, "a house a newcomer can live in"): no class in
scout/ grows past a size one can read at a sitting; a class that does should be split into parts
with one job each, as the simulator was (``scout/transport/sim``)."""

from __future__ import annotations

import ast
from pathlib import Path

SCOUT = Path(__file__).resolve().parents[2] / "scout"
MAX_CLASS_LINES = 400


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
