"""CrossHair checks the verdict functions' pre/postconditions (crosshair_contracts.py).

Always with an explicit budget (--max_uninteresting_iterations, --per_condition_timeout), so
the run is bounded. A planted bug (strict majority weakened to ">=") must be caught, which
shows the check is not vacuous; every contract has its own planted bug in CI.
"""

from __future__ import annotations

import re
from functools import partial
from pathlib import Path

import pytest

from tests.model_check import crosshair_contracts as verdict_contracts
from tests.model_check.crosshair_runner import REPO
from tests.model_check.crosshair_runner import run_crosshair as _run

pytestmark = pytest.mark.spawns

CONTRACTS = Path(__file__).with_name("crosshair_contracts.py")
run_crosshair = partial(_run, max_uninteresting_iterations=30, per_condition_timeout_s=20, timeout_s=240)


def test_VERDICT_13_crosshair_postconditions_hold() -> None:
    result = run_crosshair(CONTRACTS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Error" not in result.stdout + result.stderr


def _mutant_contracts(tmp_path: Path, old: str, new: str) -> None:
    source = (REPO / "scout" / "core" / "verdict.py").read_text()
    assert source.count(old) == 1, "the planted mutation no longer applies; update this test"
    (tmp_path / "mutant_verdict.py").write_text(source.replace(old, new))
    contracts = CONTRACTS.read_text().replace(
        "from scout.core import verdict as VERDICT_IMPL", "import mutant_verdict as VERDICT_IMPL"
    )
    # The mutant defines its own Status enum; compare against it.
    contracts = contracts.replace(
        "from scout.core.verdict import Status, Verdict", "from mutant_verdict import Status, Verdict"
    )
    assert "from mutant_verdict import Status" in contracts
    (tmp_path / "mutant_contracts.py").write_text(contracts)


# One planted bug per contract, each checked against its contract alone (MODULE.FUNCTION).
PLANTED = [
        # Strict majority weakened to ">=" (VERDICT-13).
        pytest.param(
            "    if 2 * count > n:\n        invalid_positions",
            "    if 2 * count >= n:\n        invalid_positions",
            "exact_verdict",
            id="exact-majority-ge",
        ),
        # Timing mode attributes while the non-outliers are only half the group (VERDICT-25).
        pytest.param(
            "if 2 * healthy_count > n:", "if 2 * healthy_count >= n:", "timing_verdict", id="timing-majority-ge"
        ),
]


@pytest.mark.parametrize(("old", "new", "function"), PLANTED)
def test_crosshair_catches_a_planted_verdict_bug(tmp_path: Path, old: str, new: str, function: str) -> None:
    _mutant_contracts(tmp_path, old, new)
    result = run_crosshair(f"mutant_contracts.{function}", extra_path=tmp_path)
    assert result.returncode != 0, "CrossHair did not catch the planted bug"
    output = result.stdout + result.stderr
    # A real counterexample, not an error in the harness: either the contract's postcondition is
    # false, or the verdict's own run-time invariant (VERDICT-2, scout/core/invariants.py) fires
    # first on the input CrossHair found.
    assert (f"false when calling {function}" in output
            or re.search(rf"InvariantViolation: invariant VERDICT-\d+\S* violated .* when calling {function}\(", output)), output
    assert "Error while evaluating" not in output, output


def test_every_verdict_contract_has_a_planted_bug_in_ci() -> None:
    declared = {name for name, value in vars(verdict_contracts).items() if name.endswith("_verdict") and callable(value)}
    assert declared == {case.values[2] for case in PLANTED}, "a new contract needs a planted bug in PLANTED"
