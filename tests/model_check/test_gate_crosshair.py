"""CrossHair checks the gate step's postconditions (gate_crosshair_contracts.py) with an explicit
budget, and catches a planted bug in a mutant of the bindings, so the check is not vacuous."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest

from tests.model_check.crosshair_runner import REPO
from tests.model_check.crosshair_runner import run_crosshair as _run

CONTRACTS = Path(__file__).with_name("gate_crosshair_contracts.py")
run_crosshair = partial(_run, max_uninteresting_iterations=20, per_condition_timeout_s=30)


def test_GATE_4_5_crosshair_step_postconditions_hold() -> None:
    result = run_crosshair(CONTRACTS)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("old", "new", "function"),
    [
        # SDC quarantines only the candidate, not every unverified checkpoint (GATE-4).
        (
            "        if entry.trust in UNVERIFIED_RESTORABLE\n    }",
            "        if entry.trust is Trust.CANDIDATE\n    }",
            "result_step",
        ),
        # An unclean cycle leaves the candidate standing, so a later clean cycle would promote
        # it without a clean cycle right after its capture (GATE-1).
        pytest.param(
            "    if candidate is not None:\n        changes[candidate.id] = (\n            Trust.CAPTURED,",
            "    if False:\n        changes[candidate.id] = (\n            Trust.CAPTURED,",
            "boundary_step",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_crosshair_catches_a_planted_gate_bug(tmp_path: Path, old: str, new: str, function: str) -> None:
    source = (REPO / "scout" / "gate" / "machine.py").read_text(encoding="utf-8")
    assert source.count(old) == 1, "the planted mutation no longer applies; update this test"
    (tmp_path / "mutant_gate_actions.py").write_text(source.replace(old, new), encoding="utf-8")
    contracts = CONTRACTS.read_text(encoding="utf-8").replace(
        "from scout.gate import machine as GATE_ACTIONS_IMPL", "import mutant_gate_actions as GATE_ACTIONS_IMPL"
    )
    target = tmp_path / "mutant_gate_contracts.py"
    target.write_text(contracts, encoding="utf-8")
    result = run_crosshair(target, extra_path=tmp_path)
    assert result.returncode != 0, "CrossHair did not catch the planted bug"
    assert function in result.stdout + result.stderr
