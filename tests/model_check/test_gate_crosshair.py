"""CrossHair checks the gate step's postconditions (gate_crosshair_contracts.py) with an explicit
budget, and catches a planted bug in a mutant of the bindings, so the check is not vacuous."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest

from tests.model_check import gate_crosshair_contracts as gate_contracts
from tests.model_check.crosshair_runner import REPO
from tests.model_check.crosshair_runner import run_crosshair as _run

pytestmark = pytest.mark.spawns

CONTRACTS = Path(__file__).with_name("gate_crosshair_contracts.py")
run_crosshair = partial(_run, max_uninteresting_iterations=20, per_condition_timeout_s=30)


def test_GATE_4_5_crosshair_step_postconditions_hold() -> None:
    result = run_crosshair(CONTRACTS)
    assert result.returncode == 0, result.stdout + result.stderr


# One planted bug per contract, each checked against that contract alone (crosshair check
# MODULE.FUNCTION) so a run stops at its own budget, not every contract's.
PLANTED = [
        # SDC quarantines only the candidate, not every unverified checkpoint (GATE-4).
        pytest.param(
            "        if entry.trust in UNVERIFIED_RESTORABLE\n    }",
            "        if entry.trust is Trust.CANDIDATE\n    }",
            "result_step",
            id="sdc-quarantines-only-the-candidate",
        ),
        # The completeness guard forgets to look at coverage: an incomplete cycle promotes.
        pytest.param(
            "    return context.cycle_complete\n",
            "    return True\n",
            "boundary_step",
            id="incomplete-cycle-promotes",
        ),
        # A capture inside a cycle (not at its start) is nominated (GATE-1, GATE-17).
        pytest.param(
            "    if before is not None and context.cycle_start_step == event.step:",
            "    if before is not None:",
            "capture_step",
            id="capture-inside-a-cycle-nominated",
        ),
        # A restart supersedes older unverified checkpoints too (GATE-18; the spec: only those
        # newer than the restore point).
        pytest.param(
            "        if restored is None or entry.id.step > restored:",
            "        if restored is None or entry.id.step != restored:",
            "restart_step",
            id="restart-supersedes-older-checkpoints",
        ),
        # An unclean cycle leaves the candidate standing, so a later clean cycle would promote
        # it without a clean cycle right after its capture (GATE-1).
        pytest.param(
            "    if candidate is not None:\n        changes[candidate.id] = (\n            Trust.CAPTURED,",
            "    if False:\n        changes[candidate.id] = (\n            Trust.CAPTURED,",
            "boundary_step",
            marks=pytest.mark.slow,
            id="unclean-cycle-keeps-candidate",
        ),
]


@pytest.mark.parametrize(("old", "new", "function"), PLANTED)
def test_crosshair_catches_a_planted_gate_bug(tmp_path: Path, old: str, new: str, function: str) -> None:
    source = (REPO / "scout" / "gate" / "machine.py").read_text(encoding="utf-8")
    assert source.count(old) == 1, "the planted mutation no longer applies; update this test"
    (tmp_path / "mutant_gate_actions.py").write_text(source.replace(old, new), encoding="utf-8")
    contracts = CONTRACTS.read_text(encoding="utf-8").replace(
        "from scout.gate import machine as GATE_ACTIONS_IMPL", "import mutant_gate_actions as GATE_ACTIONS_IMPL"
    )
    target = tmp_path / "mutant_gate_contracts.py"
    target.write_text(contracts, encoding="utf-8")
    result = run_crosshair(f"mutant_gate_contracts.{function}", extra_path=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode != 0, "CrossHair did not catch the planted bug"
    assert f"false when calling {function}" in output, output
    assert "Error while evaluating" not in output, output


def test_every_gate_contract_has_a_planted_bug_in_ci() -> None:
    contracts = {name for name, value in vars(gate_contracts).items() if name.endswith("_step") and callable(value)}
    in_ci = {case.values[2] for case in PLANTED if not case.marks}
    assert contracts == in_ci, "a new contract needs a planted bug (not marked slow) in PLANTED"
