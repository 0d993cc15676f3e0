"""The package layout (README "Layout"): each top-level package is one feature, and imports only
point down. A test, so a new upward import fails CI instead of being found by a reader."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SCOUT = Path(__file__).resolve().parents[2] / "scout"

#: Layer of every top-level package (and module) of scout: an import may only go to a lower
#: layer or stay inside its own package. Equal layers do not import each other.
LAYERS = {
    "core": 0,
    "gate": 1,
    "transport": 1,
    "spec_examples": 1,
    # reports: the report vocabulary and its translations (kinds.py: a checkpoint's trust) and
    # the run's summary and picture, which read the gate's manifest.
    "reports": 2,
    "observer": 3,
    # the observer's worked examples (spec/examples/observer.txt): the core's assessment and the
    # reports' reason codes.
    "observer_examples": 3,
    "replay": 3,
    # ops (metrics sidecar, live page, Slurm) reads what observers and reports leave, and attach
    # starts it: between the two.
    "ops": 4,
    "job": 5,
    "scenarios": 6,
    "integrations": 6,
    "commands": 7,
    "cli": 8,
}


def _package(path: Path) -> str:
    relative = path.relative_to(SCOUT)
    return relative.parts[0].removesuffix(".py")


def _imported(node: ast.AST, path: Path) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level:  # relative: resolve against the module's package
            base = list(path.relative_to(SCOUT.parent).with_suffix("").parts)[: -node.level]
            return [".".join([*base, node.module] if node.module else base)]
        return [node.module or ""]
    return []


def _imports() -> list[tuple[Path, str, str]]:
    found = []
    for path in sorted(SCOUT.rglob("*.py")):
        if path.parent == SCOUT and path.name == "__init__.py":
            continue  # ``import scout`` re-exports the public API lazily, from the top
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            for name in _imported(node, path):
                parts = name.split(".")
                if parts[0] == "scout" and len(parts) > 1:
                    found.append((path, _package(path), parts[1]))
    return found


def test_every_package_has_a_layer() -> None:
    packages = {_package(p) for p in SCOUT.rglob("*.py") if p != SCOUT / "__init__.py"}
    assert packages <= set(LAYERS), f"packages without a layer: {sorted(packages - set(LAYERS))}"


def test_imports_only_point_down() -> None:
    upward = [
        f"{path.relative_to(SCOUT.parent)}: {importer} (layer {LAYERS[importer]}) imports scout.{imported} "
        f"(layer {LAYERS.get(imported)})"
        for path, importer, imported in _imports()
        if imported != importer and not LAYERS.get(imported, 99) < LAYERS[importer]
    ]
    assert not upward, "imports that do not point down:\n" + "\n".join(upward)


@pytest.mark.parametrize("attribute", ["control"])
def test_no_string_literal_compares_a_control_state(attribute: str) -> None:
    """Control states are the tables' enums (``ObserverState.STOPPED``), never string literals."""
    offenders = []
    for root in (SCOUT, SCOUT.parent / "tests", SCOUT.parent / "bench"):
        for path in sorted(root.rglob("*.py")):
            if "toy" in path.parts:
                continue  # the machinery's own test machine has no states enum, on purpose
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not isinstance(node, ast.Compare):
                    continue
                sides = [node.left, *node.comparators]
                touches = any(isinstance(s, ast.Attribute) and s.attr == attribute for s in sides)
                literal = any(
                    isinstance(s, ast.Constant) and isinstance(s.value, str)
                    or isinstance(s, (ast.Tuple, ast.Set, ast.List))
                    and any(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in s.elts)
                    for s in sides
                )
                if touches and literal:
                    offenders.append(f"{path.relative_to(SCOUT.parent)}:{node.lineno}")
    assert not offenders, "string literals compared with a control state:\n" + "\n".join(offenders)
