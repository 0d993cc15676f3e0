"""The README's mutation table is current and every survivor is explained (issue 26).

The table is generated from the committed run records (``tests/mutation/runs/*.json``, written by
``./dev mutate --record``) and the explanations (``tests/mutation/explained.toml``) by
``./dev mutate --summary``, as ``scout spec`` generates the spec documents; this test is its
``--check``. No mutation run happens here."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def _driver() -> ModuleType:
    spec = importlib.util.spec_from_file_location("scout_mutation_driver", REPO / "tests" / "mutation" / "mutate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module


def test_the_readme_shows_the_mutation_score_of_every_target_as_recorded() -> None:
    from scout.core.machine.render import splice

    driver = _driver()
    _defaults, targets = driver.load_targets()
    explained = driver.load_explained()
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    block = driver.render_summary(targets, explained)
    assert splice(readme, block, "mutation", "README.md") == readme, "run `./dev mutate --summary`"
    assert block in readme
    for name in targets:
        assert f"| {name} |" in block


def test_every_recorded_survivor_is_explained_and_every_record_matches_its_target() -> None:
    driver = _driver()
    _defaults, targets = driver.load_targets()
    assert driver.summary_problems(targets, driver.load_explained()) == []


def test_a_survivor_without_an_explanation_is_a_problem_naming_it() -> None:
    driver = _driver()
    _defaults, targets = driver.load_targets()
    explained = driver.load_explained()
    recorded = [row for row in driver.table_rows(targets, explained) if row["record"] and row["equivalent"]]
    assert recorded, "no recorded target has an equivalent survivor to take away"
    name = recorded[0]["target"]
    dropped = sorted(explained[name])[0]
    partial = {**explained, name: {m: k for m, k in explained[name].items() if m != dropped}}
    assert driver.summary_problems(targets, partial) == [
        f"{name}: survivors not in explained.toml: {[dropped]}"]
    stale = {**explained, name: {**explained[name], "scout.nowhere.x_f__mutmut_1": "equivalent"}}
    assert driver.summary_problems(targets, stale) == [
        f"{name}: explained.toml explains mutants that did not survive: ['scout.nowhere.x_f__mutmut_1']"]
