"""The core's run-time invariants (scout/core/invariants.py): each fires on the violation it
names, with the invariant and the values in the message; the model checks and the healthy runs
of the rest of the suite prove they hold. Their cost: bench/invariants.py."""

from __future__ import annotations

import attrs
import pytest

from scout.core import invariants
from scout.core.recipes import DueRecipe, EvidenceKind, RecipeClass, RecipeId, ReplayStatus
from scout.core.replay_round import (
    EVIDENCE_OF,
    Executed,
    Prepared,
    communication_slot,
    evidence_position,
    replay_round,
)
from scout.core.straggler import DEFAULT_SEQUENTIAL_CONFIG, confirmation_start
from scout.core.straggler.confirmation import _check_confirmation
from scout.core.straggler.model import StragglerState
from scout.core.verdict import DEFAULT_TIMING_CONFIG, Status, Verdict
from scout.gate.model import (
    CheckpointId,
    CheckpointLost,
    CycleBoundary,
    GateReport,
    GateReportKind,
    Persist,
    Trust,
    TrustChange,
)
from scout.gate.step import _check_step, initial_state, step
from tests.gate_story import CONFIG, story

EVENT = CycleBoundary(1)  # any event that is not a loss


def test_INVARIANTS_every_invariant_names_a_clause_and_says_what_it_checks() -> None:
    assert len(invariants.INVARIANTS) >= 7
    for key, sentence in invariants.INVARIANTS.items():
        clause, _, what = key.partition("/")
        assert clause.split("-")[0].isupper() and clause.split("-")[1].isdigit() and what and sentence


def test_VERDICT_2_a_verdict_naming_outliers_it_may_not_name_is_refused() -> None:
    with pytest.raises(invariants.InvariantViolation, match="VERDICT-2/outliers.*ATTRIBUTED with outliers"):
        Verdict(Status.ATTRIBUTED, (), (1, 1, 2), None)
    with pytest.raises(invariants.InvariantViolation, match="VERDICT-2/outliers"):
        Verdict(Status.ATTRIBUTED, (2, 1), (1, 2, 2), None)
    with pytest.raises(invariants.InvariantViolation, match="VERDICT-2/majority.*outliers \\[1, 2\\]"):
        Verdict(Status.ATTRIBUTED, (1, 2), (1, 2, 3), None)
    with pytest.raises(invariants.InvariantViolation, match="VERDICT-2/majority"):
        Verdict(Status.ATTRIBUTED, (3,), (1, 1, 2, 3), None, missing=(2,))


def _drive(rows_of_peers: int) -> object:
    """A replay round of a 4-peer group whose driver answers with ``rows_of_peers`` rows."""
    due = DueRecipe(RecipeId(RecipeClass.HIDDEN, 0), 4, 0)
    done = Executed(ReplayStatus.OK, 0.01, (0.01,), {k: 7 for k in EVIDENCE_OF[RecipeClass.HIDDEN]})
    round_ = replay_round(4, [Prepared(due, ReplayStatus.OK, 1)], schedule_digest=1, group_size=4,
                          timing=DEFAULT_TIMING_CONFIG)
    op = next(round_)
    round_.send([op.row] * rows_of_peers)
    op = round_.send(done)
    evidence = [list(op.row) + list(communication_slot(())) for _ in range(rows_of_peers)]
    evidence[-1][evidence_position(RecipeClass.HIDDEN, EvidenceKind.OUTPUT)] ^= 1  # the last peer's output differs
    with pytest.raises(StopIteration) as stopped:
        round_.send(evidence)
    return stopped.value.value


def test_REPLAY_9_a_round_naming_a_peer_outside_its_group_is_refused() -> None:
    assert _drive(4).results[0].outliers == (3,)
    with pytest.raises(invariants.InvariantViolation, match="REPLAY-9/results.*group of 4"):
        _drive(6)  # a broken driver answered with six peers' rows for a group of four


def test_GATE_9_GATE_2_GATE_3_a_step_that_breaks_them_is_refused() -> None:
    states = [initial_state(CONFIG)]
    for event in story():
        states.append(step(states[-1], event)[0])
    changed = states[2]
    with pytest.raises(invariants.InvariantViolation, match="GATE-9/persist"):
        _check_step(states[1], EVENT, changed, ())  # changed, nothing persisted
    with pytest.raises(invariants.InvariantViolation, match="GATE-9/persist"):
        _check_step(states[1], EVENT, changed, (Persist(), Persist()))
    unquarantine = TrustChange(CheckpointId(0, 150), Trust.QUARANTINED, Trust.CAPTURED, "lifted")
    with pytest.raises(invariants.InvariantViolation, match="GATE-2/absorbing"):
        _check_step(states[1], EVENT, changed, (Persist(), unquarantine))
    verified = next(s for s in states if s.context.verified_step is not None)
    demoted = TrustChange(CheckpointId(0, 100), Trust.RECOVERY_VERIFIED, Trust.CAPTURED, "demoted")
    with pytest.raises(invariants.InvariantViolation, match="GATE-3/monotone.*t0/s100 left RECOVERY_VERIFIED"):
        _check_step(verified, EVENT, changed, (Persist(), demoted))
    older = TrustChange(CheckpointId(0, 50), Trust.CANDIDATE, Trust.RECOVERY_VERIFIED, "promoted")
    with pytest.raises(invariants.InvariantViolation, match="GATE-3/monotone.*promoted step 50, verified already 100"):
        _check_step(verified, EVENT, changed, (Persist(), older))
    # GATE-42: a loss is the one way out of RECOVERY_VERIFIED, into LOST, on a lose event only.
    lost = TrustChange(CheckpointId(0, 100), Trust.RECOVERY_VERIFIED, Trust.LOST, "lost")
    _check_step(verified, CheckpointLost(CheckpointId(0, 100)), changed, (Persist(), lost))
    with pytest.raises(invariants.InvariantViolation, match="GATE-3/monotone.*t0/s100 left RECOVERY_VERIFIED"):
        _check_step(verified, EVENT, changed, (Persist(), lost))
    relost = TrustChange(CheckpointId(0, 100), Trust.LOST, Trust.RECOVERY_VERIFIED, "found again")
    with pytest.raises(invariants.InvariantViolation, match="GATE-2/absorbing"):
        _check_step(verified, EVENT, changed, (Persist(), relost))
    report = GateReport(GateReportKind.UNCHECKED, 1, 1, (), (), "")
    _check_step(states[1], EVENT, states[1], (report,))  # unchanged: a report alone is fine


def test_STRAG_14_a_group_with_a_majority_confirmed_is_refused() -> None:
    state = confirmation_start(3, DEFAULT_SEQUENTIAL_CONFIG)
    _check_confirmation(state)
    bound = state.bounds.confirm_bound
    confirmed = tuple(attrs.evolve(p, control=StragglerState.CONFIRMED, context=attrs.evolve(p.context, score=bound))
                      for p in state.peers[:2])
    with pytest.raises(invariants.InvariantViolation, match="STRAG-14/minority.*peers \\[0, 1\\] of 3"):
        _check_confirmation(attrs.evolve(state, peers=(*confirmed, state.peers[2])))
