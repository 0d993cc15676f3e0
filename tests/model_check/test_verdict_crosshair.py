"""CrossHair checks the verdict functions' pre/postconditions (crosshair_contracts.py).

Always with an explicit budget (--max_uninteresting_iterations, --per_condition_timeout), so
the run is bounded. A planted bug (strict majority weakened to ">=") must be caught, which
shows the check is not vacuous.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from tests.model_check.crosshair_runner import REPO
from tests.model_check.crosshair_runner import run_crosshair as _run

CONTRACTS = Path(__file__).with_name("crosshair_contracts.py")
run_crosshair = partial(_run, max_uninteresting_iterations=30, per_condition_timeout_s=20, timeout_s=240)


def test_VERDICT_13_crosshair_postconditions_hold() -> None:
    result = run_crosshair(CONTRACTS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Error" not in result.stdout + result.stderr


def test_crosshair_catches_a_planted_majority_bug(tmp_path: Path) -> None:
    source = (REPO / "scout" / "core" / "verdict.py").read_text()
    mutated = source.replace("if 2 * count > n:", "if 2 * count >= n:")
    assert mutated != source, "the planted mutation no longer applies; update this test"
    (tmp_path / "mutant_verdict.py").write_text(mutated)
    contracts = CONTRACTS.read_text().replace(
        "from scout.core import verdict as VERDICT_IMPL", "import mutant_verdict as VERDICT_IMPL"
    )
    # The mutant defines its own Status enum; compare against it.
    contracts = contracts.replace(
        "from scout.core.verdict import Status, Verdict", "from mutant_verdict import Status, Verdict"
    )
    assert "from mutant_verdict import Status" in contracts
    target = tmp_path / "mutant_contracts.py"
    target.write_text(contracts)
    result = run_crosshair(target, extra_path=tmp_path)
    assert result.returncode != 0, "CrossHair did not catch the planted bug"
    output = result.stdout + result.stderr
    # A real counterexample ("false when calling"), not an error in the harness.
    assert "false when calling exact_verdict" in output, output
    assert "Error while evaluating" not in output, output
